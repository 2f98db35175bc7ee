"""edge_sdk.streams.signal: windows, timestamps, policies, per-stream state, routing, batching.

Tiny models built here make results exact: ``identity`` returns the window it got,
``accumulator`` (stateful) returns the running sum of every sample it was fed, ``energy``
(stateless, dynamic batch) returns the mean square of each window, ``batched_accumulator``
(stateful, dynamic batch, state batched on axis 1, a scalar constant) returns gain x the
running sum and counts its windows. The real model (Silero VAD on espeak-ng speech) proves
state isolation across 50+ interleaved streams, unbatched and batched.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import EdgeSDKError, InputDTypeError, InputError, InputShapeError, InputTypeError, NonFiniteInputError
from edge_sdk.streams import (
    DuplicateStreamError,
    GapError,
    NonFiniteSignalError,
    SignalConfigError,
    SignalDTypeError,
    SignalShapeError,
    SignalStream,
    SignalStreamOptions,
    StreamClosedError,
    StreamLimitError,
    StreamRouter,
    TimestampError,
)
from edge_sdk.streams.signal import StreamRouterOwnedError

SR = 1000  # 1 sample per ms keeps the timestamp arithmetic readable


# --- tiny models -----------------------------------------------------------------------------


def _onnx(nodes, inputs, outputs, opset: int = 17) -> bytes:
    from onnx import helper

    g = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _package(tmp: Path, name: str, model: bytes, inputs: list[dict], outputs: list[dict], **extra: Any):
    from converters.packaging import write_package

    man = {
        "schema": 1,
        "name": name,
        "version": "1",
        "task": "raw",
        "inputs": inputs,
        "outputs": outputs,
        "variants": [{"id": "fp32", "file": "m.onnx", "backend": "onnxruntime", "precision": "fp32"}],
        **extra,
    }
    write_package(tmp / name, man, {"m.onnx": model}, overwrite=True)
    return edge_sdk.load(tmp / name, "generic-x86_64", threads=1)


def identity_model(tmp: Path, shape: list, dtype: str = "float32"):
    """y = x: the model returns exactly the window it was fed."""
    from onnx import TensorProto, helper

    t = {"float32": TensorProto.FLOAT, "int16": TensorProto.INT16}[dtype]
    onx = _onnx([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", t, shape)], [helper.make_tensor_value_info("y", t, shape)])
    return _package(tmp, f"identity-{'x'.join(map(str, shape))}-{dtype}", onx, [{"name": "x", "dtype": dtype, "shape": shape}], [{"name": "y", "dtype": dtype, "shape": shape}])


def accumulator_model(tmp: Path, window: int):
    """Stateful: total = s + sum(x); outputs total twice (y, and sN fed back into s)."""
    from onnx import TensorProto, helper

    onx = _onnx(
        [
            helper.make_node("ReduceSum", ["x"], ["r"], keepdims=1),
            helper.make_node("Add", ["s", "r"], ["y"]),
            helper.make_node("Identity", ["y"], ["sN"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, window]), helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1]), helper.make_tensor_value_info("sN", TensorProto.FLOAT, [1, 1])],
        opset=13,
    )
    return _package(
        tmp,
        f"acc{window}",
        onx,
        [{"name": "x", "dtype": "float32", "shape": [1, window]}, {"name": "s", "dtype": "float32", "shape": [1, 1]}],
        [{"name": "y", "dtype": "float32", "shape": [1, 1]}, {"name": "sN", "dtype": "float32", "shape": [1, 1]}],
        state=[{"input": "s", "output": "sN"}],
    )


def energy_model(tmp: Path, window: int, max_batch: int = 8, gain: bool = False):
    """Stateless, dynamic batch in [1, max_batch]: y[b] = mean(x[b]**2), times a rank-0
    input ``gain`` with ``gain=True``."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["m" if gain else "y"], axes=[1], keepdims=1)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", window])]
    specs = [{"name": "x", "dtype": "float32", "shape": ["batch", window], "dims": {"batch": [1, max_batch]}}]
    if gain:
        nodes.append(helper.make_node("Mul", ["m", "gain"], ["y"]))
        ins.append(helper.make_tensor_value_info("gain", TensorProto.FLOAT, []))
        specs.append({"name": "gain", "dtype": "float32", "shape": []})
    onx = _onnx(nodes, ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])])
    return _package(tmp, f"energy{window}{'-gain' if gain else ''}", onx, specs, [{"name": "y", "dtype": "float32", "shape": ["batch", 1]}])


def batched_accumulator_model(tmp: Path, window: int, max_batch: int = 8, batch_axis: int | None = 1):
    """Stateful with a dynamic batch in [1, max_batch]; state s [2, batch, 1] (batch_axis 1):
    sN[0] = s[0] + gain * sum(x) (the running sum), sN[1] = s[1] + 1 (windows since the state
    was last initial); y = sN[0] as [batch, 1]. ``gain`` is a rank-0 constant input."""
    from onnx import TensorProto, helper, numpy_helper

    one = numpy_helper.from_array(np.ones((1, 1, 1), np.float32), "one")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    onx_graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x", "axes1"], ["r"], keepdims=1),  # [B, 1]
            helper.make_node("Mul", ["r", "gain"], ["rg"]),
            helper.make_node("Unsqueeze", ["rg", "axes0"], ["r3"]),  # [1, B, 1]
            helper.make_node("Mul", ["r3", "zerof"], ["z3"]),
            helper.make_node("Add", ["z3", "one"], ["c3"]),  # ones like r3
            helper.make_node("Concat", ["r3", "c3"], ["inc"], axis=0),  # [2, B, 1]
            helper.make_node("Add", ["s", "inc"], ["sN"]),
            helper.make_node("Gather", ["sN", "zero"], ["y"], axis=0),  # [B, 1]
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", window]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, "batch", 1]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1]), helper.make_tensor_value_info("sN", TensorProto.FLOAT, [2, "batch", 1])],
        [
            numpy_helper.from_array(np.array([1], np.int64), "axes1"),
            numpy_helper.from_array(np.array([0], np.int64), "axes0"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zerof"),
            one,
            zero,
        ],
    )
    m = helper.make_model(onx_graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    dims = {"batch": [1, max_batch]}
    pair: dict[str, Any] = {"input": "s", "output": "sN"}
    if batch_axis is not None:
        pair["batch_axis"] = batch_axis
    return _package(
        tmp,
        f"bacc{window}-{max_batch}-{batch_axis}",
        m.SerializeToString(),
        [
            {"name": "x", "dtype": "float32", "shape": ["batch", window], "dims": dims},
            {"name": "s", "dtype": "float32", "shape": [2, "batch", 1], "dims": dims},
            {"name": "gain", "dtype": "float32", "shape": []},
        ],
        [{"name": "y", "dtype": "float32", "shape": ["batch", 1]}, {"name": "sN", "dtype": "float32", "shape": [2, "batch", 1]}],
        state=[pair],
    )


GAIN = {"gain": np.array(2.0, np.float32)}


def opts(**kw: Any) -> SignalStreamOptions:
    base: dict[str, Any] = {"sample_rate_hz": SR, "window": 4}
    base.update(kw)
    return SignalStreamOptions(**base)


def ramp(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32)


def windows(results) -> list[list[float]]:
    return [w.outputs["y"].reshape(-1).tolist() for w in results]


def acc(results) -> list[float]:
    return [float(w.outputs["y"][0, 0]) for w in results]


# --- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"sample_rate_hz": 0}, "sample_rate_hz"),  # no rate, no clock
        ({"sample_rate_hz": math.nan}, "sample_rate_hz"),  # NaN rate
        ({"window": 0}, "window"),  # empty window
        ({"window": 4.0}, "window"),  # float window: an int is required
        ({"hop": 0}, "hop"),  # a zero hop would never advance
        ({"channels": 0}, "channels"),
        ({"dtype": "complex64"}, "numeric dtype"),  # not a signal sample type
        ({"dtype": "nonsense"}, "not a numpy dtype"),
        ({"layout": "NHWC"}, "layout"),  # image layouts are not signal layouts
        ({"layout": "NT", "channels": 2}, "no channel axis"),  # 2 channels cannot be fed as [1, T]
        ({"prefill": 4}, "prefill"),  # prefill must leave room for a real sample in the first window
        ({"prefill": -1}, "prefill"),
        ({"gap_policy": "ignore"}, "gap_policy"),  # typo-proof: only the three policies
        ({"out_of_order_policy": "sort"}, "out_of_order_policy"),
        ({"max_gap_ms": -1.0}, "max_gap_ms"),
        ({"timestamp_tolerance_ms": math.inf}, "timestamp_tolerance_ms"),
        ({"max_buffer_samples": 3}, "must hold one window"),  # a window must fit
        ({"max_events": 0}, "max_events"),
    ],
)
def test_options_refuse_bad_values(kw, match):
    with pytest.raises(SignalConfigError, match=match):
        opts(**kw)
    assert issubclass(SignalConfigError, (EdgeSDKError, ValueError))


