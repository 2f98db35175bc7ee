"""Benchmark the converter's variants against fp32 on this machine.

    python tools/bench/bench_convert.py [--quick] [--json OUT]

A. int8 on a MobileNetV2-class CNN (tools/fixtures/mobilenetv2.py, random weights,
   calibrated on 32 random inputs): static QDQ with uint8 activations (the
   default), static QDQ with int8 activations, and dynamic int8 — latency at
   batch 1 (threads 1 and 2) and cosine vs fp32 on 32 held-out inputs.
   Target: >= 1.8x faster than fp32 at cosine >= 0.999.
B. int4 on a MatMul-heavy model (an MLP of 4096x4096 MatMuls, random weights):
   MatMulNBits block 32 with accuracy_level 4 (int8 compute) and without it —
   size ratio and latency at batch 1. Target: <= 0.2x size, >= 5x faster.
C. fp16 on the CNN, on the CPU (for reference; fp16 is meant for GPU profiles).

Each comparison runs its arms interleaved in rounds through edge_sdk.load
(variant forced), medians of per-call wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_convert.py)
sys.path.insert(0, str(ROOT))


def _interleave(fns: dict[str, Callable[[], Any]], rounds: int, per: int) -> dict[str, float]:
    for f in fns.values():
        for _ in range(3):
            f()
    t: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            for _ in range(per):
                a = time.perf_counter_ns()
                fns[k]()
                t[k].append((time.perf_counter_ns() - a) / 1e6)
    return {k: float(np.median(v)) for k, v in t.items()}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _package(work: Path, name: str, files: dict[str, Path], inp: dict, out: dict) -> Path:
    from converters.packaging import write_package

    variants = [
        {"id": vid, "file": f.name, "backend": "onnxruntime", "precision": vid.split("-")[0], **({"reference": True} if vid.startswith("fp32") else {})}
        for vid, f in files.items()
    ]
    root = work / name
    write_package(root, {"schema": 1, "name": name, "version": "1", "task": "raw", "inputs": [inp], "outputs": [out], "variants": variants}, {f.name: f for f in files.values()})
    return root


def bench_cnn(work: Path, quick: bool) -> list[dict[str, Any]]:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader

    import edge_sdk
    from converters.quantize import Int8Options, convert_fp16, preprocess, quantize_int8
    from tools.fixtures.mobilenetv2 import build_mobilenetv2

    onnx.save(build_mobilenetv2(1.0, 224, batch=1), work / "fp32.onnx")
    prep = preprocess(work / "fp32.onnx", work / "prep.onnx")
    rng = np.random.default_rng(0)
    cal = [{"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)} for _ in range(32)]
    held = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(8 if quick else 32)]

    def reader() -> CalibrationDataReader:
        class R(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(cal)

            def get_next(self):  # type: ignore[override]
                return next(self.it, None)

        return R()

    files = {"fp32-cnn": work / "fp32.onnx"}
    methods = {
        "int8-u8s8": Int8Options(method="static", activation_type="uint8"),
        "int8-s8s8": Int8Options(method="static", activation_type="int8"),
        "int8-dynamic": Int8Options(method="dynamic"),
    }
    desc = {}
    for vid, o in methods.items():
        desc[vid] = quantize_int8(prep, work / f"{vid}.onnx", o, reader)
        files[vid] = work / f"{vid}.onnx"
    desc["fp16-cnn"] = convert_fp16(work / "fp32.onnx", work / "fp16-cnn.onnx")
    files["fp16-cnn"] = work / "fp16-cnn.onnx"
    pkg = _package(work, "mnv2", files, {"name": "input", "dtype": "float32", "shape": [1, 3, 224, 224]}, {"name": "logits", "dtype": "float32", "shape": [1, 1000]})
    rows = []
    for th in (1, 2):
        models = {vid: edge_sdk.load(pkg, "generic-x86_64", variant=vid, threads=th, measure_backends=False, cache_dir=work / "cache") for vid in files}
        outs = {vid: np.concatenate([m.predict(x).outputs["logits"] for x in held]) for vid, m in models.items()}
        x = held[0]
        lat = _interleave({vid: (lambda m=m, x=x: m.predict(x)) for vid, m in models.items()}, 4 if quick else 12, 2 if quick else 4)
        for vid in files:
            rows.append({
                "model": "MobileNetV2 1.0/224 (random weights)", "variant": vid, "method": desc.get(vid, "fp32 reference"), "threads": th,
                "latency_ms": lat[vid], "speedup": lat["fp32-cnn"] / lat[vid], "cosine": _cos(outs["fp32-cnn"], outs[vid]),
                "size_ratio": files[vid].stat().st_size / files["fp32-cnn"].stat().st_size,
            })  # fmt: skip
        for m in models.values():
            m.close()
    return rows


def build_mlp(width: int, layers: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
            prev = f"r{i}"
        else:
            nodes.append(helper.make_node("Identity", [f"m{i}"], ["y"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def bench_mlp(work: Path, quick: bool) -> list[dict[str, Any]]:
    import onnx

    import edge_sdk
    from converters.quantize import Int4Options, quantize_int4

    width, layers = (2048, 2) if quick else (4096, 4)
    onnx.save(build_mlp(width, layers), work / "mlp.onnx")
    files = {"fp32-mlp": work / "mlp.onnx"}
    desc = {}
    for vid, lvl in (("int4-acc4", 4), ("int4-acc0", 0)):
        desc[vid] = quantize_int4(work / "mlp.onnx", work / f"{vid}.onnx", Int4Options(block_size=32, accuracy_level=lvl))
        files[vid] = work / f"{vid}.onnx"
    spec = {"name": "x", "dtype": "float32", "shape": [1, width]}
    pkg = _package(work, "mlp", files, spec, {"name": "y", "dtype": "float32", "shape": [1, width]})
    rng = np.random.default_rng(1)
    held = [rng.standard_normal((1, width)).astype(np.float32) for _ in range(16)]
    rows = []
    for th in (1, 2):
        models = {vid: edge_sdk.load(pkg, "generic-x86_64", variant=vid, threads=th, measure_backends=False, cache_dir=work / "cache") for vid in files}
        outs = {vid: np.concatenate([m.predict(x).outputs["y"] for x in held]) for vid, m in models.items()}
        lat = _interleave({vid: (lambda m=m: m.predict(held[0])) for vid, m in models.items()}, 4 if quick else 12, 3 if quick else 8)
        for vid in files:
            rows.append({
                "model": f"MLP {layers}x MatMul {width}x{width} (random weights)", "variant": vid, "method": desc.get(vid, "fp32 reference"),
                "threads": th, "latency_ms": lat[vid], "speedup": lat["fp32-mlp"] / lat[vid], "cosine": _cos(outs["fp32-mlp"], outs[vid]),
                "size_ratio": files[vid].stat().st_size / files["fp32-mlp"].stat().st_size,
            })  # fmt: skip
        for m in models.values():
            m.close()
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | variant | threads | latency ms | speed-up vs fp32 | cosine vs fp32 | size vs fp32 | method |", "|---|---|--:|--:|--:|--:|--:|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['threads']} | {r['latency_ms']:.3f} | {r['speedup']:.2f}x | {r['cosine']:.6f} | {r['size_ratio']:.3f} | {r['method']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models and few calls (~20 s)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    machine = machine_record()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "cnn").mkdir()
        (work / "mlp").mkdir()
        rows = bench_cnn(work / "cnn", args.quick) + bench_mlp(work / "mlp", args.quick)
    import platform

    import onnxruntime

    head = f"{platform.machine()} | onnxruntime {onnxruntime.__version__} | {time.perf_counter() - t0:.0f} s\nCPU: {machine_line(finish_record(machine))}"
    print(head + "\n\n" + render(rows))
    if args.json:
        args.json.write_text(json.dumps({"header": head, "machine_record": machine, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
