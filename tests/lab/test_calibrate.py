"""Fitting a latency profile to engine steps, profile files, token scaling, and vLLM CLI checks."""

import json

import numpy as np
import pytest

from justitia.cli import main
from justitia.lab.live.calibrate import delivered_capacity, fit_profile, step_durations
from justitia.sim.config import LatencyProfile, load_profile
from justitia.vllm.steplog import StepRow
from justitia.workload import Agent, Task, scale_tokens


def synthetic_steps(base_ms, per_tok_ms, per_ctx_ms, n=400, seed=0, idle_every=0):
    """A step log whose durations follow the profile exactly; every ``idle_every``-th step is followed by a gap."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    for k in range(n):
        batched, ctx = int(rng.integers(1, 2048)), int(rng.integers(0, 20000))
        idle = idle_every and k % idle_every == idle_every - 1
        rows.append(StepRow(t, batched, ctx, 1, 3, 0 if idle else 1, 0))
        t += (base_ms + per_tok_ms * batched + per_ctx_ms * ctx) / 1000 + (5.0 if idle else 0.0)
    return rows


def simulated_engine(profile: LatencyProfile, speed, logged, schedulers=None):
    """A stand-in for vllm_bench's VllmEngine: the simulator, each run at ``speed()``'s factor on
    ``profile``'s step times, with a step log of steps that follow that factor where ``logged(spec)``
    (an engine that logs its steps); each engine's scheduler is appended to ``schedulers``."""
    from dataclasses import replace

    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.live import vllm_bench
    from justitia.lab.live.runner import EngineRun

    class SimulatedEngine:
        def __init__(self, spec):
            self.spec, self.block_size, self.kv_tokens = spec, 128, profile.kv_blocks * 128
            if schedulers is not None:
                schedulers.append(spec.scheduler)

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def run(
            self,
            run_agents,
            policy,
            predictor="oracle",
            cost="kv",
            capacity_per_s=None,
            seed=0,
            on_agent_finish=None,
            **_,
        ):
            x = speed(policy, len(run_agents))
            config = vllm_bench.engine_config(replace(profile, scale=x), self.spec, 128)
            steps = (
                synthetic_steps(
                    profile.base_ms * x, profile.per_batched_token_ms * x, profile.per_context_token_ms * x, n=50
                )
                if logged(self.spec)
                else []
            )
            return EngineRun(simulate(run_agents, RunSpec(policy, policy, predictor), config, seed), steps, 0.0)

    return SimulatedEngine


def test_the_fit_recovers_the_coefficients_and_ignores_steps_before_an_idle_gap():
    rows = synthetic_steps(7.5, 0.03, 0.0004, idle_every=10)
    assert len(step_durations(rows)) == 400 - 40  # steps before an idle gap (the last one among them) drop out
    profile, stats = fit_profile([rows], "fit", 23, 128, "test")
    assert profile.base_ms == pytest.approx(7.5, rel=1e-6)
    assert profile.per_batched_token_ms == pytest.approx(0.03, rel=1e-6)
    assert profile.per_context_token_ms == pytest.approx(0.0004, rel=1e-6)
    assert stats["r2"] == pytest.approx(1.0)
    assert profile.block_size == 128 and profile.kv_blocks == 23


def test_calibration_measures_m_over_the_steps_that_started_with_requests_waiting():
    # (t, batched, ctx, prefills, decodes, busy_after, preemptions, waiting_before, delivered_kv)
    lines = [
        (0.00, 64, 0, 1, 0, 1, 0, 0, 0),  # nothing waited: not counted
        (0.01, 8, 900, 0, 8, 1, 0, 3, 900),  # 900 delivered in 0.02 s while 3 waited
        (0.03, 8, 1000, 0, 8, 0, 0, 2, 1000),  # an idle gap follows: no measurable duration
        (0.50, 8, 500, 0, 8, 1, 0, 1, 500),  # 500 in 0.01 s
        (0.51, 8, 500, 0, 8, 1, 0, 0, 500),
    ]
    per_s, busy_s = delivered_capacity([[StepRow(*line) for line in lines]])
    assert per_s == pytest.approx(1400 / 0.03) and busy_s == pytest.approx(0.03)
    old = [StepRow(*line[:7]) for line in lines]  # an old step log has no such columns
    assert delivered_capacity([old]) == (None, 0.0)
    _, stats = fit_profile([synthetic_steps(7.5, 0.03, 0.0004)], "fit", 23, 128, "test")
    assert stats["delivered_capacity_per_s"] is None  # no request waited