def test_options_derived_values():
    o = SignalStreamOptions(sample_rate_hz=16000, window=576, hop=512, prefill=64)
    assert (o.hop_samples, o.buffer_samples, o.window_shape()) == (512, 576, (1, 576))
    assert o.window_ms == pytest.approx(36.0) and o.hop_ms == pytest.approx(32.0)
    assert opts().hop_samples == 4  # hop defaults to the window
    assert opts(layout="NCT", channels=3).window_shape() == (1, 3, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.window = 3  # type: ignore[misc]


def test_binding_checks_model_against_options(tmp_path):
    ident = identity_model(tmp_path, [1, 4])
    with pytest.raises(SignalConfigError, match=r"options.dtype is float64, the model's input 'x' takes float32"):
        SignalStream(ident, opts(dtype="float64"))
    with pytest.raises(SignalConfigError, match=r"layout 'NT' has shape \(1, 5\).*expected dim 1 = 4"):
        SignalStream(ident, opts(window=5))
    with pytest.raises(SignalConfigError, match="model has no input 'sr'"):
        SignalStream(ident, opts(), constants={"sr": np.array(1, np.int64)})
    with pytest.raises(SignalConfigError, match="expected SignalStreamOptions"):
        SignalStream(ident, {"window": 4})  # type: ignore[arg-type]
    accm = accumulator_model(tmp_path, 4)
    with pytest.raises(SignalConfigError, match="'s' is a state input"):
        SignalStream(accm, opts(), constants={"s": np.zeros((1, 1), np.float32)})
    with pytest.raises(SignalConfigError, match=r"needs batch_axis on every \[\[state\]\] pair; acc4.s pair\(s\) \[.s<-sN.\] declare none"):
        StreamRouter(accm, opts(), batch_size=4)
    with pytest.raises(SignalConfigError, match="batches of at most 8"):
        StreamRouter(energy_model(tmp_path, 4), opts(), batch_size=9)
    with pytest.raises(SignalConfigError, match="batches of at most 1"):
        StreamRouter(ident, opts(), batch_size=2)  # fixed batch dim


def test_constants_are_validated_and_required(tmp_path, vad_model):
    o = SignalStreamOptions(sample_rate_hz=16000, window=576, hop=512, prefill=64)
    with pytest.raises(SignalConfigError, match=r"\['input', 'sr'\]; exactly one must take the signal"):
        SignalStream(vad_model, o)  # sr not given: the validator needs every input, rank 0 too
    with pytest.raises(SignalConfigError, match="expected dtype int64, got int32"):
        SignalStream(vad_model, o, constants={"sr": np.array(16000, np.int32)})
    with pytest.raises(SignalConfigError, match=r"expected rank 0 \[\], got shape \(1,\)"):
        SignalStream(vad_model, o, constants={"sr": np.array([16000], np.int64)})
    with pytest.raises(SignalConfigError, match=r"inputs \['sr'\] get neither the signal nor a constant"):
        SignalStream(vad_model, o, input_name="input")
    sr = np.array(16000, np.int64)
    st = SignalStream(vad_model, o, constants={"sr": sr})
    sr[...] = 8000  # the stream keeps its own read-only copy
    assert st.constants["sr"] == 16000 and not st.constants["sr"].flags.writeable
    assert st.input_name == "input" and st.stateful


# --- windows -------------------------------------------------------------------------------------


def expected_windows(x: np.ndarray, window: int, hop: int, prefill: int) -> list[list[float]]:
    padded = np.concatenate([np.zeros(prefill, np.float32), x])
    return [padded[s : s + window].tolist() for s in range(0, len(padded) - window + 1, hop)]


@pytest.mark.parametrize(
    "window, hop, prefill",
    [
        (4, 4, 0),  # back to back
        (4, 1, 0),  # overlapping by 3
        (4, 3, 2),  # overlapping, with left context
        (4, 7, 0),  # hop > window: 3 samples skipped between windows
        (4, 4, 3),  # Silero-like: context in front of each hop
    ],
)
@pytest.mark.parametrize("chunking", ["whole", "ones", "random", "with_empty"])
def test_windows_do_not_depend_on_chunking(tmp_path, window, hop, prefill, chunking):
    model = identity_model(tmp_path, [1, window])
    x = ramp(101, start=1)
    o = opts(window=window, hop=hop, prefill=prefill)
    rng = np.random.default_rng(window * 100 + hop)
    sizes = {
        "whole": [101],
        "ones": [1] * 101,
        "random": list(np.diff(np.r_[0, np.sort(rng.choice(np.arange(1, 101), 12, replace=False)), 101])),
        "with_empty": [0, 50, 0, 0, 51, 0],
    }[chunking]
    got, pos = [], 0
    with SignalStream(model, o) as st:
        for n in sizes:
            got += st.push(x[pos : pos + n], 1000.0 + pos)  # SR 1000: sample i is at 1000 + i ms
            pos += int(n)
        assert st.buffered_samples < window
        assert st.pop_events() == []
    assert windows(got) == expected_windows(x, window, hop, prefill)
    assert [w.index for w in got] == list(range(len(got)))
    assert [w.start_sample for w in got] == [k * hop - prefill for k in range(len(got))]
    assert [w.timestamp_ms for w in got] == [1000.0 + k * hop - prefill for k in range(len(got))]
    assert all(w.duration_ms == window and w.epoch == 0 and w.filled_samples == 0 for w in got)


def test_burst_of_10k_samples_keeps_the_buffer_bounded(tmp_path):
    model = energy_model(tmp_path, 512)
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    ref = [float(np.mean(x[s : s + 512].astype(np.float64) ** 2)) for s in range(0, 10_000 - 512 + 1, 256)]
    for cap in (None, 2048):
        with SignalStream(model, opts(window=512, hop=256, max_buffer_samples=cap)) as st:
            nbytes = st.nbytes
            assert nbytes == (cap or 512) * 4
            got = st.push(x, 0.0)
            assert st.nbytes == nbytes and st.buffered_samples < 512  # sized by options, not by input
            assert len(got) == (10_000 - 512) // 256 + 1 == 38
            np.testing.assert_allclose([float(w.outputs["y"][0, 0]) for w in got], ref, rtol=1e-5)
            more = st.push(x[:300], 10_000.0)  # continues seamlessly after the burst
            assert [w.start_sample for w in more] == [9728]  # 9728 + 512 <= 10300 < 9984 + 512


@pytest.mark.parametrize("layout, shape", [("NTC", [1, 4, 2]), ("NCT", [1, 2, 4]), ("TC", [4, 2]), ("CT", [2, 4])])
def test_multichannel_layouts(tmp_path, layout, shape):
    model = identity_model(tmp_path, shape)
    x = np.stack([ramp(8), -ramp(8)], axis=1)  # [8, 2]
    with SignalStream(model, opts(channels=2, layout=layout)) as st:
        got = st.push(x, 0.0)
    assert len(got) == 2
    for k, w in enumerate(got):
        win = x[4 * k : 4 * k + 4]
        want = {"NTC": win[None], "NCT": win.T[None], "TC": win, "CT": win.T}[layout]
        np.testing.assert_array_equal(w.outputs["y"], want)


def test_integer_pcm_stream(tmp_path):
    model = identity_model(tmp_path, [4], "int16")
    with SignalStream(model, opts(dtype="int16", layout="T")) as st:
        got = st.push(np.array([1, -2, 3, 32767, 5], np.int16), 0.0)
        with pytest.raises(SignalDTypeError, match="expected samples of dtype int16, got float32"):
            st.push(np.zeros(4, np.float32), 5.0)
    assert got[0].outputs["y"].tolist() == [1, -2, 3, 32767]


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "samples, err, match",
    [
        (np.zeros(8, np.float64), SignalDTypeError, r"expected samples of dtype float32, got float64 \(nothing is cast\)"),
        (np.zeros(8, np.int16), SignalDTypeError, "expected samples of dtype float32, got int16"),  # PCM into a float stream
        (np.zeros((8, 2), np.float32), SignalShapeError, r"expected 1 channel\(s\).*got shape \(8, 2\)"),  # stereo into mono
        (np.zeros((2, 4, 1), np.float32), SignalShapeError, r"got rank 3 shape \(2, 4, 1\)"),
        (np.zeros((), np.float32), SignalShapeError, "got rank 0"),
        ([0.0] * 8, InputTypeError, "expected samples as a numpy.ndarray of float32, got list"),
        (np.array([0, 1, np.nan, 3], np.float32), NonFiniteSignalError, "got 1 NaN/Inf of 4"),
        (np.array([np.inf, -np.inf, 0, 0], np.float32), NonFiniteSignalError, "got 2 NaN/Inf of 4"),
        (np.zeros(0, np.float64), SignalDTypeError, "got float64"),  # an empty push is still checked
    ],
)
def test_bad_samples_raise_typed_errors_and_change_nothing(tmp_path, samples, err, match):
    model = accumulator_model(tmp_path, 4)
    with SignalStream(model, opts(), stream_id="mic0") as st, SignalStream(model, opts()) as clean:
        first = st.push(np.ones(6, np.float32), 0.0)
        clean.push(np.ones(6, np.float32), 0.0)
        with pytest.raises(err, match=match) as info:
            st.push(samples, 6.0)
        assert "stream 'mic0'" in str(info.value)
        assert st.buffered_samples == 2 and st.pop_events() == []
        # The refused push left no trace: the stream continues exactly like one that never saw it.
        assert acc(st.push(np.ones(6, np.float32), 6.0)) == acc(clean.push(np.ones(6, np.float32), 6.0)) == [8.0, 12.0]
    assert acc(first) == [4.0]
    assert issubclass(SignalDTypeError, InputDTypeError) and issubclass(SignalShapeError, InputShapeError)
    assert issubclass(NonFiniteSignalError, NonFiniteInputError) and issubclass(TimestampError, InputError)


