"""Packages for the store tests: a small MLP at any version, with golden data, and bad ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from conftest import mlp_manifest, mlp_onnx


def mlp_reference(x: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    return np.maximum(x @ w + b, 0).astype(np.float32)


def bad_op_onnx() -> bytes:
    """A structurally valid ONNX model whose op no runtime knows: loading it fails."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example.none")],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.none", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def make_pkg(
    folder: Path,
    version: str,
    *,
    seed: int = 0,
    golden: bool = True,
    model: bytes | None = None,
    expected_seed: int | None = None,
    max_latency_ms: float | None = 1000.0,
    **golden_extra: Any,
) -> Path:
    """An MLP package at ``version``; golden outputs from ``expected_seed`` (default: the same weights)."""
    from converters.packaging import write_package

    files: dict[str, Any] = {"m.onnx": model if model is not None else mlp_onnx(seed=seed)}
    extra: dict[str, Any] = {"version": version}
    if golden:
        x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
        y = mlp_reference(x, seed if expected_seed is None else expected_seed)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "golden_in.npz", x=x)
        np.savez(folder / "golden_out.npz", y=y)
        g: dict[str, Any] = {
            "inputs": "golden_in.npz",
            "outputs": "golden_out.npz",
            "atol": 1e-4,
            "rtol": 1e-4,
            "timeout_s": 30.0,
            **golden_extra,
        }
        if max_latency_ms is not None:
            g["max_latency_ms"] = max_latency_ms
        extra["golden"] = g
    write_package(folder, mlp_manifest(**extra), files, overwrite=True, verify=model is None)
    return folder


def slow_mlp_onnx(seed: int = 0, width: int = 1024, depth: int = 96) -> bytes:
    """The same function as ``mlp_onnx(seed)`` (so its golden outputs match) made really slow: a
    chain of ``depth`` width x width MatMuls over the input (one shared 4 MiB weight, scaled to
    shrink the values so nothing overflows) whose sum is added times zero. No runtime folds it away
    (its input is the request): ~400 MFLOP a call (~10 ms here), where the MLP takes ~10 us."""
    import onnx
    from onnx import helper, numpy_helper

    base = onnx.load_from_string(mlp_onnx(seed=seed))
    g = base.graph
    out = g.output[0].name
    rng = np.random.default_rng(99)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, width)) / np.sqrt(8)).astype(np.float32), "slow_w0"),
        numpy_helper.from_array((0.5 * rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "slow_w"),
        numpy_helper.from_array(np.zeros((1,), np.float32), "slow_zero"),
    ]
    nodes = [helper.make_node("MatMul", [g.input[0].name, "slow_w0"], ["slow_h0"])]
    for i in range(1, depth + 1):
        nodes.append(helper.make_node("MatMul", [f"slow_h{i - 1}", "slow_w"], [f"slow_h{i}"]))
    nodes += [
        helper.make_node("ReduceSum", [f"slow_h{depth}"], ["slow_s"], keepdims=1),
        helper.make_node("Mul", ["slow_s", "slow_zero"], ["slow_z"]),
    ]
    for n in g.node:  # rename the model's own output, then add the zero term to it
        n.output[:] = ["slow_y0" if o == out else o for o in n.output]
    nodes.append(helper.make_node("Add", ["slow_y0", "slow_z"], [out]))
    g.node.extend(nodes)
    g.initializer.extend(inits)
    return base.SerializeToString()
