"""Import to first result in a fresh interpreter: edge_sdk against the floor of its own parts.

Three arms, each a ``python -c`` child timed from inside (interpreter start excluded), interleaved:

* ``floor``: what any program that runs this model needs: ``import numpy, cv2`` and LiteRT's
  ``Interpreter``, the model file loaded, tensors allocated, the image read, resized and normalised
  with OpenCV, one ``invoke``;
* ``edge_sdk first``: ``import edge_sdk; edge_sdk.load(PKG).predict_image(IMG)`` with an empty cache
  folder (the sandbox child parses the model once and remembers its digest; the optimised-model
  cache is written);
* ``edge_sdk warm``: the same with that cache folder filled by an earlier run (the sandbox skipped).

The package is the BlazeFace short-range face detector from ``tools/bench/bench_pipeline.py`` (the
``.tflite`` MediaPipe ships, pinned by digest), the image a frame of its clip. Modules are
byte-compiled (one warm-up run each; this machine's ``PYTHONDONTWRITEBYTECODE`` is unset for the
children, as a pip install leaves ``.pyc`` files). Medians of ``--samples`` runs per arm.

Then, in this process: warm-cache ``edge_sdk.load`` of a 14 MB MobileNetV2 package (random weights;
its files dated back past the digest cache's racy window, as a package on disk is) against a raw
``InferenceSession`` built from the same file with the same threads and optimisation level,
``--pairs`` interleaved pairs.

    python tools/bench/bench_cold.py [--samples 9] [--pairs 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from tools.fixtures.face_clip import write_clip  # noqa: E402
from tools.fixtures.face_package import MODEL_NAME, write_face_package  # noqa: E402

FLOOR = (
    "import time, json; t0 = time.perf_counter(); import numpy as np, cv2; "
    "from ai_edge_litert.interpreter import Interpreter; t1 = time.perf_counter(); "
    "it = Interpreter(model_path={model!r}, num_threads={threads}); it.allocate_tensors(); "
    "i = it.get_input_details()[0]; h, w = int(i['shape'][1]), int(i['shape'][2]); t2 = time.perf_counter(); "
    "img = cv2.imread({img!r}); x = cv2.resize(cv2.cvtColor(img, cv2.COLOR_BGR2RGB), (w, h)).astype(np.float32); "
    "x = (x / 127.5 - 1.0)[None]; it.set_tensor(i['index'], x); it.invoke(); "
    "out = [it.get_tensor(o['index']) for o in it.get_output_details()]; t3 = time.perf_counter(); "
    "print(json.dumps({{'total_ms': (t3 - t0) * 1e3, 'import_ms': (t1 - t0) * 1e3, 'load_ms': (t2 - t1) * 1e3, 'first_ms': (t3 - t2) * 1e3}}))"
)
SDK = (
    "import time, json; t0 = time.perf_counter(); import edge_sdk; t1 = time.perf_counter(); "
    "m = edge_sdk.load({pkg!r}); t2 = time.perf_counter(); r = m.predict_image({img!r}); t3 = time.perf_counter(); "
    "print(json.dumps({{'total_ms': (t3 - t0) * 1e3, 'import_ms': (t1 - t0) * 1e3, 'load_ms': (t2 - t1) * 1e3, 'first_ms': (t3 - t2) * 1e3, "
    "'faces': len(r.decoded), 'variant': m.variant.id, 'threads': m.session.info.threads}}))"
)


def _run(code: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", code], cwd=str(cwd), env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"child failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def warm_load(work: Path, pairs: int, threads: int = 2) -> dict[str, Any]:
    import onnxruntime as ort

    import edge_sdk
    from converters.packaging import write_package
    from tools.fixtures.mobilenetv2 import build_mobilenetv2

    pkg = work / "mnv2"
    write_package(
        pkg,
        {
            "name": "mobilenetv2-random", "version": "1", "task": "raw",
            "inputs": [{"name": "input", "dtype": "float32", "shape": [1, 3, 224, 224], "layout": "NCHW"}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 1000]}],
            "variants": [{"id": "fp32-onnx", "file": "model.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        },
        files={"model.onnx": build_mobilenetv2(1.0, 224, batch=1).SerializeToString()},
    )  # fmt: skip
    cache = work / "mnv2-cache"
    edge_sdk.load(pkg, cache_dir=cache, threads=threads).close()  # writes the optimised model
    old = time.time() - 60
    for f in [*pkg.rglob("*"), *cache.rglob("*")]:
        if f.is_file():
            os.utime(f, (old, old))
    time.sleep(2.6)  # utime sets ctime to now: let the files age past the digest cache's racy window (2.5 s)

    def raw() -> Any:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(pkg / "model.onnx"), so, providers=["CPUExecutionProvider"])

    sdk_ms: list[float] = []
    raw_ms: list[float] = []
    for i in range(pairs):
        for arm in ("sdk", "raw") if i % 2 == 0 else ("raw", "sdk"):
            t0 = time.perf_counter()
            if arm == "sdk":
                m = edge_sdk.load(pkg, cache_dir=cache, threads=threads)
                sdk_ms.append((time.perf_counter() - t0) * 1e3)
                assert m.session.info.optimized_cache.startswith("hit"), m.session.info.optimized_cache
                m.close()
            else:
                s = raw()
                raw_ms.append((time.perf_counter() - t0) * 1e3)
                del s
    return {
        "threads": threads, "pairs": pairs,
        "load_median_ms": round(statistics.median(sdk_ms), 1), "raw_session_median_ms": round(statistics.median(raw_ms), 1),
        "ratio": round(statistics.median(sdk_ms) / statistics.median(raw_ms), 2),
        "per_pair_ratio_median": round(statistics.median(a / b for a, b in zip(sdk_ms, raw_ms)), 2),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import cv2

    from tools.fixtures.fetch_pretrained import fetch

    rec = machine_record()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = fetch(MODEL_NAME)
        pkg = write_face_package(work / "face-pkg", model)
        frames = write_clip(work / "clip.avi", 8)
        cap = cv2.VideoCapture(str(work / "clip.avi"))
        ok, img = cap.read()
        cap.release()
        assert ok and frames
        cv2.imwrite(str(work / "frame0.png"), img)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        warm_env = dict(env, EDGE_SDK_CACHE=str(work / "cache-warm"))
        probe = _run(SDK.format(pkg=str(pkg), img=str(work / "frame0.png")), warm_env, work)  # warm-up: .pyc files, the warm cache
        floor_code = FLOOR.format(model=str(model), img=str(work / "frame0.png"), threads=probe["threads"])
        sdk_code = SDK.format(pkg=str(pkg), img=str(work / "frame0.png"))
        _run(floor_code, env, work)
        res: dict[str, list[dict[str, Any]]] = {"floor": [], "edge_sdk first": [], "edge_sdk warm": []}
        for k in range(args.samples):
            order = list(res) if k % 2 == 0 else list(reversed(res))
            for arm in order:
                if arm == "floor":
                    res[arm].append(_run(floor_code, env, work))
                elif arm == "edge_sdk warm":
                    res[arm].append(_run(sdk_code, warm_env, work))
                else:
                    first = work / f"cache-first-{k}"
                    shutil.rmtree(first, ignore_errors=True)
                    res[arm].append(_run(sdk_code, dict(env, EDGE_SDK_CACHE=str(first)), work))
        warm = warm_load(work, args.pairs)
    finish_record(rec)
    keys = ("total_ms", "import_ms", "load_ms", "first_ms")
    med = {arm: {k: round(statistics.median(x[k] for x in xs), 1) for k in keys} for arm, xs in res.items()}
    out = {
        "machine": rec,
        "variant": probe["variant"],
        "threads": probe["threads"],
        "faces": [x.get("faces") for x in res["edge_sdk warm"]],
        "median": med,
        "ratio_first_vs_floor": round(med["edge_sdk first"]["total_ms"] / med["floor"]["total_ms"], 2),
        "ratio_warm_vs_floor": round(med["edge_sdk warm"]["total_ms"] / med["floor"]["total_ms"], 2),
        "samples": args.samples,
        "warm_load_vs_raw_session": warm,
    }
    print(f"variant {out['variant']}, threads {out['threads']}, {args.samples} samples per arm, medians (ms):")
    print(f"{'arm':16} {'total':>8} {'import':>8} {'load':>8} {'first':>8}")
    for arm, m in med.items():
        print(f"{arm:16} {m['total_ms']:8.1f} {m['import_ms']:8.1f} {m['load_ms']:8.1f} {m['first_ms']:8.1f}")
    print(f"edge_sdk / floor: first {out['ratio_first_vs_floor']}x, warm {out['ratio_warm_vs_floor']}x (target <= 1.5x)")
    print(
        f"warm-cache load of MobileNetV2 {warm['load_median_ms']} ms vs raw session {warm['raw_session_median_ms']} ms: "
        f"{warm['ratio']}x (per-pair median {warm['per_pair_ratio_median']}x; target <= 1.5x)"
    )
    print(machine_line(rec))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
