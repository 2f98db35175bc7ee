"""The decoder as an ONNX graph on ONNX Runtime's fused contrib operators.

Graph contract (what a runtime binds)::

    inputs   input_ids                   int64 [batch, seq]
             attention_mask              int64 [batch, total_seq]      ones; total_seq = past_len + seq
             past_key_values.{i}.key     kv    [batch, n_kv_heads, max_len, head_dim]
             past_key_values.{i}.value   kv    [batch, n_kv_heads, max_len, head_dim]
             logits_to_keep              int64 [1]                     optional (an initializer default of 1): how many
                                                                       last positions get logits (speculative verification)
    outputs  logits                      float32 [batch, 1, vocab]     (the last position; [batch, keep, vocab] when fed
                                                                       logits_to_keep > 1, declared 1 because onnxruntime-genai
                                                                       preallocates the declared shape; all_logits: [batch, seq, vocab])
             present.{i}.key / .value    same shape and dtype as the past

``max_len`` is chosen by the runtime and must not exceed ``context_length`` (the rotary caches'
length). Past and present may be bound to one buffer (IOBinding), which GroupQueryAttention
updates in place; with plain numpy feeds the present comes back as a new ``[.., max_len, ..]``
array that is the next step's past (:class:`DecodeSession` does that).

Per layer: ``SkipSimplifiedLayerNormalization`` (layer 0, which has no residual yet, normalises
``x + x`` with ``4 * eps``: exactly ``norm(x)``), one ``MatMulNBits`` for fused q/k/v (+ ``Add`` of the
concatenated biases for Qwen2), ``GroupQueryAttention`` (packed QKV, ``do_rotary=1``,
``rotary_interleaved=0``, cos/sin caches computed from ``rope_theta`` and ``rope_scaling``),
``MatMulNBits`` o_proj, fused gate/up ``MatMulNBits`` + ``Split``, ``x * Sigmoid(x) * up``,
``MatMulNBits`` down; final ``SkipSimplifiedLayerNormalization``, the last position sliced before
the head, the head. Operator semantics: ONNX Runtime's ContribOperators.md,
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md (MatMulNBits,
GatherBlockQuantized, GroupQueryAttention, SkipSimplifiedLayerNormalization).

fp32/fp16 variants use ``MatMul`` with ``[K, N]`` weights (a tied head uses ``Gemm(transB=1)`` on the
embedding table itself, so the table is stored once) and a plain ``Gather`` embedding. int4/int8
variants quantize the embedding for ``GatherBlockQuantized`` when asked; with tied embeddings it
reads the LM head's ``MatMulNBits`` B initializer (one copy of the big bytes; its scales and zero
points are separate small initializers, see :func:`.quant.pack_gather_block_quantized`).
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .native import native_weight
from .quant import QuantizedWeight, concat_cols, concat_rows, dequantize, pack_gather_block_quantized, pack_matmulnbits, quantize
from .reference import rope_cos_sin
from .spec import DecoderConfig, DecoderSource, LLMConvertError, UnsupportedModelError

__all__ = [
    "DecodeSession",
    "GraphInfo",
    "OPSET",
    "PRECISIONS",
    "VariantPlan",
    "build_decoder_graph",
    "dequantized_weights",
    "empty_kv",
    "linear_names",
    "quantize_decoder",
    "quantize_tensor",
    "session_feeds",
    "weight_bytes_per_token",
]

#: The ai.onnx opset the graphs are built at (GatherBlockQuantized embeddings need >= 21).
OPSET = 21
PRECISIONS = ("fp32", "fp16", "int8", "int4")
_MS = "com.microsoft"
_PROJ = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class VariantPlan:
    """How to build one variant.

    ``overrides`` maps a canonical tensor name or an ``fnmatch`` pattern (``"layers.*.down"``,
    ``"lm_head"``) to bits (4 or 8) for int4/int8 variants; the last matching entry wins. With
    tied embeddings the head's weight is ``"lm_head"`` and the quantized embedding shares it.
    ``kv_dtype`` ``""`` means the graph's compute type (float32, or float16 for fp16); a float16
    cache under float32 activations (half the KV memory) and the reverse run on ONNX Runtime
    1.32's CPU GroupQueryAttention (measured; older runtimes may refuse a cache type that differs
    from the activations').
    ``hessians`` (canonical name -> ``[K, K]``) feed ``method="gptq"``.
    """

    precision: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    method: str = "rtn"
    overrides: Mapping[str, int] = field(default_factory=dict)
    kv_dtype: str = ""
    quantize_embedding: bool = True
    hessians: Mapping[str, np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise UnsupportedModelError(f"precision must be one of {PRECISIONS}, found {self.precision!r}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise UnsupportedModelError(f"accuracy_level must be 0..4 (MatMulNBits), found {self.accuracy_level}")
        if self.kv_dtype not in ("", "float32", "float16"):
            raise UnsupportedModelError(f"kv_dtype must be '', 'float32' or 'float16', found {self.kv_dtype!r}")
        for pat, bits in self.overrides.items():
            if bits not in (4, 8):
                raise UnsupportedModelError(f"override {pat!r}: bits must be 4 or 8, found {bits}")

    @property
    def quantized(self) -> bool:
        """True for int4/int8 plans (MatMulNBits weights)."""
        return self.precision in ("int4", "int8")

    @property
    def kv(self) -> str:
        """The KV cache dtype this plan builds (``kv_dtype``, else the compute type)."""
        return self.kv_dtype or ("float16" if self.precision == "fp16" else "float32")

    def bits_for(self, name: str) -> int | None:
        """Bits of canonical tensor ``name`` in this variant (None: not quantized)."""
        if not self.quantized:
            return None
        bits = 4 if self.precision == "int4" else 8
        for pat, b in self.overrides.items():
            if fnmatch.fnmatchcase(name, pat):
                bits = b
        return bits


def linear_names(cfg: DecoderConfig) -> list[str]:
    """Canonical names of every quantizable linear weight, the head (``"lm_head"``) last."""
    return [f"layers.{i}.{p}" for i in range(cfg.n_layers) for p in _PROJ] + ["lm_head"]


def _head_source(src: DecoderSource) -> np.ndarray:
    return src.tensor("embed" if src.config.tie_embeddings else "lm_head")


def quantize_decoder(src: DecoderSource, plan: VariantPlan) -> dict[str, QuantizedWeight]:
    """Quantize every linear weight (and the embedding if ``plan.quantize_embedding``) as ``plan`` says.

    Keys are canonical names; ``"lm_head"`` is the head even when tied; ``"embed"`` is present when the
    embedding is quantized, and with tied embeddings it is the same object as ``"lm_head"``.
    """
    if not plan.quantized:
        raise LLMConvertError(f"quantize_decoder: plan precision {plan.precision!r} is not quantized")
    out = {name: quantize_tensor(src, plan, name) for name in linear_names(src.config)}
    if plan.quantize_embedding:
        out["embed"] = out["lm_head"] if src.config.tie_embeddings else quantize_tensor(src, plan, "embed")
    return out


def quantize_tensor(src: DecoderSource, plan: VariantPlan, name: str) -> QuantizedWeight:
    """Quantize canonical tensor ``name`` as ``plan`` says. With ``method="gptq"`` the head and the
    embedding fall back to RTN unless ``plan.hessians`` holds theirs (their inputs' Hessians are
    not collected by :meth:`~.reference.ReferenceDecoder.collect_hessians`); the per-tensor method
    is reported in :class:`GraphInfo`."""
    bits = plan.bits_for(name)
    assert bits is not None
    if plan.method == "native":
        nw = native_weight(src, name)
        # (an untied embedding with per-block offsets is re-quantized: GatherBlockQuantized adds no offset)
        if nw is not None and nw.bits == bits and not (name == "embed" and nw.offsets is not None):
            return nw
    w = _head_source(src) if name == "lm_head" else src.tensor(name)
    h = (plan.hessians or {}).get(name) if plan.method == "gptq" else None
    method = "hqq" if plan.method == "native" else plan.method  # a tensor the file does not store in an imported type
    if method == "gptq" and h is None:
        if name not in ("lm_head", "embed"):
            raise LLMConvertError(f"method 'gptq' needs plan.hessians[{name!r}], found none")
        method = "rtn"
    return quantize(w, bits, plan.block_size, method, hessian=h)


def dequantized_weights(qws: Mapping[str, QuantizedWeight]) -> dict[str, np.ndarray]:
    """Float32 weights by canonical name that make :class:`~.reference.ReferenceDecoder` compute
    the quantized graph's model (``ReferenceDecoder(src, weights=dequantized_weights(qws))``)."""
    cache: dict[int, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for name, qw in qws.items():
        if id(qw) not in cache:
            cache[id(qw)] = dequantize(qw)
        out[name] = cache[id(qw)]
    return out


@dataclass(frozen=True)
class GraphInfo:
    """What :func:`build_decoder_graph` wrote.

    ``weight_bytes_per_token``: bytes of initializers one decode step reads: every initializer
    except the embedding table (and a GatherBlockQuantized embedding's own scales / zero points)
    and the rotary caches, of which one row each is counted. A tied quantized embedding's data is
    the head's B, counted once as the head. ``tensor_bits``: canonical name -> 32/16/8/4.
    ``batch_invariant``: whether a position's logits do not depend on how many rows a pass
    computes (False for MatMulNBits with accuracy_level 4, which quantizes activations per block).
    """

    path: Path
    opset: int
    ops: dict[str, int]
    weight_bytes_per_token: int
    total_initializer_bytes: int
    tensor_bits: dict[str, int]
    tensor_methods: dict[str, str]
    batch_invariant: bool
    precision: str
    kv_dtype: str
    all_logits: bool


class _Builder:
    def __init__(self, src: DecoderSource, plan: VariantPlan, weights: Mapping[str, QuantizedWeight] | None) -> None:
        self.src = src
        self.cfg = src.config
        self.plan = plan
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        self.fdt = np.float16 if plan.precision == "fp16" else np.float32
        self.bits: dict[str, int] = {}
        self.methods: dict[str, str] = {}
        self.qw: dict[str, QuantizedWeight] = dict(weights or {})
        self._n = 0
        self._blocksums: dict[tuple[str, int], str] = {}

    # -- helpers -------------------------------------------------------------------------------
    def init(self, name: str, arr: np.ndarray) -> str:
        if name in self._names:
            raise LLMConvertError(f"graph builder: initializer {name!r} defined twice")
        self._names.add(name)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(self, op: str, inputs: Sequence[str], outputs: Sequence[str] | int = 1, domain: str = "", **attrs: Any) -> list[str]:
        self._n += 1
        if isinstance(outputs, int):
            outputs = [f"/{op}_{self._n}/out{j}" for j in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=f"/{op}_{self._n}", domain=domain, **attrs))
        return list(outputs)

    def weight(self, name: str) -> QuantizedWeight:
        """The quantized weight of canonical ``name`` (given, or quantized now)."""
        bits = self.plan.bits_for(name)
        assert bits is not None
        if name not in self.qw:
            self.qw[name] = quantize_tensor(self.src, self.plan, name)
        qw = self.qw[name]
        if qw.bits != bits:
            raise LLMConvertError(f"pre-quantized weight {name!r} has {qw.bits} bits, the plan asks for {bits}")
        n_exp, k_exp = self._shape_of(name)
        if (qw.N, qw.K) != (n_exp, k_exp):
            raise LLMConvertError(f"pre-quantized weight {name!r} is [{qw.N}, {qw.K}], the config needs [{n_exp}, {k_exp}]")
        self.bits[name] = qw.bits
        self.methods[name] = qw.method
        return qw

    def _shape_of(self, name: str) -> tuple[int, int]:
        c = self.cfg
        p = name.rsplit(".", 1)[-1]
        return {
            "q": (c.n_heads * c.head_dim, c.d_model),
            "k": (c.n_kv_heads * c.head_dim, c.d_model),
            "v": (c.n_kv_heads * c.head_dim, c.d_model),
            "o": (c.d_model, c.n_heads * c.head_dim),
            "gate": (c.ffn_dim, c.d_model),
            "up": (c.ffn_dim, c.d_model),
            "down": (c.d_model, c.ffn_dim),
            "lm_head": (c.vocab_size, c.d_model),
            "embed": (c.vocab_size, c.d_model),
        }[p]

    def float_weight(self, name: str) -> np.ndarray:
        w = _head_source(self.src) if name == "lm_head" else self.src.tensor(name)
        w = np.asarray(w, dtype=np.float32)
        if w.shape != self._shape_of(name):
            raise LLMConvertError(f"tensor {name!r} is {list(w.shape)}, the config needs {list(self._shape_of(name))}")
        self.bits[name] = 16 if self.plan.precision == "fp16" else 32
        self.methods[name] = self.plan.precision
        return w

    def augmented(self, x: str, block_size: int, k: int) -> str:
        """``[x, blocksum(x)]`` along the last axis (``K + K / block_size`` inputs), once per input: the block
        sums come from one MatMul by a constant 0/1 matrix ``[K, K / block_size]``."""
        key = (x, block_size)
        if key not in self._blocksums:
            if k % block_size:
                raise LLMConvertError(f"per-block offsets need K ({k}) to be a multiple of the block size {block_size}")
            nb = k // block_size
            name = f"/const/blocksum_{k}_{block_size}"
            if name not in self._names:
                sel = np.zeros((k, nb), dtype=self.fdt)
                sel[np.arange(k), np.arange(k) // block_size] = 1.0
                self.init(name, sel)
            xs = self.node("MatMul", [x, name])[0]
            self._blocksums[key] = self.node("Concat", [x, xs], axis=-1)[0]
        return self._blocksums[key]

    def matmulnbits(self, x: str, qw: QuantizedWeight, init_name: str, out: str | None = None) -> str:
        if qw.offsets is not None:
            # w = (q - zp) * scale + offset per block, so x @ w.T = [x, blocksum(x)] @ [w_q, offsets].T: one
            # MatMulNBits over K + K/block inputs whose last blocks hold the offsets (4-bit, their own scales;
            # an offset is at most half a step of the weight grid, and 4 bits keep 1/30 of its range).
            off = quantize(qw.offsets, qw.bits, qw.block_size, "rtn")
            aug = concat_cols(replace(qw, offsets=None), off)
            return self.matmulnbits(self.augmented(x, qw.block_size, qw.K), aug, init_name, out)
        b, s, z = pack_matmulnbits(qw)
        ins = [x, self.init(init_name + ".qweight", b), self.init(init_name + ".scales", s)]
        if z is not None:
            ins.append(self.init(init_name + ".qzeros", z))
        return self.node(
            "MatMulNBits",
            ins,
            [out] if out else 1,
            domain=_MS,
            K=qw.K,
            N=qw.N,
            bits=qw.bits,
            block_size=qw.block_size,
            accuracy_level=self.plan.accuracy_level,
        )[0]

    def linear(self, x: str, names: list[str], init_name: str) -> list[str]:
        """One projection over ``names`` stacked along N (fused when they quantize alike).

        Returns one output if fused, else one per name."""
        if not self.plan.quantized:
            w = np.concatenate([self.float_weight(n) for n in names], axis=0)
            wt = np.ascontiguousarray(w.T.astype(self.fdt))
            return self.node("MatMul", [x, self.init(init_name + ".weight", wt)])
        qws = [self.weight(n) for n in names]
        if len({(q.bits, q.block_size) for q in qws}) == 1:
            fused = qws[0] if len(qws) == 1 else concat_rows(qws)
            return [self.matmulnbits(x, fused, init_name)]
        return [self.matmulnbits(x, q, f"{init_name}.{n.rsplit('.', 1)[-1]}") for q, n in zip(qws, names)]

    def const_i64(self, name: str, values: Sequence[int]) -> str:
        return self.init(name, np.asarray(values, dtype=np.int64))

    # -- the graph ---------------------------------------------------------------------------
    def build(self, all_logits: bool) -> onnx.ModelProto:
        c, plan = self.cfg, self.plan
        nh, nkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
        kvt = TensorProto.FLOAT16 if plan.kv == "float16" else TensorProto.FLOAT
        inputs = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_seq"]),
        ]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq" if all_logits else 1, c.vocab_size])]
        if not all_logits:
            # A graph input that is also an initializer is overridable with a default (ONNX IR >= 4;
            # https://onnx.ai/onnx/repo-docs/IR.html#graphs): runtimes that do not know it (onnxruntime-genai)
            # get the last position's logits; a speculative verifier feeds k + 1.
            inputs.append(helper.make_tensor_value_info("logits_to_keep", TensorProto.INT64, [1]))
            self.init("logits_to_keep", np.asarray([1], dtype=np.int64))
        for i in range(c.n_layers):
            for kv in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", kvt, ["batch", nkv, "max_len", hd]))
                outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", kvt, ["batch", nkv, "max_len", hd]))

        # attention-mask derived GQA inputs
        msum = self.node("ReduceSum", ["attention_mask", self.const_i64("/const/axes1", [1])], keepdims=0)[0]
        sub = self.node("Sub", [msum, self.init("/const/one_i64", np.asarray(1, dtype=np.int64))])[0]
        seqlens_k = self.node("Cast", [sub], ["seqlens_k"], to=TensorProto.INT32)[0]
        mshape = self.node("Shape", ["attention_mask"])[0]
        tlen = self.node("Gather", [mshape, self.init("/const/idx1", np.asarray(1, dtype=np.int64))], axis=0)[0]
        total_len = self.node("Cast", [tlen], ["total_sequence_length"], to=TensorProto.INT32)[0]

        # rotary caches
        cos, sin = rope_cos_sin(c, np.arange(c.context_length))
        cos_n = self.init("cos_cache", cos.astype(self.fdt))
        sin_n = self.init("sin_cache", sin.astype(self.fdt))

        # embedding
        x = self.embedding()

        residual = x
        prev_out: str | None = None
        for i in range(c.n_layers):
            p = f"layers.{i}."
            g_attn = self.init(f"model.layers.{i}.attn_norm.weight", self.src.tensor(p + "attn_norm").astype(self.fdt))
            if prev_out is None:
                # Layer 0 has no skip. RMSNorm is scale-invariant, so norm(x + x) with epsilon 4*eps is
                # exactly norm(x) with eps (2x and 4*eps are exact in binary floating point); this keeps
                # to contrib ops onnx.checker accepts (SimplifiedLayerNormalization is registered by
                # ONNX Runtime in the default domain, which the checker rejects at opset 21).
                h = self.node("SkipSimplifiedLayerNormalization", [x, x, g_attn], 1, domain=_MS, epsilon=4.0 * float(c.rms_eps))[0]
            else:
                outs = self.node("SkipSimplifiedLayerNormalization", [prev_out, residual, g_attn], 4, domain=_MS, epsilon=float(c.rms_eps))
                h, residual = outs[0], outs[3]
            qkv_parts = self.linear(h, [p + "q", p + "k", p + "v"], f"model.layers.{i}.attn.qkv_proj")
            qkv = qkv_parts[0] if len(qkv_parts) == 1 else self.node("Concat", qkv_parts, axis=-1)[0]
            if c.attention_bias:
                bias = np.concatenate([self.src.tensor(p + "q_bias"), self.src.tensor(p + "k_bias"), self.src.tensor(p + "v_bias")])
                qkv = self.node("Add", [qkv, self.init(f"model.layers.{i}.attn.qkv_proj.bias", bias.astype(self.fdt))])[0]
            attn = self.node(
                "GroupQueryAttention",
                [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens_k, total_len, cos_n, sin_n],
                [f"/layers.{i}/attn/out", f"present.{i}.key", f"present.{i}.value"],
                domain=_MS,
                num_heads=nh,
                kv_num_heads=nkv,
                scale=1.0 / math.sqrt(hd),
                do_rotary=1,
                rotary_interleaved=0,
                local_window_size=-1,
            )[0]
            o = self.linear(attn, [p + "o"], f"model.layers.{i}.attn.o_proj")[0]
            g_ffn = self.init(f"model.layers.{i}.ffn_norm.weight", self.src.tensor(p + "ffn_norm").astype(self.fdt))
            outs = self.node("SkipSimplifiedLayerNormalization", [o, residual, g_ffn], 4, domain=_MS, epsilon=float(c.rms_eps))
            h, residual = outs[0], outs[3]
            gu = self.linear(h, [p + "gate", p + "up"], f"model.layers.{i}.mlp.gate_up_proj")
            if len(gu) == 1:
                gate, up = self.node("Split", [gu[0], self.const_i64(f"/layers.{i}/split", [c.ffn_dim, c.ffn_dim])], 2, axis=-1)
            else:
                gate, up = gu
            sig = self.node("Sigmoid", [gate])[0]
            silu = self.node("Mul", [gate, sig])[0]
            act = self.node("Mul", [silu, up])[0]
            prev_out = self.linear(act, [p + "down"], f"model.layers.{i}.mlp.down_proj")[0]

        g_norm = self.init("model.norm.weight", self.src.tensor("norm").astype(self.fdt))
        assert prev_out is not None
        hfin = self.node("SkipSimplifiedLayerNormalization", [prev_out, residual, g_norm], 1, domain=_MS, epsilon=float(c.rms_eps))[0]
        if not all_logits:
            big = np.iinfo(np.int64).max
            start = self.node("Neg", ["logits_to_keep"])[0]
            hfin = self.node(
                "Slice",
                [
                    hfin,
                    start,
                    self.const_i64("/const/last_end", [big]),
                    self.const_i64("/const/seq_axis", [1]),
                ],
            )[0]
        self.head(hfin)

        graph = helper.make_graph(self.nodes, "decoder", inputs, outputs, self.inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(_MS, 1)],
            producer_name="edge_sdk.converters.llm",
        )
        model.ir_version = 10
        return model

    def embedding(self) -> str:
        c, plan = self.cfg, self.plan
        if plan.quantized and plan.quantize_embedding:
            if c.tie_embeddings and self.weight("lm_head").offsets is not None:
                # The head was imported with per-block offsets, which GatherBlockQuantized cannot add:
                # the embedding gets its own 8-bit copy (near exact; bytes read per token: one row).
                qw = quantize(self.src.tensor("embed"), 8, plan.block_size, "rtn")
                self.bits["embed"], self.methods["embed"] = qw.bits, qw.method
                data_name = self.init("model.embed_tokens.qweight", pack_gather_block_quantized(qw)[0])
            elif c.tie_embeddings:
                qw = self.weight("lm_head")
                if "embed" in self.qw and self.qw["embed"] is not qw:
                    raise LLMConvertError("tied embeddings: pre-quantized 'embed' must be the same object as 'lm_head'")
                data_name = "lm_head.qweight"  # the head's MatMulNBits B, defined by head()
                self.bits["embed"], self.methods["embed"] = qw.bits, qw.method
            else:
                bits = plan.bits_for("embed")
                if "embed" not in self.qw:
                    self.qw["embed"] = quantize_tensor(self.src, plan, "embed")
                qw = self.qw["embed"]
                if qw.bits != bits or (qw.N, qw.K) != (c.vocab_size, c.d_model):
                    raise LLMConvertError(
                        f"pre-quantized 'embed' is {qw.bits}-bit [{qw.N}, {qw.K}], the plan needs {bits}-bit [{c.vocab_size}, {c.d_model}]"
                    )
                self.bits["embed"], self.methods["embed"] = qw.bits, qw.method
                data_name = self.init("model.embed_tokens.qweight", pack_gather_block_quantized(qw)[0])
            _, s3, z3 = pack_gather_block_quantized(qw)
            ins = [data_name, "input_ids", self.init("model.embed_tokens.scales", s3)]
            if z3 is not None:
                ins.append(self.init("model.embed_tokens.qzeros", z3))
            g = self.node("GatherBlockQuantized", ins, domain=_MS, bits=qw.bits, block_size=qw.block_size, gather_axis=0, quantize_axis=2)[
                0
            ]
            flat = self.node("Reshape", [g, self.const_i64("/const/emb_shape", [0, 0, -1])])[0]
            if qw.n_blocks * qw.block_size != c.d_model:
                flat = self.node(
                    "Slice",
                    [
                        flat,
                        self.const_i64("/const/emb_s", [0]),
                        self.const_i64("/const/emb_e", [c.d_model]),
                        self.const_i64("/const/emb_ax", [2]),
                    ],
                )[0]
            return flat
        w = self.src.tensor("embed").astype(np.float32)
        if w.shape != (c.vocab_size, c.d_model):
            raise LLMConvertError(f"tensor 'embed' is {list(w.shape)}, the config needs {[c.vocab_size, c.d_model]}")
        self.bits["embed"] = 16 if plan.precision == "fp16" else 32
        self.methods["embed"] = plan.precision if not plan.quantized else "float"
        emb = self.init("model.embed_tokens.weight", w.astype(self.fdt))
        return self.node("Gather", [emb, "input_ids"], axis=0)[0]

    def head(self, h: str) -> None:
        c, plan = self.cfg, self.plan
        to_f32 = plan.precision == "fp16"
        out = "/head/logits16" if to_f32 else "logits"
        if plan.quantized:
            self.matmulnbits(h, self.weight("lm_head"), "lm_head", out)
        elif c.tie_embeddings:
            # Gemm(transB=1) on the embedding table: the table is stored once.
            self.bits["lm_head"], self.methods["lm_head"] = self.bits["embed"], self.methods["embed"]
            flat = self.node("Reshape", [h, self.const_i64("/head/flat", [-1, c.d_model])])[0]
            y = self.node("Gemm", [flat, "model.embed_tokens.weight"], transB=1)[0]
            hs = self.node("Shape", [h], start=0, end=2)[0]
            shp = self.node("Concat", [hs, self.const_i64("/head/vocab", [c.vocab_size])], axis=0)[0]
            self.node("Reshape", [y, shp], [out])
        else:
            self.node(
                "MatMul", [h, self.init("lm_head.weight", np.ascontiguousarray(self.float_weight("lm_head").T.astype(self.fdt)))], [out]
            )
        if to_f32:
            self.node("Cast", [out], ["logits"], to=TensorProto.FLOAT)


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    cons: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for x in n.input:
            if x:
                cons.setdefault(x, []).append(n)
    return cons


