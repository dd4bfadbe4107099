"""The front end of ``justitia serve --upstream`` / ``--ray``: one process in front of several
engines (stock vLLM servers, or replicas on Ray Serve; ``justitia.backends``), with Justitia's door
and agent API (``justitia.server``) on an app of its own.

``app`` (the app: the door, the agent API, ``/health``, ``/metrics``), ``forward`` (the inference
endpoints, validated by vLLM's own request models and forwarded to the backend) and ``serve`` (the
serve loop: the port, the backend, the journal reloaded, drain on SIGTERM, exit if the engine dies).
It sits above the server and below the lab (``tests/test_architecture.py``).
"""
