"""``edge-sdk serve``: a real uvicorn server on 127.0.0.1 with the real demo package (the shapes
classifier: fp32-onnx, int8-onnx and fp32-tflite variants) and small MLP packages with a dynamic
(or fixed) batch dim. Every wait is bounded; every socket is local."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import ROOT, mlp_manifest, mlp_onnx  # noqa: E402

import edge_sdk  # noqa: E402
from edge_sdk.model import Model  # noqa: E402
from edge_sdk.remote import protocol  # noqa: E402
from edge_sdk.serve import ServeError, ServeOptions, Server  # noqa: E402
from edge_sdk.serve.batching import Job, ModelWorker, stack_key  # noqa: E402
from edge_sdk.telemetry import parse  # noqa: E402

DEMO = "shapes-classifier"


# ----------------------------------------------------------------------------------- helpers


def call(
    method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None, *, context: ssl.SSLContext | None = None,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """One HTTP request with the standard library: (status, lower-cased headers, body)."""
    u = urlsplit(url)
    if u.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(u.hostname, u.port, context=context, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=body, headers=dict(headers or {}))
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def infer(url: str, model: str, inputs: Mapping[str, np.ndarray], **kw: Any) -> tuple[int, dict[str, str], bytes]:
    headers_extra = kw.pop("headers", {})
    body, headers = protocol.encode_request(inputs, **kw)
    return call("POST", f"{url}/v2/models/{model}/infer", body, {**headers, **headers_extra})


def decoded(status: int, headers: Mapping[str, str], body: bytes) -> protocol.InferResponse:
    assert status == 200, body
    return protocol.decode_response(body, headers)


def error_of(status: int, body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) == {"error"} and isinstance(doc["error"], str), doc
    return doc["error"]


def metrics(url: str, headers: Mapping[str, str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, _, body = call("GET", url + "/metrics", headers=headers)
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value) for s in parse(body.decode())}  # type: ignore[arg-type]


def metric(m: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_until(cond: Any, timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


class WrappedSession:
    """A real session behind a wrapper that counts calls and their rows and, with ``gated``, holds
    each call until :attr:`gate` is set (at most 10 s, so a failing test cannot hang)."""

    def __init__(self, inner: Any, *, gated: bool = False, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.gated = gated
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.rows: list[int] = []
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.rows.append(int(next(iter(feeds.values())).shape[0]))
        self.entered.set()
        if self.gated and not self.gate.wait(10):
            raise TimeoutError("the test never opened the gate")
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.inner.run(feeds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def wrapped(model: Model, **kw: Any) -> tuple[Model, WrappedSession]:
    """The same loaded model with its session behind a :class:`WrappedSession`."""
    s = WrappedSession(model.session, **kw)
    return Model(model.package, model.variant, s, model.selection, model.detection, model.options), s  # type: ignore[arg-type]


def two_output_onnx(n_in: int = 8, n_out: int = 4) -> bytes:
    """x[batch, n_in] -> h = x @ w (output), y = relu(h + b) (output)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", n_out]) for n in ("h", "y")],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def image(model: Model, rows: int = 1, seed: int = 0) -> np.ndarray:
    shape = (rows,) + tuple(model.inputs[0].shape[1:])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-cache")


@pytest.fixture(scope="module")
def demo_models(cache: Path) -> dict[str, Model]:
    """The three demo variants, loaded once for the module."""
    pkg = edge_sdk.demo_package_path()
    models = {v: edge_sdk.load(pkg, variant=v, cache_dir=cache, measure_backends=False) for v in ("fp32-onnx", "int8-onnx", "fp32-tflite")}
    yield models
    for m in models.values():
        m.close()


