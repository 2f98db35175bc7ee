"""The `edge-sdk` CLI as a user runs it (real subprocesses), a real pretrained
TFLite model through the LiteRT backend, and the wheel: profiles and the demo
package must be found from an installed package, not only from a checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, mlp_manifest, mlp_onnx

import edge_sdk
from converters.packaging import write_package

FIXTURES = ROOT / "tests" / "fixtures" / "devices"


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "edge_sdk.cli", *args], capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd
    )


def test_cli_profile_from_fake_tree() -> None:
    p = run_cli("profile", "--root", str(FIXTURES / "raspberry-pi-5"), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["profile"]["name"] == "raspberry-pi-5" and d["source"] == "detected" and not d["fallback"]
    assert any("Raspberry Pi 5" in r for r in d["reasons"])
    assert d["backends"]["onnxruntime"]["available"] is True
    text = run_cli("profile", "--root", str(FIXTURES / "raspberry-pi-5")).stdout
    assert "raspberry-pi-5" in text and "runtimes:" in text and "sensors" in text


def test_cli_profile_env_override() -> None:
    p = run_cli("profile", "--json", env={"EDGE_SDK_PROFILE": "jetson-agx-orin"})
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["profile"]["name"] == "jetson-agx-orin" and d["source"] == "override-env"


def test_cli_inspect_demo(demo_package: Path) -> None:
    p = run_cli("inspect", str(demo_package), "--profile", "raspberry-pi-4")
    assert p.returncode == 0, p.stderr
    for part in ("shapes-classifier", "fp32-onnx", "int8-onnx", "fp32-tflite", "sha256=", "chosen:", "precision int8 is #1"):
        assert part in p.stdout, part
    d = json.loads(run_cli("inspect", str(demo_package), "--json").stdout)
    assert {c["variant"] for c in d["selection"]["candidates"]} == {"fp32-onnx", "int8-onnx", "fp32-tflite"}


def test_cli_predict_image_and_npy(demo_package: Path, tmp_path: Path) -> None:
    from edge_sdk.assets import demo_samples

    img = next(p for p in demo_samples() if p.name.startswith("cross"))
    p = run_cli("predict", str(demo_package), str(img), "--variant", "fp32-onnx", "--json", "--repeat", "5")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["classes"][0][0]["label"] == "cross" and d["variant"] == "fp32-onnx"
    assert d["latency"]["total_ms"]["n"] == 5
    # a .npy tensor for a raw model
    root = tmp_path / "mlp"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    p = run_cli("predict", str(root), str(tmp_path / "x.npy"), "--profile", "generic-x86_64", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["outputs"]["y"]["shape"] == [1, 4]


def test_cli_errors_are_typed_and_exit_1(tmp_path: Path) -> None:
    root = tmp_path / "mlp"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float64))
    p = run_cli("predict", str(root), str(tmp_path / "x.npy"), "--profile", "generic-x86_64")
    assert p.returncode == 1 and "InputDTypeError" in p.stderr and "expected dtype float32, got float64" in p.stderr
    p = run_cli("profile", "--profile", "no-such-board")
    assert p.returncode == 1 and "ProfileError" in p.stderr
    p = run_cli("inspect", str(tmp_path / "missing"))
    assert p.returncode == 1 and "ManifestError" in p.stderr


def test_cli_demo() -> None:
    p = run_cli("demo", "--runs", "20", "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["correct"] >= len(d["results"]) - 2
    assert d["latency_ms"]["total_ms"]["n"] == 20 and d["latency_ms"]["total_ms"]["p50"] > 0
    assert d["model"]["selection"]["chosen"] == d["model"]["variant"]
    text = run_cli("demo", "--runs", "10", timeout=300).stdout
    for part in ("== device", "== selection", "chosen:", "== results", "correct", "p50", "p99"):
        assert part in text, part


def test_pretrained_tflite_through_litert_backend(tmp_path: Path) -> None:
    """MediaPipe's face detector (trained weights, fetched from its PyPI wheel and
    pinned by sha256) packaged and run through edge_sdk's LiteRT backend."""
    from tools.fixtures.fetch_pretrained import MODELS, fetch

    name = "mediapipe-face-detection-short-range"
    path = fetch(name)  # raises FetchError (fails the test) when the network is missing
    spec = MODELS[name]
    root = tmp_path / "face"
    write_package(
        root,
        {
            "name": "face-detection-short-range", "version": "0.10.21", "task": "detection",
            "inputs": [{"name": "input", "dtype": "float32", "shape": [1, 128, 128, 3], "layout": "NHWC"}],
            "outputs": [
                {"name": "regressors", "dtype": "float32", "shape": [1, 896, 16]},
                {"name": "classificators", "dtype": "float32", "shape": [1, 896, 1]},
            ],
            "variants": [{"id": "fp32-tflite", "file": "face.tflite", "backend": "litert", "precision": "fp32"}],
        },  # fmt: skip
        {"face.tflite": path},
    )
    assert spec.sha256 == edge_sdk.ModelPackage.open(root).manifest.variants[0].sha256
    with edge_sdk.load(root, "raspberry-pi-5", delegates=()) as m:
        assert m.describe()["backend"] == "litert"
        blank = np.zeros((1, 128, 128, 3), np.float32)
        r = m.predict(blank)
        assert r.outputs["regressors"].shape == (1, 896, 16)
        scores = 1 / (1 + np.exp(-np.clip(r.outputs["classificators"], -60, 60)))
        assert scores.max() < 0.5  # no face in a blank frame
        with pytest.raises(edge_sdk.errors.InputShapeError):
            m.predict(np.zeros((1, 3, 128, 128), np.float32))  # NCHW given to an NHWC model


def test_wheel_ships_profiles_and_demo(tmp_path: Path) -> None:
    """Build the wheel, unpack it alone on sys.path, and use it from another folder."""
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    wheel = next((tmp_path / "dist").glob("edge_sdk-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for want in ("edge_sdk/_profiles/raspberry-pi-5.toml", "edge_sdk/assets/shapes-classifier/edge-model.toml", "edge_sdk/assets/samples/circle_1.png"):
        assert want in names, want
    assert not any(n.startswith("tests/") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import edge_sdk, edge_sdk.profiles as p, json;"
        "print(json.dumps([edge_sdk.__file__, str(p.profiles_dir()), p.list_profiles(), str(edge_sdk.demo_package_path())]))"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    f, pdir, names_, demo = json.loads(out.stdout)
    assert f.startswith(str(site)) and pdir.startswith(str(site)) and demo.startswith(str(site))
    assert sorted(names_) == sorted(p.stem for p in (ROOT / "device_profiles").glob("*.toml")) and len(names_) >= 15
    d = subprocess.run([sys.executable, "-m", "edge_sdk.cli", "demo", "--runs", "5", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert d.returncode == 0, d.stderr
    assert json.loads(d.stdout)["correct"] >= 10