def test_a_coefficient_the_data_would_make_negative_is_dropped():
    from dataclasses import replace

    rows = synthetic_steps(7.5, 0.03, 0.0, n=200)
    rows = [replace(row, decode_context_tokens=0) for row in rows]  # context never varies
    profile, _ = fit_profile([rows], "fit", 23, 128, "test")
    assert profile.per_context_token_ms == 0.0 and profile.base_ms > 0 and profile.per_batched_token_ms > 0


def test_too_few_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 10 busy engine steps"):
        fit_profile([synthetic_steps(1, 0, 0, n=5)], "fit", 23, 128, "test")


def test_profile_files_round_trip_and_bad_ones_are_refused(tmp_path):
    profile, _ = fit_profile([synthetic_steps(7.5, 0.03, 0.0004)], "fit", 23, 128, "test")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile.to_json()))
    loaded = load_profile(str(path))
    assert loaded == profile and loaded.coefficients_ps() == profile.coefficients_ps()
    doc = profile.to_json()
    del doc["base_ms"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="'base_ms' is missing"):
        load_profile(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(str(path))
    with pytest.raises(ValueError, match="unknown latency profile"):
        load_profile(str(tmp_path / "absent.json"))
    assert isinstance(load_profile("llama7b-a100-40gb"), LatencyProfile)


def test_scale_tokens_divides_lengths_and_keeps_at_least_one_token():
    agent = Agent("a", "fv", 1.0, ((Task("p", 1000, 3), Task("q", 17, 200)),))
    (scaled,) = scale_tokens([agent], 8)
    assert [(t.prompt_tokens, t.output_tokens) for t in scaled.tasks] == [(125, 1), (2, 25)]
    assert scaled.agent_id == "a" and scaled.arrival_s == 1.0
    with pytest.raises(ValueError):
        scale_tokens([agent], 0)


def test_vllm_bench_flags_are_checked_before_any_engine_starts(capsys):
    assert main(["bench", "--engine", "vllm", "--agents", "2", "--kv-blocks", "0"]) == 2
    assert "--kv-blocks must be >= 1" in capsys.readouterr().err
    assert main(["bench", "--engine", "vllm", "--agents", "2", "--latency", "nope.json"]) == 2
    assert "unknown latency profile 'nope.json'" in capsys.readouterr().err


def test_calibration_agents_are_scaled_to_fit_the_engine_whatever_their_lengths():
    from justitia.workload import fit_tokens

    a = Agent("a", "t", 0.0, ((Task("x", 1900, 162), Task("y", 10, 10)),))
    fitted, factor = fit_tokens([a], 2048)
    assert factor > 1 and all(t.prompt_tokens + t.output_tokens <= 2048 for t in fitted[0].tasks)
    assert fitted[0].tasks[0].prompt_tokens > 1800  # scaled by the least factor, not more
    same, one = fit_tokens([a], 4096)
    assert one == 1.0 and same[0].tasks == a.tasks  # fits already: unchanged
    with pytest.raises(ValueError, match="cannot run a task"):
        fit_tokens([a], 1)


def test_the_bench_calibrates_on_agents_that_fit_the_engines_context_and_cache(monkeypatch):
    import asyncio

    from justitia.engine.launch import EngineSpec
    from justitia.lab.live import vllm_bench

    class FakeEngine:  # the engine's limits as VllmEngine reports them once started
        spec = EngineSpec(max_model_len=2048)
        kv_tokens, block_size = 1536, 128

        def __init__(self):
            self.longest = []

        async def run(self, agents, policy, seed=0):
            from types import SimpleNamespace

            self.longest.append(max(t.prompt_tokens + t.output_tokens for a in agents for t in a.tasks))
            return SimpleNamespace(
                steps=[], requests=[], result=SimpleNamespace(agents=[SimpleNamespace(jct_s=1.0) for _ in agents])
            )

    profile = LatencyProfile("p", 0.0, 1.0, 0.01, 0.0, 1.0, 11, "test", 128)
    monkeypatch.setattr(vllm_bench, "fit_profile", lambda runs, *a: (profile, {"steps": 0}))
    monkeypatch.setattr(
        vllm_bench,
        "fit_frontend",
        lambda runs: {"request_latency_ms": 5.0, "answer_latency_ms": 1.0, "frontend_ms_per_request": 0.5},
    )
    engine = FakeEngine()
    big = [Agent("a", "t", 0.0, ((Task("x", 2000, 62),),))]  # 2,062 tokens: over both limits
    profile, stats = asyncio.run(vllm_bench._calibrate(engine, big, 0))
    assert engine.longest and max(engine.longest) <= 1536 and stats["scaled_down_by"] > 1
    assert profile.frontend_ms == (5.0, 1.0, 0.5) and stats["engine_mean_jct_s"] == 1.0


def test_the_calibration_throws_runs_away_until_the_engine_is_warm(monkeypatch):
    """A fresh engine's first runs are slow: runs are thrown away until two in a row agree (5 %),
    and the fit sees only the runs after them."""
    import asyncio
    from types import SimpleNamespace

    from justitia.engine.launch import EngineSpec
    from justitia.lab.live import vllm_bench

    def steps(ms):  # ten busy steps of ``ms`` each (the step log's first six columns)
        return [StepRow(k * ms / 1000, 64, 0, 0, 1, 1) for k in range(11)]

    class FakeEngine:
        spec = EngineSpec(max_model_len=2048)
        kv_tokens, block_size = 1536, 128

        def __init__(self, speeds):
            self.speeds = list(speeds)

        async def run(self, agents, policy, seed=0):
            ms = self.speeds.pop(0)
            return SimpleNamespace(
                steps=steps(ms), requests=[], result=SimpleNamespace(agents=[SimpleNamespace(jct_s=ms)])
            )

    fitted = []
    profile = LatencyProfile("p", 0.0, 1.0, 0.01, 0.0, 1.0, 11, "test", 128)
    monkeypatch.setattr(vllm_bench, "fit_profile", lambda runs, *a: (fitted.append(runs) or profile, {"steps": 0}))
    monkeypatch.setattr(
        vllm_bench,
        "fit_frontend",
        lambda runs: {"request_latency_ms": 5.0, "answer_latency_ms": 1.0, "frontend_ms_per_request": 0.5},
    )
    agents = [Agent("a", "t", 0.0, ((Task("x", 100, 10),),))]
    engine = FakeEngine([14.0, 11.0, 10.5, 10.0, 99.0])
    _, stats = asyncio.run(vllm_bench._calibrate(engine, agents, 0))
    assert [round(x, 6) for x in stats["warmup_step_ms"]] == [14.0, 11.0, 10.5]  # 11 -> 10.5 is within 5 %
    assert stats["engine_mean_jct_s"] == 10.0 and engine.speeds == [99.0]  # the fit saw the fourth run only
    engine = FakeEngine([14.0, 11.0, 9.0, 7.0, 5.0, 99.0])  # never steady: at most four thrown away
    _, stats = asyncio.run(vllm_bench._calibrate(engine, agents, 0))
    assert len(stats["warmup_step_ms"]) == vllm_bench.WARM_RUNS_MAX and stats["engine_mean_jct_s"] == 5.0


def test_the_paired_bootstrap_separates_a_real_difference_and_not_noise():
    from justitia.lab.metrics import paired_bootstrap

    rng = np.random.default_rng(0)
    size = rng.lognormal(0, 1, 200)  # agents differ by far more than the policies do
    speed = np.array([[1.0], [1.3], [0.8]])  # and so do the repeats' engine speeds
    base = speed * size * rng.uniform(0.9, 1.1, (3, 200))
    half = speed * size * 0.5 * rng.uniform(0.9, 1.1, (3, 200))
    c = paired_bootstrap(half, base, seed=1)
    assert c["ratio"] == pytest.approx(half.mean() / base.mean())
    lo, hi = c["ci95"]
    assert lo < c["ratio"] < hi < 1 and c["repeats"] == 3 and c["agents"] == 200
    # the same policy twice: the interval straddles 1
    again = speed * size * rng.uniform(0.9, 1.1, (3, 200))
    lo, hi = paired_bootstrap(again, base, seed=1)["ci95"]
    assert lo < 1 < hi
    # pairing is what makes it narrow: unpaired, the agents' sizes swamp a 10 % difference
    shuffled = paired_bootstrap(0.9 * base[:, rng.permutation(200)], base, seed=1)["ci95"]
    paired = paired_bootstrap(0.9 * base, base, seed=1)["ci95"]
    assert paired[1] - paired[0] < 0.2 * (shuffled[1] - shuffled[0])
    with pytest.raises(ValueError, match="same repeats and agents"):
        paired_bootstrap(base, base[:2])


def test_the_vllm_bench_compares_justitia_with_each_baseline_that_ran():
    from types import SimpleNamespace

    from justitia.lab.live.vllm_bench import TAGGING_LABEL, comparisons

    def run(jcts):
        return SimpleNamespace(result=SimpleNamespace(agents=[SimpleNamespace(jct_s=j) for j in jcts]))

    tries = {
        "justitia": [run([1, 2]), run([1, 3])],
        "vtc": [run([2, 4]), run([2, 5])],
        TAGGING_LABEL: [run([1, 2]), run([1, 2])],
        "fcfs": [run([3, 3]), run([3, 3])],
    }
    out = comparisons(tries)
    assert set(out) == {
        "justitia_vs_vtc",
        "justitia_vs_fcfs",
        f"{TAGGING_LABEL}_vs_vtc",
        f"{TAGGING_LABEL}_vs_justitia",
    }
    assert out["justitia_vs_vtc"]["ratio"] == pytest.approx(7 / 13) and out["justitia_vs_vtc"]["repeats"] == 2


def test_the_engine_preset_is_the_papers_comparison_on_dense_arrivals_that_fit_the_engine():
    from justitia.lab.presets import make_preset

    preset = make_preset("engine")
    assert preset.engine == "vllm" and preset.tagging and preset.repeats >= 3
    # every policy as itself with the oracle's costs, and justitia priced as it ships
    assert all(s.label == s.policy for s in preset.specs if s.predictor == "oracle")
    assert [(s.label, s.policy) for s in preset.specs if s.predictor != "oracle"] == [("justitia@online", "justitia")]
    assert {"fcfs", "vtc", "justitia", "las"} <= {s.policy for s in preset.specs}  # the paper's comparison
    agents = preset.agents
    assert len(agents) >= 100 and len({a.type for a in agents}) == 9
    assert max(a.arrival_s for a in agents) < 10  # dense: queueing, not arrivals, sets JCT
    for group in (agents, preset.calibration_agents):  # fits the preset's engine as it is
        assert max(t.prompt_tokens + t.output_tokens for a in group for t in a.tasks) <= 2048
    # the calibration is another workload (seed + 1): the fit never sees the agents it is judged on
    calibration = preset.calibration_agents
    assert [a.tasks for a in calibration] != [a.tasks for a in agents[: len(calibration)]]


def test_the_front_end_fit_recovers_its_latencies_from_a_step_log_and_the_requests():
    """An engine whose front end takes 1 ms per request, then 15 ms, and answers 2 ms after a
    step's end: ``fit_frontend`` finds them from the step log's arrival and finish counts."""
    import numpy as np

    from justitia.lab.live.calibrate import fit_frontend

    rng = np.random.default_rng(0)
    sent = np.sort(np.concatenate([np.full(8, 0.1 * k) for k in range(20)]) + rng.uniform(0, 0.002, 160))
    free, ready = -1.0, []
    for t in sent:  # one at a time, 1 ms each, then 15 ms
        free = max(free, t) + 0.001
        ready.append(free + 0.015)
    starts = np.arange(0.0, 2.5, 0.0103)  # steps of 10.3 ms
    joined = np.searchsorted(starts, ready)  # each request joins the first step starting after it is ready
    ends = joined + 3  # and finishes three steps later
    lines = [
        (float(t), 64, 0, 1, 1, 1, 0, 0, 0, 0, int((joined == k).sum()), int((ends == k).sum()), 0)
        for k, t in enumerate(starts)
    ]
    rows = [StepRow(*line) for line in lines]
    # answered 2 ms after the end of its finishing step (the next step's start)
    requests = [(f"r{i}", float(s), float(starts[e + 1] + 0.002)) for i, (s, e) in enumerate(zip(sent, ends))]
    fit = fit_frontend([(rows, requests)])
    assert fit["frontend_ms_per_request"] == pytest.approx(1.0, abs=0.1)
    assert fit["request_latency_ms"] == pytest.approx(15.0, abs=1.0)
    assert fit["answer_latency_ms"] == pytest.approx(2.0, abs=0.01)
    with pytest.raises(ValueError, match="step logs"):
        fit_frontend([([StepRow(*line[:10]) for line in lines], requests)])  # a log without the arrival columns
    # the latencies round-trip through a profile file; an older file's one latency meant both ways
    doc = LatencyProfile(
        "p",
        0.0,
        2.0,
        0.01,
        0.0,
        1.0,
        23,
        "test",
        128,
        request_latency_ms=12.5,
        answer_latency_ms=2.0,
        frontend_ms_per_request=0.8,
        per_request_ms=0.1,
        per_arrival_ms=0.2,
    ).to_json()
    loaded = LatencyProfile.from_json(doc)
    assert loaded.frontend_ms == (12.5, 2.0, 0.8) and (loaded.per_request_ms, loaded.per_arrival_ms) == (0.1, 0.2)
    old = {
        k: v
        for k, v in doc.items()
        if k not in ("answer_latency_ms", "frontend_ms_per_request", "per_request_ms", "per_arrival_ms")
    }
    assert LatencyProfile.from_json(old).frontend_ms == (12.5, 12.5, 0.0)
    with pytest.raises(ValueError, match="frontend_ms_per_request"):
        LatencyProfile.from_json(doc | {"frontend_ms_per_request": "fast"})


def test_the_fit_finds_what_each_request_and_each_arrival_adds_to_a_step():
    import numpy as np

    rng = np.random.default_rng(1)
    rows, t = [], 0.0
    for k in range(300):
        batched, ctx, reqs = int(rng.integers(1, 500)), int(rng.integers(0, 3000)), int(rng.integers(1, 30))
        rows.append([t, batched, ctx, 1, reqs - 1, 1, 0, 0, 0, 0, int(rng.integers(0, 5)), 0, 0])
    for k in range(len(rows) - 1):  # a step lasts its terms, the next row's arrivals included
        b, c, n, a = rows[k][1], rows[k][2], rows[k][3] + rows[k][4], rows[k + 1][10]
        rows[k + 1][0] = rows[k][0] + (6.0 + 0.04 * b + 0.0002 * c + 0.12 * n + 0.25 * a) / 1000
    profile, stats = fit_profile([[StepRow(*r) for r in rows]], "fit", 23, 128, "test")
    assert profile.per_request_ms == pytest.approx(0.12, rel=1e-6) and profile.per_arrival_ms == pytest.approx(
        0.25, rel=1e-6
    )
    assert profile.base_ms == pytest.approx(6.0, rel=1e-6) and stats["r2"] == pytest.approx(1.0)
    assert profile.iteration_s(100, 1000, 10, 2) == pytest.approx((6.0 + 4.0 + 0.2 + 1.2 + 0.5) / 1000)


def test_the_runner_gives_the_model_and_the_front_end_cores_of_their_own(monkeypatch):
    from justitia.engine.launch import EngineSpec
    from justitia.lab.live import runner

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(runner, "process_cpus", lambda: frozenset({0, 1}))
    assert runner.core_layout(EngineSpec()) == ("1", {0})
    monkeypatch.setattr(runner, "process_cpus", lambda: frozenset({2, 3, 5}))
    assert runner.core_layout(EngineSpec()) == ("3,5", {2})
    assert runner.core_layout(EngineSpec(cpu_threads="2-5")) == ("2-5", None)  # the caller's binding wins
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "3,5")  # an earlier engine's, ours: still pinned
    assert runner.core_layout(EngineSpec()) == ("3,5", {2})
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's
    assert runner.core_layout(EngineSpec()) == ("nobind", None)
    monkeypatch.setattr(runner, "process_cpus", lambda: frozenset({4}))
    assert runner.core_layout(EngineSpec()) == ("4", None)  # one core: nothing to split


