"""Run one small agent scenario through real vLLM with the Justitia plug-in; print JSON.

    python tests/vllm_scenario.py POLICY

An elephant agent (8 requests) is submitted before a mouse agent (1 request) on an engine that
runs two requests at a time. Prints each request's agent and finish order.
"""

import json
import os
import sys

if __name__ == "__main__":
    os.environ["JUSTITIA_POLICY"] = sys.argv[1]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    from vllm import LLM, SamplingParams

    from justitia.vllm.models import tiny_model
    from justitia.vllm.scheduler import JustitiaScheduler

    llm = LLM(model=str(tiny_model()), scheduler_cls=JustitiaScheduler, scheduling_policy="priority",
              num_gpu_blocks_override=32, max_model_len=2048, max_num_seqs=2, enforce_eager=True,
              disable_log_stats=False)
    prompts, params, agents = [], [], []
    for i in range(8):
        prompts.append("Summarize the report on the regional water utility. " * 4)
        params.append(SamplingParams(max_tokens=60, ignore_eos=True,
                                     extra_args={"agent_id": "elephant", "agent_cost": 8 * 60 * 100.0}))
        agents.append("elephant")
    prompts.append("Verify the claim about the transit plan.")
    params.append(SamplingParams(max_tokens=10, ignore_eos=True,
                                 extra_args={"agent_id": "mouse", "agent_cost": 10 * 20.0}))
    agents.append("mouse")
    outs = llm.generate(prompts, params, use_tqdm=False)
    finished = [o.metrics.last_token_ts for o in outs]
    order = sorted(range(len(outs)), key=lambda i: finished[i])
    print(json.dumps({"finish_order": [agents[i] for i in order],
                      "tokens": [len(o.outputs[0].token_ids) for o in outs]}))
