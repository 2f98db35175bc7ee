"""``edge-convert``: build and check model packages.

    edge-convert package OUT --name N --version V --task T \\
        --variant fp32-onnx=model.onnx:onnxruntime:fp32 --variant int8-tfl=m.tflite:litert:int8 \\
        [--reference fp32-onnx] [--dim batch=1:8] [--labels labels.txt] [--overwrite]
    edge-convert verify PACKAGE
    edge-convert llm SOURCE --to int4,int8[,fp16,fp32] --out PKG [--eval-text FILE] [--gate int4=0.10] [--force]

``package`` reads each model's own signature (ONNX: a wire-format scan, no
runtime; TFLite: the interpreter's tensor details) for the package-level
inputs/outputs, takes the first variant as the reference unless told, copies
the files, digests them and writes ``edge-model.toml``. Dynamic dims need
bounds (``--dim NAME=MIN:MAX``); a TFLite variant whose layout differs gets
its own input/output specs. ``quantize`` makes int8/int4/fp16 variants of an
fp32 ONNX model, measured and gated (:mod:`converters.pipeline`); ``validate``
re-measures a package; ``inspect`` describes a model file. See docs/converter.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from edge_sdk.errors import EdgeSDKError

from .errors import ConverterError

#: quality figures of the task gates, printed beside cosine (converters.validate.compare)
TASK_FIGURES = ("position_agreement", "sequence_exact_match", "edit_distance", "box_recall", "box_iou", "mask_iou")


def _onnx_specs(path: Path, dims: dict[str, tuple[int, int]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from .packaging import SignatureError, onnx_tensor_specs

    try:
        ins, outs = onnx_tensor_specs(path.read_bytes(), dims)
    except SignatureError as e:
        raise SystemExit(f"edge-convert: {path.name}: {e}") from None
    return [s.to_dict() for s in ins], [s.to_dict() for s in outs]


def _tflite_specs(path: Path, dims: dict[str, tuple[int, int]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))

    def spec(d: Any, is_input: bool) -> dict[str, Any]:
        sig = d.get("shape_signature", d["shape"])
        shape: list[Any] = []
        used: dict[str, list[int]] = {}
        for i, n in enumerate(sig):
            if n > 0:
                shape.append(int(n))
            else:
                name = "batch" if i == 0 else f"d{i}"
                shape.append(name)
                if is_input:
                    if name not in dims:
                        raise SystemExit(f"edge-convert: input {d['name']!r} dim {i} is dynamic: give --dim {name}=MIN:MAX")
                    used[name] = list(dims[name])
        q = d.get("quantization", (0.0, 0))
        dtype = "float32" if (q[0] and str(d["dtype"].__name__) in ("int8", "uint8")) else d["dtype"].__name__
        out: dict[str, Any] = {"name": d["name"], "dtype": dtype, "shape": shape}
        if used:
            out["dims"] = used
        return out

    return [spec(d, True) for d in it.get_input_details()], [spec(d, False) for d in it.get_output_details()]


def _parse_variant(s: str) -> dict[str, str]:
    try:
        vid, rest = s.split("=", 1)
        file, backend, precision = rest.rsplit(":", 2)
    except ValueError:
        raise SystemExit(f"edge-convert: --variant expects ID=FILE:BACKEND:PRECISION, got {s!r}") from None
    return {"id": vid, "file": file, "backend": backend, "precision": precision}


def _parse_dim(s: str) -> tuple[str, tuple[int, int]]:
    try:
        name, rng = s.split("=", 1)
        lo, hi = (int(x) for x in rng.split(":", 1))
    except ValueError:
        raise SystemExit(f"edge-convert: --dim expects NAME=MIN:MAX, got {s!r}") from None
    return name, (lo, hi)


def cmd_package(args: argparse.Namespace) -> int:
    """``edge-convert package``: copy the ``--variant`` model files into OUT and write a verified manifest for them."""
    from .packaging import write_package

    dims = dict(_parse_dim(d) for d in args.dim)
    variants = [_parse_variant(v) for v in args.variant]
    files: dict[str, Path] = {}
    base_in = base_out = None
    for v in variants:
        src = Path(v["file"])
        if not src.is_file():
            raise SystemExit(f"edge-convert: model file {src} does not exist")
        rel = src.name
        if rel in files:
            raise SystemExit(f"edge-convert: two variants use a file named {rel}")
        files[rel] = src
        v["file"] = rel
        reader = _onnx_specs if src.suffix == ".onnx" else _tflite_specs
        ins, outs = reader(src, dims)
        if base_in is None:
            base_in, base_out = ins, outs
        elif ins != base_in or outs != base_out:
            v["inputs"], v["outputs"] = ins, outs  # e.g. NHWC TFLite beside NCHW ONNX
    ref = args.reference or variants[0]["id"]
    if ref not in {v["id"] for v in variants}:
        raise SystemExit(f"edge-convert: --reference {ref} is not one of the variants")
    for v in variants:
        if v["id"] == ref:
            v["reference"] = True
    manifest: dict[str, Any] = {
        "schema": 1, "name": args.name, "version": args.version, "task": args.task,
        "inputs": base_in, "outputs": base_out, "variants": variants,
    }  # fmt: skip
    if args.labels:
        manifest["labels"] = [ln.strip() for ln in Path(args.labels).read_text().splitlines() if ln.strip()]
    if args.task == "classification":
        manifest["decoder"] = {"kind": "classification", "output": base_out[0]["name"] if base_out else None, "softmax": True, "top_k": 5}
    pkg = write_package(args.out, manifest, files, overwrite=args.overwrite)
    print(f"wrote {args.out}: {len(variants)} variant(s), manifest sha256 {pkg.manifest_sha256}")  # type: ignore[union-attr]
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``edge-convert verify``: open the package (which checks every digest) and print one ``ok`` line per variant."""
    from edge_sdk.package import ModelPackage

    pkg = ModelPackage.open(args.package)
    for v in pkg.manifest.variants:
        print(f"ok {v.id} {v.file} {v.sha256}")
    return 0


