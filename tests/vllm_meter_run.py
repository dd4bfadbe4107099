"""The plug-in's capacity meter inside real vLLM: a stream of agents saturates an in-process engine
under justitia; print the capacity schedule its clock ran at as JSON, with what the engine
delivered, counted apart from the meter: every request's KV token-time so far (``sum_j (200 + j)``
over the tokens it has sampled: the whole 60 once finished) over the time from the first step to
the last.

    python tests/vllm_meter_run.py
"""

import json
import time

if __name__ == "__main__":
    from vllm_inprocess import inprocess_engine  # tests/ is this script's directory

    llm, engine, sched = inprocess_engine(
        "justitia",
        max_num_seqs=16,
        JUSTITIA_ITERATION_S="0.004",  # a window is 100 steps of 4 ms (0.4 s of busy time)
        JUSTITIA_CAPACITY="5e6",
    )  # a guess far above what a CPU engine delivers (~0.05-0.7e6 here)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from justitia.core import RequestMeta

    sampled: dict[str, int] = {}  # request id -> tokens sampled so far
    started, k, first, last = time.monotonic(), 0, None, None
    while time.monotonic() - started < 20:  # a new agent of four requests every 80 ms: more than the engine serves
        if (time.monotonic() - started) > k * 0.08:
            meta = RequestMeta(f"a{k}", "t", 4 * (200 * 60 + 60 * 60 / 2), None, True).to_extra_args()
            for i in range(4):
                # prompts of their own: no prefix cache hit lets more requests in than the KV cache holds
                prompt = [(k * 131 + i * 17 + j) % 2000 + 3 for j in range(200)]
                engine.add_request(
                    f"a{k}-{i}",
                    TokensPrompt(prompt_token_ids=prompt),
                    SamplingParams(max_tokens=60, ignore_eos=True, extra_args=meta),
                )
            k += 1
        if engine.has_unfinished_requests():
            first = first or time.monotonic()
            for out in engine.step():
                sampled[out.request_id] = len(out.outputs[0].token_ids)
            last = time.monotonic()
    delivered = sum(sum(200 + j for j in range(n)) for n in sampled.values())
    print(
        "RESULT "
        + json.dumps(
            {
                "agents": k,
                "schedule": sched.core.clock().schedule,
                "delivered_per_s": delivered / (last - first),
                "finished": sum(n == 60 for n in sampled.values()),
                "state": sched.book.state(time.monotonic() - sched.t0).to_json(),
            }
        )
    )
