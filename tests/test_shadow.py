"""Shadow checks (edge_sdk/quality/shadow.py): a sample of requests also answered by a reference
(the fp32 variant here, or a server), off the request path, with the agreement rate as telemetry.
Real models throughout: the demo package's int8 and fp32 variants on images drawn by
tools/fixtures/train_demo.make_split, a biased fp32 model and a slow MLP built here, `edge-sdk serve`'s
Server on 127.0.0.1."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_manifest, mlp_onnx

import edge_sdk
from edge_sdk.errors import SelectionError
from edge_sdk.processing.detection import Detections
from edge_sdk.quality.shadow import (
    ShadowChecker,
    ShadowError,
    ShadowMemoryError,
    classification_agreement,
    cosine_agreement,
    detection_agreement,
    shadow_samples,
)
from edge_sdk.remote.client import RemoteClient
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.telemetry import EventLog, Registry, parse
from tools.fixtures.train_demo import make_split

DEMO = edge_sdk.demo_package_path()


@pytest.fixture(scope="module")
def images() -> tuple[np.ndarray, np.ndarray]:
    return make_split(11, 120)


def _int8() -> edge_sdk.Model:
    return edge_sdk.load(DEMO, variant="int8-onnx")


def _value(samples, name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


# -- agreement on the demo package --------------------------------------------------------------


def test_local_fp32_agreement_is_measured_and_matches_running_both_variants(images) -> None:
    x, _ = images
    with _int8() as primary, edge_sdk.load(DEMO, variant="fp32-onnx") as fp32:
        direct = [primary.predict_image(im).top1.index == fp32.predict_image(im).top1.index for im in x]
        expected = sum(direct) / len(direct)
        with ShadowChecker.local_fp32(primary, sample_every=1, max_in_flight=len(x)) as checker:
            assert checker.reference.variant.id == "fp32-onnx" and checker.reference_label == "local:fp32-onnx"
            for im in x:
                r = checker.predict_image(im)
                want = primary.predict_image(im)
                assert r.variant_id == "int8-onnx"
                np.testing.assert_array_equal(r.outputs["logits"], want.outputs["logits"])  # the primary's answer, unchanged
            assert checker.drain(20)
            st = checker.status()
            assert st["sampled"] == st["checked"] == st["rows_checked"] == len(x)
            assert st["skipped_busy"] == st["skipped_budget"] == st["privacy_blocked"] == st["errors"] == 0
            assert st["agreement_total"] == pytest.approx(expected)
            assert st["agreement"] == pytest.approx(sum(direct[-checker.window :]) / min(len(x), checker.window))
            assert expected >= 0.95 and not checker.alarm and not checker.events
            reg = Registry()
            reg.track(checker)
            back = parse(reg.render())  # through the Prometheus text format
            lab = {"model": "shapes-classifier", "reference": "local:fp32-onnx"}
            assert _value(back, "edge_sdk_shadow_agreement", scope="total", **lab) == pytest.approx(expected)
            assert _value(back, "edge_sdk_shadow_checked_total", **lab) == len(x)
            assert _value(back, "edge_sdk_shadow_reference_latency_seconds_count", **lab) == len(x)
            assert _value(back, "edge_sdk_shadow_skipped_total", reason="busy", **lab) == 0
            reference = checker.reference
        assert reference.closed  # made by local_fp32: closed with the checker
        assert not primary.closed


def test_sampling_every_nth_and_observe(images) -> None:
    x, _ = images
    with _int8() as primary:
        with ShadowChecker.local_fp32(primary, sample_every=4, max_in_flight=64) as checker:
            for i, im in enumerate(x[:40]):
                if i % 2:
                    checker.predict_image(im)
                else:  # the caller ran it: observe the PreparedImage (or tensor) and the result
                    prep = primary.prepare_image(im)
                    checker.observe(prep, primary.predict_prepared(prep))
            tensor = primary.prepare_image(x[0]).feeds["image"]
            for _ in range(8):
                checker.predict(tensor)
            assert checker.drain(20)
            c = checker.counts
            assert c["requests"] == 48 and c["sampled"] == 12 and c["checked"] == 12 and c["rows_checked"] == 12
        for _ in range(4):
            assert checker.predict(tensor).variant_id == "int8-onnx"  # closed: the primary still answers, nothing is sampled
        assert checker.counts["sampled"] == 12 and checker.counts["submitted"] == 12


# -- a wrong reference: agreement drops and the event fires, with hysteresis -----------------------


def _biased_reference_package(tmp_path: Path) -> Path:
    """The demo's fp32 model with +10000 added to the circle logit: it answers "circle" always."""
    import onnx
    from onnx import helper, numpy_helper

    from converters.packaging import write_package
    from edge_sdk._toml import loads

    m = onnx.load(str(DEMO / "model_fp32.onnx"))
    out = m.graph.output[0].name
    for node in m.graph.node:
        node.output[:] = [f"{out}_raw" if o == out else o for o in node.output]
    m.graph.initializer.append(numpy_helper.from_array(np.array([1e4, 0, 0, 0], np.float32), "circle_bias"))
    m.graph.node.append(helper.make_node("Add", [f"{out}_raw", "circle_bias"], [out]))
    onnx.checker.check_model(m)
    man = loads((DEMO / "edge-model.toml").read_text())
    fp32 = next(v for v in man["variants"] if v["id"] == "fp32-onnx")
    man["variants"] = [{k: v for k, v in fp32.items() if k not in ("sha256", "size", "quality")}]
    man.pop("reference_stats", None)
    man.pop("golden", None)
    write_package(tmp_path / "biased", man, {"model_fp32.onnx": m.SerializeToString()})
    return tmp_path / "biased"


