"""Silero VAD (pinned out of the silero-vad wheel) as an edge_sdk package, run through
edge_sdk.streams on real synthesized speech.

Needs the network once (pip download of the pinned wheel; then the normal cache) and the
``espeak-ng`` program (Debian/Ubuntu: ``apt-get install -y espeak-ng``). Neither is skipped
when missing: the tests FAIL and say what to install.

The measuring code (:func:`measure_vad_throughput`) is importable and runnable on its own
(streams served in real time on one core, per batch size; per-chunk compute and end-to-end
latency, waiting for the batch included)::

    python tests/test_vad_model.py [--streams N ...] [--batch B ...] [--seconds S] [--max-wait-ms W]
"""

from __future__ import annotations

import hashlib
import math
import pathlib
import sys
import tempfile
import time
from collections import deque
from typing import Any

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from edge_sdk.streams import SignalStream, StreamRouter  # noqa: E402
from tools.fixtures import fetch_pretrained as fp  # noqa: E402
from tools.fixtures.vad_package import (  # noqa: E402, F401  (shared with samples/vad_stream.py; tests/test_streams.py uses mix via this module)
    CONTEXT,
    HOP,
    MAX_BATCH,
    SR,
    VAD,
    VAD_CONSTANTS,
    VAD_OPTIONS,
    Mix,
    build_vad_package,
    load_vad,
    mix,
    new_audio_span,
    resample,
    segments,
    standard_mix,
)

VAD_SHA256 = "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49"
VAD_WHEEL_SHA256 = "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"


# --- the reference loop ------------------------------------------------------------------------


