"""Cost predictors: what an engine believes an agent or request will cost when it arrives.

``make_predictor(spec)`` builds one by name (``registry.SPEC_HELP``): ``oracle``, ``noisy:L``,
``session`` (a session's turns learned online, ``predictors.session``), a trainable kind trained
on the committed SmolLM2 profile (``mlp``, ``lm``, ``mean``, ``linear``; cached), a saved directory (``mlp:DIR``,
``lm:DIR``, or a bare ``DIR``), or a
baseline trained on the spot on a profile or workload file (``mean:FILE``, ``linear:FILE``).
"""

from __future__ import annotations

from justitia.core import KV
from justitia.predictors.base import NoisyPredictor, OraclePredictor, Predictor
from justitia.predictors.committed import DEFAULT_PROFILE, trained_predictors
from justitia.predictors.online import OnlinePredictor
from justitia.predictors.registry import KINDS, SPEC_HELP, kind_of_dir
from justitia.predictors.session import SessionPredictor
from justitia.workload import load_workload

# the cold start of ``online``: first-stage prompts priced with short answers (online:mlp: the committed profile's MLP)
ONLINE_PRIOR = "none"


def make_online(prior: str = ONLINE_PRIOR, seed: int = 0, background: bool = False) -> "OnlinePredictor":
    """``online`` cold-started from the predictor ``prior`` names (``none``: prompt tokens alone)."""
    if prior in ("online", "session") or prior.startswith("online:"):
        raise ValueError(
            f"predictor 'online:{prior}': the cold start must be one of {', '.join(KINDS)} (trained on "
            "the committed profile), KIND:DIR, or none."
        )
    if prior in ("oracle",) or prior.startswith("noisy:"):
        raise ValueError(f"predictor 'online:{prior}': the prior must not read the true cost.")
    return OnlinePredictor(None if prior == "none" else make_predictor(prior, seed), background, prior)


def make_predictor(spec: str, seed: int = 0) -> Predictor:
    """Build the predictor ``spec`` names (see the module's docstring)."""
    if spec == "oracle":
        return OraclePredictor()
    if spec == "session":
        return SessionPredictor()
    if spec == "online" or spec.startswith("online:"):
        return make_online(spec.partition(":")[2] or ONLINE_PRIOR, seed)
    if spec.startswith("noisy:"):
        try:
            lam = float(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"predictor '{spec}': expected noisy:L with a number L >= 1, e.g. noisy:3.") from None
        return NoisyPredictor(lam, seed)
    saved = kind_of_dir(spec)
    if saved is not None:  # a bare trained directory: its manifest says which kind
        spec = f"{saved}:{spec}"
    name, _, arg = spec.partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown predictor '{spec}'; expected {SPEC_HELP}.")
    if not arg:  # trained on the committed profile, once, then cached
        return make_predictor(trained_predictors(load_workload(DEFAULT_PROFILE), 0, (name,))[name], seed)
    if kind.load is not None:
        return kind.load(arg)
    return kind.train(load_workload(arg), KV, seed)


__all__ = ["Predictor", "OnlinePredictor", "ONLINE_PRIOR", "make_predictor", "make_online", "SPEC_HELP"]
