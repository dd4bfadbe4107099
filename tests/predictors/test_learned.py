"""The learned (TF-IDF + MLP) cost predictor: persistence, safety, sanity of predictions, cold start."""

import json
import math
import pickle
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("sklearn")

from justitia.core.cost import cost_model
from justitia.predictors import make_predictor
from justitia.predictors.features import ALL_TYPES, agent_numbers, agent_text
from justitia.predictors.files import PredictorFileError
from justitia.predictors.mlp import CORRECTION_LIMIT, CORRECTION_WEIGHT, LearnedPredictor
from justitia.workload import Agent, Task
from justitia.workload.workflows import WORKFLOW_TYPES, generate_agents

KV = cost_model("kv")


@pytest.fixture(scope="module")
def agents():
    rng = np.random.default_rng(3)
    return generate_agents(
        np.zeros(12 * len(WORKFLOW_TYPES)), rng, types=[t for t in WORKFLOW_TYPES for _ in range(12)]
    )


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


def test_an_unseen_types_price_follows_the_correction_rule_per_tenant_and_type_within_the_clip(trained, agents):
    """An unseen type is priced by the all-types model, then moved toward what its finished agents
    cost: the first sets the correction, each later one by CORRECTION_WEIGHT, within CORRECTION_LIMIT,
    for its (tenant, type) only."""
    a = next(x for x in agents if x.type == "mrs")
    mine = Agent(a.agent_id, "brand-new", a.arrival_s, a.stages, tenant="t1")
    theirs = replace(mine, tenant="t2")  # another tenant, the same type
    my_other = replace(mine, type="other-new")  # the same tenant, another unseen type
    fresh = LearnedPredictor(trained.models, "kv")
    raw = fresh.agent_cost(mine, KV)
    assert raw == trained.models[ALL_TYPES]["agent"].predict(agent_text(mine), agent_numbers(mine))
    expected = None
    # actual costs as multiples of the raw prediction; 100 and 1/100 hit the clip
    for factor in (2.0, 3.0, 0.5, 0.5, 100.0, 1.0, 0.01, 0.01):
        predicted = fresh.agent_cost(mine, KV)
        fresh.observe("brand-new", predicted, factor * raw, "t1")
        err = math.log(factor)
        unclipped = err if expected is None else (1 - CORRECTION_WEIGHT) * expected + CORRECTION_WEIGHT * err
        expected = min(CORRECTION_LIMIT, max(-CORRECTION_LIMIT, unclipped))
        now = fresh.agent_cost(mine, KV)
        assert math.log(now / raw) == pytest.approx(expected, abs=1e-12), factor
        assert abs(math.log(now / (factor * raw))) <= abs(math.log(predicted / (factor * raw))) + 1e-12  # toward it
        assert abs(math.log(now / raw)) <= CORRECTION_LIMIT + 1e-12
        assert fresh.agent_cost(theirs, KV) == raw and fresh.agent_cost(my_other, KV) == raw
    assert fresh.correction == {("t1", "brand-new"): pytest.approx(-CORRECTION_LIMIT)}
    assert 0 < CORRECTION_WEIGHT < 1 and CORRECTION_LIMIT == pytest.approx(math.log(4))  # a mean; 4x, as documented


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