def test_multichannel_shape_errors(tmp_path):
    with SignalStream(identity_model(tmp_path, [1, 4, 2]), opts(channels=2, layout="NTC")) as st:
        with pytest.raises(SignalShapeError, match=r"expected samples of shape \[n, 2\] \(2 channels\), got shape \(8,\)"):
            st.push(np.zeros(8, np.float32), 0.0)
        with pytest.raises(SignalShapeError, match=r"expected 2 channel\(s\).*got shape \(8, 3\)"):
            st.push(np.zeros((8, 3), np.float32), 0.0)
        assert len(st.push(np.zeros((8, 2), np.float32)[::1], 0.0)) == 2
        assert len(st.push(np.zeros((2, 16), np.float32).T[:8], 8.0)) == 2  # non-contiguous input is copied in


@pytest.mark.parametrize("ts, err, match", [(math.nan, TimestampError, "finite timestamp_ms"), (math.inf, TimestampError, "finite"), ("0", InputTypeError, "got str"), (True, InputTypeError, "got bool")])
def test_bad_timestamps(tmp_path, ts, err, match):
    with SignalStream(identity_model(tmp_path, [1, 4]), opts()) as st:
        with pytest.raises(err, match=match):
            st.push(np.zeros(4, np.float32), ts)


# --- timestamps, gaps, order --------------------------------------------------------------------


def test_jitter_within_tolerance_is_ignored(tmp_path):
    model = identity_model(tmp_path, [1, 4])
    jitter = [0.0, 1.5, -1.9, 0.7, -0.2, 1.99]
    got = []
    with SignalStream(model, opts(timestamp_tolerance_ms=2.0)) as st:
        for k, j in enumerate(jitter):
            got += st.push(ramp(10, 10 * k), 10.0 * k + j)
        assert st.pop_events() == []
    assert windows(got) == expected_windows(ramp(60), 4, 4, 0)
    assert [w.timestamp_ms for w in got] == [4.0 * k for k in range(15)]  # the sample clock, not the jittery stamps


def test_clock_drift_beyond_tolerance_is_a_gap(tmp_path):
    """A device clock 2 % fast: the error grows 2 ms per 100 ms push until it exceeds the
    tolerance; then it is a gap (filled here), and the stream re-anchors."""
    model = identity_model(tmp_path, [1, 4])
    with SignalStream(model, opts(gap_policy="fill", timestamp_tolerance_ms=5.0)) as st:
        for k in range(10):
            st.push(np.ones(100, np.float32), k * 100 * 1.02)
        ev = st.pop_events()
    assert [(e.kind, e.action) for e in ev] == [("gap", "fill")] * 3
    assert [e.samples for e in ev] == [6, 6, 6]  # 3 pushes x 2 ms each time, at 1 sample per ms
    assert "expected timestamp 300.000 ms, got 306.000 ms" in ev[0].detail


def test_gap_reset(tmp_path):
    model = accumulator_model(tmp_path, 4)
    with SignalStream(model, opts(gap_policy="reset")) as st:
        assert acc(st.push(np.ones(6, np.float32), 0.0)) == [4.0]
        after = st.push(np.ones(8, np.float32), 56.0)  # 50 samples missing
        (ev,) = st.pop_events()
        assert (ev.kind, ev.action, ev.samples, ev.timestamp_ms) == ("gap", "reset", 50, 56.0)
        assert "expected timestamp 6.000 ms, got 56.000 ms" in ev.detail and "reset" in ev.detail
    # State restarted (4, 8 -- not 8, 12), the 2 buffered samples were dropped, the clock re-anchored.
    assert acc(after) == [4.0, 8.0]
    assert [(w.timestamp_ms, w.epoch, w.index) for w in after] == [(56.0, 1, 1), (60.0, 1, 2)]


def test_gap_fill(tmp_path):
    model = identity_model(tmp_path, [1, 4])
    with SignalStream(model, opts(gap_policy="fill", max_gap_ms=100.0)) as st:
        a = st.push(ramp(6, 1), 0.0)
        b = st.push(ramp(4, 11), 9.0)  # samples 6, 7, 8 missing -> zeros
        (ev,) = st.pop_events()
        c = st.push(ramp(2, 15), 13.0)
    assert (ev.kind, ev.action, ev.samples) == ("gap", "fill", 3)
    assert c == []  # 14, 15, 16 wait for a fourth sample
    assert windows(a + b + c) == [
        [1.0, 2.0, 3.0, 4.0],
        [5.0, 6.0, 0.0, 0.0],
        [0.0, 11.0, 12.0, 13.0],
    ]
    assert [w.filled_samples for w in a + b + c] == [0, 2, 1]
    assert [w.timestamp_ms for w in a + b + c] == [0.0, 4.0, 8.0]
    assert {w.epoch for w in a + b + c} == {0}  # filled: still continuous


def test_gap_fill_longer_than_max_gap_resets(tmp_path):
    model = accumulator_model(tmp_path, 4)
    with SignalStream(model, opts(gap_policy="fill", max_gap_ms=20.0)) as st:
        st.push(np.ones(4, np.float32), 0.0)
        got = st.push(np.ones(4, np.float32), 25.0)  # 21 ms missing > 20
        (ev,) = st.pop_events()
    assert (ev.kind, ev.action, ev.samples) == ("gap", "reset", 21)
    assert "longer than max_gap_ms=20" in ev.detail
    assert acc(got) == [4.0] and got[0].epoch == 1


def test_long_fill_is_done_through_the_fixed_buffer(tmp_path):
    model = energy_model(tmp_path, 512)
    with SignalStream(model, opts(window=512, gap_policy="fill", max_gap_ms=1e6)) as st:
        st.push(np.ones(100, np.float32), 0.0)
        got = st.push(np.ones(100, np.float32), 100_100.0)  # 100 000 samples missing
        assert st.nbytes == 512 * 4
        assert st.buffered_samples == 100_200 - 195 * 512  # the 100 new samples wait behind 260 zeros
    assert len(got) == (100 + 100_000 + 100) // 512 == 195
    assert [w.filled_samples for w in (got[0], got[1], got[-1])] == [412, 512, 512]
    assert float(got[0].outputs["y"][0, 0]) == pytest.approx(100 / 512)
    assert float(got[1].outputs["y"][0, 0]) == 0.0


