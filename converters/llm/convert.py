"""``edge-convert llm SOURCE --to int4,int8[,fp16,fp32] --out PKG``: the whole job.

1. Read the source (GGUF file or Hugging Face folder) into a :class:`~.spec.DecoderSource`.
2. Tokenize the held-out text (``--eval-text``; default: CPython's documentation topics).
3. Build the float32 reference as an ``all_logits`` graph and measure it teacher-forced: its
   perplexity is the reference every variant is gated against.
4. For each precision asked for, quantize, build an ``all_logits`` graph and measure perplexity and
   top-1 agreement with the reference. For int4 every method in ``int4_methods`` (RTN, HQQ, GPTQ,
   measured; "native" imports a GGUF's own blocks exactly); if no pure int4 passes its gate, a
   mixed-precision search (the head, then each projection class in int8, measured; classes added by
   the perplexity they save until the gate passes) on the best method.
5. Gate each variant (``perplexity_gap`` <= int8 2 %, int4 10 %, fp16 1 % by default; ``gates``
   overrides); a failing one is dropped, or kept and marked with ``force``.
6. Build the runtime graph (last position only), time TTFT/TPOT on this machine, write the package
   (``edge-model.toml``, the ``.onnx`` files, ``tokenizer.json``, ``chat_template.jinja``,
   ``conversion-report.json`` with every candidate's figures) and open it to prove it verifies.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from edge_sdk.package import (
    MANIFEST_NAME,
    FileRef,
    Gate,
    GenerationSpec,
    Manifest,
    ModelPackage,
    Quality,
    TensorSpec,
    Variant,
    VariantGeneration,
    file_ref,
)

from .evaluate import TeacherForced, agreement, default_eval_text, teacher_forced, time_decoder
from .graph import GraphInfo, VariantPlan, build_decoder_graph, linear_names, quantize_decoder, quantize_tensor
from .native import native_overrides
from .quant import METHODS, QuantizedWeight
from .reference import ReferenceDecoder
from .sources import read_source
from .spec import DecoderSource, LLMConvertError

__all__ = ["DEFAULT_GATES", "LLMConvertOptions", "LLMConvertResult", "convert_llm"]

#: Maximum perplexity gap (relative to the float reference) per precision.
DEFAULT_GATES = {"fp32": 0.0005, "fp16": 0.01, "int8": 0.02, "int4": 0.10}
TARGETS = ("int4", "int8", "fp16", "fp32")
#: int4 quantizers: ONNX Runtime-style RTN (asymmetric / symmetric), HQQ, GPTQ, and "native": a GGUF
#: file's own Q4_0/Q4_1/Q8_0 blocks imported exactly (:mod:`.native`; other tensors by HQQ).
INT4_METHODS = (*METHODS, "native")
_BITS = {"int4": 4, "int8": 8, "fp16": 16, "fp32": 32}


@dataclass(frozen=True)
class LLMConvertOptions:
    """What ``edge-convert llm`` was asked for (see the module docs)."""

    targets: tuple[str, ...] = ("int4",)
    eval_text: str | None = None
    eval_tokens: int = 512
    window: int = 256
    int4_methods: tuple[str, ...] = ("native", "rtn", "hqq", "gptq")
    mixed: str = "auto"  # mixed precision by measured sensitivity: "auto" = searched when no pure int4 passes its gate; "always"; "never"
    block_size: int = 32
    accuracy_level: int = 4
    gates: Mapping[str, float] = field(default_factory=dict)
    force: bool = False
    calib_tokens: int = 256
    threads: int | None = None
    name: str | None = None
    version: str = "1"
    timing: bool = True
    bench_prompt_tokens: int = 64
    bench_new_tokens: int = 32
    overwrite: bool = False
    prefer: str = "perplexity"  # among int4 candidates that pass: "perplexity" (lowest) or "speed" (lowest measured TPOT)
    kv_dtype: str = ""  # "" (the compute type), "float32" or "float16" (half the KV bytes per token)
    #: Keep only the first N decoder layers (and the final norm and head): a self-speculation draft
    #: of the full model that shares its tokenizer. Measured and gated against its own float reference.
    draft_layers: int | None = None

    def __post_init__(self) -> None:
        if self.kv_dtype not in ("", "float32", "float16"):
            raise LLMConvertError(f"--kv-dtype: expected float32 or float16, got {self.kv_dtype!r}")
        if self.prefer not in ("perplexity", "speed"):
            raise LLMConvertError(f"--prefer: expected perplexity or speed, got {self.prefer!r}")
        if self.draft_layers is not None and (isinstance(self.draft_layers, bool) or not isinstance(self.draft_layers, int) or self.draft_layers < 1):
            raise LLMConvertError(f"--draft-layers: expected an int >= 1, got {self.draft_layers!r}")
        bad = [t for t in self.targets if t not in TARGETS]
        if bad or not self.targets:
            raise LLMConvertError(f"--to: expected a comma list of {list(TARGETS)}, got {list(self.targets)}")
        badm = [m for m in self.int4_methods if m not in INT4_METHODS]
        if badm or not self.int4_methods:
            raise LLMConvertError(f"--int4-methods: expected a comma list of {list(INT4_METHODS)}, got {list(self.int4_methods)}")
        if self.mixed not in ("auto", "always", "never"):
            raise LLMConvertError(f"--mixed: expected auto, always or never, got {self.mixed!r}")
        for k, v in self.gates.items():
            if k not in TARGETS or not (isinstance(v, (int, float)) and v >= 0):
                raise LLMConvertError(f"--gate: expected PRECISION=MAX_PERPLEXITY_GAP with precision in {list(TARGETS)} and gap >= 0, got {k}={v!r}")
        if self.eval_tokens < 16 or self.window < 8:
            raise LLMConvertError(f"eval_tokens/window: expected >= 16 / >= 8, got {self.eval_tokens} / {self.window}")

    def gate(self, precision: str) -> float:
        """The maximum perplexity gap for ``precision`` (``gates``, else :data:`DEFAULT_GATES`)."""
        return float(self.gates.get(precision, DEFAULT_GATES[precision]))


@dataclass
class Candidate:
    """One measured build: a precision and method (and mixed-precision tensors)."""

    precision: str
    method: str
    overrides: dict[str, int]
    perplexity: float
    perplexity_gap: float
    top1_agreement: float
    convert_s: float
    weights: dict[str, QuantizedWeight] | None = None
    info: GraphInfo | None = None
    name: str = ""
    tpot_ms: float | None = None

    @property
    def label(self) -> str:
        return self.name or f"{self.precision}-{self.method}" + ("-mixed" if self.overrides and self.method != "native" else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "precision": self.precision,
            "method": self.method,
            "tpot_ms": None if self.tpot_ms is None else round(self.tpot_ms, 3),
            "mixed_int8_tensors": sorted(k for k, b in self.overrides.items() if b == 8),
            "perplexity": round(self.perplexity, 4),
            "perplexity_gap": round(self.perplexity_gap, 5),
            "top1_agreement": round(self.top1_agreement, 4),
            "convert_s": round(self.convert_s, 2),
        }


@dataclass(frozen=True)
class LLMConvertResult:
    """What was written: the package folder, its manifest, and the report (every candidate)."""

    out: Path
    manifest: Manifest
    report: dict[str, Any]


def _log(log: Callable[[str], None] | None, msg: str) -> None:
    if log is not None:
        log(msg)


def _eval_ids(src: DecoderSource, text: str, n: int) -> list[int]:
    from edge_sdk.generation.text import Tokenizer

    tok = Tokenizer(src.tokenizer_json)
    ids = tok.encode(text)
    if len(ids) < 16:
        raise LLMConvertError(f"eval text: {len(ids)} tokens; at least 16 are needed")
    return ids[:n]


def _plan(precision: str, opts: LLMConvertOptions, method: str = "rtn", overrides: Mapping[str, int] | None = None, hessians: Any = None) -> VariantPlan:
    if precision in ("fp32", "fp16"):
        return VariantPlan(precision=precision, kv_dtype=opts.kv_dtype if precision == "fp32" else "")
    return VariantPlan(
        precision=precision,
        block_size=opts.block_size,
        accuracy_level=opts.accuracy_level,
        method=method,
        overrides=dict(overrides or {}),
        hessians=hessians,
        kv_dtype=opts.kv_dtype,
    )


def _measure(src: DecoderSource, plan: VariantPlan, work: Path, ids: list[int], opts: LLMConvertOptions, ref: TeacherForced | None, weights: dict[str, QuantizedWeight] | None) -> tuple[TeacherForced, GraphInfo]:
    path = work / f"eval-{plan.precision}-{plan.method}-{len(plan.overrides)}.onnx"
    info = build_decoder_graph(src, plan, path, all_logits=True, weights=weights)
    try:
        tf = teacher_forced(path, src.config, ids, window=opts.window, threads=opts.threads, kv_dtype=np.float16 if plan.kv == "float16" else np.float32)
    finally:
        path.unlink(missing_ok=True)
    return tf, info


#: Projection classes whose sensitivity the mixed-precision search measures (each kept in 8 bits in turn).
CLASSES = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


class _WeightCache:
    """Quantized tensors by (name, bits, method): a candidate that differs from another in a few
    tensors' bits quantizes only those (HQQ of a 135M model takes ~20 s)."""

    def __init__(self, src: DecoderSource) -> None:
        self.src = src
        self._w: dict[tuple[str, int, str], QuantizedWeight] = {}

    def weights(self, plan: VariantPlan) -> dict[str, QuantizedWeight]:
        out: dict[str, QuantizedWeight] = {}
        for name in linear_names(self.src.config):
            bits = plan.bits_for(name)
            assert bits is not None
            # 8 bits are near lossless by plain rounding; the chosen method is for the 4-bit tensors.
            method = plan.method if bits == 4 or plan.method == "native" else "rtn"
            key = (name, bits, method)
            if key not in self._w:
                one = VariantPlan(plan.precision, plan.block_size, plan.accuracy_level, method, {name: bits}, hessians=plan.hessians)
                self._w[key] = quantize_tensor(self.src, one, name)
            out[name] = self._w[key]
        if plan.quantize_embedding:
            out["embed"] = out["lm_head"] if self.src.config.tie_embeddings else quantize_tensor(self.src, plan, "embed")
        return out


