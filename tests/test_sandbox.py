"""edge_sdk.backends.sandbox: the runtime's own model load, isolated in a limited child."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import mlp_onnx

from edge_sdk.backends import sandbox as _sandbox
from edge_sdk.errors import SessionError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX rlimits and signals")


def _big_initializer_onnx(n_floats: int) -> bytes:
    """y = x + w with a real ``n_floats``-element initializer (the load must copy it)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.zeros(n_floats, np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _huge_dims_tflite() -> bytes:
    """relu over a declared [65536, 16384] float32 input: 4 GiB per tensor, a few hundred bytes of file."""
    from converters.tflite_writer import TFLiteBuilder

    b = TFLiteBuilder()
    x = b.input("x", shape=(1 << 16, 1 << 14), dtype="float32")
    b.output(b.relu(x), "y")
    return b.build()


def test_good_models_load() -> None:
    pytest.importorskip("onnxruntime")
    _sandbox.check_load("onnxruntime", mlp_onnx())


def test_good_tflite_loads() -> None:
    from converters.tflite_writer import TFLiteBuilder

    pytest.importorskip("ai_edge_litert")
    b = TFLiteBuilder()
    x = b.input("x", shape=(1, 8), dtype="float32")
    b.output(b.relu(x), "y")
    _sandbox.check_load("litert", b.build())


def test_onnx_over_memory_limit_kills_only_the_child() -> None:
    pytest.importorskip("onnxruntime")
    data = _big_initializer_onnx(32 << 20)  # 128 MiB of weights
    with pytest.raises(_sandbox.SandboxMemoryError, match="memory limit of 64 MiB"):
        _sandbox.check_load("onnxruntime", data, memory_limit_mb=64)
    _sandbox.check_load("onnxruntime", data, memory_limit_mb=1024)  # fits a realistic limit


def test_tflite_huge_declared_dims_is_a_memory_error() -> None:
    pytest.importorskip("ai_edge_litert")
    with pytest.raises(_sandbox.SandboxMemoryError, match="8192 MiB.*512 MiB"):
        _sandbox.check_load("litert", _huge_dims_tflite(), memory_limit_mb=512)


def test_runtime_refusal_is_a_load_error() -> None:
    pytest.importorskip("onnxruntime")
    with pytest.raises(_sandbox.SandboxLoadError, match="refused the model"):
        _sandbox.check_load("onnxruntime", b"\x08\x07garbage that is not a model")


@pytest.mark.parametrize(("fault", "error", "text"), [
    ("abort", _sandbox.SandboxCrashError, "SIGABRT"),
    ("segv", _sandbox.SandboxCrashError, "SIGSEGV"),
    ("alloc", _sandbox.SandboxMemoryError, "memory limit"),
    ("hang", _sandbox.SandboxTimeoutError, "time limit of 2 s"),
])
def test_native_faults_are_typed(fault: str, error: type[Exception], text: str) -> None:
    pytest.importorskip("onnxruntime")
    with pytest.raises(error, match=text) as info:
        _sandbox.check_load("onnxruntime", mlp_onnx(), time_limit_s=2, _fault=fault)
    assert isinstance(info.value, SessionError)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="backend"):
        _sandbox.check_load("tensorrt", b"x")
    with pytest.raises(ValueError, match="exactly one"):
        _sandbox.check_load("onnxruntime")
    with pytest.raises(ValueError, match="limits"):
        _sandbox.check_load("onnxruntime", b"x", memory_limit_mb=1)


def test_default_is_on_except_inside_a_model_store(tmp_path) -> None:
    outside = tmp_path / "pkg"
    outside.mkdir()
    (outside / ".store-install.json").write_text("{}")  # a package cannot vouch for itself
    assert _sandbox.enabled(None, outside)
    store = tmp_path / "store"
    version = store / "versions" / "mlp" / "0.1-abcdef"
    version.mkdir(parents=True)
    (version / ".store-install.json").write_text("{}")
    (store / "store.toml").write_text("")
    assert not _sandbox.enabled(None, version)
    assert _sandbox.enabled(True, version) and not _sandbox.enabled(False, outside)


def test_check_verified_sizes_the_limit_and_skips_unknown_backends(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    assert _sandbox.memory_limit_for(10 << 30) == 3 * 10 * 1024 + 512
    assert _sandbox.memory_limit_for(1) == _sandbox.DEFAULT_MEMORY_LIMIT_MB
    _sandbox.check_verified("fake-backend", b"anything", tmp_path / "m.bin")
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp_onnx())
    _sandbox.check_verified("onnxruntime", path.read_bytes(), path)
    _sandbox.check_verified("onnxruntime", path.read_bytes(), path, external_bytes=0)
    with pytest.raises(_sandbox.SandboxLoadError):
        _sandbox.check_verified("onnxruntime", b"junk", path.with_name("x.onnx"), external_bytes=0)


def test_load_parses_a_model_in_the_sandbox_once_per_digest_and_refuses_one_that_crashes_it(tmp_path, monkeypatch) -> None:
    import edge_sdk
    from converters.packaging import write_package

    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path / "cache"))
    marks = tmp_path / "cache" / "sandbox-ok"
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path / "c1") as m:
        digest = m.variant.sha256
    made = sorted(marks.iterdir())
    assert len(made) == 1 and made[0].name.startswith("onnxruntime-") and made[0].name.endswith(digest)
    before = made[0].stat().st_mtime_ns
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", variant="fp32-onnx", cache_dir=tmp_path / "c2"):
        pass
    assert sorted(marks.iterdir()) == made and made[0].stat().st_mtime_ns == before  # remembered: no second child
    # a TFLite model whose declared tensors need far more memory than the limit: refused, this process unharmed
    pkg = tmp_path / "huge"
    write_package(pkg, {"name": "huge", "version": "1", "task": "raw",
                        "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 1]}],
                        "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 1]}],
                        "variants": [{"id": "fp32-tflite", "file": "m.tflite", "backend": "litert", "precision": "fp32"}]},
                  {"m.tflite": _huge_dims_tflite()}, verify=False)  # fmt: skip
    monkeypatch.setattr(_sandbox, "memory_limit_for", lambda n: 512)
    with pytest.raises(_sandbox.SandboxError):
        edge_sdk.load(pkg, "generic-x86_64", cache_dir=tmp_path / "c3", measure_backends=False)
    assert not any(p.name.endswith(edge_sdk.package.sha256_file(pkg / "m.tflite")) for p in marks.iterdir())
