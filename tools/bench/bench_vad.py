"""Silero VAD streams on one core: edge_sdk's StreamRouter against the raw ONNX Runtime loop a user would write.

Both arms serve the same ``--streams`` 16 kHz streams, one 32 ms chunk (512 samples) per stream per round,
as fast as they can on the calling thread (ORT intra-op threads 1), and are timed in CPU time:

* ``raw``: a hand-written loop on a plain ``InferenceSession`` (the SessionOptions edge_sdk used): per stream
  the last 64 samples of context and Silero's [2, 1, 128] state; a round stacks ``batch`` streams' windows
  [b, 576] and states [2, b, 128], runs, and splits the new states back (batch 1: one call per stream).
* ``edge_sdk``: ``StreamRouter(model, VAD_OPTIONS, batch_size=b)`` pushed each chunk, results counted as they
  come (framing, per-stream state, stacking, validation, the call, splitting, ``WindowResult`` per window).
* ``raw_block``: the raw loop a user with every stream's chunk of a round in one array [streams, 512] would
  write: the contexts and chunks stacked with two slice assignments, then the same batched calls.
* ``edge_sdk_block``: ``StreamRouter.push_block`` with that array, the returned ``WindowBlock``'s
  probabilities stored with one assignment.

Arms rotate in rounds (each round starts with the next arm); each figure is the median over rounds of
``streams served in real time per core`` = 32 ms / CPU ms per chunk, and each ratio is the median of the
per-round ratios: ``ratio`` edge_sdk / raw, ``block_ratio`` edge_sdk_block / raw (the per-chunk raw loop the
issue measures against) and ``block_vs_raw_block`` edge_sdk_block / raw_block. The first round warms up and
is dropped. Every window's probability is checked equal between the arms (they compute the same thing).

    python tools/bench/bench_vad.py [--streams 300] [--batch 1 16 64] [--rounds 7] [--seconds 1.0] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.bench.machine import finish_record, machine_line, machine_record  # noqa: E402
from edge_sdk.streams import StreamRouter  # noqa: E402
from tools.fixtures import fetch_pretrained as fp  # noqa: E402
from tools.fixtures.vad_package import CONTEXT, HOP, SR, VAD, VAD_CONSTANTS, VAD_OPTIONS, build_vad_package, load_vad  # noqa: E402


def _audio(seconds: float = 20.0) -> np.ndarray:
    """Speech-like test audio without external programs: noise bursts shaped like syllables, and silence."""
    rng = np.random.default_rng(0)
    n = int(seconds * SR)
    t = np.arange(n) / SR
    env = (np.sin(2 * np.pi * 3.0 * t) > 0.2) * (np.sin(2 * np.pi * 0.25 * t) > -0.3)
    voiced = 0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 700 * t))
    return ((voiced + rng.normal(0, 0.05, n)) * env + rng.normal(0, 0.003, n)).astype(np.float32)


class _Feed:
    """Chunk ``r`` of stream ``s``: the same for both arms."""

    def __init__(self, audio: np.ndarray, n_streams: int) -> None:
        self.audio = audio
        self.offsets = [(i * 7919 * HOP) % (len(audio) - HOP) for i in range(n_streams)]

        self._rows = np.lib.stride_tricks.sliding_window_view(audio, HOP)
        self._offs = np.array(self.offsets)

    def __call__(self, s: int, r: int) -> np.ndarray:
        a = (self.offsets[s] + r * HOP) % (len(self.audio) - HOP)
        return self.audio[a : a + HOP]

    def block(self, r: int) -> np.ndarray:
        """Chunk ``r`` of every stream, [streams, HOP] (one gather)."""
        return self._rows[(self._offs + r * HOP) % (len(self.audio) - HOP)]


class RawLoop:
    """The loop a user would write on a plain session: per stream the last 64 samples and Silero's state,
    carried from chunk to chunk like the router's streams."""

    def __init__(self, sess: Any, n: int, batch: int) -> None:
        self.sess, self.n, self.batch = sess, n, batch
        self.sr = np.array(SR, np.int64)
        self.ctx = np.zeros((n, CONTEXT), np.float32)
        self.state = np.zeros((2, n, 128), np.float32)
        self.x = np.empty((n, CONTEXT + HOP), np.float32)

    def run(self, feed: _Feed, rounds: int, r0: int, block: bool = False) -> tuple[float, np.ndarray]:
        """CPU ms for ``rounds`` rounds of every stream, and the probabilities [rounds, n]. ``block``:
        every stream's chunk of a round comes as one array, stacked with two slice assignments."""
        n, batch, x, ctx, state, sess, sr = self.n, self.batch, self.x, self.ctx, self.state, self.sess, self.sr
        probs = np.empty((rounds, n), np.float32)
        c0 = time.process_time()
        for r in range(rounds):
            if block:
                x[:, :CONTEXT] = ctx
                x[:, CONTEXT:] = feed.block(r0 + r)
                ctx[:] = x[:, HOP:]
            else:
                for s in range(n):  # a chunk arrives: window = the stream's context + the new samples
                    x[s, :CONTEXT] = ctx[s]
                    x[s, CONTEXT:] = feed(s, r0 + r)
                    ctx[s] = x[s, HOP:]
            for a in range(0, n, batch):
                b = min(batch, n - a)
                out, st = sess.run(None, {"input": x[a : a + b], "state": np.ascontiguousarray(state[:, a : a + b]), "sr": sr})
                state[:, a : a + b] = st
                probs[r, a : a + b] = out[:, 0]
        return (time.process_time() - c0) * 1000.0, probs


