"""Backend tests: real ONNX Runtime and LiteRT sessions behind ``edge_sdk.load``.

Every model is built here (``onnx.helper`` / ORT's quantizers for ONNX,
:class:`converters.tflite_writer.TFLiteBuilder` for TFLite) with seeded
weights, packaged with :func:`converters.packaging.write_package`, loaded
through the public API and compared against a numpy reference computed in
float64 in this file. Nothing under test is mocked. All caches live in
``tmp_path``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("ai_edge_litert.interpreter")
pytest.importorskip("flatbuffers")

from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import edge_sdk  # noqa: E402
from converters.packaging import write_package  # noqa: E402
from converters.tflite_writer import TFLiteBuilder  # noqa: E402
from edge_sdk.errors import SessionClosedError, SignatureMismatchError  # noqa: E402
from edge_sdk.model import LoadOptions  # noqa: E402
from edge_sdk.profiles import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "generic-x86_64"
CPU = "CPUExecutionProvider"

# ---------------------------------------------------------------------------
# seeded weights and numpy references

_rng = np.random.default_rng(1234)
# conv -> relu -> flatten -> matmul -> add: x[1,3,8,8] (NCHW) -> y[1,64]
CONV_W = (_rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)  # OIHW
CONV_B = (_rng.standard_normal(8) * 0.1).astype(np.float32)
MM_W = (_rng.standard_normal((512, 64)) * 0.05).astype(np.float32)  # K=512, N=64
MM_B = (_rng.standard_normal(64) * 0.1).astype(np.float32)
# plain MatMul for int4 (K, N multiples of the 32 block): x[1,64] -> y[1,32]
Q4_K, Q4_N, Q4_BLOCK = 64, 32, 32
Q4_W = (_rng.standard_normal((Q4_K, Q4_N)) * 0.2).astype(np.float32)
# dense layer shared by the ONNX and TFLite fp32 twins: x[b,32] -> y[b,16]
FC_W = (_rng.standard_normal((16, 32)) * 0.25).astype(np.float32)  # OI
FC_B = (_rng.standard_normal(16) * 0.1).astype(np.float32)
# NHWC conv for the float TFLite model: x[1,8,8,3] -> conv 3x3 SAME relu -> mean(H,W) -> FC -> y[1,10]
T_CONV_W = (_rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)  # OHWI
T_CONV_B = (_rng.standard_normal(8) * 0.1).astype(np.float32)
T_FC_W = (_rng.standard_normal((10, 8)) * 0.5).astype(np.float32)
T_FC_B = (_rng.standard_normal(10) * 0.1).astype(np.float32)

# int8 TFLite dense layer: inputs in [-1, 1]; outputs (std ~0.8) fit the +-5 int8 range
IN_Q = (2.0 / 255.0, 0)
OUT_Q = (10.0 / 255.0, 0)


def ref_convmm(x: np.ndarray) -> np.ndarray:
    """float64 numpy reference of the conv/matmul ONNX model (NCHW, pad 1)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = sliding_window_view(xp, (3, 3), axis=(2, 3))  # n c h w i j
    c = np.einsum("nchwij,ocij->nohw", win, CONV_W.astype(np.float64)) + CONV_B[None, :, None, None]
    return np.maximum(c, 0.0).reshape(x.shape[0], -1) @ MM_W.astype(np.float64) + MM_B


