"""The Justitia plug-in inside a real vLLM engine (tiny model, CPU): each policy's known behaviour,
and release of policy state. The engines run in subprocesses (vLLM spawns processes of its own)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

HERE = Path(__file__).parents[1]  # the drivers live at tests/


def run_script(name: str) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, str(HERE / name)], capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT ") :]), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def policies() -> dict:
    """Per policy, per agent: finish and JCT of the elephant-and-mice workload (tests/vllm_policies_run.py)."""
    return run_script("vllm_policies_run.py")[0]


def test_the_learned_predictor_drives_the_real_engine(policies):
    run = policies["justitia@mlp"]
    predicted = {a: r["predicted_cost"] for a, r in run.items()}
    assert predicted["elephant"] > max(v for a, v in predicted.items() if a != "elephant")
    assert any(r["predicted_cost"] != pytest.approx(r["cost"]) for r in run.values())  # a model, not the truth


def mice(run: dict) -> dict:
    return {a: r for a, r in run.items() if a.startswith("mouse")}


PAMPER_MICE = ["sjf", "vtc", "srjf", "justitia", "las"]

# Who waited for whom is judged within one run, on the order of its answers (each request's sent and
# answered times in that run): two runs' engine speeds differ on a busy machine, and the mice arrive
# on the wall clock (the first 0.3 s after the elephant, then every 0.4 s), so how much of the
# elephant's work is left when a mouse comes differs between runs, but not who goes first once it
# has come. The KV cache (8 blocks) holds at most HELD of the elephant's requests at once (a prompt
# takes 2 blocks): those a mouse finds in the engine may finish before it under any policy.
HELD = 4


def behind(policies: dict, label: str, mouse: str) -> tuple[int, int]:
    """Of the elephant's requests unanswered when ``mouse`` sent its request in run ``label``: how
    many there were, and how many of them were answered before the mouse's."""
    requests = {rid: (sent, answered) for rid, sent, answered in policies[f"{label} requests"]}
    sent, answered = requests[f"{mouse}/0/0"]
    outstanding = [a for rid, (_, a) in requests.items() if rid.startswith("elephant/") and a > sent]
    return len(outstanding), sum(a < answered for a in outstanding)


@pytest.mark.parametrize("policy", ["fcfs", "parrot", "fcfs@tagging", "justitia-chained@one-tenant"])
def test_first_come_first_served_makes_mice_wait_behind_the_elephant(policies, policy):
    waits = {m: behind(policies, policy, m) for m in mice(policies[policy])}
    # the first mouse comes while most of the elephant's 16 requests wait (else this says nothing)
    assert waits["mouse-00"][0] > 2 * HELD, waits
    # every mouse waits for each elephant request queued before it, but those the cache holds at the end
    assert all(before >= outstanding - HELD for outstanding, before in waits.values()), waits


@pytest.mark.parametrize(
    "policy", PAMPER_MICE + ["justitia@mlp", "justitia@tagging", "justitia@one-tenant", "justitia@tagging-one-tenant"]
)
def test_a_mouse_arriving_after_the_elephant_finishes_first(policies, policy):
    run = policies[policy]
    assert run["mouse-00"]["finish_s"] < run["elephant"]["finish_s"]
    waits = {m: behind(policies, policy, m) for m in mice(run)}
    assert waits["mouse-00"][0] > 2 * HELD, waits  # it came while most of the elephant waited
    # no mouse waits behind the elephant's queued requests: at most those the cache held finish first
    assert all(before <= HELD for _, before in waits.values()), waits


def test_srjf_holds_the_elephant_back_behind_the_stream_of_mice(policies):
    srjf = policies["srjf"]
    # Under srjf the elephant yields to every mouse: each mouse that comes while the elephant still
    # has requests queued (more unanswered than the cache holds) goes ahead of them, and finishes
    # before the elephant does. Which mice those are depends on the engine's speed; the first two
    # always are (at 0.3 and 0.7 s the elephant has most of its 16 requests to do).
    waits = {m: behind(policies, "srjf", m) for m in mice(srjf)}
    stream = [m for m, (outstanding, _) in waits.items() if outstanding > HELD]
    assert {"mouse-00", "mouse-01"} <= set(stream), waits
    assert all(waits[m][1] <= HELD for m in stream), waits
    assert srjf["elephant"]["finish_s"] > max(srjf[m]["finish_s"] for m in stream)


def test_finished_aborted_and_unlabelled_requests_release_all_policy_state():
    doc, log = run_script("vllm_release_run.py")
    assert doc["finished"] == ["later", "plain", "quiet-0", "quiet-1"]  # aborted ones never finish
    after_run = doc["after_run"]
    assert after_run["infos"] == 0 and after_run["waiting"] == 0
    # aborted agent (agent_done) and the unlabelled request are gone; "quiet" waits for the idle timeout
    assert after_run["agents"] == {"aborted": False, "quiet": True, "plain": False}
    after_idle = doc["after_idle"]
    assert not any(after_idle["agents"].values())
    assert after_idle["held"] == doc["fresh"]  # the core and the book hold what they held before any request
    assert "justitia" not in "".join(line for line in log.splitlines() if "ERROR" in line)


