"""``justitia serve``: an agent-aware HTTP server on vLLM with the Justitia scheduler plug-in.

``schema`` (the agent document and its placeholders), ``app`` (the FastAPI application),
``main`` (starting vLLM and uvicorn in one process). Needs the ``vllm`` extra.
"""
