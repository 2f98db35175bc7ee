"""Triton's own Python client (``tritonclient.http``) against ``edge-sdk serve``: the server speaks
the protocol as a third-party client expects it (JSON and binary tensors, gzip bodies, errors).
A real server on 127.0.0.1 with the real demo package."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpclient = pytest.importorskip("tritonclient.http")

import edge_sdk  # noqa: E402
from edge_sdk.model import Model  # noqa: E402
from edge_sdk.serve import ServeOptions, Server  # noqa: E402

DEMO = "shapes-classifier"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    cache = tmp_path_factory.mktemp("cache")
    pkg = edge_sdk.demo_package_path()
    ms = {v: edge_sdk.load(pkg, variant=v, cache_dir=cache, measure_backends=False) for v in ("fp32-onnx", "fp32-tflite")}
    yield ms
    for m in ms.values():
        m.close()


@pytest.fixture(scope="module")
def client(models: dict[str, Model]) -> httpclient.InferenceServerClient:
    with Server({DEMO: models["fp32-onnx"], "shapes-tflite": models["fp32-tflite"]}, ServeOptions(max_queue_delay_ms=1)) as srv:
        c = httpclient.InferenceServerClient(url=srv.url.removeprefix("http://"), connection_timeout=10.0, network_timeout=10.0)
        yield c
        c.close()


def _x(model: Model, rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, *model.inputs[0].shape[1:])).astype(np.float32)


def test_health_and_metadata(client: httpclient.InferenceServerClient, models: dict[str, Model]) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(DEMO) and client.is_model_ready(DEMO, model_version="1.0.0")
    assert not client.is_model_ready("nope") and not client.is_model_ready(DEMO, model_version="7")
    meta = client.get_server_metadata()
    assert meta["name"] == "edge-sdk" and meta["version"] == edge_sdk.__version__ and "binary_tensor_data" in meta["extensions"]
    mm = client.get_model_metadata(DEMO)
    assert mm["name"] == DEMO and mm["versions"] == [models["fp32-onnx"].manifest.version] and mm["platform"] == "onnxruntime_onnx"
    assert mm["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert mm["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 4]}]
    assert client.get_model_metadata("shapes-tflite", model_version="1.0.0")["platform"] == "tensorflow_lite"


@pytest.mark.parametrize("name,variant", [(DEMO, "fp32-onnx"), ("shapes-tflite", "fp32-tflite")])
@pytest.mark.parametrize("binary", [False, True])
def test_infer_equals_predict(
    client: httpclient.InferenceServerClient, models: dict[str, Model], name: str, variant: str, binary: bool
) -> None:
    model = models[variant]
    x = _x(model, 2, seed=11)
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("logits", binary_data=binary)
    res = client.infer(name, [inp], outputs=[out], request_id="t-1")
    np.testing.assert_array_equal(res.as_numpy("logits"), model.predict(x).outputs["logits"])
    r = res.get_response()
    assert r["model_name"] == name and r["id"] == "t-1" and r["model_version"] == model.manifest.version


def test_infer_all_outputs_versioned_and_gzip(client: httpclient.InferenceServerClient, models: dict[str, Model]) -> None:
    model = models["fp32-onnx"]
    x = _x(model, 1, seed=12)
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = client.infer(DEMO, [inp], model_version="1.0.0", request_compression_algorithm="gzip")  # no outputs named: all of them
    np.testing.assert_array_equal(res.as_numpy("logits"), model.predict(x).outputs["logits"])


def test_errors_reach_the_client(client: httpclient.InferenceServerClient, models: dict[str, Model]) -> None:
    from tritonclient.utils import InferenceServerException

    x = _x(models["fp32-onnx"], 1, seed=13).astype(np.float64)
    inp = httpclient.InferInput("image", list(x.shape), "FP64")
    inp.set_data_from_numpy(x, binary_data=True)
    with pytest.raises(InferenceServerException, match="float32"):
        client.infer(DEMO, [inp])
    with pytest.raises(InferenceServerException, match="not served"):
        client.infer("nope", [inp])
    with pytest.raises(InferenceServerException, match="not served"):
        client.get_model_metadata("nope")