def test_a_wrong_reference_drops_agreement_and_fires_events(tmp_path: Path, images) -> None:
    x, y = images
    circles, others = x[y == 0], x[y != 0]
    assert len(circles) >= 20 and len(others) >= 40
    records: list[dict] = []
    with _int8() as primary, edge_sdk.load(_biased_reference_package(tmp_path)) as biased:
        checker = ShadowChecker(primary, biased, sample_every=1, max_in_flight=128, window=20, min_rows=10, threshold=0.8, consecutive=2)
        got = []
        checker.subscribe(got.append)
        log = EventLog(callback=records.append)
        log.watch(checker)
        for im in circles[:20]:  # the primary says circle: the biased reference agrees
            assert checker.predict_image(im).top1.label == "circle"
        assert checker.drain(20)
        assert checker.agreement == 1.0 and not got and not checker.alarm
        for im in others[:30]:
            checker.predict_image(im)
        assert checker.drain(20)
        assert checker.alarm and checker.agreement < 0.2
        assert [(e.kind, e.indicator) for e in got] == [("entered", "shadow_disagreement")]
        assert got[0].value < 0.8 and got[0].detail["reference"] == "local:fp32-onnx" and got[0].detail["primary"] == "int8-onnx"
        for im in np.concatenate([circles[:20], circles[:20]]):  # back to agreeing: the alarm is left, once
            checker.predict_image(im)
        assert checker.drain(20)
        assert [e.kind for e in got] == ["entered", "left"] and not checker.alarm
        assert got[1].value >= checker.exit_threshold
        assert [(r["source"], r["kind"], r["indicator"]) for r in records] == [
            ("quality", "entered", "shadow_disagreement"), ("quality", "left", "shadow_disagreement"),
        ]  # fmt: skip
        n_rows = 20 + 30 + 40
        assert checker.counts["rows_checked"] == n_rows
        assert checker.agreement_total == pytest.approx(checker.counts["rows_agreed"] / n_rows)
        s = shadow_samples(checker)()
        assert _value(s, "edge_sdk_shadow_disagreement") == 0.0
        log.close()
        checker.close()
        assert not biased.closed  # not made by the checker: the caller closes it


# -- cost bounds: a slow reference never slows the caller ------------------------------------------