def ref_q4(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ Q4_W.astype(np.float64)


def ref_fc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ FC_W.T.astype(np.float64) + FC_B


def ref_tconv(x: np.ndarray) -> np.ndarray:
    """float64 reference of the NHWC TFLite conv model."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    win = sliding_window_view(xp, (3, 3), axis=(1, 2))  # n h w c i j
    c = np.einsum("nhwcij,oijc->nhwo", win, T_CONV_W.astype(np.float64)) + T_CONV_B
    return np.maximum(c, 0.0).mean(axis=(1, 2)) @ T_FC_W.T.astype(np.float64) + T_FC_B


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())


def cosine(y: np.ndarray, ref: np.ndarray) -> float:
    a, b = y.astype(np.float64).ravel(), ref.ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---------------------------------------------------------------------------
# model builders


def _onnx_model(nodes, inputs, outputs, inits, *, ms_domain: bool = False) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms_domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def convmm_onnx(dtype: Any = np.float32) -> onnx.ModelProto:
    tp = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    inits = [numpy_helper.from_array(a.astype(dtype), n) for a, n in ((CONV_W, "w"), (CONV_B, "b"), (MM_W, "m"), (MM_B, "mb"))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "m"], ["mm"]),
        helper.make_node("Add", ["mm", "mb"], ["y"]),
    ]
    return _onnx_model(
        nodes, [helper.make_tensor_value_info("x", tp, [1, 3, 8, 8])], [helper.make_tensor_value_info("y", tp, [1, 64])], inits
    )


def q4_fp32_onnx() -> onnx.ModelProto:
    return _onnx_model(
        [helper.make_node("MatMul", ["x", "m"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, Q4_K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, Q4_N])],
        [numpy_helper.from_array(Q4_W, "m")],
    )


def q4_packed() -> tuple[onnx.ModelProto, np.ndarray]:
    """MatMulNBits (com.microsoft) packed by hand: symmetric 4-bit per 32-block,
    default zero point 8, two values per byte (low nibble first). Returns the
    model and the dequantized weights it encodes (K, N)."""
    nb = Q4_K // Q4_BLOCK
    wt = Q4_W.T.reshape(Q4_N, nb, Q4_BLOCK)
    scale = (np.abs(wt).max(-1) / 7.0).astype(np.float32)
    q = np.clip(np.rint(wt / scale[..., None]), -8, 7).astype(np.int32) + 8
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # (N, blocks, 16)
    node = helper.make_node("MatMulNBits", ["x", "qb", "sc"], ["y"], domain="com.microsoft", K=Q4_K, N=Q4_N, bits=4, block_size=Q4_BLOCK)
    m = _onnx_model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, Q4_K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, Q4_N])],
        [numpy_helper.from_array(packed, "qb"), numpy_helper.from_array(scale.reshape(-1), "sc")],
        ms_domain=True,
    )
    deq = ((q - 8) * scale[..., None]).reshape(Q4_N, Q4_K).T.astype(np.float64)
    return m, deq


def fc_onnx() -> bytes:
    return _onnx_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(FC_W.T.copy(), "w"), numpy_helper.from_array(FC_B, "b")],
    ).SerializeToString()


def fc_tflite(*, dynamic: bool = False) -> bytes:
    b = TFLiteBuilder()
    x = b.input("x", (1, 32), shape_signature=(-1, 32) if dynamic else None)
    b.output(b.fully_connected(x, FC_W, FC_B), "y")
    return b.build()


def fc_tflite_int8(*, dynamic: bool = False) -> bytes:
    """int8 in, int8 out (quant params on both), weights quantized per channel."""
    b = TFLiteBuilder()
    x = b.input("x", (1, 32), "int8", shape_signature=(-1, 32) if dynamic else None, quant=IN_Q)
    b.output(b.fully_connected(x, FC_W, FC_B, out_quant=OUT_Q), "y")
    return b.build()


def tconv_tflite() -> bytes:
    b = TFLiteBuilder()
    x = b.input("x", (1, 8, 8, 3))
    y = b.conv2d(x, T_CONV_W, T_CONV_B, padding="SAME", activation="RELU")
    y = b.mean(y, axes=(1, 2))
    b.output(b.fully_connected(y, T_FC_W, T_FC_B), "y")
    return b.build()


# ---------------------------------------------------------------------------
# packages


def spec(name: str, dtype: str, shape: list, **kw: Any) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape, **kw}


def make_package(root: Path, inputs: list, outputs: list, variants: list[dict[str, Any]]):
    """variants: dicts with id, backend, precision, data (bytes) and optional manifest keys."""
    files, vs = {}, []
    for v in variants:
        v = dict(v)
        fn = f"{v['id']}.{'onnx' if v['backend'] == 'onnxruntime' else 'tflite'}"
        files[fn] = v.pop("data")
        vs.append({"file": fn, **v})
    manifest = {"name": "t", "version": "1", "task": "raw", "inputs": inputs, "outputs": outputs, "variants": vs}
    return write_package(root, manifest, files)


def load(pkg, tmp_path: Path, profile: Any = PROFILE, **opts: Any):
    opts.setdefault("cache_dir", tmp_path / "cache")
    return edge_sdk.load(pkg, profile, LoadOptions(**opts))


@pytest.fixture
def convmm_pkg(tmp_path: Path):
    return make_package(
        tmp_path / "pkg",
        [spec("x", "float32", [1, 3, 8, 8], layout="NCHW")],
        [spec("y", "float32", [1, 64])],
        [{"id": "fp32", "backend": "onnxruntime", "precision": "fp32", "data": convmm_onnx().SerializeToString()}],
    )


def x_convmm(seed: int = 7, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


# ---------------------------------------------------------------------------
# 1. ONNX Runtime quantization formats


class _Calib:
    """CalibrationDataReader for quantize_static: 16 seeded inputs like the test ones."""

    def __init__(self) -> None:
        rng = np.random.default_rng(99)
        self._it = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(16)])

    def get_next(self):
        return next(self._it, None)


def _static(fmt_name: str) -> Callable[[Path], bytes]:
    def build(d: Path) -> bytes:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        class Reader(_Calib, CalibrationDataReader):
            pass

        src, dst = d / "fp32.onnx", d / f"{fmt_name}.onnx"
        onnx.save(convmm_onnx(), src)
        fmt = getattr(QuantFormat, fmt_name)
        act = QuantType.QInt8 if fmt_name == "QDQ" else QuantType.QUInt8
        quantize_static(str(src), str(dst), Reader(), quant_format=fmt, activation_type=act, weight_type=QuantType.QInt8)
        return dst.read_bytes()

    return build


def _dynamic(d: Path) -> bytes:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = d / "fp32.onnx", d / "dyn.onnx"
    onnx.save(convmm_onnx(), src)
    # uint8 weights: ConvInteger with int8 weights exists only in newer ORT builds (1.23,
    # the last with Python 3.10 wheels as on JetPack 6, lacks it)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)
    return dst.read_bytes()


def _nbits_quantizer(d: Path) -> bytes:
    pytest.importorskip("onnx_ir", reason="onnxruntime.quantization.matmul_nbits_quantizer needs onnx_ir (not installed)")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(q4_fp32_onnx(), block_size=Q4_BLOCK, is_symmetric=True)
    q.process()
    return q.model.model.SerializeToString()


def _bnb4(d: Path) -> bytes:
    from onnxruntime.quantization.matmul_bnb4_quantizer import MatMulBnb4Quantizer

    q = MatMulBnb4Quantizer(q4_fp32_onnx(), MatMulBnb4Quantizer.NF4, Q4_BLOCK)
    q.process()
    return q.model.model.SerializeToString()


def _ops(data: bytes) -> set[tuple[str, str]]:
    m = onnx.load_from_string(data)
    return {(n.domain or "", n.op_type) for n in m.graph.node}


MS = "com.microsoft"
CONVMM_IO = ([spec("x", "float32", [1, 3, 8, 8])], [spec("y", "float32", [1, 64])])
Q4_IO = ([spec("x", "float32", [1, Q4_K])], [spec("y", "float32", [1, Q4_N])])

# id, precision, builder(tmpdir) -> bytes, fp32 builder, reference, (inputs, outputs) manifest specs,
# ops that must be in the graph, max relative error (max|y-ref| / max|ref|), min cosine
QUANT_CASES = [
    # int8 QDQ: QuantizeLinear/DequantizeLinear pairs around fp32 ops; ORT fuses them to int8 kernels.
    pytest.param("int8", _static("QDQ"), convmm_onnx, ref_convmm, CONVMM_IO,
                 {("", "QuantizeLinear"), ("", "DequantizeLinear")}, 0.06, 0.998, id="int8-qdq"),
    # int8 QOperator (static): dedicated QLinear* operators, uint8 activations.
    pytest.param("int8", _static("QOperator"), convmm_onnx, ref_convmm, CONVMM_IO,
                 {("", "QLinearConv"), ("", "QLinearMatMul")}, 0.06, 0.998, id="int8-qoperator-static"),
    # int8 QOperator (dynamic): activations quantized at run time.
    pytest.param("int8", _dynamic, convmm_onnx, ref_convmm, CONVMM_IO,
                 {("", "ConvInteger"), ("", "MatMulInteger"), ("", "DynamicQuantizeLinear")}, 0.06, 0.998, id="int8-dynamic"),
    # int4 MatMulNBits written by hand (block 32, symmetric): the format ORT's 4-bit quantizer emits.
    pytest.param("int4", lambda d: q4_packed()[0].SerializeToString(), q4_fp32_onnx, ref_q4, Q4_IO,
                 {(MS, "MatMulNBits")}, 0.2, 0.99, id="int4-matmulnbits-packed"),
    # int4 MatMulNBits from ORT's own quantizer (skipped where onnx_ir is missing).
    pytest.param("int4", _nbits_quantizer, q4_fp32_onnx, ref_q4, Q4_IO,
                 {(MS, "MatMulNBits")}, 0.2, 0.99, id="int4-matmulnbits-quantizer"),
    # int4 NF4 blockwise (MatMulBnb4), the other 4-bit format ORT's CPU EP runs.
    pytest.param("int4", _bnb4, q4_fp32_onnx, ref_q4, Q4_IO,
                 {(MS, "MatMulBnb4")}, 0.2, 0.99, id="int4-bnb4"),
    # fp16: float16 initializers and float16 I/O; ORT's CPU EP inserts casts where it has no fp16 kernel.
    pytest.param("fp16", lambda d: convmm_onnx(np.float16).SerializeToString(), convmm_onnx, ref_convmm,
                 ([spec("x", "float16", [1, 3, 8, 8])], [spec("y", "float16", [1, 64])]),
                 {("", "Conv"), ("", "MatMul")}, 0.005, 0.99999, id="fp16"),
]


@pytest.mark.parametrize("precision, build, build_fp32, ref, io, want_ops, max_rel, min_cos", QUANT_CASES)
def test_ort_quantized_formats_match_fp32(tmp_path, precision, build, build_fp32, ref, io, want_ops, max_rel, min_cos):
    data = build(tmp_path)
    assert want_ops <= _ops(data), f"graph lacks {want_ops - _ops(data)}"
    if precision != "fp16":
        # really quantized: the fp32 MatMul/Conv are gone (QDQ keeps float ops between Q/DQ pairs)
        kept = _ops(data) & {("", "MatMul"), ("", "Conv")}
        assert not kept or ("", "DequantizeLinear") in want_ops, kept
    ins, outs = io
    qid = f"{precision}-variant"
    pkg = make_package(
        tmp_path / "pkg",
        [spec("x", "float32", ins[0]["shape"])],
        [spec("y", "float32", outs[0]["shape"])],
        [
            {"id": "fp32", "backend": "onnxruntime", "precision": "fp32", "reference": True, "data": build_fp32().SerializeToString()},
            {"id": qid, "backend": "onnxruntime", "precision": precision, "data": data, "inputs": ins, "outputs": outs},
        ],
    )
    dtype = np.dtype(ins[0]["dtype"])
    xs = [np.random.default_rng(s).standard_normal(ins[0]["shape"]).astype(np.float32) for s in range(4)]
    with load(pkg, tmp_path, variant="fp32") as m32, load(pkg, tmp_path, variant=qid) as mq:
        assert mq.describe()["precision"] == precision and mq.variant.id == qid
        assert mq.session.info.providers_used == (CPU,)
        for x in xs:
            want = ref(x)
            y32 = m32.predict(x).outputs["y"]
            np.testing.assert_allclose(y32, want, rtol=1e-4, atol=1e-4)  # the fp32 variant is the reference
            y = mq.predict(x.astype(dtype)).outputs["y"]
            assert y.dtype == dtype and y.shape == want.shape
            assert rel_err(y, want) <= max_rel, f"{precision}: rel err {rel_err(y, want):.4f} > {max_rel}"
            assert cosine(y, want) >= min_cos
            assert not np.array_equal(y.astype(np.float32), y32), "quantized variant gave the fp32 result bit for bit"


def test_int4_matmulnbits_runs_the_packed_weights_exactly(tmp_path):
    """The hand-packed int4 model must compute x @ dequant(W) (to float32 rounding):
    proves the 4-bit weights, not some float fallback, are what runs."""
    model, deq = q4_packed()
    pkg = make_package(tmp_path / "pkg", *Q4_IO, [{"id": "q4", "backend": "onnxruntime", "precision": "int4", "data": model.SerializeToString()}])
    x = np.random.default_rng(3).standard_normal((1, Q4_K)).astype(np.float32)
    with load(pkg, tmp_path, variant="q4") as m:
        y = m.predict(x).outputs["y"]
    np.testing.assert_allclose(y, x.astype(np.float64) @ deq, rtol=1e-4, atol=1e-4)
    assert rel_err(y, ref_q4(x)) > 1e-3  # and it is not the fp32 product


def test_generic_profile_prefers_int8_over_fp32(tmp_path):
    """Untimed, generic-x86_64 (precisions int8, fp32) picks the int8 ONNX variant by rank; timed (the
    default: no benchmark vouches for int8 on this CPU), it keeps what the measurement says."""
    pkg = make_package(
        tmp_path / "pkg",
        *CONVMM_IO,
        [
            {"id": "fp32", "backend": "onnxruntime", "precision": "fp32", "data": convmm_onnx().SerializeToString()},
            {"id": "int8", "backend": "onnxruntime", "precision": "int8", "data": _dynamic(tmp_path)},
        ],
    )
    with load(pkg, tmp_path, measure_backends=False) as m:
        assert m.variant.id == "int8" and not m.selection.measured
        assert rel_err(m.predict(x_convmm()).outputs["y"], ref_convmm(x_convmm())) <= 0.06
    with load(pkg, tmp_path) as m:
        timed = {c.variant_id: c.measured_ms for c in m.selection.candidates}
        assert m.selection.measured and None not in timed.values()
        assert m.variant.id == ("int8" if timed["int8"] * 1.03 < timed["fp32"] else "fp32"), m.selection.explain()


# ---------------------------------------------------------------------------
# 2. provider fallback

# profile, LoadOptions providers override (None = the profile's), providers that must be reported missing
FALLBACK_CASES = [
    # explicit CUDA then CPU on the generic profile
    pytest.param(PROFILE, ("CUDAExecutionProvider", CPU), ("CUDAExecutionProvider",), id="cuda-override"),
    # TensorRT and CUDA without CPU: CPU is appended anyway
    pytest.param(PROFILE, ("TensorrtExecutionProvider", "CUDAExecutionProvider"), ("TensorrtExecutionProvider", "CUDAExecutionProvider"), id="trt-cuda-no-cpu"),
    # the Jetson profile's own list (TensorRT, CUDA, CPU) on a CPU-only build
    pytest.param("jetson-orin-nano", None, ("TensorrtExecutionProvider", "CUDAExecutionProvider"), id="jetson-profile"),
]


@pytest.mark.parametrize("profile, providers, missing", FALLBACK_CASES)
def test_missing_providers_fall_back_to_cpu(tmp_path, convmm_pkg, profile, providers, missing):
    have = set(ort.get_available_providers())
    if have & set(missing):
        pytest.skip(f"{sorted(have & set(missing))} available here: nothing falls back")
    opts = {} if providers is None else {"providers": providers}
    x = x_convmm()
    with load(convmm_pkg, tmp_path, profile, **opts) as m:
        d = m.describe()
        assert d["providers"] == [CPU]
        assert m.session.info.providers_used == (CPU,)
        want_requested = providers if providers is not None else load_profile(profile).runtime.onnxruntime_providers
        assert m.session.info.providers_requested == tuple(want_requested)
        notes = " | ".join(m.session.info.notes)
        for p in missing:
            assert p in notes, f"{p} not mentioned in notes: {notes!r}"
        assert d["notes"] == list(m.session.info.notes)
        # nothing compiled: the optimised-model cache still applies, no TensorRT cache is made
        assert m.session.info.optimized_cache.startswith("written")
        assert not (tmp_path / "cache" / "tensorrt").exists()
        np.testing.assert_allclose(m.predict(x).outputs["y"], ref_convmm(x), rtol=1e-4, atol=1e-4)


def test_cpu_only_request_has_no_notes(tmp_path, convmm_pkg):
    with load(convmm_pkg, tmp_path, providers=(CPU,)) as m:
        assert m.session.info.notes == () and m.describe()["providers"] == [CPU]


# ---------------------------------------------------------------------------
# 3. optimised-model cache


def _cache_files(cache: Path) -> tuple[Path, Path]:
    onnx_files = sorted((cache / "ort-optimized").glob("*.onnx"))
    assert len(onnx_files) == 1, onnx_files
    return onnx_files[0], onnx_files[0].with_suffix(".sha256")


def test_optimized_cache_written_then_hit(tmp_path, convmm_pkg):
    cache = tmp_path / "cache"
    x = x_convmm()
    with load(convmm_pkg, tmp_path) as m1:
        st1 = m1.session.info.optimized_cache
        y1 = m1.predict(x).outputs["y"]
        so1 = m1.session._sess.get_session_options()
    assert st1.startswith("written"), st1
    f, side = _cache_files(cache)
    assert str(f) in st1
    assert side.read_text().strip() == hashlib.sha256(f.read_bytes()).hexdigest()
    assert not list((cache / "ort-optimized").glob(".*tmp*")), "temporary file left behind"
    assert so1.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with load(convmm_pkg, tmp_path) as m2:
        st2 = m2.session.info.optimized_cache
        y2 = m2.predict(x).outputs["y"]
        # the cached graph is already optimised: it is loaded with optimisation off
        assert m2.session._sess.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert st2.startswith("hit") and str(f) in st2, st2
    assert np.array_equal(y1, y2)
    np.testing.assert_allclose(y2, ref_convmm(x), rtol=1e-4, atol=1e-4)


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    for i in range(len(b) // 2, len(b) // 2 + 16):
        b[i] ^= 0xFF
    p.write_bytes(bytes(b))


def _unloadable_with_matching_digest(p: Path) -> None:
    data = p.read_bytes()[:64]
    p.write_bytes(data)
    p.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest())


# how the cache entry is damaged before the next load
CORRUPTIONS = [
    pytest.param(_flip, id="flip-bytes"),  # 16 bytes inverted mid-file
    pytest.param(lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), id="truncated"),
    pytest.param(lambda p: p.with_suffix(".sha256").write_text("0" * 64), id="wrong-digest"),
    pytest.param(lambda p: p.with_suffix(".sha256").unlink(), id="digest-missing"),
    pytest.param(lambda p: p.unlink(), id="model-missing"),
    pytest.param(lambda p: p.write_bytes(b"not an onnx model"), id="garbage"),
    # digest intact but the bytes are not a model ORT can load (a torn write that was
    # digested after the tear, or a graph ORT wrote but cannot read back): still only a cache
    pytest.param(_unloadable_with_matching_digest, id="unloadable-matching-digest"),
]


@pytest.mark.parametrize("damage", CORRUPTIONS)
def test_corrupted_cache_is_rebuilt(tmp_path, convmm_pkg, damage):
    x = x_convmm(11)
    with load(convmm_pkg, tmp_path) as m:
        assert m.session.info.optimized_cache.startswith("written")
        y0 = m.predict(x).outputs["y"]
    f, _ = _cache_files(tmp_path / "cache")
    damage(f)
    with load(convmm_pkg, tmp_path) as m:
        assert m.session.info.optimized_cache.startswith("written"), m.session.info.optimized_cache
        assert np.array_equal(m.predict(x).outputs["y"], y0)
    f2, side2 = _cache_files(tmp_path / "cache")
    assert f2 == f and side2.read_text().strip() == hashlib.sha256(f2.read_bytes()).hexdigest()
    with load(convmm_pkg, tmp_path) as m:  # repaired: a hit again
        assert m.session.info.optimized_cache.startswith("hit")
        np.testing.assert_allclose(m.predict(x).outputs["y"], ref_convmm(x), rtol=1e-4, atol=1e-4)


def test_no_cache_when_optimisation_disabled(tmp_path, convmm_pkg):
    x = x_convmm()
    for _ in range(2):
        with load(convmm_pkg, tmp_path, graph_optimization="disable") as m:
            assert m.session.info.optimized_cache == "off"
            assert m.session._sess.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            np.testing.assert_allclose(m.predict(x).outputs["y"], ref_convmm(x), rtol=1e-4, atol=1e-4)
    assert not list((tmp_path / "cache").glob("ort-optimized/*.onnx"))


def test_cache_key_separates_optimisation_levels(tmp_path, convmm_pkg):
    """A graph optimised at 'basic' is not served to an 'all' load."""
    with load(convmm_pkg, tmp_path, graph_optimization="basic") as m:
        assert m.session.info.optimized_cache.startswith("written")
    with load(convmm_pkg, tmp_path, graph_optimization="all") as m:
        assert m.session.info.optimized_cache.startswith("written")
    assert len(list((tmp_path / "cache" / "ort-optimized").glob("*.onnx"))) == 2


# ---------------------------------------------------------------------------
# 4. session options really applied

_L = ort.GraphOptimizationLevel
# LoadOptions overrides, threads, spin config value, graph optimisation level ORT got
# (None: the generic-x86_64 profile's own value)
OPTION_CASES = [
    pytest.param({}, None, None, _L.ORT_ENABLE_ALL, id="profile-defaults"),  # threads, spinning and level from the profile
    pytest.param({"threads": 3, "allow_spinning": True}, 3, "1", _L.ORT_ENABLE_ALL, id="threads3-spin"),
    pytest.param({"threads": 1, "allow_spinning": False, "graph_optimization": "basic"}, 1, "0", _L.ORT_ENABLE_BASIC, id="threads1-basic"),
    pytest.param({"threads": 2, "graph_optimization": "extended"}, 2, None, _L.ORT_ENABLE_EXTENDED, id="threads2-extended"),
    pytest.param({"graph_optimization": "disable", "allow_spinning": True}, None, "1", _L.ORT_DISABLE_ALL, id="disable-spin"),
]


@pytest.mark.parametrize("overrides, threads, spin, level", OPTION_CASES)
def test_session_options_reach_onnxruntime(tmp_path, convmm_pkg, overrides, threads, spin, level):
    rt = load_profile(PROFILE).runtime
    assert rt.graph_optimization == "all"  # the rows' default level assumes it
    threads = min(rt.threads, os.cpu_count() or rt.threads) if threads is None else threads  # capped at this machine's CPUs
    spin = ("1" if rt.allow_spinning else "0") if spin is None else spin
    with load(convmm_pkg, tmp_path, **overrides) as m:
        so = m.session._sess.get_session_options()
        assert so.intra_op_num_threads == threads
        assert so.inter_op_num_threads == 1
        assert so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == spin
        assert so.get_session_config_entry("session.inter_op.allow_spinning") == spin
        assert so.graph_optimization_level == level
        assert m.session.info.threads == threads and m.describe()["threads"] == threads
        x = x_convmm()
        np.testing.assert_allclose(m.predict(x).outputs["y"], ref_convmm(x), rtol=1e-4, atol=1e-4)


def test_profile_runtime_settings_reach_onnxruntime(tmp_path, convmm_pkg):
    """Values unlike any default, set only in the profile, arrive in ORT's SessionOptions."""
    base = load_profile(PROFILE)
    rt = dataclasses.replace(base.runtime, threads=5, allow_spinning=True, graph_optimization="extended")
    with load(convmm_pkg, tmp_path, dataclasses.replace(base, runtime=rt)) as m:
        so = m.session._sess.get_session_options()
        want = min(5, os.cpu_count() or 5)  # the profile's count, capped at this machine's CPUs
        assert so.intra_op_num_threads == want and m.session.info.threads == want
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert so.graph_optimization_level == _L.ORT_ENABLE_EXTENDED


# ---------------------------------------------------------------------------
# 5. LiteRT


def test_litert_float_nhwc_model(tmp_path):
    pkg = make_package(
        tmp_path / "pkg",
        [spec("x", "float32", [1, 8, 8, 3], layout="NHWC")],
        [spec("y", "float32", [1, 10])],
        [{"id": "fp32-tflite", "backend": "litert", "precision": "fp32", "data": tconv_tflite()}],
    )
    with load(pkg, tmp_path, threads=2) as m:
        info = m.session.info
        assert info.backend == "litert" and info.runtime in ("ai-edge-litert", "tflite-runtime")
        assert info.threads == 2 and info.delegates_used == ("cpu (xnnpack)",) and info.notes == ()
        assert m.session.inputs[0].shape == (1, 8, 8, 3) and m.session.inputs[0].quant is None
        for s in range(3):
            x = np.random.default_rng(s).standard_normal((1, 8, 8, 3)).astype(np.float32)
            y = m.predict(x).outputs["y"]
            assert y.dtype == np.float32
            np.testing.assert_allclose(y, ref_tconv(x), rtol=1e-4, atol=1e-4)


def _int8_pkg(root: Path, io_dtype: str, *, dynamic: bool = False):
    shape_in = ["batch", 32] if dynamic else [1, 32]
    shape_out = ["batch", 16] if dynamic else [1, 16]
    dims = {"dims": {"batch": [1, 4]}} if dynamic else {}
    return make_package(
        root,
        [spec("x", io_dtype, shape_in, **dims)],
        [spec("y", io_dtype, shape_out)],
        [{"id": "int8-tflite", "backend": "litert", "precision": "int8", "data": fc_tflite_int8(dynamic=dynamic)}],
    )


def test_litert_int8_io_is_converted_for_the_caller(tmp_path):
    pkg = _int8_pkg(tmp_path / "pkg", "float32")
    with load(pkg, tmp_path) as m:
        (ti,), (to,) = m.session.inputs, m.session.outputs
        assert (ti.dtype, ti.raw_dtype, to.dtype, to.raw_dtype) == ("float32", "int8", "float32", "int8")
        assert ti.quant == (pytest.approx(IN_Q[0], rel=1e-6), IN_Q[1])
        assert to.quant == (pytest.approx(OUT_Q[0], rel=1e-6), OUT_Q[1])
        rng = np.random.default_rng(5)
        for _ in range(5):
            x = rng.uniform(-1, 1, (1, 32)).astype(np.float32)
            assert np.abs(ref_fc(x)).max() < 127 * OUT_Q[0]  # precondition: no saturation
            y = m.predict(x).outputs["y"]
            assert y.dtype == np.float32
            # within 2 output scales of the float model (input + weight + output rounding)
            assert np.abs(y - ref_fc(x)).max() <= 2 * OUT_Q[0], np.abs(y - ref_fc(x)).max() / OUT_Q[0]
            # values lie on the output grid: they came from int8 through (q - zp) * scale
            q = y / np.float32(to.quant[0]) + to.quant[1]
            np.testing.assert_allclose(q, np.rint(q), atol=1e-3)


def test_litert_raw_io_passes_int8_through(tmp_path):
    rng = np.random.default_rng(6)
    xs = [rng.uniform(-1, 1, (1, 32)).astype(np.float32) for _ in range(4)]
    with load(_int8_pkg(tmp_path / "f", "float32"), tmp_path) as mf:
        yf = [mf.predict(x).outputs["y"] for x in xs]
    with load(_int8_pkg(tmp_path / "r", "int8"), tmp_path, raw_io=True) as mr:
        ti, to = mr.session.inputs[0], mr.session.outputs[0]
        assert (ti.dtype, to.dtype) == ("int8", "int8") and ti.quant is not None
        s_in, zp_in = ti.quant
        s_out, zp_out = to.quant
        for x, y_float in zip(xs, yf):
            xq = np.clip(np.rint(x / np.float32(s_in)) + zp_in, -128, 127).astype(np.int8)
            before = xq.copy()
            yq = mr.predict(xq).outputs["y"]
            assert np.array_equal(xq, before)  # caller's tensor untouched
            assert yq.dtype == np.int8
            # the raw int8 is exactly what the converting session dequantized
            np.testing.assert_array_equal((yq.astype(np.float32) - np.float32(zp_out)) * np.float32(s_out), y_float)
            # and it was not re-quantized or scaled on the way: re-deriving q from the float result gives yq
            assert np.array_equal(np.rint(y_float / np.float32(s_out) + zp_out).astype(np.int8), yq)


# manifest I/O dtype, raw_io: the manifest must declare what callers will pass
RAW_MISMATCH = [
    pytest.param("float32", True, id="raw-io-but-manifest-float32"),  # raw_io gives int8 I/O
    pytest.param("int8", False, id="converted-but-manifest-int8"),  # conversion gives float32 I/O
]


@pytest.mark.parametrize("manifest_dtype, raw_io", RAW_MISMATCH)
def test_litert_manifest_must_match_io_mode(tmp_path, manifest_dtype, raw_io):
    with pytest.raises(SignatureMismatchError, match="dtype"):
        load(_int8_pkg(tmp_path / "pkg", manifest_dtype), tmp_path, raw_io=raw_io)


# which model, reference, tolerance
DYNAMIC_CASES = [
    pytest.param(lambda: fc_tflite(dynamic=True), 1e-4, id="float"),  # float FC, exact to float32 rounding
    pytest.param(lambda: fc_tflite_int8(dynamic=True), 2 * OUT_Q[0], id="int8"),  # int8 FC, 2 output scales
]


@pytest.mark.parametrize("build, atol", DYNAMIC_CASES)
def test_litert_dynamic_batch_resizes(tmp_path, build, atol):
    pkg = make_package(
        tmp_path / "pkg",
        [spec("x", "float32", ["batch", 32], dims={"batch": [1, 4]})],
        [spec("y", "float32", ["batch", 16])],
        [{"id": "tfl", "backend": "litert", "precision": "fp32", "data": build()}],
    )
    rng = np.random.default_rng(8)
    with load(pkg, tmp_path) as m:
        assert m.session.inputs[0].shape == (None, 32)
        for b in (1, 3, 1, 4, 2):
            x = rng.uniform(-1, 1, (b, 32)).astype(np.float32)
            y = m.predict(x).outputs["y"]
            assert y.shape == (b, 16)
            np.testing.assert_allclose(y, ref_fc(x), atol=atol, rtol=0)


# ai_edge_litert's Delegate.__del__ touches an attribute a failed load_delegate never set
# (an unraisable AttributeError inside LiteRT itself, not edge_sdk).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_litert_missing_delegate_falls_back_to_cpu(tmp_path):
    pkg = make_package(
        tmp_path / "pkg",
        [spec("x", "float32", [1, 32])],
        [spec("y", "float32", [1, 16])],
        [{"id": "tfl", "backend": "litert", "precision": "fp32", "data": fc_tflite()}],
    )
    with load(pkg, tmp_path, delegates=("libdoes_not_exist.so",)) as m:
        info = m.session.info
        assert info.delegates_used == ("cpu (xnnpack)",)
        assert any("libdoes_not_exist.so" in n for n in info.notes), info.notes
        assert m.describe()["delegates"] == ["cpu (xnnpack)"]
        x = np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)
        np.testing.assert_allclose(m.predict(x).outputs["y"], ref_fc(x), rtol=1e-4, atol=1e-4)