def test_gap_error_leaves_stream_unchanged(tmp_path):
    model = accumulator_model(tmp_path, 4)
    with SignalStream(model, opts(gap_policy="error")) as st:
        st.push(np.ones(6, np.float32), 0.0)
        with pytest.raises(GapError, match=r"gap of 10.000 ms \(10 samples at 1000 Hz\).*expected timestamp 6.000 ms, got 16.000 ms.*reset\(\)"):
            st.push(np.ones(6, np.float32), 16.0)
        assert st.buffered_samples == 2 and st.expected_timestamp_ms() == 6.0
        assert acc(st.push(np.ones(2, np.float32), 6.0)) == [8.0]  # the on-time push continues
        with pytest.raises(GapError):
            st.push(np.ones(4, np.float32), 100.0)
        st.reset()  # ... or start over at the new time
        assert acc(st.push(np.ones(4, np.float32), 100.0)) == [4.0]
        assert [e.kind for e in st.pop_events()] == ["reset"]
    assert issubclass(GapError, TimestampError)


@pytest.mark.parametrize("policy", ["drop", "error"])
def test_out_of_order_and_duplicate(tmp_path, policy):
    model = accumulator_model(tmp_path, 4)
    with SignalStream(model, opts(out_of_order_policy=policy)) as st:
        st.push(np.ones(4, np.float32), 100.0)
        for ts, kind in ((50.0, "out_of_order"), (100.0, "duplicate")):
            if policy == "error":
                with pytest.raises(TimestampError, match=("goes back from" if kind == "out_of_order" else "repeats") + r" the previous push's 100.000 ms"):
                    st.push(np.ones(4, np.float32), ts)
            else:
                assert st.push(np.ones(4, np.float32), ts) == []
        ev = st.pop_events()
        assert acc(st.push(np.ones(4, np.float32), 104.0)) == [8.0]  # nothing of the bad pushes got in
    if policy == "drop":
        assert [(e.kind, e.action, e.samples) for e in ev] == [("out_of_order", "drop", 4), ("duplicate", "drop", 4)]
    else:
        assert ev == []


def test_overlap_drops_samples_already_seen(tmp_path):
    model = identity_model(tmp_path, [1, 4])
    with SignalStream(model, opts()) as st:
        a = st.push(ramp(6), 0.0)
        b = st.push(ramp(6, 3), 3.0)  # re-sends samples 3..5, then 6..8
        (ev,) = st.pop_events()
        c = st.push(ramp(4, 5), 5.0)  # samples 5..8: all already there
        (ev2,) = st.pop_events()
    assert (ev.kind, ev.action, ev.samples) == ("overlap", "drop", 3)
    assert (ev2.kind, ev2.samples) == ("overlap", 4)
    assert windows(a + b + c) == expected_windows(ramp(9), 4, 4, 0)
    with SignalStream(model, opts(out_of_order_policy="error")) as st:
        st.push(ramp(6), 0.0)
        with pytest.raises(TimestampError, match=r"overlaps 3.000 ms \(3 samples\)"):
            st.push(ramp(6, 3), 3.0)


def test_empty_push_does_not_touch_the_clock(tmp_path):
    with SignalStream(identity_model(tmp_path, [1, 4]), opts()) as st:
        assert st.push(np.zeros(0, np.float32), 500.0) == []
        assert st.expected_timestamp_ms() is None  # not anchored by an empty push
        st.push(ramp(4), 0.0)
        assert st.push(np.zeros((0, 1), np.float32), -7.0) == []  # no samples: no order to check
        assert st.pop_events() == []


def test_events_are_bounded(tmp_path):
    with SignalStream(identity_model(tmp_path, [1, 4]), opts(max_events=3)) as st:
        st.push(ramp(4), 100.0)
        for k in range(10):
            st.push(ramp(4), float(k))  # all out of order
        ev = st.events
        assert len(ev) == 3 and [e.timestamp_ms for e in ev] == [7.0, 8.0, 9.0]


def test_close_and_reset(tmp_path):
    model = accumulator_model(tmp_path, 4)
    st = SignalStream(model, opts(), stream_id=7)
    st.push(np.ones(6, np.float32), 0.0)
    st.reset()
    assert st.buffered_samples == 0 and st.epoch == 1 and st.expected_timestamp_ms() is None
    assert acc(st.push(np.ones(4, np.float32), 0.0)) == [4.0]  # clock forgotten: 0 ms is fine again
    st.close()
    st.close()  # idempotent
    assert st.closed and st.nbytes == 0
    with pytest.raises(StreamClosedError, match="stream 7 is closed"):
        st.push(np.ones(4, np.float32), 4.0)
    with pytest.raises(StreamClosedError):
        st.reset()
    assert not model.closed  # the model is the caller's


# --- the router -------------------------------------------------------------------------------


def test_router_keeps_state_per_stream_and_evicts_lru(tmp_path):
    model = accumulator_model(tmp_path, 4)
    r = StreamRouter(model, opts(), max_streams=3)
    one = np.ones(4, np.float32)
    assert acc(r.push("a", one, 0.0)) == [4.0]
    assert acc(r.push("b", 2 * one, 0.0)) == [8.0]
    assert acc(r.push("c", 3 * one, 0.0)) == [12.0]
    assert acc(r.push("a", one, 4.0)) == [8.0]  # a's own running sum
    assert r.stream_ids == ("b", "c", "a")
    assert acc(r.push("d", one, 0.0)) == [4.0]  # opens d, evicts b (least recently pushed)
    assert r.stream_ids == ("c", "a", "d") and len(r) == 3 and "b" not in r
    (ev,) = r.pop_events()
    assert (ev.kind, ev.action, ev.stream_id) == ("evicted", "close", "b") and "max_streams=3" in ev.detail
    assert acc(r.push("b", 2 * one, 4.0)) == [8.0]  # b again: a fresh stream, fresh state
    assert acc(r.push("c", 3 * one, 4.0)) == [12.0]  # c was evicted by b's return: fresh (not 24)
    assert [e.stream_id for e in r.pop_events()] == ["c", "a"]
    for i in range(1000):  # many ids: the router stays bounded
        r.push(("sensor", i), one, 0.0)
    assert len(r) == 3


def test_router_eviction_error(tmp_path):
    r = StreamRouter(accumulator_model(tmp_path, 4), opts(), max_streams=2, eviction="error")
    r.push(1, np.ones(4, np.float32), 0.0)
    r.push(2, np.ones(4, np.float32), 0.0)
    with pytest.raises(StreamLimitError, match="2 streams open, max_streams=2.*before opening 3"):
        r.push(3, np.ones(4, np.float32), 0.0)
    assert r.stream_ids == (1, 2)
    r.close(1)
    assert acc(r.push(3, np.ones(4, np.float32), 0.0)) == [4.0]
    with pytest.raises(SignalConfigError, match="eviction"):
        StreamRouter(accumulator_model(tmp_path, 4), opts(), eviction="fifo")


def test_router_duplicate_and_reused_ids(tmp_path):
    r = StreamRouter(accumulator_model(tmp_path, 4), opts(), max_streams=4)
    one = np.ones(4, np.float32)
    r.open("mic")
    with pytest.raises(DuplicateStreamError, match="'mic' is already open"):
        r.open("mic")
    assert acc(r.push("mic", one, 1000.0)) == [4.0]
    assert acc(r.push("mic", one, 1004.0)) == [8.0]
    assert r.close("mic") == [] and "mic" not in r
    assert r.close("mic") == [] and r.close("never-opened") == []  # closing twice / unknown: no error
    # Reused id: fresh state and a fresh clock (an earlier timestamp is no "out of order").
    assert acc(r.push("mic", one, 0.0)) == [4.0]
    assert r.pop_events() == []
    with pytest.raises(InputTypeError, match="stream_id must be hashable"):
        r.push(["mic"], one, 0.0)  # type: ignore[arg-type]
    r.reset("mic")
    assert acc(r.push("mic", one, 0.0)) == [4.0]
    with r:
        pass  # shutdown
    with pytest.raises(StreamClosedError, match="shut down"):
        r.push("mic", one, 4.0)
    assert r.shutdown() == []  # twice is fine


def test_router_stream_events_carry_ids(tmp_path):
    r = StreamRouter(identity_model(tmp_path, [1, 4]), opts(gap_policy="fill"), max_streams=4)
    r.push("x", ramp(4), 0.0)
    r.push("y", ramp(4), 0.0)
    r.push("y", ramp(4), 10.0)  # 6 ms gap on y only
    (ev,) = r.pop_events()
    assert (ev.stream_id, ev.kind, ev.samples) == ("y", "gap", 6)


# --- batching across streams (stateless) ---------------------------------------------------------------


