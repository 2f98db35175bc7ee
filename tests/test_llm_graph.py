"""converters/llm/graph.py and reference.py: the ONNX decoder on ONNX Runtime's contrib ops against
the independent numpy reference, on tiny random Llama/Qwen2 models (real ORT sessions)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from converters.llm.graph import (
    OPSET,
    DecodeSession,
    GraphInfo,
    VariantPlan,
    build_decoder_graph,
    dequantized_weights,
    empty_kv,
    quantize_decoder,
    session_feeds,
)
from converters.llm.quant import pack_matmulnbits
from converters.llm.reference import ReferenceDecoder, rope_inv_freq
from converters.llm.spec import DecoderConfig, DecoderSource, LLMConvertError, UnsupportedModelError, tensor_names

PROMPT = [1, 5, 7, 100, 299, 3, 42]
STEPS = [9, 250, 11, 0, 77]
MAX_LEN = 32
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def make_source(
    arch: str = "llama", tie: bool = True, bias: bool = False, rope_scaling: dict[str, Any] | None = None, seed: int = 0, n_layers: int = 2
) -> DecoderSource:
    cfg = DecoderConfig(
        architecture=arch,
        n_layers=n_layers,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        ffn_dim=128,
        vocab_size=300,
        context_length=128,
        rms_eps=1e-6 if arch == "qwen2" else 1e-5,
        rope_theta=10000.0,
        rope_scaling=rope_scaling,
        tie_embeddings=tie,
        attention_bias=bias,
    )
    rng = np.random.default_rng(seed)
    qd, kvd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "q": (qd, 64),
        "k": (kvd, 64),
        "v": (kvd, 64),
        "o": (64, qd),
        "gate": (128, 64),
        "up": (128, 64),
        "down": (64, 128),
        "q_bias": (qd,),
        "k_bias": (kvd,),
        "v_bias": (kvd,),
        "embed": (300, 64),
        "lm_head": (300, 64),
    }
    w: dict[str, np.ndarray] = {}
    for name in tensor_names(cfg):
        last = name.rsplit(".", 1)[-1]
        if last.endswith("norm"):
            w[name] = (1.0 + 0.1 * rng.standard_normal(64)).astype(np.float32)
        elif last.endswith("_bias"):
            w[name] = (0.2 * rng.standard_normal(shapes[last])).astype(np.float32)
        else:
            shp = shapes[last]
            w[name] = (rng.standard_normal(shp) / math.sqrt(shp[1]) * (2.0 if last in ("embed", "lm_head") else 1.0)).astype(np.float32)
    return DecoderSource(config=cfg, load=w.__getitem__, tokenizer_json="")


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_steps(ds: DecodeSession, prompt: list[int], steps: list[int]) -> list[np.ndarray]:
    ds.reset()
    out = [ds(prompt)[-1]]
    for t in steps:
        out.append(ds([t])[-1])
    return out


def ref_steps(ref: ReferenceDecoder, prompt: list[int], steps: list[int]) -> list[np.ndarray]:
    logits, cache = ref.forward(prompt)
    out = [logits[-1]]
    for t in steps:
        logits, cache = ref.forward([t], cache)
        out.append(logits[-1])
    return out


CONFIGS = {
    "llama_tied": dict(tie=True),
    "llama_untied": dict(tie=False),
    "qwen2_bias": dict(arch="qwen2", tie=False, bias=True),
    "llama3_rope": dict(tie=True, rope_scaling=LLAMA3),
    "linear_rope": dict(tie=False, rope_scaling={"type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp32_graph_equals_reference_prefill_and_decode(name: str, tmp_path: Path) -> None:
    src = make_source(**CONFIGS[name])
    info = build_decoder_graph(src, VariantPlan(precision="fp32"), tmp_path / "m.onnx")
    sess = session(info.path)
    ds = DecodeSession(sess, src.config, MAX_LEN)
    got = run_steps(ds, PROMPT, STEPS)
    want = ref_steps(ReferenceDecoder(src), PROMPT, STEPS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
    # the presents keep the past's shape: [1, kv_heads, max_len, head_dim]
    assert ds.kv is not None and ds.kv["past_key_values.1.value"].shape == (1, 2, MAX_LEN, 16)
    assert ds.past_len == len(PROMPT) + len(STEPS)
    # graph contract
    model = onnx.load(str(info.path))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain: o.version for o in model.opset_import} == {"": OPSET, "com.microsoft": 1}
    assert [i.name for i in sess.get_inputs()][:2] == ["input_ids", "attention_mask"]
    assert sess.get_outputs()[0].name == "logits" and sess.get_outputs()[0].shape[1] == 1
    # logits_to_keep: an input with a default of 1 (runtimes that do not feed it get the last position)
    assert [i.name for i in sess.get_overridable_initializers()] == ["logits_to_keep"]
    ds.reset()
    ds(PROMPT)
    feeds = session_feeds(src.config, STEPS, ds.past_len, MAX_LEN, ds.kv)
    three = sess.run(["logits"], {**feeds, "logits_to_keep": np.array([3], np.int64)})[0][0]
    assert three.shape == (3, src.config.vocab_size)
    np.testing.assert_allclose(three[-1], ds(STEPS)[-1], atol=1e-5)
    assert info.ops["com.microsoft.GroupQueryAttention"] == 2
    assert info.ops["com.microsoft.SkipSimplifiedLayerNormalization"] == 4 + 1  # 2 per layer + final (layer 0: x + x)
    assert info.batch_invariant and info.precision == "fp32"


def test_reference_cache_equals_full_forward_and_rope_scaling_formulas() -> None:
    src = make_source(rope_scaling=LLAMA3)
    ref = ReferenceDecoder(src, dtype=np.float64)
    full, _ = ref.forward(PROMPT + STEPS)
    inc = ref_steps(ref, PROMPT, STEPS)
    np.testing.assert_allclose(np.stack(inc), full[len(PROMPT) - 1 :], atol=1e-10)
    # llama3 inverse frequencies, restated per frequency from Hugging Face's _compute_llama3_parameters
    cfg = src.config
    base = [1.0 / 10000.0 ** (i / 16) for i in range(0, 16, 2)]
    expect = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < 64 / 4.0:  # high-frequency band: unchanged
            expect.append(f)
        elif wavelen > 64 / 1.0:  # low-frequency band: divided by factor
            expect.append(f / 8.0)
        else:
            smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
            expect.append((1 - smooth) * f / 8.0 + smooth * f)
    np.testing.assert_allclose(rope_inv_freq(cfg), expect, rtol=1e-12)
    assert len({round(e / b, 6) for e, b in zip(expect, base)}) >= 3  # all three bands occur
    lin = make_source(rope_scaling={"type": "linear", "factor": 2.0}).config
    np.testing.assert_allclose(rope_inv_freq(lin), np.array(base) / 2.0, rtol=1e-12)
    with pytest.raises(UnsupportedModelError, match="yarn"):
        rope_inv_freq(make_source(rope_scaling={"rope_type": "yarn", "factor": 4.0}).config)


def test_reference_linear_inputs_and_hessians() -> None:
    src = make_source(tie=False)
    ref = ReferenceDecoder(src)
    xs = ref.collect_linear_inputs(PROMPT)
    assert xs["layers.0.q"] is xs["layers.0.k"] is xs["layers.0.v"]
    assert xs["layers.1.gate"] is xs["layers.1.up"]
    assert xs["layers.1.down"].shape == (len(PROMPT), 128) and xs["layers.0.o"].shape == (len(PROMPT), 64)
    seqs = [PROMPT, STEPS]
    hs = ref.collect_hessians(seqs, layers=[1])
    assert set(hs) == {f"layers.1.{p}" for p in ("q", "k", "v", "o", "gate", "up", "down")}
    x2 = ref.collect_linear_inputs(STEPS)
    for name in ("layers.1.q", "layers.1.down"):
        x = np.concatenate([xs[name], x2[name]]).astype(np.float64)
        np.testing.assert_allclose(hs[name], x.T @ x / x.shape[0], rtol=1e-5, atol=1e-6)


def test_all_logits_graph_gives_every_position(tmp_path: Path) -> None:
    src = make_source(tie=False)
    last = build_decoder_graph(src, VariantPlan(precision="fp32"), tmp_path / "last.onnx")
    full = build_decoder_graph(src, VariantPlan(precision="fp32"), tmp_path / "all.onnx", all_logits=True)
    s_all = session(full.path)
    assert s_all.get_outputs()[0].shape[1] == "seq"
    rows = DecodeSession(s_all, src.config, MAX_LEN)(PROMPT)
    assert rows.shape == (len(PROMPT), 300)
    want, _ = ReferenceDecoder(src).forward(PROMPT)
    np.testing.assert_allclose(rows, want, atol=1e-4, rtol=0)
    one = DecodeSession(session(last.path), src.config, MAX_LEN)(PROMPT)
    assert one.shape == (1, 300)
    np.testing.assert_allclose(one[0], rows[-1], atol=1e-5, rtol=0)
    # the same weights; the last-only graph adds its Slice's three int64 constants
    assert last.weight_bytes_per_token - full.weight_bytes_per_token == 3 * 8


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("tie", [True, False])
def test_quantized_graph_equals_reference_on_dequantized_weights(precision: str, tie: bool, tmp_path: Path) -> None:
    src = make_source(tie=tie, arch="qwen2" if not tie else "llama", bias=not tie)
    plan0 = VariantPlan(precision=precision, accuracy_level=0, quantize_embedding=True)
    qws = quantize_decoder(src, plan0)
    if tie:
        assert qws["embed"] is qws["lm_head"]
    ref = ReferenceDecoder(src, weights=dequantized_weights(qws))
    want = ref_steps(ref, PROMPT, STEPS)
    info0 = build_decoder_graph(src, plan0, tmp_path / "a0.onnx", weights=qws)
    got0 = run_steps(DecodeSession(session(info0.path), src.config, MAX_LEN), PROMPT, STEPS)
    for g, w in zip(got0, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)  # accuracy_level 0: float32 GEMM on the same weights
    assert info0.batch_invariant
    model = onnx.load(str(info0.path))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 2 * 4 + 1 and "MatMul" not in ops and "GatherBlockQuantized" in ops
    gbq = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in model.graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
    assert (gbq.input[0] == head.input[1]) == tie  # tied: the embedding reads the head's B
    onnx.checker.check_model(model, full_check=True)

    plan4 = VariantPlan(precision=precision, accuracy_level=4, quantize_embedding=True)
    info4 = build_decoder_graph(src, plan4, tmp_path / "a4.onnx", weights=qws)
    assert not info4.batch_invariant
    got4 = run_steps(DecodeSession(session(info4.path), src.config, MAX_LEN), PROMPT, STEPS)
    spread = float(np.max(np.abs(np.stack(want))))
    err4 = max(float(np.max(np.abs(g - w))) for g, w in zip(got4, want))
    # accuracy_level 4 quantizes each block of activations to int8 before every MatMulNBits:
    # measured max |logit error| / max |logit| 1.8-2.6 % over the 6 steps (int4 and int8 alike: the
    # error comes from the activations; greedy argmax unchanged); bound 5 %.
    assert err4 < 0.05 * spread, (err4, spread)


def test_mixed_precision_overrides(tmp_path: Path) -> None:
    src = make_source(tie=True, n_layers=2)
    overrides = {"layers.*.down": 8, "layers.0.v": 8, "lm_head": 8}
    plan = VariantPlan(precision="int4", accuracy_level=0, overrides=overrides)
    info = build_decoder_graph(src, plan, tmp_path / "mix.onnx")
    model = onnx.load(str(info.path))
    mm = {n.input[1]: {a.name: a.i for a in n.attribute} for n in model.graph.node if n.op_type == "MatMulNBits"}
    assert mm["model.layers.0.mlp.down_proj.qweight"]["bits"] == 8
    assert mm["model.layers.1.mlp.down_proj.qweight"]["bits"] == 8
    assert mm["lm_head.qweight"]["bits"] == 8
    assert mm["model.layers.1.attn.qkv_proj.qweight"]["bits"] == 4  # fused: q, k, v alike
    # layer 0's v differs from q/k, so its projections are separate MatMulNBits joined by Concat
    assert mm["model.layers.0.attn.qkv_proj.v.qweight"]["bits"] == 8
    assert mm["model.layers.0.attn.qkv_proj.q.qweight"]["bits"] == 4
    assert mm["model.layers.0.mlp.gate_up_proj.qweight"]["bits"] == 4
    gbq = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    assert {a.name: a.i for a in gbq.attribute}["bits"] == 8  # tied: the embedding follows the head
    assert info.tensor_bits["layers.0.v"] == 8 and info.tensor_bits["layers.0.q"] == 4 and info.tensor_bits["embed"] == 8
    # greedy tokens: graph == reference on the same dequantized weights
    qws = quantize_decoder(src, plan)
    ref = ReferenceDecoder(src, weights=dequantized_weights(qws))
    ds = DecodeSession(session(info.path), src.config, MAX_LEN)
    assert ds.greedy(PROMPT, 8) == ref.greedy(PROMPT, 8)


def _expected_bytes_per_token(src: DecoderSource, model: onnx.ModelProto, qws: dict[str, Any] | None) -> int:
    """Independently: linear weights (packed) + norms + biases + one embedding row + one rotary row
    each for cos/sin + the graph's small int64 constants."""
    c = src.config
    norms = 4 * c.d_model * (2 * c.n_layers + 1)
    biases = 4 * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim * c.n_layers if c.attention_bias else 0
    rope = 2 * 4 * (c.head_dim // 2)
    consts = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT64)
    if qws is None:  # fp32
        lin = sum(4 * src.tensor(n).size for n in tensor_names(c) if n.rsplit(".", 1)[-1] in ("q", "k", "v", "o", "gate", "up", "down"))
        head = 4 * c.vocab_size * c.d_model
        row = 0 if c.tie_embeddings else 4 * c.d_model  # tied: the whole table is the head, already counted
        return lin + head + norms + biases + rope + consts + row
    lin = 0
    for name, qw in qws.items():
        if name == "embed":
            continue
        b, s, z = pack_matmulnbits(qw)
        lin += b.nbytes + s.nbytes + (z.nbytes if z is not None else 0)
    e = qws["embed"]
    row = e.n_blocks * 4 + (e.n_blocks if e.zero_points is not None else 0)  # its scales and zero points, one row
    if not c.tie_embeddings:
        row += e.n_blocks * e.block_size * e.bits // 8  # its own data row
    return lin + norms + biases + rope + consts + row