# backend, package variant
CLOSE_CASES = [
    pytest.param("onnxruntime", lambda: fc_onnx(), id="onnxruntime"),
    pytest.param("litert", lambda: fc_tflite(), id="litert"),
]


@pytest.mark.parametrize("backend, build", CLOSE_CASES)
def test_close_is_idempotent_and_run_after_close_raises(tmp_path, backend, build):
    pkg = make_package(
        tmp_path / "pkg",
        [spec("x", "float32", [1, 32])],
        [spec("y", "float32", [1, 16])],
        [{"id": "v", "backend": backend, "precision": "fp32", "data": build()}],
    )
    x = np.zeros((1, 32), np.float32)
    m = load(pkg, tmp_path)
    assert m.session.info.backend == backend
    m.predict(x)
    m.close()
    m.close()
    m.session.close()
    assert m.closed and m.session.closed
    with pytest.raises(SessionClosedError):
        m.predict(x)
    with pytest.raises(SessionClosedError):
        m.session.run({"x": x})


# ---------------------------------------------------------------------------
# 6. measured backend choice


def _twin_pkg(root: Path):
    return make_package(
        root,
        [spec("x", "float32", [1, 32])],
        [spec("y", "float32", [1, 16])],
        [
            {"id": "fp32-onnx", "backend": "onnxruntime", "precision": "fp32", "data": fc_onnx()},
            {"id": "fp32-tflite", "backend": "litert", "precision": "fp32", "data": fc_tflite()},
        ],
    )


