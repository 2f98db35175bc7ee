"""Interop with a real Open Inference Protocol server: Seldon MLServer 1.7.1.

MLServer needs protobuf<7 and many packages, so this test keeps its own virtual environment,
made once and cached at ``~/.cache/edge_sdk/mlserver-venv-1.7.1`` (``$XDG_CACHE_HOME`` is
honoured) by one ``pip install`` call. If that install fails the test FAILS (it never skips:
a silent skip would hide a broken interop check). It runs in the normal suite.

The server runs a small custom MLServer runtime over onnxruntime serving an ONNX model built
here with the ``onnx`` helper API, on free 127.0.0.1 ports, in a subprocess that is always
killed. MLServer speaks JSON only (its ``GET /v2`` lists no extensions, and it answers a
binary body with a 500), so the client must negotiate JSON, and fall back to JSON when forced
to try binary.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from edge_sdk.remote.breaker import RemoteEvent
from edge_sdk.remote.client import RemoteClient
from edge_sdk.remote.errors import RemoteError
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.session import check_compatible, remote_model

MLSERVER_VERSION = "1.7.1"
# uvloop 0.22 breaks MLServer 1.7's default worker setup; the server below also runs with
# parallel_workers = 0 (inference in the server process: faster to start, fewer processes).
REQUIREMENTS = [f"mlserver=={MLSERVER_VERSION}", "onnxruntime", "uvloop<0.22"]
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 60.0
ALLOWED = PrivacyPolicy("allowed")
MODEL, VERSION = "tiny", "1.0.0"

RUNTIME = '''\
"""An MLServer runtime over onnxruntime (written by tests/test_remote_mlserver.py)."""
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        self._sess = ort.InferenceSession(await get_model_uri(self._settings), providers=["CPUExecutionProvider"])
        self._names = [o.name for o in self._sess.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        wanted = [o.name for o in payload.outputs] if payload.outputs else self._names
        outputs = []
        for n, v in zip(wanted, self._sess.run(wanted, feeds)):
            out = NumpyCodec.encode_output(n, np.ascontiguousarray(v))
            out.shape = list(v.shape)  # NumpyCodec declares a 1-D array as [n, 1]; say what onnxruntime gave
            outputs.append(out)
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id, outputs=outputs)
'''


def _cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edge_sdk"


def mlserver_venv() -> Path:
    """The cached venv (made on first use under a file lock; a half-made one is redone)."""
    venv = _cache_root() / f"mlserver-venv-{MLSERVER_VERSION}"
    done = venv / ".edge-sdk-complete"
    if done.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".mlserver-venv-{MLSERVER_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be making it
        if done.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", *REQUIREMENTS],
        ]
        for cmd in steps:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                pytest.fail(f"making the MLServer venv timed out after {INSTALL_TIMEOUT_S} s: {' '.join(cmd)}")
            if r.returncode != 0:
                pytest.fail(
                    f"making the MLServer venv failed (exit {r.returncode}): {' '.join(cmd)}\n"
                    f"--- stdout ---\n{r.stdout[-4000:]}\n--- stderr ---\n{r.stderr[-4000:]}"
                )
        done.write_text(" ".join(REQUIREMENTS) + "\n")
    return venv


def tiny_onnx() -> bytes:
    """x FP32 [batch, 4] -> y = tanh(x @ W + b) FP32 [batch, 3], label = argmax(y) INT64 [batch]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["a"]),
            helper.make_node("Tanh", ["a"], ["y"]),
            helper.make_node("ArgMax", ["y"], ["label"], axis=1, keepdims=0),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def onnx_bytes() -> bytes:
    return tiny_onnx()


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory, onnx_bytes: bytes) -> Iterator[str]:
    venv = mlserver_venv()
    root = tmp_path_factory.mktemp("mlserver")
    http_port, grpc_port = _free_ports(2)
    (root / "settings.json").write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "http_port": http_port,
                "grpc_port": grpc_port,
                "metrics_endpoint": None,
                "parallel_workers": 0,
                "debug": False,
            }
        )
    )
    model_dir = root / MODEL
    model_dir.mkdir()
    (model_dir / "model.onnx").write_bytes(onnx_bytes)
    (model_dir / "ort_runtime.py").write_text(RUNTIME)
    (model_dir / "model-settings.json").write_text(
        json.dumps(
            {
                "name": MODEL,
                "implementation": "ort_runtime.OnnxRuntime",
                "parameters": {"uri": "./model.onnx", "version": VERSION},
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}, {"name": "label", "datatype": "INT64", "shape": [-1]}],
            }
        )
    )
    log_path = root / "mlserver.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLSERVER")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(venv / "bin" / "mlserver"), "start", str(root)],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: killed whole below
        )
    url = f"http://127.0.0.1:{http_port}"
    try:
        probe = RemoteClient(url, connect_timeout_s=0.5, deadline_s=1.0)
        t_end = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlserver exited with {proc.returncode} while starting:\n{log_path.read_text(errors='replace')[-4000:]}")
            try:
                if probe.model_ready(MODEL, VERSION):
                    break
            except RemoteError:
                pass
            if time.monotonic() > t_end:
                pytest.fail(f"mlserver not ready after {START_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.2)
        yield url
    finally:
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue


def reference(onnx_bytes: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    y, label = sess.run(["y", "label"], {"x": x})
    return {"y": y, "label": label}


X = np.array([[0.5, -1.0, 2.0, 0.25], [1.5, 0.0, -0.5, -2.0], [0.1, 0.2, 0.3, 0.4]], np.float32)


def test_health_and_metadata(mlserver: str) -> None:
    c = RemoteClient(mlserver)
    assert c.live() and c.ready() and c.model_ready(MODEL) and c.model_ready(MODEL, VERSION)
    assert not c.model_ready("no-such-model")
    server = c.server_metadata()
    assert (server.name, server.version) == ("mlserver", MLSERVER_VERSION)
    meta = c.model_metadata(MODEL)
    assert meta.name == MODEL
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("x", "FP32", (-1, 4))]
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [("y", "FP32", (-1, 3)), ("label", "INT64", (-1,))]


def test_json_infer_equals_onnxruntime(mlserver: str, onnx_bytes: bytes) -> None:
    c = RemoteClient(mlserver, privacy=ALLOWED)
    r = c.infer(MODEL, {"x": X}, version=VERSION, outputs=["y", "label"], expected={"y": ("FP32", [3, 3]), "label": ("INT64", [3])})
    assert c.wire == "json"  # MLServer lists no binary extension
    want = reference(onnx_bytes, X)
    np.testing.assert_allclose(r.outputs["y"], want["y"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(r.outputs["label"], want["label"])
    assert r.model_name == MODEL and r.model_version == VERSION


def test_binary_refused_falls_back_to_json(mlserver: str, onnx_bytes: bytes) -> None:
    events: list[RemoteEvent] = []
    c = RemoteClient(mlserver, privacy=ALLOWED, wire="binary", on_event=events.append)
    r = c.infer(MODEL, {"x": X}, version=VERSION, outputs=["y"], expected={"y": ("FP32", [3, 3])})
    np.testing.assert_allclose(r.outputs["y"], reference(onnx_bytes, X)["y"], rtol=1e-6, atol=1e-7)
    assert c.wire == "json" and [e.kind for e in events] == ["wire"] and "HTTP 500" in events[0].reason
    c.infer(MODEL, {"x": X}, version=VERSION)  # straight to JSON now
    assert [e.kind for e in events] == ["wire"]


def test_remote_model_over_mlserver(mlserver: str, onnx_bytes: bytes, tmp_path: Path) -> None:
    import edge_sdk
    from converters.packaging import write_package
    from edge_sdk.package import ModelPackage

    manifest = {
        "schema": 1,
        "name": MODEL,
        "version": VERSION,
        "task": "raw",
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4], "dims": {"batch": [1, 8]}}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 3]}, {"name": "label", "dtype": "int64", "shape": ["batch"]}],
        "variants": [{"id": "fp32", "file": "tiny.onnx", "backend": "onnxruntime", "precision": "fp32"}],
    }
    write_package(tmp_path / "tiny", manifest, {"tiny.onnx": onnx_bytes})
    c = RemoteClient(mlserver)
    check_compatible(c, ModelPackage.open(tmp_path / "tiny").manifest)
    with edge_sdk.load(tmp_path / "tiny", threads=1) as local, remote_model(tmp_path / "tiny", c, privacy=ALLOWED) as remote:
        a, b = local.predict(X), remote.predict(X)
        np.testing.assert_allclose(b.outputs["y"], a.outputs["y"], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(b.outputs["label"], a.outputs["label"])
        assert b.backend == "remote" and list(b.outputs) == ["y", "label"]
