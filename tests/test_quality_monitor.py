"""Quality on the device: reference statistics and the drift monitor, on real models.

The demo shapes classifier (real ONNX Runtime session) is driven with drawn images
(tools/fixtures/train_demo.make_split) darkened step by step and blurred: the monitor must flag the
drift within a stated number of samples, and must not flag streams drawn from the reference
distribution (false-alarm rate measured over 20 streams). A sensor model (an MLP over 8
features) gets an offset on one feature. PSI and KS are checked on hand-computable cases and
against scipy; hysteresis, telemetry, events, and the package's digest-covered
reference_stats.json (tampering refused) too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

import edge_sdk
from edge_sdk.errors import IntegrityError, ManifestError
from edge_sdk.quality import (
    MonitorThresholds,
    QualityMonitor,
    ReferenceStats,
    ReferenceStatsError,
    ks_pvalue,
    ks_statistic,
    psi,
    reference_from_model,
)
from edge_sdk.telemetry import EventLog, Registry, parse

WINDOW, EVERY = 200, 50
# With a full window of 200 and evaluations every 50 sampled rows, two in a row over the threshold:
# a drift present in every row is flagged after at most WINDOW * 0.75 + 2 * EVERY rows (the window
# must be mostly drifted), i.e. 250; the tests assert that bound.
DETECT_BOUND = 250


@pytest.fixture(scope="module")
def demo_model():
    from edge_sdk.assets import demo_package_path

    m = edge_sdk.load(demo_package_path(), "generic-x86_64", variant="fp32-onnx", telemetry=False)
    yield m
    m.close()


def _tensors(model, images: np.ndarray) -> np.ndarray:
    return np.concatenate([model.prepare_image(im).feeds["image"] for im in images])


@pytest.fixture(scope="module")
def demo_ref(demo_model) -> ReferenceStats:
    from tools.fixtures.train_demo import make_split

    x, _ = make_split(7, 600)  # the "calibration data"
    return reference_from_model(demo_model, list(_tensors(demo_model, x)[:, None]), source="make_split(7, 600)")


@pytest.fixture(scope="module")
def fresh_pool(demo_model) -> np.ndarray:
    """Held-out images of the reference distribution (seeds the reference never saw), model-ready."""
    from tools.fixtures.train_demo import make_split

    return _tensors(demo_model, make_split(20261130, 1200)[0])


def _monitor(model, ref, **kw) -> QualityMonitor:
    kw.setdefault("window", WINDOW)
    kw.setdefault("evaluate_every", EVERY)
    mon = QualityMonitor(ref, **kw)
    model.attach_monitor(mon)
    return mon


def _first_entered(mon: QualityMonitor, indicator: str = "drift"):
    return next((e for e in mon.events if e.kind == "entered" and e.indicator == indicator), None)


# --------------------------------------------------------------------------------------------
# the reference


def test_reference_stats_of_the_demo(demo_ref: ReferenceStats) -> None:
    r = demo_ref
    assert r.samples == 600 and r.output_kind == "classification"
    assert {"image.brightness", "image.contrast", "image.sharpness", "image.mean_R", "confidence"} <= set(r.summaries)
    img = r.inputs["image"]
    assert img["kind"] == "image" and len(img["channel_mean"]) == 3 and len(img["channel_std"]) == 3
    # make_split draws uniform random backgrounds: mean pixel near the middle of 0..255, wide spread
    assert 100 < r.summaries["image.brightness"].mean < 155 and all(60 < s < 90 for s in img["channel_std"])
    assert len(r.classes) == 4 and abs(sum(r.classes) - 1) < 1e-9 and min(r.classes) > 0.15  # four balanced classes
    s = r.summaries["image.brightness"]
    assert len(s.edges) == 9 and all(abs(f - 0.1) < 0.02 for f in s.fractions)  # deciles: about a tenth per bin
    back = ReferenceStats.from_json(r.to_json())
    assert back == r


def test_reference_stats_parse_strictly(demo_ref: ReferenceStats) -> None:
    d = json.loads(demo_ref.to_json())
    d["summaries"]["image.brightness"]["fractions"][0] += 0.5
    with pytest.raises(ReferenceStatsError, match="summing to 1"):
        ReferenceStats.from_dict(d)
    d = json.loads(demo_ref.to_json())
    d["surprise"] = 1
    with pytest.raises(ReferenceStatsError, match="unknown \\['surprise'\\]"):
        ReferenceStats.from_dict(d)
    with pytest.raises(ReferenceStatsError, match="expected JSON"):
        ReferenceStats.from_json("{nope")
    with pytest.raises(TypeError, match="expected ReferenceStats"):
        QualityMonitor({"samples": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample_every: expected an int >= 1"):
        QualityMonitor(demo_ref, sample_every=0)
    with pytest.raises(ValueError, match="psi_exit < psi_enter"):
        MonitorThresholds(psi_enter=0.1, psi_exit=0.2)


# --------------------------------------------------------------------------------------------
# PSI and KS on cases worked by hand, and against scipy


def test_psi_by_hand() -> None:
    assert psi([0.5, 0.5], [0.5, 0.5]) == 0.0
    assert psi([0.5, 0.5], [0.9, 0.1]) == pytest.approx(0.4 * math.log(1.8) + 0.4 * math.log(5.0), rel=1e-12)
    # an empty bin counts as 1e-4 (no division by zero, no infinity)
    assert psi([1.0, 0.0], [0.5, 0.5]) == pytest.approx(-0.5 * math.log(0.5) + (0.5 - 1e-4) * math.log(0.5 / 1e-4), rel=1e-12)
    assert psi([0.2, 0.8], [0.8, 0.2]) == pytest.approx(psi([0.8, 0.2], [0.2, 0.8]))  # symmetric


def test_ks_by_hand_and_against_scipy() -> None:
    from scipy import special, stats

    unif_x, unif_p = np.array([0.0, 1.0]), np.array([0.0, 1.0])  # the reference: uniform on [0, 1]
    assert ks_statistic(np.arange(1, 11) / 10, unif_x, unif_p) == pytest.approx(0.1)  # the left limits count
    assert ks_statistic(np.full(4, 0.5), unif_x, unif_p) == pytest.approx(0.5)
    assert ks_statistic(np.array([2.0, 3.0]), unif_x, unif_p) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for v in (rng.uniform(size=50), rng.uniform(size=300) ** 1.3, rng.beta(2, 2, size=120)):
        assert ks_statistic(v, unif_x, unif_p) == pytest.approx(stats.kstest(v, "uniform").statistic, abs=1e-12)
    for d, n, m in ((0.1, 200, 600), (0.05, 1000, 1000), (0.3, 50, 80)):
        en = math.sqrt(n * m / (n + m))
        assert ks_pvalue(d, n, m) == pytest.approx(float(special.kolmogorov((en + 0.12 + 0.11 / en) * d)), rel=1e-9)
    assert ks_pvalue(0.0, 10, 10) == 1.0 and ks_pvalue(1.0, 200, 600) < 1e-30


# --------------------------------------------------------------------------------------------
# images: drift flagged within a bound, reference streams not flagged


def test_darkening_step_by_step_is_flagged(demo_model, demo_ref) -> None:
    from tools.fixtures.train_demo import make_split

    mon = _monitor(demo_model, demo_ref)
    try:
        x, _ = make_split(31337, 900)
        factors = [1.0] * 3 + [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]  # 100 images per step, darker every step
        row = 0
        onset = None
        for step, f in enumerate(factors):
            for im in x[step * 100 : (step + 1) * 100]:
                demo_model.predict_image((im.astype(np.float32) * f).astype(np.uint8))
                row += 1
                if f <= 0.8 and onset is None:
                    onset = row  # the first frame 20 % darker: a drift that matters
        ev = _first_entered(mon)
        assert ev is not None, mon.status()
        assert ev.sampled > 300, "flagged while the stream was still the reference distribution"
        assert ev.sampled - onset <= DETECT_BOUND, (ev.sampled, onset)
        assert "image.brightness" in ev.detail and ev.detail["image.brightness"]["mean"] < demo_ref.summaries["image.brightness"].mean
        assert mon.state == "drift" and mon.requests == 900 and mon.sampled == 900
    finally:
        demo_model.attach_monitor(mon)()  # detach


def test_blur_is_flagged_through_sharpness(demo_model, demo_ref) -> None:
    from tools.fixtures.train_demo import make_split

    mon = _monitor(demo_model, demo_ref, sample_every=2)  # every other request sampled
    try:
        x, _ = make_split(4711, 600)
        for im in x:
            demo_model.predict_image(cv2.GaussianBlur(im, (0, 0), 1.5))
        ev = _first_entered(mon)
        assert ev is not None, mon.status()
        assert ev.sampled <= DETECT_BOUND and ev.requests <= 2 * DETECT_BOUND
        assert "image.sharpness" in ev.detail
        st = mon.status()["summaries"]["image.sharpness"]
        assert st["mean"] < 0.7 * st["reference_mean"]  # blur: neighbouring pixels differ far less
        assert mon.requests == 600 and mon.sampled == 300
    finally:
        demo_model.attach_monitor(mon)()


def test_reference_streams_false_alarm_rate(demo_model, demo_ref, fresh_pool) -> None:
    """20 streams of 600 rows drawn (with replacement) from held-out images of the reference
    distribution: a stream with any drift alarm is a false alarm. Measured rate <= 1/20."""
    alarms, worst = 0, 0.0
    for s in range(20):
        rng = np.random.default_rng(1000 + s)
        stream = fresh_pool[rng.integers(0, len(fresh_pool), 600)]
        mon = _monitor(demo_model, demo_ref)
        try:
            for i in range(0, 600, 8):
                demo_model.predict(np.ascontiguousarray(stream[i : i + 8]))  # batches of 8: rows are observed one by one
        finally:
            demo_model.attach_monitor(mon)()
        assert mon.sampled == 600 and mon.status()["evaluations"] >= 8
        alarms += _first_entered(mon) is not None
        worst = max(worst, max(r["psi"] for r in mon.status()["summaries"].values()))
    rate = alarms / 20
    print(f"false-alarm rate {rate:.2f} over 20 reference streams of 600 rows; highest final PSI {worst:.3f}")
    assert rate <= 0.05, rate
    assert worst < 0.25


# --------------------------------------------------------------------------------------------
# a sensor model


@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory):
    from converters.packaging import write_package

    root = tmp_path_factory.mktemp("mlp") / "pkg"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    m = edge_sdk.load(root, "generic-x86_64", telemetry=False)
    yield m
    m.close()


def test_sensor_offset_is_flagged_and_schema_violations_counted(mlp_model) -> None:
    rng = np.random.default_rng(5)
    ref = reference_from_model(mlp_model, [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(600)])
    assert ref.output_kind == "raw" and {f"x.f{i}" for i in range(8)} | {"y.mean"} <= set(ref.summaries)
    feats = ref.inputs["x"]["features"]
    assert len(feats) == 8 and all(abs(f["mean"]) < 0.15 and 0.85 < f["std"] < 1.15 and f["missing"] == 0.0 for f in feats)
    mon = _monitor(mlp_model, ref)
    try:
        for _ in range(400):  # the reference distribution: no alarm
            mlp_model.predict(rng.standard_normal((1, 8)).astype(np.float32))
        assert _first_entered(mon) is None and mon.state == "ok"
        for _ in range(400):  # sensor 3 drifts: +1.5 (1.5 standard deviations)
            x = rng.standard_normal((1, 8)).astype(np.float32)
            x[0, 3] += 1.5
            mlp_model.predict(x)
        ev = _first_entered(mon)
        assert ev is not None and "x.f3" in ev.detail and 400 < ev.sampled <= 400 + DETECT_BOUND
        assert not any(k.startswith("x.f") and k != "x.f3" for k in ev.detail)  # only the sensor that moved
        # inputs refused by validation are schema violations (no data kept: the type and a rate)
        before = mon.status()["schema_violations"]
        for i in range(150):  # half the requests refused: 3 evaluations (every 50 sampled rows), 2 in a row enter
            with pytest.raises(edge_sdk.errors.InputError):
                mlp_model.predict(np.zeros((1, 7), np.float32) if i % 2 else np.full((1, 8), np.nan, np.float32))
            mlp_model.predict(rng.standard_normal((1, 8)).astype(np.float32))
        st = mon.status()
        assert st["schema_violations"] - before == 150
        assert st["violations_by_type"] == {"InputShapeError": 75, "NonFiniteInputError": 75}
        assert mon.alarms["schema"] and _first_entered(mon, "schema") is not None
    finally:
        mlp_model.attach_monitor(mon)()


# --------------------------------------------------------------------------------------------
# hysteresis, sampling, telemetry, events


def test_hysteresis_no_flapping(mlp_model) -> None:
    """A drift hovering between the exit and the enter threshold changes nothing; the state
    changes once on the way in and once on the way out, each after `consecutive` evaluations."""
    rng = np.random.default_rng(9)
    ref = reference_from_model(mlp_model, [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(600)])
    # PSI of x.f0 for a 0.5-sigma offset over 400 rows: 0.13 .. 0.49 (500 draws), between exit and enter
    th = MonitorThresholds(psi_enter=0.6, psi_exit=0.1, ks=False, consecutive=3)
    mon = _monitor(mlp_model, ref, thresholds=th, window=400)
    seen = []
    mon.subscribe(seen.append)

    def feed(n: int, offset: float) -> None:
        for _ in range(n):
            x = rng.standard_normal((1, 8)).astype(np.float32)
            x[0, 0] += offset
            mlp_model.predict(x)

    try:
        feed(400, 0.0)
        feed(1000, 2.0)  # far: enters
        assert [e.kind for e in seen] == ["entered"] and mon.state == "drift"
        feed(1000, 0.5)  # in between: stays in drift, no event
        psi_mid = mon.status()["summaries"]["x.f0"]["psi"]
        assert [e.kind for e in seen] == ["entered"] and mon.state == "drift", psi_mid
        feed(1000, 0.0)  # back: leaves once
        assert [e.kind for e in seen] == ["entered", "left"] and mon.state == "ok"
        feed(1000, 0.5)  # in between from "ok": does not enter
        assert [e.kind for e in seen] == ["entered", "left"], mon.status()["summaries"]["x.f0"]
        assert mon.status()["evaluations"] >= 80 and 0.1 < psi_mid < 0.6
    finally:
        mlp_model.attach_monitor(mon)()


def test_unsampled_requests_cost_a_counter_only(mlp_model) -> None:
    rng = np.random.default_rng(2)
    ref = reference_from_model(mlp_model, [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(100)])
    mon = _monitor(mlp_model, ref, sample_every=10)
    try:
        for _ in range(95):
            mlp_model.predict(rng.standard_normal((1, 8)).astype(np.float32))
        assert mon.requests == 95 and mon.sampled == 10  # requests 0, 10, ..., 90
    finally:
        mlp_model.attach_monitor(mon)()
    mon2 = _monitor(mlp_model, ref, rate=0.25, seed=1)
    try:
        for _ in range(400):
            mlp_model.predict(rng.standard_normal((1, 8)).astype(np.float32))
        assert mon2.requests == 400 and 60 <= mon2.sampled <= 140
    finally:
        mlp_model.attach_monitor(mon2)()


def test_telemetry_gauges_and_events(demo_model, demo_ref, tmp_path: Path) -> None:
    from tools.fixtures.train_demo import make_split

    mon = _monitor(demo_model, demo_ref, name="shapes-cam")
    reg = Registry()
    reg.track(mon)
    records: list[dict] = []
    try:
        with EventLog(tmp_path / "events.jsonl", callback=records.append) as log:
            log.watch(mon)
            for im in make_split(99, 450)[0]:
                demo_model.predict_image(im // 3)  # a third of the light
        text = reg.render()
    finally:
        demo_model.attach_monitor(mon)()
    samples = {(s.name, s.labels.get("summary"), s.labels.get("indicator")): s for s in parse(text)}
    assert samples[("edge_sdk_quality_drift", None, None)].value == 1.0
    assert samples[("edge_sdk_quality_alarm", None, "drift")].value == 1.0
    assert samples[("edge_sdk_quality_sampled_total", None, None)].value == 450
    assert samples[("edge_sdk_quality_psi", "image.brightness", None)].value > 1.0
    assert ("edge_sdk_quality_ks_pvalue", "confidence", None) in samples
    assert ("edge_sdk_quality_low_confidence_rate", None, None) in samples
    assert all(s.labels["model"] == "shapes-cam" for s in parse(text) if s.name.startswith("edge_sdk_quality"))
    drift = [r for r in records if r["source"] == "quality" and r["indicator"] == "drift"]
    assert drift and drift[0]["kind"] == "entered" and drift[0]["model"] == "shapes-cam"
    line = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])
    assert line["kind"] == "entered" and "image.brightness" in line["detail"]
    assert set(line["detail"]["image.brightness"]) <= {"psi", "n", "mean", "ks", "ks_p"}  # statistics only, never pixels


def test_monitor_must_fit_the_model(demo_model, mlp_model, demo_ref) -> None:
    with pytest.raises(ReferenceStatsError, match="classification model"):
        mlp_model.attach_monitor(QualityMonitor(demo_ref))
    with pytest.raises(TypeError, match="attach_monitor: expected a QualityMonitor"):
        demo_model.attach_monitor(object())
    mon = _monitor(demo_model, demo_ref)
    try:
        with pytest.raises(ValueError, match="already has a monitor"):
            demo_model.attach_monitor(QualityMonitor(demo_ref))
    finally:
        demo_model.attach_monitor(mon)()
    assert demo_model.monitor is None


# --------------------------------------------------------------------------------------------
# the package: written by edge-convert, covered by digest, loaded with the model


def test_converter_writes_reference_stats_covered_by_digest(tmp_path: Path) -> None:
    from converters.pipeline import ConvertOptions, convert
    from edge_sdk.package import ModelPackage

    rng = np.random.default_rng(0)
    (tmp_path / "m.onnx").write_bytes(mlp_onnx(8, 4))
    np.save(tmp_path / "cal.npy", rng.standard_normal((64, 8)).astype(np.float32))
    res = convert(tmp_path / "m.onnx", tmp_path / "cal.npy", tmp_path / "pkg",
                  ConvertOptions(targets=("fp16",), dims={"batch": (1, 8)}, progress=False))  # fmt: skip
    pkg = ModelPackage.open(res.package)
    rs = pkg.manifest.reference_stats
    assert rs is not None and rs.file == "reference_stats.json" and rs.size == (res.package / rs.file).stat().st_size
    with edge_sdk.load(res.package, "generic-x86_64") as model:
        ref = model.reference_stats
        assert ref.samples == 64 and "x.f0" in ref.summaries and "y.mean" in ref.summaries
        mon = QualityMonitor.for_model(model, window=32, evaluate_every=8)
        for x in rng.standard_normal((40, 1, 8)).astype(np.float32):
            model.predict(x + 3.0)  # every sensor offset by 3 sigma
        assert mon.state == "drift"
    # tampering with the statistics: refused when the package is opened (and when read)
    p = res.package / "reference_stats.json"
    d = json.loads(p.read_text())
    d["summaries"]["x.f0"]["mean"] += 1.0
    p.write_text(json.dumps(d))
    with pytest.raises(IntegrityError, match="reference stats"):
        edge_sdk.load(res.package, "generic-x86_64")
    # the manifest table is validated strictly
    from edge_sdk import _toml
    from edge_sdk.package import Manifest

    m = _toml.loads((res.package / "edge-model.toml").read_text())
    m["reference_stats"]["extra"] = 1
    with pytest.raises(ManifestError, match="reference_stats"):
        Manifest.from_dict(m)
    m["reference_stats"] = {"file": "../x.json", "sha256": "0" * 64, "size": 3}
    with pytest.raises(edge_sdk.errors.UnsafePackageError, match="escape"):
        Manifest.from_dict(m)


def test_package_without_reference_stats(mlp_model) -> None:
    assert mlp_model.reference_stats is None
    with pytest.raises(ReferenceStatsError, match="no reference_stats.json"):
        QualityMonitor.for_model(mlp_model)


def test_detection_model_count_and_box_area(tmp_path: Path) -> None:
    """BlazeFace (the pinned pretrained model, LiteRT) on real photographs: the reference has the
    detection count and box-area summaries; photos at a fifth of the light are flagged within a
    window and two evaluations."""
    from skimage import data

    from converters.packaging import write_package
    from tools.fixtures.fetch_pretrained import fetch

    write_package(
        tmp_path / "face",
        {
            "name": "face", "version": "1", "task": "detection",
            "decoder": {"kind": "detection", "format": "blazeface", "outputs": ["regressors", "classificators"]},
            "inputs": [{"name": "input", "dtype": "float32", "shape": [1, 128, 128, 3], "layout": "NHWC",
                        "preprocess": {"kind": "image", "size_hw": [128, 128], "resize": "letterbox", "color": "RGB",
                                       "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "pad_value": 0}}],
            "outputs": [{"name": "regressors", "dtype": "float32", "shape": [1, 896, 16]},
                        {"name": "classificators", "dtype": "float32", "shape": [1, 896, 1]}],
            "variants": [{"id": "fp32-tflite", "file": "face.tflite", "backend": "litert", "precision": "fp32"}],
        },
        {"face.tflite": fetch("mediapipe-face-detection-short-range")},
    )  # fmt: skip
    photos = [data.astronaut(), data.chelsea(), data.coffee()]  # one face, a cat, a cup
    rng = np.random.default_rng(0)
    with edge_sdk.load(tmp_path / "face", "generic-x86_64", delegates=(), telemetry=False) as m:
        ref = reference_from_model(
            m, [m.prepare_image(np.clip(photos[i % 3] * rng.uniform(0.8, 1.2), 0, 255).astype(np.uint8)).feeds["input"] for i in range(60)]
        )
        assert ref.output_kind == "detection" and {"count", "box_area", "input.brightness"} <= set(ref.summaries)
        assert 0.2 < ref.summaries["count"].mean < 1.0  # the astronaut's face, in a third of the photos or a little more
        assert 0.0 < ref.summaries["box_area"].mean < 0.5
        mon = QualityMonitor.for_model(m, ref, window=32, evaluate_every=8)
        # (three photos make a lumpy reference: the no-alarm side is measured on the demo classifier above)
        for i in range(60):
            m.predict_image((photos[i % 3] * 0.2).astype(np.uint8))
        ev = _first_entered(mon)
        assert ev is not None and ev.sampled <= 32 + 2 * 8 and "input.brightness" in ev.detail
        assert "count" in mon.status()["summaries"]
