"""converters/repair.py on real models and real ONNX Runtime quantization.

The model is a small CNN whose one hard layer is built in: ``outlier_conv``
writes tensor ``o`` with one output channel scaled x1000, and ``mix_conv``
reads it (its weights for that channel scaled /1000, so the float model's
downstream values stay ordinary). Per-tensor int8 activation quantization of
``o`` (scale set by the outlier) crushes the seven ordinary channels, which is
all ``mix_conv``'s output really depends on. Every other layer quantizes fine:
the same network without the outlier passes the gate as plain int8.
"""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

from converters.repair import NodeSensitivity, RepairResult, rank_sensitivity, repair_int8  # noqa: E402

OUTLIER = 1000.0
GATE_COSINE = 0.999
QUANTIZED_NODES = {"stem", "outlier_conv", "mix_conv", "head_conv", "gap", "flatten", "fc"}


def cnn_onnx(path: Path, *, outlier: float = OUTLIER, seed: int = 3) -> Path:
    """x[N,3,16,16] -> stem Conv+Relu -> outlier_conv -> mix_conv+Relu -> head_conv(1x1)+Relu
    -> GlobalAveragePool -> Flatten -> fc Gemm -> logits[N,10] (ir_version 8, opset 17)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def conv(o: int, i: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.standard_normal((o, i, k, k)) * np.sqrt(2.0 / (i * k * k))
        return w.astype(np.float32), (rng.standard_normal(o) * 0.1).astype(np.float32)

    w_stem, b_stem = conv(8, 3, 3)
    w_out, b_out = conv(8, 8, 3)
    w_out[3] *= outlier  # output channel 3 of `o` is ~1000x the others
    b_out[3] *= outlier
    w_mix, b_mix = conv(8, 8, 3)
    w_mix[:, 3] /= outlier  # ... and mix_conv scales it back: float values downstream stay ordinary
    w_head, b_head = conv(8, 8, 1)
    w_fc = (rng.standard_normal((10, 8)) * 0.5).astype(np.float32)
    b_fc = (rng.standard_normal(10) * 0.1).astype(np.float32)
    inits = {
        "w_stem": w_stem, "b_stem": b_stem, "w_out": w_out, "b_out": b_out, "w_mix": w_mix,
        "b_mix": b_mix, "w_head": w_head, "b_head": b_head, "w_fc": w_fc, "b_fc": b_fc,
    }  # fmt: skip
    same = {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w_stem", "b_stem"], ["s"], name="stem", **same),
        helper.make_node("Relu", ["s"], ["sr"], name="stem_relu"),
        helper.make_node("Conv", ["sr", "w_out", "b_out"], ["o"], name="outlier_conv", **same),
        helper.make_node("Conv", ["o", "w_mix", "b_mix"], ["m"], name="mix_conv", **same),
        helper.make_node("Relu", ["m"], ["mr"], name="mix_relu"),
        helper.make_node("Conv", ["mr", "w_head", "b_head"], ["h"], name="head_conv"),
        helper.make_node("Relu", ["h"], ["hr"], name="head_relu"),
        helper.make_node("GlobalAveragePool", ["hr"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w_fc", "b_fc"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "outlier_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


CALIBRATION = feeds(32, seed=1)
RANK_SAMPLES = CALIBRATION[:8]
HELD_OUT = feeds(16, seed=99)


class Counter:
    """``quantize(out_path, nodes_to_exclude)``: ORT static QDQ int8 (per-channel
    weights, QInt8 activations and weights, MinMax over CALIBRATION); counts calls."""

    def __init__(self, fp32: Path) -> None:
        self.fp32 = fp32
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, out: Path, nodes_to_exclude: Sequence[str]) -> None:
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self._it = iter(CALIBRATION)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._it, None)

        self.calls.append(tuple(nodes_to_exclude))
        quantize_static(
            str(self.fp32),
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=list(nodes_to_exclude),
        )


def run(model: Path, samples: Sequence[dict[str, np.ndarray]]) -> np.ndarray:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, s)[0] for s in samples])


def cosine_gate(fp32: Path) -> Callable[[Path], tuple[bool, str]]:
    """Passes when every held-out output has cosine >= GATE_COSINE with the float model's."""
    ref = run(fp32, HELD_OUT)

    def evaluate(model: Path) -> tuple[bool, str]:
        out = run(model, HELD_OUT)
        cos = np.sum(out * ref, axis=1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1))
        return bool(cos.min() >= GATE_COSINE), f"min cosine {cos.min():.5f} over {len(HELD_OUT)} held-out inputs"

    return evaluate


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Graph:
    """Just enough of a QDQ graph to ask what surrounds a node."""

    def __init__(self, path: Path) -> None:
        self.model = onnx.load(str(path))
        g = self.model.graph
        self.nodes = {n.name: n for n in g.node}
        self.init = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def from_dq(self, tensor: str) -> bool:
        p = self.producer.get(tensor)
        return p is not None and p.op_type == "DequantizeLinear"

    def to_q(self, tensor: str) -> bool:
        return any(c.op_type == "QuantizeLinear" for c in self.consumers.get(tensor, []))

    def weight_is_int8(self, node: str) -> bool:
        """The node's weight (input 1) is DequantizeLinear(int8 initializer)."""
        w = self.nodes[node].input[1]
        return self.from_dq(w) and self.init[self.producer[w].input[0]].data_type == onnx.TensorProto.INT8

    def no_qdq_around(self, node: str) -> bool:
        n = self.nodes[node]
        return not any(self.from_dq(i) for i in n.input if i) and not any(self.to_q(o) for o in n.output)


