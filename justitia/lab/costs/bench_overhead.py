"""How much time the Justitia plug-in adds to vLLM's scheduler per engine step.

    python -m justitia.lab.costs.bench_overhead [--requests 1000] [--out results/overhead.json]

Runs the same burst of requests (all queued at once) through one in-process vLLM engine per
scheduler: stock vLLM's (priority policy) and the plug-in under each policy. Every scheduler
method the plug-in overrides or feeds (``add_request``, ``schedule``, ``update_from_output``,
``finish_requests``) is timed with ``perf_counter``; the report is the mean scheduler time per
step, the plug-in's extra time over stock per step, that extra as a share of the mean step, and the
plug-in's own time per step (``Attribution``: its code alone, however it and vLLM's call each other),
and that net of the floor: the same count for a subclass of stock vLLM's scheduler whose methods
only call ``super()`` (what the counting costs, and what any first code after a forward pass pays).
Each scheduler runs ``--repeats`` times, interleaved with the others, and its fastest try counts.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from justitia.lab.report import write_doc

TIMED = ("add_request", "schedule", "update_from_output", "finish_requests")
PASSTHROUGH = "pass-through (floor)"


def timed(cls):
    """A subclass of scheduler ``cls`` that adds up the time spent in the ``TIMED`` methods."""

    def wrap(name):
        base = getattr(cls, name)

        def method(self, *args, **kwargs):
            t = time.perf_counter()
            try:
                return base(self, *args, **kwargs)
            finally:
                self.sched_s += time.perf_counter() - t
                if name == "schedule":
                    self.steps += 1
                    self.max_waiting = max(self.max_waiting, len(self.waiting))

        return method

    def init(self, *args, **kwargs):
        cls.__init__(self, *args, **kwargs)
        self.sched_s, self.steps, self.max_waiting = 0.0, 0, 0

    return type(f"Timed{cls.__name__}", (cls,), {"__init__": init} | {n: wrap(n) for n in TIMED})


class Attribution:
    """Wall time split between the plug-in's own code and vLLM's, however they nest.

    Every instrumented method says whose code it is; the time between two entries or exits goes to
    whoever's method is innermost then. vLLM's scheduler calls into the plug-in (its waiting queue,
    its request hooks) and the plug-in calls vLLM back (``super()``), so a difference of two
    totals would mix them; this does not."""

    def __init__(self):
        self.stack: list[str] = []
        self.last = 0.0
        self.spent = {"plugin": 0.0, "vllm": 0.0}

    def wrap(self, fn, owner: str):
        def method(*args, **kwargs):
            now = time.perf_counter()
            if self.stack:
                self.spent[self.stack[-1]] += now - self.last
            self.stack.append(owner)
            self.last = now
            try:
                return fn(*args, **kwargs)
            finally:
                now = time.perf_counter()
                self.spent[self.stack.pop()] += now - self.last
                self.last = now

        return method


ATTRIBUTION = Attribution()


def passthrough_scheduler():
    """Stock vLLM's scheduler under a subclass whose methods only call ``super()``, instrumented as
    the plug-in's are: its "own" time is the floor, what the counting costs and what the first
    Python to run after a forward pass pays for cold caches, whoever's code that is."""
    from vllm.v1.core.sched.scheduler import Scheduler

    def through(name):
        def method(self, *args, **kwargs):
            return getattr(super(PassThrough, self), name)(*args, **kwargs)

        method.__name__ = name
        return method

    PassThrough = type("PassThrough", (Scheduler,), {n: through(n) for n in FLOOR})
    return PassThrough


FLOOR = ("schedule", "update_from_output", "_free_request", "_preempt_request")