def _parse_preprocess(text: str) -> Any:
    """``size=224x224,resize=letterbox,color=RGB,mean=0.485:0.456:0.406,std=...,scale=...``"""
    from edge_sdk.package import ImagePreprocess

    d: dict[str, Any] = {"kind": "image"}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        k, _, v = part.partition("=")
        try:
            if k == "size":
                h, _, w = v.lower().partition("x")
                d["size_hw"] = [int(h), int(w)]
            elif k in ("mean", "std"):
                d[k] = [float(x) for x in v.split(":")]
            elif k == "scale":
                d[k] = float(v)
            elif k in ("pad_value",):
                d[k] = int(v)
            elif k == "crop_fraction":
                d[k] = float(v)
            elif k in ("resize", "color", "interpolation", "sampling_grid"):
                d[k] = v
            else:
                raise SystemExit(
                    f"edge-convert: --preprocess: unknown key {k!r} (size, resize, color, mean, std, scale, pad_value, crop_fraction, interpolation, sampling_grid)"
                )
        except ValueError:
            raise SystemExit(f"edge-convert: --preprocess: bad value for {k}: {v!r}") from None
    if "size_hw" not in d:
        raise SystemExit("edge-convert: --preprocess needs size=HxW")
    return ImagePreprocess.from_dict(d, "--preprocess")


def _read_labels(path: str) -> Any:
    """A .json (list: class indices, or per-sample boxes for detection) or a text file of class indices."""
    import json

    p = Path(path)
    if p.suffix == ".json":
        return json.loads(p.read_text())
    return [int(x) for x in p.read_text().split()]


