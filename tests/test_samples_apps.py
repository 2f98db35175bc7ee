"""The application samples (samples/offload_when_hot.py, embed_app.py, quantize_own_model.py) run as
a user runs them: a subprocess, from another folder, with PYTHONPATH at the checkout."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT

import edge_sdk
from edge_sdk.assets import demo_package_path, demo_samples
from edge_sdk.package import ModelPackage

SAMPLES = ROOT / "samples"
LABELS = ("circle", "square", "triangle", "cross")


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), EDGE_SDK_PROFILE="raspberry-pi-5", **extra)


def _run(name: str, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SAMPLES / name), *args], capture_output=True, text=True, cwd=cwd, env=_env(), timeout=timeout
    )


def _gone(pid: int) -> bool:
    """The process no longer runs: it does not exist, or it is a zombie waiting for a reaper
    (an orphan's reaper in a container may be slow)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- embed_app ------------------------------------------------------------------------------------


def test_embed_app_telemetry_is_consistent(tmp_path: Path) -> None:
    imgs = demo_samples()[:4]
    p = _run("embed_app.py", str(demo_package_path()), *map(str, imgs), "--repeat", "5", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for img in imgs:  # the demo images are named <label>_<n>.png
        assert re.search(rf"^{re.escape(str(img))}: {img.stem.rsplit('_', 1)[0]} [\d.]+  total [\d.]+ ms", out, re.M), out
    n = len(imgs) * 5
    prov = re.search(r"^provenance: shapes-classifier 1\.0\.0 variant (\S+) sha256 (\w{12}) on (onnxruntime|ai-edge-litert|tflite-runtime) ", out, re.M)
    assert prov, out
    variant = ModelPackage.open(demo_package_path()).manifest.variant(prov.group(1))
    assert variant.sha256[:12] == prov.group(2)
    assert f"telemetry: requests {n} errors {{}}" in out
    rows = re.findall(r"^(validate|preprocess|inference|decode|total)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert {r[0] for r in rows} == {"validate", "preprocess", "inference", "decode", "total"}, out
    for stage, count, p50, p90, p99 in rows:
        assert int(count) == n, (stage, count)
        assert 0 < float(p50) <= float(p90) <= float(p99), (stage, p50, p90, p99)
    total_p50 = next(float(r[2]) for r in rows if r[0] == "total")
    assert total_p50 >= next(float(r[2]) for r in rows if r[0] == "inference")
    assert f"registry: edge_sdk_model_requests_total{{variant={prov.group(1)}}} {n}" in out


def test_embed_app_errors(tmp_path: Path) -> None:
    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"nope")
    p = _run("embed_app.py", str(demo_package_path()), str(bad), cwd=tmp_path)
    assert p.returncode == 2 and "bad input:" in p.stderr and "not-an-image.png" in p.stderr
    p = _run("embed_app.py", str(tmp_path / "missing-package"), cwd=tmp_path)
    assert p.returncode == 1 and "ManifestError" in p.stderr and "missing-package" in p.stderr
    p = _run("embed_app.py", "--repeat", "0", cwd=tmp_path)
    assert p.returncode == 2 and "--repeat" in p.stderr


# -- offload_when_hot -----------------------------------------------------------------------------

REQ = re.compile(r"^#(\d+) (\S+): (\w+) [\d.]+( ok| WRONG.*)? \| served (local|remote) \((.*)\) \| (normal|constrained|critical) ")


def _requests(out: str) -> list[tuple[str, str, str, str]]:
    """(image name, label, served_by, reason) per request line."""
    return [(m.group(2), m.group(3), m.group(5), m.group(6)) for m in map(REQ.match, out.splitlines()) if m]


def test_offload_when_hot_demo(tmp_path: Path) -> None:
    p = _run("offload_when_hot.py", "--demo", "--duration", "6", "--requests", "400", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    out = p.stdout
    pid = int(re.search(r"^gateway: edge-sdk serve \(pid (\d+)\) listening on http://127\.0\.0\.1:\d+$", out, re.M).group(1))
    assert f"gateway: edge-sdk serve (pid {pid}) stopped, exit code 0" in out
    assert _gone(pid)

    reqs = _requests(out)
    assert 100 <= len(reqs) <= 400, len(reqs)
    for name, label, _, _ in reqs:  # right answers, wherever they were served
        assert label == name.rsplit("_", 1)[0], (name, label)
    served = [s for _, _, s, _ in reqs]
    # local first, while the simulated SoC is cool ...
    assert served[0] == "local" and reqs[0][3] == "local first"
    # ... then remote, because the governor's offload step forced it ...
    assert "remote" in served
    assert {r for _, _, s, r in reqs if s == "remote"} == {"offload forced (governor)"}
    first_remote = served.index("remote")
    assert first_remote >= 5  # it took heating: not from the start
    # ... and local again once it cooled
    assert "local" in served[first_remote:]
    assert {r for _, _, s, r in reqs if s == "local"} == {"local first"}

    # the governor's side: transitions with their reasons, offload applied and undone
    assert re.search(r"^governor: normal -> constrained \(temp [\d.]+ C >= soft limit 50 C\)$", out, re.M), out
    assert re.search(r"^governor: constrained -> normal \(temp [\d.]+ C: temp <= 50 - 3 C, after [\d.]+ s in constrained\)$", out, re.M)
    applied = len(re.findall(r"^governor: offload applied: offload on: router offload on", out, re.M))
    undone = len(re.findall(r"^governor: offload undone: offload off: router offload off", out, re.M))
    runs = sum(1 for a, b in zip(["local", *served], served) if a == "local" and b == "remote")  # local -> remote switches
    assert 1 <= runs <= applied and undone >= applied - 1, (runs, applied, undone)
    # the order in the printout: a transition to constrained comes before the first remote request
    lines = out.splitlines()
    first_remote_line = next(i for i, ln in enumerate(lines) if REQ.match(ln) and " served remote " in ln)
    assert any(ln.startswith("governor: normal -> constrained") for ln in lines[: first_remote_line + 3])

    # the summary agrees with the lines, and the gateway counted what it answered
    n_local, n_remote = served.count("local"), served.count("remote")
    assert f"summary: {len(reqs)} requests, local {n_local}, remote {n_remote}, wrong 0" in out
    assert f"summary: served remote by forced: {n_remote}" in out
    assert f"gateway: answered {n_remote} inference requests (its /metrics)" in out
    n_trans = int(re.search(r"^summary: (\d+) governor transitions", out, re.M).group(1))
    assert n_trans == len(re.findall(r"^governor: \w+ -> \w+ \(", out, re.M)) >= 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_offload_when_hot_signal_stops_the_gateway(tmp_path: Path, sig: int) -> None:
    """SIGTERM ends the sample through its finally blocks; SIGKILL skips them, and the kernel's
    parent-death signal (PR_SET_PDEATHSIG) stops the gateway instead."""
    proc = subprocess.Popen(
        [sys.executable, str(SAMPLES / "offload_when_hot.py"), "--demo", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env(),
    )  # fmt: skip
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def pump() -> None:
        for ln in proc.stdout:  # type: ignore[union-attr]
            lines.put(ln)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    pid = None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the loop serves requests
            ln = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert ln is not None, "".join(seen) + proc.stderr.read()  # type: ignore[union-attr]
            seen.append(ln)
            m = re.match(r"gateway: edge-sdk serve \(pid (\d+)\) listening", ln)
            pid = int(m.group(1)) if m else pid
            if ln.startswith("#0005 "):
                break
        assert pid is not None and not _gone(pid)
        proc.send_signal(sig)
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while (ln := lines.get(timeout=10)) is not None:
        seen.append(ln)
    if sig == signal.SIGTERM:
        assert rc == 130, "".join(seen)
        assert f"gateway: edge-sdk serve (pid {pid}) stopped" in "".join(seen)
        assert _gone(pid)
    else:
        assert rc == -signal.SIGKILL
        assert _wait_gone(pid, 15), f"gateway {pid} still running after its parent was killed"


def test_offload_when_hot_errors_and_unreachable_gateway(tmp_path: Path) -> None:
    p = _run("offload_when_hot.py", cwd=tmp_path)
    assert p.returncode == 2 and "exactly one of --gateway URL (real hardware) or --demo" in p.stderr
    p = _run("offload_when_hot.py", "--demo", "--images", str(tmp_path / "missing.png"), cwd=tmp_path)
    assert p.returncode == 1 and "missing.png': expected an image file" in p.stderr and "gateway" not in p.stdout
    p = _run("offload_when_hot.py", "--demo", str(tmp_path / "no-package"), cwd=tmp_path)
    assert p.returncode == 1 and "ManifestError" in p.stderr and "gateway" not in p.stdout

    # The real-hardware path against a gateway that is down: a warning, and every request served here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it once closed
    p = _run("offload_when_hot.py", "--gateway", f"http://127.0.0.1:{port}", "--requests", "6", "--duration", "5",
             "--remote-deadline-s", "0.5", cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"warning: gateway http://127.0.0.1:{port} not ready" in p.stdout
    reqs = _requests(p.stdout)
    assert len(reqs) == 6 and {s for _, _, s, _ in reqs} == {"local"}
    # this machine's own sensors decide whether the governor offloads; if it does, the failure falls back here
    assert all(r == "local first" or "remote failed" in r for _, _, _, r in reqs), reqs


# -- quantize_own_model ---------------------------------------------------------------------------


def test_quantize_own_model_demo(tmp_path: Path) -> None:
    out_pkg = tmp_path / "pkg"
    p = _run("quantize_own_model.py", "--demo", "--out", str(out_pkg), cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    out = p.stdout
    for step in ("inspect", "quantize", "validate"):  # the three commands, shown as a user would type them
        assert re.search(rf"^\$ edge-convert {step} ", out, re.M), out
    assert "int8-static   yes" in out  # inspect's verdict on a CNN

    # the package was written, with its report, and every file verified on open
    for f in ("edge-model.toml", "report.json", "report.md", "report.png"):
        assert (out_pkg / f).is_file(), f
    m = ModelPackage.open(out_pkg).manifest
    assert {v.id for v in m.variants} == {"fp32-onnx", "int8-onnx", "fp16-onnx"}
    assert tuple(m.labels) == LABELS
    report = json.loads((out_pkg / "report.json").read_text())
    rows = {v["id"]: v for v in report["variants"]}
    for vid in ("int8-onnx", "fp16-onnx"):
        q, gate = rows[vid]["quality"], rows[vid]["gate"]
        assert gate["passed"] and rows[vid]["written"]
        assert q["cosine"] >= 0.99 and q["top1_agreement"] >= 0.98 and q["value"] >= 0.9
        # the sample prints the measured figures, as in report.json
        line = f"  {vid:<10} PASS   written: cosine {q['cosine']:.4f}, top1_agreement {q['top1_agreement']:.4f}, accuracy {q['value']:.4f}"
        assert line in out, (line, out)
        assert m.variant(vid).quality.cosine == q["cosine"]
    assert rows["int8-onnx"]["size"] < rows["fp32-onnx"]["size"] / 2

    # edge-convert validate re-measured accuracy against the right labels (folder names mapped to the model's classes)
    val = re.findall(
        r"^(fp32-onnx|int8-onnx|fp16-onnx)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+\S+\s+([\d.]+)\s+[\d.]+ accuracy ([\d.]+)$", out, re.M
    )
    assert {v[0] for v in val} == {"fp32-onnx", "int8-onnx", "fp16-onnx"}, out
    assert all(float(cos) >= 0.99 and float(top1) >= 0.98 and float(acc) >= 0.9 for _, cos, top1, acc in val), val

    # loaded as an app would, and the prediction is right (the image sits in its class folder)
    # which variant runs follows the latencies the converter measured (the fastest passing one), so the
    # sample must name the one load() picks from this manifest
    chosen = re.search(r"^loaded shapes-quantized 1\.0\.0: variants \[.*\]; this device \(raspberry-pi-5\) runs (\S+)$", out, re.M)
    assert chosen, out
    with edge_sdk.load(out_pkg, "raspberry-pi-5") as model:
        assert chosen.group(1) == model.variant.id
    pred = re.search(r"^predict \S+/held-out/(\w+)/\d+\.png: (\w+) [\d.]+ \(", out, re.M)
    assert pred and pred.group(1) == pred.group(2), out


def test_quantize_own_model_errors(tmp_path: Path) -> None:
    p = _run("quantize_own_model.py", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert p.returncode == 2 and "exactly one of MODEL" in p.stderr
    p = _run("quantize_own_model.py", str(tmp_path / "model.onnx"), "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert p.returncode == 2 and "--calibration is required" in p.stderr
    p = _run(
        "quantize_own_model.py", str(tmp_path / "missing.onnx"), "--calibration", str(tmp_path), "--out", str(tmp_path / "x"), cwd=tmp_path
    )
    assert p.returncode == 1 and "edge-convert inspect exited with code 1" in p.stderr and "InspectError" in p.stderr
    assert not (tmp_path / "x").exists()