def _slow_onnx(n_in: int = 8, n_out: int = 4, hidden: int = 1024, layers: int = 256) -> bytes:
    """x[batch, n_in] -> MatMul -> (MatMul 1024x1024 -> Tanh) x layers -> y[batch, n_out]: tens of ms a call."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w0 = (rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32)
    wh = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    w1 = (rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"])]
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [f"h{i}", "wh"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes.append(helper.make_node("MatMul", [f"h{layers}", "w1"], ["y"]))
    g = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n_out])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(wh, "wh"), numpy_helper.from_array(w1, "w1")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.fixture
def mlp_pair(tmp_path: Path):
    """A fast MLP (the primary) and a slow one with the same signature (the reference)."""
    from converters.packaging import write_package

    write_package(tmp_path / "fast", mlp_manifest(), {"m.onnx": mlp_onnx()})
    write_package(tmp_path / "slow", mlp_manifest(file="slow.onnx"), {"slow.onnx": _slow_onnx()})
    with edge_sdk.load(tmp_path / "fast") as fast, edge_sdk.load(tmp_path / "slow", threads=1, telemetry=False) as slow:
        yield fast, slow


def _median_ms(model, x, n: int = 5) -> float:
    model.predict(x)
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        model.predict(x)
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def test_a_slow_reference_is_skipped_when_busy_and_never_waited_for(mlp_pair) -> None:
    fast, slow = mlp_pair
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    ref_ms = _median_ms(slow, x)
    assert ref_ms > 5 * _median_ms(fast, x)
    n = 300
    with ShadowChecker(fast, slow, sample_every=1, max_in_flight=1, min_cosine=-1.0) as checker:
        t = time.perf_counter()
        for _ in range(n):
            r = checker.predict(x)
        loop_ms = (time.perf_counter() - t) * 1e3
        c = checker.counts
        assert r.variant_id == "fp32" and c["sampled"] == n
        assert c["checked"] + c["skipped_busy"] + checker.in_flight == n and c["skipped_budget"] == 0
        assert checker.in_flight <= 1
        assert c["skipped_busy"] >= n - 1 - loop_ms / ref_ms - 2  # at most one reference call per reference latency
        assert c["skipped_busy"] > n // 2
        assert loop_ms < n * ref_ms / 5, (loop_ms, ref_ms)  # waiting for the reference would take n * ref_ms
        assert checker.drain(10)
        c = checker.counts
        assert c["checked"] + c["skipped_busy"] == n and c["checked"] >= 1 and c["rows_agreed"] == c["checked"]
        assert checker.latency.count == c["checked"]


def test_max_per_s_bounds_the_reference_calls(mlp_pair, tmp_path: Path) -> None:
    fast, _ = mlp_pair
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    with (
        edge_sdk.load(tmp_path / "fast", telemetry=False) as twin,
        ShadowChecker(fast, twin, sample_every=1, max_in_flight=8, max_per_s=20) as checker,
    ):
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 0.5 and n < 5000:  # bounded in time and count
            checker.predict(x)
            n += 1
            time.sleep(0.001)
        elapsed = time.monotonic() - t0
        assert checker.drain(10)
        c = checker.counts
        assert c["sampled"] == n
        assert 2 <= c["checked"] <= 1 + 20 * elapsed + 1, (c, elapsed)
        assert c["checked"] + c["skipped_budget"] + c["skipped_busy"] == n and c["skipped_budget"] > n // 2
        assert c["rows_checked"] == 2 * c["checked"] and checker.agreement_total == 1.0  # the same model: agrees by cosine


def test_max_busy_fraction_bounds_the_reference_time(mlp_pair) -> None:
    fast, slow = mlp_pair
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    ref_s = _median_ms(slow, x) / 1e3
    with ShadowChecker(fast, slow, sample_every=1, max_in_flight=4, max_busy_fraction=0.2, min_cosine=-1.0) as checker:
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 1.0 and n < 5000:
            checker.predict(x)
            n += 1
            time.sleep(0.002)
        assert checker.drain(10)
        st = checker.status()
        assert st["checked"] >= 1 and st["skipped_budget"] > n // 2
        assert st["checked"] + st["skipped_budget"] + st["skipped_busy"] == n
        # admitted only while busy time (with what is queued) <= 20 % of the time so far: at most one call over
        assert st["reference_busy_s"] <= 0.2 * st["uptime_s"] + 4 * ref_s, st


# -- a remote reference and the privacy policy ----------------------------------------------------


def _served_requests(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return sum(s.value for s in parse(r.read().decode()) if s.name == "edge_sdk_serve_requests_total")


def test_remote_reference_checks_on_the_server_only_when_privacy_allows(images) -> None:
    from edge_sdk.serve import Server

    x, _ = images
    x = x[:20]
    with edge_sdk.load(DEMO, variant="fp32-onnx") as served, Server([served]) as srv, _int8() as primary:
        expected = [primary.predict_image(im).top1.index == served.predict_image(im).top1.index for im in x[::2]]
        client = RemoteClient(srv.url, deadline_s=5.0)
        with ShadowChecker.remote(primary, client, privacy=PrivacyPolicy("allowed"), sample_every=2, max_in_flight=32) as checker:
            assert checker.kind == "remote" and checker.reference_label == f"remote:{srv.url}"
            for im in x:
                checker.predict_image(im)
            assert checker.drain(20)
            c = checker.counts
            assert c["sampled"] == c["checked"] == 10 and c["privacy_blocked"] == 0 and c["errors"] == 0
            assert checker.agreement_total == pytest.approx(sum(expected) / len(expected))
        assert _served_requests(srv.url) == 10  # the server answered each check

        for policy in (PrivacyPolicy(), PrivacyPolicy("allowlist", allow_inputs=("embedding",))):  # default: nothing leaves
            with ShadowChecker.remote(primary, client, privacy=policy, sample_every=1) as checker:
                for im in x:
                    r = checker.predict_image(im)
                assert r.variant_id == "int8-onnx" and checker.drain(5)
                c = checker.counts
                assert c["privacy_blocked"] == c["sampled"] == len(x) and c["checked"] == c["submitted"] == 0
                s = checker.samples()
                assert _value(s, "edge_sdk_shadow_skipped_total", reason="privacy") == len(x)
            assert _served_requests(srv.url) == 10  # not one more request reached the server


# -- memory and configuration refusals --------------------------------------------------------------


def test_local_fp32_refused_when_both_variants_do_not_fit_the_memory_budget(tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from converters.packaging import write_package

    src = tmp_path / "big_fp32.onnx"
    src.write_bytes(mlp_onnx(64, 1840))  # 0.45 MiB of weights: ~0.9 MiB to run, fits 1 MiB alone
    quantize_dynamic(str(src), str(tmp_path / "big_int8.onnx"), weight_type=QuantType.QInt8)
    man = mlp_manifest(64, 1840, name="big")
    man["variants"] = [
        {"id": "fp32", "file": "m_fp32.onnx", "backend": "onnxruntime", "precision": "fp32"},
        {"id": "int8", "file": "m_int8.onnx", "backend": "onnxruntime", "precision": "int8"},
    ]
    pkg = tmp_path / "big"
    write_package(pkg, man, {"m_fp32.onnx": src.read_bytes(), "m_int8.onnx": (tmp_path / "big_int8.onnx").read_bytes()})
    base = (Path(edge_sdk.__file__).parents[1] / "device_profiles" / "generic-x86_64.toml").read_text()
    tiny = tmp_path / "generic-x86_64.toml"  # this box, with 1 MiB for models
    tiny.write_text(base.replace("memory_budget_mb = ", "memory_budget_mb = 1 #"))
    with edge_sdk.load(pkg, str(tiny), variant="int8") as primary:
        assert primary.detection.memory_budget_mb == 1
        with pytest.raises(ShadowMemoryError) as ei:
            ShadowChecker.local_fp32(primary)
        msg = str(ei.value)
        assert "int8 (~0.2" in msg and "fp32 (~0.9" in msg and "over the 1 MiB memory budget" in msg
        assert isinstance(ei.value, SelectionError)
    with edge_sdk.load(pkg, "generic-x86_64", variant="int8") as primary, ShadowChecker.local_fp32(primary, sample_every=1) as checker:
        xs = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        checker.predict(xs)  # the default budget holds both: checked by cosine of the raw outputs
        assert checker.drain(10) and checker.counts["checked"] == 1 and checker.agreement_total == 1.0


def test_configuration_errors_are_typed(mlp_package: Path) -> None:
    with edge_sdk.load(DEMO, variant="fp32-onnx") as fp32:
        with pytest.raises(ShadowError, match="already runs fp32-onnx"):
            ShadowChecker.local_fp32(fp32)
        with pytest.raises(ShadowError, match="another model"):
            ShadowChecker(fp32, fp32)
    with edge_sdk.load(mlp_package) as mlp:
        with pytest.raises(ShadowError, match="already runs fp32"):
            ShadowChecker.local_fp32(mlp)
        with pytest.raises(ShadowError, match="variant 'nope' is not in package mlp"):
            ShadowChecker.local_fp32(mlp, variant="nope")
        with edge_sdk.load(DEMO) as demo:
            with pytest.raises(ShadowError, match="decodes 'classification'"):
                ShadowChecker(mlp, demo)
        with edge_sdk.load(mlp_package, telemetry=False) as twin:
            for kw, what in (({"sample_every": 0}, "sample_every"), ({"rate": 1.5}, "rate"), ({"max_in_flight": 0}, "max_in_flight"),
                             ({"max_per_s": 0}, "max_per_s"), ({"max_busy_fraction": 2}, "max_busy_fraction"),
                             ({"threshold": 0.9, "exit_threshold": 0.5}, "threshold"), ({"min_rows": 500}, "min_rows")):  # fmt: skip
                with pytest.raises(ValueError, match=what):
                    ShadowChecker(mlp, twin, **kw)
            with pytest.raises(TypeError, match="reference"):
                ShadowChecker(mlp, "http://127.0.0.1:1")


# -- the agreement functions ---------------------------------------------------------------------------


def test_agreement_functions() -> None:
    from edge_sdk.processing.decoders import decode_classification

    labels = ["a", "b", "c"]
    p = decode_classification(np.array([[3.0, 1, 0], [0, 2, 1]]), labels, top_k=2)
    q = decode_classification(np.array([[2.5, 1, 0], [0, 1, 2]]), labels, top_k=2)
    assert classification_agreement(p, q) == [True, False]
    assert classification_agreement(p, q, max_score_delta=1e-6) == [False, False]
    assert classification_agreement(p, q, max_score_delta=0.2) == [True, False]

    a = Detections(np.array([[0, 0, 10, 10], [20, 20, 40, 40]], np.float32), np.array([0.9, 0.8], np.float32), np.array([1, 2], np.int32))
    moved = Detections(
        np.array([[21, 21, 41, 41], [1, 0, 11, 10]], np.float32), np.array([0.7, 0.9], np.float32), np.array([2, 1], np.int32)
    )
    far = Detections(np.array([[0, 0, 10, 10], [30, 30, 50, 50]], np.float32), np.array([0.9, 0.8], np.float32), np.array([1, 2], np.int32))
    relabelled = Detections(a.xyxy, a.scores, np.array([2, 1], np.int32))
    one = a[np.array([True, False])]
    empty = a[np.array([False, False])]
    assert detection_agreement(a, moved) == [True]  # order-free, IoU ~0.82 and ~0.9
    assert detection_agreement(a, far) == [False]  # IoU 0.14 < 0.5
    assert detection_agreement(a, far, iou=0.1) == [True]
    assert detection_agreement(a, relabelled) == [False]
    assert detection_agreement(a, one) == [False] and detection_agreement(empty, empty) == [True]
    assert detection_agreement([a, a], [moved, far]) == [True, False]

    u = {"y": np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)}
    v = {"y": np.array([[1.0, 0.05], [1.0, -1.0]], np.float32)}
    assert cosine_agreement(u, v, min_cosine=0.99) == [True, False]
    assert cosine_agreement(u, {"y": np.zeros((2, 2), np.float32)}) == [False, False]
    with pytest.raises(ShadowError, match="shape"):
        cosine_agreement(u, {"y": np.zeros((2, 3), np.float32)})


def test_a_checker_dropped_without_close_is_collected_and_its_thread_ends(mlp_package: Path) -> None:
    import gc
    import threading
    import weakref

    x = np.ones((1, 8), np.float32)
    with edge_sdk.load(mlp_package) as primary, edge_sdk.load(mlp_package, telemetry=False) as twin:
        checker = ShadowChecker(primary, twin, sample_every=1, name="dropped")
        checker.predict(x)
        assert checker.drain(5) and checker.counts["checked"] == 1
        (thread,) = [t for t in threading.enumerate() if t.name == "edge-sdk-shadow-dropped"]
        gone = weakref.ref(checker)
        del checker
        gc.collect()
        assert gone() is None
        thread.join(5)
        assert not thread.is_alive()
        assert primary.predict(x).variant_id == "fp32"


def test_a_reference_with_other_input_specs_gets_the_image_and_failures_are_counted(images) -> None:
    x, _ = images
    with edge_sdk.load(DEMO, variant="fp32-tflite") as nhwc, edge_sdk.load(DEMO, variant="fp32-onnx", telemetry=False) as nchw:
        with ShadowChecker(nhwc, nchw, sample_every=1, max_in_flight=32) as checker:
            for im in x[:10]:  # LiteRT NHWC vs ONNX NCHW: the reference preprocesses the image its own way
                assert checker.predict_image(im).variant_id == "fp32-tflite"
            assert checker.drain(10)
            assert checker.counts["checked"] == 10 and checker.agreement_total == 1.0
            prep = nhwc.prepare_image(x[0])
            checker.observe(prep, nhwc.predict_prepared(prep))  # its tensor would not fit the reference: counted, not run
            checker.predict(prep.feeds["image"])  # run: the reference refuses the NHWC tensor (InputShapeError), counted
            assert checker.drain(10)
            st = checker.status()
            assert st["checked"] == 10 and st["errors"] == 2
            assert st["errors_by_type"] == {"ShadowError": 1, "InputShapeError": 1}
            assert _value(checker.samples(), "edge_sdk_shadow_errors_total") == 2


def test_a_pipeline_runs_through_the_checker(tmp_path: Path) -> None:
    """A VisionPipeline takes the checker as its model: every frame answered by the primary, every
    2nd also checked by the fp32 reference, frame accounting exact."""
    from edge_sdk.assets import demo_package_path, demo_samples
    from edge_sdk.pipelines import VisionPipeline

    labels: list[str] = []
    with edge_sdk.load(demo_package_path(), "generic-x86_64", threads=1, cache_dir=tmp_path, variant="int8-onnx") as model:
        checker = ShadowChecker.local_fp32(model, sample_every=2, max_in_flight=16)
        try:
            pipe = VisionPipeline(checker, demo_samples()[0].parent, sinks=[lambda f: labels.append(f.result.top1.label)])
            pipe.run()
            deadline = time.monotonic() + 20
            while checker.status()["checked"] < 6 and time.monotonic() < deadline:
                time.sleep(0.02)
            st = checker.status()
        finally:
            checker.close()
    n = len(demo_samples())
    c = pipe.counters()
    assert (c.frames_in, c.processed, c.dropped_total, c.unaccounted) == (n, n, 0, 0)
    assert labels == [p.stem.rsplit("_", 1)[0] for p in demo_samples()]
    assert st["requests"] == n and st["sampled"] == n // 2 and st["checked"] == n // 2 and st["agreement_total"] == 1.0
