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
from edge_sdk.package.modelfile import sniff_format

from .calibration_quality import diagram_name
from .errors import ConverterError
from .packaging import SignatureError, onnx_tensor_specs, write_package
from .quantize import Int4Options, Int8Options, QuantizeError, quantize_target
from .validate import VariantReport, check_gate, compare, default_gate, validate_package


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


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert` produced: the package folder, the report (as in ``report.json``), the variant ids written
    and those refused by their gate."""
    package: Path
    report: dict[str, Any]
    written: tuple[str, ...]
    refused: tuple[str, ...]


def _specs_from_model(data: bytes, opts: ConvertOptions) -> tuple[list[TensorSpec], list[TensorSpec]]:
    try:
        return onnx_tensor_specs(data, opts.dims, opts.preprocess)
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


def _ort_outputs(path: Path, samples: Sequence[Mapping[str, np.ndarray]], threads: int) -> dict[str, np.ndarray]:
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
    return {n: np.concatenate(v, axis=0) for n, v in per.items()}


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
    if kind != "onnx":
        what = {"pickle": "a Python pickle (runs code when loaded; export the model to ONNX)", "tflite": "TFLite (pass it with --tflite to add it as a variant)"}
        raise ConvertError(f"{src.name}: expected an fp32 ONNX model, got {what.get(kind, kind)}")
    if out.exists() and any(out.iterdir()) and not opts.overwrite:
        raise ConvertError(f"{out} exists and is not empty; pass --overwrite to replace it")
    for f, _ in opts.tflite:
        if sniff_format(Path(f).read_bytes()[:64] if Path(f).is_file() else b"") != "tflite":
            raise ConvertError(f"--tflite {f}: not a TFLite file")

    ins, outs = _specs_from_model(data, opts)
    calib = load_data(calibration, ins, limit=opts.limit, progress=opts.progress)
    if validation is not None:
        val = load_data(validation, ins, limit=opts.limit, progress=opts.progress)
    else:
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
    threads = opts.threads or min(det.profile.runtime.threads, det.facts.cpu_count or det.profile.runtime.threads)
    name = opts.name or src.stem
    work = Path(tempfile.mkdtemp(prefix="edge-convert-"))
    try:
        return _convert(src, data, out, opts, ins, outs, calib, val, labels, class_names, gate, det, threads, name, work, str(calibration), str(validation or f"{calibration} (held-out {opts.holdout:.0%})"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert(
    src: Path, data: bytes, out: Path, opts: ConvertOptions, ins: list[TensorSpec], outs: list[TensorSpec], calib: Any, val: Any,
    labels: Any, class_names: tuple[str, ...], gate: dict[str, float], det: Any, threads: int, name: str, work: Path,
    calib_name: str, val_name: str,
) -> ConvertResult:  # fmt: skip
    from .quantize import preprocess as ort_preprocess

    ref_file = work / "model_fp32.onnx"
    ref_file.write_bytes(data)
    prep_error = None
    try:
        prep = ort_preprocess(ref_file, work / "prep.onnx")
    except QuantizeError as e:
        prep, prep_error = ref_file, str(e)
    val_samples = list(val.samples)
    ref_out = _ort_outputs(ref_file, val_samples, threads)
    class_output = outs[0].name if opts.task == "classification" else None

    def evaluate(path: Path) -> tuple[bool, str, Quality]:
        c = compare(ref_out, _ort_outputs(path, val_samples, threads), task=opts.task, class_output=class_output, labels=labels, reference_id="fp32-onnx", dataset=val_name)
        ok, fails = check_gate(c.quality, gate)
        summary = ", ".join(f"{k} {getattr(c.quality, k):.6g}" for k in gate if getattr(c.quality, k) is not None)
        return ok, summary + ("" if ok else f" (fails: {'; '.join(fails)})"), c.quality

    made: list[dict[str, Any]] = []  # variant dicts for the manifest + report extras
    files: dict[str, Path] = {"model_fp32.onnx": ref_file}
    for target in opts.targets:
        vid, fname = f"{target}-onnx", f"model_{target}.onnx"
        dst = work / fname
        src_for = prep if target == "int8" else ref_file
        notes: list[str] = []
        kept: tuple[str, ...] = ()
        try:
            if target == "int8" and prep_error:
                raise QuantizeError(prep_error)
            method = quantize_target(target, src_for, dst, int8=opts.int8, int4=opts.int4, reader_factory=calib.reader)
            ok, summary, _q = evaluate(dst)
        except QuantizeError as e:
            made.append({"id": vid, "precision": target, "error": str(e)})
            continue
        except Exception as e:  # ONNX Runtime refusing the quantized graph: that variant is not made
            made.append({"id": vid, "precision": target, "error": f"ONNX Runtime cannot run the {target} model it made: {str(e)[:300]}"})
            continue
        if not ok and target == "int8" and opts.repair and "static" in method:
            from .repair import repair_int8

            def requantize(path: Path, exclude: Sequence[str]) -> None:
                quantize_target("int8", prep, path, int8=replace(opts.int8, method="static", nodes_to_exclude=tuple(exclude)), int4=opts.int4, reader_factory=calib.reader)

            def gate_fn(path: Path) -> tuple[bool, str]:
                ok_, s_, _ = evaluate(path)
                return ok_, s_

            try:
                rr = repair_int8(prep, dst, quantize=requantize, evaluate=gate_fn, samples=list(calib.samples)[:16], work_dir=work / "repair", max_excluded=opts.max_keep_float)
            except (ValueError, RuntimeError) as e:  # the graph defeats the sensitivity analysis: keep the plain int8 result
                requantize(dst, ())
                notes.append(f"int8 failed its gate ({summary}); repair was not possible: {str(e)[:200]}")
            else:
                kept = tuple(rr.excluded)
                notes.append(f"int8 failed its gate ({summary}); repair kept {len(kept)} node(s) in float: {', '.join(kept) or 'none'}; " + ("passed" if rr.passed else "still failing"))
                method += f", {len(kept)} sensitive node(s) kept in float"
        files[fname] = dst
        made.append({"id": vid, "precision": target, "file": fname, "method": method, "notes": notes, "kept": kept})
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
        calibrate_temperature=opts.calibrate_temperature, fit_samples=fit_samples, fit_labels=fit_labels, fit_source=calib_name,
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
        ok, fails = (True, ()) if is_ref else check_gate(q, gate)
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
            "method": extra.get("method", "fp32 reference (the input model)"), "written": keep,
            "quality": {k: x for k, x in q.to_dict().items() if k in Quality.FIGURES or k == "metric"},
            "gate": {"passed": ok, "thresholds": dict(gate), "failures": list(fails), "forced": not ok and opts.force},
            "latency_ms": r.latency_ms, "reference_latency_ms": r.reference_latency_ms, "slower_than_reference": slower,
            "kept_float_nodes": list(extra.get("kept", ())), "notes": notes,
        })  # fmt: skip
        if r.calibration is not None:
            rows[-1]["calibration"] = r.calibration.to_dict(diagram=diagram_name(v["id"]))
    for m in made:
        if "error" in m:
            refused.append(m["id"])
            rows.append({
                "id": m["id"], "backend": "onnxruntime", "precision": m["precision"], "file": None, "size": 0, "method": "not made",
                "written": False, "quality": {}, "gate": {"passed": False, "thresholds": dict(gate), "failures": [m["error"]], "forced": False},
                "latency_ms": None, "reference_latency_ms": None, "slower_than_reference": False, "kept_float_nodes": [], "notes": [],
            })  # fmt: skip

    # Reference statistics of inputs and outputs (fp32 reference, calibration + validation data) for on-device monitoring.
    from .reference_stats import write_reference_stats

    base["reference_stats"] = write_reference_stats(pkg, [*calib.samples, *val_samples], work / "reference_stats.json", f"{calib_name} + {val_name}", work / "cache", det.profile)
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