@pytest.fixture(scope="module")
def two_output_model(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Model:
    from converters.packaging import write_package

    root = tmp_path_factory.mktemp("two") / "two"
    man = mlp_manifest(name="two-out", outputs=[{"name": n, "dtype": "float32", "shape": ["batch", 4]} for n in ("h", "y")])
    write_package(root, man, {"m.onnx": two_output_onnx()})
    m = edge_sdk.load(root, cache_dir=cache)
    yield m
    m.close()


@pytest.fixture(scope="module")
def server(demo_models: dict[str, Model], two_output_model: Model) -> Server:
    """Demo fp32-onnx under its manifest name, the other variants under their own names, and a
    model with two outputs."""
    models = {DEMO: demo_models["fp32-onnx"], "shapes-int8": demo_models["int8-onnx"], "shapes-tflite": demo_models["fp32-tflite"],
              "two-out": two_output_model}  # fmt: skip
    srv = Server(models, ServeOptions(max_queue_delay_ms=1)).start()
    yield srv
    assert srv.stop(10)


# ----------------------------------------------------------------------------------- endpoints


def test_health_and_server_metadata(server: Server) -> None:
    assert server.url.startswith("http://127.0.0.1:") and server.port > 0
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = call("GET", server.url + path)
        assert (status, body) == (200, b"")
    status, headers, body = call("GET", server.url + "/v2")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert json.loads(body) == {"name": "edge-sdk", "version": edge_sdk.__version__, "extensions": ["binary_tensor_data"]}


def test_model_metadata_and_ready(server: Server, demo_models: dict[str, Model]) -> None:
    version = demo_models["fp32-onnx"].manifest.version
    for path in (f"/v2/models/{DEMO}", f"/v2/models/{DEMO}/versions/{version}"):
        status, _, body = call("GET", server.url + path)
        assert status == 200
        assert json.loads(body) == {
            "name": DEMO,
            "versions": [version],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}],
        }
        assert call("GET", server.url + path + "/ready")[:3:2] == (200, b"")
    meta = json.loads(call("GET", server.url + "/v2/models/shapes-tflite")[2])
    assert meta["platform"] == "tensorflow_lite" and meta["inputs"][0]["shape"] == [-1, 32, 32, 3]
    for path in ("/v2/models/nope", "/v2/models/nope/ready", f"/v2/models/{DEMO}/versions/9.9", f"/v2/models/{DEMO}/versions/9.9/ready"):
        status, _, body = call("GET", server.url + path)
        assert status == 404, path
        assert "nope" in error_of(status, body) or "9.9" in error_of(status, body)
    status, _, body = call("GET", server.url + "/v3/whatever")
    assert status == 404 and error_of(status, body)
    status, _, body = call("GET", server.url + f"/v2/models/{DEMO}/infer")
    assert status == 405 and error_of(status, body)


@pytest.mark.parametrize("variant,name", [("fp32-onnx", DEMO), ("int8-onnx", "shapes-int8"), ("fp32-tflite", "shapes-tflite")])
@pytest.mark.parametrize("binary_inputs,binary_outputs", [(False, False), (True, True), (True, False), (False, True)])
def test_infer_matches_predict(
    server: Server, demo_models: dict[str, Model], variant: str, name: str, binary_inputs: bool, binary_outputs: bool
) -> None:
    model = demo_models[variant]
    x = image(model, rows=3, seed=7)
    kw = {"binary_inputs": binary_inputs, "binary_outputs": binary_outputs, "request_id": "r1"}
    status, headers, body = infer(server.url, name, {"image": x}, **kw)
    r = decoded(status, headers, body)
    assert (r.model_name, r.model_version, r.id) == (name, model.manifest.version, "r1")
    assert (protocol.HEADER_LENGTH.lower() in headers) == binary_outputs
    np.testing.assert_array_equal(r.outputs["logits"], model.predict(x).outputs["logits"])