def weight_bytes_per_token(model: onnx.ModelProto) -> int:
    """Bytes of ``model``'s initializers one single-token decode step reads (see :class:`GraphInfo`)."""
    cons = _consumers(model)
    total = 0
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        users = cons.get(t.name, [])
        # an embedding table (and GatherBlockQuantized's scales / zero points): one row per token
        gather_only = bool(users) and all(u.op_type in ("Gather", "GatherBlockQuantized") and u.input[1] != t.name for u in users)
        if gather_only or t.name in ("cos_cache", "sin_cache"):
            total += arr.nbytes // arr.shape[0]  # one row
        else:
            total += arr.nbytes
    return int(total)


def build_decoder_graph(
    src: DecoderSource,
    plan: VariantPlan,
    out_path: Path,
    *,
    all_logits: bool = False,
    weights: Mapping[str, QuantizedWeight] | None = None,
) -> GraphInfo:
    """Write ``src`` as the ONNX decoder of the module's contract to ``out_path`` (one file, no external data).

    ``weights`` are pre-quantized weights by canonical name (:func:`quantize_decoder`'s output);
    missing ones are quantized here as ``plan`` says.
    """
    c = src.config
    if c.n_heads % c.n_kv_heads:
        raise UnsupportedModelError(f"n_heads ({c.n_heads}) must be a multiple of n_kv_heads ({c.n_kv_heads})")
    if c.head_dim % 2:
        raise UnsupportedModelError(f"head_dim must be even for rotary embedding, found {c.head_dim}")
    if not plan.quantized and weights:
        raise LLMConvertError(f"a {plan.precision} graph takes no quantized weights, {len(weights)} given")
    b = _Builder(src, plan, weights)
    model = b.build(all_logits)
    out_path = Path(out_path)
    data = model.SerializeToString()
    if len(data) >= 2**31:
        raise UnsupportedModelError(
            f"the {plan.precision} graph is {len(data)} bytes; over 2 GB needs external data, which this builder does not write"
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out_path)
    ops = Counter((n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}") for n in model.graph.node)
    total = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    invariant = (not plan.quantized) or plan.accuracy_level in (0, 1)
    return GraphInfo(
        path=out_path,
        opset=OPSET,
        ops=dict(ops),
        weight_bytes_per_token=weight_bytes_per_token(model),
        total_initializer_bytes=int(total),
        tensor_bits=dict(b.bits),
        tensor_methods=dict(b.methods),
        batch_invariant=invariant,
        precision=plan.precision,
        kv_dtype=plan.kv,
        all_logits=all_logits,
    )


# -- running a graph with numpy feeds ---------------------------------------------------------------
def empty_kv(cfg: DecoderConfig, max_len: int, dtype: Any = np.float32, batch: int = 1) -> dict[str, np.ndarray]:
    """Zeroed ``past_key_values.{i}.key|value`` arrays ``[batch, n_kv_heads, max_len, head_dim]``."""
    if max_len > cfg.context_length:
        raise LLMConvertError(f"max_len {max_len} exceeds the model's context length {cfg.context_length} (the rotary caches' size)")
    shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    return {f"past_key_values.{i}.{kv}": np.zeros(shape, dtype=dtype) for i in range(cfg.n_layers) for kv in ("key", "value")}


def session_feeds(
    cfg: DecoderConfig,
    ids: Sequence[int] | np.ndarray,
    past_len: int,
    max_len: int,
    kv: Mapping[str, np.ndarray] | None = None,
    kv_dtype: Any = np.float32,
) -> dict[str, np.ndarray]:
    """Feeds for one call: ``ids`` (the new tokens, batch 1) after ``past_len`` cached ones.

    ``kv`` are the past arrays (``[1, kv_heads, max_len, head_dim]``: the previous call's
    ``present.*`` outputs renamed ``past_key_values.*``), or None for a first call (zeros).
    ``attention_mask`` is ``past_len + len(ids)`` ones.
    """
    ids_a = np.asarray(ids, dtype=np.int64).reshape(1, -1)
    if past_len + ids_a.shape[1] > max_len:
        raise LLMConvertError(f"past ({past_len}) + new ({ids_a.shape[1]}) tokens exceed the KV buffer max_len {max_len}")
    feeds: dict[str, np.ndarray] = {
        "input_ids": ids_a,
        "attention_mask": np.ones((1, past_len + ids_a.shape[1]), dtype=np.int64),
    }
    feeds.update(dict(kv) if kv is not None else empty_kv(cfg, max_len, kv_dtype))
    return feeds


class DecodeSession:
    """Prefill and one-token steps through an ``onnxruntime.InferenceSession`` of a graph of this
    module, with numpy KV buffers of length ``max_len`` (each call's presents become the next pasts).
    """

    def __init__(self, session: Any, cfg: DecoderConfig, max_len: int, kv_dtype: Any = np.float32) -> None:
        self.session = session
        self.cfg = cfg
        self.max_len = max_len
        self.kv_dtype = kv_dtype
        self.out_names = [o.name for o in session.get_outputs()]
        self.reset()

    def reset(self) -> None:
        """Start a new sequence (zeroed KV, position 0)."""
        self.past_len = 0
        self.kv: dict[str, np.ndarray] | None = None

    def __call__(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Run ``ids`` after what is cached; returns the logits ``[rows, vocab]`` (rows: 1, or len(ids) for all_logits graphs)."""
        n = int(np.asarray(ids).size)
        feeds = session_feeds(self.cfg, ids, self.past_len, self.max_len, self.kv, self.kv_dtype)
        outs = dict(zip(self.out_names, self.session.run(self.out_names, feeds)))
        self.kv = {k.replace("present.", "past_key_values.", 1): v for k, v in outs.items() if k.startswith("present.")}
        self.past_len += n
        return np.asarray(outs["logits"][0], dtype=np.float32)

    def greedy(self, prompt_ids: Sequence[int], max_new: int) -> list[int]:
        """Greedy continuation of ``prompt_ids`` (from an empty cache): ``max_new`` token ids."""
        self.reset()
        logits = self(prompt_ids)
        out: list[int] = []
        while len(out) < max_new:
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            if len(out) < max_new:
                logits = self([tok])
        return out
