"""The learned (TF-IDF + MLP) cost predictor: persistence, safety, sanity of predictions, cold start."""

import json
import math
import pickle

import numpy as np
import pytest

pytest.importorskip("sklearn")

from justitia.core.cost import cost_model
from justitia.predictors.features import ALL_TYPES
from justitia.predictors.files import PredictorFileError
from justitia.predictors.mlp import LearnedPredictor
from justitia.predictors import make_predictor
from justitia.workload.workflows import WORKFLOW_TYPES, generate_agents
from justitia.workload import Agent, Task

KV = cost_model("kv")


@pytest.fixture(scope="module")
def agents():
    rng = np.random.default_rng(3)
    return generate_agents(np.zeros(12 * len(WORKFLOW_TYPES)), rng,
                           types=[t for t in WORKFLOW_TYPES for _ in range(12)])


@pytest.fixture(scope="module")
def trained(agents):
    return LearnedPredictor.train(agents[:-9], KV, seed=0, min_agents_per_type=8)


def test_save_load_predict_round_trip_gives_the_same_numbers(trained, agents, tmp_path):
    trained.save(tmp_path)
    loaded = LearnedPredictor.load(tmp_path)
    bare = make_predictor(str(tmp_path))  # `--predictor DIR`: the manifest says it is an mlp
    assert isinstance(bare, LearnedPredictor)
    for a in agents[-9:]:
        assert bare.agent_cost(a, KV) == loaded.agent_cost(a, KV)
        assert loaded.agent_cost(a, KV) == pytest.approx(trained.agent_cost(a, KV), rel=1e-12)
        assert loaded.request_cost(a, 0, 0, KV) == pytest.approx(trained.request_cost(a, 0, 0, KV), rel=1e-12)


def test_loading_a_tampered_or_pickled_weights_file_fails_clearly(trained, tmp_path):
    trained.save(tmp_path)
    weights = tmp_path / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(PredictorFileError, match="SHA-256 does not match"):
        LearnedPredictor.load(tmp_path)
    # a pickle in its place, with the manifest's hash "fixed" to match: still refused, never unpickled
    weights.write_bytes(pickle.dumps({"w": np.zeros(3)}))
    manifest = json.loads((tmp_path / "predictor.json").read_text())
    import hashlib

    manifest["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (tmp_path / "predictor.json").write_text(json.dumps(manifest))
    with pytest.raises(PredictorFileError, match="malformed predictor"):
        LearnedPredictor.load(tmp_path)
    (tmp_path / "predictor.json").write_text("not json")
    with pytest.raises(PredictorFileError, match="not valid JSON"):
        LearnedPredictor.load(tmp_path)
    with pytest.raises(PredictorFileError, match="not a predictor directory"):
        LearnedPredictor.load(tmp_path / "nowhere")


@pytest.mark.parametrize("prompt", ["", "x" * 100_000, "word " * 20_000, "\x00\n\t"])
def test_predictions_are_finite_and_positive_on_any_prompt(trained, prompt):
    for agent_type in ("mrs", "never-seen-type"):
        agent = Agent("a", agent_type, 0.0, ((Task(prompt, 1, 1),),))
        for value in (trained.agent_cost(agent, KV), trained.request_cost(agent, 0, 0, KV)):
            assert math.isfinite(value) and value > 0


def test_an_unseen_type_uses_the_all_types_model_and_its_error_shrinks_as_agents_finish(trained, agents):
    assert ALL_TYPES in trained.models
    relabelled = [Agent(a.agent_id, "brand-new", a.arrival_s, a.stages) for a in agents if a.type == "mrs"]
    fresh = LearnedPredictor(trained.models, "kv")
    errors = []
    for a in relabelled:
        predicted = fresh.agent_cost(a, KV)
        errors.append(abs(math.log(predicted / a.cost(KV))))
        fresh.observe(a.type, predicted, a.cost(KV))
    assert (None, "brand-new") in fresh.correction
    assert np.mean(errors[-4:]) <= np.mean(errors[:4]) + 0.05


def test_corrections_are_kept_per_tenant_and_type_and_clipped(trained, agents):
    """A tenant that keeps reporting agents far dearer (or cheaper) than predicted moves its own
    prices for the type, by at most 4x, and nobody else's; a fresh type name starts from none."""
    fresh = LearnedPredictor(trained.models, "kv")
    a = next(x for x in agents if x.type == "mrs")
    mine, theirs = (Agent(a.agent_id, a.type, a.arrival_s, a.stages, tenant=t) for t in ("mallory", "alice"))
    before = fresh.agent_cost(theirs, KV)
    for _ in range(50):
        fresh.observe("mrs", fresh.agent_cost(mine, KV), 1e6 * fresh.agent_cost(mine, KV), "mallory")
    assert fresh.agent_cost(theirs, KV) == before  # another tenant's prices stay put
    assert fresh.agent_cost(mine, KV) == pytest.approx(4 * before)  # moved, by the limit at most
    for _ in range(50):
        fresh.observe("mrs", fresh.agent_cost(mine, KV), 1e-6 * fresh.agent_cost(mine, KV), "mallory")
    assert fresh.agent_cost(mine, KV) == pytest.approx(before / 4)


def test_a_predictor_trained_on_kv_costs_refuses_compute_costs(trained, agents):
    with pytest.raises(ValueError, match="trained on 'kv' costs"):
        trained.agent_cost(agents[0], cost_model("compute"))