def reference_probs(model_file: pathlib.Path, audio: np.ndarray) -> np.ndarray:
    """Silero's own OnnxWrapper loop (silero_vad/utils_vad.py), in numpy on plain ORT."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_file), so, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, CONTEXT), np.float32)
    probs = []
    for i in range(0, len(audio) - HOP + 1, HOP):
        x = np.concatenate([context, audio[None, i : i + HOP]], axis=1)
        out, state = sess.run(None, {"input": x, "state": state, "sr": np.array(SR, np.int64)})
        context = x[:, -CONTEXT:]
        probs.append(out[0, 0])
    return np.array(probs, np.float32)


# --- throughput ----------------------------------------------------------------------------


def _pct(x: list[float], q: float) -> float:
    return float(np.percentile(x, q)) if x else math.nan


def measure_vad_throughput(
    model,
    n_streams: int = 32,
    seconds: float = 2.0,
    audio: np.ndarray | None = None,
    *,
    batch_size: int = 1,
    max_wait_ms: float = 10.0,
    paced: bool = True,
) -> dict[str, Any]:
    """Serve ``n_streams`` 16 kHz streams (one 32 ms chunk per stream per round) through one
    StreamRouter with ``batch_size``, on the calling thread (load the model with threads=1 to
    measure one core). Two runs:

    * as fast as possible: CPU ms per chunk (everything: framing, batching, the model call,
      splitting), so ``streams_per_core_realtime`` = 32 ms / that; ``compute_ms_per_chunk``
      is the time inside ``Model.predict`` per chunk (ORT + validation; ``ort_ms_per_chunk``
      ORT alone), ``push_*`` the time of ``push`` calls (batched: most only queue; one in
      ``batch_size`` runs the batch).
    * ``paced``: the chunks arrive in real time (stream s at s/n of each 32 ms period), served
      by one thread whose clock advances by the measured duration of each call (a discrete
      event simulation: no sleeping; a timer would ``poll()`` when the oldest queued window is
      ``max_wait_ms`` old and the server is idle). ``e2e_*``: from a chunk's arrival to its
      window's result, waiting for the batch included; ``backlog_ms``: how far the server is
      behind the last arrival at the end (grows without bound when it cannot keep up).
    """
    if audio is None:
        audio = standard_mix().audio
    rounds = max(1, int(seconds * SR) // HOP)
    offsets = [(i * 7919 * HOP) % max(HOP, len(audio) - HOP) for i in range(n_streams)]

    def chunk(s: int, r: int) -> np.ndarray:
        a = (offsets[s] + r * HOP) % (len(audio) - HOP)
        return audio[a : a + HOP]

    def router(**kw: Any) -> StreamRouter:
        return StreamRouter(model, VAD_OPTIONS, max_streams=n_streams, constants=VAD_CONSTANTS, batch_size=batch_size, max_wait_ms=max_wait_ms, **kw)

    # -- as fast as possible
    rt = router()
    for s in range(n_streams):  # warm up each stream once (state allocation, first-call costs)
        rt.push(s, chunk(s, 0), 0.0)
    rt.flush()
    push_lat = np.empty(rounds * n_streams)
    stats = np.zeros(4)  # windows, calls, model ms, ORT ms: results are counted, not kept (as a server would)

    def count(results) -> None:
        for w in results:
            b = w.result.batch_size
            stats[:] += (1.0, 1.0 / b, w.result.timings.total_ms / b, w.result.timings.inference_ms / b)

    i = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for r in range(1, rounds + 1):
        for s in range(n_streams):
            x = chunk(s, r)
            t = time.perf_counter_ns()
            got = rt.push(s, x, r * 32.0)
            push_lat[i] = (time.perf_counter_ns() - t) * 1e-6
            i += 1
            if got:
                count(got)
    count(rt.flush())
    cpu_ms = (time.process_time() - cpu0) * 1000.0
    wall_ms = (time.perf_counter() - wall0) * 1000.0
    rt.shutdown()
    k = rounds * n_streams
    assert stats[0] == k, (stats[0], k)
    per_chunk_cpu = cpu_ms / k
    out: dict[str, Any] = {
        "streams": n_streams,
        "batch_size": batch_size,
        "chunks": k,
        "mean_batch": k / stats[1],
        "compute_ms_per_chunk": stats[2] / k,
        "ort_ms_per_chunk": stats[3] / k,
        "cpu_ms_per_chunk": per_chunk_cpu,
        "wall_ms_per_chunk": wall_ms / k,
        "streams_per_core_realtime": HOP * 1000.0 / SR / per_chunk_cpu,
        "push_p50_ms": float(np.percentile(push_lat, 50)),
        "push_p99_ms": float(np.percentile(push_lat, 99)),
        "push_max_ms": float(push_lat.max()),
    }
    if paced:
        out.update(_paced(router, chunk, n_streams, rounds, max_wait_ms))
    return out


def _paced(router, chunk, n: int, rounds: int, max_wait_ms: float) -> dict[str, float]:
    period = HOP / SR  # 32 ms, in seconds
    now = [0.0]  # the simulated clock (s), read by the router
    rt = router(clock=lambda: now[0])
    arrival: dict[tuple[int, int], float] = {}
    queued: deque = deque()  # (enqueue time, key) of windows whose result is not back yet
    done: set = set()
    e2e: list[float] = []
    server = 0.0  # when the server is free again

    def call(fn, *args) -> None:
        nonlocal server
        t = time.perf_counter()
        got = fn(*args)
        server = now[0] + (time.perf_counter() - t)
        for w in got:
            key = (w.stream_id, w.index)
            e2e.append((server - arrival[key]) * 1000.0)
            done.add(key)

    for r in range(rounds):
        for s in range(n):
            t_arr = (r + s / n) * period
            while queued:  # before this arrival: a timer polls once the oldest window is due
                if queued[0][1] in done:
                    queued.popleft()
                    continue
                at = max(server, queued[0][0] + max_wait_ms / 1000.0 + 1e-7)
                if at >= t_arr:
                    break
                now[0] = at
                call(rt.poll)
                if queued[0][1] not in done:
                    break  # (cannot happen: poll runs the overdue windows, oldest first)
            now[0] = max(server, t_arr)
            arrival[(s, r)] = t_arr  # chunk r of a stream completes its window r (hop 512, prefill 64)
            queued.append((now[0], (s, r)))
            call(rt.push, s, chunk(s, r), r * 32.0)
    last = ((rounds - 1) + (n - 1) / n) * period
    backlog = max(0.0, server - last) * 1000.0
    now[0] = max(server, last + max_wait_ms / 1000.0)
    call(rt.flush)
    rt.shutdown()
    assert len(e2e) == n * rounds, (len(e2e), n * rounds)
    return {"e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99), "e2e_max_ms": max(e2e), "backlog_ms": backlog}


def measure_raw_ort(model_file: pathlib.Path, chunks: int = 2000) -> float:
    """ms per call of the bare ORT session (1 thread), for the SDK's overhead."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_file), so, providers=["CPUExecutionProvider"])
    feeds = {"input": np.zeros((1, HOP + CONTEXT), np.float32), "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(SR, np.int64)}
    for _ in range(20):
        sess.run(None, feeds)
    t = time.perf_counter()
    for _ in range(chunks):
        sess.run(None, feeds)
    return (time.perf_counter() - t) * 1000.0 / chunks


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vad_file() -> pathlib.Path:
    return fp.fetch(VAD)  # the normal cache: instant once fetched


@pytest.fixture(scope="module")
def vad_model(vad_file, tmp_path_factory):
    pkg = build_vad_package(tmp_path_factory.mktemp("vad") / "pkg", vad_file)
    with load_vad(pkg, tmp_path_factory.mktemp("vad-cache")) as m:
        yield m


@pytest.fixture(scope="module")
def speech() -> Mix:
    return standard_mix()


# --- the pin -----------------------------------------------------------------------------------


def test_table_pins_silero_vad():
    spec = fp.MODELS[VAD]
    assert (spec.package, spec.version) == ("silero-vad", "6.2.3")
    assert spec.member == "silero_vad/data/silero_vad_16k_op15.onnx"
    assert (spec.sha256, spec.size) == (VAD_SHA256, 1_289_603)
    assert (spec.wheel_sha256, spec.wheel_size) == (VAD_WHEEL_SHA256, 11_317_527)
    assert spec.pure and spec.format == "onnx" and spec.filename == f"{VAD_SHA256}.onnx"
    assert spec.license == "MIT"
    cmd = fp._pip_command(spec, pathlib.Path("/tmp"))
    assert cmd[-1] == "silero-vad==6.2.3" and "--platform" not in cmd
    # The other entries are untouched.
    assert {"mediapipe-face-detection-short-range", "ppocr-v4-text-detection"} <= set(fp.MODELS)


def test_fetched_file_is_the_pinned_model(vad_file):
    import onnx
    import onnxruntime as ort

    assert vad_file.name == f"{VAD_SHA256}.onnx"
    assert hashlib.sha256(vad_file.read_bytes()).hexdigest() == VAD_SHA256
    m = onnx.load(str(vad_file))
    assert (m.ir_version, [(o.domain, o.version) for o in m.opset_import]) == (8, [("", 15)])
    sess = ort.InferenceSession(str(vad_file), providers=["CPUExecutionProvider"])
    assert [(i.name, tuple(i.shape), i.type) for i in sess.get_inputs()] == [
        ("input", ("batch", "sequence"), "tensor(float)"),
        ("state", (2, "batch", 128), "tensor(float)"),
        ("sr", (), "tensor(int64)"),
    ]
    assert [o.name for o in sess.get_outputs()] == ["output", "stateN"]


def test_package_declares_state_pair_and_constant(vad_model):
    man = vad_model.manifest
    assert [(p.input, p.output, p.initial, p.batch_axis) for p in man.state] == [("state", "stateN", 0.0, 1)]
    assert [(s.name, s.shape, s.dim_bounds) for s in vad_model.inputs] == [
        ("input", ("batch", 576), (("batch", 1, MAX_BATCH),)),
        ("state", (2, "batch", 128), (("batch", 1, MAX_BATCH),)),
        ("sr", (), ()),
    ]
    assert [(s.name, s.shape) for s in vad_model.outputs] == [("output", ("batch", 1)), ("stateN", (2, "batch", 128))]
    assert vad_model.stream().state["state"].shape == (2, 1, 128)  # one stream: batch 1
    # The SDK's validator wants every non-state input, the rank-0 ``sr`` too: the stream feeds it.
    st = vad_model.stream()
    from edge_sdk.errors import MissingInputError

    with pytest.raises(MissingInputError, match="missing input 'sr'"):
        st.predict({"input": np.zeros((1, 576), np.float32)})


def test_silero_computes_batch_rows_independently(vad_model, vad_file, speech):
    """The file takes batches > 1 (input [batch, 576], state [2, batch, 128]), and each row of
    a batch is bitwise what that row gives alone, on plain ORT and through the SDK: batching
    streams changes no probability and no state."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(vad_file), so, providers=["CPUExecutionProvider"])
    sr = np.array(SR, np.int64)
    # Realistic rows: windows of speech and silence, states after a few calls on different audio.
    n = MAX_BATCH
    starts = np.linspace(0, len(speech.audio) - 4 * HOP - CONTEXT - 1, n).astype(int)
    state = np.zeros((2, n, 128), np.float32)
    for k in range(3):
        x = np.stack([speech.audio[a + k * HOP : a + k * HOP + HOP + CONTEXT] for a in starts])
        _, state = sess.run(None, {"input": x, "state": state, "sr": sr})
    x = np.stack([speech.audio[a + 3 * HOP : a + 3 * HOP + HOP + CONTEXT] for a in starts])
    assert np.abs(state).max() > 0.1 and len({r.tobytes() for r in np.moveaxis(state, 1, 0)}) == n
    alone = [sess.run(None, {"input": x[i : i + 1], "state": np.ascontiguousarray(state[:, i : i + 1]), "sr": sr}) for i in range(n)]
    for b in (2, 5, 16, n):
        for name, run in (("ort", lambda f: sess.run(None, f)), ("sdk", lambda f: list(vad_model.predict(f).outputs.values()))):
            out, new_state = run({"input": x[:b], "state": np.ascontiguousarray(state[:, :b]), "sr": sr})
            assert out.shape == (b, 1) and new_state.shape == (2, b, 128)
            for i in range(b):
                assert out[i : i + 1].tobytes() == alone[i][0].tobytes(), (name, b, i)
                assert np.ascontiguousarray(new_state[:, i : i + 1]).tobytes() == alone[i][1].tobytes(), (name, b, i)
    probs = np.array([a[0][0, 0] for a in alone])
    assert probs.min() < 0.1 and probs.max() > 0.5  # speech and non-speech rows both in the batch


# --- the model through SignalStream -----------------------------------------------------------


def test_stream_equals_silero_reference_loop(vad_model, vad_file, speech):
    """SignalStream (window 576, hop 512, prefill 64) is Silero's own chunking, call for call."""
    with SignalStream(vad_model, VAD_OPTIONS, constants=VAD_CONSTANTS) as st:
        rng = np.random.default_rng(1)
        got, pos = [], 0
        while pos < len(speech.audio):  # chunks of random sizes: the framing must not depend on them
            n = int(rng.integers(1, 3000))
            got += st.push(speech.audio[pos : pos + n], pos * 1000.0 / SR)
            pos += n
    ref = reference_probs(vad_file, speech.audio)
    probs = np.array([w.outputs["output"][0, 0] for w in got], np.float32)
    assert len(probs) == len(ref) == len(speech.audio) // HOP
    assert [w.start_sample for w in got[:3]] == [-64, 448, 960]
    assert got[1].timestamp_ms == pytest.approx(28.0)  # (512 - 64) / 16 kHz
    np.testing.assert_allclose(probs, ref, rtol=0, atol=1e-5)


def test_vad_finds_speech_where_it_is(vad_model, speech):
    with SignalStream(vad_model, VAD_OPTIONS, constants=VAD_CONSTANTS) as st:
        results = st.push(speech.audio, 0.0)
    probs = np.array([w.outputs["output"][0, 0] for w in results])
    found = segments(results)
    assert len(found) == len(speech.speech_ms) == 2, (found, speech.speech_ms)
    for (s0, e0), (s1, e1) in zip(found, speech.speech_ms):
        assert abs(s0 - s1) <= 150 and abs(e0 - e1) <= 150, (found, speech.speech_ms)
    # Silence windows (with noise) are confidently not speech.
    starts = np.array([new_audio_span(w)[0] for w in results])
    silent = (starts + 32 < speech.speech_ms[0][0] - 100) | ((starts > speech.speech_ms[0][1] + 300) & (starts + 32 < speech.speech_ms[1][0] - 100))
    assert probs[silent].max() < 0.2


def test_vad_quiet_on_noise_only(vad_model):
    noise = (np.random.default_rng(3).normal(0, 0.01, 5 * SR)).astype(np.float32)
    with SignalStream(vad_model, VAD_OPTIONS, constants=VAD_CONSTANTS) as st:
        results = st.push(noise, 0.0)
    assert segments(results) == []


def test_gap_resets_vad_state_mid_speech(vad_model, speech):
    """A gap (reset policy) mid-utterance restarts state; results after it equal a fresh stream."""
    a = speech.audio
    cut = 40 * HOP  # inside the first utterance
    with SignalStream(vad_model, VAD_OPTIONS, constants=VAD_CONSTANTS) as st, SignalStream(
        vad_model, VAD_OPTIONS, constants=VAD_CONSTANTS
    ) as fresh:
        st.push(a[:cut], 0.0)
        after = st.push(a[cut:], cut * 1000.0 / SR + 500.0)  # 500 ms missing
        ref = fresh.push(a[cut:], 0.0)
        (ev,) = st.pop_events()
    assert (ev.kind, ev.action, ev.samples) == ("gap", "reset", 8000)
    assert [w.outputs["output"].tobytes() for w in after] == [w.outputs["output"].tobytes() for w in ref]
    assert {w.epoch for w in after} == {1}


def test_resampler_keeps_the_band_and_removes_aliases():
    t = np.arange(22050) / 22050
    amp = {f: np.sqrt(2 * np.mean(resample(np.sin(2 * np.pi * f * t), 22050, SR)[200:-200] ** 2)) for f in (300, 1000, 5000, 9000, 10500)}
    assert all(abs(amp[f] - 1) < 1e-3 for f in (300, 1000, 5000)), amp  # speech band intact
    assert amp[9000] < 1e-3 and amp[10500] < 1e-3, amp  # above 8 kHz would alias: removed
    assert len(resample(np.zeros(22050), 22050, SR)) == SR


@pytest.mark.parametrize("n_streams, batch_size", [(4, 1), (12, 4)])
def test_measure_vad_throughput_smoke(vad_model, n_streams, batch_size):
    m = measure_vad_throughput(vad_model, n_streams=n_streams, seconds=0.5, batch_size=batch_size)
    assert m["chunks"] == n_streams * (8000 // HOP) and m["batch_size"] == batch_size
    assert 1 <= m["mean_batch"] <= batch_size and (batch_size == 1) == (m["mean_batch"] == 1)
    assert 0 < m["push_p50_ms"] <= m["push_p99_ms"] <= m["push_max_ms"]
    assert 0 < m["e2e_p50_ms"] <= m["e2e_p99_ms"] <= m["e2e_max_ms"]
    assert 0 < m["ort_ms_per_chunk"] <= m["compute_ms_per_chunk"] < m["cpu_ms_per_chunk"] * 3  # (wall vs CPU time)
    # Far below real time would mean something is badly wrong (one chunk is 32 ms of audio).
    assert m["streams_per_core_realtime"] > 4
    # A handful of streams is far below one core's capacity: a chunk typically waits for its
    # batch (at most max_wait_ms = 10) plus one call, and the server does not fall behind.
    assert m["e2e_p50_ms"] < 10.0 + 15.0 and m["backlog_ms"] < 50.0


if __name__ == "__main__":  # python tests/test_vad_model.py [--streams N ...] [--batch B ...] [--seconds S]
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Silero VAD through edge_sdk.streams: streams per core, per-chunk latency")
    ap.add_argument("--streams", type=int, nargs="+", default=[300])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--max-wait-ms", type=float, default=10.0)
    ap.add_argument("--no-paced", action="store_true", help="skip the real-time (paced) run")
    args = ap.parse_args()
    path = fp.fetch(VAD)
    with tempfile.TemporaryDirectory() as tmp:
        pkg = build_vad_package(pathlib.Path(tmp) / "pkg", path)
        with load_vad(pkg, pathlib.Path(tmp) / "cache") as model:
            print(json.dumps({"raw_ort_ms_per_call": round(measure_raw_ort(path), 4)}))
            for n in args.streams:
                for b in args.batch:
                    r = measure_vad_throughput(model, n_streams=n, seconds=args.seconds, batch_size=b, max_wait_ms=args.max_wait_ms, paced=not args.no_paced)
                    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
