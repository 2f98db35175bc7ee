"""converters.llm.sources: GGUF and Hugging Face folders to a DecoderSource, and hostile files.

Tiny models are written here with the real writers (gguf.GGUFWriter through
tools/fixtures/gguf_writer.py, safetensors' numpy API, a BPE trained with `tokenizers`) and read
back; the real SmolLM2-135M GGUF is fetched (pinned) for the facts a tiny model cannot show.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from converters.llm.sources import (
    GGUFHeader,
    expected_shape,
    hf_tensor_name,
    permute_qk,
    read_gguf,
    read_gguf_header,
    read_hf_folder,
    read_source,
    unpermute_qk,
)
from converters.llm.spec import DecoderConfig, SourceFormatError, UnsupportedModelError, tensor_names
from converters.llm.tokenizer_gguf import gguf_tokenizer, tokenizer_json_from_gguf
from tools.fixtures.gguf_writer import gguf_layout, gguf_tensor_name, tokenizer_from_json, write_gguf

TYPED = (SourceFormatError, UnsupportedModelError)
TEXT = (
    "The quick brown fox jumps over the lazy dog. Edge devices run small language models; "
    "tokenizers split text into pieces, and 12345 digits go one by one. Hello, world! "
) * 8


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok_json() -> str:
    """A byte-level BPE of 300 ids trained here: 3 special tokens, 256 bytes, 41 merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    assert tok.get_vocab_size() == 300
    return tok.to_str()


def make_cfg(arch: str = "llama", *, tie: bool = False, bias: bool | None = None, vocab: int = 320, **kw: Any) -> DecoderConfig:
    return DecoderConfig(
        architecture=arch,
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        ffn_dim=128,
        vocab_size=vocab,  # padded past the tokenizer's 300 ids, as real models are
        context_length=256,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=tie,
        attention_bias=(arch == "qwen2") if bias is None else bias,
        bos_token_id=1,
        eos_token_ids=(2,),
        **kw,
    )


