"""Theorem B.1: under Justitia, finish - GPS finish <= 2 c_max + C_max / M for every agent."""

import numpy as np
import pytest
from helpers import agent, engine, task_parallel_agents
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from justitia.core.policies import make_policy
from justitia.lab.metrics import delay_bound_s, gps_finish_times
from justitia.predictors import make_predictor
from justitia.sim import Simulator


def violations(agents, cfg, policy="justitia"):
    pol = make_policy(policy, cfg.capacity_per_s("kv"))
    res = Simulator(cfg, pol, make_predictor("oracle")).run(agents)
    gps = gps_finish_times(agents, cfg.capacity_per_s("kv"))
    bound = delay_bound_s(agents, cfg)
    late = {
        a.agent_id: a.finish_s - gps[a.agent_id] - bound for a in res.agents if a.finish_s > gps[a.agent_id] + bound
    }
    return late, bound


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), blocks=st.integers(90, 200), n=st.integers(2, 40))
def test_justitia_keeps_every_task_parallel_agent_within_the_bound(seed, blocks, n):
    # The theorem assumes requests are small next to M (the paper's stated limitation). Here a
    # request holds at most 350 tokens, under 25% of the smallest cache (90 blocks = 1,440 tokens).
    # Larger requests leave memory idle behind a head-of-line request and can overshoot:
    # docs/design.md records how often. Derandomized: the same examples in every run.
    agents = task_parallel_agents(np.random.default_rng(seed), n)
    late, bound = violations(agents, engine(blocks=blocks, budget=512, seqs=256))
    assert not late, f"agents over the {bound:.2f} s bound by: {late}"


@pytest.mark.parametrize("policy", ["srjf", "sjf"])
def test_shortest_first_starves_an_elephant_that_justitia_keeps_within_the_bound(policy):
    # An elephant among a stream of mice: shortest-first, agent-level (SRJF) or request-level
    # (SJF), holds it back past its GPS finish + bound until the mice stop coming.
    # The mice alone keep the 640-token cache busy most of the time until the stream ends at 30 s.
    elephant = agent("elephant", 0.0, [(100, 120)] * 20)
    mice = [agent(f"m{i:03d}", 0.15 * (i + 1), [(60, 40)] * 2) for i in range(200)]
    cfg = engine(blocks=40, budget=512)
    late, _ = violations([elephant, *mice], cfg, policy)
    assert "elephant" in late
    pol = make_policy(policy)
    res = Simulator(cfg, pol, make_predictor("oracle")).run([elephant, *mice])
    elephant_finish = next(a.finish_s for a in res.agents if a.agent_id == "elephant")
    assert elephant_finish > mice[-1].arrival_s  # starved until the mice stopped coming
    late, _ = violations([elephant, *mice], cfg, "justitia")
    assert not late
