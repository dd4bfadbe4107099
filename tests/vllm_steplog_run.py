"""Stock vLLM's scheduler and the plug-in's step-log base (``StepLogScheduler``) on the same burst:
print each one's steps (what it scheduled, whom it preempted) and the base's step log as JSON.

    python tests/vllm_steplog_run.py

Both run in process, one after the other, on the same small KV cache (6 blocks of 128 tokens)
with vLLM's priority policy: 14 requests of mixed sizes and priorities, all queued at once, so
that the cache fills, requests are preempted and priorities decide who goes first. A step-log
base that decides nothing schedules step for step as vLLM does. Its log is the one
``JUSTITIA_STEP_LOG`` names (as a bench's door server is told), read before the engine stops: it is
written line by line from the engine's start, with no reset and no close.
"""

import json
import os
import tempfile
from dataclasses import asdict

if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    import gc

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.core.sched.scheduler import Scheduler

    from justitia.engine.models import tiny_model
    from justitia.vllm.plugin import StepLogScheduler
    from justitia.vllm.steplog import read_step_log

    def recording(cls):
        """``cls`` under a subclass that keeps every step's scheduled tokens and preemptions."""

        def schedule(self, *args, **kwargs):
            output = cls.schedule(self, *args, **kwargs)
            # (vLLM adds a random suffix to each request id: the id given is what comes before it)
            self.record.append(
                {
                    "scheduled": sorted((r.split("-")[0], n) for r, n in output.num_scheduled_tokens.items()),
                    "preempted": sorted(r.split("-")[0] for r in output.preempted_req_ids or ()),
                }
            )
            return output

        return type(f"Recording{cls.__name__}", (cls,), {"schedule": schedule, "record": None})

    # (prompt tokens, decode tokens, priority): a low priority number goes first
    burst = [(120 + 37 * (k % 5), 24 + 11 * (k % 4), (7 * k) % 5) for k in range(14)]

    def run(cls, standing: str | None):
        llm = LLM(
            model=str(tiny_model()),
            scheduler_cls=recording(cls),
            scheduling_policy="priority",
            num_gpu_blocks_override=6,
            max_model_len=512,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            enforce_eager=True,
            dtype="float32",
            async_scheduling=False,
            enable_prefix_caching=False,
        )
        engine = llm.llm_engine
        sched = engine.engine_core.engine_core.scheduler
        sched.record = []
        for k, (p, d, priority) in enumerate(burst):
            engine.add_request(
                f"r{k:02d}",
                TokensPrompt(prompt_token_ids=[3 + (k + i) % 400 for i in range(p)]),
                SamplingParams(max_tokens=d, ignore_eos=True, temperature=0.0),
                priority=priority,
            )
        finished = []
        while engine.has_unfinished_requests():
            finished += [out.request_id for out in engine.step() if out.finished]
        rows = [asdict(row) for row in read_step_log(standing)] if standing is not None else None  # still open
        record = sched.record
        engine.engine_core.shutdown()
        del llm, engine, sched
        gc.collect()
        return record, finished, rows

    fd, path = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    stock, stock_finished, _ = run(Scheduler, None)
    os.environ["JUSTITIA_STEP_LOG"] = path
    logged, logged_finished, rows = run(StepLogScheduler, path)
    os.unlink(path)
    print(
        "RESULT "
        + json.dumps(
            {
                "stock": stock,
                "logged": logged,
                "stock_finished": stock_finished,
                "logged_finished": logged_finished,
                "step_log": rows,
                "burst": burst,
            }
        )
    )