def _candidate(
    src: DecoderSource,
    precision: str,
    method: str,
    overrides: Mapping[str, int],
    opts: LLMConvertOptions,
    work: Path,
    ids: list[int],
    ref: TeacherForced,
    hessians: Any,
    log: Callable[[str], None] | None,
    cache: _WeightCache | None = None,
    label: str = "",
) -> Candidate:
    t0 = time.perf_counter()
    plan = _plan(precision, opts, method, overrides, hessians if method == "gptq" else None)
    weights = None
    if plan.quantized:
        weights = cache.weights(plan) if cache is not None else quantize_decoder(src, plan)
    tf, info = _measure(src, plan, work, ids, opts, ref, weights)
    c = Candidate(precision, method if plan.quantized else "", dict(overrides), tf.perplexity, tf.perplexity / ref.perplexity - 1.0, agreement(tf, ref), time.perf_counter() - t0, weights, info, label)
    _log(log, f"  {c.label:34s} perplexity {c.perplexity:8.3f} ({c.perplexity_gap:+.2%}), top-1 agreement {c.top1_agreement:.3f} [{c.convert_s:.1f} s]")
    return c


def _class_overrides(cfg: Any, classes: Sequence[str]) -> dict[str, int]:
    return {f"layers.{i}.{p}": 8 for i in range(cfg.n_layers) for c in classes for p in CLASSES[c]}


