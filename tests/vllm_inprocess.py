"""The plug-in inside a vLLM engine run in process, for the scripts that inspect its scheduler
(``vllm_meter_run.py``, ``vllm_release_run.py``). Import this before vLLM: ``inprocess_engine``
sets the environment that vLLM and the plug-in read when they are imported."""

import os


def inprocess_engine(policy: str, max_num_seqs: int, **env: str):
    """vLLM's engine over the tiny model on the CPU, in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
    so that its scheduler can be inspected, scheduled by the plug-in under ``policy`` with the
    environment ``env`` besides (``JUSTITIA_*`` settings); 16 KV blocks, a model length of 1024 and
    at most ``max_num_seqs`` requests at a time. Returns (the ``LLM``, its engine, the plug-in's
    scheduler)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["JUSTITIA_POLICY"] = policy
    os.environ.update(env)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    from vllm import LLM

    from justitia.engine.models import tiny_model
    from justitia.vllm.plugin import JustitiaScheduler

    llm = LLM(
        model=str(tiny_model()),
        scheduler_cls=JustitiaScheduler,
        scheduling_policy="priority",
        num_gpu_blocks_override=16,
        max_model_len=1024,
        max_num_seqs=max_num_seqs,
        enforce_eager=True,
        dtype="float32",
    )
    engine = llm.llm_engine
    return llm, engine, engine.engine_core.engine_core.scheduler
