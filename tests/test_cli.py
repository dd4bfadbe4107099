"""The command line: generate a workload, bench it, and the results schema."""

import json
import re

import pytest

from justitia.cli import main

REQUIRED = ("mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "makespan_s", "agents")


def test_generate_then_bench_writes_results_and_plots(tmp_path, capsys):
    wl = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--agents", "12", "--seed", "3", "--out", str(wl)]) == 0
    assert len(wl.read_text().splitlines()) == 12
    out = tmp_path / "out"
    rc = main(["bench", "--workload", str(wl), "--policies", "vtc,justitia,srjf", "--out", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == "justitia.results/1"
    for name in ("vtc", "justitia", "srjf"):
        assert all(k in doc["policies"][name] for k in REQUIRED)
        assert len(doc["policies"][name]["agents"]) == 12
    agent = doc["policies"]["justitia"]["agents"][0]
    assert {"agent_id", "type", "arrival_s", "finish_s", "jct_s", "cost_token_iters", "gps_finish_s"} <= set(agent)
    assert doc["policies"]["justitia"]["delay_bound_s"] > 0
    fair = doc["fairness"]["justitia_vs_vtc"]
    assert 0 <= fair["not_delayed_frac"] <= 1 and fair["max_delay"] >= 0
    assert (out / "jct_cdf.png").stat().st_size > 1000
    assert (out / "justitia_vs_vtc.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "justitia" in printed and "mean JCT" in printed


def test_same_seed_gives_the_same_results(tmp_path):
    docs = []
    for i in range(2):
        out = tmp_path / f"r{i}"
        main(
            [
                "bench",
                "--agents",
                "10",
                "--seed",
                "5",
                "--policies",
                "justitia,las",
                "--predictor",
                "noisy:3",
                "--out",
                str(out),
                "--no-plots",
                "--no-progress",
            ]
        )
        doc = json.loads((out / "results.json").read_text())
        docs.append({k: v["agents"] for k, v in doc["policies"].items()})
    assert docs[0] == docs[1]


def test_bad_input_is_one_clear_sentence_and_nothing_runs(tmp_path, capsys):
    wl = tmp_path / "bad.jsonl"
    wl.write_text(
        '{"agent_id": "a", "type": "t", "arrival_s": 0, '
        '"stages": [[{"prompt": "p", "prompt_tokens": "ten", "output_tokens": 3}]]}\n'
    )
    out = tmp_path / "out"
    assert main(["bench", "--workload", str(wl), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1: field 'stages[0][0].prompt_tokens' must be an integer" in err
    assert not out.exists()
    assert main(["bench", "--agents", "3", "--policies", "fcfs,magic", "--out", str(out)]) == 2
    assert "unknown policy 'magic'" in capsys.readouterr().err
    assert main(["bench", "--agents", "3", "--predictor", "noisy:x", "--out", str(out)]) == 2
    assert "noisy:L" in capsys.readouterr().err
    assert not out.exists()


def test_the_cost_switch_prices_agents_in_its_cost_model(tmp_path):
    from justitia.core import COMPUTE, KV
    from justitia.workload import load_workload

    wl = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--agents", "8", "--seed", "2", "--out", str(wl)]) == 0
    agents = load_workload(wl)
    priced = {}
    for model in (KV, COMPUTE):
        out = tmp_path / model.name
        assert (
            main(
                [
                    "bench",
                    "--workload",
                    str(wl),
                    "--policies",
                    "justitia",
                    "--cost",
                    model.name,
                    "--out",
                    str(out),
                    "--no-plots",
                    "--no-progress",
                ]
            )
            == 0
        )
        runs = json.loads((out / "results.json").read_text())["policies"]["justitia"]["agents"]
        priced[model.name] = {r["agent_id"]: r["predicted_cost"] for r in runs}
        # the oracle prices each agent at its true cost in the model asked for: p + 2d, or p*d + d^2/2
        assert priced[model.name] == pytest.approx({a.agent_id: a.cost(model) for a in agents})
    assert all(priced["compute"][a] < priced["kv"][a] for a in priced["kv"])


@pytest.mark.parametrize("argv", [["bench", "--preset", "nope"], ["bench", "--engine", "gpu"]])
def test_argparse_rejects_unknown_choices(argv):
    with pytest.raises(SystemExit):
        main(argv)


def test_presets_use_the_shipped_arrivals_and_name_no_local_path():
    import justitia.lab.presets as presets

    preset = presets.make_preset("noise")
    assert preset.workload_info["arrivals"] == "trace" and preset.workload_info["trace"] == "mooncake_conversation"
    assert len(preset.agents) == 300 and 90.0 < max(a.arrival_s for a in preset.agents) < 115.0
    # each run is what its label says: its predictor's noise, and retagging off only where it says so
    for s in preset.specs:
        noisy = s.label.split("@")[1].split("/")[0] if "@" in s.label else None
        assert s.predictor == noisy if noisy else s.predictor in ("oracle", "noisy:1")  # noisy:1, the exact price
        assert s.retag == (not s.label.endswith("/no-retag"))
    assert {"vtc", "justitia"} <= {s.label for s in preset.specs} and not all(s.retag for s in preset.specs)


def test_the_trojan_preset_hides_a_twentieth_of_the_cost_in_the_first_stage():
    import justitia.lab.presets as presets
    from justitia.core import KV
    from justitia.lab.workloads import TROJAN_PREFIX

    preset = presets.make_preset("trojan")
    trojans = [a for a in preset.agents if a.agent_id.startswith(TROJAN_PREFIX)]
    assert len(trojans) == preset.workload_info["trojans"] == round(0.1 * len(preset.agents))
    for a in trojans:
        first = sum(KV.request_cost(t.prompt_tokens, t.output_tokens) for t in a.stages[0])
        assert len(a.stages) == 2 and first / a.cost(KV) == pytest.approx(1 / 20)
    runs = {s.label: s for s in preset.specs}
    assert not runs["justitia@mlp/no-retag"].retag and runs["justitia@mlp/all-stages"].pricing == "all-stages"


def test_the_sustained_presets_stream_small_agents_at_a_multiple_of_what_the_engine_serves():
    import justitia.lab.presets as presets
    from justitia.lab.workloads import SUSTAINED_S

    over, near = presets.make_preset("sustained"), presets.make_preset("sustained-near")
    assert over.workload_info["rate_per_s"] / near.workload_info["rate_per_s"] == pytest.approx(1.2 / 0.95)
    for preset in (over, near):
        elephant, *mice = preset.agents
        assert elephant.agent_id == "elephant" and len(elephant.stages) == 2
        assert all(len(m.stages) == 1 and 1 <= len(m.stages[0]) <= 3 for m in mice)
        assert max(m.arrival_s for m in mice) < SUSTAINED_S
        rate = len(mice) / SUSTAINED_S  # Poisson: within a few percent of the asked rate
        assert rate == pytest.approx(preset.workload_info["rate_per_s"], rel=0.1)
        assert [s.label for s in preset.specs] == [
            "fcfs",
            "sjf",
            "parrot",
            "vtc",
            "srjf",
            "justitia",
            "las",
            "justitia@formula-M",
            "justitia@online",
            "srjf@online",
            "justitia-guarded@online",
        ]
        assert {s.predictor for s in preset.specs} == {"oracle", "online"}


def test_a_preset_prints_its_own_summary_and_an_agent_name_alone_prints_none(tmp_path, capsys):
    from helpers import agent

    import justitia.lab.presets as presets
    from justitia.workload import save_workload

    wl = save_workload(
        [
            agent("elephant", 0.0, [(400, 200)] * 6),
            agent("trojan-1", 0.5, [(50, 20)]),
            agent("mouse-1", 1.0, [(60, 30)] * 2),
        ],
        tmp_path / "w.jsonl",
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench",
                "--workload",
                str(wl),
                "--policies",
                "fcfs,justitia",
                "--out",
                str(out),
                "--no-plots",
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "elephant finishes" not in printed and "trojans" not in printed  # no preset, no summary
    doc = json.loads((out / "results.json").read_text())
    lines = presets.elephant_summary(doc)
    assert len(lines) == 3 and "elephant finishes" in lines[1] and "GPS finish" in lines[2]  # fcfs, justitia
    jct = {a["agent_id"]: a["jct_s"] for a in doc["policies"]["fcfs"]["agents"]}
    line = presets.trojan_summary(doc)[1]
    honest, trojans = (float(x) for x in re.findall(r"(\d+\.\d) s", line))
    assert line.split()[0] == "fcfs" and trojans == pytest.approx(jct["trojan-1"], abs=0.05)
    assert honest == pytest.approx((jct["elephant"] + jct["mouse-1"]) / 2, abs=0.05)
    assert presets.make_preset("starvation").summary is presets.elephant_summary


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0."),
        (["--key-rate", "inf"], "--key-rate must be a finite number >= 0, got inf."),
        (["--header-timeout", "0"], "--header-timeout must be a finite number > 0, got 0.0."),
        (["--journal", "j.sqlite", "--no-journal"], "--journal and --no-journal contradict each other."),
        (["--ray", "--upstream", "http://127.0.0.1:9"], "--ray and --upstream contradict each other"),
        (["--ray", "--replicas", "0"], "--replicas must be >= 1, got 0."),
        (
            ["--upstream", "http://127.0.0.1:9", "--enforce-eager"],
            "--enforce-eager: with --upstream, give vLLM's options",
        ),
        (
            ["--upstream", "http://127.0.0.1:9", "--calibration", "c.json"],
            "--calibration: for the engine justitia serve runs",
        ),
    ],
)
def test_serve_refuses_a_bad_setting_in_one_sentence_before_starting_anything(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    assert f"justitia: error: {message}" in capsys.readouterr().err


def test_serve_settings_check_themselves_when_made():
    from justitia.server.settings import ServeSettings

    with pytest.raises(ValueError, match="--drain-s must be a finite number >= 0"):
        ServeSettings(drain_s=float("nan"))
    with pytest.raises(ValueError, match="--key-agents-in-flight must be >= 1"):
        ServeSettings(key_agents_in_flight=0)
    assert ServeSettings(no_journal=True).journal_path() is None
    assert ServeSettings(policy="justitia-guarded").policy == "justitia-guarded"  # the lag guard, by name
    with pytest.raises(ValueError, match="--policy: unknown policy 'magic'; expected one of: .*justitia-guarded"):
        ServeSettings(policy="magic")