MEASURE = {"measure_runs": 5, "measure_budget_s": 0.2}


def test_backend_choice_is_measured_and_cached(tmp_path):
    pkg = _twin_pkg(tmp_path / "pkg")
    store = tmp_path / "cache" / "selection.json"
    x = np.random.default_rng(2).standard_normal((1, 32)).astype(np.float32)
    with load(pkg, tmp_path, measure_backends=True, **MEASURE) as m1:
        sel = m1.selection
        assert sel.measured and not sel.forced
        ms = {c.variant_id: c.measured_ms for c in sel.candidates}
        assert set(ms) == {"fp32-onnx", "fp32-tflite"} and all(v is not None and v > 0 for v in ms.values()), ms
        assert sel.variant_id == min(ms, key=ms.get)
        assert m1.session.info.backend == sel.chosen.backend
        assert m1.describe()["selection"]["measured"] is True
        np.testing.assert_allclose(m1.predict(x).outputs["y"], ref_fc(x), rtol=1e-4, atol=1e-4)
        first = sel.variant_id
    known = json.loads(store.read_text())
    assert len(known) == 1 and next(iter(known.values())) == pytest.approx(ms)
    with load(pkg, tmp_path, measure_backends=True, **MEASURE) as m2:
        sel2 = m2.selection
        assert sel2.measured and sel2.variant_id == first
        for c in sel2.candidates:
            assert c.measured_ms == pytest.approx(ms[c.variant_id])
            assert any("cached measurement" in r for r in c.reasons), c.reasons
        np.testing.assert_allclose(m2.predict(x).outputs["y"], ref_fc(x), rtol=1e-4, atol=1e-4)
    assert json.loads(store.read_text()) == known  # reused, not re-measured