def test_infer_with_version_no_content_type_and_gzip(server: Server, demo_models: dict[str, Model]) -> None:
    model = demo_models["fp32-onnx"]
    x = image(model, seed=3)
    want = model.predict(x).outputs["logits"]
    body, headers = protocol.encode_request({"image": x})
    headers.pop("Content-Type")  # tritonclient sends JSON without one
    url = f"{server.url}/v2/models/{DEMO}/versions/{model.manifest.version}/infer"
    np.testing.assert_array_equal(decoded(*call("POST", url, body, headers)).outputs["logits"], want)
    status, h, b = call("POST", url, gzip.compress(body), {**headers, "Content-Encoding": "gzip"})
    np.testing.assert_array_equal(decoded(status, h, b).outputs["logits"], want)
    status, _, b = call("POST", url, body, {**headers, "Content-Encoding": "br"})
    assert status == 415 and "gzip" in error_of(status, b)
    status, _, b = call("POST", f"{server.url}/v2/models/{DEMO}/versions/0.0.1/infer", body, headers)
    assert status == 404 and "0.0.1" in error_of(status, b)


def test_outputs_selection_and_mixed_binary(server: Server, two_output_model: Model) -> None:
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    want = two_output_model.predict(x).outputs
    r = decoded(*infer(server.url, "two-out", {"x": x}, outputs=["y"]))
    assert list(r.outputs) == ["y"]
    np.testing.assert_array_equal(r.outputs["y"], want["y"])
    r = decoded(*infer(server.url, "two-out", {"x": x}))
    assert list(r.outputs) == ["h", "y"]
    # h in binary, y in JSON, in the order asked
    doc = {"inputs": [protocol.tensor_to_json("x", x)], "outputs": [{"name": "y"}, {"name": "h", "parameters": {"binary_data": True}}]}
    status, headers, body = call("POST", f"{server.url}/v2/models/two-out/infer", json.dumps(doc).encode())
    assert status == 200 and int(headers[protocol.HEADER_LENGTH.lower()]) < len(body)
    head = json.loads(body[: int(headers[protocol.HEADER_LENGTH.lower()])])
    assert [o["name"] for o in head["outputs"]] == ["y", "h"] and "data" in head["outputs"][0] and "data" not in head["outputs"][1]
    r = protocol.decode_response(body, headers)
    for k in ("h", "y"):
        np.testing.assert_array_equal(r.outputs[k], want[k])
    status, _, body = infer(server.url, "two-out", {"x": x}, outputs=["z"])
    assert status == 400 and "['h', 'y']" in error_of(status, body)


def test_bad_requests_are_400_naming_what_was_expected(server: Server, demo_models: dict[str, Model]) -> None:
    model = demo_models["fp32-onnx"]
    x = image(model)
    cases = [
        ({"image": x.astype(np.float64)}, "float32"),  # never cast silently
        ({"image": image(model)[:, :2]}, "[batch:1..16, 3, 32, 32]"),
        ({"image": image(model, rows=17)}, "[1, 16]"),
        ({"img": x}, "image"),
        ({"image": x, "extra": x}, "extra"),
    ]
    for inputs, expected in cases:
        status, _, body = infer(server.url, DEMO, inputs)
        assert status == 400, expected
        assert expected in error_of(status, body)
    bad = x.copy()
    bad[0, 0, 0, 0] = np.nan
    status, _, body = infer(server.url, DEMO, {"image": bad})
    assert status == 400 and "finite" in error_of(status, body)
    url = f"{server.url}/v2/models/{DEMO}/infer"
    for raw, expected in [
        (b"{not json", "does not parse"),
        (b'{"inputs": [{"name": "image", "shape": [1, 2], "datatype": "FP32", "data": [1.0]}]}', "needs 2 elements"),
        (b'{"inputs": [{"name": "image", "shape": [1], "datatype": "FLOAT", "data": [1.0]}]}', "FP32"),
        (b'{"outputs": []}', "inputs"),
    ]:
        status, _, body = call("POST", url, raw)
        assert status == 400 and expected in error_of(status, body), (raw, body)
    status, _, body = infer(server.url, "nope", {"image": x})
    assert status == 404 and "nope" in error_of(status, body)