def _interleaved_pushes(n_streams: int, total: int, seed: int):
    rng = np.random.default_rng(seed)
    data = {s: rng.standard_normal(total).astype(np.float32) * (s + 1) for s in range(n_streams)}
    cuts = {s: np.r_[0, np.sort(rng.choice(np.arange(1, total), 30, replace=False)), total] for s in range(n_streams)}
    order = [s for s in range(n_streams) for _ in range(len(cuts[s]) - 1)]
    rng.shuffle(order)
    k = dict.fromkeys(range(n_streams), 0)
    pushes = []
    for s in order:
        a, b = cuts[s][k[s]], cuts[s][k[s] + 1]
        k[s] += 1
        pushes.append((s, data[s][a:b], float(a)))
    return pushes


def _by_stream(results) -> dict:
    out: dict = {}
    for w in results:
        out.setdefault(w.stream_id, []).append((w.index, w.start_sample, w.timestamp_ms, w.outputs["y"].tobytes()))
    return out


def test_batching_equals_unbatched(tmp_path):
    model = energy_model(tmp_path, 64, max_batch=8)
    o = opts(window=64, hop=32)
    pushes = _interleaved_pushes(10, 2000, seed=5)
    plain = StreamRouter(model, o, max_streams=10)
    batched = StreamRouter(model, o, max_streams=10, batch_size=8, max_wait_ms=1e9)
    a, b = [], []
    for s, x, ts in pushes:
        a += plain.push(s, x, ts)
        b += batched.push(s, x, ts)
        assert batched.pending < 8
    b += batched.flush()
    assert batched.pending == 0
    assert _by_stream(a) == _by_stream(b)  # bitwise, in order per stream
    assert sum(len(v) for v in _by_stream(a).values()) == 10 * ((2000 - 64) // 32 + 1)
    assert {w.result.batch_size for w in a} == {1}
    assert max(w.result.batch_size for w in b) == 8


def test_batching_wait_is_bounded(tmp_path):
    now = [0.0]
    model = energy_model(tmp_path, 4)
    r = StreamRouter(model, opts(), max_streams=8, batch_size=4, max_wait_ms=20.0, clock=lambda: now[0])
    assert r.push("a", np.ones(4, np.float32), 0.0) == []  # queued: 1 of 4
    now[0] = 0.010
    assert r.push("b", np.ones(4, np.float32), 0.0) == [] and r.poll() == []  # 10 ms < 20 ms
    now[0] = 0.020
    got = r.poll()  # the oldest has waited 20 ms: run what is there
    assert [w.stream_id for w in got] == ["a", "b"] and r.pending == 0
    assert {w.result.batch_size for w in got} == {2}
    r.push("a", np.ones(4, np.float32), 4.0)
    now[0] = 0.045
    got = r.push("c", np.ones(4, np.float32), 0.0)  # a push also runs what is overdue (a waited 25 ms)
    assert [w.stream_id for w in got] == ["a", "c"]
    got = r.push("d", np.ones(12, np.float32), 0.0)  # 3 windows queued, then the 4th fills a batch ...
    assert got == [] and r.pending == 3
    got = r.push("e", np.ones(4, np.float32), 0.0)
    assert [w.stream_id for w in got] == ["d", "d", "d", "e"]  # ... and runs at once, no waiting
    r.push("f", np.ones(4, np.float32), 0.0)
    assert [w.stream_id for w in r.close("f")] == ["f"]  # closing runs what is queued
    zero = StreamRouter(model, opts(), max_streams=8, batch_size=4, max_wait_ms=0.0, clock=lambda: now[0])
    assert len(zero.push("a", np.ones(8, np.float32), 0.0)) == 2  # max_wait 0: never held back


# --- batching across streams (stateful) -----------------------------------------------------------------


def _rows(results, out: str = "y") -> dict:
    """Per stream, in order: everything a window result says (outputs bitwise)."""
    by: dict = {}
    for w in results:
        by.setdefault(w.stream_id, []).append(
            (w.index, w.start_sample, w.timestamp_ms, w.epoch, w.filled_samples)
            + tuple(w.outputs[k].tobytes() for k in sorted(w.outputs))
        )
    return by


def _batches(results) -> list[list]:
    """Results grouped per model call (the rows of one call share its Timings object)."""
    groups: list[list] = []
    for w in results:
        if groups and groups[-1][0].result.timings is w.result.timings:
            groups[-1].append(w)
        else:
            groups.append([w])
    return groups


def _script(n_streams: int, seed: int, total: int = 400, cuts: int = 25, gap_every: int = 7, reset_every: int = 5):
    """Interleaved pushes of random sizes (in stream order per stream, at random across
    streams), with a gap in some streams and a router.reset() in others, mid-stream:
    ("push", s, samples, ts) and ("reset", s)."""
    rng = np.random.default_rng(seed)
    per: dict[int, list] = {}
    for s in range(n_streams):
        x = (rng.integers(-8, 9, total)).astype(np.float32)  # small integers: exact sums
        c = np.r_[0, np.sort(rng.choice(np.arange(1, total), cuts, replace=False)), total]
        ops: list = []
        shift = 0.0
        for j in range(len(c) - 1):
            if s % gap_every == 1 and j == len(c) // 2:
                shift += 50.0  # a 50 ms gap
            if s % reset_every == 2 and j == len(c) // 3:
                ops.append(("reset", s))
                shift -= 10_000.0  # after reset() the clock is free again: start over earlier
            ops.append(("push", s, x[c[j] : c[j + 1]], 1000.0 + c[j] + shift))
        per[s] = ops
    order = [s for s in range(n_streams) for _ in per[s]]
    rng.shuffle(order)
    pos = dict.fromkeys(range(n_streams), 0)
    script = []
    for s in order:
        script.append(per[s][pos[s]])
        pos[s] += 1
    return script


def _play(router, script, poll_every: int = 0, clock: list | None = None) -> list:
    out = []
    for i, op in enumerate(script):
        if clock is not None:
            clock[0] += 0.001  # 1 ms per call
        if op[0] == "reset":
            router.reset(op[1])
        else:
            out += router.push(op[1], op[2], op[3])
        if poll_every and i % poll_every == 0:
            out += router.poll()
    return out + router.flush()


@pytest.mark.parametrize("batch_size, max_wait_ms", [(2, 1e9), (4, 5.0), (8, 1e9), (8, 0.0), (8, 3.0)])
def test_stateful_batching_equals_unbatched(tmp_path, batch_size, max_wait_ms):
    """Random chunk sizes, 13 interleaved streams, gaps (reset policy) and reset() calls while
    windows wait: every stream's windows and states are bitwise those of the unbatched router,
    and no call ever holds two windows of one stream."""
    model = batched_accumulator_model(tmp_path, 16, max_batch=8)
    o = opts(window=16, hop=12, prefill=3, gap_policy="reset")
    script = _script(13, seed=batch_size)
    plain = StreamRouter(model, o, max_streams=13, constants=GAIN)
    now = [0.0]
    batched = StreamRouter(model, o, max_streams=13, constants=GAIN, batch_size=batch_size, max_wait_ms=max_wait_ms, clock=lambda: now[0])
    a = _play(plain, script)
    b = _play(batched, script, poll_every=3, clock=now)
    assert batched.pending == 0
    assert _rows(a) == _rows(b)
    assert sum(len(v) for v in _rows(a).values()) > 13 * 25
    assert {w.epoch for w in a} == {0, 1}  # restarts happened (a gap or a reset() in some streams)
    assert any(e.kind == "gap" for e in plain.pop_events()) and any(e.kind == "gap" for e in batched.pop_events())
    groups = _batches(b)
    for g in groups:
        assert len({w.stream_id for w in g}) == len(g) <= batch_size  # one window per stream per call
        assert {w.result.batch_size for w in g} == {len(g)}
    if max_wait_ms > 0:
        assert max(len(g) for g in groups) == (batch_size if max_wait_ms > 1e6 else max(len(g) for g in groups)) > 1  # batches formed
    # the results are exact: gain x the running sum since the stream's last restart
    w = a[-1]
    assert w.outputs["sN"].shape == (2, 1, 1) and w.outputs["y"].shape == (1, 1)


def test_reset_and_gap_in_one_stream_leave_the_others_in_the_batch_alone(tmp_path):
    model = batched_accumulator_model(tmp_path, 4)
    one = np.ones(4, np.float32)
    r = StreamRouter(model, opts(gap_policy="reset"), max_streams=8, constants=GAIN, batch_size=4, max_wait_ms=1e9)

    def ys(results):
        return [(w.stream_id, w.epoch, float(w.outputs["y"][0, 0]), float(w.outputs["sN"][1, 0, 0])) for w in results]

    assert r.push("a", one, 0.0) == r.push("b", one, 0.0) == r.push("c", one, 0.0) == []
    got = r.push("d", one, 0.0)  # the 4th stream fills the batch
    assert ys(got) == [(k, 0, 8.0, 1.0) for k in "abcd"]  # 2 x 4, first window
    # Round 2: b's window is queued, then b is reset and pushes again (a new epoch); c has a gap.
    r.push("a", 2 * one, 4.0)
    r.push("b", 2 * one, 4.0)
    r.reset("b")  # b's queued window still runs with b's state (as unbatched, it would already have run)
    r.push("b", 3 * one, 0.0)  # after reset the clock starts over
    r.push("c", 2 * one, 104.0)  # 100 ms gap: c restarts (epoch 1)
    assert r.pending == 4  # a, b (epoch 0), b (epoch 1), c: 3 different streams
    got = r.push("d", 2 * one, 4.0)
    assert ys(got) == [("a", 0, 24.0, 2.0), ("b", 0, 24.0, 2.0), ("c", 1, 16.0, 1.0), ("d", 0, 24.0, 2.0)]
    assert r.pending == 1  # b's epoch-1 window waits: it needs the state of the one just run
    assert ys(r.flush()) == [("b", 1, 24.0, 1.0)]  # from the initial state: 2 x 12
    assert [(e.kind, e.stream_id) for e in r.pop_events()] == [("reset", "b"), ("gap", "c")]
    # The same pushes unbatched give the same numbers.
    u = StreamRouter(model, opts(gap_policy="reset"), max_streams=8, constants=GAIN)
    for k in "abcd":
        u.push(k, one, 0.0)
    seq = [u.push("a", 2 * one, 4.0), u.push("b", 2 * one, 4.0)]
    u.reset("b")
    seq += [u.push("b", 3 * one, 0.0), u.push("c", 2 * one, 104.0), u.push("d", 2 * one, 4.0)]
    assert sorted(ys([w for x in seq for w in x])) == sorted(ys(got) + [("b", 1, 24.0, 1.0)])


def test_close_and_evict_while_windows_are_queued(tmp_path):
    model = batched_accumulator_model(tmp_path, 4)
    one = np.ones(4, np.float32)
    r = StreamRouter(model, opts(), max_streams=3, constants=GAIN, batch_size=4, max_wait_ms=1e9)
    r.push("a", one, 0.0)
    r.push("b", one, 0.0)
    r.push("c", one, 0.0)
    assert r.pending == 3
    # Opening d evicts a (least recently pushed): a's queued window runs first, in a batch.
    got = r.push("d", one, 0.0)
    assert [(w.stream_id, float(w.outputs["y"][0, 0])) for w in got] == [("a", 8.0), ("b", 8.0), ("c", 8.0)]
    assert got[0].result.batch_size == 3
    assert r.stream_ids == ("b", "c", "d") and r.pending == 1
    (ev,) = r.pop_events()
    assert (ev.kind, ev.stream_id) == ("evicted", "a")
    # close(): every queued window runs first (d's), then b goes; b comes back fresh.
    r.push("b", one, 4.0)
    got = r.close("b")
    assert [(w.stream_id, float(w.outputs["y"][0, 0])) for w in got] == [("d", 8.0), ("b", 16.0)]
    assert "b" not in r and r.pending == 0
    r.push("b", one, 0.0)  # fresh stream: fresh state and clock
    assert [(w.stream_id, float(w.outputs["y"][0, 0])) for w in r.flush()] == [("b", 8.0)]
    # open() evicting a stream with queued windows: their results come with the next call's.
    r.push("c", 3 * one, 4.0)  # c: 8 + 24
    r.push("d", one, 4.0)
    r.push("b", one, 4.0)
    assert r.stream_ids == ("c", "d", "b") and r.pending == 3
    r.open("e")  # evicts c, whose window runs now, in a batch with the others queued
    assert r.pending == 0 and r.stream_ids == ("d", "b", "e")
    got = r.poll()
    assert [(w.stream_id, float(w.outputs["y"][0, 0]), w.result.batch_size) for w in got] == [("c", 32.0, 3), ("d", 16.0, 3), ("b", 16.0, 3)]
    assert [(e.kind, e.stream_id) for e in r.pop_events()] == [("evicted", "c")]
    # A stream closed directly while its window is queued: the window still runs (it was accepted).
    r.push("f", one, 0.0)  # (evicts d)
    r.stream("f").close()
    assert [(w.stream_id, float(w.outputs["y"][0, 0])) for w in r.flush()] == [("f", 8.0)]
    with pytest.raises(StreamClosedError):
        r.push("f", one, 4.0)
    # shutdown runs what is queued.
    r.push("e", one, 0.0)
    assert [(w.stream_id, float(w.outputs["y"][0, 0])) for w in r.shutdown()] == [("e", 8.0)]


def test_stateful_batching_wait_and_queue_are_bounded(tmp_path):
    now = [0.0]
    model = batched_accumulator_model(tmp_path, 4)
    one = np.ones(4, np.float32)
    r = StreamRouter(model, opts(), max_streams=8, constants=GAIN, batch_size=4, max_wait_ms=20.0, clock=lambda: now[0])
    assert r.push("a", np.ones(12, np.float32), 0.0) == []  # 3 windows of one stream: never one batch
    now[0] = 0.010
    assert r.push("b", one, 0.0) == [] and r.poll() == [] and r.pending == 4  # 10 ms < 20 ms
    now[0] = 0.020
    got = r.poll()  # a's oldest has waited 20 ms: batches run until nothing queued is that old
    assert [[(w.stream_id, float(w.outputs["y"][0, 0])) for w in g] for g in _batches(got)] == [
        [("a", 8.0), ("b", 8.0)],
        [("a", 16.0)],
        [("a", 24.0)],
    ]
    assert r.pending == 0
    # Overdue windows also run on push; b waited 25 ms here.
    r.push("b", one, 4.0)
    now[0] = 0.045
    got = r.push("c", one, 0.0)
    assert [(w.stream_id, w.result.batch_size) for w in got] == [("b", 2), ("c", 2)]
    # More than max_pending queued windows (default 4 x batch_size = 16): partial batches of the oldest run.
    got = r.push("d", np.ones(4 * 17, np.float32), 0.0)
    assert len(got) == 1 and got[0].index == 0 and r.pending == 16
    assert r.flush()[-1].index == 16
    small = StreamRouter(model, opts(), max_streams=8, constants=GAIN, batch_size=4, max_wait_ms=1e9, max_pending=5, clock=lambda: now[0])
    assert small.push("a", np.ones(8, np.float32), 0.0) == small.push("b", np.ones(8, np.float32), 0.0) == []
    got = small.push("c", np.ones(8, np.float32), 0.0)  # 6 queued > 5: the oldest window of each stream runs
    assert [(w.stream_id, w.index, w.result.batch_size) for w in got] == [("a", 0, 3), ("b", 0, 3), ("c", 0, 3)]
    assert small.pending == 3
    zero = StreamRouter(model, opts(), max_streams=8, constants=GAIN, batch_size=4, max_wait_ms=0.0, clock=lambda: now[0])
    assert [w.index for w in zero.push("a", np.ones(8, np.float32), 0.0)] == [0, 1]  # max_wait 0: never held back


def test_stateful_batching_config(tmp_path):
    model = batched_accumulator_model(tmp_path, 4, max_batch=8)
    with pytest.raises(SignalConfigError, match=r"input 'x' has dim 0 \(batch\) in \[1, 8\]: batches of at most 8"):
        StreamRouter(model, opts(), constants=GAIN, batch_size=16)
    with pytest.raises(SignalConfigError, match="needs batch_axis on every"):
        StreamRouter(batched_accumulator_model(tmp_path, 4, batch_axis=None), opts(), constants=GAIN, batch_size=2)
    with pytest.raises(SignalConfigError, match="max_pending: must be >= batch_size"):
        StreamRouter(model, opts(), constants=GAIN, batch_size=4, max_pending=3)
    r = StreamRouter(model, opts(), constants=GAIN, batch_size=8)
    r.open("mic")
    with pytest.raises(StreamRouterOwnedError, match=r"push through router.push\('mic'"):
        r.stream("mic").push(np.ones(4, np.float32), 0.0)
    assert isinstance(StreamRouterOwnedError("x"), (EdgeSDKError, RuntimeError))
    # Unbatched (batch_size 1) streams of a router still take direct pushes, as before.
    u = StreamRouter(model, opts(), constants=GAIN)
    assert [float(w.outputs["y"][0, 0]) for w in u.open("mic").push(np.ones(4, np.float32), 0.0)] == [8.0]

def test_stateless_model_with_a_constant_batches(tmp_path):
    """The constant (rank 0 here) is fed as it is, only the windows are stacked."""
    model = energy_model(tmp_path, 64, max_batch=8, gain=True)
    o = opts(window=64, hop=32)
    pushes = _interleaved_pushes(10, 2000, seed=6)
    plain = StreamRouter(model, o, max_streams=10, constants=GAIN)
    batched = StreamRouter(model, o, max_streams=10, constants=GAIN, batch_size=8, max_wait_ms=1e9)
    a, b = [], []
    for s, x, ts in pushes:
        a += plain.push(s, x, ts)
        b += batched.push(s, x, ts)
        assert batched.pending < 8
    b += batched.flush()
    assert _by_stream(a) == _by_stream(b)
    assert max(w.result.batch_size for w in b) == 8
    assert any(len({w.stream_id for w in g}) < len(g) for g in _batches(b))  # stateless: one stream may fill several rows


def test_manifest_state_batch_axis(tmp_path):
    from edge_sdk import _toml
    from edge_sdk.errors import ManifestError
    from edge_sdk.package import Manifest, StatePair

    assert StatePair("s", "sN").batch_axis is None  # the default: not batchable
    model = batched_accumulator_model(tmp_path, 4)
    d = model.manifest.to_dict()
    assert d["state"] == [{"input": "s", "output": "sN", "initial": 0.0, "batch_axis": 1}]
    text = model.manifest.to_toml()
    assert "batch_axis = 1" in text
    back = Manifest.from_dict(_toml.loads(text))
    assert back.state == (StatePair("s", "sN", 0.0, 1),) and back == model.manifest
    d = _toml.loads(text)
    old = batched_accumulator_model(tmp_path, 4, batch_axis=None).manifest
    assert old.to_dict()["state"] == [{"input": "s", "output": "sN", "initial": 0.0}]  # no key when unset
    assert Manifest.from_dict(_toml.loads(old.to_toml())).state[0].batch_axis is None
    for bad, match in [
        (3, r"batch_axis must be in \[0, 3\).*got 3"),
        (-1, r"batch_axis must be in \[0, 3\).*got -1"),
        (True, "expected int, got bool"),
        (1.0, "expected int, got float"),
    ]:
        d2 = dict(d, state=[dict(d["state"][0], batch_axis=bad)])
        with pytest.raises(ManifestError, match=match):
            Manifest.from_dict(d2)
    with pytest.raises(ManifestError, match=r"unknown key\(s\) \['batch'\]"):
        Manifest.from_dict(dict(d, state=[dict(d["state"][0], batch=1)]))


# --- the real model: 50 interleaved streams ------------------------------------------------------------


@pytest.fixture(scope="module")
def vad_model(tmp_path_factory):
    import test_vad_model as tv

    pkg = tv.build_vad_package(tmp_path_factory.mktemp("vad") / "pkg", tv.fp.fetch(tv.VAD))
    with tv.load_vad(pkg, tmp_path_factory.mktemp("vad-cache")) as m:
        yield m


def test_50_interleaved_vad_streams_equal_each_alone(vad_model):
    """Different mixes and offsets, random chunk sizes, pushes interleaved at random across
    streams: every stream's probabilities are bitwise those it gives alone."""
    import test_vad_model as tv

    rng = np.random.default_rng(50)
    n = 50
    mixes = []
    for s in range(n):
        lead = float(rng.uniform(0.1, 0.8))
        mixes.append(tv.mix([lead, int(s % 2), float(rng.uniform(0.1, 0.5))], noise=0.001 * (1 + s % 5), gain=float(rng.uniform(0.3, 1.0)), seed=s).audio)
    t0 = {s: float(rng.uniform(0, 1e6)) for s in range(n)}  # each stream on its own clock

    alone = {}
    for s in range(n):
        with SignalStream(vad_model, tv.VAD_OPTIONS, constants=tv.VAD_CONSTANTS, stream_id=s) as st:
            alone[s] = [(w.index, w.start_sample, w.outputs["output"].tobytes()) for w in st.push(mixes[s], t0[s])]

    router = StreamRouter(vad_model, tv.VAD_OPTIONS, max_streams=n, eviction="error", constants=tv.VAD_CONSTANTS)
    pos = dict.fromkeys(range(n), 0)
    live = list(range(n))
    together: dict[int, list] = {s: [] for s in range(n)}
    while live:
        s = live[int(rng.integers(len(live)))]
        k = int(rng.choice([1, 7, 300, 512, 513, 1500, 4000]))
        x = mixes[s][pos[s] : pos[s] + k]
        for w in router.push(s, x, t0[s] + pos[s] * 1000.0 / tv.SR):
            assert w.stream_id == s
            together[s].append((w.index, w.start_sample, w.outputs["output"].tobytes()))
        pos[s] += len(x)
        if pos[s] >= len(mixes[s]):
            live.remove(s)
    assert router.pop_events() == []
    for s in range(n):
        assert together[s] == alone[s], f"stream {s} differs when interleaved"
    assert sum(len(v) for v in alone.values()) > 50 * 40
    # And the probabilities really differ between streams (otherwise the test proves nothing).
    assert len({alone[s][20][2] for s in range(n)}) > 40


@pytest.fixture(scope="module")
def vad_script():
    """70 streams of speech mixes on their own clocks, pushed interleaved at random in chunks
    of random sizes; a 200 ms gap (reset policy) in some streams and a reset() in others,
    mid-stream. With the unbatched router's results per stream (bitwise)."""
    import test_vad_model as tv

    rng = np.random.default_rng(70)
    n = 70
    per: dict[int, list] = {}
    for s in range(n):
        audio = tv.mix([float(rng.uniform(0.1, 0.6)), int(s % 2), float(rng.uniform(0.1, 0.4))], noise=0.001 * (1 + s % 5), gain=float(rng.uniform(0.3, 1.0)), seed=s).audio
        t0 = float(rng.uniform(0, 1e6))
        ops: list = []
        pos = 0
        while pos < len(audio):
            k = int(rng.choice([1, 7, 300, 512, 513, 1500, 4000]))
            if s % 9 == 4 and pos > len(audio) // 2 and not any(op[0] == "gap" for op in ops):
                ops.append(("gap", s))
                t0 += 200.0
            if s % 11 == 5 and pos > len(audio) // 3 and not any(op[0] == "reset" for op in ops):
                ops.append(("reset", s))
                t0 -= 1e7  # the clock is forgotten on reset: any timestamp starts it again
            ops.append(("push", s, audio[pos : pos + k], t0 + pos * 1000.0 / tv.SR))
            pos += k
        per[s] = [op for op in ops if op[0] != "gap"]
    order = [s for s in range(n) for _ in per[s]]
    rng.shuffle(order)
    idx = dict.fromkeys(range(n), 0)
    script = []
    for s in order:
        script.append(per[s][idx[s]])
        idx[s] += 1
    return script


def _vad_rows(results) -> dict:
    by: dict = {}
    for w in results:
        by.setdefault(w.stream_id, []).append((w.index, w.start_sample, w.timestamp_ms, w.epoch, w.outputs["output"].tobytes(), w.outputs["stateN"].tobytes()))
    return by


def _play_vad(router, script, clock=None) -> list:
    out = []
    for i, op in enumerate(script):
        if clock is not None:
            clock[0] += 0.00025  # 0.25 ms per call
        if op[0] == "reset":
            router.reset(op[1])
        else:
            out += router.push(op[1], op[2], op[3])
        if clock is not None and i % 5 == 0:
            out += router.poll()
    return out + router.flush()


@pytest.fixture(scope="module")
def vad_unbatched(vad_model, vad_script) -> dict:
    import test_vad_model as tv

    plain = StreamRouter(vad_model, tv.VAD_OPTIONS, max_streams=70, eviction="error", constants=tv.VAD_CONSTANTS)
    return _vad_rows(_play_vad(plain, vad_script))


@pytest.mark.parametrize("batch_size, max_wait_ms, max_pending", [(8, 5.0, None), (32, 20.0, None), (64, 1e9, 1024)])
def test_batched_vad_streams_equal_unbatched(vad_model, vad_script, vad_unbatched, batch_size, max_wait_ms, max_pending):
    """Silero VAD, 70 interleaved streams with random chunk sizes, gaps and resets: batched
    (one call for up to batch_size streams, each stream's LSTM state stacked on axis 1 and
    split back) gives every stream bitwise the probabilities and states it gets unbatched."""
    import test_vad_model as tv

    ref = vad_unbatched
    now = [0.0]
    batched = StreamRouter(
        vad_model,
        tv.VAD_OPTIONS,
        max_streams=70,
        eviction="error",
        constants=tv.VAD_CONSTANTS,
        batch_size=batch_size,
        max_wait_ms=max_wait_ms,
        max_pending=max_pending,
        clock=lambda: now[0],
    )
    got = _play_vad(batched, vad_script, now)
    assert _vad_rows(got) == ref
    assert len(ref) == 70 and sum(len(v) for v in ref.values()) > 70 * 40
    assert {r[3] for v in ref.values() for r in v} == {0, 1, 2}  # gaps and resets happened (stream 49: both)
    ev = [(e.kind, e.action) for e in batched.pop_events()]
    assert ev.count(("gap", "reset")) == 8 and ev.count(("reset", "reset")) == 6  # streams 4, 13, ..., 67; 5, 16, ..., 60
    sizes = [len(g) for g in _batches(got)]
    for g in _batches(got):
        assert len({w.stream_id for w in g}) == len(g)  # never two windows of one stream in a call
    assert max(sizes) == batch_size and sum(sizes) / len(sizes) > batch_size / 4, sizes


# --- the steady-state push (fast path) --------------------------------------------------


def _steady_script(rng, window: int, hop: int, channels: int, n: int = 160) -> list:
    """Pushes that are mostly steady (exactly ``hop`` samples continuing the clock, jitter within
    the tolerance), broken now and then by what the general path handles: two pushes of other sizes
    (hop x 2 in all, so the steady state can come back), a gap or overlap of ``hop`` samples, a
    repeat, a timestamp going back, NaN, [n, 1] / strided / int-timestamp pushes, reset()."""
    ops: list = []
    ts = 100.0  # SR 1000: 1 sample per ms
    sizes: list[int] = []
    for _ in range(n):
        if not sizes:
            a = int(rng.integers(0, 2 * hop + 1))
            sizes = [a, 2 * hop - a] if rng.random() < 0.1 else [hop]
        size = sizes.pop(0)
        x = rng.standard_normal((size, channels)).astype(np.float32)
        if channels == 1 and rng.random() < 0.7:
            x = x[:, 0]  # mono as [n]; else [n, 1]
        if rng.random() < 0.1:
            x = np.repeat(x, 2, axis=0)[::2]  # strided (not contiguous)
        stamp: Any = ts + float(rng.uniform(-0.9, 0.9))  # jitter: the clock anchors on one, so twice it is within the 2 ms tolerance
        k = rng.random()
        if k < 0.04:
            stamp = ts + hop  # gap (fill or reset per policy)
            ts += hop
        elif k < 0.07 and size >= hop:
            stamp = ts - hop  # overlap: the first hop samples are dropped
            ts -= hop
        elif k < 0.09:
            stamp = ts - 1000.0  # goes back: dropped
            ts -= size
        elif k < 0.11:
            stamp = int(ts)  # an int timestamp
        if rng.random() < 0.03 and size:
            x = x.copy()
            x[size // 2] = np.nan  # refused
            ts -= size
        if rng.random() < 0.02:
            ops.append(("reset",))
        ops.append(("push", x, stamp))
        ts += size
    return ops


def _run_stream(st, ops) -> list:
    out: list = []
    for op in ops:
        if op[0] == "reset":
            st.reset()
            continue
        try:
            got = st.push(op[1], op[2])
        except EdgeSDKError as e:
            out.append(("error", type(e).__name__, str(e)))
            continue
        out.append(("ok", st.buffered_samples, st.expected_timestamp_ms()))
        out += [(w.index, w.start_sample, w.timestamp_ms, w.duration_ms, w.epoch, w.filled_samples, w.outputs["y"].shape, w.outputs["y"].tobytes()) for w in got]
    return out + [tuple(e) for e in st.pop_events()]


@pytest.mark.parametrize(
    "window, hop, prefill, channels, layout, shape, gap_policy",
    [
        (12, 8, 4, 1, "NT", [1, 12], "reset"),  # Silero-like: context + hop
        (12, 8, 4, 1, "NT", [1, 12], "fill"),  # zero-filled windows leave the steady state until they are gone
        (8, 8, 0, 1, "T", [8], "fill"),  # back to back
        (8, 3, 2, 1, "NT", [1, 8], "reset"),  # overlap larger than the hop
        (8, 11, 0, 1, "NT", [1, 8], "reset"),  # hop > window: never steady
        (6, 4, 2, 2, "NTC", [1, 6, 2], "fill"),
        (6, 4, 2, 2, "NCT", [1, 2, 6], "reset"),
        (6, 6, 1, 2, "CT", [2, 6], "reset"),
    ],
)
def test_steady_path_equals_general_path(tmp_path, window, hop, prefill, channels, layout, shape, gap_policy):
    """Random push sequences, mostly steady: a stream whose fast path is switched off gives exactly
    the same windows (bitwise), timestamps, events, errors, buffer and clock."""
    model = identity_model(tmp_path, shape)
    o = opts(window=window, hop=hop, prefill=prefill, channels=channels, layout=layout, gap_policy=gap_policy)
    ops = _steady_script(np.random.default_rng(window * 7 + hop + channels), window, hop, channels)
    fast, general = SignalStream(model, o, stream_id="s"), SignalStream(model, o, stream_id="s")
    general._framer.push_steady = lambda *a, **k: None  # type: ignore[method-assign]
    taken = []
    steady = fast._framer.push_steady

    def counting(*a: Any, **k: Any) -> Any:
        f = steady(*a, **k)
        taken.append(f is not None)
        return f

    fast._framer.push_steady = counting  # type: ignore[method-assign]
    a, b = _run_stream(fast, ops), _run_stream(general, ops)
    assert a == b
    assert any(r[0] == "error" for r in a) and sum(len(r) == 8 for r in a) > 50
    if hop <= window:
        assert sum(taken) > len(taken) // 4  # the fast path did much of the work
    else:
        assert not any(taken)


def test_steady_windows_are_the_signal_cut_by_hand(tmp_path):
    """Silero's framing (64 context + 512 new samples): every window is the signal's samples
    [512 k - 64, 512 k + 512), zeros before the start, whatever path cut it."""
    model = identity_model(tmp_path, [1, 576])
    o = SignalStreamOptions(sample_rate_hz=16000, window=576, hop=512, prefill=64)
    x = np.random.default_rng(3).standard_normal(512 * 40).astype(np.float32)
    with SignalStream(model, o) as st:
        got = [w for k in range(40) for w in st.push(x[512 * k : 512 * (k + 1)], k * 32.0)]
    padded = np.concatenate([np.zeros(64, np.float32), x])
    assert len(got) == 40
    for k, w in enumerate(got):
        assert w.outputs["y"].tobytes() == padded[512 * k : 512 * k + 576][None].tobytes()
        assert (w.start_sample, w.timestamp_ms) == (512 * k - 64, k * 32.0 - 4.0)


def test_finiteness_check_never_warns(tmp_path):
    """Huge finite samples (a float32 sum of squares overflows) are accepted without any warning or
    FloatingPointError; NaN/Inf are refused, in every size and float dtype the check handles."""
    import warnings

    from edge_sdk.streams.signal import _finite

    for dtype in (np.float16, np.float32, np.float64):
        for n in (3, 64, 65, 512, 70_000):
            big = np.full(n, np.finfo(dtype).max / 2, dtype)
            with warnings.catch_warnings(), np.errstate(all="raise"):
                warnings.simplefilter("error")
                assert _finite(big) and _finite(-big) and _finite(np.zeros(n, dtype))
                for bad in (np.nan, np.inf, -np.inf):
                    y = big.copy()
                    y[n // 2] = bad
                    assert not _finite(y), (dtype, n, bad)
                pm = np.zeros(n, dtype)
                pm[0], pm[-1] = np.inf, -np.inf
                assert not _finite(pm)
    model = identity_model(tmp_path, [1, 512])
    with SignalStream(model, opts(window=512)) as st, warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        assert len(st.push(np.full(512, 1e30, np.float32), 0.0)) == 1  # steady path off: first push
        assert len(st.push(np.full(512, -1e30, np.float32), 512.0)) == 1  # steady path
        with pytest.raises(NonFiniteSignalError, match="got 1 NaN/Inf of 512"):
            st.push(np.r_[np.full(511, 1e30, np.float32), np.float32(np.inf)], 1024.0)
