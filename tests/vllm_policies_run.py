"""Replay the elephant-and-mice workload on one real vLLM engine under every policy (and justitia
with the learned predictor), then on stock vLLM with fcfs and justitia by front-end tagging (its
priority scheduling under the plug-in's step-log base); print JSON.

    python tests/vllm_policies_run.py

An elephant agent (16 requests) arrives at t=0; eleven one-request mice arrive from 0.3 s, every
0.4 s. The KV cache (8 blocks of 128 tokens) holds about two elephant requests at a time, so the
order in which the engine admits requests decides who waits. Then every agent in one tenant (one API
key's traffic) under justitia (hierarchical) and justitia-chained, through the plug-in and by
tagging. Beside each run's agents, under "<label> requests", each request's (id, sent, answered) in
seconds into the run: the order of answers within one run says who waited for whom, whatever the
engine's speed.
"""

import asyncio
import json
from dataclasses import asdict, replace

if __name__ == "__main__":
    from justitia.core.policies import POLICY_NAMES
    from justitia.engine.launch import EngineSpec
    from justitia.lab.live.runner import VllmEngine
    from justitia.workload import Agent, Task

    elephant = Agent(
        "elephant", "mrs", 0.0, (tuple(Task(f"Summarize part {i} of the annual report.", 256, 96) for i in range(16)),)
    )
    mice = [Agent(f"mouse-{k:02d}", "fv", 0.3 + 0.4 * k, ((Task(f"Verify claim {k}.", 32, 16),),)) for k in range(11)]
    agents = [elephant, *mice]
    one_tenant = [replace(a, tenant="T") for a in agents]  # one API key's traffic

    async def main():
        out = {}
        async with VllmEngine(EngineSpec(kv_blocks=8, max_num_seqs=16, max_model_len=512)) as engine:
            # every policy with true costs, then justitia with the MLP trained on the committed profile
            for label, policy, predictor in [(p, p, "oracle") for p in POLICY_NAMES] + [
                ("justitia@mlp", "justitia", "mlp")
            ]:
                run = await engine.run(agents, policy, predictor, capacity_per_s=engine.kv_tokens / 0.015)
                out[label] = {
                    r.agent_id: {
                        "finish_s": r.finish_s,
                        "jct_s": r.jct_s,
                        "predicted_cost": r.predicted_cost,
                        "cost": r.cost_token_iters,
                    }
                    for r in run.result.agents
                }
                out[f"{label} requests"] = run.requests
            # every agent in one tenant: hierarchical justitia, and the rule before it (arrival order)
            for policy in ("justitia", "justitia-chained"):
                run = await engine.run(one_tenant, policy, "oracle", capacity_per_s=engine.kv_tokens / 0.015)
                out[f"{policy}@one-tenant"] = {
                    r.agent_id: {"finish_s": r.finish_s, "jct_s": r.jct_s} for r in run.result.agents
                }
                out[f"{policy}@one-tenant requests"] = run.requests
        # front-end tagging: stock vLLM's priority scheduler (its steps logged), the policy in the runner
        spec = EngineSpec(kv_blocks=8, max_num_seqs=16, max_model_len=512, scheduler="priority-logged")
        async with VllmEngine(spec) as engine:
            for policy in ("fcfs", "justitia"):
                run = await engine.run(agents, policy, "oracle", capacity_per_s=engine.kv_tokens / 0.015)
                out[f"{policy}@tagging"] = {
                    r.agent_id: {"finish_s": r.finish_s, "jct_s": r.jct_s} for r in run.result.agents
                }
                out[f"{policy}@tagging steps"] = [asdict(row) for row in run.steps]
                out[f"{policy}@tagging requests"] = run.requests
            run = await engine.run(one_tenant, "justitia", "oracle", capacity_per_s=engine.kv_tokens / 0.015)
            out["justitia@tagging-one-tenant"] = {
                r.agent_id: {"finish_s": r.finish_s, "jct_s": r.jct_s} for r in run.result.agents
            }
            out["justitia@tagging-one-tenant requests"] = run.requests
        return out

    print("RESULT " + json.dumps(asyncio.run(main())))