def test_a_speed_probe_recovers_the_engines_speed_and_the_run_speed_reads_the_steps():
    from dataclasses import replace

    from justitia.engine.launch import EngineSpec
    from justitia.lab.bench import RunSpec, simulate
    from justitia.lab.live.calibrate import fit_speed, probe_speed, run_speed
    from justitia.lab.live.vllm_bench import engine_config
    from justitia.lab.presets import make_preset

    probe = make_preset("engine").calibration_agents[:12]
    profile = LatencyProfile("p", 0.0, 4.8, 0.0309, 0.00028, 1.0, 23, "test", 128, request_latency_ms=30.0)
    config = engine_config(profile, EngineSpec(kv_blocks=24), 128)
    for speed in (0.7, 1.0, 1.6):
        slow = replace(config, profile=replace(profile, scale=speed))
        run = simulate(probe, RunSpec("fcfs", "fcfs"), slow, 0)
        jct = sum(a.jct_s for a in run.agents) / len(run.agents)
        assert fit_speed(probe, config, jct) == pytest.approx(speed, rel=0.02)
    assert fit_speed(probe, config, 1e-6) == pytest.approx(0.25, rel=0.01)  # out of range: held at its ends
    assert fit_speed(probe, config, 1e6) == pytest.approx(4.0, rel=0.01)
    rows = synthetic_steps(4.8 * 1.25, 0.0309 * 1.25, 0.00028 * 1.25)  # steps 25 % slower than the profile
    assert run_speed(profile, rows) == pytest.approx(1.25, rel=1e-3)
    assert run_speed(profile, rows[:1]) is None  # no step with a measurable duration
    assert probe_speed(profile, rows) == pytest.approx(1.25, rel=1e-3)
    assert probe_speed(profile, synthetic_steps(48.0, 0.309, 0.0028)) == 4.0  # 10x slower: held at the range's end
    assert probe_speed(profile, []) is None  # stock vLLM: no step log