@pytest.fixture(scope="module")
def outlier_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cnn_onnx(tmp_path_factory.mktemp("fp32") / "cnn.onnx")


@pytest.fixture(scope="module")
def plain_int8(outlier_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "cnn.int8.onnx"
    Counter(outlier_model)(out, [])
    return out


# --------------------------------------------------------------------------- the model is what it claims


def test_plain_int8_fails_the_gate_but_the_same_net_without_the_outlier_passes(
    outlier_model: Path, plain_int8: Path, tmp_path: Path
) -> None:
    ok, summary = cosine_gate(outlier_model)(plain_int8)
    assert not ok, summary
    assert float(summary.split()[2]) < 0.99  # not a near miss

    control = cnn_onnx(tmp_path / "control.onnx", outlier=1.0)
    Counter(control)(tmp_path / "control.int8.onnx", [])
    ok, summary = cosine_gate(control)(tmp_path / "control.int8.onnx")
    assert ok, summary  # every other layer quantizes fine


def test_plain_int8_control_repair_is_a_single_quantization(tmp_path: Path) -> None:
    control = cnn_onnx(tmp_path / "control.onnx", outlier=1.0)
    quantize = Counter(control)
    result = repair_int8(
        control, tmp_path / "out.onnx", quantize=quantize, evaluate=cosine_gate(control), samples=RANK_SAMPLES, work_dir=tmp_path / "w"
    )
    assert result.passed and result.excluded == () and result.ranking == ()
    assert len(result.attempts) == 1 and result.attempts[0][0] == ()
    assert quantize.calls == [()]
    assert Graph(tmp_path / "out.onnx").weight_is_int8("mix_conv")


# --------------------------------------------------------------------------- ranking


def test_rank_sensitivity_puts_the_consumer_of_the_outlier_tensor_first(outlier_model: Path, plain_int8: Path, tmp_path: Path) -> None:
    before = digest(outlier_model)
    siblings = sorted(p.name for p in outlier_model.parent.iterdir())

    ranking = rank_sensitivity(outlier_model, plain_int8, RANK_SAMPLES, work_dir=tmp_path / "rank")

    assert all(isinstance(s, NodeSensitivity) for s in ranking)
    # SQNR is charged to the node that *adds* the noise. The outlier tensor `o`
    # itself still looks fine by whole-tensor SQNR (its norm is the outlier
    # channel's); the collapse shows at mix_conv's output. mix_conv's Relu was
    # folded into its Q/DQ by ORT, so its activation is the Relu's output `mr`.
    worst = ranking[0]
    assert (worst.node, worst.op_type, worst.tensor) == ("mix_conv", "Conv", "mr")
    assert worst.sqnr_db < 3.0
    by_node = {s.node: s for s in ranking}
    assert by_node["outlier_conv"].tensor == "o" and by_node["outlier_conv"].sqnr_db > 25.0
    assert by_node["stem"].tensor == "sr" and by_node["stem"].sqnr_db > 25.0
    assert [s.sqnr_db for s in ranking] == sorted(s.sqnr_db for s in ranking)

    # Only nodes that run quantized: the Relus were folded away, every ranked node
    # sits between DequantizeLinear inputs and QuantizeLinear outputs.
    assert set(by_node) == QUANTIZED_NODES
    g = Graph(plain_int8)
    for name in by_node:
        n = g.nodes[name]
        assert all(g.from_dq(i) for i in n.input if i) and all(g.to_q(o) for o in n.output), name

    assert digest(outlier_model) == before
    assert sorted(p.name for p in outlier_model.parent.iterdir()) == siblings  # nothing written beside it


def test_rank_sensitivity_refuses_a_float_model_that_was_not_the_one_quantized(plain_int8: Path, tmp_path: Path) -> None:
    from conftest import mlp_onnx

    other = tmp_path / "mlp.onnx"
    other.write_bytes(mlp_onnx(n_in=8, n_out=4))
    with pytest.raises(ValueError, match="actually quantized"):
        rank_sensitivity(other, plain_int8, [{"x": np.ones((1, 8), np.float32)}], work_dir=tmp_path / "rank")


# --------------------------------------------------------------------------- repair


def test_repair_keeps_the_sensitive_node_and_its_input_in_float_and_passes(outlier_model: Path, tmp_path: Path) -> None:
    before = digest(outlier_model)
    quantize = Counter(outlier_model)
    evaluate = cosine_gate(outlier_model)
    out = tmp_path / "repaired.onnx"

    result = repair_int8(outlier_model, out, quantize=quantize, evaluate=evaluate, samples=RANK_SAMPLES, work_dir=tmp_path / "w")

    assert isinstance(result, RepairResult)
    assert result.passed
    assert len(result.excluded) <= 2 and result.excluded[0] == "mix_conv"
    # mix_conv alone is not enough: its input `o` keeps its Q/DQ while its
    # producer is quantized. outlier_conv is its QDQ partner and comes next.
    assert result.excluded == ("mix_conv", "outlier_conv")
    assert [a[0] for a in result.attempts] == [(), ("mix_conv",), ("mix_conv", "outlier_conv")]
    assert all("min cosine" in a[1] for a in result.attempts)
    assert quantize.calls == [a[0] for a in result.attempts]
    assert result.ranking[0].node == "mix_conv"

    ok, summary = evaluate(out)
    assert ok, summary
    g = Graph(out)
    assert g.no_qdq_around("mix_conv")
    assert not g.to_q("o")  # the outlier tensor itself is float now
    w = g.nodes["mix_conv"].input[1]
    assert g.init[w].data_type == onnx.TensorProto.FLOAT
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(g.init[w]),
        onnx.numpy_helper.to_array({t.name: t for t in onnx.load(str(outlier_model)).graph.initializer}["w_mix"]),
    )
    for name in ("stem", "head_conv", "fc"):  # the rest stays int8
        assert g.weight_is_int8(name), name
    assert digest(outlier_model) == before


