"""``drive``: an ``AgentProcess`` run to its end with asyncio, on a real engine (the bench runner,
the server)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Awaitable, Callable

from justitia.agent.calls import Answer, Call
from justitia.agent.process import AgentProcess


async def drive(
    process: AgentProcess,
    serve: Callable[[Call], Awaitable[Answer]],
    resume: list[list[Answer]] | None = None,
    on_pause: Callable[[], Awaitable[None]] | None = None,
    clock: Callable[[], float] | None = None,
) -> None:
    """Run ``process`` to its end on a real engine: each call served by ``serve`` after its pause,
    the calls a stage releases as soon as it completes (after the stages ``resume`` answered, if
    given). If one call fails (or the agent is cancelled), the others are cancelled and the error
    propagates.

    A session's calls say so in their metadata (``RequestMeta.session``); the call that opens a
    burst also says ``turn_start``, with the burst's predicted cost as its ``agent_cost``
    (``AgentProcess.burst_cost``), and ``on_pause`` is awaited whenever the session pauses between
    two bursts (``AgentProcess.paused``): the engine's book settles it then (``AgentBook.pause``).
    ``clock``: the time the process records its calls at (turn times, bursts), in seconds (default:
    the event loop's; a bench passes seconds into its run, the time its agents arrive on)."""
    now = clock or asyncio.get_running_loop().time

    async def one(call: Call) -> Answer:
        if call.pause_s > 0:
            await asyncio.sleep(call.pause_s)
        if process.agent.is_session and process.opens_burst([call]):
            call = replace(call, meta=replace(call.meta, turn_start=True, agent_cost=process.burst_cost([call])))
        process.sent([call], now())
        return await serve(call)

    calls = process.start() if resume is None else process.resume(resume)
    pending = {asyncio.ensure_future(one(c)): c for c in calls}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                call = pending.pop(fut)
                for c in process.answered(call, fut.result(), now()):
                    pending[asyncio.ensure_future(one(c))] = c
                if on_pause is not None and process.agent.is_session and process.paused:
                    await on_pause()
    except BaseException:
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