@pytest.mark.parametrize("step_log", [False, True])
def test_the_vllm_bench_predicts_each_run_at_the_speed_its_probe_found(monkeypatch, step_log):
    """The engine's speed moves from run to run; probes of the calibration agents just before and just
    after each run find it (from their steps where the engine logs them, else from their mean JCTs),
    and the simulator's prediction follows, where one profile, or the probe before alone, cannot."""
    from justitia.engine.launch import EngineSpec
    from justitia.lab.bench import RunSpec
    from justitia.lab.live import vllm_bench
    from justitia.lab.presets import make_preset

    preset = make_preset("engine")
    agents, probe = preset.agents[:16], preset.calibration_agents[:12]
    profile = LatencyProfile("p", 0.0, 4.8, 0.0309, 0.00028, 1.0, 23, "test", 128, request_latency_ms=30.0)
    # probe, run, probe, ...: the engine's speed moves steadily, so each run's is its probes' mean
    speeds = iter([1.0, 1.25, 1.5, 1.1, 0.7, 0.95, 1.2, 1.2, 1.2])
    calls = []

    def speed(policy, n):  # the speed moves, and every run is recorded
        calls.append((policy, n))
        return next(speeds)

    SimulatedEngine = simulated_engine(profile, speed, lambda _spec: step_log)
    monkeypatch.setattr(vllm_bench, "VllmEngine", SimulatedEngine)
    specs = [RunSpec("fcfs", "fcfs"), RunSpec("justitia", "justitia")]
    doc = vllm_bench.run_bench_vllm(
        agents, specs, EngineSpec(kv_blocks=24), {}, 0, False, profile, probe, repeats=2, speed_probes=True
    )
    # a probe before the first run and after every run
    assert calls == [("fcfs", 12)] + [("fcfs", 16), ("fcfs", 12), ("justitia", 16), ("fcfs", 12)] * 2
    fcfs, justitia = doc["policies"]["fcfs"], doc["policies"]["justitia"]
    assert fcfs["speed_scale_per_repeat"] == [pytest.approx(1.25, rel=0.02), pytest.approx(0.95, rel=0.02)]
    assert justitia["speed_scale_per_repeat"] == [pytest.approx(1.1, rel=0.02), pytest.approx(1.2, rel=0.02)]
    assert len(fcfs["probe_mean_jct_s_per_repeat"][0]) == 2  # (before, after)
    for entry in (fcfs, justitia):
        assert entry["speed_probe"] == ("steps" if step_log else "jct")
        assert abs(entry["sim_error"]) < 0.03 < abs(entry["sim_error_one_profile"])
        assert abs(entry["sim_error_probe_jct"]) < 0.03  # both readings of a probe find the speed
        if step_log:
            assert entry["run_speed_per_repeat"] == pytest.approx(entry["speed_scale_per_repeat"], rel=0.02)
            assert entry["probe_step_scale_before_after_per_repeat"][0] == [
                pytest.approx(x, rel=0.02) for x in ((1.0, 1.5) if entry is fcfs else (1.5, 0.7))
            ]
    if step_log:  # the probe before alone is off by the speed's move over the run
        assert abs(fcfs["sim_error_probe_before"]) > 0.1 and abs(justitia["sim_error_probe_before"]) > 0.1
    assert abs(justitia["sim_error_one_profile"]) > 0.1  # the engine ran 1.1-1.2x slower than the profile
    with pytest.raises(ValueError, match="calibration agents"):
        vllm_bench.run_bench_vllm(
            agents, specs, EngineSpec(kv_blocks=24), {}, 0, False, profile, None, speed_probes=True
        )