def cmd_quantize(args: argparse.Namespace) -> int:
    """``edge-convert quantize``: build :class:`~converters.pipeline.ConvertOptions` from the arguments and run
    :func:`~converters.pipeline.convert`."""
    from .pipeline import ConvertOptions, convert
    from .quantize import Int4Options, Int8Options, parse_targets
    from .validate import parse_gate

    opts = ConvertOptions(
        targets=parse_targets(args.to),
        task=args.task,
        name=args.name,
        version=args.version,
        dims=dict(_parse_dim(d) for d in args.dim),
        preprocess=_parse_preprocess(args.preprocess) if args.preprocess else None,
        class_names=tuple(ln.strip() for ln in Path(args.class_names).read_text().splitlines() if ln.strip()) if args.class_names else (),
        int8=Int8Options(
            method=args.int8_method, activation_type=args.activation_type, weight_type=args.weight_type, calibration=args.calibration_method,
            reduce_range={"auto": None, "on": True, "off": False}[args.reduce_range],
        ),
        int4=Int4Options(block_size=args.block_size, accuracy_level=None if args.accuracy_level < 0 else args.accuracy_level),
        gate=parse_gate(args.gate) if args.gate else None,
        force=args.force,
        repair=not args.no_repair,
        max_keep_float=args.max_keep_float,
        holdout=args.holdout,
        limit=args.limit,
        threads=args.threads,
        profile=args.profile,
        overwrite=args.overwrite,
        tflite=tuple((Path(f.rsplit(":", 1)[0]), f.rsplit(":", 1)[1] if ":" in f else "fp32") for f in args.tflite),
        labels=_read_labels(args.labels) if args.labels else None,
        progress=not args.quiet,
        calibrate_temperature=args.calibrate_temperature,
        blank=args.blank,
        detection_format=args.detection_format,
    )
    res = convert(args.model, args.calibration, args.out, opts, validation=args.validation)
    for note in res.report.get("notes", []):
        print(f"note: {note}")
    for row in res.report["variants"]:
        q = row["quality"]
        gate = "PASS" if row["gate"]["passed"] else ("FORCED" if row["gate"]["forced"] else "FAIL")
        lat = f"{row['latency_ms']:.3f} ms" if row["latency_ms"] else "-"
        cos = f"cosine {q['cosine']:.5f}" if "cosine" in q else ""
        task_figs = [f"{k} {q[k]:.4g}" for k in TASK_FIGURES if q.get(k) is not None]
        cos = ", ".join([*task_figs, cos] if cos else task_figs)
        print(f"{row['id']:12s} {gate:6s} {lat:>11s} {cos} {row['method']}" + ("" if row["written"] else "  [not written]"))
        for f in row["gate"]["failures"]:
            print(f"{'':12s}   {f}")
        if row.get("calibration"):
            from .calibration_quality import describe

            print(f"{'':12s}   calibration: {describe(row['calibration'])}")
    print(f"wrote {res.package} ({', '.join(res.written)}); report: report.md, report.json, report.png")
    return 0 if not res.refused else 3


