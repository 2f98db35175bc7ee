"""``edge-convert quantize``: float ONNX model -> measured, gated model package.

1. Read the model's own signature (inputs/outputs), add dynamic-dim bounds and
   image preprocessing from the options; refuse anything but ONNX (an existing
   TFLite model can be added as a variant with ``tflite=``).
2. Load calibration data (and validation data, or hold out part of the
   calibration data) with :mod:`converters.calibration`.
3. Make each target with :mod:`converters.quantize`; measure each variant
   against the fp32 reference through ``edge_sdk.load`` (quality and latency,
   :mod:`converters.validate`); gate it; an int8 variant that fails is repaired
   by keeping its most sensitive nodes in float (:mod:`converters.repair`).
4. Write the package: passing variants (and failing ones only with ``force``,
   the failure recorded), each with its quality, gate and measured latency on
   this machine's profile; plus report.json / report.md / report.png.
5. Classification with labelled validation data: each variant's calibration
   (ECE, MCE, Brier, NLL; :mod:`converters.calibration_quality`) goes into the
   report with a reliability diagram per variant (``reliability_<id>.png``);
   with ``calibrate_temperature`` a softmax temperature is fitted per variant
   (on the calibration data when it is labelled, else on the validation data)
   and stored as the variant's ``temperature`` in the manifest.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from edge_sdk.package import Benchmark, Gate, ImagePreprocess, ModelPackage, Quality, TensorSpec
from edge_sdk.package.modelfile import precision_mismatch, scan_onnx, sniff_format

from .calibration_quality import diagram_name
from .errors import ConverterError
from .normalize import Normalized, NormalizeError, normalize
from .packaging import SignatureError, observed_bounds, onnx_tensor_specs, write_package
from .quantize import MIN_INT4_OPSET, MIN_QDQ_OPSET, Int4Options, Int8Options, QuantizeError, choose_int8_method, quantize_target
from .validate import (
    FALLBACK_GATE,
    MAXIMA,
    DetectionFormat,
    VariantReport,
    check_gate,
    compare,
    default_gate,
    detection_format,
    input_hw,
    per_sample,
    stack_outputs,
    validate_package,
)  # fmt: skip


class ConvertError(ConverterError, ValueError):
    """The conversion cannot go on; the message says why and what to change."""


@dataclass(frozen=True)
class ConvertOptions:
    """Everything ``convert`` can be told (the CLI builds one from its flags)."""

    targets: tuple[str, ...] = ("int8",)
    task: str = "raw"
    name: str | None = None
    version: str = "1.0.0"
    dims: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    preprocess: ImagePreprocess | None = None
    class_names: tuple[str, ...] = ()
    int8: Int8Options = Int8Options()
    int4: Int4Options = Int4Options()
    gate: Mapping[str, float] | None = None  # None: the task's default gate
    force: bool = False
    repair: bool = True
    max_keep_float: int = 8
    holdout: float = 0.25
    limit: int | None = 256
    threads: int | None = None
    profile: str | None = None
    overwrite: bool = False
    tflite: tuple[tuple[Path, str], ...] = ()  # (file, precision) of existing TFLite variants
    labels: Sequence[Any] | None = None  # validation labels (class indices or detection boxes)
    progress: bool = True
    calibrate_temperature: bool = False  # classification: fit a softmax temperature per variant, store it in the manifest
    blank: int = 0  # task sequence: the CTC blank class index
    detection_format: str = "auto"  # task detection without a decoder: how the raw head is read (validate.DETECTION_FORMATS)


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert` produced: the package folder, the report (as in ``report.json``), the variant ids written
    and those refused by their gate."""
    package: Path
    report: dict[str, Any]
    written: tuple[str, ...]
    refused: tuple[str, ...]


def _specs_from_model(data: bytes, opts: ConvertOptions, dims: Mapping[str, tuple[int, int]] | None = None, *, open_dims: bool = False) -> tuple[list[TensorSpec], list[TensorSpec]]:
    try:
        return onnx_tensor_specs(data, opts.dims if dims is None else dims, opts.preprocess, open_dims=open_dims)
    except SignatureError as e:
        raise ConvertError(str(e)) from e


def _model_labels(ds: Any, class_names: Sequence[str]) -> list[int] | None:
    """The data set's labels as the model's class indices. Folder labels are
    indices into the data set's own (sorted) class names; when the model's class
    names are known they are mapped by name, never assumed to share an order."""
    labels = getattr(ds, "labels", None)
    if labels is None:
        return None
    names = getattr(ds, "class_names", None)
    if not names or not class_names or tuple(names) == tuple(class_names):
        return list(labels)
    missing = sorted(set(names) - set(class_names))
    if missing:
        raise ConvertError(f"data classes {missing} are not among the model's class names {list(class_names)}")
    return [class_names.index(names[i]) for i in labels]


