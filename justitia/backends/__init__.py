"""The engines behind the server, below it: the interface (``base``: ``Backend``, its own output
types and errors, no vLLM type and no Ray field in it), the one clock that tags requests in front of
several engines (``tagging``), and the backends themselves: ``local`` (the engine of vLLM's own
server, with the plug-in), ``upstream`` (stock vLLM servers) and ``ray`` (replicas on Ray Serve).
``wire`` holds what a backend and the server both use (a prompt's text, ASGI helpers); a request
``Backend.forward`` refuses raises ``ForwardRefused``, which the front end answers in the
endpoint's own error shape."""

from justitia.backends.base import (
    DEADLINE,
    Backend,
    BackendError,
    BackendInterrupted,
    Completion,
    ForwardRefused,
    Output,
    Sampling,
    metric_lines,
)

__all__ = [
    "DEADLINE",
    "Backend",
    "BackendError",
    "BackendInterrupted",
    "Completion",
    "ForwardRefused",
    "Output",
    "Sampling",
    "metric_lines",
]
