"""The install proof's parts that run anywhere: tools/smoke_test.py on this Python (a real
subprocess: detection, ONNX Runtime and LiteRT predictions, edge-convert quantize), and
tools/arm64_install_proof.sh's syntax and argument handling. The slow arm64 / Python 3.10
runs themselves are not part of the suite: docs/install-proof.md holds their output."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SMOKE = ROOT / "tools" / "smoke_test.py"
SCRIPT = ROOT / "tools" / "arm64_install_proof.sh"
BASH = shutil.which("bash")


def _smoke(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # cwd outside the tree, the checkout on PYTHONPATH: the package as a user's program sees it
    e = {k: v for k, v in os.environ.items() if k != "EDGE_SDK_PROFILE"}
    e.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    return subprocess.run(
        [sys.executable, str(SMOKE), "--json", str(tmp_path / "smoke.json"), "--work", str(tmp_path / "work"), *args],
        capture_output=True, text=True, cwd=tmp_path, env=e, timeout=120,
    )  # fmt: skip


def test_smoke_test_passes_on_this_python(tmp_path: Path) -> None:
    p = _smoke(tmp_path)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    out = p.stdout
    assert "SMOKE TEST PASSED: 7/7 checks" in out and "FAIL " not in out
    assert f"machine {platform.machine()}" in out and f"python {platform.python_version()}" in out
    assert "fake-pi5 -> raspberry-pi-5; fake-orin-nano -> jetson-orin-nano" in out
    for variant, backend in (("fp32-onnx", "onnxruntime"), ("int8-onnx", "onnxruntime"), ("fp32-tflite", "litert")):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"PASS load + predict_image: demo {variant}"))
        assert "12/12 right" in line and f"backend {backend}" in line
    assert "int8-onnx    PASS" in out  # edge-convert's own gate line
    d = json.loads((tmp_path / "smoke.json").read_text())
    assert d["failed"] == [] and d["passed"] == 7 and d["machine"] == platform.machine()
    assert [r["check"] for r in d["results"]][-1].startswith("edge-convert quantize")
    converted = tmp_path / "work" / "converted"
    assert (converted / "edge-model.toml").is_file() and (converted / "report.json").is_file()
    variants = {v["id"]: v for v in json.loads((converted / "report.json").read_text())["variants"]}
    assert set(variants) == {"fp32-onnx", "int8-onnx"} and variants["int8-onnx"]["written"] is True


def test_smoke_test_fails_when_loading_fails(tmp_path: Path) -> None:
    """A profile that cannot be resolved breaks every load: the smoke test says so and exits 1."""
    p = _smoke(tmp_path, "--skip-convert", env={"EDGE_SDK_PROFILE": "no-such-board"})
    assert p.returncode == 1, p.stdout[-3000:]
    assert "PASS detect: this machine" in p.stdout  # detect() ignores the override; load does not
    for variant in ("fp32-onnx", "int8-onnx", "fp32-tflite"):
        assert f"FAIL load + predict_image: demo {variant}" in p.stdout
    assert "SMOKE TEST FAILED" in p.stdout and "no-such-board" in p.stdout
    d = json.loads((tmp_path / "smoke.json").read_text())
    assert d["passed"] == 3 and len(d["failed"]) == 3


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_install_proof_script_syntax_help_and_bad_arguments(tmp_path: Path) -> None:
    assert subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30).returncode == 0
    h = subprocess.run([BASH, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert h.returncode == 0 and "usage: tools/arm64_install_proof.sh" in h.stdout
    for flag in ("--python 3.11-arm64", "--python 3.10-x86_64", "--wheels-3.10-arm64", "--root DIR", "--cpu LIST", "--keep"):
        assert flag in h.stdout
    env = dict(os.environ, EDGE_SDK_PROOF_LOGS=str(tmp_path / "logs"))
    bad = subprocess.run([BASH, str(SCRIPT), "--python", "3.9-arm64"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "expected 3.11-arm64, 3.10-x86_64 or wheels-3.10-arm64, got '3.9-arm64'" in bad.stderr
    bad = subprocess.run([BASH, str(SCRIPT), "--frobnicate"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "unknown argument: --frobnicate" in bad.stderr
    bad = subprocess.run([BASH, str(SCRIPT), "--cpu", "cortex-a76,cortex-x9"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "--cpu: expected a comma list of cortex-a76" in bad.stderr and "got 'cortex-x9'" in bad.stderr
    bad = subprocess.run([BASH, str(SCRIPT), "--root"], capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 2 and "--root needs a directory" in bad.stderr
    assert not (tmp_path / "logs").exists()  # refused before anything was done