def instrument(passthrough) -> None:
    """Mark vLLM's scheduler methods as vLLM's, and the plug-in's queue and hooks (and the
    pass-through subclass's methods) as the plug-in's."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from justitia.vllm.plugin import JustitiaScheduler, StepLogScheduler, _CoreQueue

    for name in (*TIMED, "_free_request", "_preempt_request"):
        setattr(Scheduler, name, ATTRIBUTION.wrap(getattr(Scheduler, name), "vllm"))
    # the plug-in's methods on a step's path, in its step-log base and in the scheduler itself
    for cls in (StepLogScheduler, JustitiaScheduler):
        for name in (*TIMED, "_free_request", "_preempt_request", "_queue", "_before_step", "_after_step"):
            if name in cls.__dict__:
                setattr(cls, name, ATTRIBUTION.wrap(cls.__dict__[name], "plugin"))
    for name in FLOOR:
        setattr(passthrough, name, ATTRIBUTION.wrap(passthrough.__dict__[name], "plugin"))
    for name in (
        "add_request",
        "prepend_request",
        "prepend_requests",
        "peek_request",
        "pop_request",
        "remove_request",
        "remove_requests",
        "__bool__",
        "__len__",
        "__iter__",
    ):
        setattr(_CoreQueue, name, ATTRIBUTION.wrap(_CoreQueue.__dict__[name], "plugin"))


def run(label: str, scheduler_cls, model: str, n: int, policy: str | None) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if policy:
        os.environ["JUSTITIA_POLICY"] = policy
    llm = LLM(
        model=model,
        scheduler_cls=timed(scheduler_cls),
        scheduling_policy="priority",
        num_gpu_blocks_override=64,
        max_model_len=2048,
        max_num_seqs=32,
        enforce_eager=True,
        enable_prefix_caching=False,
        async_scheduling=False,
        dtype="float32",
    )
    prompts, params = [], []
    for i in range(n):
        prompts.append(TokensPrompt(prompt_token_ids=[3 + (i + k) % 1000 for k in range(64)]))
        params.append(
            SamplingParams(
                max_tokens=32,
                ignore_eos=True,
                detokenize=False,
                extra_args={"agent_id": f"a{i // 8}", "agent_cost": 5000.0 + i},
            )
        )
    llm.generate(prompts[:32], params[:32], use_tqdm=False)  # warm-up
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    sched.sched_s, sched.steps, sched.max_waiting = 0.0, 0, 0
    ATTRIBUTION.spent = {"plugin": 0.0, "vllm": 0.0}
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    out = {
        "run": label,
        "steps": sched.steps,
        "max_waiting": sched.max_waiting,
        "wall_s": wall,
        "step_ms": 1000 * wall / sched.steps,
        "scheduler_ms_per_step": 1000 * sched.sched_s / sched.steps,
        "plugin_ms_per_step": 1000 * ATTRIBUTION.spent["plugin"] / sched.steps,
    }
    llm.llm_engine.engine_core.shutdown()
    del llm
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--policies", default="fcfs,justitia,vtc,srjf")
    ap.add_argument("--repeats", type=int, default=2, help="tries per scheduler; the fastest counts (default 2)")
    ap.add_argument("--out", type=Path, default=Path("results/overhead.json"))
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    from vllm.v1.core.sched.scheduler import Scheduler

    from justitia.engine.models import tiny_model
    from justitia.vllm.plugin import JustitiaScheduler

    passthrough = passthrough_scheduler()
    instrument(passthrough)

    model = str(tiny_model())
    configs = [("stock vLLM (priority)", Scheduler, None), (PASSTHROUGH, passthrough, None)]
    configs += [(f"plug-in {p}", JustitiaScheduler, p) for p in args.policies.split(",")]
    tries: dict[str, list[dict]] = {label: [] for label, _, _ in configs}
    for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine hits every config
        for label, cls, policy in configs:
            tries[label].append(run(label, cls, model, args.requests, policy))
    # the fastest try of each: noise on a shared machine only ever adds time
    rows = [
        min(runs, key=lambda r: r["plugin_ms_per_step"] if r["plugin_ms_per_step"] else r["scheduler_ms_per_step"])
        | {"tries": len(runs)}
        for runs in tries.values()
    ]
    stock, floor = rows[0]["scheduler_ms_per_step"], rows[1]["plugin_ms_per_step"]
    for row in rows:
        row["extra_ms_per_step"] = row["scheduler_ms_per_step"] - stock
        row["extra_share_of_step"] = row["extra_ms_per_step"] / row["step_ms"]
        if row["run"].startswith("plug-in"):
            row["plugin_net_ms_per_step"] = row["plugin_ms_per_step"] - floor
    write_doc(args.out, {"requests": args.requests, "runs": rows})
    print(
        f"{'run':<24}{'steps':>7}{'max queued':>11}{'step ms':>9}{'sched ms':>10}{'extra ms':>10}{'extra %':>9}"
        f"{'plug-in ms':>12}{'net of floor':>14}"
    )
    for r in rows:
        net = f"{r['plugin_net_ms_per_step']:>14.3f}" if "plugin_net_ms_per_step" in r else f"{'-':>14}"
        print(
            f"{r['run']:<24}{r['steps']:>7}{r['max_waiting']:>11}{r['step_ms']:>9.2f}{r['scheduler_ms_per_step']:>10.3f}"
            f"{r['extra_ms_per_step']:>10.3f}{r['extra_share_of_step']:>9.1%}{r['plugin_ms_per_step']:>12.3f}{net}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
