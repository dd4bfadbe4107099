"""Starting and stopping vLLM engines, apart from what runs inside them (``justitia.vllm``).

``launch`` (an engine's settings, ``EngineSpec``; starting vLLM in this process, ``AsyncLLM``, with
the plug-in; control calls into a running plug-in), ``models`` (the embedded models, built from the
packages that ship their weights), ``reaper`` (no vLLM process outlives the one that started it)
and ``scripted`` (the benches' logits processor that ends an answer at a scripted length; never
read by pricing). Importing ``launch``'s engine starter or ``scripted`` needs vLLM.
"""
