"""``edge-sdk bench PKG --scenario offline|multi-stream|server`` on a text-generation package: the
:class:`~edge_sdk.generation.engine.GenerationEngine` under load, after MLPerf Inference's LLM rules.

::

    edge-sdk bench smollm2-135m/ --scenario offline [--requests 16] [--streams 4] [--new-tokens 64] [--json F]
    edge-sdk bench smollm2-135m/ --scenario multi-stream [--streams 1,2,4,8] [--requests-per-stream 4] [--probe-runs 5]
    edge-sdk bench smollm2-135m/ --scenario server [--ttft-p99-ms 2000] [--tpot-p99-ms 200] [--rate QPS] [--max-probes 10]

The scenarios (MLPerf Inference rules, https://github.com/mlcommons/inference_policies/blob/master/inference_rules.adoc,
section "Scenarios"; the LLM latency constraints of https://github.com/mlcommons/inference/blob/master/mlperf.conf,
now ``loadgen/mlperf.conf``: ``llama2-70b.Server.ttft_latency = 2000`` and ``tpot_latency = 200`` ms, both held at
the 99th percentile):

- **offline**: every query at once (MLPerf's Offline: "LoadGen sends all queries to the SUT at
  the start"); the figure is output tokens / wall time, from the first submission to the last
  token. ``requests`` requests go to an engine of ``streams`` slots whose queue is sized to hold
  them all (a refusal here would be a failed run, not a measurement).
- **multi-stream** (not an MLPerf LLM scenario; the figure the engine was built for): for each
  stream count S, S closed-loop clients (each submits its next request when its previous one
  ends) of ``requests_per_stream`` requests each, stopped early by ``time_limit_s``; aggregate
  tokens/s and its ratio to S=1 (targets: 4 streams >= 2.0x, 8 >= 2.5x). Then the interference
  probe: the TTFT of a new request while ``background_streams`` others decode, against the same
  request's TTFT on an idle engine (target: <= 2x at p99), ``probe_runs`` probes each, on an
  engine without the prefix cache (a repeated probe must not be served from it).
- **server**: Poisson arrivals (MLPerf's Server: "queries ... according to a Poisson
  distribution"; exponential inter-arrival times from numpy's seeded generator, drawn once at
  rate 1 and divided by the rate, so every trial has the same arrival pattern, scaled) of
  ``trial_requests`` requests per trial; a trial passes when nothing was refused or failed and the
  TTFT p99 and the TPOT p99 over its requests meet ``ttft_p99_ms`` and ``tpot_p99_ms``. The
  figure is the highest passing rate the search found (:func:`search_rate`: doubling from the
  start rate while trials pass, halving while they fail, then bisection between the highest
  pass and the lowest fail, at most ``max_trials`` trials); every trial is reported. A request
  refused with :class:`~edge_sdk.errors.GenerationBusyError` fails its trial.

What every request is: a chat-like prompt (a question drawn from a fixed list by ``seed``, each
request its own; rendered with the package's chat template, plain text when it has none), or with
``prompt_tokens`` a prompt of exactly that many random token ids (:func:`~edge_sdk.bench.generation.make_prompt`,
seeded per request); ``new_tokens`` tokens, greedy, ``ignore_eos``, so every request generates
exactly ``new_tokens``. TTFT runs from the ``stream()`` call (queueing included) to the first token,
TPOT is the request's mean time per token after the first (the engine's
:class:`~edge_sdk.generation.results.GenerationTimings`); percentiles are numpy's linear
interpolation over the requests (with few requests the p99 is close to the slowest one).

Warm-up: ONNX Runtime's first passes at a new batch size are slow, so before measuring on an
engine of S slots, ``warmup`` rounds of S requests of staggered lengths run (every batch size 1..S
decodes, and later prompts prefill in chunks while earlier ones decode); the warm-up's wall time is
reported, its requests are not counted. Every report records the CPU (model, flags, load average
before and after), the options, and per scenario the counts (submitted = completed + refused +
failed), medians, percentiles and ratios.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import GenerationBusyError, OptionsError, TemplateError
from .generation import _pct, column, cpu_facts, environment, make_prompt, write_generation_json
from .machine import CPU_FLAGS
from .machine import loadavg as _loadavg
from .options import BenchError

if TYPE_CHECKING:  # pragma: no cover
    from ..generation.decoder import DecoderModel
    from ..generation.engine import GenerationEngine
    from ..package import ModelPackage

__all__ = [
    "DEFAULT_MULTISTREAM_STREAMS",
    "DEFAULT_REQUESTS",
    "DEFAULT_STREAMS",
    "DEFAULT_TPOT_P99_MS",
    "DEFAULT_TTFT_P99_MS",
    "INTERFERENCE_TARGET",
    "LOAD_SCENARIOS",
    "SCALING_TARGETS",
    "GenerationLoadOptions",
    "canonical_scenario",
    "chat_prompts",
    "render_generation_load_text",
    "run_generation_load",
    "search_rate",
    "write_generation_load_json",
]

SCHEMA = "edge-sdk-bench-generation-load/1"
#: The load scenarios, in the order they run.
LOAD_SCENARIOS: tuple[str, ...] = ("offline", "multi-stream", "server")
_ALIASES = {"multistream": "multi-stream", "multi_stream": "multi-stream"}
DEFAULT_REQUESTS = 16
DEFAULT_STREAMS = 4
DEFAULT_MULTISTREAM_STREAMS: tuple[int, ...] = (1, 2, 4, 8)
DEFAULT_REQUESTS_PER_STREAM = 4
DEFAULT_TRIAL_REQUESTS = 32
DEFAULT_TIME_LIMIT_S = 120.0
#: MLPerf Inference's LLM Server constraints (loadgen/mlperf.conf, llama2-70b), milliseconds at p99.
DEFAULT_TTFT_P99_MS = 2000.0
DEFAULT_TPOT_P99_MS = 200.0
#: Aggregate tokens/s at S streams over S=1 that the engine is built to reach.
SCALING_TARGETS: dict[int, float] = {4: 2.0, 8: 2.5}
#: TTFT p99 of a request arriving while others decode, over its idle p99, at most.
INTERFERENCE_TARGET = 2.0
REFERENCES = {
    "scenarios": "https://github.com/mlcommons/inference_policies/blob/master/inference_rules.adoc",
    "llm_latency_constraints": "https://github.com/mlcommons/inference/blob/master/mlperf.conf "
    "(now loadgen/mlperf.conf: llama2-70b.Server.ttft_latency = 2000, tpot_latency = 200, ms at p99)",
}
#: Share of the machine's CPU time other processes may use during a measured block before the report warns.
OTHERS_BUSY_WARN = 0.1
_pc = time.perf_counter
Progress = Callable[[str], None]

TOPICS = (
    "the water cycle", "how a bicycle's gears work", "why the sky is blue", "photosynthesis", "the printing press",
    "how vaccines train the immune system", "the rules of chess", "how a refrigerator keeps food cold", "tides and the moon",
    "how bread rises", "weather and climate", "how a compiler works", "volcanoes", "honeybees", "solar panels",
    "the Roman aqueducts", "how maps are drawn", "the speed of sound", "recycling plastic", "how a lighthouse works",
    "the first trains", "how birds migrate", "earthquakes", "how a battery stores energy",
)  # fmt: skip
TASKS = (
    "Explain {} to a ten-year-old.", "Write a short paragraph about {}.", "Give three facts about {}.",
    "Describe {} in plain words.", "What should a beginner know about {}?", "Why does {} matter?",
)  # fmt: skip


def _quiet(_: str) -> None:
    pass


def _proc_stat() -> tuple[int, int] | None:
    """(busy, total) jiffies over every CPU since boot (/proc/stat), None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def _cpu_meter() -> Callable[[], dict[str, Any]]:
    """Start measuring; the function returned gives this process's CPU seconds since, and the share
    of the machine's CPU time that was busy and that other processes used (``others_busy_fraction``:
    busy minus this process, over all CPUs; Linux only, and only over a second or more): what says
    whether a figure is clean."""
    a, t, w = _proc_stat(), os.times(), _pc()

    def stop() -> dict[str, Any]:
        b, t2 = _proc_stat(), os.times()
        own = (t2.user + t2.system) - (t.user + t.system)
        wall = _pc() - w
        out: dict[str, Any] = {"wall_s": round(wall, 4), "process_cpu_s": round(own, 3)}
        if a is not None and b is not None and b[1] > a[1] and wall >= 1.0:  # shorter: clock ticks (10 ms) blur it
            hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
            cap = (b[1] - a[1]) / hz
            busy = (b[0] - a[0]) / hz
            out["machine_busy_fraction"] = round(min(1.0, busy / cap), 4)
            out["others_busy_fraction"] = round(max(0.0, (busy - own) / cap), 4)
        return out

    return stop