@pytest.mark.parametrize("precision,tie", [("fp32", True), ("fp32", False), ("int4", True), ("int4", False), ("int8", True)])
def test_graph_info_bytes(precision: str, tie: bool, tmp_path: Path) -> None:
    src = make_source(tie=tie, bias=not tie, arch="qwen2" if not tie else "llama")
    plan = VariantPlan(precision=precision)
    qws = quantize_decoder(src, plan) if plan.quantized else None
    info: GraphInfo = build_decoder_graph(src, plan, tmp_path / "m.onnx", weights=qws)
    model = onnx.load(str(info.path))
    assert info.weight_bytes_per_token == _expected_bytes_per_token(src, model, qws)
    assert info.total_initializer_bytes == sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert info.path.stat().st_size > info.total_initializer_bytes  # one file, weights inside
    assert not list(tmp_path.glob("*.data"))
    if precision == "fp32" and tie:  # the table is stored once, read by Gather and by the head's Gemm
        assert sum(1 for t in model.graph.initializer if list(t.dims) == [300, 64]) == 1


def test_fp16_graph_runs_on_cpu(tmp_path: Path) -> None:
    src = make_source(tie=True)
    info = build_decoder_graph(src, VariantPlan(precision="fp16"), tmp_path / "h.onnx")
    assert info.kv_dtype == "float16"
    sess = session(info.path)
    assert sess.get_inputs()[2].type == "tensor(float16)" and sess.get_outputs()[0].type == "tensor(float)"
    got = run_steps(DecodeSession(sess, src.config, MAX_LEN, np.float16), PROMPT, STEPS)
    want = ref_steps(ReferenceDecoder(src), PROMPT, STEPS)
    spread = float(np.max(np.abs(np.stack(want))))
    err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    # float16 weights and activations: measured max |err| / max |logit| 0.15 %; bound 2 %
    assert err < 0.02 * spread, (err, spread)
    assert [int(np.argmax(g)) for g in got] == [int(np.argmax(w)) for w in want]