# backend preference order in the profile -> variant chosen without measuring
ORDER_CASES = [
    pytest.param(("onnxruntime", "litert"), "fp32-onnx", id="ort-first"),  # generic-x86_64's own order
    pytest.param(("litert", "onnxruntime"), "fp32-tflite", id="litert-first"),
]


@pytest.mark.parametrize("backends, chosen", ORDER_CASES)
def test_without_measuring_the_profile_order_decides(tmp_path, backends, chosen):
    base = load_profile(PROFILE)
    prof = dataclasses.replace(base, runtime=dataclasses.replace(base.runtime, backends=backends))
    with load(_twin_pkg(tmp_path / "pkg"), tmp_path, prof, measure_backends=False) as m:
        assert not m.selection.measured and m.variant.id == chosen
        assert all(c.measured_ms is None for c in m.selection.candidates)
    assert not (tmp_path / "cache" / "selection.json").exists()


def _corrupt_entry_values(store: Path) -> None:
    known = json.loads(store.read_text())
    store.write_text(json.dumps({k: {vid: "fast" for vid in v} for k, v in known.items()}))


# how selection.json is damaged; a damaged cache must cost a re-measurement, never the load
SELECTION_CORRUPTIONS = [
    pytest.param(lambda p: p.write_text("{not json"), id="not-json"),
    pytest.param(lambda p: p.write_text(json.dumps({"x": 1})), id="unrelated-key"),
    pytest.param(lambda p: p.write_text("[]"), id="top-level-list"),
    pytest.param(_corrupt_entry_values, id="non-numeric-timings"),
]