def canonical_scenario(name: str) -> str:
    """``name`` as one of :data:`LOAD_SCENARIOS` ("multistream" is "multi-stream"); OptionsError otherwise."""
    s = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if s not in LOAD_SCENARIOS:
        raise OptionsError(f"scenario: expected one of {list(LOAD_SCENARIOS)} (or multistream), got {name!r}")
    return s


def _check_int(name: str, v: object, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise OptionsError(f"{name}: expected an int >= {lo}, got {v!r}")


def _check_num(name: str, v: object, *, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise OptionsError(f"{name}: expected a number > 0{' or None' if allow_none else ''}, got {v!r}")


@dataclass(frozen=True)
class GenerationLoadOptions:
    """One load benchmark's settings (all recorded in the report).

    ``scenarios``: names from :data:`LOAD_SCENARIOS`; ``variant``: one id (None: the one ``load``
    selects). ``streams``: engine slots; offline and server use the largest, multi-stream runs each
    (None: offline/server 4, multi-stream 1, 2, 4, 8). Offline: ``requests`` at once. Multi-stream:
    ``requests_per_stream`` per closed-loop client, ``time_limit_s`` per stream count; the
    interference probe: ``probe_runs`` idle and as many busy, with ``background_streams`` decoding.
    Server: ``trial_requests`` Poisson arrivals per trial (no arrivals after ``time_limit_s``);
    ``ttft_p99_ms`` / ``tpot_p99_ms`` the constraints; ``rate`` the first trial's rate (None: half the
    rate the warm-up (or offline) sustained); ``search`` False: only ``rate``; at most ``max_trials``
    trials, never above ``max_rate``, bisection until the bracket is within ``tolerance`` (relative).
    Requests: ``prompt_tokens`` random ids (None: chat prompts), or one ``prompt`` text for all;
    ``new_tokens`` each, greedy, ignore_eos; ``seed`` of the prompts and arrivals; ``warmup`` rounds
    per engine. Engine: ``queue_size``, ``prefill_chunk``, ``prefix_cache``, ``speculative``.
    Loading: ``threads``, ``context``, ``profile``, ``root``, ``cache_dir`` as for ``load``."""

    scenarios: tuple[str, ...] = ("offline",)
    variant: str | None = None
    streams: tuple[int, ...] | None = None
    requests: int = DEFAULT_REQUESTS
    requests_per_stream: int = DEFAULT_REQUESTS_PER_STREAM
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    probe_runs: int = 5
    background_streams: int = 3
    trial_requests: int = DEFAULT_TRIAL_REQUESTS
    ttft_p99_ms: float = DEFAULT_TTFT_P99_MS
    tpot_p99_ms: float = DEFAULT_TPOT_P99_MS
    rate: float | None = None
    search: bool = True
    max_trials: int = 8
    max_rate: float = 1000.0
    tolerance: float = 0.1
    prompt_tokens: int | None = None
    prompt: str | None = None
    new_tokens: int = 64
    seed: int = 0
    warmup: int = 1
    queue_size: int = 16
    prefill_chunk: int = 128
    prefix_cache: bool = True
    speculative: str | None = None
    threads: int | None = None
    context: int | None = None
    profile: str | None = None
    root: str = "/"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        scen = tuple(dict.fromkeys(canonical_scenario(s) for s in self.scenarios))
        if not scen:
            raise OptionsError(f"scenarios: expected at least one of {list(LOAD_SCENARIOS)}")
        object.__setattr__(self, "scenarios", tuple(s for s in LOAD_SCENARIOS if s in scen))
        if self.streams is not None:
            st = tuple(self.streams)
            if not st:
                raise OptionsError("streams: expected at least one stream count")
            for s in st:
                _check_int("streams", s, 1)
            object.__setattr__(self, "streams", tuple(dict.fromkeys(st)))
        for name in ("requests", "requests_per_stream", "probe_runs", "background_streams", "trial_requests", "max_trials", "new_tokens"):
            _check_int(name, getattr(self, name), 1)
        for name in ("warmup", "queue_size"):
            _check_int(name, getattr(self, name), 0)
        _check_int("prefill_chunk", self.prefill_chunk, 1)
        for name in ("time_limit_s", "ttft_p99_ms", "tpot_p99_ms", "max_rate", "tolerance"):
            _check_num(name, getattr(self, name))
        _check_num("rate", self.rate, allow_none=True)
        if not self.search and self.rate is None and "server" in self.scenarios:
            raise OptionsError("search=False needs a rate for the server scenario")
        if self.prompt_tokens is not None:
            _check_int("prompt_tokens", self.prompt_tokens, 1)
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise OptionsError(f"prompt: expected a non-empty str or None, got {self.prompt!r}")
        if self.prompt is not None and self.prompt_tokens is not None:
            raise OptionsError("prompt and prompt_tokens: give one or the other")
        if self.threads is not None:
            _check_int("threads", self.threads, 1)

    def engine_streams(self) -> int:
        """The slots of the offline and server engines."""
        return max(self.streams) if self.streams else DEFAULT_STREAMS

    def multistream_streams(self) -> tuple[int, ...]:
        """The stream counts the multi-stream scenario runs, ascending."""
        return tuple(sorted(self.streams)) if self.streams else DEFAULT_MULTISTREAM_STREAMS

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name."""
        d = asdict(self)
        d["streams"] = list(self.streams) if self.streams is not None else None
        return d


# ------------------------------------------------------------------------------------------ prompts


def chat_prompts(n: int, seed: int, start: int = 0) -> list[str]:
    """``n`` distinct user questions (requests ``start`` .. ``start + n - 1`` of the sequence ``seed``
    makes: every topic x task pairing once in a seeded order, then again with a number)."""
    rng = np.random.default_rng(seed)
    pairs = [(t, k) for t in range(len(TOPICS)) for k in range(len(TASKS))]
    order = rng.permutation(len(pairs))
    out = []
    for i in range(start, start + n):
        t, k = pairs[int(order[i % len(pairs)])]
        q = TASKS[k].format(TOPICS[t])
        out.append(q if i < len(pairs) else f"{q} (Question {i // len(pairs) + 1}.)")
    return out


class _Prompts:
    """The requests' prompts, each index its own (taken in order, never twice)."""

    def __init__(self, model: "DecoderModel", opts: GenerationLoadOptions) -> None:
        self.model = model
        self.opts = opts
        self.next = 0
        self.chat = True
        if opts.prompt is None and opts.prompt_tokens is None:
            try:
                model.encode([{"role": "user", "content": "Hello"}])
            except TemplateError:
                self.chat = False
        if opts.prompt is not None:
            self.source = f"the given text for every request ({len(model.encode(opts.prompt))} tokens; the prefix cache serves repeats)"
        elif opts.prompt_tokens is not None:
            self.source = f"{opts.prompt_tokens} random token ids per request (make_prompt, seed {opts.seed} + request index)"
        else:
            how = (
                "as a chat user message (the package's chat template)" if self.chat else "as plain text (the package has no chat template)"
            )
            self.source = f"a distinct question per request from {len(TOPICS)} topics x {len(TASKS)} tasks (seed {opts.seed}), {how}"
        self.lengths: list[int] = []

    def take(self, n: int) -> list[Any]:
        i0, self.next = self.next, self.next + n
        o = self.opts
        if o.prompt is not None:
            out: list[Any] = [o.prompt] * n
        elif o.prompt_tokens is not None:
            out = [make_prompt(self.model, o.prompt_tokens, o.seed + i)[0] for i in range(i0, i0 + n)]
        else:
            qs = chat_prompts(n, o.seed, i0)
            out = [[{"role": "user", "content": q}] for q in qs] if self.chat else qs
        return out


# ------------------------------------------------------------------------------------------ one request


def _record(r: Any, t_submit: float, t_done: float) -> dict[str, Any]:
    e = r.details.get("engine", {})
    t = r.timings
    rec = {
        "ttft_ms": float(t.ttft_ms),
        "tpot_ms": None if t.tpot_ms is None else float(t.tpot_ms),
        "total_ms": float(t.total_ms),
        "tokens": int(r.usage.completion_tokens),
        "prompt_tokens": int(r.usage.prompt_tokens),
        "queued_ms": e.get("queued_ms"),
        "max_batch": e.get("max_batch"),
        "prefix_cached_tokens": e.get("prefix_cached_tokens"),
        "finish_reason": r.finish_reason,
        "t_submit": t_submit,
        "t_done": t_done,
    }
    spec = r.details.get("speculation")
    if spec:
        rec["speculation"] = {k: spec.get(k) for k in ("drafted", "accepted", "passes")}
    return rec


def _summary(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and percentiles over completed requests' records."""

    def col(k: str) -> list[float]:
        return column(recs, k)

    tpot = col("tpot_ms")
    queued = col("queued_ms")
    out: dict[str, Any] = {
        "completed": len(recs),
        "output_tokens": int(sum(r["tokens"] for r in recs)),
        "prompt_tokens": _pct(col("prompt_tokens")) if recs else None,
        "ttft_ms": _pct(col("ttft_ms")) if recs else None,
        "tpot_ms": _pct(tpot) if tpot else None,
        "queued_ms": _pct(queued) if queued else None,
        "prefix_cached_tokens": int(sum(r.get("prefix_cached_tokens") or 0 for r in recs)),
        "max_batch_seen": max((r.get("max_batch") or 0 for r in recs), default=0),
    }
    spec = [r["speculation"] for r in recs if r.get("speculation")]
    if spec:
        d = sum(s["drafted"] or 0 for s in spec)
        a = sum(s["accepted"] or 0 for s in spec)
        out["speculation"] = {"requests": len(spec), "drafted": d, "accepted": a, "acceptance_rate": round(a / d, 4) if d else None}
    return out


def _engine_stats(eng: "GenerationEngine") -> dict[str, Any]:
    st = eng.stats()
    keep = ("max_streams", "queue_size", "kv_budget_tokens", "steps", "prefill_passes", "finished", "refused", "batch_histogram")
    out = {k: st[k] for k in keep}
    out["prefix_cache"] = st.get("prefix_cache")
    out["deterministic_single_stream"] = st.get("deterministic_single_stream")
    return out


def _throughput(summ: dict[str, Any], requests: int, wall: float) -> dict[str, Any]:
    """A block's summary with its wall time, output tokens/s and requests/s."""
    return {
        **summ,
        "wall_s": wall,
        "tokens_per_s": summ["output_tokens"] / wall if wall > 0 else None,
        "requests_per_s": requests / wall if wall > 0 else None,
    }


def _make_engine(model: "DecoderModel", opts: GenerationLoadOptions, streams: int, **over: Any) -> "GenerationEngine":
    from ..generation.engine import EngineOptions, GenerationEngine

    kw: dict[str, Any] = {
        "max_streams": streams,
        "queue_size": opts.queue_size,
        "prefill_chunk": opts.prefill_chunk,
        "prefix_cache": opts.prefix_cache,
        "speculative": opts.speculative,
    }
    kw.update(over)
    return GenerationEngine(model, EngineOptions(**kw))


def _warm(eng: "GenerationEngine", prompts: _Prompts, opts: GenerationLoadOptions) -> dict[str, Any]:
    """``warmup`` rounds of S requests at once, of staggered lengths (every batch size 1..S decodes)."""
    S = eng.options.max_streams
    G = opts.new_tokens
    walls = []
    for _ in range(opts.warmup):
        ps = prompts.take(S)
        t0 = _pc()
        ss = [eng.stream(p, max_new_tokens=max(2, G * (k + 1) // S), ignore_eos=True) for k, p in enumerate(ps)]
        for s in ss:
            s.until_done()
        walls.append(_pc() - t0)
    return {
        "rounds": opts.warmup,
        "requests_per_round": S,
        "new_tokens": [max(2, G * (k + 1) // S) for k in range(S)],
        "wall_s": [round(w, 4) for w in walls],
        "note": "excluded from every figure: ONNX Runtime's first passes at a new batch size are slow",
    }


def _submit(eng: "GenerationEngine", prompt: Any, G: int) -> tuple[Any, float]:
    t = _pc()
    return eng.stream(prompt, max_new_tokens=G, ignore_eos=True), t


def _finish(stream: Any, t_submit: float, failures: list[str]) -> dict[str, Any] | None:
    try:
        r = stream.until_done()
    except Exception as e:  # a failed request counts as failed; the scenario goes on
        failures.append(f"{type(e).__name__}: {e}")
        return None
    return _record(r, t_submit, _pc())


# ------------------------------------------------------------------------------------------ offline


def _offline(model: "DecoderModel", opts: GenerationLoadOptions, prompts: _Prompts, say: Progress) -> dict[str, Any]:
    S, N, G = opts.engine_streams(), opts.requests, opts.new_tokens
    eng = _make_engine(model, opts, S, queue_size=max(opts.queue_size, N))
    try:
        say(f"offline: warm-up on {eng.options.max_streams} stream(s)")
        warm = _warm(eng, prompts, opts)
        ps = prompts.take(N)
        say(f"offline: {N} requests at once, {G} new tokens each")
        refused = 0
        failures: list[str] = []
        pending: list[tuple[Any, float]] = []
        meter = _cpu_meter()
        t0 = _pc()
        for p in ps:
            try:
                pending.append(_submit(eng, p, G))
            except GenerationBusyError:
                refused += 1
        recs = [x for x in (_finish(s, t, failures) for s, t in pending) if x is not None]
        wall = _pc() - t0
        cpu = meter()
        summ = _summary(recs)
        out: dict[str, Any] = {
            "streams": S,
            "effective_streams": eng.options.max_streams,
            "queue_size": eng.options.queue_size,
            "submitted": N,
            "refused": refused,
            "failed": len(failures),
            "failures": failures[:5],
            **_throughput(summ, len(recs), wall),
            "cpu": cpu,
            "engine": _engine_stats(eng),
            "warmup": warm,
            "definition": "every request submitted at once; output tokens / wall time from the first submission to the last token",
        }
        return out
    finally:
        eng.close()


# ------------------------------------------------------------------------------------------ multi-stream


def _closed_loop(eng: "GenerationEngine", opts: GenerationLoadOptions, prompts: list[list[Any]]) -> dict[str, Any]:
    """len(prompts) clients, each running its prompts one after another (the next when the previous ends)."""
    G = opts.new_tokens
    recs: list[dict[str, Any]] = []
    failures: list[str] = []
    counts = {"submitted": 0, "refused": 0, "time_limited_clients": 0}
    lock = threading.Lock()
    start = threading.Barrier(len(prompts) + 1)
    t0_box: list[float] = []

    def client(mine: list[Any]) -> None:
        start.wait()
        t0 = t0_box[0]
        for p in mine:
            if _pc() - t0 > opts.time_limit_s:
                with lock:
                    counts["time_limited_clients"] += 1
                return
            with lock:
                counts["submitted"] += 1
            try:
                s, ts = _submit(eng, p, G)
            except GenerationBusyError:
                with lock:
                    counts["refused"] += 1
                continue
            rec = _finish(s, ts, failures)
            if rec is not None:
                with lock:
                    recs.append(rec)

    threads = [threading.Thread(target=client, args=(mine,), daemon=True) for mine in prompts]
    for t in threads:
        t.start()
    meter = _cpu_meter()
    t0_box.append(_pc())
    start.wait()
    for t in threads:
        t.join()
    cpu = meter()
    end = max((r["t_done"] for r in recs), default=_pc())
    wall = end - t0_box[0]
    summ = _summary(recs)
    return {
        **counts,
        "failed": len(failures),
        "failures": failures[:5],
        **_throughput(summ, len(recs), wall),
        "cpu": cpu,
    }


def _interference(model: "DecoderModel", opts: GenerationLoadOptions, prompts: _Prompts, say: Progress) -> dict[str, Any]:
    """A probe's TTFT on an idle engine, then while ``background_streams`` others decode."""
    B, n, G = opts.background_streams, opts.probe_runs, opts.new_tokens
    eng = _make_engine(model, opts, B + 1, prefix_cache=False)
    stop = threading.Event()
    try:
        warm = _warm(eng, prompts, opts)
        probes = prompts.take(n)
        meter = _cpu_meter()
        say(f"multi-stream: interference probe, {n} idle runs")
        idle: list[dict[str, Any]] = []
        failures: list[str] = []
        for p in probes:
            s, ts = _submit(eng, p, G)
            rec = _finish(s, ts, failures)
            if rec is not None:
                idle.append(rec)
        bg_prompts = prompts.take(B)
        bg_len = [len(model.encode(p)) for p in bg_prompts]
        bg_new = [max(G, min(eng.max_context - L - 1, max(8 * G, 256))) for L in bg_len]
        decoding = [threading.Event() for _ in range(B)]
        current: list[Any] = [None] * B
        restarts = [0] * B

        def background(j: int) -> None:
            while not stop.is_set():
                try:
                    s = eng.stream(bg_prompts[j], max_new_tokens=bg_new[j], ignore_eos=True)
                except Exception:  # the engine closed or refused: stop this background stream
                    return
                current[j] = s
                try:
                    for _ in s:
                        decoding[j].set()
                        if stop.is_set():
                            s.cancel()
                except Exception:  # closed under it
                    return
                finally:
                    decoding[j].clear()
                restarts[j] += 1

        threads = [threading.Thread(target=background, args=(j,), daemon=True) for j in range(B)]
        for t in threads:
            t.start()
        say(f"multi-stream: interference probe, {n} runs while {B} streams decode")
        busy: list[dict[str, Any]] = []
        at_submit: list[int] = []
        for p in probes:
            deadline = _pc() + 60.0
            while not all(d.is_set() for d in decoding) and _pc() < deadline:
                time.sleep(0.002)
            at_submit.append(sum(d.is_set() for d in decoding))
            s, ts = _submit(eng, p, G)
            rec = _finish(s, ts, failures)
            if rec is not None:
                busy.append(rec)
        stop.set()
        for s in current:
            if s is not None:
                s.cancel()
        for t in threads:
            t.join(timeout=60)
        cpu = meter()
        si, sb = _summary(idle), _summary(busy)
        ti, tb = si["ttft_ms"], sb["ttft_ms"]
        r99 = tb["p99"] / ti["p99"] if ti and tb and ti["p99"] > 0 else None
        r50 = tb["p50"] / ti["p50"] if ti and tb and ti["p50"] > 0 else None
        return {
            "background_streams": B,
            "engine_streams": eng.options.max_streams,
            "prefix_cache": False,
            "probe_runs": n,
            "failed": len(failures),
            "failures": failures[:5],
            "idle_ttft_ms": ti,
            "busy_ttft_ms": tb,
            "idle_tpot_ms": si["tpot_ms"],
            "busy_tpot_ms": sb["tpot_ms"],
            "ratio_p99": r99,
            "ratio_p50": r50,
            "target_ratio_p99": INTERFERENCE_TARGET,
            "met": None if r99 is None else r99 <= INTERFERENCE_TARGET,
            "background_decoding_at_submit": at_submit,
            "probe_max_batch": [r.get("max_batch") for r in busy],
            "background_new_tokens": bg_new,
            "background_restarts": restarts,
            "cpu": cpu,
            "warmup": warm,
            "definition": f"TTFT of a new request while {B} others decode vs the same requests on the idle engine "
            "(prefix cache off: a repeated probe must not be served from it)",
        }
    finally:
        stop.set()
        eng.close()


def _multistream(model: "DecoderModel", opts: GenerationLoadOptions, prompts: _Prompts, say: Progress) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for S in opts.multistream_streams():
        eng = _make_engine(model, opts, S)
        try:
            say(f"multi-stream: warm-up on {eng.options.max_streams} stream(s)")
            warm = _warm(eng, prompts, opts)
            R = opts.requests_per_stream
            ps = prompts.take(S * R)
            say(f"multi-stream: {S} closed-loop client(s) x {R} requests")
            row: dict[str, Any] = {"streams": S, "effective_streams": eng.options.max_streams, "clients": S, "requests_per_client": R}
            row.update(_closed_loop(eng, opts, [ps[c * R : (c + 1) * R] for c in range(S)]))
            tp = row["tpot_ms"]
            row["per_stream_tokens_per_s_p50"] = 1000.0 / tp["p50"] if tp and tp["p50"] > 0 else None
            row["engine"] = _engine_stats(eng)
            row["warmup"] = warm
            rows.append(row)
        finally:
            eng.close()
    base = next((r for r in rows if r["streams"] == 1), rows[0])
    for r in rows:
        r["ratio_vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"] if r["tokens_per_s"] and base["tokens_per_s"] else None
    targets: dict[str, Any] = {}
    for S, want in SCALING_TARGETS.items():
        hit = next((r for r in rows if r["streams"] == S), None)
        if hit is not None and base["streams"] == 1:
            ratio = hit["ratio_vs_baseline"]
            targets[str(S)] = {"target_ratio": want, "ratio": ratio, "met": bool(ratio and ratio >= want)}
    out: dict[str, Any] = {
        "baseline_streams": base["streams"],
        "rows": rows,
        "scaling_targets": targets,
        "definition": "S closed-loop clients (each submits its next request when its previous ends) on an engine of S slots; "
        "aggregate output tokens / wall time, and its ratio to the baseline (S=1 when run)",
    }
    out["interference"] = _interference(model, opts, prompts, say)
    return out


# ------------------------------------------------------------------------------------------ server


def search_rate(
    trial: Callable[[float], dict[str, Any]], start: float, *, max_trials: int, max_rate: float, tolerance: float = 0.1, search: bool = True
) -> dict[str, Any]:
    """The highest rate ``trial(rate)["passed"]`` holds for: doubling from ``start`` while trials pass
    (up to ``max_rate``), halving while they fail, then bisection between the highest pass and the
    lowest fail until ``hi / lo <= 1 + tolerance``; at most ``max_trials`` trials (``search`` False:
    one, at ``start``). Every pass is below every fail (a bisection point is between the two), so
    the bracket only narrows. Returns the trials (each with ``rate``), ``highest_passing_rate``
    (None when no trial passed), ``lowest_failing_rate``, why it stopped, and a sentence."""
    if not (start > 0 and math.isfinite(start)):
        raise OptionsError(f"start: expected a rate > 0, got {start!r}")
    trials: list[dict[str, Any]] = []
    lo: float | None = None
    hi: float | None = None
    rate = min(start, max_rate)
    stopped = "max_trials"
    while len(trials) < max_trials:
        t = dict(trial(rate))
        t["rate"] = rate
        trials.append(t)
        if t["passed"]:
            lo = rate
        else:
            hi = rate
        if not search:
            stopped = "no search"
            break
        if hi is None:
            if rate >= max_rate:
                stopped = "max_rate"
                break
            rate = min(rate * 2.0, max_rate)
        elif lo is None:
            rate = rate / 2.0
        else:
            if hi <= lo * (1.0 + tolerance):
                stopped = "converged"
                break
            rate = (lo + hi) / 2.0
    if lo is None:
        msg = f"no rate tried meets the constraints (lowest tried {min(t['rate'] for t in trials):.4g} req/s, {len(trials)} trial(s))"
    elif hi is None:
        msg = f"every rate tried passed: {lo:.4g} req/s is a lower bound (stopped: {stopped})"
    else:
        msg = f"highest passing rate {lo:.4g} req/s, lowest failing {hi:.4g} req/s (stopped: {stopped})"
    return {"highest_passing_rate": lo, "lowest_failing_rate": hi, "stopped": stopped, "trials": trials, "message": msg}


def _server_trial(
    eng: "GenerationEngine", opts: GenerationLoadOptions, prompts: list[Any], unit_gaps: np.ndarray, rate: float
) -> dict[str, Any]:
    G = opts.new_tokens
    arrivals = np.cumsum(unit_gaps / rate)
    arrivals -= arrivals[0]  # the first request at once
    pending: list[tuple[Any, float]] = []
    refused = 0
    issued = 0
    meter = _cpu_meter()
    t0 = _pc()
    for p, at in zip(prompts, arrivals):
        if at > opts.time_limit_s:
            break
        wait = t0 + float(at) - _pc()
        if wait > 0:
            time.sleep(wait)
        issued += 1
        try:
            pending.append(_submit(eng, p, G))
        except GenerationBusyError:
            refused += 1
    t_issue = _pc() - t0
    failures: list[str] = []
    recs = [x for x in (_finish(s, t, failures) for s, t in pending) if x is not None]
    end = max((r["t_done"] for r in recs), default=_pc())
    cpu = meter()
    summ = _summary(recs)
    ttft99 = summ["ttft_ms"]["p99"] if summ["ttft_ms"] else None
    tpot99 = summ["tpot_ms"]["p99"] if summ["tpot_ms"] else None
    reasons = []
    if refused:
        reasons.append(f"{refused} refused (GenerationBusyError)")
    if failures:
        reasons.append(f"{len(failures)} failed")
    if not recs:
        reasons.append("nothing completed")
    if ttft99 is not None and ttft99 > opts.ttft_p99_ms:
        reasons.append(f"TTFT p99 {ttft99:.1f} ms > {opts.ttft_p99_ms:g}")
    if tpot99 is not None and tpot99 > opts.tpot_p99_ms:
        reasons.append(f"TPOT p99 {tpot99:.2f} ms > {opts.tpot_p99_ms:g}")
    wall = end - t0
    return {
        "passed": not reasons,
        "reasons": reasons,
        "requests": len(prompts),
        "submitted": issued,
        "time_limited": issued < len(prompts),
        "refused": refused,
        "failed": len(failures),
        "failures": failures[:5],
        **summ,
        "ttft_p99_ms": ttft99,
        "tpot_p99_ms": tpot99,
        "offered_rate": (issued - 1) / float(arrivals[issued - 1]) if issued > 1 and arrivals[issued - 1] > 0 else None,
        "issue_s": t_issue,
        "wall_s": wall,
        "tokens_per_s": summ["output_tokens"] / wall if wall > 0 else None,
        "completed_per_s": len(recs) / wall if wall > 0 else None,
        "cpu": cpu,
    }


def _server(
    model: "DecoderModel", opts: GenerationLoadOptions, prompts: _Prompts, say: Progress, offline: dict[str, Any] | None
) -> dict[str, Any]:
    S, n = opts.engine_streams(), opts.trial_requests
    eng = _make_engine(model, opts, S)
    try:
        say(f"server: warm-up on {eng.options.max_streams} stream(s)")
        warm = _warm(eng, prompts, opts)
        if opts.rate is not None:
            start, how = opts.rate, "given"
        elif offline is not None and offline.get("requests_per_s") and offline["streams"] == S:
            start, how = 0.5 * offline["requests_per_s"], "half the offline scenario's requests/s"
        else:
            per_round = warm["wall_s"][-1] if warm["wall_s"] else None
            if per_round:
                start, how = 0.5 * eng.options.max_streams / per_round, "half the warm-up's requests/s"
            else:
                start, how = 1.0, "1 req/s (no warm-up to estimate from)"
        start = float(f"{min(start, opts.max_rate):.3g}")
        unit = np.random.default_rng(opts.seed).exponential(1.0, size=n)

        def trial(rate: float) -> dict[str, Any]:
            ps = prompts.take(n)  # every trial its own prompts: none served whole from the prefix cache
            say(f"server: trial at {rate:.4g} req/s ({n} Poisson arrivals)")
            return _server_trial(eng, opts, ps, unit, rate)

        res = search_rate(trial, start, max_trials=opts.max_trials, max_rate=opts.max_rate, tolerance=opts.tolerance, search=opts.search)
        best = next((t for t in res["trials"] if t["rate"] == res["highest_passing_rate"] and t["passed"]), None)
        return {
            "streams": S,
            "effective_streams": eng.options.max_streams,
            "queue_size": eng.options.queue_size,
            "ttft_p99_ms": opts.ttft_p99_ms,
            "tpot_p99_ms": opts.tpot_p99_ms,
            "requests_per_trial": n,
            "start_rate": start,
            "start_rate_from": how,
            **res,
            "tokens_per_s_at_highest": best["tokens_per_s"] if best else None,
            "engine": _engine_stats(eng),
            "warmup": warm,
            "definition": "Poisson arrivals (seeded exponential gaps at rate 1, divided by the rate); a trial passes when nothing "
            "was refused or failed and TTFT p99 and TPOT p99 meet the constraints; the figure is the highest passing rate",
        }
    finally:
        eng.close()


# ------------------------------------------------------------------------------------------ the run


def run_generation_load(
    package: "str | os.PathLike[str] | ModelPackage",
    options: GenerationLoadOptions | None = None,
    *,
    argv: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the load scenarios on a text-generation ``package``; returns the report (JSON-ready).
    Raises BenchError (not a text-generation package), and what ``load`` and the engine raise."""
    from ..model import LoadOptions, load_decoder
    from ..package import ModelPackage, default_cache_dir
    from ..profiles import resolve_profile

    opts = options or GenerationLoadOptions()
    say = progress or _quiet
    started = _dt.datetime.now(_dt.timezone.utc)
    t_origin = _pc()
    cpu_before = cpu_facts(opts.root)
    cache = Path(opts.cache_dir) if opts.cache_dir else default_cache_dir()
    pkg = package if isinstance(package, ModelPackage) else ModelPackage.open(package, cache_dir=cache)
    manifest = pkg.manifest
    if manifest.task != "text-generation" or manifest.generation is None:
        raise BenchError(
            f"package {manifest.name} has task {manifest.task!r}; the generation load benchmark needs a text-generation package"
        )
    detection = resolve_profile(opts.profile, root=opts.root)
    if opts.variant is not None and opts.variant not in [v.id for v in manifest.variants]:
        raise BenchError(f"variant {opts.variant!r} not in package {manifest.name}; it has {[v.id for v in manifest.variants]}")
    lo = LoadOptions(variant=opts.variant, threads=opts.threads, cache_dir=cache, root=opts.root, context=opts.context)
    say("loading")
    model = load_decoder(pkg, detection.profile, lo)
    warnings: list[str] = []
    scen: dict[str, Any] = {}
    try:
        prompts = _Prompts(model, opts)
        if model.deterministic:
            warnings.append("deterministic load: a variant that is not batch-invariant gets one engine slot")
        if "offline" in opts.scenarios:
            scen["offline"] = _offline(model, opts, prompts, say)
        if "multi-stream" in opts.scenarios:
            scen["multi-stream"] = _multistream(model, opts, prompts, say)
        if "server" in opts.scenarios:
            scen["server"] = _server(model, opts, prompts, say, scen.get("offline"))
        info = {
            "variant": model.variant.id,
            "threads": model.session_info.threads,
            "kv_slot_tokens": model.max_context,
            "backend": f"onnxruntime {model.session_info.runtime_version}",
        }
    finally:
        model.close()
    for name, s in scen.items():
        for row in s.get("rows", [s]):
            if row.get("effective_streams") is not None and row.get("streams") is not None and row["effective_streams"] != row["streams"]:
                warnings.append(f"{name}: the engine ran {row['effective_streams']} slot(s), not {row['streams']} (deterministic mode)")
    for where, blk in _measured_blocks(scen):
        o = (blk.get("cpu") or {}).get("others_busy_fraction")
        if o is not None and o > OTHERS_BUSY_WARN:
            warnings.append(f"{where}: other processes used {o:.0%} of the CPUs while it ran: its figures are not clean")
    load_after = _loadavg()
    if cpu_before["loadavg"] and cpu_before["cpu_count"] and cpu_before["loadavg"][0] > 0.7 * cpu_before["cpu_count"]:
        warnings.append(f"load average {cpu_before['loadavg'][0]} before the run on {cpu_before['cpu_count']} CPUs: other work shares them")
    return {
        "schema": SCHEMA,
        "kind": "text-generation-load",
        "package": {"name": manifest.name, "version": manifest.version, "path": str(pkg.root)},
        **info,
        "settings": {**opts.to_dict(), "greedy": True, "ignore_eos": True},
        "prompts": {"source": prompts.source, "taken": prompts.next},
        "references": REFERENCES,
        "environment": environment(started, _pc() - t_origin, detection.profile.name, cpu_before, load_after),
        "scenarios": scen,
        "warnings": warnings,
        "argv": list(argv) if argv is not None else None,
    }


def _measured_blocks(scen: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if "offline" in scen:
        out.append(("offline", scen["offline"]))
    if "multi-stream" in scen:
        out += [(f"multi-stream {r['streams']} stream(s)", r) for r in scen["multi-stream"]["rows"]]
        out.append(("multi-stream interference probe", scen["multi-stream"]["interference"]))
    if "server" in scen:
        out += [(f"server trial at {t['rate']:.4g} req/s", t) for t in scen["server"]["trials"]]
    return out


# ------------------------------------------------------------------------------------------ text


def _f(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _others(block: dict[str, Any]) -> str:
    o = (block.get("cpu") or {}).get("others_busy_fraction")
    return "-" if o is None else f"{o:.0%}"


def _p(d: dict[str, Any] | None, spec: str = ".1f") -> str:
    return "-" if not d else f"{d['p50']:{spec}}/{d['p90']:{spec}}/{d['p99']:{spec}}"


def render_generation_load_text(report: dict[str, Any]) -> str:
    """The tables the CLI prints."""
    env = report["environment"]
    cpu = env["cpu"]
    flags = ", ".join(k for k, v in cpu["flags"].items() if v) or "none of " + ", ".join(CPU_FLAGS)
    st = report["settings"]
    lines = [
        f"edge-sdk bench (text generation under load): {report['package']['name']} {report['package']['version']}, variant "
        f"{report['variant']}, {report['threads']} thread(s)",
        f"cpu: {cpu['cpu_model'] or 'unknown'} x {cpu['cpu_count']} ({flags}); load average before {env['loadavg_before']}, "
        f"after {env['loadavg_after']}; onnxruntime {env['onnxruntime']}",
        f"requests: {report['prompts']['source']}; {st['new_tokens']} new tokens, greedy, ignore_eos; engine prefix cache "
        f"{'on' if st['prefix_cache'] else 'off'}, speculative {st['speculative'] or 'off'}, prefill chunk {st['prefill_chunk']}",
    ]
    sc = report["scenarios"]
    if "offline" in sc:
        o = sc["offline"]
        lines += [
            "",
            f"offline ({o['submitted']} requests at once, {o['effective_streams']} streams): {_f(o['tokens_per_s'])} tokens/s, "
            f"{_f(o['requests_per_s'], '.2f')} req/s over {o['wall_s']:.2f} s; completed {o['completed']}, refused {o['refused']}, "
            f"failed {o['failed']}; other processes' CPU share {_others(o)}",
            f"  TTFT p50/p90/p99 ms {_p(o['ttft_ms'])}   TPOT p50/p90/p99 ms {_p(o['tpot_ms'], '.2f')}   queued p50/p99 ms "
            f"{_f((o['queued_ms'] or {}).get('p50'))}/{_f((o['queued_ms'] or {}).get('p99'))}",
        ]
    if "multi-stream" in sc:
        m = sc["multi-stream"]
        lines += [
            "",
            f"multi-stream (closed-loop clients; ratio vs {m['baseline_streams']} stream(s)):",
            f"{'streams':>7} {'done':>5} {'tok/s':>8} {'ratio':>6} {'per-stream tok/s':>16} {'TTFT p50/p90/p99 ms':>24} "
            f"{'TPOT p50/p90/p99 ms':>22} {'wall s':>7} {'others':>6}",
        ]
        for r in m["rows"]:
            lines.append(
                f"{r['streams']:>7} {r['completed']:>5} {_f(r['tokens_per_s']):>8} {_f(r['ratio_vs_baseline'], '.2f'):>6} "
                f"{_f(r['per_stream_tokens_per_s_p50']):>16} {_p(r['ttft_ms']):>24} {_p(r['tpot_ms'], '.2f'):>22} {r['wall_s']:>7.2f} {_others(r):>6}"
                + (f"  (time limit: {r['time_limited_clients']} client(s) stopped)" if r["time_limited_clients"] else "")
            )
        for S, t in m["scaling_targets"].items():
            lines.append(f"  target {S} streams >= {t['target_ratio']:g}x: {_f(t['ratio'], '.2f')}x, {'met' if t['met'] else 'NOT met'}")
        i = m["interference"]
        lines.append(
            f"  TTFT while {i['background_streams']} others decode: p50/p99 {_f((i['busy_ttft_ms'] or {}).get('p50'))}/"
            f"{_f((i['busy_ttft_ms'] or {}).get('p99'))} ms vs idle {_f((i['idle_ttft_ms'] or {}).get('p50'))}/"
            f"{_f((i['idle_ttft_ms'] or {}).get('p99'))} ms: {_f(i['ratio_p99'], '.2f')}x at p99 (target <= {i['target_ratio_p99']:g}x, "
            f"{'met' if i['met'] else 'NOT met'}; {i['probe_runs']} probes, decoding at submit {i['background_decoding_at_submit']})"
        )
    if "server" in sc:
        s = sc["server"]
        lines += [
            "",
            f"server (Poisson arrivals, {s['requests_per_trial']} per trial, {s['effective_streams']} streams, queue {s['queue_size']}; "
            f"TTFT p99 <= {s['ttft_p99_ms']:g} ms, TPOT p99 <= {s['tpot_p99_ms']:g} ms; start {s['start_rate']:g} req/s, "
            f"{s['start_rate_from']}):",
            f"{'rate':>9} {'pass':>5} {'sent':>5} {'done':>5} {'refused':>7} {'TTFT p99 ms':>11} {'TPOT p99 ms':>11} {'tok/s':>8}  reasons",
        ]
        for t in s["trials"]:
            lines.append(
                f"{t['rate']:>9.4g} {'yes' if t['passed'] else 'no':>5} {t['submitted']:>5} {t['completed']:>5} {t['refused']:>7} "
                f"{_f(t['ttft_p99_ms']):>11} {_f(t['tpot_p99_ms'], '.2f'):>11} {_f(t['tokens_per_s']):>8}  {'; '.join(t['reasons'])}"
            )
        lines.append(f"  {s['message']}")
    for w in report["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"


def write_generation_load_json(report: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``report`` as JSON (NaN refused); returns the path."""
    return write_generation_json(report, path)