def test_metrics_count_requests(server: Server, demo_models: dict[str, Model]) -> None:
    x = image(demo_models["fp32-onnx"], rows=2)
    before = metrics(server.url)
    for _ in range(2):
        assert infer(server.url, DEMO, {"image": x})[0] == 200
    assert infer(server.url, DEMO, {"image": x.astype(np.float64)})[0] == 400
    assert infer(server.url, "nope", {"image": x})[0] == 404
    after = metrics(server.url)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("edge_sdk_serve_requests_total", model=DEMO, code="200") == 2
    assert delta("edge_sdk_serve_requests_total", model=DEMO, code="400") == 1
    assert delta("edge_sdk_serve_requests_total", model="(unknown)", code="404") == 1
    assert delta("edge_sdk_serve_request_success_total", model=DEMO) == 2
    assert delta("edge_sdk_serve_request_failure_total", model=DEMO) == 1
    assert delta("edge_sdk_serve_inference_count_total", model=DEMO) == 4
    assert delta("edge_sdk_serve_batch_size_sum", model=DEMO) == 4
    assert delta("edge_sdk_serve_batch_size_count", model=DEMO) == delta("edge_sdk_serve_execution_count_total", model=DEMO) == 2
    assert delta("edge_sdk_serve_request_duration_seconds_count", model=DEMO) == 2
    assert delta("edge_sdk_serve_request_duration_seconds_sum", model=DEMO) > 0
    assert metric(after, "edge_sdk_serve_queue_depth", model=DEMO) == 0
    assert metric(after, "edge_sdk_serve_queue_capacity", model=DEMO) == 64
    assert metric(after, "edge_sdk_serve_model_ready", model="shapes-tflite") == 1


# ----------------------------------------------------------------------------------- batching, queueing, timeouts


@pytest.fixture
def mlp_models(tmp_path: Path, cache: Path) -> tuple[Model, Model]:
    """An MLP with a dynamic batch dim (1..8) and one with a fixed batch of 1."""
    from converters.packaging import write_package

    write_package(tmp_path / "dyn", mlp_manifest(), {"m.onnx": mlp_onnx()})
    fixed = mlp_manifest(name="mlp-fixed", inputs=[{"name": "x", "dtype": "float32", "shape": [1, 8]}],
                         outputs=[{"name": "y", "dtype": "float32", "shape": [1, 4]}])  # fmt: skip
    write_package(tmp_path / "fixed", fixed, {"m.onnx": mlp_onnx(batch=1)})
    dyn_m, fixed_m = edge_sdk.load(tmp_path / "dyn", cache_dir=cache), edge_sdk.load(tmp_path / "fixed", cache_dir=cache)
    yield dyn_m, fixed_m
    dyn_m.close()
    fixed_m.close()