@pytest.mark.parametrize("damage", SELECTION_CORRUPTIONS)
def test_damaged_selection_cache_is_remeasured(tmp_path, damage):
    pkg = _twin_pkg(tmp_path / "pkg")
    with load(pkg, tmp_path, **MEASURE):
        pass
    damage(tmp_path / "cache" / "selection.json")
    with load(pkg, tmp_path, **MEASURE) as m:
        assert m.selection.measured
        for c in m.selection.candidates:
            assert isinstance(c.measured_ms, float) and c.measured_ms > 0
            assert not any("cached measurement" in r for r in c.reasons)


# ---------------------------------------------------------------------------
# 7. the seam: only edge_sdk/backends imports a runtime

RUNTIMES = ("onnxruntime", "ai_edge_litert", "tflite_runtime")
_PROBE = "print([m for m in ('onnxruntime','ai_edge_litert','tflite_runtime') if m in sys.modules])"


def _python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_importing_the_sdk_imports_no_runtime():
    out = _python(
        "import edge_sdk, edge_sdk.model, edge_sdk.package, edge_sdk.selection, edge_sdk.validation, sys; " + _PROBE
    )
    assert out == "[]"


def test_runtime_probe_detects_a_backend_import():
    """Control for the test above: using a backend does import its runtime."""
    out = _python("import sys, edge_sdk.backends as b; b.backend_status('onnxruntime'); " + _PROBE)
    assert out == "['onnxruntime']"


