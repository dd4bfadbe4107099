"""Sessions through the door: the ``sessions-engine`` workload sent to ``justitia serve`` as a harness
sends it, priced by the server itself.

Each session call is an OpenAI chat request to ``/v1/chat/completions`` with ``X-Session-ID`` (the
session's id). A call that opens a user turn ends with the user's message; a call after a tool
pause ends with the tool's result (an assistant tool call, then a ``tool`` message), so the door
counts turns as it does a harness's. The text is the call's prompt as the in-process runs build it
(``runner.SessionPrompts``: the same shared system prompts, the conversation as sent and
answered), decoded to text: the context in the first message, the call's own text in the last.

Nothing in the request names the call's cost. ``max_tokens`` is one cap whatever the answer, as a
harness sends it (``MAX_TOKENS``, clipped to the room the prompt leaves in the context: ``cap``);
the answer ends at the workload's length by a bench-only key that pricing never reads
(``vllm_xargs.justitia_answer_tokens``, from a trusted key, read by the scripted logits processor
``justitia.engine.scripted``). The plug-in prices each turn where it opens from what the engine sees
(``vllm/pricer.py``), learning from the turns that ended earlier in the run: each run is a fresh
server, which the caller's saved pricing state does not reach (``servers.child_env``). The door
learns a turn when its answer calls no tool; the scripted answers call none, so one that the turn
goes on after (``goes_on``) says it stands for a tool call by another bench-only key
(``vllm_xargs.justitia_answer_calls_tool``), as a harness's answer would show one.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable

import httpx

from justitia.agent import AgentProcess
from justitia.agent.calls import AgentResult, Answer, Call, RunResult
from justitia.core import cost_model
from justitia.defaults import ANSWER_CALLS_TOOL_KEY, ANSWER_TOKENS_KEY, ENV_STEP_LOG
from justitia.engine.launch import EngineSpec
from justitia.lab.live.runner import EngineRun, SessionPrompts, replay
from justitia.lab.live.servers import samples, start_server
from justitia.predictors import make_predictor
from justitia.vllm.steplog import read_step_log
from justitia.workload import Agent

KEY = "sk-bench-door-trusted-0001"
# max_tokens on every call, whatever its answer: a harness sends the same cap on every call, so a
# price read from max_tokens learns nothing of the answer from it (1,024: half the bench's context)
MAX_TOKENS = 1024
TEMPLATE_SLACK = 64  # tokens the chat template and the messages' roles add to a prompt, at most
SUFFIX = "@door"


def door_label(policy: str) -> str:
    return policy + SUFFIX


def cap(prompt_tokens: int, max_model_len: int) -> int:
    """A call's ``max_tokens``: ``MAX_TOKENS``, clipped to what the context leaves after its prompt
    (and the chat template's ``TEMPLATE_SLACK``), as a harness clips its cap to its model's context."""
    return max(1, min(MAX_TOKENS, max_model_len - prompt_tokens - TEMPLATE_SLACK))


def goes_on(agent: Agent, call: Call) -> bool:
    """Whether the call's turn goes on after its answer, which a harness's answer would show as a
    tool call: a call of an earlier stage of its turn, or of a subagent's branch."""
    last = max(s for s, _ in agent.turn_calls(call.turn))
    return call.stage < last or call.index >= len(agent.stages[call.stage])


def messages(head: str, own: str, opens_turn: bool) -> list[dict]:
    """A call's chat messages: the user's, or (inside a turn) a tool's result after a tool call."""
    if opens_turn:
        return [{"role": "user", "content": head + own}]
    call = {"id": "call_0", "type": "function", "function": {"name": "tool", "arguments": "{}"}}
    return [
        {"role": "user", "content": head},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": own},
    ]


async def run_through_door(
    url: str,
    agents: list[Agent],
    policy: str,
    tokenizer,
    max_model_len: int,
    seed: int = 0,
    on_agent_finish: Callable[[AgentResult], None] | None = None,
    served: str = "tiny",
    step_log: str | Path | None = None,
) -> EngineRun:
    """Every session of ``agents`` through the door at ``url`` (serving the model as ``served``), on
    the wall clock; their results, with the steps of the server's engine if it logs them to
    ``step_log`` (``door_server``), on the run's clock."""
    model = cost_model("kv")
    pred = make_predictor("oracle", seed)  # the process's own bookkeeping: nothing of it is sent
    prompts = SessionPrompts(tokenizer, max_model_len)
    run_id = uuid.uuid4().hex[:8]
    by_id = {a.agent_id: a for a in agents}
    requests: list[tuple[str, float, float]] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=limits, headers={"Authorization": f"Bearer {KEY}"}
    ) as client:
        t0 = time.monotonic()

        async def serve(call: Call) -> Answer:
            task = call.task
            ids = prompts.prompt(call)
            head, tail = (
                tokenizer.decode(ids[: prompts.context_tokens]),
                tokenizer.decode(ids[prompts.context_tokens :]),
            )
            limit = cap(len(ids), max_model_len)
            if limit < task.output_tokens:
                raise RuntimeError(
                    f"request '{call.request_id}': its answer of {task.output_tokens} tokens does not "
                    f"fit the {limit} the context leaves after its prompt of {len(ids)}."
                )
            body = {
                "model": served,
                "messages": messages(head, tail, call.meta.turn_start),
                "max_tokens": limit,
                "temperature": 0.0,
                "return_token_ids": True,
                "vllm_xargs": {ANSWER_TOKENS_KEY: int(task.output_tokens)},
            }
            if goes_on(by_id[call.meta.agent_id], call):
                body["vllm_xargs"][ANSWER_CALLS_TOOL_KEY] = True
            sent = time.monotonic() - t0
            r = await client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": call.meta.agent_id})
            if r.status_code != 200:
                raise RuntimeError(f"request '{call.request_id}': {r.status_code} {r.text[:300]}")
            doc = r.json()
            out = list(doc["choices"][0].get("token_ids") or [])
            n = int(doc["usage"]["completion_tokens"])
            if n != task.output_tokens:
                raise RuntimeError(f"request '{call.request_id}': {n} tokens answered, {task.output_tokens} asked for")
            prompts.answered(call, out[:n])
            requests.append((call.request_id.removeprefix(f"{run_id}/"), sent, time.monotonic() - t0))
            return Answer("", task.prompt_tokens, n)

        results, lags, wall = await replay(
            agents,
            lambda a: AgentProcess(a, pred, model, request_prefix=f"{run_id}/"),
            serve,
            t0,
            on_agent_finish=on_agent_finish,
        )
        cache = door_prefix_cache((await client.get("/metrics")).text)
    for r in results:  # the prices were the server's, which it does not report: the process's own (the workload's
        r.turn_costs = None  # true costs, its bookkeeping) are no prediction; its predicted_cost stays that bookkeeping
    run = RunResult(policy, results, max(r.finish_s for r in results), 0, 0, 0, wall, prefix_cache=cache)
    steps = []  # the engine's, written line by line on the system's monotonic clock: moved to the run's
    if step_log is not None:
        steps = [replace(row, t_s=row.t_s - t0) for row in read_step_log(step_log)]
    return EngineRun(run, steps, max(lags) if lags else 0.0, requests)


