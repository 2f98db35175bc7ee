"""Calibration on the device (issue 10): ECE / MCE / Brier / NLL per variant, reliability diagrams, temperature
scaling fitted at conversion, stored in the manifest and applied by the classification decoder.

Real parts: the demo package's ONNX / LiteRT models, images drawn by tools/fixtures/train_demo.py (a seed it never trained on,
with pixel noise so the model makes mistakes and is over-confident), ``edge-convert`` as a subprocess, real PNG files."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import ROOT

import edge_sdk
from converters.calibration_quality import (
    CalibrationQualityError,
    assess,
    calibration_stats,
    check_calibration_entry,
    expected_calibration_error,
    fit_temperature,
    plot_reliability,
    to_probabilities,
)
from converters.report import validate_report
from edge_sdk.errors import ManifestError
from edge_sdk.package import ModelPackage
from edge_sdk.processing.decoders import decode_classification

DEMO = ROOT / "edge_sdk" / "assets" / "shapes-classifier"
LABELS = ("circle", "square", "triangle", "cross")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _two_class(conf: list[float]) -> np.ndarray:
    """Probabilities over 2 classes with top-1 (class 0) confidence ``conf``."""
    c = np.asarray(conf, dtype=np.float64)
    return np.stack([c, 1 - c], axis=1)


# ------------------------------------------------------------------ figures with answers known by hand


def test_ece_is_zero_when_every_bin_is_calibrated() -> None:
    # 10 samples at confidence 0.8 of which 8 right, 5 at 0.6 of which 3 right: accuracy == confidence in each bin
    probs = _two_class([0.8] * 10 + [0.6] * 5)
    labels = [0] * 8 + [1] * 2 + [0] * 3 + [1] * 2
    st = calibration_stats(probs, labels)
    assert st.ece == pytest.approx(0.0, abs=1e-12) and st.mce == pytest.approx(0.0, abs=1e-12)
    assert [b.count for b in st.bins if b.count] == [5, 10] and len(st.bins) == 15
    assert st.accuracy == pytest.approx(11 / 15)
    # Brier by hand: right at 0.8 -> 2 * 0.2^2, wrong at 0.8 -> 2 * 0.8^2, right at 0.6 -> 2 * 0.4^2, wrong -> 2 * 0.6^2
    brier = (8 * 2 * 0.04 + 2 * 2 * 0.64 + 3 * 2 * 0.16 + 2 * 2 * 0.36) / 15
    nll = -(8 * math.log(0.8) + 2 * math.log(0.2) + 3 * math.log(0.6) + 2 * math.log(0.4)) / 15
    assert st.brier == pytest.approx(brier) and st.nll == pytest.approx(nll)


def test_ece_is_about_one_when_confidently_wrong_and_weighted_by_bin_size() -> None:
    probs = _two_class([0.99] * 20)
    st = calibration_stats(probs, [1] * 20)
    assert st.ece == pytest.approx(0.99) and st.mce == pytest.approx(0.99) and st.accuracy == 0.0
    # 4 samples at 0.9 with 2 right (gap 0.4) and 6 at 0.55 with 3 right (gap 0.05): 0.4 * 0.4 + 0.6 * 0.05
    probs = _two_class([0.9] * 4 + [0.55] * 6)
    labels = [0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    st = calibration_stats(probs, labels)
    assert st.ece == pytest.approx(0.19) and st.mce == pytest.approx(0.4)
    # one bin over everything: |0.5 accuracy - 0.69 mean confidence|
    assert expected_calibration_error(probs, labels, n_bins=1) == pytest.approx(abs(0.5 - (4 * 0.9 + 6 * 0.55) / 10))


def test_bins_are_equal_width_and_right_closed() -> None:
    # with 10 bins, 0.7 falls in (0.6, 0.7] and 0.7000001 in (0.7, 0.8]
    st = calibration_stats(_two_class([0.7, 0.7000001, 1.0]), [0, 0, 0], n_bins=10)
    assert [i for i, b in enumerate(st.bins) if b.count] == [6, 7, 9]
    assert st.bins[6].lo == pytest.approx(0.6) and st.bins[6].hi == pytest.approx(0.7)


def test_bad_scores_labels_and_options_are_typed_errors() -> None:
    p = _two_class([0.9, 0.8])
    with pytest.raises(CalibrationQualityError, match=r"expected 2 integer class indices"):
        calibration_stats(p, [0, 1, 1])
    with pytest.raises(CalibrationQualityError, match=r"class indices in 0\.\.1"):
        calibration_stats(p, [0, 2])
    with pytest.raises(CalibrationQualityError, match=r"rows of values in \[0, 1\] summing to 1"):
        calibration_stats(np.array([[3.0, -1.0], [0.2, 0.1]]), [0, 1])
    with pytest.raises(CalibrationQualityError, match=r"finite"):
        calibration_stats(np.array([[np.nan, 1.0], [0.5, 0.5]]), [0, 1])
    with pytest.raises(CalibrationQualityError, match=r"n_bins: expected an integer 1..1000"):
        calibration_stats(p, [0, 1], n_bins=0)
    for t in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(CalibrationQualityError, match=r"temperature: expected a finite number > 0"):
            to_probabilities(p, temperature=t)
    with pytest.raises(CalibrationQualityError, match=r"at least 1 sample and 2 classes"):
        fit_temperature(np.zeros((3, 1)), [0, 0, 0])


# ------------------------------------------------------------------ temperature fit


def test_fit_recovers_a_known_temperature() -> None:
    rng = np.random.default_rng(7)
    z = rng.normal(0.0, 2.0, (20000, 5))
    p = _softmax(z)
    y = (p.cumsum(axis=1) > rng.random((len(z), 1))).argmax(axis=1)  # labels drawn from the calibrated model itself
    assert expected_calibration_error(p, y) < 0.02  # calibrated by construction
    hot = 2.5 * z  # the same model, over-confident by a temperature of 2.5
    t = fit_temperature(hot, y)
    assert t == pytest.approx(2.5, rel=0.05)
    res = assess(hot, y, fit=True)
    assert res.before.ece > 0.1 and res.after is not None and res.after.ece < 0.03 and res.after.nll < res.before.nll
    assert res.after.accuracy == res.before.accuracy  # T never changes the top-1 class
    # the same model outputting probabilities: T applies to log-probabilities, and is the same T
    assert fit_temperature(_softmax(hot), y, logits=False) == pytest.approx(t, rel=1e-3)
    # an under-confident model (T = 0.5) and a calibrated one (T = 1)
    assert fit_temperature(0.5 * z, y) == pytest.approx(0.5, rel=0.05)
    assert fit_temperature(z, y) == pytest.approx(1.0, rel=0.05)


def test_fit_stops_at_the_bound_when_sharper_is_always_better() -> None:
    z = np.array([[3.0, 0.0], [0.0, 3.0], [2.0, -1.0]])
    assert fit_temperature(z, [0, 1, 0], bounds=(0.1, 10.0)) == pytest.approx(0.1, rel=1e-4)


# ------------------------------------------------------------------ the decoder applies T


def test_decoder_applies_temperature_to_logits_and_to_probabilities() -> None:
    rng = np.random.default_rng(3)
    for classes in (4, 100):  # the pure-Python path and the numpy top-k path
        labels = [f"c{i}" for i in range(classes)]
        z = rng.normal(0, 3, (3, classes)).astype(np.float32)
        for t in (0.5, 1.0, 2.5):
            want = _softmax(z.astype(np.float64) / t)
            got = decode_classification(z, labels, top_k=3, temperature=t)
            for row, w in zip(got, want):
                assert [c.index for c in row] == list(np.argsort(-w, kind="stable")[:3])
                assert [c.score for c in row] == pytest.approx(w[[c.index for c in row]], rel=1e-5)
            # probabilities in: softmax(log p / T) = p ** (1/T) renormalised
            p = _softmax(z.astype(np.float64))
            want_p = p ** (1 / t) / (p ** (1 / t)).sum(axis=1, keepdims=True)
            got_p = decode_classification(p, labels, top_k=3, apply_softmax=False, temperature=t)
            for row, w in zip(got_p, want_p):
                assert [c.score for c in row] == pytest.approx(w[[c.index for c in row]], rel=1e-5)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        decode_classification(np.zeros((1, 4)), LABELS, temperature=-2.0)


# ------------------------------------------------------------------ the manifest field


def _demo_copy(tmp_path: Path, **temps: str) -> Path:
    """The demo package with ``temperature = <text>`` added to the named variants (the digests cover the model files
    only, so the manifest can be edited)."""
    dst = tmp_path / "pkg"
    shutil.copytree(DEMO, dst)
    toml = dst / "edge-model.toml"
    text = toml.read_text()
    for vid, value in temps.items():
        anchor = f'id = "{vid}"\n'
        assert anchor in text
        text = text.replace(anchor, anchor + f"temperature = {value}\n")
    toml.write_text(text)
    return dst


def test_package_temperature_scales_the_scores_at_predict_time(tmp_path: Path) -> None:
    from tools.fixtures.train_demo import make_split, to_tensor

    pkg = ModelPackage.open(_demo_copy(tmp_path, **{"fp32-onnx": "2.5", "int8-onnx": "0.75"}))
    m = pkg.manifest
    assert m.variant("fp32-onnx").temperature == 2.5 and m.variant("int8-onnx").temperature == 0.75
    assert m.variant("fp32-tflite").temperature is None
    assert "temperature = 2.5" in m.to_toml()  # round-trips
    x, _ = make_split(99, 6)
    batch = to_tensor(x)
    for vid, t in (("fp32-onnx", 2.5), ("int8-onnx", 0.75), ("fp32-tflite", 1.0)):
        with edge_sdk.load(pkg, variant=vid, measure_backends=False) as model:
            nhwc = model.manifest.inputs_for(model.variant)[0].layout == "NHWC"
            for i in range(len(batch)):
                r = model.predict({"image": np.ascontiguousarray(batch[i : i + 1].transpose(0, 2, 3, 1)) if nhwc else batch[i : i + 1]})
                logits = np.asarray(r.outputs["logits"], dtype=np.float64)
                want = _softmax(logits / t)[0]
                got = {c.index: c.score for c in r.decoded[0]}
                assert len(got) == 3 and got == pytest.approx({k: want[k] for k in got}, rel=1e-5), vid
                assert r.top1.index == int(np.argmax(logits))
    # validate measures each variant before and after the temperature its manifest has (the one predict applies)
    from converters.validate import validate_package

    xn, yn = make_split(31, 64)
    xn = np.clip(xn.astype(np.float32) + np.random.default_rng(31).normal(0, 20, xn.shape), 0, 255).astype(np.uint8)
    tn = to_tensor(xn)
    reps = validate_package(pkg, [{"image": tn[i : i + 1]} for i in range(len(tn))], labels=yn.tolist(), latency=False)
    with edge_sdk.load(pkg, variant="fp32-onnx", measure_backends=False) as model:
        logits = np.concatenate([np.asarray(model.predict({"image": tn[i : i + 1]}).outputs["logits"], np.float64) for i in range(len(tn))])
    cal = reps["fp32-onnx"].calibration
    assert cal is not None and not cal.fitted and cal.temperature == 2.5 and cal.after is not None
    assert cal.before.ece == pytest.approx(expected_calibration_error(_softmax(logits), yn), abs=1e-6)
    assert cal.after.ece == pytest.approx(expected_calibration_error(_softmax(logits / 2.5), yn), abs=1e-6)
    assert reps["fp32-tflite"].calibration.after is None and reps["fp32-tflite"].calibration.temperature is None
    # and an old manifest (no temperature) decodes as before: plain softmax
    with edge_sdk.load(DEMO, variant="fp32-onnx", measure_backends=False) as model:
        r = model.predict({"image": batch[:1]})
        assert r.top1.score == pytest.approx(float(_softmax(np.asarray(r.outputs["logits"], np.float64))[0].max()), rel=1e-5)
        assert model.variant.temperature is None


@pytest.mark.parametrize("value", ["0", "-1.5", "nan", "inf", '"2.0"', "true"])
def test_invalid_temperature_is_a_manifest_error_naming_the_field(tmp_path: Path, value: str) -> None:
    with pytest.raises(ManifestError, match=r"variants\[int8-onnx\]\.temperature: expected") as ei:
        ModelPackage.open(_demo_copy(tmp_path, **{"int8-onnx": value}))
    assert "temperature" in str(ei.value)


def test_temperature_needs_a_classification_decoder(tmp_path: Path) -> None:
    dst = _demo_copy(tmp_path, **{"fp32-onnx": "1.5"})
    toml = dst / "edge-model.toml"
    toml.write_text(toml.read_text().replace('kind = "classification"', 'kind = "raw"').replace("top_k = 3\n", ""))
    with pytest.raises(ManifestError, match=r"temperature: applies only with a classification decoder"):
        ModelPackage.open(dst)


# ------------------------------------------------------------------ the report entry and diagram


def test_report_calibration_entry_is_checked_and_drawn(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    z = rng.normal(0, 3, (300, 4))
    y = rng.integers(0, 4, 300)
    entry = assess(z, y, temperature=2.0).to_dict(diagram="reliability_x.png")
    check_calibration_entry(entry, "v")
    assert entry["after"]["ece"] != entry["before"]["ece"] and sum(b["count"] for b in entry["before"]["bins"]) == 300
    png = plot_reliability(entry, tmp_path / "r.png", "x")
    img = cv2.imread(str(png))
    assert img is not None and img.shape[0] >= 400 and img.shape[1] >= 800  # two panels: before and after T
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 10  # drawn, not blank
    for bad, where in (
        ({**entry, "temperature": -1}, "v.temperature"),
        ({**entry, "diagram": "../x.png"}, "v.diagram"),
        ({**entry, "colour": 1}, "v.colour"),
        ({k: x for k, x in entry.items() if k != "before"}, "v.before"),
    ):
        with pytest.raises(ValueError, match=re.escape(where)):
            check_calibration_entry(bad, "v")
    report = {
        "model": {"name": "m", "version": "1", "task": "classification", "source": None, "source_sha256": None},
        "machine": {"profile": "p", "machine": "x", "threads": 1}, "reference": "a",
        "variants": [{"id": "a", "backend": "onnxruntime", "precision": "fp32", "file": "a.onnx", "size": 1, "method": "ref",
                      "written": True, "quality": {}, "gate": {"passed": True}, "calibration": {**entry, "fitted": "yes"}}],
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"variants\[0\]\.calibration\.fitted"):
        validate_report(report)


# ------------------------------------------------------------------ end to end on the demo model


def _noisy_shapes(root: Path, seed: int, n: int, noise: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
    """Drawn shapes in class subfolders with Gaussian pixel noise (sigma ``noise`` grey levels): the demo model gets
    ~70 % of them right and is over-confident on the rest. Returns the images (RGB) and labels as written."""
    from tools.fixtures.train_demo import make_split

    x, y = make_split(seed, n)
    rng = np.random.default_rng(seed)
    x = np.clip(x.astype(np.float32) + rng.normal(0, noise, x.shape), 0, 255).astype(np.uint8)
    for i, (img, lab) in enumerate(zip(x, y)):
        d = root / LABELS[lab]
        d.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(d / f"{i:03d}.png"), img[:, :, ::-1])
    return x, y


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "converters.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_validate_cli_reports_ece_and_writes_a_reliability_png_per_variant(tmp_path: Path) -> None:
    import onnxruntime as ort

    from tools.fixtures.train_demo import to_tensor

    x, y = _noisy_shapes(tmp_path / "data", 2024, 120)
    r = _cli("validate", str(DEMO), "--data", str(tmp_path / "data"), "--quiet", "--report-dir", str(tmp_path / "rep"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "calibration (top-1 confidence, 15 equal-width bins, 120 samples)" in r.stdout
    rows = {row["variant"]: row for row in json.loads((tmp_path / "rep" / "validation.json").read_text())}
    assert set(rows) == {"fp32-onnx", "int8-onnx", "fp32-tflite"}
    for vid, row in rows.items():
        cal = row["calibration"]
        assert f"{vid:14s} ECE {cal['before']['ece']:.4f}" in r.stdout
        assert "after" not in cal and cal["temperature"] is None and not cal["fitted"]  # the demo has no temperature
        png = tmp_path / "rep" / cal["diagram"]
        assert png.name == f"reliability_{vid}.png" and png.read_bytes()[:8] == PNG_MAGIC
        img = cv2.imread(str(png))
        assert img is not None and img.shape[0] >= 300 and len(np.unique(img.reshape(-1, 3), axis=0)) > 10
    # The fp32 figures match an independent computation: ONNX Runtime on the same images, numpy softmax, ECE by hand.
    s = ort.InferenceSession(str(DEMO / "model_fp32.onnx"), providers=["CPUExecutionProvider"])
    logits = np.concatenate([s.run(None, {"image": to_tensor(x[i : i + 1])})[0] for i in range(len(x))]).astype(np.float64)
    p, yy = _softmax(logits), y  # ECE does not depend on the order of the samples
    conf, right = p.max(1), (p.argmax(1) == yy)
    b = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)
    ece = sum((b == k).sum() / len(yy) * abs(right[b == k].mean() - conf[b == k].mean()) for k in range(15) if (b == k).any())
    fp = rows["fp32-onnx"]["calibration"]["before"]
    assert 0.5 < right.mean() < 0.95 and fp["accuracy"] == pytest.approx(right.mean())
    assert fp["ece"] == pytest.approx(ece, abs=2e-3) and fp["ece"] > 0.1  # over-confident on noisy images
    # --json with --calibrate-temperature: a fitted T per variant, ECE after it lower; the package is not changed
    r = _cli("validate", str(DEMO), "--data", str(tmp_path / "data"), "--quiet", "--json", "--calibrate-temperature", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for row in json.loads(r.stdout):
        cal = row["calibration"]
        assert cal["fitted"] and cal["temperature"] > 1.5 and cal["after"]["ece"] < cal["before"]["ece"]
    assert ModelPackage.open(DEMO).manifest.variant("fp32-onnx").temperature is None


def test_validate_cli_without_labels_and_with_bad_bins(tmp_path: Path) -> None:
    from tools.fixtures.train_demo import make_split, to_tensor

    x, y = make_split(5, 8)
    np.savez(tmp_path / "nolab.npz", image=to_tensor(x))
    r = _cli("validate", str(DEMO), "--data", str(tmp_path / "nolab.npz"), "--quiet", "--calibrate-temperature", cwd=tmp_path)
    assert r.returncode == 1 and "ValidationError" in r.stderr and "class labels" in r.stderr
    np.savez(tmp_path / "lab.npz", image=to_tensor(x), labels=y)
    r = _cli("validate", str(DEMO), "--data", str(tmp_path / "lab.npz"), "--quiet", "--bins", "0", cwd=tmp_path)
    assert r.returncode == 1 and "n_bins: expected an integer 1..1000" in r.stderr


def test_quantize_fits_and_stores_a_temperature_per_variant(tmp_path: Path) -> None:
    from converters.pipeline import ConvertError, ConvertOptions, convert
    from edge_sdk.package import ImagePreprocess

    _noisy_shapes(tmp_path / "calib", 11, 96)
    xv, yv = _noisy_shapes(tmp_path / "val", 12, 96)
    pre = ImagePreprocess((32, 32), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), interpolation="area")
    opts = ConvertOptions(
        targets=("int8",), task="classification", name="shapes", dims={"batch": (1, 16)}, preprocess=pre, class_names=LABELS,
        progress=False, calibrate_temperature=True, gate={"cosine": 0.99},
    )  # fmt: skip
    res = convert(DEMO / "model_fp32.onnx", tmp_path / "calib", tmp_path / "pkg", opts, validation=tmp_path / "val")
    pkg = ModelPackage.open(res.package)
    rows = {r["id"]: r for r in res.report["variants"]}
    assert set(res.written) == {"fp32-onnx", "int8-onnx"}
    for vid in res.written:
        cal = rows[vid]["calibration"]
        t = pkg.manifest.variant(vid).temperature
        assert cal["fitted"] and cal["fitted_on"] == str(tmp_path / "calib") and t == pytest.approx(cal["temperature"])
        assert t > 1.5  # over-confident on noisy shapes: softened
        # fitted on the calibration split, measured on the unseen validation split
        assert cal["after"]["ece"] < cal["before"]["ece"] and cal["after"]["nll"] < cal["before"]["nll"]
        assert (res.package / cal["diagram"]).read_bytes()[:8] == PNG_MAGIC
    md = (res.package / "report.md").read_text()
    assert "## Calibration" in md and "![reliability diagram of fp32-onnx](reliability_fp32-onnx.png)" in md
    assert json.loads((res.package / "report.json").read_text())["variants"][0]["calibration"]["n_bins"] == 15
    # the stored T is what the decoder applies
    from tools.fixtures.train_demo import to_tensor

    with edge_sdk.load(pkg, variant="int8-onnx", measure_backends=False) as model:
        r = model.predict({"image": to_tensor(xv[:1])})
        want = _softmax(np.asarray(r.outputs["logits"], np.float64) / pkg.manifest.variant("int8-onnx").temperature)[0]
        assert r.top1.score == pytest.approx(float(want.max()), rel=1e-5)
    with pytest.raises(ConvertError, match="--calibrate-temperature needs --task classification"):
        convert(
            DEMO / "model_fp32.onnx",
            tmp_path / "calib",
            tmp_path / "pkg2",
            ConvertOptions(task="raw", dims={"batch": (1, 16)}, preprocess=pre, progress=False, calibrate_temperature=True),
        )