_IMPORT_RE = re.compile(
    r"^\s*(?:import|from)\s+(?:%s)\b|import_module\(\s*['\"](?:%s)|__import__\(\s*['\"](?:%s)"
    % (("|".join(RUNTIMES),) * 3),
    re.MULTILINE,
)


def test_no_runtime_import_outside_backends():
    pkg = ROOT / "edge_sdk"
    offenders, backend_hits = [], []
    for p in sorted(pkg.rglob("*.py")):
        hits = _IMPORT_RE.findall(p.read_text(encoding="utf-8"))
        if pkg / "backends" in p.parents:
            backend_hits += hits
        elif hits:
            offenders.append((p.relative_to(ROOT).as_posix(), hits))
    assert offenders == []
    assert backend_hits, "the pattern should match the backends' own imports"


# ---------------------------------------------------------------------------
# 8. thread safety


def _ort_threads_case(tmp_path: Path):
    pkg = make_package(
        tmp_path / "pkg",
        *CONVMM_IO,
        [{"id": "fp32", "backend": "onnxruntime", "precision": "fp32", "data": convmm_onnx().SerializeToString()}],
    )
    xs = [x_convmm(100 + i) for i in range(8)]
    return load(pkg, tmp_path, threads=2), xs


def _litert_threads_case(tmp_path: Path):
    pkg = make_package(
        tmp_path / "pkg",
        [spec("x", "float32", ["batch", 32], dims={"batch": [1, 4]})],
        [spec("y", "float32", ["batch", 16])],
        [{"id": "int8", "backend": "litert", "precision": "int8", "data": fc_tflite_int8(dynamic=True)}],
    )
    rng = np.random.default_rng(9)
    # batch sizes differ between calls so threads also race on resize_tensor_input
    xs = [rng.uniform(-1, 1, (1 + i % 4, 32)).astype(np.float32) for i in range(8)]
    return load(pkg, tmp_path, threads=2), xs


