"""Small workloads and engines shared by the tests."""

from __future__ import annotations

import numpy as np

from justitia.sim import EngineConfig, LatencyProfile
from justitia.workload import Agent, Segment, Stage, Task

CONSTANT = LatencyProfile("const-10ms", 10.0, 0.0, 0.0, 0.0, 1.0, 64, "tests: every iteration 10 ms")


def engine(blocks: int = 64, budget: int = 256, seqs: int = 64, profile: LatencyProfile = CONSTANT) -> EngineConfig:
    """A small engine; by default every iteration takes 10 ms."""
    return EngineConfig(profile=profile, kv_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=seqs)


def agent(agent_id: str, arrival_s: float, *stages: list[tuple[int, int]], type: str = "t") -> Agent:
    """An agent from stages given as lists of (prompt_tokens, output_tokens)."""
    return Agent(agent_id, type, arrival_s, tuple(tuple(Task(f"{agent_id} task", p, d) for p, d in s) for s in stages))


def task_parallel_agents(rng, n: int) -> list[Agent]:
    """Single-stage agents (the theorem's task-parallel agents) with bursty arrivals."""
    t = 0.0
    out = []
    for i in range(n):
        t += float(rng.exponential(0.15))
        tasks = [(int(rng.integers(1, 200)), int(rng.integers(1, 150))) for _ in range(rng.integers(1, 12))]
        out.append(agent(f"a{i:03d}", round(t, 3), tasks))
    return out


def random_agents(
    rng: np.random.Generator,
    n: int,
    max_stages: int = 3,
    max_tasks: int = 8,
    max_prompt: int = 300,
    max_output: int = 120,
    mean_gap_s: float = 0.3,
) -> list[Agent]:
    """Random multi-stage agents with Poisson arrivals."""
    t = 0.0
    out = []
    for i in range(n):
        t += float(rng.exponential(mean_gap_s))
        stages = [
            [
                (int(rng.integers(1, max_prompt)), int(rng.integers(1, max_output)))
                for _ in range(rng.integers(1, max_tasks + 1))
            ]
            for _ in range(rng.integers(1, max_stages + 1))
        ]
        out.append(agent(f"a{i:03d}", round(t, 3), *stages))
    return out


def retained(obj, _seen: set | None = None) -> int:
    """How many entries the containers reachable from ``obj``'s attributes hold, walked generically
    through Justitia's objects (no private name read): what an object keeps per agent shows up
    here, whatever it is called."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        return len(obj) + sum(retained(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return len(obj) + sum(retained(v, seen) for v in obj)
    fields = getattr(obj, "__dict__", None)
    if fields is None or isinstance(obj, type) or not type(obj).__module__.startswith("justitia"):
        return 0  # only Justitia's own objects are walked (not a logger's registry, say)
    return sum(retained(v, seen) for v in fields.values())


def session(agent_id: str = "s", arrival_s: float = 0.0) -> Agent:
    """Turn 0: a call on a shared system prompt, a tool pause, a call on the conversation so far,
    then two subagents (one of two calls with a pause between them) whose outputs the last call
    reads; turn 1 after the user's 5 s."""
    sys = Segment.shared("system", 40)
    t0 = Task("hi", 50, 10, "t0", (sys,))
    t1 = Task("tool said", 50 + 10 + 7, 8, "t1", (Segment.prompt_of("t0"), Segment.output_of("t0")))
    b0 = (
        Stage([Task("sub a", 45, 6, "a0", (sys,))]),
        Stage(
            [Task("sub a again", 45 + 6 + 3, 4, "a1", (Segment.prompt_of("a0"), Segment.output_of("a0")))], pause_s=1.0
        ),
    )
    b1 = (Stage([Task("sub b", 44, 5, "b0", (sys,))]),)
    fork = Stage([], pause_s=0.5, branches=[b0, b1])
    t2 = Task(
        "merge",
        67 + 8 + 4 + 5 + 2,
        9,
        "t2",
        (Segment.prompt_of("t1"), Segment.output_of("t1"), Segment.output_of("a1"), Segment.output_of("b0")),
    )
    t3 = Task("next question", 86 + 9 + 5, 6, "t3", (Segment.prompt_of("t2"), Segment.output_of("t2")))
    stages = (Stage([t0], turn=0), Stage([t1], pause_s=2.0), fork, Stage([t2]), Stage([t3], pause_s=5.0, turn=1))
    return Agent(agent_id, "coding", arrival_s, stages)


def tiny_cpu_config() -> EngineConfig:
    """The simulated engine of the lab's CPU presets: the tiny model's steps on this machine as a
    recorded sessions-engine bench calibrated them (rounded), on the presets' engine settings."""
    from justitia.engine.launch import EngineSpec
    from justitia.lab.live.vllm_bench import engine_config
    from justitia.lab.presets import CPU_BLOCK_SIZE, ENGINE_OPTIONS

    profile = LatencyProfile(
        name="tiny-cpu",
        floor_ms=0.0,
        base_ms=1.85,
        per_batched_token_ms=0.015,
        per_context_token_ms=3e-5,
        scale=1.0,
        kv_blocks=23,
        source="rounded from a sessions-engine calibration",
        block_size=CPU_BLOCK_SIZE,
    )
    return engine_config(profile, EngineSpec(**ENGINE_OPTIONS), CPU_BLOCK_SIZE)
