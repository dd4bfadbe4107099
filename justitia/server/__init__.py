"""``justitia serve``: an agent-aware HTTP server on vLLM with the Justitia scheduler plug-in.

Justitia's side of the server, whatever serves the model: ``settings`` (``justitia serve``'s
options), ``launch`` (vLLM's own server in this process, with the plug-ins), ``plugin`` (the
endpoint plugin), ``app`` (the door and the agent API on a FastAPI app), ``door``, ``limits``,
``errors`` and ``admission`` (what the door checks, answers and counts), ``agents`` (the agent
manager), ``store``, ``recovery``, ``turns``, ``journal``, ``pricing``, ``schema``. The front end
over several engines (``--upstream``, ``--ray``) is ``justitia.gateway``, above it. Needs the
``vllm`` extra.
"""