@pytest.mark.parametrize("make", [pytest.param(_ort_threads_case, id="onnxruntime"), pytest.param(_litert_threads_case, id="litert-dynamic-int8")])
def test_concurrent_predict_matches_single_threaded(tmp_path, make):
    model, xs = make(tmp_path)
    with model:
        expected = [model.predict(x).outputs["y"].copy() for x in xs]
        results: dict[tuple[int, int], np.ndarray] = {}
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def worker(t: int) -> None:
            try:
                barrier.wait()
                for i in range(50):
                    k = (t * 3 + i) % len(xs)
                    results[(t, i)] = model.predict(xs[k]).outputs["y"]
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        assert len(results) == 200
        # checked after all threads finished: no result was overwritten by a later call
        for (t, i), y in results.items():
            assert np.array_equal(y, expected[(t * 3 + i) % len(xs)]), (t, i)


def test_a_cpu_session_runs_through_the_binding_with_the_same_results_and_errors() -> None:
    """A CPU-only ORT session calls the compiled binding's run directly (no per-call Python checks
    in InferenceSession.run): the outputs equal the public API's, a feed of the wrong type or a
    missing input is still a SessionError from the binding, and a closed session refuses to run."""
    import onnxruntime as ort

    from edge_sdk.backends.base import ModelSource, SessionOptions
    from edge_sdk.backends.ort import open_session
    from edge_sdk.errors import SessionError

    data = fc_onnx()
    sess = open_session(ModelSource(data, Path("fc.onnx"), hashlib.sha256(data).hexdigest()), SessionOptions(threads=1))
    assert sess._crun is not None  # type: ignore[attr-defined]
    name = sess.inputs[0].name
    x = np.random.default_rng(0).normal(0, 1, [d or 1 for d in sess.inputs[0].shape]).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {name: x})
    got = sess.run({name: x})
    assert list(got) == [o.name for o in sess.outputs] and all(np.array_equal(a, b) for a, b in zip(got.values(), ref))
    with pytest.raises(SessionError, match="onnxruntime run failed"):
        sess.run({name: x.astype(np.float64)})
    with pytest.raises(SessionError, match="onnxruntime run failed"):
        sess.run({})
    sess.close()
    with pytest.raises(SessionClosedError):
        sess.run({name: x})


def test_a_deferred_model_source_is_read_only_when_onnx_runtime_needs_the_bytes(tmp_path: Path) -> None:
    """ModelSource(read=...) defers reading the model: ONNX Runtime reads it to build (and cache) the
    optimised model, and not at all when it loads that cached model; a source needs data or read."""
    from edge_sdk.backends.base import ModelSource, SessionOptions
    from edge_sdk.backends.ort import open_session

    data = fc_onnx()
    reads: list[int] = []

    def read() -> bytes:
        reads.append(1)
        return data

    sha = hashlib.sha256(data).hexdigest()
    opts = SessionOptions(threads=1, cache_dir=tmp_path / "cache")
    x = {"x": np.ones((1, 32), np.float32)}
    first = ModelSource(None, tmp_path / "fc.onnx", sha, read=read)
    with open_session(first, opts) as s1:
        assert s1.info.optimized_cache.startswith("written") and first.bytes_read and len(reads) == 1
        y1 = s1.run(x)["y"]
    second = ModelSource(None, tmp_path / "fc.onnx", sha, read=read)
    with open_session(second, opts) as s2:
        assert s2.info.optimized_cache.startswith("hit") and not second.bytes_read and len(reads) == 1
        assert np.array_equal(s2.run(x)["y"], y1)
    with pytest.raises(TypeError, match="either data or read"):
        ModelSource(data, tmp_path / "fc.onnx", sha, read=read)