def make_weights(cfg: DecoderConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in tensor_names(cfg):
        shape = expected_shape(cfg, name)
        base = 1.0 if name.endswith("norm") else 0.0
        out[name] = (base + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return out


@pytest.fixture()
def tiny_gguf(tmp_path: Path, tok_json: str) -> Callable[..., Path]:
    """tiny_gguf(**write_gguf kwargs, cfg=..., weights=...) -> path of a written GGUF."""
    counter = iter(range(1000))

    def make(cfg: DecoderConfig | None = None, weights: dict[str, np.ndarray] | None = None, **kw: Any) -> Path:
        cfg = cfg or make_cfg()
        weights = weights if weights is not None else make_weights(cfg)
        kw.setdefault("tokenizer", tok_json)
        return write_gguf(tmp_path / f"m{next(counter)}.gguf", cfg, weights, **kw)

    return make


# --- permutation ---------------------------------------------------------------------------------------


def test_unpermute_is_llama_cpp_permute_inverse_and_restores_half_split_order():
    # One head of 4 rows: HF rotates pairs (0, 2) and (1, 3) (half split); llama.cpp stores the
    # pairs adjacent: rows 0, 2, 1, 3.
    rows = np.arange(4, dtype=np.float32)
    assert permute_qk(rows, 1).tolist() == [0, 2, 1, 3]
    assert unpermute_qk(np.array([0, 2, 1, 3], np.float32), 1).tolist() == [0, 1, 2, 3]
    w = np.random.default_rng(1).standard_normal((3 * 8, 5)).astype(np.float32)
    assert np.array_equal(unpermute_qk(permute_qk(w, 3), 3), w)
    assert not np.array_equal(permute_qk(w, 3), w)


# --- GGUF round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, tie, bias, qtype",
    [
        ("llama", False, False, "F32"),
        ("llama", True, False, "Q8_0"),
        ("llama", False, True, "F32"),  # a llama with q/k/v biases: the biases are permuted too
        ("qwen2", False, True, "Q8_0"),
        ("qwen2", True, True, "F32"),
        ("llama", False, False, "F16"),
    ],
)
def test_gguf_round_trip(tiny_gguf, arch, tie, bias, qtype):
    cfg = make_cfg(arch, tie=tie, bias=bias)
    weights = make_weights(cfg, seed=3)
    path = tiny_gguf(cfg, weights, qtype=qtype, chat_template="{{ messages }}")
    src = read_gguf(path)
    assert src.config == cfg
    assert src.source_kind == "gguf" and src.source_path == str(path)
    assert src.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert src.chat_template == "{{ messages }}"
    assert (src.bos_token, src.eos_token) == ("<|im_start|>", "<|im_end|>")
    for name in tensor_names(cfg):
        got, want = src.load(name), weights[name]
        assert got.dtype == np.float32 and got.shape == want.shape, name
        if qtype == "F32" or want.ndim == 1:
            assert np.array_equal(got, want), name
        elif qtype == "F16":
            assert np.array_equal(got, want.astype(np.float16).astype(np.float32)), name
        else:  # Q8_0: within about half a quantization step (amax / 127 per 32-block) of the original
            step = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
            assert (np.abs((got - want).reshape(-1, 32)) <= step * 0.6 + 1e-6).all(), name  # half a step, plus the fp16 scale
    quantized = {n for n in tensor_names(cfg) if weights[n].ndim == 2}
    assert src.native_quant == ({} if qtype == "F32" else dict.fromkeys(quantized, qtype))
    assert ("lm_head" in tensor_names(src.config)) is not tie
    with pytest.raises(KeyError, match="no tensor 'lm_head'" if tie else "no tensor 'nope'"):
        src.load("lm_head" if tie else "nope")


def test_gguf_file_really_holds_permuted_qk_for_llama_only(tiny_gguf):
    """The reader's un-permutation is needed: the file's raw Q/K rows are llama.cpp's order for
    llama and Hugging Face's for qwen2 (read with gguf's own reader, not the code under test)."""
    import gguf

    for arch, permuted in (("llama", True), ("qwen2", False)):
        cfg = make_cfg(arch)
        weights = make_weights(cfg, seed=5)
        reader = gguf.GGUFReader(tiny_gguf(cfg, weights))
        raw = {t.name: np.array(t.data) for t in reader.tensors}
        for name, heads in (("layers.1.q", cfg.n_heads), ("layers.1.k", cfg.n_kv_heads)):
            stored = raw[gguf_tensor_name(name)]
            expect = permute_qk(weights[name], heads) if permuted else weights[name]
            assert np.array_equal(stored, expect), (arch, name)
            assert np.array_equal(stored, weights[name]) is not permuted


def test_gguf_tokenizer_round_trip_and_add_bos(tiny_gguf, tok_json):
    path = tiny_gguf(add_bos=True)
    src = read_gguf(path)
    assert src.add_bos is True
    mine, theirs = Tokenizer.from_str(src.tokenizer_json), Tokenizer.from_str(tok_json)
    for text in ["The quick brown fox.", "Hello, world! 12345", "<|im_start|>user\nhi<|im_end|>\n", "café € 😀 中文"]:
        ids = mine.encode(text).ids
        assert ids == theirs.encode(text).ids, text
        assert mine.decode(ids, skip_special_tokens=False) == text
    assert mine.encode("<|im_start|>").ids == [1]
    assert mine.decode([1, 2], skip_special_tokens=True) == ""  # CONTROL tokens are special
    assert json.loads(src.tokenizer_json)["post_processor"] is None  # BOS is the caller's, never baked in
    assert read_gguf(tiny_gguf()).add_bos is False


def test_read_source_dispatches_and_refuses_other_things(tiny_gguf, tmp_path):
    path = tiny_gguf()
    assert read_source(path).source_kind == "gguf"
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(SourceFormatError, match=r"expected a \.gguf file .*or a Hugging Face folder"):
        read_source(odd)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceFormatError, match="has no config.json"):
        read_source(tmp_path / "empty")
    with pytest.raises(SourceFormatError, match="does not exist"):
        read_source(tmp_path / "missing.gguf")
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(path.read_bytes())
    assert read_source(renamed).config == make_cfg()  # the magic decides, not the suffix


# --- unsupported things --------------------------------------------------------------------------------


