"""Concurrency: many threads on one Model, StreamRouter open/push/close races, a Model closed while
threads are inside predict, swap_model while frames flow under load, and the local/remote Router
under concurrent load with the remote failing halfway. Bounded (a few seconds each); every
thread is joined with a timeout, so a hang fails instead of blocking the run."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import EdgeSDKError, SessionClosedError
from edge_sdk.pipelines import PipelineOptions, VisionPipeline
from edge_sdk.pipelines.sources import SyntheticSource
from edge_sdk.remote.errors import RemoteUnavailableError
from edge_sdk.remote.router import Router, RouterOptions
from edge_sdk.streams import DuplicateStreamError, SignalStreamOptions, StreamRouter
from tools.fixtures.soak_runs import WINDOW, Chunks, _frame_pool, accumulator_package

PKG = edge_sdk.demo_package_path()
JOIN_S = 20.0


def run_threads(n: int, target: Callable[[int], None]) -> None:
    """Run ``target(i)`` on ``n`` threads; re-raise the first exception; fail on a hang."""
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads hung"
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    from edge_sdk.assets import demo_samples
    from edge_sdk.processing.image import load_image

    return [load_image(p) for p in demo_samples()]


def load_demo(tmp: Path, variant: str, threads: int = 1) -> Any:
    return edge_sdk.load(PKG, "generic-x86_64", variant=variant, threads=threads, cache_dir=tmp / "cache")


# --- many threads, one Model ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["fp32-onnx", "int8-onnx", "fp32-tflite"])
def test_predict_from_many_threads_equals_single_threaded(tmp_path, images, variant) -> None:
    with load_demo(tmp_path, variant, threads=2) as m:
        alone = [m.predict_image(img).outputs for img in images]
        got: dict[tuple[int, int], Any] = {}

        def work(t: int) -> None:
            for k in range(40):
                i = (t * 7 + k) % len(images)
                got[(t, k)] = (i, m.predict_image(images[i]).outputs)

        run_threads(8, work)
        assert len(got) == 8 * 40
        for i, outs in got.values():
            for name, v in alone[i].items():
                np.testing.assert_array_equal(outs[name], v)


# --- StreamRouter open/close races -----------------------------------------------------------------


@pytest.fixture(scope="module")
def acc_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acc")
    plain = edge_sdk.load(accumulator_package(tmp), "generic-x86_64", threads=1, cache_dir=tmp / "cache")
    batched = edge_sdk.load(accumulator_package(tmp, max_batch=8), "generic-x86_64", threads=1, cache_dir=tmp / "cache")
    with plain, batched:
        yield plain, batched


OPTS = SignalStreamOptions(sample_rate_hz=1000, window=WINDOW)


def test_stream_open_push_close_races_keep_states_apart(acc_models) -> None:
    """8 threads, each owning 4 ids, open / push / close / reopen them on one router (with LRU
    eviction by the others' opens): every window equals the running sum of its stream since it
    was (re)opened, so a reused id always starts fresh and no state leaks across streams."""
    model, _ = acc_models
    chunks = Chunks()
    router = StreamRouter(model, OPTS, max_streams=24)
    typed: Counter[str] = Counter()
    lock = threading.Lock()
    max_open = [0]

    def work(t: int) -> None:
        rng = random.Random(t)
        ids = [t * 4 + k for k in range(4)]
        st = {i: [0, -1, 0] for i in ids}  # id -> [running sum, last epoch, next timestamp]
        for _ in range(200):
            i = rng.choice(ids)
            if rng.random() < 0.3:
                router.close(i)
            try:
                router.open(i)
            except DuplicateStreamError:
                pass
            s = st[i]
            for _ in range(rng.randrange(1, 6)):
                ts = s[2]
                s[2] += WINDOW * rng.choice((1, 1, 1, 3))  # now and then a gap: the stream resets
                try:
                    out = router.push(i, chunks.samples(i, ts), float(ts))
                except EdgeSDKError as e:
                    with lock:
                        typed[type(e).__name__] += 1
                    break
                for w in out:
                    if w.index == 0 or w.epoch != s[1]:  # opened fresh (by us, or after an eviction), or reset on a gap
                        s[0] = 0
                    s[0] += chunks.total(i, ts)
                    s[1] = w.epoch
                    assert float(w.outputs["y"][0, 0]) == s[0], (i, w)
            with lock:
                max_open[0] = max(max_open[0], len(router))

    run_threads(8, work)
    assert max_open[0] <= 24
    assert set(typed) <= {"StreamClosedError"}, typed
    # a reused id starts fresh: new state, new clock
    for i in range(32):
        router.close(i)
        (w,) = router.push(i, chunks.samples(i, 0), 0.0)
        assert (w.index, w.epoch, float(w.outputs["y"][0, 0])) == (0, 0, chunks.total(i, 0))
    router.shutdown()
    assert len(router) == 0


def test_batched_router_races_lose_no_window(acc_models) -> None:
    """A batching router hammered by 6 threads, each pushing 4 ids of its own with gaps (resets),
    and closing, resetting and polling any id (closes and LRU evictions run queued windows of
    other threads' streams): every window pushed comes back exactly once, as a result or a typed
    error; queues stay bounded; afterwards each reused id starts fresh."""
    _, model = acc_models
    chunks = Chunks()
    router = StreamRouter(model, OPTS, max_streams=16, batch_size=8, max_wait_ms=2.0)
    lock = threading.Lock()
    pushed, results, max_pending = [0], [0], [0]
    typed: Counter[str] = Counter()

    def work(t: int) -> None:
        rng = random.Random(100 + t)
        own = list(range(t, 24, 6))
        ts = {i: 0 for i in own}
        for _ in range(600):
            i = rng.randrange(24)
            op = rng.random()
            out: list[Any] = []
            try:
                if op < 0.05:
                    out = router.close(i)
                elif op < 0.08:
                    router.reset(i)
                elif op < 0.15:
                    out = router.poll()
                else:
                    i = rng.choice(own)
                    with lock:
                        pushed[0] += 1
                    t_ms = ts[i] = ts[i] + WINDOW * rng.randrange(1, 3)
                    out = router.push(i, chunks.samples(i, t_ms), float(t_ms))
            except KeyError:
                pass  # reset() of a stream that is not open
            except EdgeSDKError as e:
                with lock:
                    typed[type(e).__name__] += 1
            with lock:
                results[0] += len(out)
                max_pending[0] = max(max_pending[0], router.pending)

    run_threads(6, work)
    results[0] += len(router.flush())
    assert results[0] + sum(typed.values()) == pushed[0], (results, typed, pushed)
    assert set(typed) <= {"StreamClosedError"}, typed
    assert max_pending[0] <= router.max_pending
    for i in range(24):
        router.close(i)
        out = router.push(i, chunks.samples(i, 0), 0.0) + router.flush()
        (w,) = [w for w in out if w.stream_id == i]
        assert (w.index, float(w.outputs["y"][0, 0])) == (0, chunks.total(i, 0))


# --- close during inference ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["fp32-onnx", "fp32-tflite"])
def test_close_while_threads_are_inside_predict(tmp_path, images, variant) -> None:
    """Threads predicting in a loop while the model is closed: each call finishes with a result
    or raises SessionClosedError; nothing crashes or hangs, and later calls all raise."""
    m = load_demo(tmp_path, variant)
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    started = threading.Barrier(7)

    def work(t: int) -> None:
        started.wait(5)
        while True:
            try:
                m.predict_image(images[t % len(images)])
                key = "ok"
            except SessionClosedError:
                key = "closed"
            with lock:
                counts[key] += 1
            if key == "closed":
                return

    def closer(_: int) -> None:
        started.wait(5)
        time.sleep(0.3)
        m.close()

    run_threads(7, lambda i: closer(i) if i == 6 else work(i))
    assert counts["closed"] == 6 and counts["ok"] > 0, counts
    with pytest.raises(SessionClosedError):
        m.predict_image(images[0])
    with pytest.raises(SessionClosedError):
        m.stream()


# --- swap_model while frames flow -------------------------------------------------------------------


@pytest.mark.parametrize("preprocess", ["capture", "worker"])
def test_swap_model_under_load(tmp_path, preprocess) -> None:
    """A live source at 4 kHz (well over what two workers infer), swap_model every few ms between
    three variants: every snapshot balances, every frame reaches the sinks at most once, from one
    model (each result's variant is one the pipeline ran at the time), and after a last swap,
    wait_model_idle and close of the old models, the pipeline goes on without an error."""
    models = [load_demo(tmp_path, v) for v in ("fp32-onnx", "int8-onnx", "fp32-tflite")]
    by_variant = {m.variant.id: m for m in models}
    pool = _frame_pool(8, (120, 160))
    stop_at = time.monotonic() + 3.0
    src = SyntheticSource(lambda i: pool[i % 8] if time.monotonic() < stop_at else None, fps=4000, live=True)
    seen: dict[int, str] = {}
    dup: list[int] = []
    errors: list[BaseException] = []

    def sink(fr: Any) -> None:
        if fr.index in seen:
            dup.append(fr.index)
        seen[fr.index] = fr.result.variant_id

    opts = PipelineOptions(drop_policy="drop_oldest", queue_size=4, workers=2, preprocess=preprocess)
    p = VisionPipeline(models[0], src, opts, sinks=[sink], on_error=lambda e, f: errors.append(e))
    p.start()
    unaccounted = 0
    swaps = 0
    try:
        while time.monotonic() < stop_at - 1.0:
            p.swap_model(models[swaps % 3])
            swaps += 1
            c = p.counters()
            unaccounted = max(unaccounted, abs(c.unaccounted))
            time.sleep(0.003)
        last = p.swap_model(models[0])
        for m in models[1:]:
            assert p.wait_model_idle(m, timeout=5.0)
            m.close()  # safe: no frame runs on it, and none will
        processed_before = p.counters().processed
        assert p.join(JOIN_S)
    finally:
        p.close("discard")
        for m in models:
            m.close()
    c = p.counters()
    assert last is not None and swaps > 50
    assert unaccounted == 0 and c.unaccounted == 0 and c.in_flight == 0
    assert c.frames_in == c.processed + c.dropped_total
    assert not dup and len(seen) == c.processed
    assert set(seen.values()) == set(by_variant), Counter(seen.values())
    assert not errors and c.dropped.get("error", 0) == 0, errors[:3]
    assert c.processed > processed_before  # frames flowed after the old models were closed
    assert c.dropped_total > 0  # overload: the surplus was dropped, not queued


# --- the router, remote failing halfway ---------------------------------------------------------


class FlakyRemote:
    """A remote model (the same package, loaded separately) that goes down when ``down`` is set:
    from then on every call raises RemoteUnavailableError, as a dead gateway does."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.down = threading.Event()
        self.calls = Counter[str]()
        self._lock = threading.Lock()

    def predict_image(self, image: Any, **kw: Any) -> Any:
        with self._lock:
            self.calls["down" if self.down.is_set() else "up"] += 1
        if self.down.is_set():
            raise RemoteUnavailableError("remote down (test)")
        time.sleep(0.002)  # a network round trip
        return self.model.predict_image(image, **kw)


def test_router_under_load_with_the_remote_failing_halfway(tmp_path, images) -> None:
    """8 threads x 60 requests through a Router with a 1-deep local queue, so the surplus goes
    remote; halfway the remote dies. Every request ends in a result or a typed error, the
    router's counts add up to the answered ones, and after the failure everything is served
    locally with the reason saying so."""
    with load_demo(tmp_path, "fp32-onnx") as local, load_demo(tmp_path, "int8-onnx") as remote_model:
        remote = FlakyRemote(remote_model)
        router = Router(local, remote, RouterOptions(max_local_inflight=1, max_local_queue=1, deadline_s=10.0))
        n_threads, n_req = 8, 60
        done = Counter[str]()
        reasons: list[tuple[bool, str, str]] = []
        lock = threading.Lock()
        count = [0]

        def work(t: int) -> None:
            for k in range(n_req):
                with lock:
                    count[0] += 1
                    if count[0] == n_threads * n_req // 2:
                        remote.down.set()
                    down = remote.down.is_set()
                try:
                    r = router.predict_image(images[(t + k) % len(images)])
                except EdgeSDKError as e:
                    with lock:
                        done[type(e).__name__] += 1
                    continue
                assert r.result.outputs, r
                with lock:
                    done["ok"] += 1
                    reasons.append((down, r.served_by, r.reason))

        run_threads(n_threads, work)
    assert sum(done.values()) == n_threads * n_req, done
    assert set(done) <= {"ok", "RouterTimeoutError", "RouterError"}, done
    assert sum(router.counts.values()) == done["ok"]
    before = [s for d, s, _ in reasons if not d]
    after = [(s, why) for d, s, why in reasons if d]
    assert "remote" in before and "local" in before  # under load the surplus went remote
    assert remote.calls["down"] > 0
    assert all(s == "local" for s, _ in after)
    assert any("remote failed" in why for _, why in after)