def _ort_outputs(path: Path, samples: Sequence[Mapping[str, np.ndarray]], threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    per: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for x in samples:
        for n, y in zip(names, s.run(None, dict(x))):
            per[n].append(y)
    return stack_outputs(per)


def _machine() -> str:
    """This machine as ``Benchmark.machine`` records it: what selection compares (``edge_sdk.selection.same_machine_class``)."""
    from edge_sdk.profiles import read_facts
    from edge_sdk.selection import describe_machine

    return describe_machine(read_facts("/"))


def convert(model: str | Path, calibration: str | Path, out: str | Path, opts: ConvertOptions, validation: str | Path | None = None) -> ConvertResult:
    """Quantize ``model`` into a package at ``out``. Raises ConvertError,
    CalibrationError, QuantizeError; never leaves a half-written ``out``."""
    from .calibration import load_data

    src, out = Path(model), Path(out)
    if not src.is_file():
        raise ConvertError(f"model {str(src)!r} does not exist")
    data = src.read_bytes()
    kind = sniff_format(data)
    if kind == "tflite":  # a float TFLite model (MediaPipe's): quantize its exact ONNX translation, keep the original as a variant
        from .tflite_import import TFLiteToOnnxError, translate

        try:
            data = translate(data).SerializeToString()
        except TFLiteToOnnxError as e:
            raise ConvertError(f"{src.name}: a TFLite model is quantized through its ONNX translation, which cannot be made: {e}") from e
        opts = replace(opts, tflite=((src, "fp32"), *opts.tflite))
        kind = "onnx"
    if kind != "onnx":
        what = {"pickle": "a Python pickle (runs code when loaded; export the model to ONNX)"}
        raise ConvertError(f"{src.name}: expected an fp32 ONNX or TFLite model, got {what.get(kind, kind)}")
    if out.exists() and any(out.iterdir()) and not opts.overwrite:
        raise ConvertError(f"{out} exists and is not empty; pass --overwrite to replace it")
    for f, _ in opts.tflite:
        if sniff_format(Path(f).read_bytes()[:64] if Path(f).is_file() else b"") != "tflite":
            raise ConvertError(f"--tflite {f}: not a TFLite file")

    # 1. graph normalisation: the normalised model is the fp32 reference from here on
    need = [(MIN_QDQ_OPSET, "per-channel QDQ int8")] if "int8" in opts.targets else []
    if "int4" in opts.targets:
        need.append((MIN_INT4_OPSET, "MatMulNBits int4"))
    min_opset, why_opset = max(need) if need else (0, "")
    try:
        norm = normalize(data, min_opset=min_opset, why_opset=why_opset, source=src.name)
    except NormalizeError as e:
        raise ConvertError(str(e)) from e
    notes = list(norm.notes)

    # 2. the data, read against the model's inputs; dynamic dims without --dim are bounded by what the data shows
    open_ins, _ = _specs_from_model(norm.data, opts, open_dims=True)
    # the dynamic input dims still open (an image input's H and W are fixed by --preprocess)
    missing = list(dict.fromkeys(d for sp in open_ins for d in sp.shape if isinstance(d, str) and d not in opts.dims))
    calib = load_data(calibration, open_ins, limit=opts.limit, progress=opts.progress)
    val = load_data(validation, open_ins, limit=opts.limit, progress=opts.progress) if validation is not None else None
    for ds in (calib, val):
        notes.extend(n for n in (ds.notes if ds is not None else ()) if n not in notes)
    assumed: dict[str, tuple[int, int]] = {}
    if missing:
        assumed = observed_bounds(open_ins, missing, [*calib.samples, *(val.samples if val is not None else ())])
        for dn in missing:
            if dn not in assumed:
                raise ConvertError(f"dynamic dim {dn} has no --dim and the data shows no size for it; give --dim {dn}=MIN:MAX")
            lo, hi = assumed[dn]
            seen = f"{len(calib)} calibration" + (f" and {len(val)} validation" if val is not None else "") + " samples"
            notes.append(f"assumed dim {dn} = {lo}:{hi} from {seen} (give --dim {dn}=MIN:MAX to widen it)")
    ins, outs = _specs_from_model(norm.data, opts, {**opts.dims, **assumed})
    if val is None:
        if len(calib) < 4:
            raise ConvertError(f"{calibration}: {len(calib)} samples; give --validation data or at least 4 calibration samples to hold some out")
        calib, val = calib.split(opts.holdout)
    class_names = opts.class_names or tuple(getattr(calib, "class_names", None) or ())
    labels = opts.labels if opts.labels is not None else _model_labels(val, class_names)
    if opts.calibrate_temperature and (opts.task != "classification" or labels is None):
        raise ConvertError(
            "--calibrate-temperature needs --task classification and labelled validation data "
            "(class subfolders, labels.csv, .npz 'labels', or --labels)"
        )
    gate = dict(opts.gate) if opts.gate is not None else default_gate(opts.task)

    from edge_sdk.profiles import resolve_profile

    det = resolve_profile(opts.profile)
    threads = opts.threads or min(det.profile.runtime.threads, det.facts.usable_cpus or det.profile.runtime.threads)
    name = opts.name or src.stem
    work = Path(tempfile.mkdtemp(prefix="edge-convert-"))
    try:
        return _convert(
            src, data, norm, notes, out, opts, ins, outs, calib, val, labels, class_names, gate, det, threads, name, work,
            str(calibration), str(validation or f"{calibration} (held-out {opts.holdout:.0%})"),
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_normalised(src_data: bytes, norm: Normalized, ref_file: Path, ref_out: Mapping[str, Any], samples: Sequence[Mapping[str, np.ndarray]], threads: int, notes: list[str], src_name: str) -> Mapping[str, Any]:
    """The normalised reference must compute what the input model computes: compare both on ``samples``. When the
    opset change made a difference, normalise again without it; returns the reference outputs to use."""
    orig = ref_file.with_name("model_input.onnx")
    orig.write_bytes(src_data)
    k = min(4, len(samples))
    try:
        want = _ort_outputs(orig, samples[:k], threads)
    except Exception as e:  # ONNX Runtime cannot run the input as exported: nothing to compare with
        notes.append(f"the input model does not run as exported in ONNX Runtime ({str(e)[:150]}); the normalised model is the reference")
        return ref_out
    got = {n: v[:k] if isinstance(v, np.ndarray) else v[:k] for n, v in ref_out.items()}
    diff = _max_diff(want, got)
    if diff <= 1e-5:
        notes.append(f"normalised model checked against the input on {k} validation sample(s): max abs difference {diff:.3g}")
        return ref_out
    if norm.opset != norm.opset_from:
        again = normalize(src_data, source=src_name)
        ref_file.write_bytes(again.data)
        new_out = _ort_outputs(ref_file, samples, threads)
        d2 = _max_diff(want, {n: v[:k] if isinstance(v, np.ndarray) else v[:k] for n, v in new_out.items()})
        if d2 <= 1e-5:
            notes.append(f"opset kept at {norm.opset_from}: the model raised to opset {norm.opset} differed from the input by {diff:.3g}; the int8 step raises it on its own copy")
            return new_out
    raise ConvertError(f"{src_name}: the normalised model's outputs differ from the input's by {diff:.3g} (a converter bug; please report it with the model)")


def _max_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    d = 0.0
    for n in a:
        for x, y in zip(per_sample(a[n]), per_sample(b[n])):
            if x.shape != y.shape:
                return float("inf")
            if x.size:
                d = max(d, float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max() / max(1.0, float(np.abs(x).max()))))
    return d


def _margin(q: Quality, gate: Mapping[str, float]) -> float:
    """How far ``q`` is from failing ``gate``: the smallest relative margin over the thresholds (negative: fails)."""
    m = float("inf")
    for k, limit in gate.items():
        v = getattr(q, k)
        if v is None:
            return float("-inf")
        rel = (v - limit) / max(abs(limit), 1e-9)
        m = min(m, -rel if k in MAXIMA else rel)
    return m


CONV_OPS = ("Conv", "ConvTranspose")
MATMUL_OPS = ("MatMul", "Gemm")


def _has_ops(path: Path, ops: Sequence[str]) -> bool:
    """Whether the model at ``path`` has a node of one of ``ops`` (default domain, main graph)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return any(n.op_type in ops and n.domain in ("", "ai.onnx") for n in m.graph.node)


CANDIDATE_TIMING = {"rounds": 8, "per_round": 5, "budget_s": 8.0}  # int8 candidates: a shorter run than the final measurement


def _has_8bit_weights(path: Path) -> bool:
    """Whether the package check would accept the model as int8 (:func:`edge_sdk.package.modelfile.precision_mismatch`)."""
    info = scan_onnx(path.read_bytes())
    return precision_mismatch("int8", info.weights, "onnx", info.op_types) is None


def _time_candidates(
    cands: list[dict[str, Any]], ins: Sequence[TensorSpec], outs: Sequence[TensorSpec], opts: ConvertOptions, name: str, ref_file: Path,
    work: Path, det: Any, threads: int, samples: Sequence[Mapping[str, np.ndarray]],
) -> float:  # fmt: skip
    """Median latency of each candidate (``latency_ms`` set in place) and of fp32 (returned), through ``edge_sdk.load``
    on a staged package, interleaved like the final measurement (:meth:`Measurer.latencies`)."""
    from .validate import Measurer

    variants = [{"id": "fp32-onnx", "file": "model_fp32.onnx", "backend": "onnxruntime", "precision": "fp32", "reference": True}]
    files: dict[str, Path] = {"model_fp32.onnx": ref_file}
    for c in cands:
        variants.append({"id": f"int8-{c['kind']}", "file": c["file"].name, "backend": "onnxruntime", "precision": "int8"})
        files[c["file"].name] = c["file"]
    manifest = {"schema": 1, "name": name, "version": opts.version, "task": opts.task, "inputs": [x.to_dict() for x in ins], "outputs": [x.to_dict() for x in outs], "variants": variants}
    pkg = write_package(work / "int8-candidates", manifest, files, overwrite=True)
    assert isinstance(pkg, ModelPackage)
    meas = Measurer(pkg, det.profile, threads, work / "cache")
    try:
        lat = meas.latencies([v["id"] for v in variants], samples[0], **CANDIDATE_TIMING)  # type: ignore[arg-type]
    finally:
        meas.close()
    for c in cands:
        c["latency_ms"] = round(lat[f"int8-{c['kind']}"], 4)
    return round(lat["fp32-onnx"], 4)


def _candidate_rows(cands: Sequence[Mapping[str, Any]], best: Mapping[str, Any] | None, gate: Mapping[str, float], ref_ms: float | None = None) -> list[dict[str, Any]]:
    """The report's ``candidates`` entries."""
    rows = []
    for c in cands:
        q = c.get("q")
        row: dict[str, Any] = {
            "method": c["method"], "passed": bool(c.get("ok")), "chosen": c is best,
            "quality": {k: getattr(q, k) for k in gate if q is not None and getattr(q, k) is not None},
            "latency_ms": c.get("latency_ms"), "reference_latency_ms": ref_ms if c.get("latency_ms") is not None else None,
        }  # fmt: skip
        if "error" in c:
            row["error"] = c["error"]
        if c.get("why"):
            row["why"] = c["why"]
        elif "error" not in c and not c.get("ok"):
            row["why"] = "fails the gate: " + c.get("summary", "")
        rows.append(row)
    return rows


def _convert(
    src: Path, data: bytes, norm: Normalized, model_notes: list[str], out: Path, opts: ConvertOptions, ins: list[TensorSpec], outs: list[TensorSpec],
    calib: Any, val: Any, labels: Any, class_names: tuple[str, ...], gate: dict[str, float], det: Any, threads: int, name: str, work: Path,
    calib_name: str, val_name: str,
) -> ConvertResult:  # fmt: skip
    from .quantize import preprocess as ort_preprocess

    ref_file = work / "model_fp32.onnx"
    ref_file.write_bytes(norm.data)
    val_samples = list(val.samples)
    ref_out: Mapping[str, Any] = _ort_outputs(ref_file, val_samples, threads)
    if norm.changed:
        ref_out = _check_normalised(data, norm, ref_file, ref_out, val_samples, threads, model_notes, src.name)
    class_output = outs[0].name if opts.task == "classification" else None
    det_fmt: str | DetectionFormat = opts.detection_format
    if opts.task == "detection":  # one reading of the raw head for every candidate and variant, said once
        from .validate import ValidationError

        try:
            found = detection_format({k: per_sample(v)[0] for k, v in ref_out.items()}, opts.detection_format, input_hw(ins))
        except ValidationError as e:
            raise ConvertError(f"--detection-format: {e}") from e
        if found is not None:
            det_fmt = found
            model_notes.append(f"detection outputs read as {found.kind} ({found.why}); boxes with score >= {found.score_threshold:g}, then NMS, compared at IoU 0.5")

    def compare_to_ref(got: Mapping[str, Any]) -> Any:
        return compare(
            ref_out, got, task=opts.task, class_output=class_output, labels=labels, reference_id="fp32-onnx", dataset=val_name, blank=opts.blank,
            detection=det_fmt, input_hw=input_hw(ins),
        )  # fmt: skip

    if opts.gate is None:  # a task figure this model's outputs cannot give: gate on cosine, and say so
        self_q = compare_to_ref(ref_out)
        unmeasurable = [k for k in gate if getattr(self_q.quality, k) is None]
        if unmeasurable:
            model_notes.append(
                f"the {opts.task} gate's {', '.join(unmeasurable)} cannot be measured on this model's outputs ({'; '.join(self_q.notes) or 'no such output'}); "
                f"gated on {', '.join(f'{k} >= {v:g}' for k, v in FALLBACK_GATE.items())} instead"
            )
            gate.clear()
            gate.update(FALLBACK_GATE)
    prep, prep_error = ref_file, None
    if "int8" in opts.targets:
        try:
            (work / "prep").mkdir()
            prep = ort_preprocess(ref_file, work / "prep" / "prep.onnx", notes=model_notes)
        except QuantizeError as e:
            prep, prep_error = ref_file, str(e)

    def evaluate(path: Path) -> tuple[bool, str, Quality]:
        c = compare_to_ref(_ort_outputs(path, val_samples, threads))
        ok, fails = check_gate(c.quality, gate)
        summary = ", ".join(f"{k} {getattr(c.quality, k):.6g}" for k in gate if getattr(c.quality, k) is not None)
        return ok, summary + ("" if ok else f" (fails: {'; '.join(fails)})"), c.quality

    def requantize(path: Path, exclude: Sequence[str]) -> None:
        quantize_target("int8", prep, path, int8=replace(opts.int8, method="static", nodes_to_exclude=tuple(exclude)), int4=opts.int4, reader_factory=calib.reader)

    def make_int8() -> dict[str, Any]:
        """int8 candidates (static, dynamic, partial), each gated and, when more than one passes, timed; the winner."""
        vid = "int8-onnx"
        if prep_error:
            return {"id": vid, "precision": "int8", "error": prep_error}
        methods: list[tuple[str, Int8Options]] = [(opts.int8.method, opts.int8)]
        if opts.int8.method == "auto":
            methods = [("static", replace(opts.int8, method="static")), ("dynamic", replace(opts.int8, method="dynamic"))]
        recommended, why_rec = choose_int8_method(prep)
        cands: list[dict[str, Any]] = []

        def make(kind: str, i8: Int8Options) -> dict[str, Any]:
            dst = work / f"int8_{kind}.onnx"
            cand: dict[str, Any] = {"kind": kind, "file": dst, "kept": (), "notes": []}
            try:
                cand["method"] = quantize_target("int8", prep, dst, int8=i8, int4=opts.int4, reader_factory=calib.reader)
                cand["ok"], cand["summary"], cand["q"] = evaluate(dst)
            except QuantizeError as e:
                cand.update(method=f"int8 {kind}", error=str(e))
            except Exception as e:  # ONNX Runtime refusing the quantized graph
                cand.update(method=f"int8 {kind}", error=f"ONNX Runtime cannot run the int8 {kind} model it made: {str(e)[:300]}")
            cands.append(cand)
            return cand

        for kind, i8 in methods:
            make(kind, i8)
        dyn = next((c for c in cands if c["kind"] == "dynamic"), None)
        if dyn is not None and not dyn.get("ok") and _has_ops(prep, CONV_OPS) and _has_ops(prep, MATMUL_OPS):
            # dynamic int8 quantizes a Conv through ONNX Runtime's ConvInteger path, which can lose a model (PP-OCRv4's
            # recognizer: cosine 0.53); the MatMuls alone keep it (0.9999). Only then: where plain dynamic passes, a
            # MatMul-only variant would quantize a fraction of the weights (0.94x the size on PP-OCR's classifier).
            make("dynamic-matmul", replace(opts.int8, method="dynamic", op_types=MATMUL_OPS))
        static = next((c for c in cands if c["kind"] == "static" and "error" not in c), None)
        passing_others = [c for c in cands if c["kind"] != "static" and "error" not in c and c["ok"]]
        ref_ms: float | None = None
        if static is not None and not static["ok"] and opts.repair and passing_others:
            # partial int8 is static int8 with nodes kept in float: it runs no faster than static. When a passing
            # candidate is already as fast as static, the (costly: one re-quantization per attempt) repair cannot
            # produce the winner, so it is skipped.
            ref_ms = _time_candidates([c for c in cands if "error" not in c], ins, outs, opts, name, ref_file, work, det, threads, val_samples)
            fastest = min(passing_others, key=lambda c: c["latency_ms"])
            if fastest["latency_ms"] <= static["latency_ms"]:
                static["why"] = f"fails the gate ({static['summary']}); partial int8 not made: static ({static['latency_ms']:.3f} ms) is already slower than {fastest['kind']} ({fastest['latency_ms']:.3f} ms), which passes, and keeping nodes in float does not make it faster"
                static["skip_repair"] = True
        if static is not None and not static["ok"] and opts.repair and not static.get("skip_repair"):
            from .repair import repair_int8

            def gate_fn(path: Path) -> tuple[bool, str]:
                ok_, s_, _ = evaluate(path)
                return ok_, s_

            dst = work / "int8_partial.onnx"
            kept: tuple[str, ...] = ()
            rr = None
            try:
                rr = repair_int8(prep, dst, quantize=requantize, evaluate=gate_fn, samples=list(calib.samples)[:16], work_dir=work / "repair", max_excluded=opts.max_keep_float)
            except (ValueError, RuntimeError) as e:  # the graph defeats the sensitivity analysis
                static["notes"].append(f"int8 static failed its gate ({static['summary']}); repair was not possible: {str(e)[:200]}")
            else:
                kept = tuple(rr.excluded)
            if rr is not None and not kept:  # the best attempt keeps nothing in float: the same model as static, no new candidate
                static["notes"].append(f"int8 static failed its gate ({static['summary']}); repair found no node whose float form makes it pass (up to {opts.max_keep_float} tried)")
            elif rr is not None and not _has_8bit_weights(dst):  # every weighted node kept in float: an fp32 model, not an int8 one
                static["notes"].append(f"int8 static failed its gate ({static['summary']}); repair kept every weighted node in float ({len(kept)}), which is no int8 model")
            elif rr is not None:
                ok, summary, q = evaluate(dst)
                cands.append({
                    "kind": "partial", "file": dst, "kept": kept, "ok": ok, "summary": summary, "q": q,
                    "method": static["method"] + f", {len(kept)} sensitive node(s) kept in float",
                    "notes": [f"int8 static failed its gate ({static['summary']}); repair kept {len(kept)} node(s) in float: {', '.join(kept) or 'none'}; " + ("passed" if rr.passed else "still failing")],
                })  # fmt: skip
        good = [c for c in cands if "error" not in c]
        if not good:
            return {"id": vid, "precision": "int8", "error": "; ".join(c["error"] for c in cands), "candidates": _candidate_rows(cands, None, gate)}
        passing = [c for c in good if c["ok"]]
        if (len(passing) > 1 or (len(good) > 1 and opts.int8.method == "auto" and passing)) and any(c.get("latency_ms") is None for c in good):
            ref_ms = _time_candidates(good, ins, outs, opts, name, ref_file, work, det, threads, val_samples)
        notes: list[str] = []
        if passing:
            timed = [c for c in passing if c.get("latency_ms") is not None]
            faster = [c for c in timed if ref_ms is not None and c["latency_ms"] < ref_ms]
            pool = faster or timed or passing
            best = min(pool, key=lambda c: c.get("latency_ms") or 0.0) if timed else passing[0]
            if len(passing) == 1:
                best["why"] = "the only candidate that passes the gate"
            elif faster:
                best["why"] = f"the fastest of {len(passing)} candidates that pass the gate ({best['latency_ms']:.3f} ms, fp32 {ref_ms:.3f} ms)"
            else:
                best["why"] = f"passes the gate and is the fastest, but no int8 candidate was faster than fp32 on this machine (fp32 {ref_ms or 0:.3f} ms)"
                notes.append(f"no int8 candidate was faster than fp32 on this machine ({best['latency_ms']:.3f} vs {ref_ms or 0:.3f} ms); written because it passes its gate: int8 pays off on devices with int8 dot-product instructions, and the device measures before it prefers it")
        else:
            best = max(good, key=lambda c: _margin(c["q"], gate))
            best["why"] = "no candidate passes the gate; the closest to it"
        for c in good:
            if c is not best and c.get("latency_ms") is not None and ref_ms is not None and c["latency_ms"] >= ref_ms:
                c["why"] = "not faster than fp32 on this machine"
        shutil.copyfile(best["file"], work / "model_int8.onnx")
        files["model_int8.onnx"] = work / "model_int8.onnx"
        method = best["method"]
        if len(cands) > 1:
            method += f" [chosen of {len(cands)} measured candidates: {', '.join(c['kind'] for c in cands)}]"
        elif opts.int8.method == "auto":
            method += f" [auto: {why_rec}]"
        notes = [*best["notes"], *notes]
        if len(cands) > 1:
            notes.append("int8 candidates: " + "; ".join(f"{c['kind']} {'PASS' if c.get('ok') else 'FAIL'}" + (f" {c['latency_ms']:.3f} ms" if c.get("latency_ms") else "") for c in cands) + f"; kept {best['kind']}: {best['why']} (inspect recommends {recommended}: {why_rec})")
        return {"id": vid, "precision": "int8", "file": "model_int8.onnx", "method": method, "notes": notes, "kept": best["kept"], "candidates": _candidate_rows(cands, best, gate, ref_ms)}

    made: list[dict[str, Any]] = []  # variant dicts for the manifest + report extras
    files: dict[str, Path] = {"model_fp32.onnx": ref_file}
    for target in opts.targets:
        if target == "int8":
            made.append(make_int8())
            continue
        vid, fname = f"{target}-onnx", f"model_{target}.onnx"
        dst = work / fname
        notes: list[str] = []
        try:
            method = quantize_target(target, ref_file, dst, int8=opts.int8, int4=opts.int4, reader_factory=calib.reader, notes=notes)
            ok, summary, _ = evaluate(dst)
            if target == "int4" and not ok and opts.int4.accuracy_level not in (None, 0):
                method = _int4_exact_compute(ref_file, dst, work, opts, calib.reader, summary, evaluate, method, notes)
        except QuantizeError as e:
            made.append({"id": vid, "precision": target, "error": str(e)})
            continue
        except Exception as e:  # ONNX Runtime refusing the quantized graph: that variant is not made
            made.append({"id": vid, "precision": target, "error": f"ONNX Runtime cannot run the {target} model it made: {str(e)[:300]}"})
            continue
        files[fname] = dst
        made.append({"id": vid, "precision": target, "file": fname, "method": method, "notes": notes, "kept": ()})
    for i, (tfl, prec) in enumerate(opts.tflite):
        fname = f"model_{prec}_{i}.tflite" if i else f"model_{prec}.tflite"
        shutil.copyfile(tfl, work / fname)
        files[fname] = work / fname
        made.append({"id": f"{prec}-tflite" + (f"-{i}" if i else ""), "precision": prec, "file": fname, "backend": "litert", "method": f"existing TFLite model {Path(tfl).name}", "notes": [], "kept": ()})

    # Stage every variant in one package, then measure them all the way a device would.
    base: dict[str, Any] = {
        "schema": 1, "name": name, "version": opts.version, "task": opts.task,
        "inputs": [s.to_dict() for s in ins], "outputs": [s.to_dict() for s in outs],
    }  # fmt: skip
    if class_names:
        base["labels"] = list(class_names)
    if opts.task == "classification":
        base["decoder"] = {"kind": "classification", "output": outs[0].name, "softmax": True, "top_k": 5}
    variants = [{"id": "fp32-onnx", "file": "model_fp32.onnx", "backend": "onnxruntime", "precision": "fp32", "reference": True}]
    for m in made:
        if "error" not in m:
            variants.append({"id": m["id"], "file": m["file"], "backend": m.get("backend", "onnxruntime"), "precision": m["precision"]})
    stage = work / "stage"
    tfl_overrides = _tflite_overrides(files, made, ins, outs)
    for v in variants:
        if v["id"] in tfl_overrides:
            v["inputs"], v["outputs"] = tfl_overrides[v["id"]]
    pkg = write_package(stage, dict(base, variants=variants), {k: p for k, p in files.items()})
    assert isinstance(pkg, ModelPackage)
    fit_samples = fit_labels = None
    if opts.calibrate_temperature:  # fit on the calibration split when it is labelled: the validation data stays unseen
        fit_labels = _model_labels(calib, class_names)
        fit_samples = list(calib.samples) if fit_labels is not None else None
    reports = validate_package(
        pkg, val_samples, labels=labels, dataset=val_name, profile=det.profile, threads=threads, cache_dir=work / "cache",
        calibrate_temperature=opts.calibrate_temperature, fit_samples=fit_samples, fit_labels=fit_labels, fit_source=calib_name, blank=opts.blank,
        detection=opts.detection_format,
    )  # fmt: skip

    # Gate, then write the final package.
    final_variants: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    written, refused = [], []
    machine = _machine()
    by_made = {m["id"]: m for m in made}
    for v in variants:
        r: VariantReport = reports[v["id"]]
        q = r.quality or Quality()
        is_ref = v["id"] == "fp32-onnx"
        ok, fails = (True, ()) if is_ref else check_gate(q, gate, v["precision"])
        extra = by_made.get(v["id"], {})
        slower = r.slower_than_reference and not is_ref
        notes = list(extra.get("notes", [])) + list(r.notes)
        if slower:
            notes.append(f"slower than the fp32 reference on this machine ({r.latency_ms:.3f} vs {r.reference_latency_ms:.3f} ms)")
        keep = ok or opts.force
        entry = dict(v)
        entry["quality"] = q.to_dict()
        entry["gate"] = Gate(ok, tuple(gate.items()), fails, forced=not ok and opts.force).to_dict()
        if r.calibration is not None and r.calibration.fitted and r.calibration.temperature is not None:
            entry["temperature"] = round(r.calibration.temperature, 6)
        if r.latency_ms is not None:
            entry["benchmarks"] = [Benchmark(det.profile.name, round(r.latency_ms, 4), threads, 1, None if is_ref else round(r.reference_latency_ms or 0, 4) or None, machine).to_dict()]
        if keep:
            final_variants.append(entry)
            written.append(v["id"])
        else:
            refused.append(v["id"])
        rows.append({
            "id": v["id"], "backend": v["backend"], "precision": v["precision"], "file": v["file"], "size": r.size,
            "method": extra.get("method", "fp32 reference (the input model" + (", normalised)" if norm.changed else ")")), "written": keep,
            "quality": {k: x for k, x in q.to_dict().items() if k in Quality.FIGURES or k in ("metric", "nonfinite_samples")},
            "gate": {"passed": ok, "thresholds": dict(gate), "failures": list(fails), "forced": not ok and opts.force},
            "latency_ms": r.latency_ms, "reference_latency_ms": r.reference_latency_ms, "slower_than_reference": slower,
            "kept_float_nodes": list(extra.get("kept", ())), "notes": notes,
        })  # fmt: skip
        if r.calibration is not None:
            rows[-1]["calibration"] = r.calibration.to_dict(diagram=diagram_name(v["id"]))
        if extra.get("candidates"):
            rows[-1]["candidates"] = extra["candidates"]
    for m in made:
        if "error" in m:
            refused.append(m["id"])
            rows.append({
                "id": m["id"], "backend": "onnxruntime", "precision": m["precision"], "file": None, "size": 0, "method": "not made",
                "written": False, "quality": {}, "gate": {"passed": False, "thresholds": dict(gate), "failures": [m["error"]], "forced": False},
                "latency_ms": None, "reference_latency_ms": None, "slower_than_reference": False, "kept_float_nodes": [], "notes": [],
            })  # fmt: skip
            if m.get("candidates"):
                rows[-1]["candidates"] = m["candidates"]

    # Reference statistics of inputs and outputs (fp32 reference, calibration + validation data) for on-device monitoring.
    from .reference_stats import write_reference_stats

    stats_samples = [*calib.samples, *val_samples]  # input shapes may vary (dynamic dims): summarised per feature axis
    base["reference_stats"] = write_reference_stats(pkg, stats_samples, work / "reference_stats.json", f"{calib_name} + {val_name}", work / "cache", det.profile)
    files["reference_stats.json"] = work / "reference_stats.json"
    if out.exists():
        shutil.rmtree(out)
    final = write_package(
        out, dict(base, variants=final_variants), {**{v["file"]: files[v["file"]] for v in final_variants}, "reference_stats.json": files["reference_stats.json"]}
    )
    assert isinstance(final, ModelPackage)
    report = {
        "model": {"name": name, "version": opts.version, "task": opts.task, "source": str(src), "source_sha256": hashlib.sha256(data).hexdigest()},
        "machine": {"profile": det.profile.name, "machine": machine, "threads": threads, "python": platform.python_version()},
        "reference": "fp32-onnx",
        "calibration": {"source": calib_name, "samples": len(calib)},
        "validation": {"source": val_name, "samples": len(val_samples)},
        "gate": dict(gate),
        "notes": list(model_notes),
        "variants": rows,
    }
    from .report import write_report

    write_report(out, report)
    return ConvertResult(out, report, tuple(written), tuple(refused))


def _tflite_overrides(files: Mapping[str, Path], made: Sequence[Mapping[str, Any]], ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> dict[str, tuple[list, list]]:
    """TFLite variants usually take NHWC where the ONNX model takes NCHW: give them their own specs."""
    out: dict[str, tuple[list, list]] = {}
    for m in made:
        if m.get("backend") != "litert":
            continue
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=str(files[m["file"]]))
        t_in = it.get_input_details()
        if len(t_in) != len(ins):
            raise ConvertError(f"{m['file']}: {len(t_in)} inputs, the ONNX model has {len(ins)}")
        new_in = []
        for s, d in zip(ins, t_in):
            sig = [int(x) for x in d.get("shape_signature", d["shape"])]
            shape = tuple(s.shape[0] if i == 0 and n < 0 else n for i, n in enumerate(sig))
            layout = s.layout
            if s.layout == "NCHW" and len(sig) == 4 and sig[3] == s.shape[1]:
                layout = "NHWC"
            new_in.append(replace(s, name=s.name, shape=shape, layout=layout).to_dict())
        out[m["id"]] = (new_in, [s.to_dict() for s in outs])
    return out


ProgressFn = Callable[[str], None]


def _int4_exact_compute(
    ref_file: Path, dst: Path, work: Path, opts: ConvertOptions, reader: Any, summary: str, evaluate: Any, method: str, notes: list[str]
) -> str:
    """int4 whose int8-activation compute (accuracy_level 4) fails the gate: the same weights with fp32
    compute (accuracy_level 0) are measured too, and kept when they pass. MLAS's int8-activation
    kernels differ between CPUs (VNNI, AVX2, NEON), so a borderline model can pass on one and fail on
    another; level 0 dequantizes the weights and multiplies in fp32 (ONNX Runtime's contrib op docs,
    MatMulNBits ``accuracy_level``)."""
    level = opts.int4.accuracy_level
    alt = work / "int4_level0.onnx"
    alt_notes: list[str] = []
    alt_method = quantize_target("int4", ref_file, alt, int8=opts.int8, int4=replace(opts.int4, accuracy_level=0), reader_factory=reader, notes=alt_notes)
    ok0, summary0, _ = evaluate(alt)
    if not ok0:
        notes.append(f"int4 accuracy_level {level} fails the gate here ({summary}); accuracy_level 0 (fp32 compute) was measured too and fails as well ({summary0})")
        return method
    shutil.move(str(alt), str(dst))
    notes.append(f"int4 accuracy_level {level} (int8 activations) fails the gate here ({summary}); the same weights with accuracy_level 0 (fp32 compute) pass ({summary0}) and are kept")
    return alt_method