def door_prefix_cache(metrics: str) -> dict | None:
    """The engine's prefix cache on the door's requests, from its ``/metrics``: the prompt tokens of
    its finished requests and the tokens vLLM's cache held when each was first scheduled
    (``justitia_prefix_cache_*``); None when the door reports none (its cache off)."""
    queried = sum(v for _, _, v in samples(metrics, "justitia_prefix_cache_queries_total"))
    hits = sum(v for _, _, v in samples(metrics, "justitia_prefix_cache_hits_total"))
    if not queried:
        return None
    return {"queried_tokens": int(queried), "hit_tokens": int(hits), "hit_rate": hits / queried}


def door_server(policy: str, spec: EngineSpec, step_log: str | Path | None = None):
    """``justitia serve`` for one door run: the engine ``spec`` describes, ``policy``, the scripted
    logits processor, one trusted key; no journal (each run starts afresh); its engine's steps logged
    to ``step_log`` if given (``JUSTITIA_STEP_LOG``). Returns (process, url)."""
    keys = Path(tempfile.mkdtemp(prefix="justitia-door-")) / "keys.txt"
    keys.write_text(f"{KEY} bench 1 trusted\n")
    args = [
        "--model",
        spec.model,
        "--policy",
        policy,
        "--api-keys",
        str(keys),
        "--max-model-len",
        str(spec.max_model_len),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--max-num-batched-tokens",
        str(spec.max_num_batched_tokens),
        "--logits-processors",
        "justitia.engine.scripted:ScriptedAnswers",
    ]
    if spec.kv_blocks:
        args += ["--kv-blocks", str(spec.kv_blocks)]
    env = {ENV_STEP_LOG: str(step_log)} if step_log is not None else None
    return start_server(*args, quiet=True, journal=False, env=env)
