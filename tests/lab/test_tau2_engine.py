"""``lab.studies.tau2_engine``: tau2-engine's conversations on the simulated engine, slowed (``engine_speeds``)."""

from helpers import tiny_cpu_config

from justitia.lab.studies.tau2 import ORACLE, REFERENCE
from justitia.lab.studies.tau2_engine import engine_speeds, gpu_steps, speeds_table


def test_the_engine_presets_conversations_queue_only_on_a_slower_engine():
    """On an engine ten times the tiny model's speed every policy gives the same turn times (it keeps
    up with them); at 8x slower steps turns queue, and ordering by the true costs pays."""
    config = tiny_cpu_config()  # the tiny model on this machine, as a recorded bench calibrated it
    fast, slow = engine_speeds(config, [0.1, 8.0])
    assert set(fast) == set(slow) and {REFERENCE, ORACLE} <= set(fast)
    assert max(fast.values()) < 1.05 * min(fast.values())  # the engine keeps up: no order matters
    assert slow[REFERENCE] > 10 * fast[REFERENCE]  # 8x slower steps: turns queue
    assert slow[ORACLE] < 0.95 * slow[REFERENCE]  # and the true costs' order pays
    lines = speeds_table([0.1, 8.0], [fast, slow])
    assert len(lines) == 3 and lines[2].startswith("x8") and "(1.00)" in lines[2]


def test_gpu_steps_change_the_step_times_and_nothing_else():
    """``--gpu-steps`` swaps the CPU's step times for the simulator's GPU profile and keeps the
    engine's KV cache (blocks and their size), its batching, its prefix cache and its front end; its step times
    differ in shape: a GPU step costs its floor (the weights read from memory) until its batch is
    large, a CPU step grows with every token it computes."""
    from dataclasses import replace

    from justitia.lab.bench import SIM_DEFAULT_PROFILE

    tiny = tiny_cpu_config()
    door = {"request_latency_ms": 3.0, "answer_latency_ms": 2.0, "frontend_ms_per_request": 0.5}
    cpu = replace(tiny, profile=replace(tiny.profile, **door), prefix_caching=True)
    gpu = gpu_steps(cpu)
    assert gpu.profile.name == SIM_DEFAULT_PROFILE != cpu.profile.name
    assert (gpu.blocks, gpu.block_size, gpu.kv_tokens) == (cpu.blocks, cpu.block_size, cpu.kv_tokens)
    kept = ("max_num_batched_tokens", "max_num_seqs", "prefix_caching", "kv_eviction")
    assert all(getattr(gpu, k) == getattr(cpu, k) for k in kept)
    assert gpu.profile.frontend_ms == cpu.profile.frontend_ms != (0.0, 0.0, 0.0)

    def prefill_over_decode(config):  # a step computing 96 new tokens over one decoding one
        p = config.profile
        return p.iteration_s(96, 0, 1) / p.iteration_s(1, 0, 1)

    assert prefill_over_decode(gpu) == 1.0 and prefill_over_decode(cpu) > 1.5


def test_the_studys_command_line_names_what_it_refuses(monkeypatch, capsys, tmp_path):
    """Nothing runs on a bad flag: an unknown policy, a speed of 0, a missing profile, or no study."""
    import sys

    import pytest

    from justitia.lab.studies import tau2_engine

    for argv, said in [
        (["--door-idle", "sjf-ish"], "--door-idle: unknown policy 'sjf-ish'"),
        (["--engine-speeds", "0"], "--engine-speeds: each must be above 0"),
        (["--engine-speeds", "2", "--profile-from", str(tmp_path / "none.json")], "--profile-from: no such file"),
        (["--self-fit", "nope"], "--self-fit: unknown policy 'nope'"),
        (["--door-idle", "fcfs", "--self-fit", "nope"], "--self-fit: unknown policy 'nope'"),  # before the door runs
        (["--self-fit", "fcfs", "--profile-from", str(tmp_path / "none.json")], "--profile-from: no such file"),
        ([], "give --engine-speeds, --door-idle or --self-fit"),
        (["--gpu-steps", "--door-idle", "fcfs"], "--gpu-steps goes with --engine-speeds"),
    ]:
        monkeypatch.setattr(sys, "argv", ["tau2_engine", *argv])
        with pytest.raises(SystemExit) as exc:
            tau2_engine.main()
        assert exc.value.code == 2 and said in capsys.readouterr().err