def test_dynamic_batching_batches_concurrent_requests(mlp_models: tuple[Model, Model]) -> None:
    dyn, fixed = mlp_models
    assert dyn._max_batch() == 8 and fixed._max_batch() == 1
    served_dyn, dyn_calls = wrapped(dyn, delay_s=0.005)
    served_fixed, fixed_calls = wrapped(fixed)
    rng = np.random.default_rng(5)
    rows = [2 if i % 4 == 0 else 1 for i in range(16)]  # some requests carry several rows
    xs = [rng.standard_normal((r, 8)).astype(np.float32) for r in rows]
    fx = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(4)]
    with Server({"mlp": served_dyn, "mlp-fixed": served_fixed}, ServeOptions(max_queue_delay_ms=30)) as srv:
        meta = json.loads(call("GET", srv.url + "/v2/models/mlp-fixed")[2])
        assert meta["inputs"][0]["shape"] == [1, 8]
        barrier = threading.Barrier(20, timeout=10)

        def send(model: str, x: np.ndarray, binary: bool) -> np.ndarray:
            barrier.wait()
            return decoded(*infer(srv.url, model, {"x": x}, binary_inputs=binary, binary_outputs=binary)).outputs["y"]

        with ThreadPoolExecutor(20) as pool:
            futs = [pool.submit(send, "mlp", x, i % 2 == 0) for i, x in enumerate(xs)]
            futs += [pool.submit(send, "mlp-fixed", x, False) for x in fx]
            got = [f.result(timeout=30) for f in futs]
        m = metrics(srv.url)
    want = [dyn.predict(x).outputs["y"] for x in xs] + [fixed.predict(x).outputs["y"] for x in fx]
    for x, y, w in zip(xs + fx, got, want):  # each request gets its own rows back, in its order
        assert y.shape == (x.shape[0], 4)
        np.testing.assert_allclose(y, w, rtol=1e-5, atol=1e-6)
    assert sum(dyn_calls.rows) == sum(rows) == 20
    assert len(dyn_calls.rows) < len(xs), dyn_calls.rows  # fewer model calls than requests
    assert max(dyn_calls.rows) > 1 and max(dyn_calls.rows) <= 8
    assert fixed_calls.rows == [1, 1, 1, 1]  # a fixed batch runs one request at a time
    assert metric(m, "edge_sdk_serve_execution_count_total", model="mlp") == len(dyn_calls.rows)
    assert metric(m, "edge_sdk_serve_inference_count_total", model="mlp") == 20
    assert metric(m, "edge_sdk_serve_max_batch_size", model="mlp") == 8
    assert metric(m, "edge_sdk_serve_max_batch_size", model="mlp-fixed") == 1


def test_worker_keeps_order_stacks_only_what_fits() -> None:
    """Requests stack while they match the first (same trailing dims) and fit; the rest start the
    next batch, in arrival order; each gets its own rows back."""
    calls: list[list[int]] = []
    gate = threading.Event()

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = feeds["x"]
        calls.append(list(x[:, 0].astype(int)))
        if len(calls) == 1 and not gate.wait(10):
            raise TimeoutError("gate")
        return {"y": x * 2}

    w = ModelWorker("t", run, max_batch=4, max_delay_s=0.05, queue_size=8)
    w.start()
    try:

        def job(first: int, rows: int, width: int = 3) -> Job:
            x = np.zeros((rows, width), np.float32)
            x[:, 0] = np.arange(first, first + rows)
            feeds = {"x": x}
            return Job(feeds, rows, stack_key(feeds))

        jobs = [job(0, 1)]
        futs = [w.submit(jobs[0])]
        wait_until(lambda: len(calls) == 1, what="the first call")
        jobs += [job(1, 2), job(3, 1), job(4, 2, width=5), job(6, 3), job(9, 2)]
        futs += [w.submit(j) for j in jobs[1:]]
        assert w.depth == 5
        gate.set()
        results = [f.result(timeout=10) for f in futs]
    finally:
        assert w.stop(5)
    assert calls == [[0], [1, 2, 3], [4, 5], [6, 7, 8], [9, 10]]
    for j, r in zip(jobs, results):
        np.testing.assert_array_equal(r["y"], j.feeds["x"] * 2)


