"""Justitia's engines on Ray Serve (``justitia serve --ray``): ``replica`` (one vLLM engine with the
plug-in), ``deployment`` (Ray and the replicas' deployment), ``router`` (Ray Serve's
``RequestRouter`` by ``justitia.core.routing``). Needs ``pip install justitia[ray]``; nothing here
is imported unless ``--ray`` is asked for."""
