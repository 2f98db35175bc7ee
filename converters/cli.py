"""``edge-convert``: build and check model packages.

    edge-convert package OUT --name N --version V --task T \\
        --variant fp32-onnx=model.onnx:onnxruntime:fp32 --variant int8-tfl=m.tflite:litert:int8 \\
        [--reference fp32-onnx] [--dim batch=1:8] [--labels labels.txt] [--overwrite]
    edge-convert verify PACKAGE

``package`` reads each model's own signature (ONNX: a wire-format scan, no
runtime; TFLite: the interpreter's tensor details) for the package-level
inputs/outputs, takes the first variant as the reference unless told, copies
the files, digests them and writes ``edge-model.toml``. Dynamic dims need
bounds (``--dim NAME=MIN:MAX``); a TFLite variant whose layout differs gets
its own input/output specs. Quantization (int8/int4/fp16) with measured
quality comes with issue 3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from edge_sdk.errors import EdgeSDKError


def _onnx_specs(path: Path, dims: dict[str, tuple[int, int]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from edge_sdk._modelfile import scan_onnx

    info = scan_onnx(path.read_bytes())

    def spec(t: Any, is_input: bool) -> dict[str, Any]:
        if t.dims is None or t.dtype is None:
            raise SystemExit(f"edge-convert: {path.name}: tensor {t.name!r} has no static type/rank; cannot describe it")
        shape: list[Any] = []
        used: dict[str, list[int]] = {}
        for i, d in enumerate(t.dims):
            if isinstance(d, int) and d > 0:
                shape.append(d)
            else:
                name = d if isinstance(d, str) and d else f"{t.name}_d{i}"
                shape.append(name)
                if is_input:
                    if name not in dims:
                        raise SystemExit(f"edge-convert: input {t.name!r} dim {i} ({name}) is dynamic: give --dim {name}=MIN:MAX")
                    used[name] = list(dims[name])
        d: dict[str, Any] = {"name": t.name, "dtype": t.dtype, "shape": shape}
        if used:
            d["dims"] = used
        return d

    return [spec(t, True) for t in info.inputs], [spec(t, False) for t in info.outputs]


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
    from edge_sdk.package import ModelPackage

    pkg = ModelPackage.open(args.package)
    for v in pkg.manifest.variants:
        print(f"ok {v.id} {v.file} {v.sha256}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="edge-convert", description="Build and check edge_sdk model packages.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("package", help="write a package from model files")
    p.add_argument("out", type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--task", default="raw", choices=["classification", "detection", "segmentation", "embedding", "audio", "raw"])
    p.add_argument("--variant", action="append", required=True, metavar="ID=FILE:BACKEND:PRECISION")
    p.add_argument("--reference", help="variant id the others are measured against (default: the first)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=MIN:MAX", help="bounds of a dynamic input dim")
    p.add_argument("--labels", help="text file, one label per line")
    p.add_argument("--overwrite", action="store_true", help="replace files in a non-empty OUT")
    p = sub.add_parser("verify", help="open a package and verify every digest")
    p.add_argument("package")
    args = ap.parse_args(argv)
    try:
        return {"package": cmd_package, "verify": cmd_verify}[args.cmd](args)
    except (EdgeSDKError, FileExistsError) as e:
        print(f"edge-convert: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
