"""The nine workflow generators: structure, context limit, size mix, length hints and determinism."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from justitia.core.cost import kv_token_iters
from justitia.workload import WorkloadError, load_workload, parameters, save_workload, workflows
from justitia.workload.workflows import (
    SIZE_CLASSES,
    WORKFLOW_TYPES,
    generate_agent,
    generate_agents,
    load_workflow_params,
)

PARAMS = load_workflow_params()
MAX_CTX = PARAMS["max_context_tokens"]


def _agents(workflow: str, size: str, count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [generate_agent(workflow, size, f"{workflow}-{i}", 0.0, rng) for i in range(count)]


def _kv(agent) -> float:
    return sum(kv_token_iters(t.prompt_tokens, t.output_tokens) for t in agent.tasks)


def _spearman(x, y) -> float:
    rx = np.argsort(np.argsort(np.asarray(x, dtype=float)))
    ry = np.argsort(np.argsort(np.asarray(y, dtype=float)))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_names_and_parameter_file():
    assert WORKFLOW_TYPES == ("mrs", "dm", "cc", "kqa", "ev", "fv", "alfworld", "sc", "search")
    assert SIZE_CLASSES == ("small", "medium", "large")
    assert MAX_CTX == 4096
    for name in WORKFLOW_TYPES:
        wf = PARAMS["workflows"][name]
        assert wf["why"] and wf["sizes_why"]
        assert all(stage["why"] for stage in wf["stages"])


def test_unknown_names_raise_value_error_listing_valid_ones():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="unknown workflow 'nope'.*mrs, dm, cc"):
        generate_agent("nope", "small", "a", 0.0, rng)
    with pytest.raises(ValueError, match="unknown size class 'huge'.*small, medium, large"):
        generate_agent("mrs", "huge", "a", 0.0, rng)
    with pytest.raises(ValueError, match="unknown workflow 'x'"):
        generate_agents([0.0], rng, types=["mrs", "x"])
    with pytest.raises(ValueError, match="size_probs"):
        generate_agents([0.0], rng, size_probs=(0.5, 0.2, 0.2))
    with pytest.raises(ValueError, match="arrival_s"):
        generate_agent("mrs", "small", "a", -1.0, rng)


def test_same_seed_gives_identical_json_and_other_seeds_differ():
    arrivals = [0.5 * i for i in range(40)]

    def dump(seed):
        agents = generate_agents(arrivals, np.random.default_rng(seed))
        return json.dumps([a.to_json() for a in agents])

    assert dump(7) == dump(7)
    assert dump(7) != dump(8)


def test_generate_agents_ids_arrivals_and_types():
    arrivals = [0.0, 1.5, 2.0, 9.25]
    agents = generate_agents(arrivals, np.random.default_rng(1), types=["ev", "sc"], id_prefix="job")
    assert [a.agent_id for a in agents] == ["job-0000", "job-0001", "job-0002", "job-0003"]
    assert [a.arrival_s for a in agents] == arrivals
    assert {a.type for a in agents} <= {"ev", "sc"}
    assert all(a.meta["size"] in SIZE_CLASSES for a in agents)


def test_size_mix_follows_the_parameter_file():
    agents = generate_agents([0.0] * 3000, np.random.default_rng(2), types=["kqa", "fv"])
    sizes = [a.meta["size"] for a in agents]
    share = {s: sizes.count(s) / len(sizes) for s in SIZE_CLASSES}
    mix = PARAMS["size_mix"]
    assert set(mix) == set(SIZE_CLASSES) and mix["small"] > mix["medium"] > mix["large"] > 0
    for size in SIZE_CLASSES:
        assert abs(share[size] - mix[size]) < 0.03
    # given explicitly, the same mix draws the same agents
    again = generate_agents(
        [0.0] * 3000, np.random.default_rng(2), types=["kqa", "fv"], size_probs=[mix[s] for s in SIZE_CLASSES]
    )
    assert [a.meta["size"] for a in again] == sizes


def test_types_are_drawn_uniformly():
    agents = generate_agents([0.0] * 900, np.random.default_rng(3), types=["kqa", "fv", "ev"])
    counts = [sum(a.type == t for a in agents) for t in ("kqa", "fv", "ev")]
    assert all(abs(c / 900 - 1 / 3) < 0.06 for c in counts)


@pytest.mark.parametrize("workflow", WORKFLOW_TYPES)
def test_every_task_fits_the_context_and_has_text(workflow):
    for size, count in (("small", 30), ("medium", 15), ("large", 4)):
        for agent in _agents(workflow, size, count, seed=11):
            assert agent.type == workflow and agent.meta == {"size": size}
            for task in agent.tasks:
                assert task.prompt_tokens >= 1 and task.output_tokens >= 1
                assert task.prompt_tokens + task.output_tokens <= MAX_CTX
                # The prompt text is real words, about 0.75 words per prompt token.
                assert 0.65 <= len(task.prompt.split()) / task.prompt_tokens <= 0.9


def _shape(agent) -> list[int]:
    return [len(stage) for stage in agent.stages]


@pytest.mark.parametrize("size", SIZE_CLASSES)
def test_stage_structure(size):
    count = 6 if size == "large" else 20
    for a in _agents("mrs", size, count):
        n = len(a.stages[0])
        assert _shape(a) == [n, 1]
        reduce_prompt = a.stages[1][0].prompt
        assert f"Combine the {n} chunk summaries" in reduce_prompt
        assert len(re.findall(r"^Summary \d+:$", reduce_prompt, flags=re.M)) == n
    for a in _agents("dm", size, count):
        n = len(a.stages[0])
        assert _shape(a) == [n, n]
        assert len({t.prompt.split("\n\n", 1)[1] for t in a.stages[0]}) == 1, "merges share the sources"
        assert all(f"Merged version {i + 1}:" in t.prompt for i, t in enumerate(a.stages[1]))
    for a in _agents("cc", size, count):
        assert _shape(a) == [len(a.stages[0]), 1]
    for a in _agents("kqa", size, count):
        n = len(a.stages[1])
        assert _shape(a) == [1, n, 1]
        assert all("Draft answer:" in t.prompt for t in a.stages[1])
        final = a.stages[2][0].prompt
        assert "Draft answer:" in final
        assert len(re.findall(r"^Verification answer \d+:$", final, flags=re.M)) == n
    for a in _agents("ev", size, count):
        assert len(a.stages) == 1
    for a in _agents("fv", size, count):
        assert _shape(a) == [1, len(a.stages[1])]
    for a in _agents("sc", size, count):
        assert len(a.stages) == 1
        assert len({t.prompt for t in a.stages[0]}) == 1, "self-consistency samples share one prompt"
    for a in _agents("search", size, count):
        assert _shape(a) == [1, len(a.stages[1]), 1]
    for a in _agents("alfworld", size, count):
        assert all(len(stage) == 1 for stage in a.stages)
        prompts = [t.prompt_tokens for t in a.tasks]
        assert prompts == sorted(prompts), "the history only grows"


def test_fanout_follows_the_size_class():
    for workflow in WORKFLOW_TYPES:
        spec = PARAMS["workflows"][workflow]["fanout"]
        for size in SIZE_CLASSES:
            agents = _agents(workflow, size, 5 if size == "large" else 15, seed=4)
            widest = [
                max(len(stage) for stage in a.stages) if workflow != "alfworld" else len(a.stages) for a in agents
            ]
            assert all(spec[size]["min"] <= w <= spec[size]["max"] for w in widest), (workflow, size)


def test_later_prompts_grow_with_earlier_outputs():
    for a in _agents("mrs", "small", 40):
        map_out = sum(t.output_tokens for t in a.stages[0])
        reduce = a.stages[1][0]
        assert reduce.prompt_tokens >= min(map_out, MAX_CTX - reduce.output_tokens - 100)
    agents = _agents("alfworld", "medium", 20)
    grow = [a.tasks[-1].prompt_tokens - a.tasks[0].prompt_tokens for a in agents]
    assert all(g > 0 for g in grow)
    fv = _agents("fv", "medium", 60) + _agents("fv", "small", 60)
    assert _spearman([len(a.stages[1]) for a in fv], [a.stages[0][0].output_tokens for a in fv]) > 0.7


def _hints(prompt: str) -> tuple[int | None, float | None]:
    """(body words hint, output tokens implied by the hint) parsed from an instruction."""
    instruction = prompt.split("\n\n", 1)[0]
    body = re.search(r"about (\d+) words", instruction)
    out = re.search(r"(?:in|of) about (\d+) (sentences|words)", instruction)
    out_tokens = None
    if out:
        k = int(out.group(1))
        out_tokens = k * PARAMS["tokens_per_sentence"] if out.group(2) == "sentences" else k / PARAMS["words_per_token"]
    return (int(body.group(1)) if body else None), out_tokens


@pytest.mark.parametrize("workflow", WORKFLOW_TYPES)
def test_prompt_hints_track_true_lengths(workflow):
    body_pairs, out_pairs = [], []
    for size, count in (("small", 60), ("medium", 20)):
        for agent in _agents(workflow, size, count, seed=5):
            for task in agent.tasks:
                body_hint, out_hint = _hints(task.prompt)
                if body_hint is not None:
                    body_pairs.append((body_hint, task.prompt_tokens))
                if out_hint is not None:
                    out_pairs.append((out_hint, task.output_tokens))
    assert len(body_pairs) > 50
    assert _spearman(*zip(*body_pairs)) > 0.5
    if workflow != "fv" and workflow != "search":
        assert len(out_pairs) > 50
    if out_pairs:
        assert _spearman(*zip(*out_pairs)) > 0.5
        ratio = np.median([h / t for h, t in out_pairs])
        assert 0.7 < ratio < 1.4, "the hint is a noisy but unbiased statement of the output length"


def test_mrs_large_is_an_elephant():
    small = np.mean([_kv(a) for a in _agents("mrs", "small", 100, seed=6)])
    large = np.mean([_kv(a) for a in _agents("mrs", "large", 10, seed=6)])
    assert large > 30 * small


def test_round_trip_through_workload_file(tmp_path):
    agents = generate_agents(
        [0.0, 1.0, 2.5, 3.0, 7.0, 8.0, 9.5, 11.0, 12.0], np.random.default_rng(9), types=list(WORKFLOW_TYPES)
    )
    path = save_workload(agents, tmp_path / "w.jsonl")
    loaded = load_workload(path)
    assert [a.to_json() for a in loaded] == [a.to_json() for a in agents]
    assert loaded == agents


def test_bad_parameter_file_names_file_and_field(tmp_path, monkeypatch):
    doc = json.loads(parameters.PARAMS_PATH.read_text(encoding="utf-8"))
    doc["workflows"]["cc"]["stages"][1]["output_tokens"]["max"] = -1
    bad = tmp_path / "workflows.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    monkeypatch.setattr(parameters, "PARAMS_PATH", bad)
    with pytest.raises(WorkloadError, match=r"workflows\.json: field 'workflows\.cc\.stages\[1\]\.output_tokens\.max'"):
        load_workflow_params()
    doc["workflows"]["cc"]["stages"][1]["output_tokens"]["max"] = 700
    doc["workflows"]["cc"]["stages"][0]["instruction"] = "Review {file_name}."
    bad.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"stages\[0\]\.instruction.*\{file_name\}"):
        load_workflow_params()
    doc["workflows"]["cc"]["stages"][0]["instruction"] = "Review {topic}."
    doc["size_mix"]["large"] = 0.5
    bad.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"field 'size_mix' must be .*summing to 1"):
        load_workflow_params()
    bad.write_text('{"max_context_tokens": 4096,\n oops}', encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"workflows\.json:2: not valid JSON"):
        load_workflow_params()


def _drive(workflow: str, seed: int, answer) -> list:
    """Run ``staged_agent`` to the end, answering each task with ``answer(stage, task)``."""
    gen = workflows.staged_agent(workflow, "small", np.random.default_rng(seed), scale=4)
    stages = [next(gen)]
    while True:
        try:
            stages.append(gen.send([answer(len(stages) - 1, i, t) for i, t in enumerate(stages[-1])]))
        except StopIteration:
            return stages


@pytest.mark.parametrize("workflow", ["mrs", "kqa", "alfworld", "search"])  # stages with earlier outputs in context
def test_staged_agent_quotes_the_real_answers(workflow):
    def answer(s, i, task):
        return f"ANSWER-{s}-{i} zebra quokka", 7

    stages = _drive(workflow, 3, answer)
    assert len(stages) >= 2
    last = "".join(t.prompt for t in stages[-1])
    assert any(f"ANSWER-{e}-" in last for e in range(len(stages) - 1)), "the last stage quotes an earlier answer"
    assert "ANSWER-" not in "".join(t.prompt for t in stages[0])
    # the drawn shape (fan-out, rounds) does not depend on the answers
    assert len(_drive(workflow, 3, lambda s, i, t: ("x", 1))) == len(stages)


def test_scale_divides_drawn_lengths_and_leaves_the_default_unchanged():
    def draw(scale):  # one generator per agent: text lengths change how many draws each agent uses
        return [
            generate_agent("mrs", "small", f"mrs-{i}", 0.0, np.random.default_rng([8, i]), scale=scale)
            for i in range(20)
        ]

    full, small = draw(1), draw(8)
    assert [a.to_json() for a in full] == [a.to_json() for a in draw(1.0)]
    assert [len(a.stages[0]) for a in small] == [len(a.stages[0]) for a in full]  # same fan-out
    ratio = sum(t.output_tokens for a in full for t in a.tasks) / sum(t.output_tokens for a in small for t in a.tasks)
    assert 7 < ratio < 9
    assert small[0].meta == {"size": "small", "scale": 8}
    with pytest.raises(ValueError, match="scale"):
        generate_agent("mrs", "small", "x", 0.0, np.random.default_rng(0), scale=0)


def test_output_cap_per_workflow():
    caps = {w: workflows.output_cap(w, "small") for w in WORKFLOW_TYPES}
    assert all(c >= 32 for c in caps.values())
    assert workflows.output_cap("mrs", "small", scale=8) < caps["mrs"]
    assert workflows.output_cap("mrs", "small", limit=40) <= 40
    drawn = max(t.output_tokens for a in _agents("mrs", "small", 50) for t in a.tasks)
    assert drawn <= caps["mrs"]
