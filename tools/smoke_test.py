#!/usr/bin/env python3
"""Install smoke test: is an installed edge_sdk usable on this machine?

    python3 tools/smoke_test.py [--json FILE] [--skip-convert] [--work DIR]

Checks, printing one ``PASS``/``FAIL`` line (with its time) for each:

1. versions: machine, Python, edge_sdk (and where it was imported from), numpy,
   onnxruntime, ai-edge-litert, onnx;
2. ``edge_sdk.detect()`` on this machine (profile arch == ``platform.machine()``),
   and on fake device trees of a Raspberry Pi 5 and a Jetson Orin Nano (JetPack 6);
3. ``edge_sdk.load`` of the bundled demo package forcing each of ``fp32-onnx``,
   ``int8-onnx`` (ONNX Runtime) and ``fp32-tflite`` (LiteRT), then
   ``predict_image`` on the 12 bundled sample images: every label must be right;
4. ``edge-convert quantize`` (the installed console script, a real subprocess) of
   the demo's fp32 ONNX model to int8 with a small calibration folder made from the
   samples; the package it writes must verify, load and label every sample right.

Needs only the installed package (``edge-sdk[all]``), nothing from the source
tree, so it runs against a wheel installed anywhere (tools/arm64_install_proof.sh
runs it in an emulated Debian arm64 root). Exit status 0 when everything passed,
1 otherwise. Keep it small: under qemu everything is 10-20x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

DEMO_VARIANTS = ("fp32-onnx", "int8-onnx", "fp32-tflite")
_results: list[dict[str, Any]] = []


def _check(name: str, fn: Callable[[], str]) -> bool:
    t0 = time.perf_counter()
    try:
        detail = fn()
        ok = True
    except Exception as e:  # noqa: BLE001 - a smoke test reports every failure and goes on
        detail = f"{type(e).__name__}: {e}"
        ok = False
        traceback.print_exc(file=sys.stdout)
    dt = time.perf_counter() - t0
    _results.append({"check": name, "ok": ok, "seconds": round(dt, 3), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'} {name} ({dt:.2f} s){': ' + detail if detail else ''}", flush=True)
    return ok


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def check_versions() -> str:
    import edge_sdk

    lines = [
        f"machine {platform.machine()}; {platform.system()} {platform.release()}; libc {' '.join(platform.libc_ver())}",
        f"python {platform.python_version()} ({platform.python_implementation()}) at {sys.executable}",
        f"edge_sdk {edge_sdk.__version__} from {Path(edge_sdk.__file__).parent}",
    ]
    lines += [f"{d} {_dist_version(d)}" for d in ("numpy", "onnxruntime", "ai-edge-litert", "onnx", "opencv-python-headless")]
    for line in lines:
        print("    " + line)
    return ""


def check_detect_host() -> str:
    import edge_sdk

    det = edge_sdk.detect()
    print("    " + det.explain().replace("\n", "\n    "))
    machine = platform.machine()
    if det.profile.arch != machine:
        raise AssertionError(f"profile {det.profile.name} is for {det.profile.arch}, this machine is {machine}")
    if det.facts.machine != machine:
        raise AssertionError(f"facts.machine {det.facts.machine!r} != platform.machine() {machine!r}")
    return f"{det.profile.name} [{det.source}]"


def _write(root: Path, rel: str, data: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _arm_cpuinfo(part: str, n: int) -> str:
    block = (
        "processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp "
        "cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\n"
        "CPU part\t: {part}\nCPU revision\t: 1\n\n"
    )
    return "".join(block.format(i=i, part=part) for i in range(n))


def check_detect_fake_boards(work: Path) -> str:
    import edge_sdk

    pi5 = work / "fake-pi5"
    _write(pi5, "proc/device-tree/model", b"Raspberry Pi 5 Model B Rev 1.0\0")
    _write(pi5, "proc/device-tree/compatible", b"raspberrypi,5-model-b\0brcm,bcm2712\0")
    _write(pi5, "proc/cpuinfo", _arm_cpuinfo("0xd0b", 4))
    _write(pi5, "proc/meminfo", "MemTotal:        8245360 kB\n")
    orin = work / "fake-orin-nano"
    _write(orin, "proc/device-tree/model", b"NVIDIA Jetson Orin Nano Developer Kit\0")
    _write(orin, "proc/device-tree/compatible", b"nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0")
    _write(orin, "etc/nv_tegra_release", "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64\n")
    _write(orin, "proc/cpuinfo", _arm_cpuinfo("0xd42", 6))
    _write(orin, "proc/meminfo", "MemTotal:        7802040 kB\n")
    got = []
    for root, want, mem in ((pi5, "raspberry-pi-5", 8052), (orin, "jetson-orin-nano", 7619)):
        det = edge_sdk.detect(root)
        print("    " + det.explain().replace("\n", "\n    "))
        if det.profile.name != want or det.fallback or det.facts.machine != "aarch64" or det.facts.mem_total_mb != mem:
            raise AssertionError(
                f"{root.name}: got {det.profile.name} (fallback={det.fallback}, machine={det.facts.machine}, "
                f"mem={det.facts.mem_total_mb}), expected {want} on aarch64 with {mem} MiB"
            )
        got.append(f"{root.name} -> {det.profile.name}")
    return "; ".join(got)


def _sample_label(path: Path) -> str:
    return path.stem.rsplit("_", 1)[0]


def _predict_all(model: Any, samples: list[Path]) -> list[str]:
    wrong = []
    for s in samples:
        r = model.predict_image(s)
        if r.top1.label != _sample_label(s):
            wrong.append(f"{s.name} -> {r.top1.label} ({r.top1.score:.3f})")
    return wrong


def check_demo_variant(variant: str, cache: Path) -> str:
    import edge_sdk
    from edge_sdk.assets import demo_samples

    samples = demo_samples()
    if len(samples) != 12:
        raise AssertionError(f"expected 12 bundled sample images, found {len(samples)}")
    t0 = time.perf_counter()
    with edge_sdk.load(edge_sdk.demo_package_path(), variant=variant, cache_dir=cache) as model:
        t_load = time.perf_counter() - t0
        if model.variant.id != variant:
            raise AssertionError(f"asked for {variant}, loaded {model.variant.id}")
        t1 = time.perf_counter()
        wrong = _predict_all(model, samples)
        t_pred = (time.perf_counter() - t1) / len(samples)
        r = model.predict_image(samples[0])
    if wrong:
        raise AssertionError(f"{len(wrong)}/12 wrong: {', '.join(wrong)}")
    want = "litert" if variant.endswith("-tflite") else "onnxruntime"
    if r.backend != want:
        raise AssertionError(f"{variant} ran on {r.backend}, expected {want}")
    p = r.provenance
    return (
        f"12/12 right; backend {r.backend} ({p.runtime} {p.runtime_version}), profile {p.profile}; "
        f"load {t_load:.2f} s, {t_pred * 1000:.1f} ms/image"
    )


def _edge_convert() -> list[str]:
    exe = shutil.which("edge-convert", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    return [exe] if exe else [sys.executable, "-m", "converters.cli"]


def check_convert(work: Path, cache: Path) -> str:
    import cv2
    import numpy as np

    import edge_sdk
    from edge_sdk.assets import demo_samples

    # Calibration folder: the samples and 3 shifted/mirrored copies each, in class subfolders (48 images).
    cal = work / "calibration"
    for s in demo_samples():
        img = cv2.imread(str(s), cv2.IMREAD_COLOR)
        if img is None:
            raise AssertionError(f"OpenCV could not read {s}")
        d = cal / _sample_label(s)
        d.mkdir(parents=True, exist_ok=True)
        for k, im in enumerate((img, cv2.flip(img, 1), np.roll(img, 2, axis=0), np.roll(img, -2, axis=1))):
            cv2.imwrite(str(d / f"{s.stem}_{k}.png"), im)
    out = work / "converted"
    cmd = [
        *_edge_convert(), "quantize", str(edge_sdk.demo_package_path() / "model_fp32.onnx"),
        "--calibration", str(cal), "--to", "int8", "--out", str(out), "--task", "classification",
        "--name", "shapes-smoke", "--preprocess", "size=32x32,mean=0.5:0.5:0.5,std=0.25:0.25:0.25",
        "--dim", "batch=1:16", "--class-names", str(work / "classes.txt"), "--quiet",
    ]  # fmt: skip
    (work / "classes.txt").write_text("circle\nsquare\ntriangle\ncross\n")
    print("    $ " + " ".join(Path(cmd[0]).name if i == 0 else c for i, c in enumerate(cmd)))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in (p.stdout + p.stderr).strip().splitlines():
        print("    | " + line)
    if p.returncode != 0:
        raise AssertionError(f"edge-convert quantize exited {p.returncode}")
    v = subprocess.run([*_edge_convert(), "verify", str(out)], capture_output=True, text=True, timeout=300)
    if v.returncode != 0:
        raise AssertionError(f"edge-convert verify exited {v.returncode}: {v.stdout}{v.stderr}")
    with edge_sdk.load(out, variant="int8-onnx", cache_dir=cache) as model:
        wrong = _predict_all(model, demo_samples())
        q = model.variant.quality
    if wrong:
        raise AssertionError(f"converted int8: {len(wrong)}/12 wrong: {', '.join(wrong)}")
    return (
        f"int8-onnx written, verified, loaded: 12/12 right; measured cosine {q.cosine:.5f}, "
        f"top-1 agreement {q.top1_agreement:.3f} on {q.samples} held-out samples"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the results here as JSON")
    ap.add_argument("--skip-convert", action="store_true", help="leave out the edge-convert check")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    tmp = None
    if args.work:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="edge-sdk-smoke-")
        work = Path(tmp.name)
    cache = work / "cache"
    try:
        _check("versions", check_versions)
        _check("detect: this machine", check_detect_host)
        _check("detect: fake Raspberry Pi 5 and Jetson Orin Nano trees", lambda: check_detect_fake_boards(work))
        for variant in DEMO_VARIANTS:
            _check(f"load + predict_image: demo {variant}", lambda v=variant: check_demo_variant(v, cache))
        if not args.skip_convert:
            _check("edge-convert quantize int8 + load + predict", lambda: check_convert(work, cache))
    finally:
        if tmp is not None:
            tmp.cleanup()
    failed = [r["check"] for r in _results if not r["ok"]]
    total = time.perf_counter() - t0
    summary = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "passed": len(_results) - len(failed),
        "failed": failed,
        "seconds": round(total, 2),
        "results": _results,
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    verdict = "SMOKE TEST PASSED" if not failed else f"SMOKE TEST FAILED ({', '.join(failed)})"
    print(
        f"{verdict}: {summary['passed']}/{len(_results)} checks on {platform.machine()} Python {platform.python_version()} in {total:.1f} s"
    )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
