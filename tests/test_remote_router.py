"""The router, end to end: the real demo model locally, `edge-sdk serve` on 127.0.0.1 with the same
package as the remote, the real v2 client between them. Every result says where it was served and
why; remote down, breaker open or privacy refusal -> local keeps serving; nothing hangs."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import edge_sdk
from edge_sdk.budget.governor import Budget, Governor, GovernorState, Offload
from edge_sdk.budget.types import SensorSnapshot
from edge_sdk.errors import InputError, SessionClosedError
from edge_sdk.remote.client import RemoteClient
from edge_sdk.remote.errors import PrivacyError
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.router import Router, RouterError, RouterOptions
from edge_sdk.remote.session import remote_model
from edge_sdk.serve import Server
from edge_sdk.telemetry import parse

PKG = edge_sdk.demo_package_path()
ALLOWED = PrivacyPolicy("allowed")


class Slow:
    """The real local model behind the same methods, slower (inference slower than the offered load)."""

    def __init__(self, model, delay_s: float) -> None:
        self.model, self.delay_s = model, delay_s

    def predict_image(self, image, **kw):
        time.sleep(self.delay_s)
        return self.model.predict_image(image, **kw)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    with edge_sdk.load(PKG, "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("local")) as m:
        yield m


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with edge_sdk.load(PKG, "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path_factory.mktemp("srv")) as m:
        with Server([m]) as srv:
            yield srv


def requests_served(srv) -> float:
    import urllib.request

    with urllib.request.urlopen(srv.url + "/metrics", timeout=5) as r:
        return sum(s.value for s in parse(r.read().decode()) if s.name == "edge_sdk_serve_requests_total")


def remote_for(url: str, privacy: PrivacyPolicy = ALLOWED, **kw):
    return remote_model(PKG, RemoteClient(url, **kw), privacy=privacy, profile="generic-x86_64")


def images(n: int = 4) -> list[np.ndarray]:
    from edge_sdk.assets import demo_samples
    from edge_sdk.processing.image import load_image

    return [load_image(p) for p in demo_samples()[:n]]


def test_local_first_and_the_remote_answers_the_same(local, server) -> None:
    remote = remote_for(server.url)
    router = Router(local, remote)
    img = images(1)[0]
    r = router.predict_image(img)
    assert (r.served_by, r.reason) == ("local", "local first")
    forced = Router(None, remote, local_unavailable_reason="test: remote only").predict_image(img)
    assert (forced.served_by, forced.reason) == ("remote", "test: remote only")
    np.testing.assert_allclose(forced.outputs["logits"], r.outputs["logits"], rtol=1e-5, atol=1e-5)
    assert forced.top1.label == r.top1.label and forced.result.backend == "remote"


def test_a_full_local_queue_offloads_and_every_request_is_answered(local, server) -> None:
    router = Router(Slow(local, 0.15), remote_for(server.url), RouterOptions(max_local_inflight=1, max_local_queue=1))
    imgs = images(4)
    out: list = [None] * 6
    ths = [threading.Thread(target=lambda i=i: out.__setitem__(i, router.predict_image(imgs[i % 4]))) for i in range(6)]
    t0 = time.monotonic()
    for t in ths:
        t.start()
        time.sleep(0.01)
    for t in ths:
        t.join(10)
    assert time.monotonic() - t0 < 10 and all(r is not None for r in out)
    where = [r.served_by for r in out]
    assert where.count("local") >= 2 and where.count("remote") >= 3, [(r.served_by, r.reason) for r in out]
    assert all(r.reason.startswith("local queue full (1 waiting, limit 1)") for r in out if r.served_by == "remote")
    for i, r in enumerate(out):
        assert r.top1.label == local.predict_image(imgs[i % 4]).top1.label


def test_latency_objective_offloads_when_the_local_estimate_is_over_it(local, server) -> None:
    router = Router(Slow(local, 0.03), remote_for(server.url), RouterOptions(latency_objective_ms=10))
    img = images(1)[0]
    first = router.predict_image(img)  # no estimate yet: local
    assert first.served_by == "local" and router.local_service_ms >= 30
    r = router.predict_image(img)
    assert r.served_by == "remote" and r.reason.startswith("latency objective at risk (predicted ") and "> 10 ms" in r.reason


def test_governor_critical_and_its_offload_step_route_remote(local, server) -> None:
    temps = iter([50.0] + [90.0] * 5 + [40.0] * 50)
    router = Router(local, remote_for(server.url))
    gov = Governor(lambda: SensorSnapshot(0.0, next(temps)), Budget(soft_c=70, hard_c=80, min_dwell_s=0), actions=[Offload(router.set_offload)])
    router.governor = gov
    img = images(1)[0]
    gov.step()
    assert router.predict_image(img).served_by == "local"
    gov.step()
    assert gov.state is GovernorState.CRITICAL and [a.name for a in gov.applied] == ["offload"]
    r = router.predict_image(img)
    assert (r.served_by, r.reason) == ("remote", "offload forced (governor)")
    for _ in range(20):  # 4 more hot samples, then it cools: critical -> constrained -> normal, step undone
        gov.step()
    assert gov.state is GovernorState.NORMAL and gov.applied == ()
    assert router.predict_image(img).served_by == "local"


def test_remote_down_breaker_open_and_privacy_never_keep_local_serving(local, server) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = remote_for(f"http://127.0.0.1:{port}", deadline_s=2.0)
    router = Router(local, down, RouterOptions(latency_objective_ms=0.001))
    img = images(1)[0]
    router.predict_image(img)  # local: no estimate yet
    t0 = time.monotonic()
    reasons = [router.predict_image(img) for _ in range(8)]
    assert time.monotonic() - t0 < 8 * 2.5
    assert all(r.served_by == "local" and "remote failed (" in r.reason and r.reason.endswith("served locally") for r in reasons)
    assert any("CircuitOpenError" in r.reason for r in reasons)  # the breaker opened: later ones fail fast
    before = requests_served(server)
    never = Router(local, remote_for(server.url, privacy=PrivacyPolicy()), RouterOptions(latency_objective_ms=0.001))
    never.predict_image(img)
    r = never.predict_image(img)
    assert r.served_by == "local" and PrivacyError.__name__ in r.reason
    assert requests_served(server) == before  # nothing reached the server
    with pytest.raises(RouterError, match="there is no local model"):
        Router(None, remote_for(server.url, privacy=PrivacyPolicy())).predict_image(img)


def test_local_failure_offloads_but_bad_input_is_the_callers(tmp_path: Path, server) -> None:
    broken = edge_sdk.load(PKG, "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path)
    broken.close()
    router = Router(broken, remote_for(server.url))
    img = images(1)[0]
    r = router.predict_image(img)
    assert r.served_by == "remote" and r.reason.startswith("local failed (SessionClosedError")
    with pytest.raises(InputError):
        router.predict_image(np.zeros((8, 8, 5), np.uint8))
    with pytest.raises(SessionClosedError):
        Router(broken, None).predict_image(img)


def test_confidence_cascade_escalates_unsure_answers(local, server) -> None:
    img = min(images(8), key=lambda im: local.predict_image(im).top1.score)  # the least sure of the samples
    score = local.predict_image(img).top1.score
    assert score < 0.999
    router = Router(local, remote_for(server.url), RouterOptions(cascade_threshold=min(1.0, score + 1e-3)))
    r = router.predict_image(img)
    assert r.served_by == "remote" and r.reason.startswith("cascade: local top-1 ") and r.local_result is not None
    sure = Router(local, remote_for(server.url), RouterOptions(cascade_threshold=0.0)).predict_image(img)
    assert sure.served_by == "local"
    with pytest.raises(ValueError, match="cascade_threshold"):
        RouterOptions(cascade_threshold=1.5)
    with pytest.raises(ValueError, match="a local model, a remote one, or both"):
        Router(None, None)


def test_a_package_no_local_variant_fits_goes_remote_and_says_why(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    from converters.packaging import write_package

    w = np.random.default_rng(0).standard_normal((64, 8192)).astype(np.float32)  # 2 MiB of weights
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8192])],
        initializer=[numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    pkg = tmp_path / "big"
    write_package(pkg, {"name": "big", "version": "1", "task": "raw", "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 64]}],
                        "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 8192]}],
                        "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"}]},
                  {"m.onnx": m.SerializeToString()})  # fmt: skip
    (tmp_path / "profiles").mkdir()
    tiny = tmp_path / "profiles" / "generic-x86_64.toml"  # this box, but with 1 MiB for models
    text = (Path(edge_sdk.__file__).parent / "_profiles" / "generic-x86_64.toml")
    src = text.read_text() if text.exists() else (Path(__file__).parents[1] / "device_profiles" / "generic-x86_64.toml").read_text()
    tiny.write_text(src.replace("memory_budget_mb = ", "memory_budget_mb = 1 #"))
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    with edge_sdk.load(pkg, "generic-x86_64", cache_dir=tmp_path / "c1") as served, Server([served]) as srv:
        remote = remote_model(pkg, RemoteClient(srv.url), privacy=ALLOWED, profile="generic-x86_64")
        router = Router.load(pkg, remote, profile=str(tiny), cache_dir=tmp_path / "c2")
        assert router.local is None
        r = router.predict(x)
        assert r.served_by == "remote" and r.reason.startswith("no local variant: ") and "over the 1 MiB budget" in r.reason
        np.testing.assert_allclose(r.outputs["y"], x @ w, rtol=1e-4, atol=1e-3)
        with pytest.raises(edge_sdk.errors.SelectionError):
            Router.load(pkg, None, profile=str(tiny), cache_dir=tmp_path / "c3")  # no remote: the load error stands
