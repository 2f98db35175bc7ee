"""Runtime telemetry (issue 7): latency histograms per model, variant and stage with percentiles,
counters (requests, errors by type, pipeline drops by reason, router offloads by trigger, governor
transitions), Prometheus exposition (checked with the official prometheus_client parser), JSON-lines
events, provenance on every result and event, and no input data anywhere in telemetry.

Real things throughout: the demo model, pipelines on SyntheticSource, a Router whose remote fails
(a port nobody listens on) or works (``edge-sdk serve`` on 127.0.0.1), a Governor with scripted
snapshots. The process-wide table is shared by every test, so counters are compared as deltas."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_sdk
from edge_sdk import telemetry as T
from edge_sdk.budget.governor import Budget, Governor, GovernorState
from edge_sdk.budget.types import SensorSnapshot
from edge_sdk.errors import InputDTypeError, InputShapeError, SessionClosedError
from edge_sdk.model import Result, Timings
from edge_sdk.pipelines import JsonLinesSink, PipelineOptions, SyntheticSource, VisionPipeline
from edge_sdk.pipelines.sinks import frame_result_record
from edge_sdk.remote.client import RemoteClient
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.router import Router, RouterOptions
from edge_sdk.remote.session import remote_model
from edge_sdk.telemetry import EDGES_NS, PERCENTILE_ERROR, EventLog, Histogram, MetricsServer, Registry, model_samples, parse
from edge_sdk.telemetry import core as telemetry_core

prometheus_parser = pytest.importorskip("prometheus_client.parser")

PKG = edge_sdk.demo_package_path()
PROFILE = "generic-x86_64"
ALLOWED = PrivacyPolicy("allowed")
SENTINEL = 12345.678  # a value no duration, count or label here can contain
SENTINEL_TEXT = "12345.6"
PATTERN = (211, 7, 173, 59, 241, 17)  # the pixel pattern of the "recognisable" images


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    with edge_sdk.load(PKG, PROFILE, variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("local")) as m:
        yield m


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from edge_sdk.serve import Server

    with edge_sdk.load(PKG, PROFILE, variant="int8-onnx", cache_dir=tmp_path_factory.mktemp("srv")) as m, Server([m]) as srv:
        yield srv


def dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def remote_for(url: str, **kw: Any):
    return remote_model(PKG, RemoteClient(url, **kw), privacy=ALLOWED, profile=PROFILE)


def pattern_image(h: int = 64, w: int = 64) -> np.ndarray:
    flat = np.resize(np.array(PATTERN, np.uint8), h * w * 3)
    return flat.reshape(h, w, 3)


def sentinel_tensor(shape: tuple[int, ...] = (1, 3, 32, 32)) -> np.ndarray:
    return np.full(shape, SENTINEL, np.float32)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value) for s in parse(text)}  # type: ignore[arg-type]


def value(m: dict, name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def scripted_governor(temps: list[float]) -> Governor:
    it = iter(temps)
    return Governor(lambda: SensorSnapshot(0.0, next(it)), Budget(soft_c=70, hard_c=80, min_dwell_s=0), actions=[])


def run_bounded(p: VisionPipeline, timeout_s: float = 30.0):
    p.start()
    assert p.join(timeout_s), "pipeline did not finish in time"
    return p.counters()


# ----------------------------------------------------------------------------------- histograms


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "bimodal"])
def test_percentiles_match_numpy_within_the_documented_error(dist: str) -> None:
    # sizes odd and not multiples of 5: q * n / 100 is never a whole number for the q below, so
    # numpy's float rank and the exact nearest rank cannot fall on different samples
    rng = np.random.default_rng(7)
    if dist == "lognormal":  # ~20 us .. ~1 s
        ns = np.exp(rng.normal(math.log(2e5), 2.0, 50_001))
    elif dist == "uniform":
        ns = rng.uniform(1e3, 5e6, 20_003)
    else:  # a fast mode and a slow tail, as a model behind a cold cache
        ns = np.concatenate([rng.normal(8e4, 5e3, 9_902), rng.normal(3e7, 1e6, 101)])
    ns = np.maximum(np.rint(ns), 101).astype(np.int64)
    h = Histogram()
    for v in ns.tolist():
        h.record_ns(v)
    assert h.count == len(ns) and h.snapshot().sum_ns == int(ns.sum())
    for q in (0, 1, 10, 50, 90, 99, 99.9, 100):
        exact = float(np.percentile(ns, q, method="inverted_cdf")) / 1e9  # nearest rank, as documented
        got = h.percentile(q)
        assert got is not None and abs(got / exact - 1) <= PERCENTILE_ERROR + 1e-12, (q, got, exact)
        if dist != "bimodal" and 1 <= q <= 99:  # smooth data: numpy's default (linear) too
            assert abs(got / (float(np.percentile(ns, q)) / 1e9) - 1) <= PERCENTILE_ERROR + 1e-3, q
    assert PERCENTILE_ERROR == pytest.approx(0.0194, abs=1e-4)


def test_a_model_stage_histogram_gives_the_same_percentiles() -> None:
    tm = T.ModelTelemetry(T.Provenance("m", "1", "f" * 64, "v", "onnxruntime", "onnxruntime", "1", "p"))
    rng = np.random.default_rng(3)
    totals = np.rint(np.exp(rng.normal(math.log(5e4), 1.0, 10_007))).astype(np.int64)  # odd, not a multiple of 5 (see above)
    for t in totals.tolist():
        tm.record(t // 10, 0, t // 2, t // 20, t)
    assert all(len(q) < T.FOLD_AT for q in tm._pending)  # the recording thread folded: memory stays bounded
    for q in (50, 99, 99.9):
        exact = float(np.percentile(totals, q, method="inverted_cdf")) / 1e9
        assert abs(tm.histograms["total"].percentile(q) / exact - 1) <= PERCENTILE_ERROR + 1e-12
        exact = float(np.percentile(totals // 2, q, method="inverted_cdf")) / 1e9
        assert abs(tm.histograms["inference"].percentile(q) / exact - 1) <= PERCENTILE_ERROR + 1e-12
    assert tm.histograms["preprocess"].count == 0 and tm.requests == 10_007
    assert tm.histograms["total"].snapshot().sum_ns == int(totals.sum())
    snap = tm.snapshot()
    assert set(snap["stages"]) == {"validate", "inference", "decode", "total"}  # no preprocessing recorded
    assert snap["stages"]["total"]["p99.9_ms"] == pytest.approx(tm.histograms["total"].percentile(99.9) * 1e3)


def test_concurrent_recording_and_reading_lose_nothing() -> None:
    tm = T.ModelTelemetry(T.Provenance("m", "1", "e" * 64, "v", "onnxruntime", "onnxruntime", "1", "p"))
    n_threads, per = 4, 6_000
    stop = threading.Event()

    def writer(seed: int) -> None:
        for k in range(per):
            tm.record(1_000, 2_000 + seed, 50_000 + k, 300, 53_300 + k)

    def reader() -> None:
        while not stop.is_set():
            tm.snapshot()
            time.sleep(0.001)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n_threads)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stop.set()
    r.join(10)
    n = n_threads * per
    assert [h.count for h in tm.histograms.values()] == [n] * 5 and tm.requests == n
    assert tm.histograms["inference"].snapshot().sum_ns == n_threads * (50_000 * per + per * (per - 1) // 2)


def test_bucket_edges() -> None:
    assert len(EDGES_NS) == 541 and EDGES_NS[0] == 100.0 and EDGES_NS[60] == 1_000.0 and EDGES_NS[-1] == 1e11
    ratios = np.array(EDGES_NS[1:]) / np.array(EDGES_NS[:-1])
    assert np.allclose(ratios, 10 ** (1 / 60), rtol=1e-12, atol=0)  # 3.9 % each
    h = Histogram()
    for v in (0, 100, 101, 1_000, 1_001, 10**11, 10**11 + 1, 10**13):
        h.record_ns(v)
    c = h.snapshot().counts
    assert c[0] == 2  # [0, 100 ns]
    assert c[1] == 1 and c[60] == 1 and c[61] == 1  # (100, 103.9], (977.2, 1000], (1000, 1039.1]
    assert c[540] == 1 and c[541] == 2  # 100 s is the last edge; above it, the overflow bucket
    # integer ns are bucketed on whole-ns edges exactly as on the real-valued ones
    from bisect import bisect_left

    for e in EDGES_NS:
        for v in (math.floor(e) - 1, math.floor(e), math.floor(e) + 1, math.ceil(e)):
            assert bisect_left(telemetry_core._EDGES_INT, v) == bisect_left(EDGES_NS, v)
    cum = h.snapshot().cumulative()
    les = [le for le, _ in cum]
    assert les[0] == 1e-6 and les[-2] == 100.0 and les[-1] == math.inf and les == sorted(les) and len(les) == 50
    assert [n for _, n in cum] == sorted(n for _, n in cum) and cum[-1][1] == 8
    assert Histogram().percentile(50) is None
    big = Histogram()
    big.record_ns(10**13)
    small = Histogram()
    small.record_ns(5)
    assert big.percentile(50) == 100.0 and small.percentile(50) == 1e-7  # bounds, as documented
    with pytest.raises(ValueError, match="percentile"):
        h.percentile(101)


# ----------------------------------------------------------------------------------- exposition


def check_histogram_families(text: str) -> dict[str, Any]:
    """Parse with prometheus_client and check every histogram: per series, buckets sorted by le,
    cumulative, ending at +Inf == _count, with a _sum. Returns the families by name."""
    fams = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
    for f in fams.values():
        if f.type != "histogram":
            continue
        series: dict[tuple, dict[str, Any]] = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            d = series.setdefault(key, {"buckets": []})
            if s.name.endswith("_bucket"):
                d["buckets"].append((float(s.labels["le"]), s.value))
            else:
                d[s.name[len(f.name) + 1 :]] = s.value
        for key, d in series.items():
            les = [le for le, _ in d["buckets"]]
            counts = [n for _, n in d["buckets"]]
            assert les == sorted(les) and les[-1] == math.inf, key
            assert counts == sorted(counts) and counts[-1] == d["count"] and d["sum"] >= 0, key
    return fams


def test_prometheus_exposition_parses_with_prometheus_client(model) -> None:
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    for _ in range(20):
        model.predict(x)
    model.predict_image(pattern_image())
    with pytest.raises(InputShapeError):
        model.predict(x[:, :2])
    reg = Registry()
    reg.add(model_samples([model, model.telemetry]))  # one model, exported once
    gov = scripted_governor([50, 75, 85])
    for _ in range(3):
        gov.step()
    reg.track(gov)
    text = reg.render()
    fams = check_histogram_families(text)
    lat = fams["edge_sdk_model_latency_seconds"]
    assert lat.type == "histogram"
    stages = {s.labels["stage"] for s in lat.samples}
    assert stages == {"validate", "preprocess", "inference", "decode", "total"}
    lab = model.provenance.labels()
    assert all(s.labels[k] == v for s in lat.samples for k, v in lab.items())
    assert fams["edge_sdk_model_requests"].type == "counter" and fams["edge_sdk_model_errors"].type == "counter"
    info = fams["edge_sdk_model_info"].samples[0].labels
    assert info == model.provenance.to_dict()
    m = values(text)
    assert value(m, "edge_sdk_model_errors_total", **lab, type="InputShapeError") >= 1
    assert value(m, "edge_sdk_model_latency_seconds_count", **lab, stage="total") == model.telemetry.histograms["total"].count
    assert value(m, "edge_sdk_governor_transitions_total", **{"from": "normal", "to": "constrained"}) == 1
    assert [s.kind for s in parse(text) if s.name.startswith("edge_sdk_model_latency_seconds")] == ["histogram"] * len(lat.samples)
    assert render_roundtrip(text) == text
    with pytest.raises(ValueError, match="kind"):
        T.Sample("edge_sdk_x", 1, kind="histogram")
    with pytest.raises(ValueError, match="le"):
        T.Sample("edge_sdk_x_bucket", 1, kind="histogram")


def render_roundtrip(text: str) -> str:
    return T.render(parse(text))


def test_the_default_registry_on_the_endpoint_has_every_model(model) -> None:
    model.predict(np.zeros((1, 3, 32, 32), np.float32))
    with MetricsServer() as srv:  # the default registry
        text = scrape(srv.url)
    fams = check_histogram_families(text)
    series = {tuple(sorted(s.labels.items())) for s in fams["edge_sdk_model_open"].samples}
    assert tuple(sorted(model.provenance.labels().items())) in series
    assert T.default_registry() is T.default_registry()
    assert any(tm is model.telemetry for tm in T.models())


def test_a_closed_models_series_stay_until_forgotten(tmp_path: Path, model) -> None:
    other = edge_sdk.load(PKG, PROFILE, variant="fp32-onnx", cache_dir=tmp_path)
    assert other.telemetry is model.telemetry  # same provenance: one set of histograms
    n_open = model.telemetry.open_instances
    other.predict(np.zeros((1, 3, 32, 32), np.float32))
    other.close()
    other.close()
    assert model.telemetry.open_instances == n_open - 1
    with pytest.raises(SessionClosedError):
        other.predict(np.zeros((1, 3, 32, 32), np.float32))
    assert model.telemetry.errors["SessionClosedError"] >= 1
    quiet = edge_sdk.load(PKG, PROFILE, variant="fp32-onnx", cache_dir=tmp_path, telemetry=False)
    before = model.telemetry.requests
    r = quiet.predict(np.zeros((1, 3, 32, 32), np.float32))
    assert quiet.telemetry is None and model.telemetry.requests == before and r.provenance == model.provenance
    quiet.close()
    tm = T.ModelTelemetry(T.Provenance("gone", "1", "0" * 64, "v", "onnxruntime", "onnxruntime", "1", "p"))
    telemetry_core._models[tm.provenance] = tm
    assert T.forget_model(tm) and not T.forget_model(tm) and tm not in T.models()


def test_serve_metrics_have_the_served_models_histograms(server) -> None:
    from edge_sdk.remote import protocol

    def infer_count(text: str) -> tuple[float, float]:
        m = values(text)
        lab = next(dict(k[1]) for k in m if k[0] == "edge_sdk_model_info" and dict(k[1])["variant"] == "int8-onnx")
        short = {k: lab[k] if k != "sha256" else lab[k][:12] for k in ("model", "version", "variant", "sha256", "backend", "profile")}
        count = value(m, "edge_sdk_model_latency_seconds_count", **short, stage="inference")
        return count, value(m, "edge_sdk_model_requests_total", **short)

    body, headers = protocol.encode_request({"image": np.zeros((1, 3, 32, 32), np.float32)})
    req = urllib.request.Request(server.url + "/v2/models/shapes-classifier/infer", data=body, headers=headers, method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    before = infer_count(scrape(server.url + "/metrics"))
    for _ in range(3):
        urllib.request.urlopen(req, timeout=10).close()
    text = scrape(server.url + "/metrics")
    assert infer_count(text) == (before[0] + 3, before[1] + 3)  # one observation per model call
    fams = check_histogram_families(text)
    assert fams["edge_sdk_model_latency_seconds"].type == "histogram" and "edge_sdk_serve_requests" in fams


# ----------------------------------------------------------------------------------- counters


def test_errors_by_type_move(model) -> None:
    before = model.telemetry.errors
    req0 = model.telemetry.requests
    with pytest.raises(InputShapeError):
        model.predict(np.zeros((1, 3, 31, 32), np.float32))
    with pytest.raises(InputDTypeError):
        model.predict(np.zeros((1, 3, 32, 32), np.float64))
    with pytest.raises(edge_sdk.errors.ImageError):
        model.predict_image(np.zeros((4, 4), np.float32))
    with pytest.raises(edge_sdk.errors.InputError, match="batch 1"):
        model.predict_batch([np.zeros((2, 3, 32, 32), np.float32)])
    after = model.telemetry.errors
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta == {**dict.fromkeys(after, 0), "InputShapeError": 1, "InputDTypeError": 1, "ImageError": 1, "InputError": 1}
    assert model.telemetry.requests == req0 + 4


def test_pipeline_drops_by_reason_move(model) -> None:
    imgs: list[Any] = [pattern_image() for _ in range(6)]
    imgs[2] = np.zeros((8, 8, 3), np.float32)  # not uint8: an invalid_frame drop
    imgs[4] = "not an image"
    reg = Registry()
    p = VisionPipeline(model, SyntheticSource(imgs, name="drops"), PipelineOptions(preprocess="worker"))
    reg.track(p)
    with pytest.raises(ValueError, match="already tracked"):
        reg.track(VisionPipeline(model, SyntheticSource([], name="drops")))
    run_bounded(p)
    m = values(reg.render())
    assert value(m, "edge_sdk_pipeline_frames_dropped_total", pipeline="drops", reason="invalid_frame") == 2
    assert value(m, "edge_sdk_pipeline_frames_processed_total", pipeline="drops") == 4
    live = VisionPipeline(model, SyntheticSource([pattern_image()] * 12, fps=200, live=True, name="live"), PipelineOptions(max_fps=20))
    reg.track(live)
    c = run_bounded(live)
    m = values(reg.render())
    assert c.dropped["rate_limit"] > 0
    assert value(m, "edge_sdk_pipeline_frames_dropped_total", pipeline="live", reason="rate_limit") == c.dropped["rate_limit"]
    del live, p
    import gc

    gc.collect()
    assert "pipeline=\"live\"" not in reg.render()  # tracked weakly: a pipeline gone is no longer exported


def test_router_offloads_by_trigger_move(model, server) -> None:
    down = remote_for(dead_url(), deadline_s=2.0)
    router = Router(model, down, RouterOptions(latency_objective_ms=0.001))
    reg = Registry()
    reg.track(router, name="edge")
    img = pattern_image()
    r = router.predict_image(img)  # no estimate yet: local
    assert r.served_by == "local"
    r = router.predict_image(img)  # objective at risk -> remote, which is down -> local
    assert r.served_by == "local" and "remote failed" in r.reason
    assert router.offloads == {"latency_objective": 1}
    assert router.requests_by_trigger == {("local", "local_first"): 1, ("local", "remote_failed"): 1}
    assert sum(down.telemetry.errors.values()) >= 1  # the remote model counted its failure too
    assert down.telemetry.stages[2] == "remote"
    gov = scripted_governor([90.0] * 5)
    gov.step()
    assert gov.state is GovernorState.CRITICAL
    hot = Router(model, remote_for(server.url), governor=gov)
    reg.track(hot, name="hot")
    r = hot.predict_image(img)
    assert (r.served_by, r.result.provenance.backend) == ("remote", "remote")
    hot.set_offload(True)
    hot.predict_image(img)
    assert hot.remote.telemetry.histograms["remote"].count >= 2  # a remote model's inference stage is the remote call
    m = values(reg.render())
    assert value(m, "edge_sdk_router_offloads_total", router="edge", trigger="latency_objective") == 1
    assert value(m, "edge_sdk_router_requests_total", router="edge", served_by="local", trigger="remote_failed") == 1
    assert value(m, "edge_sdk_router_offloads_total", router="hot", trigger="governor_critical") == 1
    assert value(m, "edge_sdk_router_offloads_total", router="hot", trigger="forced") == 1
    assert value(m, "edge_sdk_router_requests_total", router="hot", served_by="remote", trigger="forced") == 1


def test_governor_transitions_move() -> None:
    gov = scripted_governor([50, 75, 85, 85, 60, 60, 60, 60])
    reg = Registry()
    reg.track(gov)
    for _ in range(8):
        gov.step()
    m = values(reg.render())
    tr = {(f, t): value(m, "edge_sdk_governor_transitions_total", **{"from": f, "to": t}) for f in ("normal", "constrained", "critical")
          for t in ("normal", "constrained", "critical")}  # fmt: skip
    assert tr[("normal", "constrained")] == 1 and tr[("constrained", "critical")] == 1
    assert tr[("critical", "constrained")] == 1 and tr[("constrained", "normal")] == 1
    assert sum(tr.values()) == 4 == value(m, "edge_sdk_governor_events_total", kind="transition")
    with pytest.raises(ValueError, match="already tracked"):
        reg.track(scripted_governor([50]))


# ----------------------------------------------------------------------------------- events


def test_events_to_a_file_and_a_callback(tmp_path: Path, model) -> None:
    got: list[dict] = []
    path = tmp_path / "events.jsonl"
    with EventLog(path, callback=got.append) as log:
        gov = scripted_governor([50, 85, 85])
        log.watch(gov)
        router = Router(model, remote_for(dead_url(), deadline_s=2.0), RouterOptions(latency_objective_ms=0.001))
        log.watch(router, name="edge")
        p = VisionPipeline(model, SyntheticSource([pattern_image(), np.zeros((4, 4, 3), np.float32)], name="cam"))
        log.watch(p)
        log.watch(model)
        gov.step()
        gov.step()
        router.predict_image(pattern_image())
        router.predict_image(pattern_image())
        run_bounded(p)
        with pytest.raises(InputShapeError):
            model.predict(np.zeros((1, 1), np.float32))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == got and len(lines) == log.events
    by = {(e["source"], e["kind"]) for e in lines}
    assert {("governor", "transition"), ("router", "fallback"), ("pipeline", "drop"), ("model", "error")} <= by
    prov = model.provenance.to_dict()
    for e in lines:
        assert e["time"].endswith("Z") and abs(e["unix_s"] - time.time()) < 120
        if e["source"] == "governor":
            assert prov in e["models"]  # the models open when it happened
        else:
            assert e["provenance"] == prov
    fb = next(e for e in lines if e["kind"] == "fallback")
    assert fb["router"] == "edge" and fb["decision"] == "latency_objective" and fb["trigger"] == "remote_failed" and fb["error"]
    drop = next(e for e in lines if e["kind"] == "drop")
    assert (drop["pipeline"], drop["reason"], drop["frame"]) == ("cam", "invalid_frame", 1)
    err = next(e for e in lines if e["source"] == "model")
    assert err["error"] == "InputShapeError" and err["call"] == "predict" and "expected rank" in err["message"]
    n = len(lines)
    gov.step()
    with pytest.raises(InputShapeError):
        model.predict(np.zeros((1, 1), np.float32))
    assert len(path.read_text().splitlines()) == n  # closed: detached from everything


def test_watch_models_and_a_failing_callback(tmp_path: Path, model) -> None:
    def broken(rec: dict) -> None:
        raise RuntimeError("observer bug")

    with EventLog(callback=broken) as log:
        log.watch_models()
        with pytest.raises(InputShapeError):
            model.predict(np.zeros((1, 1), np.float32))  # the event is counted, the failure is not the caller's
        assert log.events == 1 and log.write_errors == 1
    with pytest.raises(ValueError, match="path, a callback"):
        EventLog()
    with pytest.raises(TypeError, match="Governor, Router"):
        EventLog(callback=print).watch(object())


# ----------------------------------------------------------------------------------- provenance


def test_provenance_on_results_records_and_describe(tmp_path: Path, model) -> None:
    r1 = model.predict(np.zeros((1, 3, 32, 32), np.float32))
    r2 = model.predict_image(pattern_image())
    p = r1.provenance
    assert p is r2.provenance is model.provenance  # one shared immutable object
    info = model.session.info
    assert (p.model, p.version, p.variant, p.sha256) == (model.manifest.name, model.manifest.version, "fp32-onnx", model.variant.sha256)
    assert (p.backend, p.runtime, p.runtime_version, p.profile, p.sdk_version) == (
        info.backend, info.runtime, info.runtime_version, PROFILE, edge_sdk.__version__,
    )  # fmt: skip
    with pytest.raises(AttributeError):
        p.model = "x"  # type: ignore[misc]
    assert r1.to_dict()["provenance"] == p.to_dict() == model.describe()["provenance"]
    bare = Result({}, None, Timings(0, 0, 0, 0, 0), "v", "b", "m", "1", "s", 1, None)  # positional, as before
    assert bare.provenance is None and "provenance" not in bare.to_dict()
    out = tmp_path / "results.jsonl"
    with JsonLinesSink(out) as sink:
        run_bounded(VisionPipeline(model, SyntheticSource([pattern_image()] * 2), sinks=[sink]))
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 and all(r["provenance"] == p.to_dict() and r["version"] == p.version and r["sha256"] == p.sha256 for r in recs)

    class Bare:  # a duck-typed result without provenance still makes a record
        decoded, outputs, model_name = None, {}, "m"

    frame = type("F", (), {"source_timestamp_ms": None})()
    fr = type("FR", (), {"index": 0, "timestamp_ms": 1.0, "latency_ms": 1.0, "result": Bare(), "frame": frame})()
    assert frame_result_record(fr)["provenance"] is None  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------- no input data


def test_no_input_data_reaches_any_telemetry_output(tmp_path: Path, model, server) -> None:
    got: list[dict] = []
    path = tmp_path / "events.jsonl"
    sentinel = sentinel_tensor()
    img = pattern_image()
    bad_frame = np.full((16, 16, 3), SENTINEL, np.float32)  # an invalid frame full of the sentinel
    with EventLog(path, callback=got.append) as log:
        log.watch_models()
        gov = scripted_governor([50, 85])
        log.watch(gov)
        # predict: a good call and failing ones, all carrying the sentinel
        model.predict(sentinel)
        for bad in (sentinel_tensor((1, 3, 32, 31)), np.full((1, 3, 32, 32), np.nan, np.float32), sentinel.astype(np.float64)):
            with pytest.raises(edge_sdk.errors.InputError):
                model.predict(bad)
        model.predict_image(img)
        # a pipeline with the JSON-lines event sink (drops included)
        p = VisionPipeline(model, SyntheticSource([img, bad_frame, img], name="cam"))
        log.watch(p)
        run_bounded(p)
        # the router: remote down (fallback), then remote up (forced offload)
        router = Router(model, remote_for(dead_url(), deadline_s=2.0), RouterOptions(latency_objective_ms=0.001))
        log.watch(router)
        router.predict(sentinel)
        router.predict(sentinel)
        up = Router(model, remote_for(server.url))
        log.watch(up, name="up")
        up.set_offload(True)
        assert up.predict(sentinel).served_by == "remote"
        assert up.predict_image(img).served_by == "remote"
        gov.step()
        gov.step()
    # the serve endpoint, straight over HTTP
    from edge_sdk.remote import protocol

    body, headers = protocol.encode_request({"image": sentinel})  # JSON: the sentinel travels as text
    assert SENTINEL_TEXT.encode() in body
    req = urllib.request.Request(server.url + "/v2/models/shapes-classifier/infer", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    serve_metrics = scrape(server.url + "/metrics")
    assert 'stage="inference"' in serve_metrics  # the served model's histograms are on serve's /metrics
    outputs = {
        "default registry": T.default_registry().render(),
        "serve /metrics": serve_metrics,
        "event file": path.read_text(),
        "event callback": json.dumps(got),
        "registry snapshot": json.dumps(T.default_registry().snapshot()),
        "model snapshots": json.dumps([tm.snapshot() for tm in T.models()]),
    }
    assert {e["source"] for e in got} == {"model", "pipeline", "router", "governor"}
    pattern_texts = [", ".join(map(str, PATTERN[:4])), ",".join(map(str, PATTERN[:4]))]
    raw = np.float32(SENTINEL).tobytes()
    for where, text in outputs.items():
        assert SENTINEL_TEXT not in text, where
        for pt in pattern_texts:
            assert pt not in text, (where, pt)
        assert raw not in text.encode("latin-1", "replace"), where
    assert path.read_bytes().find(raw) == -1


def test_any_object_with_the_protocol_methods_is_tracked_and_watched_others_are_refused() -> None:
    """Registry.track and EventLog.watch ask the object (Trackable / EventSource), so a subsystem the
    telemetry package has never heard of plugs in by implementing the methods."""
    from edge_sdk.telemetry import EventSource, Sample, Trackable

    class Engine:  # a stand-in for a new subsystem: not a class telemetry/ imports
        def __init__(self) -> None:
            self.listeners: list[Any] = []

        def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
            return "engine", name or "engine"

        def telemetry_samples(self, label: str) -> list[Sample]:
            return [Sample("edge_sdk_engine_tokens_total", 7, "tokens", "counter", {"engine": label})]

        def watch_events(self, emit: Any, *, name: str | None = None, models: Any = None) -> Any:
            self.listeners.append(lambda kind: emit("engine", kind, engine=name or "engine"))
            return self.listeners.clear

    eng = Engine()
    assert isinstance(eng, Trackable) and isinstance(eng, EventSource)
    reg = Registry()
    reg.track(eng, name="llm")
    assert 'edge_sdk_engine_tokens_total{engine="llm"} 7' in reg.render()
    with pytest.raises(ValueError, match="already tracked"):
        reg.track(Engine(), name="llm")
    got: list[dict[str, Any]] = []
    log = EventLog(callback=got.append)
    detach = log.watch(eng, name="llm")
    eng.listeners[0]("paced")
    assert [(e["source"], e["kind"], e["engine"]) for e in got] == [("engine", "paced", "llm")]
    detach()
    assert eng.listeners == []
    for bad in (object(), "governor", 3):
        with pytest.raises(TypeError, match="track: expected"):
            reg.track(bad)
        with pytest.raises(TypeError, match="watch: expected"):
            log.watch(bad)
    log.close()