def _mixed_search(
    src: DecoderSource, base: str, opts: LLMConvertOptions, work: Path, ids: list[int], ref: TeacherForced, hess: Any, log: Callable[[str], None] | None, cache: _WeightCache
) -> list[Candidate]:
    """Mixed precision by measured sensitivity: the LM head in 8 bits, then each projection class in
    8 bits on its own; classes are then added in order of the perplexity they save until the gate
    passes (llama.cpp's Q4_K_M keeps a fixed set -- head, attn_v, ffn_down -- in more bits; here the
    set is measured per model)."""
    gate = opts.gate("int4")
    head = {"lm_head": 8}
    out = [_candidate(src, "int4", base, head, opts, work, ids, ref, hess, log, cache, f"int4-{base} + head int8")]
    if out[0].perplexity_gap <= gate:
        return out
    single = {}
    for cls in CLASSES:
        c = _candidate(src, "int4", base, {**head, **_class_overrides(src.config, [cls])}, opts, work, ids, ref, hess, log, cache, f"int4-{base} + head, {cls} int8")
        out.append(c)
        single[cls] = c.perplexity
    order = sorted(CLASSES, key=lambda k: single[k])
    if min(single.values()) - 1e-12 <= ref.perplexity * (1 + gate):
        return out
    for n in range(2, len(order) + 1):
        chosen = order[:n]
        c = _candidate(src, "int4", base, {**head, **_class_overrides(src.config, chosen)}, opts, work, ids, ref, hess, log, cache, f"int4-{base} + head, {'+'.join(chosen)} int8")
        out.append(c)
        if c.perplexity_gap <= gate:
            break
    return out


