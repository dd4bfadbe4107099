"""A clairvoyant upper reference for a session's turn prices: each turn priced by a distribution
that knows its calls' true mean cost and draws only its number of calls from the session
generator's own distribution (``calls_per_turn`` in ``justitia/data/sessions.json``).

    python -m justitia.lab.studies.sessions_ideal      # the sessions preset's workload, justitia only (20 s)

A what-if, not a predictor (it reads the true cost), to set beside ``online``'s row of the
``sessions`` preset. It bounds nothing about pricing from what a server sees: the mean call cost
it knows explains 71 % of the variance of a turn's log cost, against 9 % for what a turn's start
shows (its first prompt's length, its index). What it leaves to chance, the number of calls, the
``sessions`` generator draws for each turn independently of anything seen at its start (the log of
it correlates -0.06 with the first prompt's length, -0.04 with the turn index).
"""

from __future__ import annotations

import argparse
import math

from justitia.core import CostDist
from justitia.lab.studies.sessions import sessions_workload
from justitia.predictors.base import OraclePredictor
from justitia.sim import EngineConfig, Simulator
from justitia.sim.config import load_profile
from justitia.workload.sessions import load_session_params

Z = [-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341]  # normal quantiles at (k + 0.5) / 8


class KnownCallsCost(OraclePredictor):
    """A turn's price: its calls' true mean cost times a number of calls drawn from the generator's
    lognormal (8 quantiles, at least 1)."""

    name = "known-call-cost"

    def __init__(self) -> None:
        spec = load_session_params()["calls_per_turn"]
        self.calls = [max(1.0, spec["median"] * math.exp(spec["sigma"] * z)) for z in Z]

    def turn_dist(self, agent, turn, earlier, model):
        total = OraclePredictor.turn_cost(self, agent, turn, earlier, model)
        per_call = total / len(agent.turn_calls(turn))
        return CostDist.from_samples([per_call * n for n in self.calls])


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    agents, _ = sessions_workload(0)
    config = EngineConfig(profile=load_profile("llama7b-a100-40gb"), prefix_caching=True)
    run = Simulator(config, "justitia", KnownCallsCost(), "kv", measure_capacity=True).run(
        agents
    )  # as the bench runs it
    turns = [t for a in run.agents for t in a.turns_s]
    print(
        f"justitia, each turn priced by its calls' true mean cost and the generator's number of calls: "
        f"mean turn time {sum(turns) / len(turns):.1f} s over {len(turns)} turns"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