def test_unsupported_architecture_tokenizer_and_ggml_type(tiny_gguf, tok_json):
    cfg = make_cfg()
    with pytest.raises(UnsupportedModelError, match=r"architecture 'falcon' .*supported: llama, qwen2"):
        read_gguf(tiny_gguf(dataclasses.replace(cfg, architecture="falcon"), make_weights(cfg)))
    with pytest.raises(UnsupportedModelError, match=r"tokenizer model 'llama' .*supported: 'gpt2'"):
        read_gguf(tiny_gguf(tokenizer_model="llama"))
    with pytest.raises(UnsupportedModelError, match=r"pre-tokenizer 'mystery-pre' .*supported: .*smollm"):
        read_gguf(tiny_gguf(pre="mystery-pre"))
    # I8 is a ggml type gguf.quants cannot dequantize: patch one tensor's type to it (I8 needs fewer
    # bytes than F32, so the file stays consistent otherwise).
    path = tiny_gguf()
    at = gguf_layout(path).tensors["blk.0.ffn_up.weight"]["type"]
    _patch(path, at, struct.pack("<I", 24))
    with pytest.raises(UnsupportedModelError, match=r"'blk.0.ffn_up.weight' has ggml type I8, which gguf.quants.dequantize does not"):
        read_gguf(path)
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        read_gguf(tiny_gguf(extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)}))
    with pytest.raises(UnsupportedModelError, match=r"does not know: \['blk.0.attn_q_norm.weight'\]"):
        read_gguf(tiny_gguf(extra_tensors={"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}))
    with pytest.raises(UnsupportedModelError, match="rope scaling 'yarn'"):
        read_gguf(tiny_gguf(extra_kv={"llama.rope.scaling.type": "yarn"}))


def test_gguf_linear_rope_scaling_is_read(tiny_gguf):
    cfg = make_cfg(rope_scaling={"type": "linear", "factor": 4.0})
    assert read_gguf(tiny_gguf(cfg, make_weights(cfg))).config.rope_scaling == {"type": "linear", "factor": 4.0}


# --- hostile GGUF --------------------------------------------------------------------------------------


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


_EXTRA = {"general.alignment": 32, "test.flag": True, "test.flah": False, "test.array": [1, 2, 3]}
T = "blk.0.attn_q.weight"


def _t(layout: Any, name: str, field: str) -> int:
    return int(layout.tensors[name][field])


def _break_first_merge(layout: Any, raw: bytes) -> list[tuple[int, bytes]]:
    """Overwrite the first merge with same-length ASCII naming no token ("\x01.. \x01")."""
    at = layout.kv["tokenizer.ggml.merges"]["value"] + 12  # past the element type and the count
    (length,) = struct.unpack_from("<Q", raw, at)
    return [(at + 8, b"\x01" * (length - 2) + b" \x01")]


# (id, patch(layout, file bytes) -> [(offset, bytes)] to overwrite or a length to truncate to, error type, message regex):
# one row per hostile field.
HOSTILE: list[tuple[str, Callable[[Any, bytes], list[tuple[int, bytes]] | int], type[Exception], str]] = [
    ("bad magic", lambda L, raw: [(0, b"GGUX")], SourceFormatError, r"magic: expected b'GGUF'"),
    ("unknown version", lambda L, raw: [(4, _u32(7))], SourceFormatError, r"version: expected GGUF version 2 or 3, found 7"),
    ("version 1", lambda L, raw: [(4, _u32(1))], UnsupportedModelError, r"GGUF version 1"),
    ("big-endian", lambda L, raw: [(4, struct.pack(">I", 3))], UnsupportedModelError, r"big-endian"),
    ("tensor_count overflows", lambda L, raw: [(8, _u64(2**64 - 1))], SourceFormatError, r"tensor_count: expected at most"),
    ("kv_count overflows", lambda L, raw: [(16, _u64(2**63))], SourceFormatError, r"metadata_kv_count: expected at most"),
    ("key length over cap", lambda L, raw: [(24, _u64(2**40))], SourceFormatError, r"metadata key #0: expected a string of at most 65,535"),
    (
        "string length past EOF",
        lambda L, raw: [(L.kv["general.name"]["value"], _u64(len(raw)))],
        SourceFormatError,
        r"metadata 'general.name': expected \d+ bytes at offset \d+, found the file ends",
    ),
    (
        "string over 64 MiB cap",
        lambda L, raw: [(L.kv["general.name"]["value"], _u64(65 << 20))],
        SourceFormatError,
        r"'general.name': expected a string of at most 67,108,864 bytes",
    ),
    (
        "invalid UTF-8",
        lambda L, raw: [(L.kv["general.name"]["value"] + 8, b"\xff")],
        SourceFormatError,
        r"'general.name': expected UTF-8 text",
    ),
    (
        "unknown value type",
        lambda L, raw: [(L.kv["test.flag"]["type"], _u32(99))],
        SourceFormatError,
        r"'test.flag': expected a value type",
    ),
    ("bool byte 2", lambda L, raw: [(L.kv["test.flag"]["value"], b"\x02")], SourceFormatError, r"'test.flag': expected a bool"),
    (
        "duplicate key",
        lambda L, raw: [(L.kv["test.flah"]["key"] + 8, b"test.flag")],
        SourceFormatError,
        r"expected unique keys, found 'test.flag' a second time",
    ),
    (
        "array over 2^24 entries",
        lambda L, raw: [(L.kv["test.array"]["value"] + 4, _u64(2**24 + 1))],
        SourceFormatError,
        r"'test.array': expected an array of at most 16,777,216 entries",
    ),
    (
        "array past EOF",
        lambda L, raw: [(L.kv["test.array"]["value"] + 4, _u64(2**22))],
        SourceFormatError,
        r"'test.array': expected \d+ bytes .* file ends",
    ),
    (
        "token array over cap",
        lambda L, raw: [(L.kv["tokenizer.ggml.tokens"]["value"] + 4, _u64(2**30))],
        SourceFormatError,
        r"'tokenizer.ggml.tokens': expected an array of at most 67,108,864",
    ),
    (
        "token array past EOF",
        lambda L, raw: [(L.kv["tokenizer.ggml.tokens"]["value"] + 4, _u64(2**24))],
        SourceFormatError,
        r"'tokenizer.ggml.tokens': expected 16,777,216 entries of at least 8 bytes",
    ),
    (
        "alignment not a power of two",
        lambda L, raw: [(L.kv["general.alignment"]["value"], _u32(48))],
        SourceFormatError,
        r"'general.alignment': expected a power of two, found 48",
    ),
    (
        "alignment of the wrong type",
        lambda L, raw: [(L.kv["general.alignment"]["type"], _u32(5))],
        SourceFormatError,
        r"'general.alignment': expected a UINT32, found INT32",
    ),
    ("n_dims 5", lambda L, raw: [(_t(L, T, "n_dims"), _u32(5))], SourceFormatError, rf"tensor '{T}' n_dims: expected 1..4, found 5"),
    ("n_dims 0", lambda L, raw: [(_t(L, T, "n_dims"), _u32(0))], SourceFormatError, rf"tensor '{T}' n_dims: expected 1..4, found 0"),
    (
        "dims overflow int64",
        lambda L, raw: [(_t(L, T, "dims"), _u64(2**40) + _u64(2**40))],
        SourceFormatError,
        rf"tensor '{T}' dims: expected a product that fits int64",
    ),
    ("zero dim", lambda L, raw: [(_t(L, T, "dims"), _u64(0))], SourceFormatError, rf"'{T}' dims: expected every dimension >= 1"),
    ("unknown ggml type", lambda L, raw: [(_t(L, T, "type"), _u32(99))], UnsupportedModelError, rf"'{T}' has ggml type 99"),
    (
        "block size does not divide ne0",
        lambda L, raw: [(_t(L, T, "type"), _u32(12))],  # Q4_K: blocks of 256 > d_model 64
        SourceFormatError,
        rf"'{T}' dims\[0\]: expected a multiple of the Q4_K block size 256",
    ),
    (
        "offset outside the file",
        lambda L, raw: [(_t(L, T, "offset"), _u64(2**40))],
        SourceFormatError,
        rf"tensor '{T}' data .*expected inside the file",
    ),
    (
        "data runs past EOF",
        lambda L, raw: [(_t(L, T, "offset"), _u64((len(raw) - L.data_start - 32) // 32 * 32))],
        SourceFormatError,
        rf"tensor '{T}' data .*expected inside the file, found the file ends at",
    ),
    (
        "misaligned offset",
        lambda L, raw: [(_t(L, T, "offset"), _u64(_t(L, T, "data_offset") + 4))],
        SourceFormatError,
        rf"tensor '{T}' offset: expected a multiple of the alignment 32",
    ),
    (
        "overlapping tensors",
        lambda L, raw: [(_t(L, "blk.0.attn_k.weight", "offset"), _u64(_t(L, T, "data_offset") + 32))],
        SourceFormatError,
        r"expected no overlap, found it overlaps",
    ),
    (
        "duplicate tensor name",
        lambda L, raw: [(_t(L, "blk.0.attn_k.weight", "name") + 8, b"blk.0.attn_q.weight")],
        SourceFormatError,
        r"expected unique tensor names, found 'blk.0.attn_q.weight' a second time",
    ),
    (
        "shape not matching the config",
        lambda L, raw: [(_t(L, "blk.0.ffn_norm.weight", "dims"), _u64(32))],
        SourceFormatError,
        r"'blk.0.ffn_norm.weight' shape: expected \[64\] .*from the config, found \[32\]",
    ),
    (
        "integer metadata stored as float",
        lambda L, raw: [(L.kv["llama.context_length"]["type"], _u32(6))],
        SourceFormatError,
        r"'llama.context_length': expected an integer, found FLOAT32",
    ),
    (
        "vocab_size not matching token_embd",
        lambda L, raw: [(L.kv["llama.vocab_size"]["value"], _u32(999))],
        SourceFormatError,
        r"'llama.vocab_size': expected the token_embd rows 320, found 999",
    ),
    (
        "zero heads",
        lambda L, raw: [(L.kv["llama.attention.head_count"]["value"], _u32(0))],
        SourceFormatError,
        r"'llama.attention.head_count': expected an integer >= 1, found 0",
    ),
    (
        "huge context",
        lambda L, raw: [(L.kv["llama.context_length"]["value"], _u32(2**31))],
        UnsupportedModelError,
        r"context_length': a context of 2,147,483,648 positions",
    ),
    (
        "merge of an unknown token",
        lambda L, raw: _break_first_merge(L, raw),
        SourceFormatError,
        r"tokenizer.ggml.merges': expected merges of tokens in the vocabulary",
    ),
    # truncations (the patch gives the length to keep)
    (
        "truncated in the metadata",
        lambda L, raw: 400,
        SourceFormatError,
        r"tensor_count: expected at most 11 tensors in a file of 400 bytes",
    ),
    (
        "truncated in a tensor info",
        lambda L, raw: _t(L, T, "dims") + 3,
        SourceFormatError,
        rf"tensor '{T}' dims\[0\]: expected 8 bytes at offset \d+, found the file ends at",
    ),
    ("truncated in the data", lambda L, raw: len(raw) - 1, SourceFormatError, r"expected inside the file, found the file ends at"),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_gguf_raises_typed_error_naming_the_field(tiny_gguf, case):
    _, patch, error, message = case
    path = tiny_gguf(qtype="Q8_0", extra_kv=_EXTRA)
    read_gguf(path)  # the file is valid before the one change
    layout, raw = gguf_layout(path), path.read_bytes()
    change = patch(layout, raw)
    if isinstance(change, int):
        path.write_bytes(raw[:change])
    else:
        for offset, data in change:
            _patch(path, offset, data)
    with pytest.raises(error, match=message) as info:
        read_gguf(path)
    assert type(info.value) is error
    assert str(path) in str(info.value)  # the message names the file


def test_missing_metadata_and_tensors(tiny_gguf):
    with pytest.raises(SourceFormatError, match=r"'llama.block_count' is missing"):
        read_gguf(tiny_gguf(omit_kv=["llama.block_count"]))
    with pytest.raises(SourceFormatError, match=r"'tokenizer.ggml.merges' is missing"):
        read_gguf(tiny_gguf(omit_kv=["tokenizer.ggml.merges"]))
    with pytest.raises(SourceFormatError, match=r"tensor 'blk.1.ffn_down.weight' is missing"):
        read_gguf(tiny_gguf(omit_tensors=["layers.1.down"]))
    with pytest.raises(SourceFormatError, match=r"tensor 'token_embd.weight' is missing"):
        read_gguf(tiny_gguf(omit_tensors=["embed"]))
    cfg = make_cfg("qwen2")
    with pytest.raises(SourceFormatError, match=r"tensor 'blk.0.attn_k.bias' is missing; qwen2 has q/k/v biases"):
        read_gguf(tiny_gguf(cfg, make_weights(cfg), omit_tensors=["layers.0.k_bias"]))


def test_tokenizer_larger_than_embedding_and_duplicate_tokens(tiny_gguf, tok_json):
    cfg = make_cfg(vocab=290)
    with pytest.raises(SourceFormatError, match=r"expected at most 290 tokens \(token_embd rows\), found 300"):
        read_gguf(tiny_gguf(cfg, make_weights(cfg)))
    tokens, merges, types = tokenizer_from_json(tok_json)
    tokens = list(tokens)
    tokens[299] = tokens[298]
    with pytest.raises(SourceFormatError, match=r"expected unique token strings, found .* at ids 298 and 299"):
        read_gguf(tiny_gguf(tokenizer=(tokens, merges, types)))


def test_non_finite_weights_refused_on_load(tiny_gguf):
    cfg = make_cfg()
    weights = make_weights(cfg)
    weights["layers.0.up"][3, 4] = np.nan
    src = read_gguf(tiny_gguf(cfg, weights))
    src.load("layers.0.down")
    with pytest.raises(SourceFormatError, match=r"'blk.0.ffn_up.weight': expected finite values"):
        src.load("layers.0.up")


def test_file_changed_after_header_is_refused_on_load(tiny_gguf):
    path = tiny_gguf()
    src = read_gguf(path)
    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(SourceFormatError, match=r"file size: expected \d[\d,]* bytes"):
        src.load("norm")


def test_fuzz_truncations_and_header_corruptions_raise_only_typed_errors(tiny_gguf):
    """30 truncations anywhere and 30 single-byte corruptions of the header (fixed seed): each read
    succeeds (then every tensor loads) or raises SourceFormatError / UnsupportedModelError."""
    path = tiny_gguf(qtype="Q8_0")
    original = path.read_bytes()
    layout = gguf_layout(path)
    rng = np.random.default_rng(20240601)
    cuts = sorted(set(rng.integers(0, len(original), 30).tolist()))
    corruptions = [(int(rng.integers(0, layout.data_start)), int(rng.integers(0, 256))) for _ in range(30)]
    outcomes: dict[str, int] = {"ok": 0, "typed": 0}
    cases = [original[:cut] for cut in cuts]
    for at, byte in corruptions:
        raw = bytearray(original)
        raw[at] = byte if byte != raw[at] else (byte + 1) % 256
        cases.append(bytes(raw))
    for data in cases:
        path.write_bytes(data)
        try:
            src = read_gguf(path)
            for name in tensor_names(src.config):
                src.load(name)
        except TYPED:
            outcomes["typed"] += 1
        else:
            outcomes["ok"] += 1
    assert outcomes["typed"] >= 30  # every truncation fails, typed
    assert sum(outcomes.values()) == len(cases)


# --- Hugging Face folders ------------------------------------------------------------------------------


def _hf_config(cfg: DecoderConfig, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model_type": cfg.architecture,
        "architectures": ["LlamaForCausalLM" if cfg.architecture == "llama" else "Qwen2ForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.context_length,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_ids),
        "torch_dtype": "float32",
    }
    if cfg.architecture == "llama":
        doc["attention_bias"] = cfg.attention_bias
    doc.update(over)
    return doc


hf_name = hf_tensor_name


def write_raw_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]], *, header_extra: str = "") -> None:
    """A safetensors file written by hand (BF16, and hostile headers the library would not write)."""
    header: dict[str, Any] = {}
    blobs, pos = [], 0
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    text = json.dumps(header) if not header_extra else header_extra
    raw = text.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def make_hf_folder(
    root: Path,
    cfg: DecoderConfig,
    weights: dict[str, np.ndarray],
    tok_json: str,
    *,
    dtype: str = "F32",
    shards: int = 1,
    config_over: dict[str, Any] | None = None,
) -> Path:
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(_hf_config(cfg, **(config_over or {}))))
    (root / "tokenizer.json").write_text(tok_json)
    (root / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
                "bos_token": "<|im_start|>",
                "eos_token": {"content": "<|im_end|>"},
            }
        )
    )
    names = [hf_name(n) for n in tensor_names(cfg)]
    arrays = {hf_name(n): weights[n] for n in tensor_names(cfg)}
    groups = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for fname, group in zip(files, groups):
        if dtype == "BF16":
            write_raw_safetensors(
                root / fname,
                {n: ("BF16", arrays[n].shape, (arrays[n].view(np.uint32) >> 16).astype("<u2").tobytes()) for n in group},
            )
        else:
            np_dtype = np.float16 if dtype == "F16" else np.float32
            save_file({n: arrays[n].astype(np_dtype) for n in group}, str(root / fname))
    if shards > 1:
        weight_map = {n: fname for fname, group in zip(files, groups) for n in group}
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.mark.parametrize(
    "arch, tie, dtype, shards",
    [("llama", False, "F32", 1), ("llama", True, "BF16", 1), ("qwen2", False, "F16", 3), ("qwen2", True, "BF16", 2)],
)
def test_hf_folder_round_trip(tmp_path, tok_json, arch, tie, dtype, shards):
    cfg = make_cfg(arch, tie=tie)
    weights = make_weights(cfg, seed=11)
    folder = make_hf_folder(tmp_path / "m", cfg, weights, tok_json, dtype=dtype, shards=shards)
    src = read_source(folder)
    assert src.config == cfg
    assert src.source_kind == "safetensors" and src.add_bos is False
    assert src.chat_template and src.chat_template.startswith("{% for m in messages %}")
    assert (src.bos_token, src.eos_token) == ("<|im_start|>", "<|im_end|>")
    for name in tensor_names(cfg):
        want = weights[name]
        if dtype == "BF16":
            want = ((want.view(np.uint32) >> 16) << 16).view(np.float32)  # bf16 widens exactly
        elif dtype == "F16":
            want = want.astype(np.float16).astype(np.float32)
        assert np.array_equal(src.load(name), want), name
    assert set(src.native_quant.values()) == ({dtype} if dtype != "F32" else set())
    files = sorted(folder.glob("*.safetensors"))
    if shards == 1:
        assert src.source_sha256 == hashlib.sha256(files[0].read_bytes()).hexdigest()
    else:
        manifest = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in files)
        assert src.source_sha256 == hashlib.sha256(manifest.encode()).hexdigest()


def test_hf_config_variants(tmp_path, tok_json):
    cfg = make_cfg()
    weights = make_weights(cfg)
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    folder = make_hf_folder(tmp_path / "a", cfg, weights, tok_json, config_over={"rope_scaling": llama3, "eos_token_id": 2, "head_dim": 16})
    got = read_hf_folder(folder).config
    assert got.rope_scaling == {"type": "llama3", **{k: v for k, v in llama3.items() if k != "rope_type"}}
    assert got.eos_token_ids == (2,)
    folder = make_hf_folder(tmp_path / "b", cfg, weights, tok_json, config_over={"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert read_hf_folder(folder).config.rope_scaling == {"type": "linear", "factor": 2.0}
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert read_hf_folder(folder).config.eos_token_ids == (2, 0)


@pytest.mark.parametrize(
    "over, error, message",
    [
        ({"model_type": "mistral"}, UnsupportedModelError, r"model_type 'mistral' is not supported; supported: llama, qwen2"),
        ({"hidden_act": "gelu"}, UnsupportedModelError, r"hidden_act 'gelu' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, UnsupportedModelError, r"rope scaling 'yarn' is not supported"),
        ({"hidden_size": None}, SourceFormatError, r"'hidden_size' is missing"),
        ({"num_hidden_layers": "2"}, SourceFormatError, r"'num_hidden_layers': expected an integer, found '2'"),
        ({"tie_word_embeddings": 1}, SourceFormatError, r"'tie_word_embeddings': expected true or false, found 1"),
        ({"rms_norm_eps": -1.0}, SourceFormatError, r"'rms_norm_eps': expected a finite number > 0"),
        ({"eos_token_id": ["x"]}, SourceFormatError, r"'eos_token_id': expected a token id or a list"),
        ({"num_key_value_heads": 3}, SourceFormatError, r"'num_key_value_heads': expected a divisor of num_attention_heads 4"),
        ({"vocab_size": 290}, SourceFormatError, r"the tokenizer has 300 ids \(with added tokens\), more than the 290 embedding rows"),
        ({"intermediate_size": 64}, SourceFormatError, r"'model.layers.0.mlp.gate_proj.weight' shape: expected \[64, 64\]"),
        # the folder is written tied: saying untied leaves lm_head missing
        ({"tie_word_embeddings": False}, SourceFormatError, r"tensor 'lm_head.weight' is missing \(tie_word_embeddings is false\)"),
    ],
)
def test_hf_config_errors(tmp_path, tok_json, over, error, message):
    cfg = make_cfg(tie=True)
    folder = make_hf_folder(tmp_path / "m", cfg, make_weights(cfg), tok_json, config_over=over)
    with pytest.raises(error, match=message):
        read_hf_folder(folder)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b"\x01\x02"), r"header length: expected 8 bytes"),
        (lambda p: p.write_bytes(_u64(200_000_000) + b"{}"), r"header length: expected at most 100,000,000 bytes"),
        (lambda p: p.write_bytes(_u64(5000) + b"{}"), r"header length: expected at most 2 \(the file's size less 8\)"),
        (lambda p: p.write_bytes(_u64(8) + b"not json"), r"header: expected JSON"),
        (lambda p: p.write_bytes(_u64(4) + b"\xff\xfe{}"), r"header: expected UTF-8 JSON"),
        (lambda p: p.write_bytes(_u64(2) + b"[]"), r"header: expected a JSON object, found list"),
        (
            lambda p: write_raw_safetensors(p, {"a": ("F99", (1,), b"\0" * 4)}),
            r"tensor 'a': dtype: expected one of F64, F32",
        ),
        (
            lambda p: write_raw_safetensors(p, {"a": ("F32", (3,), b"\0" * 8)}),
            r"tensor 'a': data_offsets: expected 12 bytes for F32 \[3\], found 8",
        ),
        (
            lambda p: write_raw_safetensors(p, {}, header_extra='{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'),
            r"tensor 'a': data_offsets: expected 0 <= begin <= end <= 0",
        ),
        (
            lambda p: p.write_bytes(
                (h := b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}')
                and _u64(len(h)) + h + b"\0" * 12
            ),
            r"tensor 'b' data_offsets: expected no overlap, found it overlaps 'a'",
        ),
        (
            lambda p: p.write_bytes(
                (h := b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{}}') and _u64(len(h)) + h + b"\0" * 4
            ),
            r"JSON: expected unique keys, found 'a' twice",
        ),
        (
            lambda p: write_raw_safetensors(p, {"a": ("F32", (-1,), b"")}),
            r"tensor 'a': shape: expected a list of non-negative integers",
        ),
        (
            lambda p: write_raw_safetensors(p, {}, header_extra='{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}'),
            r"tensor 'a': expected an object with dtype, shape and data_offsets",
        ),
    ],
)
def test_hostile_safetensors(tmp_path, tok_json, make, message):
    cfg = make_cfg()
    folder = make_hf_folder(tmp_path / "m", cfg, make_weights(cfg), tok_json)
    target = folder / "model.safetensors"
    make(target)
    with pytest.raises(SourceFormatError, match=message) as info:
        read_hf_folder(folder)
    assert str(target) in str(info.value)


