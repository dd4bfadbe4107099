"""vLLM's own scheduler on the simulator's clock: does the simulator follow vLLM's rules?

    python scripts/replay.py [--results results/engine/results.json] [--policies fcfs,vtc,srjf,justitia,las]

Runs the ``engine`` preset's agents through an in-process vLLM engine (the tiny model, the plug-in
as its scheduler) one step at a time, but on a virtual clock: each step lasts what the bench's
calibrated profile says for its tokens, agents arrive on that clock, and a finished stage's next
requests go in before the next step (the simulator's hand-off, with no front-end latency). The
engine's timing is out of the picture, so what is left between this and the simulator is the
scheduling itself: which requests vLLM admits, preempts and serves in each step. Prints each
policy's mean JCT both ways and their steps and preemptions.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

CLOCK = [0.0]  # the virtual time, seconds: the plug-in's clock reads it


def replay(llm, scheduler, agents, policy: str, profile, capacity: float) -> dict:
    """One policy's run of ``agents`` on ``llm`` under the virtual clock."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from justitia.agent import AgentProcess, Answer
    from justitia.core import KV, ControlCall, RESET
    from justitia.predictors import make_predictor

    engine = llm.llm_engine
    CLOCK[0] = 0.0
    scheduler.control(ControlCall(RESET, {"policy": policy, "cost": "kv", "capacity_per_s": capacity,
                                          "measure_capacity": True}))
    scheduler.t0 = 0.0
    predictor = make_predictor("oracle", 0)
    pending = sorted(agents, key=lambda a: a.arrival_s)
    calls, procs, finish = {}, {}, {}
    nxt, steps, arrivals = 0, 0, [0]

    def submit(proc, new_calls):
        arrivals[0] += len(new_calls)
        for c in new_calls:
            calls[c.request_id] = (proc, c)
            params = SamplingParams(max_tokens=c.task.output_tokens, ignore_eos=True, temperature=0.0, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY, extra_args=c.meta.to_extra_args())
            ids = [3 + (k % 500) for k in range(c.task.prompt_tokens)]
            engine.add_request(c.request_id, TokensPrompt(prompt_token_ids=ids), params)

    while nxt < len(pending) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():
            CLOCK[0] = max(CLOCK[0], pending[nxt].arrival_s)
        while nxt < len(pending) and pending[nxt].arrival_s <= CLOCK[0] + 1e-12:
            agent = pending[nxt]
            nxt += 1
            proc = procs[agent.agent_id] = AgentProcess(agent, predictor, KV)
            submit(proc, proc.start())
        outputs = engine.step()
        steps += 1
        batched, ctx, requests = scheduler.replay_last
        CLOCK[0] += profile.iteration_s(batched, ctx, requests, arrivals[0])
        arrivals[0] = 0
        for out in outputs:
            if out.finished:
                proc, c = calls.pop(out.request_id)
                upcoming = proc.answered(c, Answer("", c.task.prompt_tokens, len(out.outputs[0].token_ids)))
                if upcoming:
                    submit(proc, upcoming)
                elif proc.done:
                    finish[proc.agent.agent_id] = CLOCK[0]
    jct = [finish[a.agent_id] - a.arrival_s for a in agents]
    return {"mean_jct_s": float(np.mean(jct)), "steps": steps, "jct_s": jct}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("results/engine/results.json"))
    ap.add_argument("--policies", default="fcfs,vtc,srjf,justitia,las")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from justitia.core import step_delivered
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.presets import make_preset
    from justitia.lab.vllm_bench import load_bench
    from justitia.vllm.models import resolve_model
    from justitia.vllm.plugin import JustitiaScheduler

    class Replay(JustitiaScheduler):
        """The plug-in on the virtual clock, keeping each step's token counts for it."""

        replay_last = (0, 0, 0)

        def _now(self) -> float:
            return CLOCK[0]

        def schedule(self, *a, **k):
            out = super().schedule(*a, **k)
            ctx = step_delivered(self.requests, out.num_scheduled_tokens)[4]
            self.replay_last = (out.total_num_scheduled_tokens, ctx, len(out.num_scheduled_tokens))
            return out

    doc, profile, spec, config = load_bench(args.results)
    preset = make_preset("engine", doc["workload"]["seed"])
    llm = LLM(model=str(resolve_model(spec.model)), scheduler_cls=Replay, scheduling_policy="priority",
              num_gpu_blocks_override=spec.kv_blocks, max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs,
              max_num_batched_tokens=spec.max_num_batched_tokens, enforce_eager=True, enable_prefix_caching=False,
              async_scheduling=False, dtype="float32")
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    report = {}
    for policy in args.policies.split(","):
        rep = replay(llm, scheduler, preset.agents, policy, profile, config.capacity_per_s("kv"))
        sim = simulate(preset.agents, RunSpec(policy, policy), config, doc["workload"]["seed"])
        sim_jct = float(np.mean([a.jct_s for a in sim.agents]))
        by_id = {a.agent_id: a.jct_s for a in sim.agents}
        diffs = np.abs(np.array(rep["jct_s"]) - np.array([by_id[a.agent_id] for a in preset.agents]))
        report[policy] = {"replay_mean_jct_s": rep["mean_jct_s"], "sim_mean_jct_s": sim_jct, "replay_steps": rep["steps"],
                          "sim_steps": sim.iterations, "max_agent_diff_s": float(diffs.max())}
        print(f"{policy:9s} vLLM's scheduler {rep['mean_jct_s']:6.2f} s ({rep['steps']} steps)  simulator {sim_jct:6.2f} s "
              f"({sim.iterations} steps)  {sim_jct / rep['mean_jct_s'] - 1:+.1%}; largest agent difference {diffs.max():.2f} s",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
