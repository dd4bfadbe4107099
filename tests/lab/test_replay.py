"""The simulator against vLLM's own scheduling rules: the `engine` preset's first agents through an
in-process vLLM engine (tiny model, the plug-in as its scheduler) stepped on the simulator's clock
(`justitia.lab.live.replay`), against the simulator on the same latency profile. The engine's timing is
out of it, so what differs is the scheduling: which requests vLLM admits, preempts and serves."""

import json
import subprocess
import sys

AGENTS = 20
POLICIES = ("fcfs", "srjf", "justitia")  # static keys: the simulator follows vLLM step for step


def test_the_simulator_schedules_as_vllm_does_on_its_clock(tmp_path):
    out = tmp_path / "replay.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "justitia.lab.live.replay",
            "--agents",
            str(AGENTS),
            "--policies",
            ",".join(POLICIES),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    for policy in POLICIES:
        row = report[policy]
        # step for step: the same steps, every agent's JCT equal, the same order of finishing
        assert row["sim_steps"] == row["replay_steps"], (policy, row["sim_steps"], row["replay_steps"])
        assert row["max_agent_diff_s"] < 1e-6, (policy, row["max_agent_diff_s"])
        assert row["sim_order"] == row["replay_order"], policy