def run_sdk_block(rt: StreamRouter, feed: _Feed, n: int, rounds: int, r0: int) -> tuple[float, np.ndarray]:
    probs = np.empty((rounds, n), np.float32)
    ids = list(range(n))
    got = 0
    c0 = time.process_time()
    for r in range(rounds):
        blk = rt.push_block(ids, feed.block(r0 + r), np.full(n, (r0 + r) * 32.0))
        probs[blk.index - r0, blk.position] = blk.outputs["output"][:, 0, 0]  # (the ids are the positions)
        got += len(blk)
    ms = (time.process_time() - c0) * 1000.0
    assert got == rounds * n, (got, rounds * n)
    return ms, probs


def run_sdk(rt: StreamRouter, feed: _Feed, n: int, rounds: int, r0: int) -> tuple[float, np.ndarray]:
    probs = np.empty((rounds, n), np.float32)
    got = 0

    def take(results: list[Any]) -> None:
        nonlocal got
        for w in results:
            probs[w.index - r0, w.stream_id] = w.outputs["output"][0, 0]
            got += 1

    c0 = time.process_time()
    for r in range(rounds):
        for s in range(n):
            res = rt.push(s, feed(s, r0 + r), (r0 + r) * 32.0)
            if res:
                take(res)
    take(rt.flush())
    ms = (time.process_time() - c0) * 1000.0
    assert got == rounds * n, (got, rounds * n)
    return ms, probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds per arm and batch size (one more warms up)")
    ap.add_argument("--seconds", type=float, default=1.0, help="audio per stream per round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import onnxruntime as ort

    rec = machine_record()
    path = fp.fetch(VAD)
    n, per = args.streams, max(1, int(args.seconds * SR) // HOP)
    feed = _Feed(_audio(), n)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        pkg = build_vad_package(Path(tmp) / "pkg", path)
        with load_vad(pkg, Path(tmp) / "cache") as model:
            so = ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            arms = ("raw", "sdk", "raw_block", "sdk_block")
            for b in args.batch:
                rt = StreamRouter(model, VAD_OPTIONS, max_streams=n, constants=VAD_CONSTANTS, batch_size=b, max_wait_ms=1e9)
                rtb = StreamRouter(model, VAD_OPTIONS, max_streams=n, constants=VAD_CONSTANTS, batch_size=b, max_wait_ms=1e9)
                raw, rawb = RawLoop(sess, n, b), RawLoop(sess, n, b)
                run = {
                    "raw": functools.partial(raw.run, feed, per),
                    "sdk": functools.partial(run_sdk, rt, feed, n, per),
                    "raw_block": functools.partial(rawb.run, feed, per, block=True),
                    "sdk_block": functools.partial(run_sdk_block, rtb, feed, n, per),
                }
                rate: dict[str, list[float]] = {a: [] for a in arms}
                ratios: dict[str, list[float]] = {"ratio": [], "block_ratio": [], "block_vs_raw_block": []}
                diff = 0.0
                for k in range(args.rounds + 1):  # every arm's streams go on from round to round, in step
                    got: dict[str, tuple[float, np.ndarray]] = {}
                    for arm in arms[k % 4 :] + arms[: k % 4]:
                        got[arm] = run[arm](k * per)
                    diff = max(diff, max(float(np.abs(got["raw"][1] - got[a][1]).max()) for a in arms[1:]))
                    if k == 0:  # warm-up
                        continue
                    for a in arms:
                        rate[a].append(32.0 * n * per / got[a][0])
                    ratios["ratio"].append(got["raw"][0] / got["sdk"][0])
                    ratios["block_ratio"].append(got["raw"][0] / got["sdk_block"][0])
                    ratios["block_vs_raw_block"].append(got["raw_block"][0] / got["sdk_block"][0])
                rt.shutdown()
                rtb.shutdown()
                row: dict[str, Any] = {"batch": b, "streams": n, "chunks_per_round": n * per}
                for a in arms:
                    row[f"{a.replace('sdk', 'edge_sdk')}_streams_per_core"] = round(statistics.median(rate[a]), 1)
                for name, v in ratios.items():
                    row[name] = round(statistics.median(v), 3)
                    row[f"{name}_min_max"] = [round(min(v), 3), round(max(v), 3)]
                row["max_prob_diff"] = diff
                rows.append(row)
                print(json.dumps(row), flush=True)
    finish_record(rec)
    print(machine_line(rec))
    if args.json:
        args.json.write_text(json.dumps({"machine": rec, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