def test_queue_full_is_503_with_retry_after_and_health_stays_up(demo_models: dict[str, Model]) -> None:
    model = demo_models["fp32-onnx"]
    gated, s = wrapped(model, gated=True)
    x = image(model)
    with Server([gated], ServeOptions(queue_size=2, max_batch_size=1, timeout_s=20)) as srv, ThreadPoolExecutor(3) as pool:
        try:
            first = pool.submit(infer, srv.url, DEMO, {"image": x})
            assert s.entered.wait(5), "the model was never called"
            waiting = [pool.submit(infer, srv.url, DEMO, {"image": x}) for _ in range(2)]
            wait_until(lambda: metric(metrics(srv.url), "edge_sdk_serve_queue_depth", model=DEMO) == 2, what="2 queued requests")
            t = time.perf_counter()
            assert call("GET", srv.url + "/v2/health/ready")[0] == 200  # the event loop is free while the model is busy
            assert call("GET", srv.url + f"/v2/models/{DEMO}")[0] == 200
            assert time.perf_counter() - t < 2
            status, headers, body = infer(srv.url, DEMO, {"image": x})
            assert status == 503 and "queue size 2" in error_of(status, body)
            assert int(headers["retry-after"]) >= 1
        finally:
            s.gate.set()
        for f in [first, *waiting]:
            np.testing.assert_array_equal(decoded(*f.result(timeout=10)).outputs["logits"], model.predict(x).outputs["logits"])
        m = metrics(srv.url)
        assert metric(m, "edge_sdk_serve_requests_total", model=DEMO, code="503") == 1
        assert metric(m, "edge_sdk_serve_requests_total", model=DEMO, code="200") == 3


def test_timeout_is_504_and_drops_the_request(demo_models: dict[str, Model]) -> None:
    model = demo_models["fp32-onnx"]
    gated, s = wrapped(model, gated=True)
    x = image(model)
    with Server([gated], ServeOptions(timeout_s=0.3, max_batch_size=1)) as srv, ThreadPoolExecutor(2) as pool:
        try:
            t = time.perf_counter()
            futs = [pool.submit(infer, srv.url, DEMO, {"image": x}) for _ in range(2)]  # one runs (held), one waits
            for f in futs:
                status, _, body = f.result(timeout=10)
                assert status == 504 and "timeout" in error_of(status, body)
            assert time.perf_counter() - t < 5
            assert metric(metrics(srv.url), "edge_sdk_serve_queue_depth", model=DEMO) == 0  # the waiting one was dropped
        finally:
            s.gate.set()
        r = decoded(*infer(srv.url, DEMO, {"image": x}))  # the server goes on
        np.testing.assert_array_equal(r.outputs["logits"], model.predict(x).outputs["logits"])
    assert len(s.rows) == 2  # the dropped request never ran


def test_body_limit_is_413(demo_models: dict[str, Model]) -> None:
    model = demo_models["fp32-onnx"]
    with Server([model], ServeOptions(max_body_bytes=4096)) as srv:
        status, _, body = infer(srv.url, DEMO, {"image": image(model)}, binary_inputs=True)
        assert status == 413 and "4096" in error_of(status, body)
        big = gzip.compress(b" " * 10_000 + b"{}")
        status, _, body = call("POST", f"{srv.url}/v2/models/{DEMO}/infer", big, {"Content-Encoding": "gzip"})
        assert status == 413 and "4096" in error_of(status, body)


# ----------------------------------------------------------------------------------- auth, TLS


def test_bearer_auth_and_the_token_is_never_logged(demo_models: dict[str, Model], caplog: pytest.LogCaptureFixture) -> None:
    token, wrong = "s3cret-Token_42", "not-the-token-99"
    opts = ServeOptions(token=token)
    assert token not in repr(opts)
    model = demo_models["fp32-onnx"]
    x = image(model)
    caplog.set_level(logging.DEBUG)
    with Server([model], opts, access_log=True) as srv:
        for path in ("/v2/health/live", "/v2/health/ready"):  # open: probes need no secret
            assert call("GET", srv.url + path)[0] == 200
        for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Basic {token}"}, {"Authorization": "Bearer"}):
            for method, path in (("GET", "/v2"), ("GET", f"/v2/models/{DEMO}"), ("GET", "/metrics")):
                status, h, body = call(method, srv.url + path, headers=headers)
                assert status == 401 and h["www-authenticate"].startswith("Bearer") and error_of(status, body), (headers, path)
            status, h, body = infer(srv.url, DEMO, {"image": x}, headers=headers)
            assert status == 401
        good = {"Authorization": f"Bearer {token}"}
        assert call("GET", srv.url + "/v2", headers=good)[0] == 200
        assert metric(metrics(srv.url, good), "edge_sdk_serve_queue_depth", model=DEMO) == 0
        r = decoded(*infer(srv.url, DEMO, {"image": x}, headers={"authorization": f"bearer {token}"}))
        np.testing.assert_array_equal(r.outputs["logits"], model.predict(x).outputs["logits"])
    assert any("GET /v2" in rec.getMessage() or "/v2" in str(rec.args) for rec in caplog.records), "the access log was not captured"
    assert token not in caplog.text and wrong not in caplog.text