def test_the_vllm_benchs_tagging_run_reads_its_probes_steps_from_the_step_log_base(monkeypatch):
    """The tagging run's engine is stock vLLM's scheduler under the plug-in's step-log base, so its
    probes and runs are read from their steps, as the plug-in's are."""
    from justitia.engine.launch import EngineSpec
    from justitia.lab.bench import RunSpec
    from justitia.lab.live import vllm_bench
    from justitia.lab.presets import make_preset

    preset = make_preset("engine")
    agents, probe = preset.agents[:12], preset.calibration_agents[:8]
    profile = LatencyProfile("p", 0.0, 4.8, 0.0309, 0.00028, 1.0, 23, "test", 128)
    schedulers = []
    # the simulator at 1.3x the profile's step times, with a step log where vLLM would write one
    SimulatedEngine = simulated_engine(profile, lambda *_: 1.3, lambda spec: spec.scheduler != "priority", schedulers)
    monkeypatch.setattr(vllm_bench, "VllmEngine", SimulatedEngine)
    doc = vllm_bench.run_bench_vllm(
        agents,
        [RunSpec("vtc", "vtc")],
        EngineSpec(kv_blocks=24),
        {},
        0,
        False,
        profile,
        probe,
        tagging=True,
        speed_probes=True,
    )
    assert schedulers == ["plugin", "priority-logged"]
    tagged = doc["policies"][vllm_bench.TAGGING_LABEL]
    assert tagged["mode"] == "tagging" and tagged["speed_probe"] == "steps"
    assert tagged["speed_scale_per_repeat"] == [pytest.approx(1.3, rel=0.02)]
    assert tagged["run_speed_per_repeat"] == [pytest.approx(1.3, rel=0.02)] and "backlogged_share" in tagged