def _fastest(src: DecoderSource, cands: Sequence[Candidate], opts: LLMConvertOptions, work: Path, log: Callable[[str], None] | None) -> Candidate:
    """Among candidates that passed, the one with the lowest measured TPOT (built once each, timed)."""
    if len(cands) == 1 or not opts.timing:
        return min(cands, key=lambda c: (c.info.weight_bytes_per_token if c.info else 0, c.perplexity))
    best: tuple[float, Candidate] | None = None
    for c in cands:
        plan = _plan(c.precision, opts, c.method or "rtn", c.overrides)
        path = work / "timing.onnx"
        info = build_decoder_graph(src, plan, path, weights=c.weights)
        t = time_decoder(path.read_bytes(), src.config, info.kv_dtype, prompt_tokens=opts.bench_prompt_tokens, new_tokens=opts.bench_new_tokens, threads=opts.threads)
        path.unlink(missing_ok=True)
        c.tpot_ms = t.tpot_ms
        _log(log, f"  {c.label:34s} passes; TPOT {t.tpot_ms:.2f} ms")
        if best is None or t.tpot_ms < best[0]:
            best = (t.tpot_ms, c)
    assert best is not None
    return best[1]


def _hessians(src: DecoderSource, text_ids: list[int], n: int, log: Callable[[str], None] | None) -> dict[str, np.ndarray]:
    t0 = time.perf_counter()
    ref = ReferenceDecoder(src)
    seqs = [text_ids[i : i + 128] for i in range(0, min(n, len(text_ids)), 128)]
    h = ref.collect_hessians(seqs)
    _log(log, f"  GPTQ calibration: Hessians of {len(h)} projections over {sum(len(s) for s in seqs)} tokens [{time.perf_counter() - t0:.1f} s]")
    return h


def _machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.machine()} {model or platform.processor()} ({os.cpu_count()} CPUs)"


def _tensor_specs(src: DecoderSource) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ctx = src.config.context_length
    ins = [
        TensorSpec("input_ids", "int64", ("batch", "seq"), dim_bounds=(("batch", 1, 1), ("seq", 1, ctx))),
        TensorSpec("attention_mask", "int64", ("batch", "total"), dim_bounds=(("batch", 1, 1), ("total", 1, ctx))),
    ]
    outs = [TensorSpec("logits", "float32", ("batch", 1, src.config.vocab_size))]
    return ins, outs


