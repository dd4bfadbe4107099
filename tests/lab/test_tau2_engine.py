"""``lab.studies.tau2_engine``: tau2-engine's conversations on the simulated engine, slowed (``engine_speeds``)."""

from helpers import tiny_cpu_config

from justitia.lab.studies.tau2 import ORACLE, REFERENCE
from justitia.lab.studies.tau2_engine import engine_speeds, speeds_table


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
    ]:
        monkeypatch.setattr(sys, "argv", ["tau2_engine", *argv])
        with pytest.raises(SystemExit) as exc:
            tau2_engine.main()
        assert exc.value.code == 2 and said in capsys.readouterr().err