def test_the_plugins_clock_follows_what_the_engine_delivers():
    """On a saturated engine the clock's M, from its first measurement on, runs on average within
    10 % of the KV token-time the engine delivered (every request's exact cost so far over the
    run's time, counted apart from the meter), from a formula's guess far from it. (The engine's
    pace moves several-fold between 0.4 s windows on a shared CPU, and M follows it: its average,
    not its last value, is what the clock's V adds up.)"""
    doc, _ = run_script("vllm_meter_run.py")
    schedule = doc["schedule"]
    start, delivered = schedule[0][1], doc["delivered_per_s"]
    assert len(schedule) >= 10 and doc["finished"] > 50, doc  # M moved while agents kept arriving
    assert start / delivered > 3  # the guess (JUSTITIA_CAPACITY) was far off
    assert [t for t, _ in schedule] == sorted(t for t, _ in schedule)
    measured = schedule[1:]
    average = sum((b[0] - a[0]) * a[1] for a, b in zip(measured, measured[1:])) / (measured[-1][0] - measured[0][0])
    assert average == pytest.approx(delivered, rel=0.10), (average, delivered, schedule)
    state = doc["state"]  # what the control channel reports: the same clock
    assert state["capacity_per_s"] == schedule[-1][1] and state["capacity_schedule"][-1] == list(schedule[-1])


def test_the_step_log_base_schedules_step_for_step_as_stock_vllm_and_logs_every_step():
    doc, _ = run_script("vllm_steplog_run.py")
    stock, logged, rows = doc["stock"], doc["logged"], doc["step_log"]
    # the burst fills the cache: requests are preempted, and priorities order who finishes first
    assert any(step["preempted"] for step in stock)
    priority = {f"r{k:02d}": b[2] for k, b in enumerate(doc["burst"])}
    assert [priority[r] for r in doc["stock_finished"]] == sorted(priority.values())
    assert logged == stock and doc["logged_finished"] == doc["stock_finished"]  # it decides nothing
    # one row a step, in order, each with what that step scheduled
    assert len(rows) == len(logged)
    assert [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)
    assert [r["batched_tokens"] for r in rows] == [sum(n for _, n in step["scheduled"]) for step in logged]
    assert [r["prefill_reqs"] + r["decode_reqs"] for r in rows] == [len(step["scheduled"]) for step in logged]
    assert sum(r["preemptions"] for r in rows) == sum(len(step["preempted"]) for step in logged)
    burst = len(doc["burst"])
    # all queued before the first step
    assert rows[0]["arrived_before"] == burst and sum(r["arrived_before"] for r in rows) == burst
    # all finished; no step after the last
    assert sum(r["finished"] for r in rows) == burst and rows[-1]["busy_after"] == 0
    # all waited before it; some, for the cache
    assert rows[0]["waiting_before"] == burst and any(r["waiting_before"] > 0 for r in rows[1:])


@pytest.mark.parametrize("policy", ["fcfs@tagging", "justitia@tagging"])
def test_a_tagging_run_on_the_step_log_base_logs_its_steps(policies, policy):
    rows, requests = policies[f"{policy} steps"], len(policies[policy]) - 1 + 16  # the elephant's 16, a mouse's one
    assert sum(r["arrived_before"] for r in rows) == requests and sum(r["finished"] for r in rows) == requests
    # every prompt and decode token, at least
    assert sum(r["batched_tokens"] for r in rows) >= 16 * (256 + 95) + 11 * (32 + 15)
    assert any(r["waiting_before"] > 0 for r in rows)  # the elephant's requests waited for the cache


def test_make_overheads_bench_runs_and_counts_the_plugins_own_code(tmp_path):
    """justitia.lab.costs.bench_overhead (make overhead) on a small burst: it instruments the plug-in's
    methods wherever they live (its step-log base included), attributes time to the plug-in's code
    for every plug-in run and none for stock vLLM's scheduler. No timing is asserted: the figures
    are the bench's, quoted in docs/results.md."""
    out = tmp_path / "overhead.json"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "justitia.lab.costs.bench_overhead",
            "--requests",
            "16",
            "--repeats",
            "1",
            "--policies",
            "justitia,vtc",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = {row["run"]: row for row in json.loads(out.read_text())["runs"]}
    assert set(rows) == {"stock vLLM (priority)", "pass-through (floor)", "plug-in justitia", "plug-in vtc"}
    assert all(row["steps"] > 0 for row in rows.values())
    assert rows["stock vLLM (priority)"]["plugin_ms_per_step"] == 0.0
    for label in ("pass-through (floor)", "plug-in justitia", "plug-in vtc"):
        assert rows[label]["plugin_ms_per_step"] > 0.0, label
    for label in ("plug-in justitia", "plug-in vtc"):
        assert "plugin_net_ms_per_step" in rows[label]
