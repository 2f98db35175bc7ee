"""`edge-convert package|verify`: a package written from model files, with
signatures read from the models themselves, loads and agrees across backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

import edge_sdk

DEMO = ROOT / "edge_sdk" / "assets" / "shapes-classifier"


def conv(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "converters.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_package_onnx_and_tflite_then_load(tmp_path: Path) -> None:
    p = conv(
        "package", "out", "--name", "shapes", "--version", "2", "--task", "classification",
        "--variant", f"fp32-onnx={DEMO / 'model_fp32.onnx'}:onnxruntime:fp32",
        "--variant", f"fp32-tflite={DEMO / 'model_fp32.tflite'}:litert:fp32",
        "--dim", "batch=1:4", cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    pkg = edge_sdk.ModelPackage.open(tmp_path / "out")
    m = pkg.manifest
    assert m.inputs[0].shape == ("batch", 3, 32, 32)  # read from the ONNX model
    assert m.variant("fp32-tflite").inputs[0].shape == ("batch", 32, 32, 3)  # TFLite's own NHWC spec
    assert m.reference_variant.id == "fp32-onnx" and m.decoder.kind == "classification"
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with edge_sdk.load(pkg, "generic-x86_64", variant="fp32-onnx") as a, edge_sdk.load(pkg, "generic-x86_64", variant="fp32-tflite") as b:
        ya = a.predict(x).outputs["logits"]
        yb = b.predict(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).outputs["logits"]
        np.testing.assert_allclose(ya, yb, rtol=1e-4, atol=1e-4)
        with pytest.raises(edge_sdk.errors.InputShapeError, match=r"\[1, 4\]"):
            a.predict(np.zeros((5, 3, 32, 32), np.float32))  # the --dim bound holds
    v = conv("verify", "out", cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.count("ok ") == 2
    (tmp_path / "out" / "model_fp32.onnx").write_bytes(b"\x00" * 10)
    v = conv("verify", "out", cwd=tmp_path)
    assert v.returncode == 1 and "IntegrityError" in v.stderr


# (arguments, message) — each a misuse
MISUSE = [
    (["--variant", f"a={DEMO / 'model_fp32.onnx'}:onnxruntime:fp32"], "give --dim batch=MIN:MAX"),  # dynamic dim unbounded
    (["--variant", "a=model.onnx"], "ID=FILE:BACKEND:PRECISION"),
    (["--variant", "a=/nonexistent.onnx:onnxruntime:fp32"], "does not exist"),
    (["--variant", f"a={DEMO / 'model_fp32.onnx'}:onnxruntime:fp32", "--dim", "batch=1"], "NAME=MIN:MAX"),
    (["--variant", f"a={DEMO / 'model_fp32.onnx'}:onnxruntime:fp32", "--dim", "batch=1:2", "--reference", "zz"], "not one of the variants"),
]


@pytest.mark.parametrize("extra,msg", MISUSE)
def test_package_misuse(tmp_path: Path, extra: list[str], msg: str) -> None:
    p = conv("package", "out", "--name", "n", "--version", "1", *extra, cwd=tmp_path)
    assert p.returncode != 0 and msg in p.stderr, p.stderr


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    args = ["package", "out", "--name", "n", "--version", "1", "--variant", f"a={DEMO / 'model_int8.onnx'}:onnxruntime:int8", "--dim", "batch=1:2"]
    assert conv(*args, cwd=tmp_path).returncode == 0
    p = conv(*args, cwd=tmp_path)
    assert p.returncode == 1 and "not empty" in p.stderr
    assert conv(*args, "--overwrite", cwd=tmp_path).returncode == 0
