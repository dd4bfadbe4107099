"""``EngineBackend``: the agent API on the vLLM engine that vLLM's own server runs (its
``EngineClient``, an ``AsyncLLM`` with the Justitia plug-in as its scheduler).

The plug-in runs in vLLM's engine process; agents are registered and released, and its clock is
read, through control calls (``justitia.engine.launch.control``), so the tags the server reports
are the ones that order the engine. vLLM's own OpenAI and Anthropic endpoints reach the same engine
on their own; their requests carry the identity the door wrote into ``vllm_xargs``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from justitia.backends.base import Backend, Completion, Output, Sampling
from justitia.core import REGISTER, RETIRE, STATE, ControlCall, PolicyState, Registration
from justitia.defaults import DOOR_KEY, door_token
from justitia.engine.launch import control


class EngineBackend(Backend):
    """vLLM's ``engine_client`` (``AsyncLLM``) running the plug-in under ``policy``."""

    def __init__(self, engine, policy: str, model: str, tokenizer_dir: Path):
        self.llm, self.policy, self.model, self.tokenizer_dir = engine, policy, model, tokenizer_dir
        config = engine.vllm_config
        self.kv_tokens = (config.cache_config.num_gpu_blocks or 1) * config.cache_config.block_size
        self.max_model_len = config.model_config.max_model_len

    async def generate(self, prompt: dict, params: Sampling, request_id: str):
        """``AsyncLLM.generate``: closing it early aborts the request in vLLM. The agent's metadata
        carries the door's token: the server priced it (``justitia.vllm.general``)."""
        from vllm.inputs import TokensPrompt

        token = door_token()
        if token:
            params = replace(params, extra_args=dict(params.extra_args or {}, **{DOOR_KEY: token}))
        prompt = TokensPrompt(prompt_token_ids=prompt["prompt_token_ids"])
        async for out in self.llm.generate(prompt, vllm_params(params), request_id):
            yield output_of(out)

    async def register(self, reg: Registration) -> float | None:
        """Register the agent in the plug-in; the tag its clock stamped."""
        return await control(self.llm, ControlCall(REGISTER, reg.to_json()))

    async def retire(self, agent_id: str, pause: bool = False) -> None:
        """Retire (or pause) the agent in the plug-in (``AgentBook.retire``: once vLLM holds none of its requests)."""
        await control(self.llm, ControlCall(RETIRE, {"agent_id": agent_id, "pause": pause}))

    async def turn_ended(self, agent_id: str) -> None:
        """The plug-in learns the session's open burst now (``retire`` with ``turn_end``: nothing
        else of the agent changes; ``vllm.pricer.BurstPricer.turn_ended``)."""
        await control(self.llm, ControlCall(RETIRE, {"agent_id": agent_id, "turn_end": True}))

    async def state(self, detail: bool = False, bound_s: float | None = None) -> PolicyState:
        """The plug-in's policy, read in the engine process."""
        args = {"detail": True, "bound_s": bound_s} if detail else {}
        return PolicyState.from_json(await control(self.llm, ControlCall(STATE, args)))

    def alive(self) -> bool:
        """False once vLLM's engine core has died."""
        return not self.llm.errored

    def unfinished(self) -> int:
        """Requests in AsyncLLM's output processor (every endpoint's)."""
        return int(self.llm.output_processor.get_num_unfinished_requests())


def vllm_params(params: Sampling):
    """The contract's ``Sampling`` as vLLM's ``SamplingParams`` (for an engine this process runs)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    kind = RequestOutputKind.DELTA if params.stream else RequestOutputKind.FINAL_ONLY
    return SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        stop=params.stop,
        ignore_eos=params.ignore_eos,
        extra_args=dict(params.extra_args or {}),
        output_kind=kind,
    )


def output_of(out) -> Output:
    """vLLM's ``RequestOutput`` as the contract's ``Output`` (its first choice)."""
    c = out.outputs[0]
    return Output(out.request_id, [Completion(c.text, list(c.token_ids), c.finish_reason)], out.finished)
