"""Request and agent costs.

``kv``: KV token-time, the tokens a request holds in the KV cache summed over the engine iterations
it decodes: ``p*d + d**2/2`` token-iterations (unit name ``token_iters``). ``compute``: VTC's
weighted compute tokens ``p + 2*d`` (the paper's Justitia/C ablation).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """How a request's (prompt, decode) lengths become one cost number."""

    name: str

    def request_cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """The cost of one request with ``prompt_tokens`` in and ``output_tokens`` out."""
        if self.name == "kv":
            return kv_token_iters(prompt_tokens, output_tokens)
        return compute_tokens(prompt_tokens, output_tokens)


def kv_token_iters(prompt_tokens: float, output_tokens: float) -> float:
    """KV token-time of one request, in token-iterations: ``p*d + d^2/2``."""
    return prompt_tokens * output_tokens + output_tokens * output_tokens / 2.0


def compute_tokens(prompt_tokens: float, output_tokens: float) -> float:
    """VTC's compute cost of one request: input weight 1, output weight 2."""
    return prompt_tokens + 2.0 * output_tokens


COST_MODELS = {"kv": CostModel("kv"), "compute": CostModel("compute")}


def cost_model(name: str) -> CostModel:
    """The cost model called ``name`` (``kv`` or ``compute``)."""
    try:
        return COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model '{name}'; expected one of: kv, compute.") from None