def convert_llm(source: str | os.PathLike[str], out: str | os.PathLike[str], opts: LLMConvertOptions | None = None, *, log: Callable[[str], None] | None = None) -> LLMConvertResult:
    """Convert ``source`` to a text-generation package at ``out`` (see the module docs). Raises
    LLMConvertError subclasses; writes nothing at ``out`` unless every kept variant is built."""
    opts = opts or LLMConvertOptions()
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not opts.overwrite:
        raise LLMConvertError(f"--out {out}: exists and is not empty (pass --overwrite)")
    t_all = time.perf_counter()
    src = read_source(source)
    cfg = src.config
    if opts.draft_layers is not None:
        if opts.draft_layers >= cfg.n_layers:
            raise LLMConvertError(f"--draft-layers {opts.draft_layers}: the model has {cfg.n_layers} layers; a draft keeps fewer")
        cfg = replace(cfg, n_layers=opts.draft_layers)  # the graph, the reference and the measures read the first N
        src = replace(src, config=cfg)
    _log(log, f"{src.source_kind} {Path(str(source)).name}: {cfg.architecture}, {cfg.n_layers} layers, d_model {cfg.d_model}, heads {cfg.n_heads}/{cfg.n_kv_heads}, vocab {cfg.vocab_size}")
    text = opts.eval_text if opts.eval_text is not None else default_eval_text()
    all_ids = _eval_ids(src, text, len(text) + 1)
    ids = all_ids[: opts.eval_tokens]
    # GPTQ calibrates on text it is not measured on: the tokens after the eval slice, else the default text.
    calib = all_ids[opts.eval_tokens : opts.eval_tokens + opts.calib_tokens]
    if len(calib) < min(64, opts.calib_tokens):
        calib = _eval_ids(src, default_eval_text(200_000)[-20_000:], opts.calib_tokens)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".edge-convert-llm-", dir=out.parent))
    report: dict[str, Any] = {
        "source": str(source), "source_sha256": src.source_sha256, "eval_tokens": len(ids), "calib_tokens": len(calib), "window": opts.window,
        "machine": _machine(), "candidates": [],
    }  # fmt: skip
    try:
        t0 = time.perf_counter()
        ref, _ = _measure(src, VariantPlan(precision="fp32"), work, ids, opts, None, None)  # float32 KV: the reference
        _log(log, f"  {'fp32 (reference)':22s} perplexity {ref.perplexity:8.3f} over {ref.positions} positions [{time.perf_counter() - t0:.1f} s]")
        report["reference_perplexity"] = ref.perplexity
        chosen: dict[str, Candidate] = {}
        failed: dict[str, list[str]] = {}
        for precision in opts.targets:
            cands: list[Candidate] = []
            if precision == "fp32":
                cands.append(Candidate("fp32", "", {}, ref.perplexity, 0.0, 1.0, 0.0))
            elif precision in ("fp16", "int8"):
                cands.append(_candidate(src, precision, "rtn", {}, opts, work, ids, ref, None, log))
            else:
                hess = _hessians(src, calib, opts.calib_tokens, log) if "gptq" in opts.int4_methods else None
                cache = _WeightCache(src)
                for m in opts.int4_methods:
                    if m == "native":
                        nat = native_overrides(src)
                        if not nat:
                            _log(log, "  int4-native: the source stores no Q4_0/Q4_1/Q8_0 blocks to import; skipped")
                            continue
                        cands.append(_candidate(src, "int4", m, nat, opts, work, ids, ref, hess, log, cache))
                        continue
                    cands.append(_candidate(src, "int4", m, {}, opts, work, ids, ref, hess, log, cache))
                if not cands:
                    raise LLMConvertError(f"int4: none of the methods {list(opts.int4_methods)} applies to this source")
                pure = [c for c in cands if c.method != "native"]
                if pure and (opts.mixed == "always" or (opts.mixed == "auto" and min(c.perplexity_gap for c in pure) > opts.gate("int4"))):
                    base = min(pure, key=lambda c: c.perplexity).method
                    cands += _mixed_search(src, base, opts, work, ids, ref, hess, log, cache)
            report["candidates"] += [c.to_dict() for c in cands]
            gate = opts.gate(precision)
            passing = [c for c in cands if c.perplexity_gap <= gate]
            # Among the candidates that pass: the lowest perplexity (prefer="perplexity"), or the fastest
            # measured (prefer="speed"); with none passing, the lowest perplexity (kept only with --force).
            if passing and opts.prefer == "speed":
                pick = _fastest(src, passing, opts, work, log)
            else:
                pick = min(passing or cands, key=lambda c: c.perplexity)
            for c in cands:
                if c.tpot_ms is not None:
                    next(r for r in report["candidates"] if r["label"] == c.label and r["precision"] == c.precision)["tpot_ms"] = round(c.tpot_ms, 3)
            if not passing:
                failed[precision] = [f"perplexity_gap {pick.perplexity_gap:.4f} > {gate}"]
                if not opts.force:
                    _log(log, f"  {precision}: no candidate passes the gate (best {pick.label} {pick.perplexity_gap:+.2%} > {gate:.0%}); left out (--force keeps it)")
                    continue
            for c in cands:
                if c is not pick:
                    c.weights = None  # free the memory of the candidates not kept
            chosen[precision] = pick
        if not chosen:
            raise LLMConvertError(f"no variant passed its quality gate: {failed}; see the figures above, relax --gate or pass --force")
        manifest = _write_package(src, chosen, failed, ref, opts, work, out, report, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["convert_s"] = round(time.perf_counter() - t_all, 1)
    (out / "conversion-report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    ModelPackage.open(out)  # proves every digest verifies
    return LLMConvertResult(out, manifest, report)


def _write_package(
    src: DecoderSource,
    chosen: Mapping[str, Candidate],
    failed: Mapping[str, list[str]],
    ref: TeacherForced,
    opts: LLMConvertOptions,
    work: Path,
    out: Path,
    report: dict[str, Any],
    log: Callable[[str], None] | None,
) -> Manifest:
    cfg = src.config
    stage = work / "package"
    stage.mkdir()
    (stage / "tokenizer.json").write_text(src.tokenizer_json, encoding="utf-8")
    template_ref: FileRef | None = None
    if src.chat_template:
        (stage / "chat_template.jinja").write_text(src.chat_template, encoding="utf-8")
        template_ref = file_ref(stage, "chat_template.jinja")
    variants: list[Variant] = []
    machine = _machine()
    ref_id = "fp32" if "fp32" in chosen else None
    for precision in TARGETS:
        c = chosen.get(precision)
        if c is None:
            continue
        plan = _plan(precision, opts, c.method or "rtn", c.overrides)
        fname = f"model-{precision}.onnx"
        info = build_decoder_graph(src, plan, stage / fname, all_logits=False, weights=c.weights)
        c.weights = None
        timing = None
        if opts.timing:
            timing = time_decoder((stage / fname).read_bytes(), cfg, info.kv_dtype, prompt_tokens=opts.bench_prompt_tokens, new_tokens=opts.bench_new_tokens, threads=opts.threads)
            _log(log, f"  {precision}: TTFT {timing.ttft_ms:.1f} ms ({timing.prompt_tokens}-token prompt), TPOT {timing.tpot_ms:.2f} ms ({1000 / timing.tpot_ms:.0f} tokens/s) on {timing.threads} threads")
        kv_bytes = 2 if info.kv_dtype == "float16" else 4
        gate_max = opts.gate(precision)
        fails = failed.get(precision, [])
        gen = VariantGeneration(
            bits=_BITS[precision],
            kv_dtype=info.kv_dtype,
            kv_bytes_per_token=cfg.kv_bytes_per_token(kv_bytes),
            weight_bytes_per_token=info.weight_bytes_per_token,
            method=c.method,
            block_size=opts.block_size if plan.quantized else None,
            accuracy_level=opts.accuracy_level if plan.quantized else None,
            int8_tensors=tuple(sorted(k for k, b in c.overrides.items() if b == 8)),
            batch_invariant=info.batch_invariant,
            ttft_ms=None if timing is None else round(timing.ttft_ms, 2),
            tpot_ms=None if timing is None else round(timing.tpot_ms, 3),
            bench_prompt_tokens=None if timing is None else timing.prompt_tokens,
            bench_threads=None if timing is None else timing.threads,
            bench_machine=machine if timing is not None else "",
        )
        ref_name = "fp32" if ref_id else "fp32 (reference, not packaged)"
        quality = Quality(
            reference=None if precision == "fp32" else ref_name,
            top1_agreement=round(c.top1_agreement, 5),
            perplexity=round(c.perplexity, 5),
            perplexity_gap=round(c.perplexity_gap, 6),
            metric="perplexity",
            value=round(c.perplexity, 5),
            dataset=f"{'--eval-text' if opts.eval_text is not None else 'pydoc_data.topics'} ({ref.positions + 1} tokens, windows of {opts.window})",
            samples=ref.positions,
        )
        variants.append(
            Variant(
                id=precision,
                file=fname,
                backend="onnxruntime",
                precision=precision,
                sha256=file_ref(stage, fname).sha256,
                size=(stage / fname).stat().st_size,
                reference=precision == "fp32",
                quality=quality,
                gate=Gate(passed=not fails, thresholds=(("perplexity_gap", gate_max),), failures=tuple(fails), forced=bool(fails)),
                generation=gen,
            )
        )
        report.setdefault("variants", {})[precision] = {"candidate": c.label, "weight_bytes_per_token": info.weight_bytes_per_token, "ops": info.ops, **({} if timing is None else timing.__dict__)}
    ins, outs = _tensor_specs(src)
    spec = GenerationSpec(
        architecture=cfg.architecture,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        context_length=cfg.context_length,
        tokenizer=file_ref(stage, "tokenizer.json"),
        chat_template=template_ref,
        bos_token_id=cfg.bos_token_id,
        eos_token_ids=tuple(cfg.eos_token_ids),
        pad_token_id=cfg.pad_token_id,
        add_bos=bool(getattr(src, "add_bos", False)) and cfg.bos_token_id is not None,
        source=f"{Path(src.source_path).name} sha256 {src.source_sha256}"
        + (f" (its first {cfg.n_layers} layers: a speculative-decoding draft)" if opts.draft_layers else ""),
    )
    manifest = Manifest(
        name=opts.name or (src.name or Path(src.source_path).stem).replace(" ", "-").lower() + (f"-draft{cfg.n_layers}" if opts.draft_layers else ""),
        version=opts.version,
        task="text-generation",
        description=f"{cfg.architecture} decoder, {cfg.n_layers} layers, converted by edge-convert llm from {Path(src.source_path).name}",
        inputs=tuple(ins),
        outputs=tuple(outs),
        variants=tuple(variants),
        generation=spec,
    )
    Manifest.from_dict(manifest.to_dict())  # the same checks a reader makes
    (stage / MANIFEST_NAME).write_text(manifest.to_toml(), encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    shutil.move(str(stage), str(out))
    return manifest


def parse_gates(items: Sequence[str]) -> dict[str, float]:
    """``--gate int4=0.12`` items -> {precision: max perplexity gap}."""
    out: dict[str, float] = {}
    for it in items:
        k, sep, v = it.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise LLMConvertError(f"--gate: expected PRECISION=MAX_PERPLEXITY_GAP (e.g. int4=0.10), got {it!r}") from None
        if not sep:
            raise LLMConvertError(f"--gate: expected PRECISION=MAX_PERPLEXITY_GAP (e.g. int4=0.10), got {it!r}")
    return out
