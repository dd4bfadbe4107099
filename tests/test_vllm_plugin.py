"""The Justitia plug-in inside a real vLLM engine (tiny model, CPU): each policy's known behaviour,
and release of policy state. The engines run in subprocesses (vLLM spawns processes of its own)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

HERE = Path(__file__).parent


def run_script(name: str) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, str(HERE / name)], capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), proc.stdout + proc.stderr


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


def mean_mouse_jct(run: dict) -> float:
    m = mice(run)
    return sum(r["jct_s"] for r in m.values()) / len(m)


PAMPER_MICE = ["sjf", "vtc", "srjf", "justitia", "las"]


# The first mouse arrives 0.3 s after the elephant, always while the elephant's work (seconds of it)
# is under way: how long it waits says who went first, however fast this machine runs the engine.
# (Later mice may arrive after the elephant is done, more so the faster the engine.)


@pytest.mark.parametrize("policy", ["fcfs", "parrot", "fcfs@tagging", "justitia-chained@one-tenant"])
def test_first_come_first_served_makes_mice_wait_behind_the_elephant(policies, policy):
    run = policies[policy]
    slowest_pampered = max(policies[p]["mouse-00"]["jct_s"] for p in PAMPER_MICE)
    assert run["mouse-00"]["jct_s"] > 5 * slowest_pampered
    # the first mouse waits for most of the elephant's work
    assert run["mouse-00"]["jct_s"] > 0.5 * run["elephant"]["jct_s"]


@pytest.mark.parametrize("policy", PAMPER_MICE + ["justitia@mlp", "justitia@tagging", "justitia@one-tenant",
                                                  "justitia@tagging-one-tenant"])
def test_a_mouse_arriving_after_the_elephant_finishes_first(policies, policy):
    run = policies[policy]
    assert run["mouse-00"]["finish_s"] < run["elephant"]["finish_s"]
    # no mouse waits anything like what the first one does behind the elephant under fcfs
    assert max(r["jct_s"] for r in mice(run).values()) < 0.25 * policies["fcfs"]["mouse-00"]["jct_s"]


def test_srjf_holds_the_elephant_back_behind_the_stream_of_mice(policies):
    srjf, fcfs = policies["srjf"], policies["fcfs"]
    # Judged within each run, by its own clock: the two runs' engine speeds differ on a busy machine,
    # and the mice arrive on the wall clock, so how many arrive before the elephant is done differs
    # with them. Under srjf the elephant yields to every mouse: it finishes after each mouse that
    # arrived while it still had requests waiting. Its last two requests (of 16, two at a time) take
    # about an eighth of its time, and a mouse arriving while they decode may finish after them, so
    # the mice counted are those that arrived before the last quarter of the elephant's time. How
    # many those are depends on the engine's speed (three or more on slow days, two on a fast one,
    # when the elephant took 1.3 s); the first always is (it arrives at 0.3 s).
    elephant = srjf["elephant"]["finish_s"]  # it arrived at 0
    early = [r for r in mice(srjf).values() if r["finish_s"] - r["jct_s"] < 0.75 * elephant]
    assert srjf["mouse-00"] in early and elephant > max(r["finish_s"] for r in early)
    # the first mouse arrives (0.3 s) while 14 of the elephant's requests wait: srjf serves it at
    # once; fcfs admits it only after the last of them, in the last eighth of the elephant's time
    assert srjf["mouse-00"]["finish_s"] < 0.5 * elephant
    assert fcfs["mouse-00"]["finish_s"] > 0.6 * fcfs["elephant"]["finish_s"]


def test_finished_aborted_and_unlabelled_requests_release_all_policy_state():
    doc, log = run_script("vllm_release_run.py")
    assert doc["finished"] == ["later", "plain", "quiet-0", "quiet-1"]  # aborted ones never finish
    after_run = doc["after_run"]
    assert after_run["infos"] == 0 and after_run["waiting"] == 0
    # aborted agent (agent_done) and the unlabelled request are gone; "quiet" waits for the idle timeout
    assert after_run["agents"] == {"aborted": False, "quiet": True, "plain": False}
    after_idle = doc["after_idle"]
    assert not any(after_idle["agents"].values())
    assert after_idle["core_agents"] == after_idle["core_open"] == 0
    assert after_idle["idle_since"] == after_idle["agent_done"] == 0
    assert after_idle["policy_state"] and not any(after_idle["policy_state"].values())
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
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert [r[1] for r in rows] == [sum(n for _, n in step["scheduled"]) for step in logged]
    assert [r[3] + r[4] for r in rows] == [len(step["scheduled"]) for step in logged]
    assert sum(r[6] for r in rows) == sum(len(step["preempted"]) for step in logged)
    burst = len(doc["burst"])
    assert rows[0][10] == burst and sum(r[10] for r in rows) == burst  # all queued before the first step
    assert sum(r[11] for r in rows) == burst and rows[-1][5] == 0  # all finished; no step after the last
    assert rows[0][7] == burst and any(r[7] > 0 for r in rows[1:])  # all waited before it; some, for the cache


@pytest.mark.parametrize("policy", ["fcfs@tagging", "justitia@tagging"])
def test_a_tagging_run_on_the_step_log_base_logs_its_steps(policies, policy):
    rows, requests = policies[f"{policy} steps"], len(policies[policy]) - 1 + 16  # the elephant's 16, a mouse's one
    assert sum(r[10] for r in rows) == requests and sum(r[11] for r in rows) == requests
    assert sum(r[1] for r in rows) >= 16 * (256 + 95) + 11 * (32 + 15)  # every prompt and decode token, at least
    assert any(r[7] > 0 for r in rows)  # the elephant's requests waited for the cache


def test_make_overheads_bench_runs_and_counts_the_plugins_own_code(tmp_path):
    """scripts/bench_overhead.py (make overhead) on a small burst: it instruments the plug-in's
    methods wherever they live (its step-log base included), attributes time to the plug-in's code
    for every plug-in run and none for stock vLLM's scheduler. No timing is asserted: the figures
    are the bench's, quoted in docs/results.md."""
    out = tmp_path / "overhead.json"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, str(HERE.parent / "scripts" / "bench_overhead.py"), "--requests", "16",
                           "--repeats", "1", "--policies", "justitia,vtc", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = {row["run"]: row for row in json.loads(out.read_text())["runs"]}
    assert set(rows) == {"stock vLLM (priority)", "pass-through (floor)", "plug-in justitia", "plug-in vtc"}
    assert all(row["steps"] > 0 for row in rows.values())
    assert rows["stock vLLM (priority)"]["plugin_ms_per_step"] == 0.0
    for label in ("pass-through (floor)", "plug-in justitia", "plug-in vtc"):
        assert rows[label]["plugin_ms_per_step"] > 0.0, label
    for label in ("plug-in justitia", "plug-in vtc"):
        assert "plugin_net_ms_per_step" in rows[label]
