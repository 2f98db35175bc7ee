"""Per-frame image preprocessing: edge_sdk's OpenCV path vs a Pillow + numpy path.

    python tools/bench/bench_preprocess.py [--frames N] [--json OUT]

Both arms take the same 640x480 RGB uint8 frames to a model input (letterbox
or stretch to 224x224 or 128x128, mean/std, NCHW float32); arms interleaved,
medians and p99 per frame, and the largest difference between their outputs
(the two libraries' bilinear kernels differ slightly).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from edge_sdk.bench.machine import finish_record, machine_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tools/bench/bench_preprocess.py)
sys.path.insert(0, str(ROOT))


def pillow_path(img: np.ndarray, size_hw: tuple[int, int], resize: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    from PIL import Image

    h, w = img.shape[:2]
    th, tw = size_hw
    pil = Image.fromarray(img)
    if resize == "stretch":
        out = np.asarray(pil.resize((tw, th), Image.BILINEAR))
    else:
        s = min(th / h, tw / w)
        nh, nw = max(1, round(h * s)), max(1, round(w * s))
        canvas = Image.new("RGB", (tw, th), (114, 114, 114))
        canvas.paste(pil.resize((nw, nh), Image.BILINEAR), ((tw - nw) // 2, (th - nh) // 2))
        out = np.asarray(canvas)
    x = (out.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def main(argv: list[str] | None = None) -> int:
    from edge_sdk.package import ImagePreprocess, TensorSpec
    from edge_sdk.processing.image import preprocess_image

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    machine = machine_record()
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(8)]
    mean, std = np.array([0.5, 0.5, 0.5], np.float32), np.array([0.25, 0.25, 0.25], np.float32)
    rows = []
    for size in ((224, 224), (128, 128)):
        for mode in ("letterbox", "stretch"):
            spec = TensorSpec("x", "float32", (1, 3, *size), "NCHW", preprocess=ImagePreprocess(size, resize=mode, mean=tuple(mean), std=tuple(std)))
            t = {"opencv": [], "pillow": []}
            diff = 0.0
            for i in range(args.frames):
                f = frames[i % len(frames)]
                order = ("opencv", "pillow") if i % 2 == 0 else ("pillow", "opencv")
                outs = {}
                for arm in order:
                    a = time.perf_counter_ns()
                    outs[arm] = preprocess_image(f, spec)[0] if arm == "opencv" else pillow_path(f, size, mode, mean, std)
                    t[arm].append((time.perf_counter_ns() - a) / 1e3)
                diff = max(diff, float(np.abs(outs["opencv"] - outs["pillow"]).max()))
            r = {
                "size": f"{size[0]}x{size[1]}", "resize": mode,
                **{f"{k}_median_us": float(np.median(v)) for k, v in t.items()},
                **{f"{k}_p99_us": float(np.percentile(v, 99)) for k, v in t.items()},
                "max_abs_diff": diff,
            }  # fmt: skip
            r["pillow_over_opencv"] = r["pillow_median_us"] / r["opencv_median_us"]
            rows.append(r)
    print("| target | resize | OpenCV median us | OpenCV p99 us | Pillow median us | Pillow p99 us | Pillow / OpenCV | max abs diff |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(
            f"| {r['size']} | {r['resize']} | {r['opencv_median_us']:.0f} | {r['opencv_p99_us']:.0f} | {r['pillow_median_us']:.0f} | "
            f"{r['pillow_p99_us']:.0f} | {r['pillow_over_opencv']:.2f}x | {r['max_abs_diff']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"machine_record": finish_record(machine), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