@pytest.mark.parametrize("precision,level", [("fp32", 0), ("int4", 0)])
def test_batch_invariance_where_claimed(precision: str, level: int, tmp_path: Path) -> None:
    """A position's logits from a 7-row prefill equal those of a 6-row prefill and a 1-row step."""
    src = make_source(tie=False)
    info = build_decoder_graph(src, VariantPlan(precision=precision, accuracy_level=level), tmp_path / "m.onnx", all_logits=True)
    assert info.batch_invariant
    ds = DecodeSession(session(info.path), src.config, MAX_LEN)
    rows = ds(PROMPT)
    ds.reset()
    ds(PROMPT[:-1])
    step = ds(PROMPT[-1:])
    np.testing.assert_allclose(step[0], rows[-1], atol=2e-5, rtol=0)


@pytest.mark.parametrize("method", ["hqq", "gptq"])
def test_hqq_and_gptq_plans(method: str, tmp_path: Path) -> None:
    src = make_source(tie=True)
    ref = ReferenceDecoder(src)
    hess = ref.collect_hessians([list(range(i, 300, 7))[:40] for i in range(4)]) if method == "gptq" else None
    plan = VariantPlan(precision="int4", accuracy_level=0, method=method, hessians=hess)
    qws = quantize_decoder(src, plan)
    info = build_decoder_graph(src, plan, tmp_path / "m.onnx", weights=qws)
    assert info.tensor_methods["layers.1.down"] == method
    assert info.tensor_methods["lm_head"] == ("rtn" if method == "gptq" else method)  # no head Hessian collected
    want = ref_steps(ReferenceDecoder(src, weights=dequantized_weights(qws)), PROMPT, STEPS[:2])
    got = run_steps(DecodeSession(session(info.path), src.config, MAX_LEN), PROMPT, STEPS[:2])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
    if method == "gptq":
        with pytest.raises(LLMConvertError, match="hessians"):
            quantize_decoder(src, VariantPlan(precision="int4", method="gptq"))


