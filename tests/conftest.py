"""Shared fixtures: small real models and packages built in the test run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tools/ and converters/ importable from a checkout


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Package extraction, ORT optimised models and selection measurements go to a
    per-test cache, never the user's. (Module-scoped fixtures, such as the
    pretrained-model fetch, run before this and keep the normal cache.)"""
    monkeypatch.setenv("EDGE_SDK_CACHE", str(tmp_path_factory.mktemp("cache")))


def mlp_onnx(n_in: int = 8, n_out: int = 4, seed: int = 0, *, batch: Any = "batch") -> bytes:
    """x[batch, n_in] -> MatMul -> Add -> Relu -> y[batch, n_out], seeded weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n_out])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def mlp_manifest(n_in: int = 8, n_out: int = 4, *, file: str = "m.onnx", **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema": 1,
        "name": "mlp",
        "version": "0.1",
        "task": "raw",
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", n_in], "dims": {"batch": [1, 8]}}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", n_out]}],
        "variants": [{"id": "fp32", "file": file, "backend": "onnxruntime", "precision": "fp32"}],
    }
    d.update(extra)
    return d


@pytest.fixture
def mlp_package(tmp_path: Path) -> Path:
    from converters.packaging import write_package

    root = tmp_path / "mlp"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    return root


@pytest.fixture(scope="session")
def demo_package() -> Path:
    from edge_sdk.assets import demo_package_path

    return demo_package_path()


TINY_LLM = ROOT / "tools" / "fixtures" / "tiny_llm"


@pytest.fixture(scope="session")
def tiny_llm_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama trained by tools/train_tiny_llm.py (shipped as safetensors), converted by
    ``edge-convert llm`` to int4, int8 and fp32 (about 3 s)."""
    from converters.cli import main as convert_main

    out = tmp_path_factory.mktemp("tiny-llm") / "pkg"
    rc = convert_main(["llm", str(TINY_LLM), "--to", "int4,int8,fp32", "--out", str(out), "--eval-text", str(TINY_LLM / "heldout.txt"), "--json"])
    assert rc == 0
    return out