def test_safetensors_unsupported_dtype_and_unknown_tensor(tmp_path, tok_json):
    from safetensors.numpy import save_file

    cfg = make_cfg()
    weights = make_weights(cfg)
    folder = make_hf_folder(tmp_path / "m", cfg, weights, tok_json)
    arrays = {hf_name(n): weights[n] for n in tensor_names(cfg)}
    save_file({**arrays, "model.norm.weight": np.ones(64, np.float64)}, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=r"'model.norm.weight' dtype F64 is not supported; supported: F32, F16, BF16"):
        read_hf_folder(folder)
    save_file({**arrays, "model.layers.0.self_attn.q_norm.weight": np.ones(16, np.float32)}, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=r"does not know: \['model.layers.0.self_attn.q_norm.weight'\]"):
        read_hf_folder(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight": "../evil.safetensors"}}))
    with pytest.raises(SourceFormatError, match=r"expected plain \*.safetensors file names in this folder, found '../evil.safetensors'"):
        read_hf_folder(folder)


# --- tokenizer from GGUF metadata, directly --------------------------------------------------------------


def test_tokenizer_json_from_gguf_field_checks(tok_json):
    tokens, merges, types = tokenizer_from_json(tok_json)
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": list(tokens),
        "tokenizer.ggml.merges": list(merges),
        "tokenizer.ggml.token_type": list(types),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    tok = Tokenizer.from_str(tokenizer_json_from_gguf(fields))
    # qwen2's regex splits digits one by one and keeps "'s" apart
    assert [tok.decode([i]) for i in tok.encode("99 it's").ids][:2] == ["9", "9"]
    info = gguf_tokenizer(fields)
    assert (info.bos_token_id, info.eos_token_id, info.pre, info.n_tokens) == (1, 2, "qwen2", 300)
    for key, value, message in [
        ("tokenizer.ggml.tokens", "abc", r"'tokenizer.ggml.tokens': expected an array of strings"),
        ("tokenizer.ggml.token_type", [1] * 3, r"'tokenizer.ggml.token_type': expected 300 entries"),
        ("tokenizer.ggml.token_type", [9] * 300, r"'tokenizer.ggml.token_type': expected values 0..6"),
        ("tokenizer.ggml.bos_token_id", 5000, r"'tokenizer.ggml.bos_token_id': expected a token id in \[0, 300\)"),
        ("tokenizer.ggml.merges", ["nospace"], r"'tokenizer.ggml.merges': expected 'left right' pairs"),
        ("tokenizer.ggml.add_bos_token", 1, r"'tokenizer.ggml.add_bos_token': expected a bool"),
        ("tokenizer.chat_template", 7, r"'tokenizer.chat_template': expected a string"),
    ]:
        with pytest.raises(SourceFormatError, match=message):
            gguf_tokenizer({**fields, key: value}, source="x.gguf")
    with pytest.raises(UnsupportedModelError, match=r"tokenizer model 'bert'"):
        gguf_tokenizer({**fields, "tokenizer.ggml.model": "bert"})
    # llama.cpp's LLAMA3 pre-tokenizers take a piece that is a whole token before merging, and add BOS
    # unless the file says otherwise; others do neither.
    llama3 = gguf_tokenizer({**fields, "tokenizer.ggml.pre": "llama-bpe"})
    assert json.loads(llama3.tokenizer_json)["model"]["ignore_merges"] is True and llama3.add_bos is True
    assert gguf_tokenizer({**fields, "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": False}).add_bos is False
    assert json.loads(info.tokenizer_json)["model"]["ignore_merges"] is False and info.add_bos is False
    # An empty token string gets llama.cpp's placeholder name instead of breaking the vocabulary.
    padded = {**fields, "tokenizer.ggml.tokens": [*tokens, ""], "tokenizer.ggml.token_type": [*types, 1]}
    assert gguf_tokenizer(padded).token(300) == "[EMPTY_300]"


# --- the real SmolLM2-135M-Instruct GGUF -----------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from tools.fixtures.fetch_pretrained import fetch

    return fetch("smollm2-135m-instruct-q4_1")  # fails loudly (FetchError) when it cannot; never skips


def _q4_1_reference(raw: bytes, rows: int, cols: int) -> np.ndarray:
    """Q4_1 decoded from the format itself (ggml-quants.c dequantize_row_q4_1): blocks of 32 as
    fp16 d, fp16 m, 16 bytes of nibbles; element j < 16 is the low nibble of byte j, j >= 16 the high
    nibble of byte j - 16; w = d * q + m."""
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]))
    d = blocks["d"].astype(np.float32)[:, None]
    m = blocks["m"].astype(np.float32)[:, None]
    q = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.float32)
    return (d * q + m).reshape(rows, cols)