def test_feeds_and_plan_errors(tmp_path: Path) -> None:
    src = make_source()
    cfg = src.config
    feeds = session_feeds(cfg, [3, 4], past_len=5, max_len=16)
    assert feeds["attention_mask"].shape == (1, 7) and feeds["input_ids"].dtype == np.int64
    assert feeds["past_key_values.0.key"].shape == (1, 2, 16, 16)
    with pytest.raises(LLMConvertError, match="max_len"):
        session_feeds(cfg, [1] * 10, past_len=10, max_len=16)
    with pytest.raises(LLMConvertError, match="context length"):
        empty_kv(cfg, 256)
    with pytest.raises(UnsupportedModelError, match="precision"):
        VariantPlan(precision="int3")
    with pytest.raises(UnsupportedModelError, match="kv_dtype"):
        VariantPlan(precision="int4", kv_dtype="int8")
    with pytest.raises(UnsupportedModelError, match="bits"):
        VariantPlan(precision="int4", overrides={"lm_head": 6})
    qws = quantize_decoder(src, VariantPlan(precision="int8"))
    with pytest.raises(LLMConvertError, match="8 bits, the plan asks for 4"):
        build_decoder_graph(src, VariantPlan(precision="int4"), tmp_path / "x.onnx", weights=qws)
    with pytest.raises(LLMConvertError, match="takes no quantized weights"):
        build_decoder_graph(src, VariantPlan(precision="fp32"), tmp_path / "y.onnx", weights=qws)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_shared_kv_buffer_with_iobinding(precision: str, tmp_path: Path) -> None:
    """The runtime's way: one OrtValue per layer bound as both past_key_values.i.* and present.i.*,
    updated in place by GroupQueryAttention; logits equal the numpy-feeds path."""
    src = make_source(tie=True)
    info = build_decoder_graph(src, VariantPlan(precision=precision, accuracy_level=0), tmp_path / "m.onnx")
    sess = session(info.path)
    cfg = src.config
    bufs = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in empty_kv(cfg, MAX_LEN).items()}
    got = []
    past = 0
    for ids in [PROMPT] + [[t] for t in STEPS]:
        io = sess.io_binding()
        io.bind_cpu_input("input_ids", np.asarray([ids], dtype=np.int64))
        io.bind_cpu_input("attention_mask", np.ones((1, past + len(ids)), dtype=np.int64))
        io.bind_output("logits")  # first, so get_outputs()[0] is it (binding order)
        for name, buf in bufs.items():
            io.bind_ortvalue_input(name, buf)
            io.bind_ortvalue_output(name.replace("past_key_values.", "present.", 1), buf)
        sess.run_with_iobinding(io)
        got.append(io.get_outputs()[0].numpy()[0, -1])
        past += len(ids)
    want = run_steps(DecodeSession(sess, cfg, MAX_LEN), PROMPT, STEPS)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    # the buffer really was written in place: positions [0, past) filled, the rest still zero
    k0 = bufs["past_key_values.0.key"].numpy()
    assert np.all(np.abs(k0[0, :, :past]).sum(axis=-1) > 0) and not np.any(k0[0, :, past:])


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_float16_kv_cache_under_float32_activations(precision: str, tmp_path: Path) -> None:
    src = make_source(tie=False)
    plan = VariantPlan(precision=precision, accuracy_level=0, kv_dtype="float16")
    qws = quantize_decoder(src, plan) if plan.quantized else None
    info = build_decoder_graph(src, plan, tmp_path / "m.onnx", weights=qws)
    assert info.kv_dtype == "float16"
    sess = session(info.path)
    assert sess.get_inputs()[2].type == "tensor(float16)" and sess.get_outputs()[1].type == "tensor(float16)"
    ds = DecodeSession(sess, src.config, MAX_LEN, np.float16)
    got = run_steps(ds, PROMPT, STEPS)
    want = ref_steps(ReferenceDecoder(src, weights=dequantized_weights(qws) if qws else None), PROMPT, STEPS)
    # prefill attends to the new float32 K/V (exact); decode steps read the float16 cache:
    # measured max |err| 2e-3 on logits up to 8 (0.03 %); bound 0.5 %
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=0)
    spread = float(np.max(np.abs(np.stack(want))))
    assert max(float(np.max(np.abs(g - w))) for g, w in zip(got, want)) < 5e-3 * spread
    assert ds.kv is not None and ds.kv["past_key_values.0.key"].dtype == np.float16


def test_quantized_graph_with_float_embedding(tmp_path: Path) -> None:
    """quantize_embedding=False: a float Gather table and an int4 tied head (no table copy in the head)."""
    src = make_source(tie=True)
    plan = VariantPlan(precision="int4", accuracy_level=0, quantize_embedding=False)
    qws = quantize_decoder(src, plan)
    assert "embed" not in qws
    info = build_decoder_graph(src, plan, tmp_path / "m.onnx", weights=qws)
    model = onnx.load(str(info.path))
    ops = [n.op_type for n in model.graph.node]
    assert "GatherBlockQuantized" not in ops and "Gather" in ops
    assert info.tensor_bits["embed"] == 32 and info.tensor_bits["lm_head"] == 4
    ref = ReferenceDecoder(src, weights=dequantized_weights(qws))  # float embed, dequantized head
    got = run_steps(DecodeSession(session(info.path), src.config, MAX_LEN), PROMPT, STEPS[:2])
    for g, w in zip(got, ref_steps(ref, PROMPT, STEPS[:2])):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