def test_unrepairable_within_max_excluded_reports_every_attempt(
    outlier_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = digest(outlier_model)
    quantize = Counter(outlier_model)
    out = tmp_path / "best.onnx"
    with caplog.at_level(logging.WARNING, logger="converters.repair"):
        result = repair_int8(
            outlier_model,
            out,
            quantize=quantize,
            evaluate=cosine_gate(outlier_model),
            samples=RANK_SAMPLES,
            work_dir=tmp_path / "w",
            max_excluded=1,
        )
    assert not result.passed
    assert [a[0] for a in result.attempts] == [(), ("mix_conv",)]
    assert len(quantize.calls) == math.ceil(1 / 1) + 1
    assert result.excluded in [a[0] for a in result.attempts]
    assert out.is_file()
    assert any("no attempt passed" in r.getMessage() and "best attempt" in r.getMessage() for r in caplog.records)
    assert digest(outlier_model) == before


def test_step_and_bound_with_a_gate_nothing_passes(outlier_model: Path, tmp_path: Path) -> None:
    quantize = Counter(outlier_model)
    gate = cosine_gate(outlier_model)
    seen: list[Path] = []

    def never(model: Path) -> tuple[bool, str]:
        seen.append(model)
        return False, "fail: " + gate(model)[1]

    out = tmp_path / "best.onnx"
    result = repair_int8(
        outlier_model, out, quantize=quantize, evaluate=never, samples=RANK_SAMPLES, work_dir=tmp_path / "w", max_excluded=3, step=2
    )
    assert not result.passed
    sizes = [len(a[0]) for a in result.attempts]
    assert sizes == [0, 2, 3]  # the last step is cut to max_excluded
    assert len(quantize.calls) == len(seen) == math.ceil(3 / 2) + 1
    assert [a[0] for a in result.attempts][1] == ("mix_conv", "outlier_conv")
    # out_model is the best attempt (by output SQNR): one that floats the outlier tensor,
    # and byte for byte the attempt it names.
    assert set(result.excluded) >= {"mix_conv", "outlier_conv"}
    k = [a[0] for a in result.attempts].index(result.excluded)
    assert out.read_bytes() == seen[k].read_bytes()
    assert Graph(out).no_qdq_around("mix_conv")


@pytest.mark.parametrize("kwargs", [{"step": 0}, {"max_excluded": -1}])
def test_bad_arguments(outlier_model: Path, tmp_path: Path, kwargs: dict) -> None:
    quantize = Counter(outlier_model)
    with pytest.raises(ValueError):
        repair_int8(
            outlier_model,
            tmp_path / "o.onnx",
            quantize=quantize,
            evaluate=lambda p: (True, ""),
            samples=RANK_SAMPLES,
            work_dir=tmp_path,
            **kwargs,
        )
    assert quantize.calls == []
