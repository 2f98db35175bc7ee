"""Quantize your own model: from an fp32 ONNX model to a gated edge_sdk package with `edge-convert`.

    # your model: an image classifier, a folder of calibration images and one of held-out images
    # (class subfolders give the labels: held-out/circle/*.png, held-out/square/*.png, ...)
    python samples/quantize_own_model.py model.onnx --calibration calib/ --validation held-out/ \\
        --preprocess size=224x224,mean=0.485:0.456:0.406,std=0.229:0.224:0.225 --class-names classes.txt \\
        --out my-package/ --image cat.jpg
    # no model of your own yet (what CI runs): the demo's fp32 shapes classifier and shapes drawn here
    python samples/quantize_own_model.py --demo --out shapes-package/

It runs the three `edge-convert` steps a model owner runs, as the commands you would type:

1. `edge-convert inspect MODEL`: the ops, inputs and outputs, and which quantization modes apply;
2. `edge-convert quantize MODEL --to int8,fp16 ...`: every variant measured against the fp32
   reference on the held-out data and gated (classification default: cosine >= 0.99, top-1
   agreement >= 98 %); a variant that fails is repaired or left out, never shipped silently;
3. `edge-convert validate PKG --data HELD-OUT`: the package re-measured through edge_sdk.load, the
   path a device runs.

Then it loads the written package as an app would and shows which variants passed their gate, what
was measured (report.json in the package), which variant this device picks, and one prediction.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import edge_sdk


class StepFailed(Exception):
    """An edge-convert step exited with an error (its message is in the exception)."""


def edge_convert(*args: str) -> str:
    """Run `edge-convert ARGS` as a subprocess with this interpreter (the same as the `edge-convert`
    command that `pip install edge-sdk[converter]` puts on PATH), echo it, return its output."""
    print("$ edge-convert " + " ".join(shlex.quote(a) for a in args), flush=True)
    p = subprocess.run([sys.executable, "-m", "converters.cli", *args], capture_output=True, text=True, timeout=600)
    print(p.stdout, end="", flush=True)
    if p.returncode != 0:
        # 1: an error (stderr says which, typed); 3: quantize wrote the package but a target could not apply
        raise StepFailed(f"edge-convert {args[0]} exited with code {p.returncode}: {p.stderr.strip() or p.stdout.strip()[-500:]}")
    return p.stdout


def make_demo_data(workdir: Path) -> dict[str, str]:
    """The demo's inputs: its fp32 ONNX model, and shapes drawn by tools/fixtures/train_demo.py (seeds it never
    trained on) as PNGs in class subfolders: 64 for calibration, 48 held out. Small on purpose, so the
    sample runs in seconds; use a few hundred of your own images for a real model."""
    import cv2

    from edge_sdk.package import ModelPackage
    from tools.fixtures.train_demo import make_split  # in the repository checkout, not in the wheel

    demo = ModelPackage.open(edge_sdk.demo_package_path()).manifest
    labels = demo.labels
    for name, seed, n in (("calibration", 101, 64), ("held-out", 102, 48)):
        x, y = make_split(seed, n)
        for i, (img, lab) in enumerate(zip(x, y)):
            d = workdir / name / labels[int(lab)]
            d.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(d / f"{i:03d}.png"), img[:, :, ::-1])  # RGB -> BGR for OpenCV
    (workdir / "classes.txt").write_text("\n".join(labels) + "\n")
    # The preprocessing the model was trained with, written the way --preprocess takes it.
    p = demo.inputs[0].preprocess
    pre = (f"size={p.size_hw[0]}x{p.size_hw[1]},resize={p.resize},color={p.color},scale={p.scale!r},"
           f"mean={':'.join(map(str, p.mean))},std={':'.join(map(str, p.std))},interpolation={p.interpolation}")  # fmt: skip
    some = sorted((workdir / "held-out" / labels[0]).glob("*.png"))[0]
    return {
        "model": str(edge_sdk.demo_package_path() / "model_fp32.onnx"),
        "calibration": str(workdir / "calibration"),
        "validation": str(workdir / "held-out"),
        "preprocess": pre,
        "class_names": str(workdir / "classes.txt"),
        "image": str(some),
        "name": "shapes-quantized",
    }


def run(args: argparse.Namespace, workdir: Path) -> int:
    if args.demo:
        src = make_demo_data(workdir)
    else:
        src = {k: getattr(args, k) for k in ("model", "calibration", "validation", "preprocess", "class_names", "image", "name")}
    out = Path(args.out)

    # 1. What is in the model, and which modes apply (a CNN takes static int8; int4 needs MatMul).
    edge_convert("inspect", src["model"])

    # 2. Quantize, measure and gate. --dim bounds the dynamic batch dim so the package declares it.
    q = ["quantize", src["model"], "--calibration", src["calibration"], "--to", args.to, "--out", str(out),
         "--task", "classification", "--dim", args.dim, "--limit", str(args.limit), "--quiet"]  # fmt: skip
    for flag, key in (("--validation", "validation"), ("--preprocess", "preprocess"), ("--class-names", "class_names"), ("--name", "name")):
        if src.get(key):
            q += [flag, src[key]]
    if args.overwrite:
        q.append("--overwrite")
    edge_convert(*q)

    # 3. Re-measure the written package on the held-out data, through edge_sdk.load.
    edge_convert("validate", str(out), "--data", src["validation"] or src["calibration"], "--limit", str(args.limit), "--quiet")

    # What was measured and gated, from the report the converter wrote into the package.
    report = json.loads((out / "report.json").read_text())
    print(
        f"\ngates (reference {report['reference']}, measured on {(report.get('validation') or {}).get('samples', '?')} held-out samples):"
    )
    for v in report["variants"]:
        g, qual = v["gate"], v["quality"]
        status = "PASS" if g["passed"] else ("FORCED" if g.get("forced") else "FAIL")
        figures = ", ".join(f"{k} {qual[k]:.4f}" for k in ("cosine", "top1_agreement") if qual.get(k) is not None)
        acc = f", {qual['metric']} {qual['value']:.4f}" if qual.get("metric") and qual.get("value") is not None else ""
        lat = f", {v['latency_ms']:.3f} ms" if v.get("latency_ms") else ""
        print(f"  {v['id']:<10} {status:<6} {'written' if v['written'] else 'left out'}: {figures or 'reference'}{acc}{lat}")
        for why in g.get("failures", ()):
            print(f"  {'':<10} {why}")

    # Load it as an app would: the device picks among the variants that passed (and runs here).
    with edge_sdk.load(out, args.profile) as model:
        print(
            f"\nloaded {model.manifest.name} {model.manifest.version}: variants {[v.id for v in model.manifest.variants]}; "
            f"this device ({model.detection.profile.name}) runs {model.variant.id}"
        )
        if src.get("image"):
            r = model.predict_image(src["image"])
            print(f"predict {src['image']}: {r.top1.label} {r.top1.score:.3f} ({model.variant.id}, {r.timings.total_ms:.2f} ms)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Quantize an fp32 ONNX classifier into a measured, gated edge_sdk package with edge-convert.")
    ap.add_argument("model", nargs="?", help="your fp32 ONNX model (not with --demo)")
    ap.add_argument("--demo", action="store_true", help="use the demo's fp32 shapes classifier and shapes drawn here")
    ap.add_argument("--calibration", help="calibration images (a folder; class subfolders give labels), .npy/.npz, video or .csv")
    ap.add_argument("--validation", help="held-out data (default: edge-convert holds out 25 %% of the calibration data)")
    ap.add_argument("--preprocess", help="image input: size=HxW,mean=a:b:c,std=a:b:c,... (see edge-convert quantize --help)")
    ap.add_argument("--class-names", help="text file, one class name per line")
    ap.add_argument("--name", help="package name (default: the model file's name)")
    ap.add_argument("--image", help="an image to classify with the package at the end")
    ap.add_argument("--out", required=True, help="package folder to write")
    ap.add_argument("--to", default="int8,fp16", help="variants to make (default int8,fp16)")
    ap.add_argument("--dim", default="batch=1:16", help="bounds of the dynamic batch dim (default batch=1:16)")
    ap.add_argument("--limit", type=int, default=256, help="at most this many samples per data set (default 256)")
    ap.add_argument("--profile", help="device profile to load the package with (default: $EDGE_SDK_PROFILE or detected)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing package in --out")
    args = ap.parse_args(argv)
    if args.demo == bool(args.model):
        ap.error("give exactly one of MODEL (your fp32 ONNX model) or --demo")
    if not args.demo and not args.calibration:
        ap.error("--calibration is required with your own model")

    try:
        with tempfile.TemporaryDirectory(prefix="quantize-demo-") as tmp:
            return run(args, Path(tmp))
    except StepFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except edge_sdk.EdgeSDKError as e:  # the package does not load, no variant for this device, a bad image ...
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
