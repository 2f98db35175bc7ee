"""Importing a GGUF file's own Q4_0 / Q4_1 / Q8_0 blocks exactly (converters/llm/native.py): the
blocks dequantize to what gguf.quants.dequantize gives, and an int4 "native" graph computes the
same logits as the numpy reference on the file's float weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from converters.llm.graph import VariantPlan, build_decoder_graph
from converters.llm.native import NATIVE_BITS, native_overrides, native_weight
from converters.llm.quant import dequantize
from converters.llm.reference import ReferenceDecoder
from converters.llm.sources import read_gguf
from tests.test_llm_sources import make_cfg, make_weights, tok_json  # noqa: F401  (the module fixture)
from tools.fixtures.gguf_writer import write_gguf


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_native_blocks_dequantize_exactly(tmp_path: Path, tok_json: str, qtype: str, arch: str) -> None:  # noqa: F811
    cfg = make_cfg(arch, tie=True)
    path = write_gguf(tmp_path / "m.gguf", cfg, make_weights(cfg), tok_json, qtype=qtype)
    src = read_gguf(path)
    for name in ("layers.0.q", "layers.0.k", "layers.1.down", "lm_head"):
        qw = native_weight(src, name)
        assert qw is not None and qw.bits == NATIVE_BITS[qtype] and qw.method == f"native-{qtype.lower()}"
        want = src.tensor("embed" if name == "lm_head" else name)  # gguf's own dequantization, un-permuted
        np.testing.assert_allclose(dequantize(qw), want, rtol=0, atol=2e-6 * float(np.abs(want).max()))
        assert (qw.offsets is not None) == (qtype == "Q4_1")
    ov = native_overrides(src)
    assert set(ov.values()) == {NATIVE_BITS[qtype]} and "lm_head" in ov


def test_f32_tensors_are_not_imported(tmp_path: Path, tok_json: str) -> None:  # noqa: F811
    cfg = make_cfg()
    src = read_gguf(write_gguf(tmp_path / "m.gguf", cfg, make_weights(cfg), tok_json, qtype="F32"))
    assert native_weight(src, "layers.0.q") is None and native_overrides(src) == {}


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_0"])
def test_native_graph_matches_the_reference_on_the_files_weights(tmp_path: Path, tok_json: str, qtype: str) -> None:  # noqa: F811
    cfg = make_cfg("llama", tie=True)
    src = read_gguf(write_gguf(tmp_path / "m.gguf", cfg, make_weights(cfg, seed=3), tok_json, qtype=qtype))
    plan = VariantPlan("int4", method="native", overrides=native_overrides(src), accuracy_level=0)
    info = build_decoder_graph(src, plan, tmp_path / "g.onnx", all_logits=True)
    if qtype == "Q4_1":
        # one block-sum MatMul per projection input (4 per layer) and one for the head
        assert info.ops.get("MatMul", 0) == 4 * cfg.n_layers + 1
    sess = ort.InferenceSession(str(tmp_path / "g.onnx"), providers=["CPUExecutionProvider"])
    ids = [5, 17, 42, 99, 7, 250, 3]
    ref, _ = ReferenceDecoder(src).forward(ids)  # src.tensor: the file's float weights
    feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    feeds.update({f"past_key_values.{i}.{p}": np.zeros((1, cfg.n_kv_heads, 32, cfg.head_dim), np.float32) for i in range(cfg.n_layers) for p in ("key", "value")})
    logits = sess.run(["logits"], feeds)[0][0]
    # Q4_0 is exact; Q4_1's per-block offsets are held in 8 bits and its tied embedding is an 8-bit copy
    # (GatherBlockQuantized adds no offset): within 1/256-ish of the logit range, not bit-exact.
    tol = 2e-3 if qtype == "Q4_0" else 2e-2
    np.testing.assert_allclose(logits, ref, atol=tol * float(np.abs(ref).max()))
    assert (logits.argmax(-1) == ref.argmax(-1)).mean() >= 0.85