def test_a_bench_document_loads_back_into_the_simulators_view_of_its_engine(tmp_path):
    """The analysis scripts read a vLLM bench's results.json back: its profile, engine and config."""
    from dataclasses import asdict

    from justitia.engine.launch import EngineSpec
    from justitia.lab.live.vllm_bench import engine_config, load_bench

    profile = LatencyProfile("p", 0.0, 4.8, 0.0309, 0.00028, 1.0, 23, "test", 128, request_latency_ms=7.5)
    spec = EngineSpec(kv_blocks=24, max_num_seqs=64)
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "profile": profile.to_json(),
                "vllm": asdict(spec) | {"block_size": 128, "kv_tokens": 2944},
                "workload": {"seed": 0},
            }
        )
    )
    doc, loaded, loaded_spec, config = load_bench(path)
    assert loaded == profile and loaded_spec == spec and doc["workload"]["seed"] == 0
    assert config == engine_config(profile, spec, 128)


def test_the_step_log_reads_back_what_it_wrote_and_older_logs_with_their_missing_columns_none(tmp_path):
    from dataclasses import fields

    from justitia.vllm.steplog import COLUMNS, StepLogWriter, read_step_log

    assert COLUMNS == tuple(f.name for f in fields(StepRow)) and COLUMNS[:2] == ("t_s", "batched_tokens")
    row = StepRow(1.25, 300, 4096, 1, 7, 1, 0, 3, 2048, 412, 2, 1, 12345)
    assert row.line() == "1.250000,300,4096,1,7,1,0,3,2048,412,2,1,12345\n"  # the format the lab has always read
    path = tmp_path / "steps.csv"
    writer = StepLogWriter(path)
    writer.write(row)
    writer.write(StepRow(0.5, 64, 0, 1, 0, 0))  # an old row writes only its columns
    writer.close()
    assert path.read_text() == row.line() + "0.500000,64,0,1,0,0,0\n"
    back = read_step_log(path)
    assert back[0] == row and back[1] == StepRow(0.5, 64, 0, 1, 0, 0, 0)
    assert back[1].waiting_before is None and back[1].arrived_before is None  # an older log's missing columns
    path.write_text(row.line() + "0.1,2,3\n")
    with pytest.raises(ValueError, match=r"steps.csv:2: a step-log line has 6 to 13 columns, this one 3"):
        read_step_log(path)
    path.write_text("0.1,2,3,4,5,x\n")
    with pytest.raises(ValueError, match=r"steps.csv:1: a step-log line is a number of seconds, then integers"):
        read_step_log(path)


