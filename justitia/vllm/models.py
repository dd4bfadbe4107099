"""Embedded models that need no model hub, built on first use into a cache directory.

``tiny``: a random-weight Llama (2 layers, hidden 128) with a byte-level BPE tokenizer trained
on prompts from this project's own workflow generators. Decode lengths are forced
(``max_tokens = output_tokens``, ``ignore_eos=True``), so the weights need not mean anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TINY_VERSION = 1


def cache_dir() -> Path:
    """Where built models live: ``$JUSTITIA_CACHE`` or ``~/.cache/justitia``."""
    return Path(os.environ.get("JUSTITIA_CACHE", Path.home() / ".cache" / "justitia"))


def tiny_model(seed: int = 0) -> Path:
    """The directory of the ``tiny`` model, building it first if it is not there."""
    out = cache_dir() / "models" / f"tiny-v{TINY_VERSION}-seed{seed}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from justitia.workflows import WORKFLOW_TYPES, generate_agent

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
        vocab_size=2048, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(tmp)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
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