def cmd_validate(args: argparse.Namespace) -> int:
    """``edge-convert validate``: re-measure every variant of an existing package against its reference on ``--data``."""
    import json

    from edge_sdk.package import ModelPackage

    from .calibration import load_data
    from .validate import validate_package

    pkg = ModelPackage.open(args.package)
    data = load_data(args.data, pkg.manifest.inputs, limit=args.limit, progress=not args.quiet)
    from .pipeline import _model_labels

    # folder labels index the data's sorted class names: map them to the model's by name, as quantize does
    labels = _read_labels(args.labels) if args.labels else _model_labels(data, tuple(pkg.manifest.labels or ()))
    res = validate_package(
        pkg, list(data.samples), labels=labels, dataset=str(args.data), profile=args.profile, threads=args.threads,
        calibrate_temperature=args.calibrate_temperature, n_bins=args.bins, blank=args.blank, detection=args.detection_format,
    )  # fmt: skip
    rows = []
    for vid, r in res.items():
        q = r.quality.to_dict() if r.quality else {}
        rows.append({"variant": vid, "size": r.size, "latency_ms": r.latency_ms, "reference_latency_ms": r.reference_latency_ms, **q, "notes": list(r.notes)})
        if r.calibration is not None:
            rows[-1]["calibration"] = r.calibration.to_dict()
    written = _write_calibration(args.report_dir, pkg.manifest.name, rows) if args.report_dir else []
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'variant':14s} {'size KiB':>9s} {'ms':>8s} {'cosine':>9s} {'max abs':>9s} {'top1':>6s} {'top5':>6s} metric")
        for r in rows:
            print(
                f"{r['variant']:14s} {r['size'] / 1024:9.1f} {r['latency_ms'] or 0:8.3f} {r.get('cosine', float('nan')):9.5f} "
                f"{r.get('max_abs_error', float('nan')):9.4g} {r.get('top1_agreement', float('nan')):6.3f} {r.get('top5_agreement', float('nan')):6.3f} "
                f"{(r.get('metric') or '')} {r.get('value', '') if r.get('metric') else ''}"
                + " ".join(f" {k} {r[k]:.4g}" for k in TASK_FIGURES if r.get(k) is not None)
            )
        _print_calibration(rows, args)
    for f in written:
        print(f"wrote {f}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _print_calibration(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    """The calibration lines of ``edge-convert validate`` (variants measured with class labels only)."""
    from .calibration_quality import describe

    cal = [r for r in rows if r.get("calibration")]
    if not cal:
        print("calibration: not measured (needs a classification package and class labels for --data)")
        return
    c0 = cal[0]["calibration"]
    print(f"calibration (top-1 confidence, {c0['n_bins']} equal-width bins, {c0['samples']} samples):")
    for r in cal:
        print(f"  {r['variant']:14s} {describe(r['calibration'])}")
    if args.calibrate_temperature:
        print("  temperatures fitted on --data itself (the after figures are optimistic); the package is not changed: "
              "edge-convert quantize --calibrate-temperature stores them")  # fmt: skip
    if not args.report_dir:
        print("  reliability diagrams: pass --report-dir DIR to write one PNG per variant")


def _write_calibration(out: Path, model_name: str, rows: list[dict[str, Any]]) -> list[Path]:
    """``validate --report-dir``: a reliability diagram per calibrated variant (named in its row's ``calibration``) and
    ``validation.json`` (the rows) in ``out``."""
    import json

    from .calibration_quality import diagram_name, plot_reliability

    out.mkdir(parents=True, exist_ok=True)
    files = []
    for r in rows:
        if r.get("calibration"):
            r["calibration"]["diagram"] = diagram_name(r["variant"])
            files.append(plot_reliability(r["calibration"], out / r["calibration"]["diagram"], f"{model_name} {r['variant']}"))
    (out / "validation.json").write_text(json.dumps(rows, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8")
    return [*files, out / "validation.json"]


def cmd_inspect(args: argparse.Namespace) -> int:
    """``edge-convert inspect``: print a model's ops, I/O, parameters and which quantization modes apply (``--json``: as
    JSON)."""
    import json

    from .inspect_model import format_inspection, inspect_model

    info = inspect_model(args.model)
    print(json.dumps(info.to_dict(), indent=2, default=str) if args.json else format_inspection(info))
    return 0


def cmd_llm(args: argparse.Namespace) -> int:
    """``edge-convert llm``: see :mod:`converters.llm.convert`."""
    import json

    from .llm.convert import LLMConvertOptions, convert_llm, parse_gates

    text = None
    if args.eval_text is not None:
        try:
            text = args.eval_text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConverterError(f"--eval-text {args.eval_text}: cannot read it as UTF-8 text: {e}") from e
    opts = LLMConvertOptions(
        targets=tuple(t.strip() for t in args.to.split(",") if t.strip()),
        eval_text=text,
        eval_tokens=args.eval_tokens,
        window=args.window,
        int4_methods=tuple(m.strip() for m in args.int4_methods.split(",") if m.strip()),
        mixed=args.mixed,
        block_size=args.block_size,
        accuracy_level=args.accuracy_level,
        gates=parse_gates(args.gate),
        force=args.force,
        calib_tokens=args.calib_tokens,
        threads=args.threads,
        name=args.name,
        version=args.version,
        timing=not args.no_timing,
        overwrite=args.overwrite,
        prefer=args.prefer,
        kv_dtype=args.kv_dtype,
        draft_layers=args.draft_layers,
    )
    res = convert_llm(args.source, args.out, opts, log=None if args.json else (lambda m: print(m, flush=True)))
    if args.json:
        print(json.dumps(res.report, indent=1, default=str))
    else:
        print(f"wrote {res.out} ({', '.join(v.id for v in res.manifest.variants)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``edge-convert``: parse ``argv`` (default ``sys.argv[1:]``), run the command and return its exit
    status (1 on a :class:`~converters.errors.ConverterError`, an :class:`~edge_sdk.errors.EdgeSDKError` or an output
    that exists, with ``edge-convert: <class>: <message>`` on stderr)."""
    ap = argparse.ArgumentParser(prog="edge-convert", description="Build and check edge_sdk model packages.")
    from edge_sdk._version import __version__

    ap.add_argument("--version", action="version", version=f"edge-convert {__version__}", help="print the edge-sdk version and exit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("package", help="write a package from model files")
    p.add_argument("out", type=Path, help="package folder to write")
    p.add_argument("--name", required=True, help="package name")
    p.add_argument("--version", required=True, help="package version, e.g. 1.0.0")
    p.add_argument("--task", default="raw", choices=["classification", "detection", "segmentation", "embedding", "audio", "raw"], help="what the model does (default raw)")
    p.add_argument(
        "--variant", action="append", required=True, metavar="ID=FILE:BACKEND:PRECISION",
        help="a model file as a variant, e.g. fp32-onnx=model.onnx:onnxruntime:fp32 (repeat for each)",
    )  # fmt: skip
    p.add_argument("--reference", help="variant id the others are measured against (default: the first)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=MIN:MAX", help="bounds of a dynamic input dim")
    p.add_argument("--labels", help="text file, one label per line")
    p.add_argument("--overwrite", action="store_true", help="replace files in a non-empty OUT")
    p = sub.add_parser("verify", help="open a package and verify every digest")
    p.add_argument("package", help="package folder or archive")

    p = sub.add_parser("quantize", help="quantize an fp32 ONNX model into a measured, gated package")
    p.add_argument("model", help="fp32 ONNX model")
    p.add_argument("--calibration", required=True, help="image folder, .npy/.npz (one array per input, or per sample: arr_0, arr_1, ...), video file or .csv of sensor windows")
    p.add_argument("--to", default="int8", help="comma list of int8, int4, fp16 (default int8)")
    p.add_argument("--out", required=True, type=Path, help="package folder to write")
    p.add_argument(
        "--task", default="raw", choices=["classification", "detection", "segmentation", "sequence", "embedding", "audio", "raw"],
        help="what the model does; picks the default gate (sequence: CTC/token outputs [batch, positions, classes], gated on decoded-sequence agreement)",
    )  # fmt: skip
    p.add_argument("--blank", type=int, default=0, help="--task sequence: the CTC blank class index (default 0)")
    p.add_argument("--name", help="package name (default: the model file's stem)")
    p.add_argument("--version", default="1.0.0", help="package version (default 1.0.0)")
    p.add_argument(
        "--detection-format", default="auto", choices=["auto", "yolov8", "yolov5", "ssd", "blazeface", "rows"],
        help="--task detection: how the raw head is decoded for box recall/IoU (auto: from the output shapes, said in a note; "
        "yolov8 [B, 4+C, N] or [B, N, 4+C], yolov5 [B, N, 5+C], ssd boxes [B, N, 4] + scores [B, N, C], blazeface, rows [B, N, 6])",
    )  # fmt: skip
    p.add_argument("--preprocess", help="image input: size=HxW,resize=stretch|letterbox|center_crop,color=RGB|BGR|GRAY,mean=a:b:c,std=a:b:c,scale=s,interpolation=linear|area|nearest|cubic,sampling_grid=centers|top_left")
    p.add_argument(
        "--dim", action="append", default=[], metavar="NAME=MIN:MAX",
        help="bounds of a dynamic input dim (default: the smallest and largest size the calibration and validation samples show)",
    )  # fmt: skip
    p.add_argument("--class-names", help="text file, one class name per line")
    p.add_argument("--validation", help="held-out data (default: hold out --holdout of the calibration data)")
    p.add_argument("--holdout", type=float, default=0.25, help="without --validation: the fraction of calibration samples held out for validation (default 0.25)")
    p.add_argument("--labels", help="validation labels: text file of class indices, or .json (indices, or boxes per sample for detection)")
    p.add_argument("--limit", type=int, default=256, help="at most this many samples from each data source")
    p.add_argument(
        "--int8-method", default="auto", choices=["auto", "static", "dynamic"],
        help="auto: make static, dynamic and (when static fails its gate) partial int8, keep the fastest that passes; or force one",
    )  # fmt: skip
    p.add_argument("--activation-type", default="uint8", choices=["uint8", "int8"], help="int8 static: activation type (default uint8)")
    p.add_argument("--weight-type", default="int8", choices=["uint8", "int8"], help="int8: weight type (default int8)")
    p.add_argument(
        "--reduce-range", default="auto", choices=["auto", "on", "off"],
        help="int8: 7-bit weights (auto: on where this CPU's u8s8 kernels can saturate, x86 without VNNI)",
    )  # fmt: skip
    p.add_argument("--calibration-method", default="minmax", choices=["minmax", "entropy", "percentile"], help="int8 static: how activation ranges are calibrated (default minmax)")
    p.add_argument("--block-size", type=int, default=32, help="int4 weights per scale")
    p.add_argument("--accuracy-level", type=int, default=4, help="int4 MatMulNBits compute type (4: int8 path; -1: none)")
    p.add_argument("--gate", help="e.g. cosine=0.995,top1_agreement=0.99 (default: the task's gate)")
    p.add_argument("--force", action="store_true", help="write variants that fail their gate, with the failure recorded")
    p.add_argument("--no-repair", action="store_true", help="do not keep sensitive nodes in float when int8 fails its gate")
    p.add_argument("--max-keep-float", type=int, default=8, help="int8 repair: keep at most this many sensitive nodes in float (default 8)")
    p.add_argument("--tflite", action="append", default=[], metavar="FILE[:PRECISION]", help="add an existing TFLite model as a variant")
    p.add_argument("--threads", type=int, help="threads for measuring (default: the profile's, at most the CPUs)")
    p.add_argument("--profile", help="device profile to record measurements under (default: detected)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--calibrate-temperature", action="store_true",
        help="classification: fit a softmax temperature per variant (on the labelled calibration data, else the validation data) and store it in the manifest",
    )  # fmt: skip

    p = sub.add_parser("validate", help="measure every variant of a package against its reference")
    p.add_argument("package", help="package folder or archive")
    p.add_argument("--data", required=True, help="validation data: image folder, .npy/.npz, video or .csv (as quantize --calibration)")
    p.add_argument("--blank", type=int, default=0, help="sequence packages: the CTC blank class index (default 0)")
    p.add_argument(
        "--detection-format", default="auto", choices=["auto", "yolov8", "yolov5", "ssd", "blazeface", "rows"],
        help="detection packages without a decoder: how the raw head is decoded (default auto)",
    )  # fmt: skip
    p.add_argument("--labels", help="labels: text file of class indices, or .json (indices, or boxes per sample for detection)")
    p.add_argument("--limit", type=int, default=256, help="at most this many samples (default 256)")
    p.add_argument("--threads", type=int, help="threads for measuring")
    p.add_argument("--profile", help="device profile to measure under (default: detected)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--report-dir", type=Path, help="write a reliability diagram PNG per variant and validation.json here (calibration needs class labels)")
    p.add_argument("--bins", type=int, default=15, help="equal-width confidence bins for ECE and the reliability diagrams")
    p.add_argument("--calibrate-temperature", action="store_true", help="also fit a softmax temperature per variant on --data and report ECE after it (the package is not changed)")

    p = sub.add_parser("inspect", help="ops, opset, inputs/outputs, parameters and which quantization modes apply")
    p.add_argument("model", help="ONNX or TFLite model file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")

    p = sub.add_parser("llm", help="a decoder-only language model (GGUF or a Hugging Face folder) to a measured, gated text-generation package")
    p.add_argument("source", help="a .gguf file, or a folder with config.json, *.safetensors and tokenizer.json")
    p.add_argument("--to", default="int4", help="comma list of int4, int8, fp16, fp32 (default int4)")
    p.add_argument("--out", required=True, type=Path, help="the package folder to write")
    p.add_argument("--eval-text", type=Path, help="held-out UTF-8 text for perplexity (default: CPython's documentation topics)")
    p.add_argument("--eval-tokens", type=int, default=512, help="tokens of it to measure (default 512)")
    p.add_argument("--window", type=int, default=256, help="teacher-forced window in tokens (default 256)")
    p.add_argument("--int4-methods", default="native,rtn,hqq,gptq",
                   help="int4 quantizers to measure, best perplexity kept (default native,rtn,hqq,gptq; native = a GGUF's own Q4_0/Q4_1/Q8_0 blocks, exactly)")  # fmt: skip
    p.add_argument("--mixed", choices=("auto", "always", "never"), default="auto",
                   help="mixed precision, the int8 tensors chosen by measured sensitivity: auto = searched when no pure int4 passes its gate")  # fmt: skip
    p.add_argument("--prefer", choices=("perplexity", "speed"), default="perplexity",
                   help="among int4 candidates that pass the gate keep the lowest perplexity (default) or the fastest measured TPOT")  # fmt: skip
    p.add_argument("--kv-dtype", choices=("float32", "float16"), default="", help="KV cache dtype (default: the compute type; float16 halves KV bytes)")
    p.add_argument("--draft-layers", type=int, metavar="N",
                   help="keep the first N layers (with the final norm and head): a self-speculation draft package sharing the model's tokenizer")  # fmt: skip
    p.add_argument("--block-size", type=int, default=32, help="int4/int8 block size (default 32)")
    p.add_argument("--accuracy-level", type=int, default=4, help="MatMulNBits accuracy_level (4: int8 activations, fast on CPU; 0: exact)")
    p.add_argument("--gate", action="append", default=[], metavar="PRECISION=GAP",
                   help="max perplexity gap vs the reference, e.g. int4=0.10 (defaults: int8 0.02, int4 0.10, fp16 0.01)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="keep a variant that fails its gate (marked in the manifest)")
    p.add_argument("--calib-tokens", type=int, default=256, help="GPTQ calibration tokens (default 256)")
    p.add_argument("--threads", type=int, help="threads for measuring (default: min(2, CPUs))")
    p.add_argument("--name", help="package name (default: from the source)")
    p.add_argument("--version", default="1", help="package version (default 1)")
    p.add_argument("--no-timing", action="store_true", help="do not time TTFT/TPOT")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the conversion report as JSON")

    args = ap.parse_args(argv)
    handlers = {
        "package": cmd_package, "verify": cmd_verify, "quantize": cmd_quantize, "validate": cmd_validate, "inspect": cmd_inspect, "llm": cmd_llm,
    }  # fmt: skip
    try:
        return handlers[args.cmd](args)
    except (EdgeSDKError, ConverterError, FileExistsError) as e:
        print(f"edge-convert: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
