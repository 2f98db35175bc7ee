"""StreamRouter.push_block: one chunk for many streams per call, the same windows, states and
results as a push() per chunk followed by flush(), on real ONNX Runtime sessions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_sdk.errors import InputTypeError
from edge_sdk.streams import (
    BlockPushError,
    DuplicateStreamError,
    NonFiniteSignalError,
    SignalDTypeError,
    SignalShapeError,
    StreamRouter,
    TimestampError,
    WindowBlock,
)
from tests.test_streams import (  # vad_model: the module-scoped Silero fixture, used by name
    GAIN,
    _package,
    batched_accumulator_model,
    energy_model,
    identity_model,
    opts,
    vad_model,  # noqa: F401
)


def _key(w) -> tuple:
    return (w.index, w.start_sample, w.timestamp_ms, w.duration_ms, w.epoch, w.filled_samples, tuple((k, v.shape, v.tobytes()) for k, v in sorted(w.outputs.items())))


def _by_stream(results) -> dict:
    out: dict = {}
    for w in results:
        out.setdefault(w.stream_id, []).append(_key(w))
    return out


def _events(router) -> dict:
    out: dict = {}
    for e in router.pop_events():
        out.setdefault(e.stream_id, []).append(tuple(e))
    return out


def _block_script(rng, n_streams: int, rounds: int, hop: int, channels: int) -> list:
    """Blocks of chunks (mostly ``hop`` samples, clock-true; some jitter, gaps, repeats, NaN, other
    lengths), with router calls between them: push, reset, close, expected_timestamp_ms."""
    clock = dict.fromkeys(range(n_streams), 1000.0)
    ops: list = []
    for _ in range(rounds):
        members = [s for s in range(n_streams) if rng.random() < 0.85]
        if rng.random() < 0.5:
            rng.shuffle(members)
        n = hop if rng.random() < 0.85 else int(rng.choice([hop - 1, 2 * hop, hop + 3]))
        shape = (len(members), n) if channels == 1 else (len(members), n, channels)
        x = rng.integers(-8, 9, shape).astype(np.float32)  # small integers: exact sums
        ts = []
        for i, s in enumerate(members):
            t = clock[s]
            u = rng.random()
            if u < 0.05:
                t += 40.0  # a gap
            elif u < 0.08:
                t -= 1.0 * n  # a repeat: dropped
            elif u < 0.16:
                t += float(rng.choice([-1.5, 1.5]))  # jitter within the 2 ms tolerance
            elif u < 0.19:
                x[i] = np.nan  # refused alone
            ts.append(t)
            clock[s] = max(clock[s], t) + n
        ops.append(("block", members, x, ts))
        if rng.random() < 0.3:
            s = int(rng.integers(n_streams))
            k = int(rng.choice([hop, hop - 2, 3]))
            y = rng.integers(-8, 9, (k,) if channels == 1 else (k, channels)).astype(np.float32)
            ops.append(("push", s, y, clock[s]))
            clock[s] += k
        if rng.random() < 0.1:
            ops.append(("reset", int(rng.integers(n_streams))))
        if rng.random() < 0.06:
            s = int(rng.integers(n_streams))
            ops.append(("close", s))
            clock[s] += 5000.0  # a reopened stream anchors afresh
        if rng.random() < 0.15:
            ops.append(("expected", int(rng.integers(n_streams))))
    return ops


def _play(router, ops, *, block: bool) -> tuple[list, dict, list]:
    """Run ``ops``: push_block per block (``block``), or push() per chunk then flush().
    Returns the results, each refused chunk's error type (by block and stream) and what the
    inspections read."""
    out: list = []
    errs: dict = {}
    seen: list = []
    for i, op in enumerate(ops):
        if op[0] == "block":
            _, members, x, ts = op
            if block:
                try:
                    got = router.push_block(members, x, ts)
                except BlockPushError as e:
                    got = e.results
                    errs.update({(i, s): type(err).__name__ for s, err in e.errors.items()})
                assert isinstance(got, WindowBlock)
                assert len(got) == len(got.stream_ids) == len(got.position) == sum(r.batch_size for r in got.results)
                for pos, sid in zip(got.position.tolist(), got.stream_ids):  # each row names the chunk that made it
                    assert members[pos] == sid if pos >= 0 else sid not in members
                out += got.windows()
            else:
                for j, s in enumerate(members):
                    try:
                        out += router.push(s, x[j], ts[j])
                    except Exception as e:
                        errs[(i, s)] = type(e).__name__
                out += router.flush()
        elif op[0] == "push":
            out += router.push(op[1], op[2], op[3])
        elif op[0] == "reset":
            if op[1] in router:
                router.reset(op[1])
        elif op[0] == "close":
            out += router.close(op[1])
        else:
            seen.append((op[1], router.stream(op[1]).expected_timestamp_ms() if op[1] in router else None))
    out += router.flush()
    for s in router.stream_ids:
        seen.append((s, router.stream(s).expected_timestamp_ms(), router.stream(s).buffered_samples, router.stream(s).epoch))
    return out, errs, seen


CASES = [
    # (model, options, batch sizes): stateful batched, stateless batched, unbatched layouts
    ("acc", dict(window=16, hop=12, prefill=4), (1, 3, 8)),
    ("acc", dict(window=12, hop=4, prefill=8, gap_policy="fill"), (1, 4)),
    ("energy", dict(window=8, hop=8), (1, 3)),
    ("energy", dict(window=8, hop=4, prefill=4, timestamp_tolerance_ms=10.0), (1, 3)),  # a repeat is within the tolerance
    ("identity-NT", dict(window=6, hop=4, prefill=2, gap_policy="fill"), (1,)),
    ("identity-NTC", dict(window=6, hop=4, prefill=2, channels=2, layout="NTC"), (1,)),
    ("identity-NCT", dict(window=6, hop=4, prefill=2, channels=2, layout="NCT"), (1,)),  # not cut as a block: push()'s path
]


@pytest.mark.parametrize("kind, kw, batch_sizes", CASES, ids=[f"{c[0]}-{c[1]['window']}-{c[1]['hop']}" for c in CASES])
def test_push_block_equals_a_push_per_chunk(tmp_path, kind, kw, batch_sizes):
    """Random block scripts (jitter, gaps, repeats, NaN chunks, other chunk lengths, streams that
    appear, reset, close and are pushed alone between blocks): every stream's windows (bitwise
    outputs, indices, clocks, epochs, fill), events, refused chunks and clocks are those of a
    router pushed one chunk at a time."""
    channels = kw.get("channels", 1)
    if kind == "acc":
        model, consts = batched_accumulator_model(tmp_path, kw["window"], max_batch=8), GAIN
    elif kind == "energy":
        model, consts = energy_model(tmp_path, kw["window"], max_batch=8), None
    else:
        layout = kind.split("-")[1]
        shape = {"NT": [1, kw["window"]], "NTC": [1, kw["window"], channels], "NCT": [1, channels, kw["window"]]}[layout]
        model, consts = identity_model(tmp_path, shape), None
    o = opts(**kw)
    ops = _block_script(np.random.default_rng(len(kind) * 31 + kw["hop"]), 11, 60, o.hop_samples, channels)
    for bs in batch_sizes:
        ref = StreamRouter(model, o, max_streams=16, constants=consts, batch_size=bs, max_wait_ms=1e9)
        blk = StreamRouter(model, o, max_streams=16, constants=consts, batch_size=bs, max_wait_ms=1e9)
        a, errs_a, seen_a = _play(ref, ops, block=False)
        b, errs_b, seen_b = _play(blk, ops, block=True)
        assert _by_stream(a) == _by_stream(b)
        assert errs_a == errs_b and "NonFiniteSignalError" in errs_a.values()
        assert seen_a == seen_b
        assert _events(ref) == _events(blk)
        assert len(a) > 300
        assert {w.epoch for w in a} >= {0, 1}  # restarts happened


def test_steady_streams_are_cut_as_one_block(tmp_path):
    """After its first chunk a steady stream is in block mode: later blocks cut every chunk
    together, batches run straight from the block (full ones, then the rest), states stay per
    stream, and the results are the running sums of each stream alone."""
    model = batched_accumulator_model(tmp_path, 16, max_batch=8)
    o = opts(window=16, hop=12, prefill=4)
    rt = StreamRouter(model, o, max_streams=100, constants=GAIN, batch_size=8)
    ids = [f"s{i}" for i in range(70)]  # beyond the slab's first 64 rows: it grows
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 9, (5, 70, 12)).astype(np.float32)
    sums = np.zeros(70)
    for r in range(5):
        blk = rt.push_block(ids, x[r], [1000.0 + 12 * r] * 70)
        assert blk.stream_ids == tuple(ids) and blk.index.tolist() == [r] * 70 and blk.position.tolist() == list(range(70))
        if r:  # block mode: 9 calls of at most 8 windows, in block order
            assert [res.batch_size for res in blk.results] == [8] * 8 + [6]
        window_sums = np.concatenate([np.zeros((70, 4)) if r == 0 else x[r - 1][:, -4:], x[r]], axis=1).sum(axis=1)
        sums += 2.0 * window_sums
        assert np.array_equal(blk.outputs["y"][:, 0, 0], sums.astype(np.float32))
        assert blk.outputs["sN"].shape == (70, 2, 1, 1) and blk.outputs["y"].shape == (70, 1, 1)
        assert np.array_equal(blk.timestamp_ms, np.full(70, 1000.0 + 12 * r - 4))
        assert [w.outputs["y"][0, 0] for w in blk.windows()] == list(sums.astype(np.float32))
    assert all(rt.stream(i)._in_block for i in ids)
    # a stream pushed alone leaves block mode with its clock; it rejoins after its next block chunk
    rt.push("s3", x[0][3], 1000.0 + 12 * 5)
    assert not rt.stream("s3")._in_block and rt.stream("s3").expected_timestamp_ms() == 1000.0 + 12 * 6
    rt.flush()
    rt.push_block(ids, x[1], [1000.0 + 12 * 6 if i == "s3" else 1000.0 + 12 * 5 for i in ids])
    assert rt.stream("s3")._in_block


def test_block_mode_checks_each_clock(tmp_path):
    """Streams in block mode: a repeat within a wide tolerance is a duplicate (dropped), jitter is
    ignored, a gap resets, and the three land in one block beside a steady stream."""
    model = energy_model(tmp_path, 8, max_batch=8)
    rt = StreamRouter(model, opts(window=8, hop=4, prefill=4, timestamp_tolerance_ms=10.0), batch_size=4)
    ids = ["dup", "jit", "gap", "ok"]
    for r in range(3):
        rt.push_block(ids, np.ones((4, 4), np.float32), [4.0 * r] * 4)
    assert all(rt.stream(i)._in_block for i in ids)
    blk = rt.push_block(ids, np.full((4, 4), 2.0, np.float32), [8.0, 12.0 + 3.0, 12.0 + 50.0, 12.0])
    assert sorted(blk.stream_ids) == ["gap", "jit", "ok"]
    assert [(e.kind, e.stream_id) for e in rt.pop_events()] == [("duplicate", "dup"), ("gap", "gap")]
    by = dict(zip(blk.stream_ids, blk.epoch.tolist()))
    assert by == {"jit": 0, "ok": 0, "gap": 1}
    assert rt.stream("dup").expected_timestamp_ms() == 12.0 and rt.stream("jit").expected_timestamp_ms() == 16.0


def test_block_arguments_are_checked_before_anything_is_accepted(tmp_path):
    model = energy_model(tmp_path, 8)
    rt = StreamRouter(model, opts(window=8), batch_size=4)
    good = np.zeros((2, 8), np.float32)
    cases: list[tuple[Any, type, str]] = [
        (("ab", good, [0.0, 0.0]), InputTypeError, "stream_ids as a list or tuple"),
        ((["a", "b"], good.tolist(), [0.0, 0.0]), InputTypeError, "numpy.ndarray"),
        ((["a", "b"], good.astype(np.float64), [0.0, 0.0]), SignalDTypeError, "dtype float32, got float64"),
        ((["a", "b"], np.zeros((3, 8), np.float32), [0.0, 0.0, 0.0]), SignalShapeError, r"\[k=2, n\]"),
        ((["a", "b"], np.zeros((2, 8, 2), np.float32), [0.0, 0.0]), SignalShapeError, r"got shape \(2, 8, 2\)"),
        ((["a", "b"], good, [0.0]), SignalShapeError, "2 timestamps"),
        ((["a", "b"], good, [0.0, True]), InputTypeError, "bool"),
        ((["a", "b"], good, [0.0, "1"]), InputTypeError, "str"),
        ((["a", "b"], good, np.array(["0", "1"])), InputTypeError, "numbers"),
        ((["a", "b"], good, 0.0), InputTypeError, "timestamps_ms as a list"),
        ((["a", ["b"]], good, [0.0, 0.0]), InputTypeError, "hashable"),
        ((["a", "a"], good, [0.0, 8.0]), DuplicateStreamError, "'a' appears twice"),
    ]
    for args, err, match in cases:
        with pytest.raises(err, match=match):
            rt.push_block(*args)
    assert len(rt) == 0 and rt.pending == 0  # nothing was accepted
    blk = rt.push_block(("a", "b"), good, np.array([0, 0]))  # a tuple of ids, integer timestamps
    assert len(blk) == 2 and blk.stream_ids == ("a", "b")
    blk = rt.push_block(["a", "b"], np.ones((2, 8, 1), np.float32), [8.0, 8.0])  # mono as [k, n, 1], as push() takes [n, 1]
    assert blk.outputs["y"][:, 0, 0].tolist() == [1.0, 1.0] and rt.stream("a")._in_block


def test_refused_chunks_leave_the_rest_pushed(tmp_path):
    """NaN samples and a non-finite timestamp refuse their own chunk; a gap with gap_policy "error"
    refuses its stream's; the other chunks run, and BlockPushError carries both."""
    model = batched_accumulator_model(tmp_path, 8, max_batch=8)
    rt = StreamRouter(model, opts(window=8, gap_policy="error"), constants=GAIN, batch_size=4)
    ids = ["a", "b", "c", "d", "e"]
    rt.push_block(ids, np.ones((5, 8), np.float32), [0.0] * 5)
    x = np.ones((5, 8), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(BlockPushError, match=r"3 of 5 chunks refused or their call failed") as ei:
        rt.push_block(ids, x, [8.0, 8.0, float("inf"), 100.0, 8.0])
    e = ei.value
    assert {k: type(v) for k, v in e.errors.items()} == {"b": NonFiniteSignalError, "c": TimestampError, "d": type(e.errors["d"])}
    assert type(e.errors["d"]).__name__ == "GapError"
    assert e.results.stream_ids == ("a", "e") and e.results.outputs["y"][:, 0, 0].tolist() == [32.0, 32.0]
    assert rt.stream("b").expected_timestamp_ms() == 8.0  # refused: its clock did not move
    blk = rt.push_block(["b", "c", "d"], np.ones((3, 8), np.float32), [8.0, 8.0, 8.0])
    assert blk.outputs["y"][:, 0, 0].tolist() == [32.0] * 3


def test_a_failing_call_loses_only_its_windows(tmp_path):
    """A model whose output has too few rows for batches of more than 2 windows: those calls fail
    (SignalConfigError, per chunk in BlockPushError), the call of 1 runs, and the next block still
    works for every stream."""
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("Slice", ["x", "st", "en"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.array([0], np.int64), "st"), numpy_helper.from_array(np.array([2], np.int64), "en")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    dims = {"batch": [1, 8]}
    model = _package(tmp_path, "first2", m.SerializeToString(), [{"name": "x", "dtype": "float32", "shape": ["batch", 4], "dims": dims}], [{"name": "y", "dtype": "float32", "shape": ["batch", 4]}])
    rt = StreamRouter(model, opts(window=4), batch_size=3)
    ids = list(range(7))
    for r in range(2):  # the first block takes push()'s path, the second is cut as a block
        with pytest.raises(BlockPushError) as ei:
            rt.push_block(ids, np.full((7, 4), r, np.float32), [4.0 * r] * 7)
        assert sorted(ei.value.errors) == list(range(6)) and "expected 3 rows on axis 0" in str(ei.value.errors[0])
        assert ei.value.results.stream_ids == (6,) and ei.value.results.index.tolist() == [r]


def _lookup_model(tmp_path, batched: bool):
    """y = table[int(x[:, 0])]: ONNX Runtime fails the call (Gather out of bounds) when a window
    starts with a value >= 3, so a failure can be put in one stream's chunk."""
    from onnx import TensorProto, helper, numpy_helper

    b: Any = "batch" if batched else 1
    g = helper.make_graph(
        [
            helper.make_node("Slice", ["x", "st", "en", "ax"], ["x0"]),  # [B, 1]
            helper.make_node("Cast", ["x0"], ["i"], to=TensorProto.INT64),
            helper.make_node("Gather", ["table", "i"], ["g"], axis=0),  # [B, 1]
            helper.make_node("Identity", ["g"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, 1])],
        [
            numpy_helper.from_array(np.array([10.0, 20.0, 30.0], np.float32), "table"),
            numpy_helper.from_array(np.array([0], np.int64), "st"),
            numpy_helper.from_array(np.array([1], np.int64), "en"),
            numpy_helper.from_array(np.array([1], np.int64), "ax"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    spec: dict[str, Any] = {"name": "x", "dtype": "float32", "shape": [b, 4]}
    if batched:
        spec["dims"] = {"batch": [1, 8]}
    return _package(tmp_path, f"lookup-{batched}", m.SerializeToString(), [spec], [{"name": "y", "dtype": "float32", "shape": [b, 1]}])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_runtime_error_in_one_call_spares_the_rest(tmp_path, batch_size):
    """A real ONNX Runtime failure (an index out of bounds) in one stream's window: its call's
    chunks are in BlockPushError.errors as SessionError, every other chunk ran, on push()'s path
    (the first block) and in block mode (the next ones)."""
    from edge_sdk.errors import SessionError

    model = _lookup_model(tmp_path, batched=batch_size > 1)
    rt = StreamRouter(model, opts(window=4), batch_size=batch_size)
    ids = ["a", "b", "c", "d"]
    for r in range(3):
        x = np.ones((4, 4), np.float32)
        x[2, 0] = 7.0  # stream "c": out of the table
        with pytest.raises(BlockPushError) as ei:
            rt.push_block(ids, x, [4.0 * r] * 4)
        e = ei.value
        failed = {"c"} if batch_size == 1 else {"c", "d"}  # batch 2: "c" shares its call with "d"
        assert set(e.errors) == failed and all(isinstance(v, SessionError) for v in e.errors.values())
        assert sorted(e.results.stream_ids) == sorted(set(ids) - failed)
        assert e.results.outputs["y"][:, 0, 0].tolist() == [20.0] * (4 - len(failed))
        assert all(rt.stream(i)._in_block for i in ids)  # entered after the first block (push()'s path), kept after


def test_unbatched_router_block(tmp_path):
    """batch_size 1: one call per window, each stream's state its own; streams stay directly
    pushable (push() on the stream takes the clock back from block mode)."""
    model = batched_accumulator_model(tmp_path, 8, max_batch=8)
    rt = StreamRouter(model, opts(window=8), constants=GAIN)
    for r in range(3):
        blk = rt.push_block(["a", "b"], np.full((2, 8), r + 1, np.float32), [8.0 * r] * 2)
        assert [res.batch_size for res in blk.results] == [1, 1]
    assert blk.outputs["y"][:, 0, 0].tolist() == [2.0 * 8 * 6] * 2
    w = rt.stream("a").push(np.ones(8, np.float32), 24.0)
    assert [x.index for x in w] == [3] and w[0].outputs["y"][0, 0] == 2.0 * 8 * 7


def test_vad_blocks_equal_pushes(vad_model):  # noqa: F811
    """Silero VAD, 24 streams of real-model state: push_block gives bitwise the probabilities of a
    push per chunk, unbatched and batched."""
    from tools.fixtures.vad_package import VAD_CONSTANTS, VAD_OPTIONS

    rng = np.random.default_rng(3)
    audio = (rng.normal(0, 0.1, (6, 24, 512)) * np.sin(np.arange(512) / 9.0)).astype(np.float32)
    for bs in (1, 16):
        ref = StreamRouter(vad_model, VAD_OPTIONS, max_streams=24, constants=VAD_CONSTANTS, batch_size=bs, max_wait_ms=1e9)
        blk = StreamRouter(vad_model, VAD_OPTIONS, max_streams=24, constants=VAD_CONSTANTS, batch_size=bs, max_wait_ms=1e9)
        a: list = []
        b: list = []
        for r in range(6):
            for s in range(24):
                a += ref.push(s, audio[r, s], 32.0 * r)
            a += ref.flush()
            b += blk.push_block(list(range(24)), audio[r], [32.0 * r] * 24).windows()
        assert _by_stream(a) == _by_stream(b) and len(b) == 144
        assert len({float(w.outputs["output"][0, 0]) for w in b}) > 100  # real, varied probabilities