def test_smollm2_gguf_facts(smollm2):
    src = read_source(smollm2)
    c = src.config
    assert (c.architecture, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (c.ffn_dim, c.vocab_size, c.context_length, c.rope_theta, c.tie_embeddings) == (1536, 49152, 8192, 100000.0, True)
    assert (c.attention_bias, c.rope_scaling, c.rms_eps) == (False, None, 1e-5)
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    assert src.source_sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert src.native_quant["embed"] == "Q8_0"
    assert {src.native_quant[f"layers.{i}.{p}"] for i in range(30) for p in ("q", "k", "v", "o", "gate", "up", "down")} == {"Q4_1"}
    assert len(src.native_quant) == 211 and "norm" not in src.native_quant  # 61 F32 norms are not listed
    # The file says add_bos_token = false (its chat template starts with <|im_start|> itself).
    assert src.add_bos is False and (src.bos_token, src.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert src.chat_template and "<|im_start|>" in src.chat_template and "<|im_end|>" in src.chat_template

    tok = Tokenizer.from_str(src.tokenizer_json)
    assert tok.get_vocab_size() == 49152
    assert tok.encode("<|im_start|>").ids == [1] and tok.encode("<|im_end|>").ids == [2]
    for text in ["Hello, world!", "The capital of France is Paris.", "café é € 😀 中文 日本語", "  spaces\tand\nnewlines 12345"]:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    ids = tok.encode(prompt).ids
    assert ids[0] == 1 and ids.count(2) == 1 and tok.decode(ids, skip_special_tokens=False) == prompt
    assert [tok.decode([i]) for i in tok.encode("2024").ids] == ["2", "0", "2", "4"]  # smollm splits digits

    # One layer: shapes, and Q4_1 decoding checked against the format's own definition.
    header: GGUFHeader = read_gguf_header(smollm2)
    down = header.tensors["blk.0.ffn_down.weight"]
    with open(smollm2, "rb") as f:
        f.seek(header.data_offset + down.offset)
        raw = f.read(down.n_bytes)
    assert np.array_equal(src.load("layers.0.down"), _q4_1_reference(raw, 576, 1536))
    for name in ("layers.0.q", "layers.0.k", "layers.0.v", "layers.0.attn_norm"):
        w = src.load(name)
        assert w.shape == expected_shape(c, name) and np.isfinite(w).all()
    # The un-permuted K reproduces the file's rows when permuted back (per KV head).
    k_file = header.tensors["blk.0.attn_k.weight"]
    with open(smollm2, "rb") as f:
        f.seek(header.data_offset + k_file.offset)
        k_raw = _q4_1_reference(f.read(k_file.n_bytes), 192, 576)
    assert np.array_equal(permute_qk(src.load("layers.0.k"), 3), k_raw)