def test_tls_with_a_trusted_ca(tmp_path: Path, demo_models: dict[str, Model]) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    model = demo_models["fp32-onnx"]
    x = image(model)
    with Server([model], tls_cert=cert_file, tls_key=key_file) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        assert call("GET", srv.url + "/v2/health/ready", context=ctx)[0] == 200
        body, headers = protocol.encode_request({"image": x}, binary_inputs=True, binary_outputs=True)
        r = decoded(*call("POST", f"{srv.url}/v2/models/{DEMO}/infer", body, headers, context=ctx))
        np.testing.assert_array_equal(r.outputs["logits"], model.predict(x).outputs["logits"])
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the CA refuses the server
            call("GET", srv.url + "/v2/health/ready", context=ssl.create_default_context())
    with pytest.raises(ValueError, match="both or neither"):
        Server([model], tls_cert=cert_file)
    with pytest.raises(ServeError, match="cannot start"):
        Server([model], tls_cert=key_file, tls_key=cert_file).start()


def test_start_errors_and_options(demo_models: dict[str, Model]) -> None:
    model = demo_models["fp32-onnx"]
    with Server([model]) as srv:
        with pytest.raises(ServeError, match="cannot listen"):
            Server([model], port=srv.port).start()
    with pytest.raises(ValueError, match="two models are named"):
        Server([model, model])
    for bad in ({"queue_size": 0}, {"timeout_s": 0}, {"max_batch_size": 0}, {"max_queue_delay_ms": -1}, {"token": "a b"}, {"token": ""}):
        with pytest.raises(ValueError):
            ServeOptions(**bad)


# ----------------------------------------------------------------------------------- CLI


def test_cli_serve_subprocess(tmp_path: Path) -> None:
    token = "cli-token-7Q"
    env = dict(os.environ, EDGE_SDK_CACHE=str(tmp_path / "cache"), SERVE_TEST_TOKEN=token, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "edge_sdk.cli", "serve", str(edge_sdk.demo_package_path()), "--port", "0", "--variant", "fp32-onnx",
           "--no-measure", "--token-env", "SERVE_TEST_TOKEN", "--access-log"]  # fmt: skip
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in p.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and p.poll() is None:
            try:
                m = re.search(r"listening on (https?://\S+)", lines.get(timeout=0.5))
            except queue.Empty:
                continue
            url = m.group(1) if m else None
        assert url is not None, f"no URL printed (rc={p.poll()})"
        assert call("GET", url + "/v2/health/ready")[0] == 200
        assert call("GET", url + "/v2")[0] == 401
        status, _, body = call("GET", url + f"/v2/models/{DEMO}", headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and json.loads(body)["name"] == DEMO
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
            raise
        reader.join(5)
        err = p.stderr.read()  # type: ignore[union-attr]
    assert rc == 0, err
    assert "GET /v2" in err  # the access log ran ...
    assert token not in err  # ... and never wrote the token


def test_the_listening_socket_is_tcp_so_accepted_connections_get_nodelay(server: Server) -> None:
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP (accepted sockets inherit
    # it); a proto-0 socket left Nagle on and kept every small keep-alive response ~40 ms.
    import socket

    assert server._sock is not None and server._sock.proto == socket.IPPROTO_TCP
