"""`edge-convert quantize | validate | inspect` end to end: real models, real
data, real quantization; the packages it writes load on every profile they suit."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import ROOT

import edge_sdk
from converters.pipeline import ConvertError, ConvertOptions, convert
from converters.quantize import Int8Options
from edge_sdk.package import ImagePreprocess, ModelPackage

DEMO = ROOT / "edge_sdk" / "assets" / "shapes-classifier"
LABELS = ("circle", "square", "triangle", "cross")
PRE = ImagePreprocess((32, 32), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


def conv_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "converters.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def shapes_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Drawn shapes in class subfolders (the demo's data, a seed it never trained on)."""
    from tools.train_demo import make_split

    root = tmp_path_factory.mktemp("shapes")
    x, y = make_split(4242, 96)
    for i, (img, lab) in enumerate(zip(x, y)):
        d = root / LABELS[lab]
        d.mkdir(exist_ok=True)
        cv2.imwrite(str(d / f"{i:03d}.png"), img[:, :, ::-1])
    return root


@pytest.fixture(scope="module")
def demo_converted(shapes_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("conv") / "pkg"
    opts = ConvertOptions(
        targets=("int8", "fp16", "int4"), task="classification", name="shapes", dims={"batch": (1, 16)}, preprocess=PRE,
        class_names=LABELS, progress=False, tflite=((DEMO / "model_fp32.tflite", "fp32"),),
    )  # fmt: skip
    return convert(DEMO / "model_fp32.onnx", shapes_folder, out, opts)


def test_quantize_demo_cnn(demo_converted) -> None:
    res = demo_converted
    # int4 does not apply to a CNN without MatMul: refused with the reason, the rest written
    assert set(res.written) == {"fp32-onnx", "int8-onnx", "fp16-onnx", "fp32-tflite"} and res.refused == ("int4-onnx",)
    rows = {r["id"]: r for r in res.report["variants"]}
    assert "MatMul" in rows["int4-onnx"]["gate"]["failures"][0]
    assert "static QDQ U8S8" in rows["int8-onnx"]["method"] and "CNN-like" in rows["int8-onnx"]["method"]
    pkg = ModelPackage.open(res.package)
    m = pkg.manifest
    assert m.labels == LABELS and m.decoder.kind == "classification" and m.reference_variant.id == "fp32-onnx"
    assert m.variant("fp32-tflite").inputs[0].layout == "NHWC"
    for v in m.variants:
        assert v.gate is not None and v.gate.passed and dict(v.gate.thresholds) == {"cosine": 0.99, "top1_agreement": 0.98}
        assert v.quality is not None and v.quality.samples == 24 and v.quality.metric == "accuracy"
        assert v.quality.value >= 0.95  # labels mapped by class name, not by folder order
        assert v.benchmarks and v.benchmarks[0].profile == edge_sdk.resolve_profile().profile.name and v.benchmarks[0].latency_ms > 0
    assert m.variant("int8-onnx").quality.cosine >= 0.995 and m.variant("fp32-tflite").quality.cosine > 0.99999
    for f in ("report.json", "report.md", "report.png"):
        assert (res.package / f).stat().st_size > 0
    assert json.loads((res.package / "report.json").read_text())["reference"] == "fp32-onnx"
    assert (res.package / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_converted_package_loads_on_every_profile_it_suits(demo_converted) -> None:
    from edge_sdk.assets import demo_samples

    pkg = ModelPackage.open(demo_converted.package)
    img = next(p for p in demo_samples() if p.name.startswith("triangle"))
    for name in edge_sdk.list_profiles():
        prof = edge_sdk.load_profile(name)
        with edge_sdk.load(pkg, prof, delegates=()) as model:  # the profile's choice
            assert model.variant.precision in prof.runtime.precisions
            assert model.predict_image(img).top1.label == "triangle", name
        for v in pkg.manifest.variants:
            if v.precision in prof.runtime.precisions:  # every variant the profile suits, forced
                with edge_sdk.load(pkg, prof, variant=v.id, delegates=()) as model:
                    assert model.predict_image(img).top1.label == "triangle", (name, v.id)


def test_validate_command(demo_converted, shapes_folder: Path, tmp_path: Path) -> None:
    p = conv_cli("validate", str(demo_converted.package), "--data", str(shapes_folder), "--limit", "16", "--json", "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = {r["variant"]: r for r in json.loads(p.stdout)}
    assert set(rows) == {"fp32-onnx", "int8-onnx", "fp16-onnx", "fp32-tflite"}
    assert rows["fp32-onnx"]["cosine"] == 1.0 and rows["fp32-onnx"]["max_abs_error"] == 0.0
    assert rows["int8-onnx"]["top1_agreement"] >= 0.98 and rows["int8-onnx"]["top5_agreement"] == 1.0
    assert all(r["latency_ms"] > 0 and r["size"] > 0 for r in rows.values())
    text = conv_cli("validate", str(demo_converted.package), "--data", str(shapes_folder), "--limit", "8", "--quiet", cwd=tmp_path)
    assert text.returncode == 0 and "int8-onnx" in text.stdout and "cosine" in text.stdout


def test_inspect_command(tmp_path: Path) -> None:
    p = conv_cli("inspect", str(DEMO / "model_fp32.onnx"), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["format"] == "onnx" and d["op_counts"]["Conv"] == 3
    (tmp_path / "m.pkl").write_bytes(pickle.dumps({"w": 1}))
    p = conv_cli("inspect", str(tmp_path / "m.pkl"), cwd=tmp_path)
    assert p.returncode == 1 and "m.pkl" in p.stderr and "pickle" in p.stderr


def _outlier_model(tmp: Path) -> Path:
    from test_repair import cnn_onnx

    return cnn_onnx(tmp / "outlier.onnx")


def test_gate_failure_is_repaired_refused_or_forced(tmp_path: Path) -> None:
    """One layer with a 1000x outlier channel breaks int8; the converter repairs it
    by keeping sensitive nodes in float; without repair it refuses it; --force
    writes it with the failure recorded, and selection then skips it."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "cal.npy", rng.standard_normal((48, 3, 16, 16)).astype(np.float32))
    model = _outlier_model(tmp_path)
    base = dict(targets=("int8",), dims={"N": (1, 4)}, progress=False, gate={"cosine": 0.999}, int8=Int8Options(method="static"))

    repaired = convert(model, tmp_path / "cal.npy", tmp_path / "repaired", ConvertOptions(**base))
    row = next(r for r in repaired.report["variants"] if r["id"] == "int8-onnx")
    assert row["gate"]["passed"] and row["kept_float_nodes"], row
    assert "kept in float" in row["method"] and "int8-onnx" in repaired.written

    refused = convert(model, tmp_path / "cal.npy", tmp_path / "refused", ConvertOptions(**base, repair=False))
    assert refused.refused == ("int8-onnx",) and not (tmp_path / "refused" / "model_int8.onnx").exists()
    assert "cosine" in next(r for r in refused.report["variants"] if r["id"] == "int8-onnx")["gate"]["failures"][0]
    assert "int8-onnx" in (tmp_path / "refused" / "report.md").read_text()

    forced = convert(model, tmp_path / "cal.npy", tmp_path / "forced", ConvertOptions(**base, repair=False, force=True))
    v = ModelPackage.open(forced.package).manifest.variant("int8-onnx")
    assert v.gate is not None and not v.gate.passed and v.gate.forced and v.gate.failures
    with edge_sdk.load(forced.package, "generic-x86_64") as m:
        assert m.variant.id == "fp32-onnx"  # the failed variant is skipped ...
        assert any("failed its quality gate" in r for c in m.selection.candidates if c.variant_id == "int8-onnx" for r in c.reasons)
    with edge_sdk.load(forced.package, "generic-x86_64", variant="int8-onnx") as m:
        assert m.variant.id == "int8-onnx"  # ... unless asked for by id


# (what is wrong, expected message) — the converter refuses before doing any work
REFUSALS = [
    ("pickle", "pickle"),
    ("tflite", "pass it with --tflite"),
    ("overwrite", "not empty"),
    ("dynamic-without-bounds", "give its bounds"),
    ("empty-calibration", "cal_empty"),
]


@pytest.mark.parametrize("case,msg", REFUSALS)
def test_refusals(tmp_path: Path, case: str, msg: str) -> None:
    from converters.calibration import CalibrationError

    model = DEMO / "model_fp32.onnx"
    cal = tmp_path / "cal.npy"
    np.save(cal, np.zeros((8, 1, 3, 32, 32), np.float32))
    out = tmp_path / "out"
    opts = ConvertOptions(dims={"batch": (1, 4)}, progress=False)
    if case == "pickle":
        model = tmp_path / "model.onnx"
        model.write_bytes(pickle.dumps({"weights": [1, 2]}))
    elif case == "tflite":
        model = DEMO / "model_fp32.tflite"
    elif case == "overwrite":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "dynamic-without-bounds":
        opts = ConvertOptions(progress=False)
    elif case == "empty-calibration":
        cal = tmp_path / "cal_empty"
        cal.mkdir()
        opts = ConvertOptions(dims={"batch": (1, 4)}, preprocess=PRE, progress=False)
    with pytest.raises((ConvertError, CalibrationError), match=msg):
        convert(model, cal, out, opts)
    if case == "overwrite":
        assert (out / "keep.txt").read_text() == "mine"  # nothing already there is lost


def test_cli_quantize_exit_codes(shapes_folder: Path, tmp_path: Path) -> None:
    args = ["quantize", str(DEMO / "model_fp32.onnx"), "--calibration", str(shapes_folder), "--out", "pkg", "--task", "classification",
            "--preprocess", "size=32x32,mean=0.5:0.5:0.5,std=0.25:0.25:0.25", "--dim", "batch=1:16", "--limit", "32", "--quiet"]  # fmt: skip
    p = conv_cli(*args, "--to", "int8", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "int8-onnx" in p.stdout and "PASS" in p.stdout
    p = conv_cli(*args, "--to", "int8", cwd=tmp_path)
    assert p.returncode == 1 and "not empty" in p.stderr
    p = conv_cli(*args, "--to", "int4", "--overwrite", cwd=tmp_path)  # int4 cannot apply: partial result, exit 3
    assert p.returncode == 3 and "no MatMul" in p.stdout
    p = conv_cli(*args, "--to", "int9", "--overwrite", cwd=tmp_path)
    assert p.returncode == 1 and "--to" in p.stderr
