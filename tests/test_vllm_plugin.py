"""The Justitia plug-in inside a real vLLM engine (tiny model, CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

SCENARIO = Path(__file__).with_name("vllm_scenario.py")


def finish_order(policy: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, str(SCENARIO), policy], capture_output=True, text=True,
                          timeout=600, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"finish_order"')]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    doc = json.loads(lines[-1])
    assert doc["tokens"] == [60] * 8 + [10]  # forced decode lengths were served in full
    return doc["finish_order"]


@pytest.mark.parametrize("policy", ["fcfs", "parrot"])
def test_first_come_first_served_makes_the_mouse_wait_behind_the_elephant(policy):
    assert finish_order(policy)[-1] == "mouse"


@pytest.mark.parametrize("policy", ["justitia", "srjf"])
def test_mouse_goes_ahead_of_the_waiting_elephant_requests(policy):
    # Requests reach the engine one by one, so up to two elephant requests (max_num_seqs) may
    # already run when the mouse arrives; nothing is preempted, but it goes ahead of the rest.
    assert finish_order(policy).index("mouse") <= 2