def test_a_standing_step_log_is_readable_row_by_row_on_the_systems_clock(tmp_path):
    """The log an engine keeps from its start (``JUSTITIA_STEP_LOG``, a door run's) is written line
    by line, its times moved by its origin (the engine's ``time.monotonic`` at start), so another
    process reads every step before the engine stops, on a clock both share."""
    from justitia.vllm.steplog import StepLogWriter, read_step_log

    path = tmp_path / "steps.csv"
    writer = StepLogWriter(path, by_line=True, origin=1000.0)
    writer.write(StepRow(0.25, 64, 0, 1, 0, 1))
    writer.write(StepRow(0.5, 32, 96, 0, 1, 0))
    assert [r.t_s for r in read_step_log(path)] == [1000.25, 1000.5]  # not closed: each row is there already
    writer.close()
    buffered = StepLogWriter(tmp_path / "other.csv")
    buffered.write(StepRow(0.25, 64, 0, 1, 0, 1))
    assert read_step_log(tmp_path / "other.csv") == []  # a bench's own log waits for its close
    buffered.close()


def test_the_doors_front_end_fit_reaches_past_the_in_process_ones_grid():
    """A front end that takes 12 ms per request (an HTTP server rendering and tokenizing each one),
    sent in bursts of eight so that they queue in it, is found with the door's wider grid
    (``DOOR_PER_REQUEST_MS_MAX``); the in-process grid, which stops at 3 ms, cannot find it."""
    import numpy as np

    from justitia.lab.live.calibrate import fit_frontend
    from justitia.lab.live.vllm_bench import DOOR_PER_REQUEST_MS_MAX

    sent = np.sort(np.concatenate([np.full(8, 0.25 * k) for k in range(16)]))
    free, ready = -1.0, []
    for t in sent:  # one at a time, 12 ms each, then 5 ms
        free = max(free, t) + 0.012
        ready.append(free + 0.005)
    starts = np.arange(0.0, 4.5, 0.002)
    joined = np.searchsorted(starts, ready)
    ends = joined + 5
    rows = [
        StepRow(float(t), 64, 0, 1, 1, 1, 0, 0, 0, 0, int((joined == k).sum()), int((ends == k).sum()), 0)
        for k, t in enumerate(starts)
    ]
    requests = [(f"r{i}", float(s), float(starts[e + 1])) for i, (s, e) in enumerate(zip(sent, ends))]
    wide = fit_frontend([(rows, requests)], DOOR_PER_REQUEST_MS_MAX)
    assert wide["frontend_ms_per_request"] == pytest.approx(12.0, abs=0.6)
    assert wide["request_latency_ms"] == pytest.approx(5.0, abs=1.0) and wide["join_mean_abs_error_ms"] < 1.5
    narrow = fit_frontend([(rows, requests)])
    assert narrow["frontend_ms_per_request"] <= 3.0 and narrow["join_mean_abs_error_ms"] > 5
