"""The committed tiny Llama fixture (tools/fixtures/tiny_llm/, written by tools/train_tiny_llm.py) is whole and
self-consistent: digests, config vs tensor shapes, tokenizer, chat template, disjoint splits.

No torch here: tensors are read with ``safetensors``' numpy API
(https://huggingface.co/docs/safetensors/api/numpy), the tokenizer with ``tokenizers``
(https://huggingface.co/docs/tokenizers/api/tokenizer), the template with jinja2 as Hugging Face's
``apply_chat_template`` does (https://huggingface.co/docs/transformers/chat_templating).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from tools.fixtures.gguf_writer import bytes_to_unicode

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tools" / "fixtures" / "tiny_llm"
HASHED = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "heldout.txt",
    "torch_reference.json",
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _json(name: str) -> Any:
    return json.loads((FIX / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def training() -> dict[str, Any]:
    return _json("TRAINING.json")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return _json("config.json")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(FIX / "tokenizer.json"))


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    return {c: b for b, c in bytes_to_unicode().items()}


# ------------------------------------------------------------------------------------------ files


def test_digests_match_training_record(training: dict[str, Any]) -> None:
    recorded = training["sha256"]
    assert set(recorded) == HASHED, f"TRAINING.json hashes {sorted(recorded)}, expected {sorted(HASHED)}"
    for name, digest in recorded.items():
        actual = hashlib.sha256((FIX / name).read_bytes()).hexdigest()
        assert actual == digest, f"{name}: sha256 {actual}, TRAINING.json says {digest} (retrain or re-record)"


def test_training_record(training: dict[str, Any]) -> None:
    assert training["versions"]["torch"].startswith("2.13.0"), training["versions"]
    assert isinstance(training["seed"], int) and training["steps"] > 0
    assert training["loss_curve"][-1]["step"] == training["steps"]
    assert training["final_heldout_loss"] < 3.5, f"held-out loss {training['final_heldout_loss']:.3f} nats/token"
    assert training["final_heldout_loss"] < training["initial_heldout_loss"] - 2.0
    assert training["final_train_loss"] < training["initial_heldout_loss"] - 2.0
    assert (FIX / "model.safetensors").stat().st_size < 5 * 1024 * 1024


# ------------------------------------------------------------------------------------------ model


def test_config_self_consistent(config: dict[str, Any]) -> None:
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_act"] == "silu" and config["torch_dtype"] == "float32"
    assert config["num_attention_heads"] * config["head_dim"] == config["hidden_size"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert config["head_dim"] % 2 == 0  # rotary pairs
    assert config["tie_word_embeddings"] is True
    assert config["attention_bias"] is False and config["mlp_bias"] is False
    assert 0 <= config["bos_token_id"] < config["vocab_size"] and 0 <= config["eos_token_id"] < config["vocab_size"]
    gen = _json("generation_config.json")
    assert config["eos_token_id"] in gen["eos_token_id"]


def test_tensors_match_config(config: dict[str, Any]) -> None:
    d, hd, v, f = config["hidden_size"], config["head_dim"], config["vocab_size"], config["intermediate_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    expected = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        expected |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (nh * hd, d),
            p + "self_attn.k_proj.weight": (nkv * hd, d),
            p + "self_attn.v_proj.weight": (nkv * hd, d),
            p + "self_attn.o_proj.weight": (d, nh * hd),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    tensors = load_file(str(FIX / "model.safetensors"))
    assert set(tensors) == set(expected), f"extra {sorted(set(tensors) - set(expected))}, missing {sorted(set(expected) - set(tensors))}"
    for name, arr in tensors.items():
        assert arr.shape == expected[name], f"{name}: shape {arr.shape}, config implies {expected[name]}"
        assert arr.dtype == np.float32, f"{name}: dtype {arr.dtype}"
        assert np.isfinite(arr).all(), name
    emb = tensors["model.embed_tokens.weight"]
    assert 0.01 < float(emb.std()) < 1.0, f"embedding std {emb.std():.4f}: untrained or not the N(0, 0.02)-initialised table"
    with safe_open(str(FIX / "model.safetensors"), framework="numpy") as sf:
        assert sf.metadata() == {"format": "pt"}


# -------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_vocab_and_specials(tok: Tokenizer, config: dict[str, Any]) -> None:
    assert tok.get_vocab_size(with_added_tokens=True) == config["vocab_size"] == 1024
    for i, s in enumerate(SPECIALS):
        assert tok.encode(s).ids == [i], f"{s!r} encodes to {tok.encode(s).ids}, expected [{i}]"
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n").ids
    assert ids[0] == 1 and 2 in ids and ids.count(1) == 1
    assert 0 not in tok.encode("plain text").ids and 1 not in tok.encode("plain text").ids  # nothing added on encode
    raw = _json("tokenizer.json")
    assert raw["post_processor"] is None
    assert raw["pre_tokenizer"]["type"] == "ByteLevel" and raw["pre_tokenizer"]["add_prefix_space"] is False
    assert raw["decoder"]["type"] == "ByteLevel"
    tc = _json("tokenizer_config.json")
    assert tok.token_to_id(tc["eos_token"]) == config["eos_token_id"] == 2
    assert tok.token_to_id(tc["bos_token"]) == config["bos_token_id"]


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    return x + 1  # the with statement\n",
        "  leading spaces, tabs\tand\n\nblank lines  ",
        "café — 10 € für Müller; naïve 日本語 😀🐍 “quoted”…",
    ],
)
def test_tokenizer_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_vocab_has_incomplete_utf8_tokens(tok: Tokenizer) -> None:
    dec = _byte_decoder()
    incomplete = []
    for token, tid in tok.get_vocab(with_added_tokens=False).items():
        raw = bytes(dec[c] for c in token)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            incomplete.append(tid)
    assert incomplete, "no vocabulary token is an incomplete UTF-8 sequence"
    # and real text uses them: a 4-byte emoji is split into more than one token
    emoji_ids = tok.encode("😀").ids
    assert len(emoji_ids) > 1 and any(i in incomplete for i in emoji_ids)


# ---------------------------------------------------------------------------------- chat template


def test_chat_template_renders_chatml() -> None:
    tc = _json("tokenizer_config.json")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders templates
    tpl = env.from_string(tc["chat_template"])
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is lambda?"}]
    body = "<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nWhat is lambda?<|im_end|>\n"
    assert tpl.render(messages=messages, add_generation_prompt=False) == body
    assert tpl.render(messages=messages, add_generation_prompt=True) == body + "<|im_start|>assistant\n"


# -------------------------------------------------------------------------------- splits/reference


def test_splits_disjoint_and_heldout_size(training: dict[str, Any], tok: Tokenizer) -> None:
    train, held = set(training["split"]["train_topics"]), set(training["split"]["heldout_topics"])
    assert train and held, "both splits must be non-empty"
    assert not train & held, f"topics in both splits: {sorted(train & held)}"
    text = (FIX / "heldout.txt").read_text(encoding="utf-8")
    assert len(tok.encode(text).ids) >= 2000


def test_heldout_text_is_heldout_topics(training: dict[str, Any]) -> None:
    """With the same CPython docs as the training run, heldout.txt is exactly the held-out topics' text."""
    if platform.python_version() != training["versions"]["python"]:
        pytest.skip(f"pydoc_data of Python {platform.python_version()} differs from the training run's {training['versions']['python']}")
    from pydoc_data.topics import topics

    held = training["split"]["heldout_topics"]
    assert set(training["split"]["train_topics"]) | set(held) == set(topics)
    expected = "\n\n".join(topics[n].strip() for n in held) + "\n"
    assert (FIX / "heldout.txt").read_text(encoding="utf-8") == expected


def test_torch_reference_consistent_with_tokenizer(tok: Tokenizer, config: dict[str, Any]) -> None:
    ref = _json("torch_reference.json")
    assert len(ref["prompts"]) == 3
    for p in ref["prompts"]:
        assert tok.encode(p["prompt"]).ids == p["prompt_ids"], p["prompt"]
        assert len(p["greedy_20_ids"]) == 20 and all(0 <= i < config["vocab_size"] for i in p["greedy_20_ids"])
        assert len(set(p["top5_ids_last_prompt_position"])) == 5
        assert p["greedy_20_ids"][0] == p["top5_ids_last_prompt_position"][0]  # greedy's first token is the top-1
        vals = p["top5_logits_last_prompt_position"]
        assert vals == sorted(vals, reverse=True)
