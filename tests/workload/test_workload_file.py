"""Loading a workload file validates every field and names the line and field of a bad one."""

import json

import pytest

from justitia.workload import WorkloadError, load_workload

GOOD = {
    "agent_id": "a",
    "type": "mrs",
    "arrival_s": 0.5,
    "stages": [[{"prompt": "p", "prompt_tokens": 10, "output_tokens": 5}]],
}


def write(tmp_path, *docs, raw=None):
    path = tmp_path / "w.jsonl"
    lines = [json.dumps(d) for d in docs] + ([raw] if raw is not None else [])
    path.write_text("\n".join(lines) + "\n")
    return path


def with_(**changes):
    doc = json.loads(json.dumps(GOOD))
    doc.update(changes)
    return doc


def test_good_file_loads_sorted_by_arrival(tmp_path):
    agents = load_workload(write(tmp_path, with_(agent_id="late", arrival_s=3.0), GOOD))
    assert [a.agent_id for a in agents] == ["a", "late"]
    assert agents[0].stages[0][0].prompt_tokens == 10


@pytest.mark.parametrize(
    "doc, message",
    [
        ({k: v for k, v in GOOD.items() if k != "type"}, "w.jsonl:2: field 'type' is missing"),
        (with_(arrival_s="soon"), "w.jsonl:2: field 'arrival_s' must be a number"),
        (with_(arrival_s=-1), "field 'arrival_s' must be a finite number >= 0"),
        (with_(stages=[]), "field 'stages' must hold at least one stage"),
        (with_(stages=[[]]), "field 'stages[0]' must be a non-empty list"),
        (with_(stages=[[{"prompt": "p", "prompt_tokens": 10}]]), "field 'stages[0][0].output_tokens' is missing"),
        (
            with_(stages=[[{"prompt": 3, "prompt_tokens": 10, "output_tokens": 5}]]),
            "field 'stages[0][0].prompt' must be a string",
        ),
        (
            with_(stages=[[{"prompt": "p", "prompt_tokens": 1.5, "output_tokens": 5}]]),
            "'stages[0][0].prompt_tokens' must be an integer",
        ),
        (
            with_(stages=[[{"prompt": "p", "prompt_tokens": 10, "output_tokens": 0}]]),
            "'stages[0][0].output_tokens' must be >= 1",
        ),
        (with_(priority=3), "unknown field 'priority'"),
        (with_(agent_id="a"), "field 'agent_id' repeats 'a' from line 1"),
    ],
)
def test_bad_line_names_line_and_field(tmp_path, doc, message):
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_workload(write(tmp_path, GOOD, doc))


def test_invalid_json_and_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"w\.jsonl:2: not valid JSON"):
        load_workload(write(tmp_path, GOOD, raw="{oops"))
    with pytest.raises(WorkloadError, match="no such workload file"):
        load_workload(tmp_path / "nope.jsonl")


def test_gzip_files_round_trip_append_and_fail_clearly(tmp_path):
    from justitia.workload import Agent, Task, append_agent, save_workload

    agents = [Agent(f"a{i}", "mrs", float(i), ((Task("p q", 3, 2),),), {"k": i}) for i in range(3)]
    path = save_workload(agents[:2], tmp_path / "w.jsonl.gz")
    append_agent(agents[2], path)  # a second gzip member
    assert load_workload(path) == agents
    assert [a.meta for a in load_workload(path)] == [{"k": 0}, {"k": 1}, {"k": 2}]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(path.read_bytes()[:-9])
    with pytest.raises(WorkloadError, match="gzip"):
        load_workload(cut)
