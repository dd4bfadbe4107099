"""Check that the plug-in releases policy state for finished, aborted and unlabelled requests; print JSON.

    python tests/vllm_release_run.py

In-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the scheduler can be inspected:
- agent ``aborted``: three requests, its last stage (``agent_done``), all aborted mid-flight;
- agent ``quiet``: two requests that finish, but it never says ``agent_done``: released by the idle
  timeout (``JUSTITIA_AGENT_IDLE_S=0.5``) once the engine schedules again;
- one request with no metadata at all: served as a one-request agent.

The book keeps each tenant's and each agent type's figures for the server (``core.ledger``: bounded,
one entry a tenant and a type, not an agent): a first agent of the same tenant and type runs before
``fresh`` is read, so that what is left after the run is what every agent leaves behind.
"""

import json
import time

if __name__ == "__main__":
    from vllm_inprocess import inprocess_engine  # tests/ is this script's directory

    # vtc, a dynamic policy: the most state to release
    llm, engine, sched = inprocess_engine("vtc", max_num_seqs=4, JUSTITIA_AGENT_IDLE_S="0.5")
    from helpers import retained
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def add(rid, tokens, meta):
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, extra_args=meta)
        engine.add_request(rid, TokensPrompt(prompt_token_ids=list(range(3, 67))), params)

    add("first", 8, {"agent_id": "first", "agent_cost": 1e3, "agent_done": True})  # the tenant's and type's entries
    while engine.has_unfinished_requests():
        engine.step()
    fresh = {"core": retained(sched.core), "book": retained(sched.book)}

    for i in range(3):
        add(f"aborted-{i}", 200, {"agent_id": "aborted", "agent_cost": 3e4, "agent_done": True})
    for i in range(2):
        add(f"quiet-{i}", 8, {"agent_id": "quiet", "agent_cost": 1e3})
    add("plain", 8, None)
    finished = set()
    steps = 0
    while engine.has_unfinished_requests():
        finished |= {o.request_id for o in engine.step() if o.finished}
        steps += 1
        if steps == 5:
            engine.abort_request([f"aborted-{i}" for i in range(3)])
    after_run = {
        "infos": sched.book.open_count,
        "waiting": len(sched.waiting),
        "agents": {a: sched.core.agent(a) is not None for a in ("aborted", "quiet", "plain")},
    }
    time.sleep(0.6)
    add("later", 4, None)  # the next schedule() sweeps idle agents
    while engine.has_unfinished_requests():
        finished |= {o.request_id for o in engine.step() if o.finished}
    after_idle = {
        "infos": sched.book.open_count,
        "waiting": len(sched.waiting),
        "agents": {a: sched.core.agent(a) is not None for a in ("aborted", "quiet", "plain", "later")},
        "held": {"core": retained(sched.core), "book": retained(sched.book)},
    }
    print(
        "RESULT "
        + json.dumps({"finished": sorted(finished), "after_run": after_run, "after_idle": after_idle, "fresh": fresh})
    )
