"""``run_bench``: open a package, load its variants, run the scenarios, return the report.

Order of a run: resolve the profile and the variants; load every variant (forced by id, the
backend timing race off); build the targets (the SDK arm per variant, plus a raw-runtime arm with
``vs_raw``); start the :class:`~edge_sdk.bench.monitor.ResourceMonitor`; per scenario, warm every
target up (excluded, reported) and run ``repetitions`` blocks per target, the targets' order
rotating from block to block (interleaved: a machine that drifts affects every target alike);
the SDK-vs-raw overhead (interleaved rounds); stop the monitor; the cold starts (fresh processes,
after the in-process measurements so they do not disturb them); assemble the report.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..profiles.facts import usable_cpus
from .machine import loadavg as _loadavg
from .monitor import ResourceMonitor, peak_rss_mb
from .options import BenchError, BenchOptions, named_variants
from .report import DESCRIPTIONS, SCHEMA_VERSION, build_row, clean
from .scenarios import Log, WarmUp, guarded, multi_stream_block, offline_block, rotate, server_block, single_stream_block, warm_up
from .stats import busy_union_s
from .targets import InputPool, RawLiteRTTarget, RawOrtTarget, SdkTarget, Target, image_spec_of, max_batch_of

__all__ = ["run_bench"]

_pc = time.perf_counter
_MAX_OFFLINE_QUERIES = 100_000
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def run_bench(
    package: str | os.PathLike[str],
    options: BenchOptions | None = None,
    *,
    wrap: Callable[[Any], Any] | None = None,
    argv: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Benchmark ``package`` on this machine; returns the report (a JSON-ready dict following
    ``schema.json``). ``wrap``: applied to every loaded model before it is measured (e.g. a
    wrapper that adds work); ``argv``: the command line, recorded; ``progress``: called with a
    line per step. Raises BenchError (bad variant, nothing runnable), ModelPackageError,
    ProfileError, BackendError."""
    from .._version import __version__
    from ..backends.base import all_backend_status
    from ..model import LoadOptions, load
    from ..package import ModelPackage, default_cache_dir
    from ..profiles import resolve_profile

    opts = options or BenchOptions()
    say = progress or _quiet
    origin = _pc()
    started = _dt.datetime.now(_dt.timezone.utc)
    load_before = _loadavg()
    warnings: list[str] = []
    cache = Path(opts.cache_dir) if opts.cache_dir else default_cache_dir()
    pkg = ModelPackage.open(package, cache_dir=cache)
    manifest = pkg.manifest
    detection = resolve_profile(opts.profile, root=opts.root)
    statuses = all_backend_status()
    base = LoadOptions(threads=opts.threads, cache_dir=cache, measure_backends=False, root=opts.root)

    # -- which variants ----------------------------------------------------------------------------
    selected_by_sdk = False
    chosen = named_variants(manifest, statuses, opts.all_variants, opts.variants, warnings)
    if chosen is not None:
        ids = chosen
    else:
        with load(pkg, detection.profile, LoadOptions(threads=opts.threads, cache_dir=cache, root=opts.root)) as m:
            ids = [m.variant.id]
        selected_by_sdk = True
    if not ids:
        raise BenchError(f"no variant of {manifest.name} can run here: " + "; ".join(warnings))

    # -- models, inputs, targets ---------------------------------------------------------------------
    say(f"loading {', '.join(ids)}")
    models: list[Any] = []
    targets: list[Target] = []
    raws: dict[str, Target] = {}
    remote = None
    try:
        for vid in ids:
            m = load(pkg, detection.profile, replace(base, variant=vid))
            models.append(wrap(m) if wrap is not None else m)
        remote = _remote_model(pkg, opts, detection) if opts.remote_url else None
        mode = _input_mode(opts.input_mode, models + ([remote] if remote is not None else []), warnings)
        pool = InputPool(mode, opts.pool, opts.seed, opts.image_hw)
        for m in models:
            targets.append(SdkTarget(m, pool, mode))
        remote_info = None
        if remote is not None:
            rt = SdkTarget(remote, pool, mode, label=f"{remote.variant.id} [remote]")
            rt.arm = "remote"
            targets.append(rt)
            info = remote.session.info
            remote_info = {
                "label": rt.label,
                "url": opts.remote_url,
                "variant": remote.variant.id,
                "runtime": f"{info.runtime} {info.runtime_version}",
            }
        if opts.vs_raw:
            for m in models:
                raw = _raw_target(pkg, m, pool, cache, detection, warnings)
                if raw is not None:
                    raws[m.variant.id] = raw
                    targets.append(raw)
        # -- measure ------------------------------------------------------------------------------
        scenarios: dict[str, Any] = {}
        overhead: list[dict[str, Any]] | None = None
        with ResourceMonitor(detection.profile, root=opts.root, interval_s=opts.sample_interval_s, origin=origin) as mon:
            for name in opts.scenarios:
                say(f"scenario {name}")
                mon.phase(name)
                scenarios[name] = _run_scenario(name, targets, opts, mon, origin, warnings)
            mon.phase(None)
            if raws:
                say("SDK vs raw runtime")
                mon.phase("overhead")
                overhead = [_overhead(m, raws[m.variant.id], pool, opts) for m in models if m.variant.id in raws]
                mon.phase(None)
        phases = mon.phases()
        sensors = mon.sensor_status()
        timeline = mon.timeline()
        variants_info = [_variant_info(m) for m in models]
        raw_info = [{"label": t.label, "variant": t.variant_id, "backend": t.backend, "runtime": getattr(t, "runtime_version", None),
                     "threads": getattr(t, "threads", None)} for t in raws.values()]  # fmt: skip
    finally:
        # every target, then what a failure may have left outside one (closing twice is harmless)
        for closable in [*targets, *models, *([remote] if remote is not None else [])]:
            try:
                closable.close()
            except Exception:  # closing is best effort; the report (or the error) is what matters
                pass
    if not sensors["temperature_available"]:
        warnings.append(f"temperature unknown throughout: {sensors['temperature_unknown_reason']}")
    if not sensors["power_available"]:
        warnings.append(f"board power unknown: energy per inference not reported ({sensors['power_unknown_reason']})")

    # -- cold start ----------------------------------------------------------------------------------
    cold: list[dict[str, Any]] | None = None
    if opts.cold_start:
        from .coldstart import measure_cold_start

        cold = []
        for vid in ids:
            say(f"cold start {vid}")
            got = measure_cold_start(
                str(pkg.source), vid, samples=opts.cold_samples, input_mode=mode, seed=opts.seed, profile=_profile_arg(opts, detection),
                threads=opts.threads, image_hw=opts.image_hw, root=opts.root,
            )  # fmt: skip
            for state in ("clear", "warm"):
                cold.append(_cold_row(vid, manifest.variant(vid).backend, state, got[state]))

    ended = _pc()
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "edge-sdk bench", "edge_sdk_version": __version__},
        "created_utc": started.isoformat(timespec="seconds"),
        "duration_s": ended - origin,
        "command": list(argv) if argv is not None else None,
        "settings": opts.to_dict(),
        "input": {"mode": mode, "pool": opts.pool, "seed": opts.seed, "image_hw": _image_hw(models, mode, opts)},
        "profile": {
            "name": detection.profile.name,
            "source": detection.source,
            "fallback": detection.fallback,
            "reasons": list(detection.reasons),
        },
        "package": {
            "name": manifest.name,
            "version": manifest.version,
            "task": manifest.task,
            "manifest_sha256": pkg.manifest_sha256,
            "path": str(pkg.source),
        },  # fmt: skip
        "variants": variants_info,
        "variant_selection": "selected by edge_sdk.load on this device"
        if selected_by_sdk
        else ("all runnable" if opts.all_variants else "forced"),
        "raw_arms": raw_info,
        "remote": remote_info,
        "environment": _environment(detection, statuses, load_before),
        "sensors": sensors,
        "scenarios": scenarios,
        "overhead": overhead,
        "cold_start": cold,
        "phases": phases,
        "timeline": timeline,
        "warnings": warnings,
    }
    report["environment"]["rss_peak_mb"] = peak_rss_mb()
    cleaned: dict[str, Any] = clean(report)
    return cleaned


# ----------------------------------------------------------------------------------------- set-up


def _remote_model(pkg: Any, opts: BenchOptions, detection: Any) -> Any:
    """The package's reference variant served at ``remote_url`` (privacy "allowed": the caller
    named the endpoint; only the generated inputs are sent)."""
    from ..remote.client import RemoteClient
    from ..remote.privacy import PrivacyPolicy
    from ..remote.session import remote_model

    token = None
    if opts.remote_token_env:
        token = os.environ.get(opts.remote_token_env)
        if not token:
            raise BenchError(f"remote_token_env: ${opts.remote_token_env} is empty or not set")
    client = RemoteClient(str(opts.remote_url), token=token)
    return remote_model(pkg, client, privacy=PrivacyPolicy("allowed"), profile=detection.profile, root=opts.root)


def _input_mode(wanted: str, models: Sequence[Any], warnings: list[str]) -> str:
    can_image = all(image_spec_of(m.inputs) is not None for m in models)
    if can_image:
        try:
            from .._deps import require_cv2

            require_cv2("image-mode benchmarking")
        except ImportError as e:
            if wanted == "image":
                raise
            warnings.append(f"input mode tensor: {e}")
            can_image = False
    if wanted == "image" and not can_image:
        raise BenchError("input mode image needs every variant to have exactly one input that declares preprocessing")
    if wanted == "auto":
        return "image" if can_image else "tensor"
    return wanted


def _image_hw(models: Sequence[Any], mode: str, opts: BenchOptions) -> list[int] | None:
    if mode != "image":
        return None
    if opts.image_hw:
        return list(opts.image_hw)
    spec = image_spec_of(models[0].inputs)
    return list(spec.preprocess.size_hw) if spec is not None and spec.preprocess is not None else None


def _session_options(model: Any, cache: Path, detection: Any) -> Any:
    return model.options.session_options(detection.profile, Path(model.options.cache_dir or cache), detection.facts.usable_cpus)


def _raw_target(pkg: Any, model: Any, pool: InputPool, cache: Path, detection: Any, warnings: list[str]) -> Target | None:
    v = model.variant
    sopts = _session_options(model, cache, detection)
    data = pkg.read_verified(v).data
    feeds = pool.tensors(model.inputs)
    mb = max_batch_of(model.inputs)
    try:
        if v.backend == "onnxruntime":
            if v.external_data:
                warnings.append(f"variant {v.id}: raw arm skipped (external data: the bytes alone are not the model)")
                return None
            return RawOrtTarget(v.id, data, sopts, feeds, mb)
        if v.backend == "litert":
            return RawLiteRTTarget(v.id, data, sopts, feeds, mb)
    except Exception as e:  # a runtime refusing what the SDK accepted is worth a warning, not a crash
        warnings.append(f"variant {v.id}: raw arm could not be built ({type(e).__name__}: {e})")
        return None
    warnings.append(f"variant {v.id}: no raw arm for backend {v.backend}")
    return None




def _profile_arg(opts: BenchOptions, detection: Any) -> str | None:
    """What the cold-start child resolves: the same profile (by path when it came from a file)."""
    if opts.profile is not None:
        return opts.profile
    path = getattr(detection.profile, "path", None)
    return str(path) if path is not None else detection.profile.name


def _variant_info(model: Any) -> dict[str, Any]:
    d = model.describe()
    v = model.variant
    return {
        "id": v.id,
        "backend": d["backend"],
        "precision": v.precision,
        "file": v.file,
        "sha256": v.sha256,
        "size": v.size,
        "runtime": d["runtime"],
        "threads": d["threads"],
        "providers": d["providers"],
        "delegates": d["delegates"],
        "notes": d["notes"],
        "optimized_cache": d["optimized_cache"],
        "session_create_ms": d["session_create_ms"],
        "max_batch": max_batch_of(model.inputs),
        "check_finite": model.options.check_finite,
    }


def _environment(detection: Any, statuses: dict[str, Any], load_before: list[float] | None) -> dict[str, Any]:
    facts = detection.facts
    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_model": facts.cpu_model,
        "cpu_count": os.cpu_count(),
        "mem_total_mb": facts.mem_total_mb,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "numpy": np.__version__,
        "runtimes": {
            n: (f"{s.runtime} {s.version}".strip() if s.available else None) for n, s in sorted(statuses.items())
        },  # backend -> runtime
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
    }


# ---------------------------------------------------------------------------------------- scenarios


@dataclass
class _Scenario:
    """One scenario's state while it runs: the targets, their logs and warm-ups, the extra fields
    each row gets, and the per-block bounds."""

    name: str
    targets: Sequence[Target]
    opts: BenchOptions
    mon: ResourceMonitor
    logs: dict[str, Log]
    warm: dict[str, WarmUp]
    block_s: float
    block_n: int | None
    settings: dict[str, Any]
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    deadline_ms: float | None = None

    @property
    def live(self) -> list[Target]:
        """The targets whose warm-up worked (the others are reported, not measured)."""
        return [t for t in self.targets if t.label in self.warm]

    def blocks(self) -> Iterator[tuple[int, Target]]:
        """(repetition, target) for every block, the target order rotating each repetition;
        the monitor accounts the block to its target while the caller runs it."""
        for rep in range(self.opts.repetitions):
            for t in rotate(self.live, rep):
                with self.mon.window(_key(self.name, t)):
                    yield rep, t


def _run_scenario(
    name: str, targets: Sequence[Target], opts: BenchOptions, mon: ResourceMonitor, origin: float, warnings: list[str]
) -> dict[str, Any]:
    """Warm every target up, run the scenario's blocks, build its rows."""
    reps = opts.repetitions
    batches = {t.label: _offline_batch(t, opts, warnings) if name == "offline" else 1 for t in targets}
    logs = {t.label: Log(t.label) for t in targets}
    warm: dict[str, WarmUp] = {}
    for t in targets:
        try:
            warm[t.label] = warm_up(t, opts.warmup, batch=batches[t.label])
        except Exception as e:
            logs[t.label].error(e)
            logs[t.label].notes.append("warm-up failed; the target was not measured")
    block_n = math.ceil(opts.count / reps) if opts.count is not None else None
    settings: dict[str, Any] = {"repetitions": reps, "block_s": opts.duration_s / reps, "block_queries": block_n, "warmup": opts.warmup}
    sc = _Scenario(name, targets, opts, mon, logs, warm, opts.duration_s / reps, block_n, settings, {t.label: {} for t in targets})
    if name == "single-stream":
        _single_stream(sc)
    elif name == "multi-stream":
        _multi_stream(sc)
    elif name == "server":
        _server(sc)
    else:
        _offline(sc, batches)
    rows = []
    for t in targets:
        lg = logs[t.label]
        a = lg.array()
        res = None
        if t.label in warm:
            res = mon.summary(_key(name, t), busy_union_s(a[:, 2], a[:, 3]) if a.size else 0.0, len(a))
        row = build_row(name, t, lg, warm.get(t.label), res, origin=origin, keep_samples=opts.keep_samples, deadline_ms=sc.deadline_ms,
                        extra=sc.extra[t.label])  # fmt: skip
        rows.append(row)
    return {"description": DESCRIPTIONS[name], "settings": settings, "rows": rows}


def _single_stream(sc: _Scenario) -> None:
    for rep, t in sc.blocks():
        lg = sc.logs[t.label]
        guarded(lg, single_stream_block, t, lg, rep, sc.block_s, sc.block_n, offset=rep * 7919)


def _multi_stream(sc: _Scenario) -> None:
    o = sc.opts
    sc.deadline_ms = o.frame_deadline_ms
    dur = sc.block_s if sc.block_n is None else min(sc.block_s, sc.block_n / (o.streams * o.fps))
    dur = max(dur, 1.0 / o.fps)
    sc.settings.update(streams=o.streams, fps=o.fps, deadline_ms=sc.deadline_ms, block_s=dur)
    for rep, t in sc.blocks():
        lg = sc.logs[t.label]
        guarded(lg, multi_stream_block, t, lg, rep, dur, o.streams, o.fps)
    frames = max(1, math.ceil(dur * o.fps - 1e-9))
    for t in sc.live:
        lg = sc.logs[t.label]
        a = lg.array()
        done = np.bincount(a[:, 9].astype(int), minlength=o.streams) if a.size else np.zeros(o.streams, dtype=int)
        late = int(np.sum((a[:, 3] - a[:, 1]) * 1e3 > sc.deadline_ms)) if a.size else 0
        sc.extra[t.label] = {
            "streams": o.streams,
            "fps": o.fps,
            "deadline_ms": sc.deadline_ms,
            "frames_per_stream": list(lg.issued_per_stream),
            "expected_frames_per_stream": frames * o.repetitions,
            "completed_per_stream": [int(x) for x in done],
            "dropped_per_stream": list(lg.dropped_per_stream),
            "dropped_pct": 100.0 * lg.dropped / lg.issued if lg.issued else 0.0,
            "late_pct": 100.0 * late / lg.issued if lg.issued else 0.0,
        }


def _server(sc: _Scenario) -> None:
    o = sc.opts
    drain = min(10.0, max(1.0, 3 * o.objective_ms / 1e3))
    searches: dict[str, Any] = {}
    if o.search:
        sc.mon.phase(f"{sc.name} (rate search)")
        for ti, t in enumerate(sc.live):
            with sc.mon.window(_key(sc.name, t) + "#search"):
                searches[t.label] = search_max_rate(t, o, sc.warm[t.label].per_query_s, seed=o.seed * 1000 + ti)
        sc.mon.phase(sc.name)
    rate, how = _server_rate(o, searches)
    dur = sc.block_s if sc.block_n is None else max(1.0 / rate, min(sc.block_s, sc.block_n / rate))
    sc.settings.update(objective_ms=o.objective_ms, objective_percentile=o.objective_percentile, workers=o.server_workers, drain_s=drain,
                       rate_qps=o.rate_qps, measured_rate_qps=rate, rate_from=how, block_s=dur)  # fmt: skip
    for rep, t in sc.blocks():
        lg = sc.logs[t.label]
        rng = np.random.default_rng([o.seed, 3, rep, list(sc.targets).index(t)])
        guarded(lg, server_block, t, lg, rep, rate, dur, rng, workers=o.server_workers, drain_s=drain, offset=rep * 7919)
    window = dur * o.repetitions
    for t in sc.live:
        lg = sc.logs[t.label]
        a = lg.array()
        lat = (a[:, 3] - a[:, 1]) * 1e3 if a.size else np.zeros(0)
        at = float(np.percentile(lat, o.objective_percentile)) if lat.size else None
        lag = np.asarray(lg.arrival_lag_s) * 1e3
        complete = lg.dropped == 0 and lg.errors == 0 and lat.size > 0
        sc.extra[t.label] = {
            "target_rate_qps": rate,
            "achieved_rate_qps": lg.issued / window,
            "window_s": window,
            "arrival_lag_ms": {
                "p50": float(np.median(lag)) if lag.size else None,
                "p99": float(np.percentile(lag, 99)) if lag.size else None,
                "max": float(lag.max()) if lag.size else None,
            },
            "workers": o.server_workers,
            "objective_ms": o.objective_ms,
            "objective_percentile": o.objective_percentile,
            "latency_at_objective_ms": at,
            "meets_objective": bool(complete and at is not None and at <= o.objective_ms),
            "p99_within_objective": bool(lat.size and float(np.percentile(lat, 99)) <= o.objective_ms),
            "p99_9_within_objective": bool(lat.size and float(np.percentile(lat, 99.9)) <= o.objective_ms),
            "search": searches.get(t.label),
        }


def _offline(sc: _Scenario, batches: dict[str, int]) -> None:
    o = sc.opts
    cap = 3 * sc.block_s + 2.0
    for rep, t in sc.blocks():
        b = batches[t.label]
        workers = 1 if b > 1 else (o.offline_workers or usable_cpus())
        if sc.block_n is not None:
            n = sc.block_n
        else:  # enough for about block_s at the warm-up's pace
            n = int(min(_MAX_OFFLINE_QUERIES, max(b, math.ceil(sc.block_s / (sc.warm[t.label].per_query_s or 1e-3)))))
        lg = sc.logs[t.label]
        guarded(lg, offline_block, t, lg, rep, n, batch=b, workers=workers, time_cap_s=cap, offset=rep * 7919)
        sc.extra[t.label] = {
            "mode": "batch" if b > 1 else "pool",
            "batch": b,
            "workers": workers,
            "time_cap_s": cap,
            "queries_per_repetition": n,
        }
    sc.settings.update(offline_batch=o.offline_batch, offline_workers=o.offline_workers, time_cap_s=cap)


def _server_rate(opts: BenchOptions, searches: dict[str, Any]) -> tuple[float, str]:
    """The one arrival rate every target is measured at (latencies compare at equal load):
    ``rate_qps``, else 80 % of the lowest highest-rate-meeting-the-objective the searches found,
    else the lowest rate probed."""
    if opts.rate_qps is not None:
        return opts.rate_qps, "--rate"
    found = [s["max_rate_qps"] for s in searches.values() if s["max_rate_qps"] is not None]
    if found and len(found) == len(searches):
        return 0.8 * min(found), "80 % of the lowest rate meeting the objective among the targets"
    probed = [p["rate_qps"] for s in searches.values() for p in s["probes"]]
    return (min(probed) if probed else 1.0), "the lowest probed rate (a target met the objective at no probed rate)"


def _key(scenario: str, t: Target) -> str:
    return f"{scenario}/{t.label}"


def _offline_batch(t: Target, opts: BenchOptions, warnings: list[str]) -> int:
    if opts.offline_batch is None:
        return t.max_batch
    if opts.offline_batch > t.max_batch:
        warnings.append(f"{t.label}: offline batch {opts.offline_batch} exceeds the model's {t.max_batch}; using {t.max_batch}")
        return t.max_batch
    return opts.offline_batch


# ------------------------------------------------------------------------------------------ server search


def search_max_rate(target: Target, opts: BenchOptions, per_query_s: float | None, *, seed: int) -> dict[str, Any]:
    """The highest Poisson rate whose probe meets the objective: start at half the rate the
    warm-up's service time allows, double until a probe fails (halve until one passes), then
    bisect until the bracket is within ``search_tolerance`` of its top; at most ``max_probes``
    probes of ``probe_s`` each, never above ``max_rate_qps``. A probe passes when every query
    completed without error and its latency percentile is within the objective."""
    workers = opts.server_workers
    capacity = workers / per_query_s if per_query_s else 100.0
    rate = min(opts.max_rate_qps, max(1.0, 0.5 * capacity))
    drain = min(10.0, max(0.25, 3 * opts.objective_ms / 1e3))
    lo: float | None = None
    hi: float | None = None
    probes: list[dict[str, Any]] = []
    stopped = f"probe limit ({opts.max_probes}) reached"
    for p in range(opts.max_probes):
        lg = Log(target.label)
        rng = np.random.default_rng([seed, 7, p])
        guarded(lg, server_block, target, lg, 0, rate, opts.probe_s, rng, workers=workers, drain_s=drain, offset=p * 7919)
        a = lg.array()
        lat = (a[:, 3] - a[:, 1]) * 1e3 if a.size else np.zeros(0)
        at = float(np.percentile(lat, opts.objective_percentile)) if lat.size else None
        ok = bool(lat.size and lg.dropped == 0 and lg.errors == 0 and at is not None and at <= opts.objective_ms)
        probes.append({"rate_qps": rate, "issued": lg.issued, "completed": int(len(a)), "dropped": lg.dropped, "errors": lg.errors,
                       "latency_at_objective_ms": at, "meets": ok})  # fmt: skip
        if ok:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None and hi - lo <= opts.search_tolerance * hi:
            stopped = f"bracket within {opts.search_tolerance:.0%}"
            break
        if hi is None:
            if rate >= opts.max_rate_qps:
                stopped = f"reached max_rate_qps ({opts.max_rate_qps:g}) still meeting the objective"
                break
            rate = min(opts.max_rate_qps, rate * 2)
        elif lo is None:
            if rate <= 0.5:
                stopped = "no rate down to 0.5 q/s met the objective"
                break
            rate = rate / 2
        else:
            rate = (lo + hi) / 2
    return {"max_rate_qps": lo, "lowest_failing_qps": hi, "probe_s": opts.probe_s, "probes": probes, "stopped": stopped}


# ------------------------------------------------------------------------------------------ overhead


def _overhead(model: Any, raw: Target, pool: InputPool, opts: BenchOptions) -> dict[str, Any]:
    """SDK ``predict`` on a model-ready tensor vs the raw runtime's call on the same tensor:
    interleaved rounds (the arm order alternates), per-call wall times."""
    feeds = pool.tensors(model.inputs)
    n = len(feeds)
    pc = time.perf_counter_ns
    for i in range(max(3, opts.warmup)):
        model.predict(feeds[i % n])
        raw.one(i)
    t0 = pc()
    for i in range(5):
        model.predict(feeds[i % n])
    est = max(1, (pc() - t0) // 5)
    rounds = 10
    budget_ns = min(opts.duration_s, 5.0) * 1e9 / (2 * rounds)
    per = int(min(2000, max(5, budget_ns // est)))
    sdk_ns: list[int] = []
    raw_ns: list[int] = []
    stages: list[tuple[float, float, float]] = []
    k = 0
    for r in range(rounds):
        arms = ("raw", "sdk") if r % 2 == 0 else ("sdk", "raw")
        for arm in arms:
            for _ in range(per):
                i = k % n
                k += 1
                if arm == "sdk":
                    t = pc()
                    res = model.predict(feeds[i])
                    sdk_ns.append(pc() - t)
                    tm = res.timings
                    stages.append((tm.validate_ms, tm.inference_ms, tm.decode_ms))
                else:
                    t = pc()
                    raw.one(i)
                    raw_ns.append(pc() - t)
    s = np.asarray(sdk_ns, np.float64) / 1e3
    w = np.asarray(raw_ns, np.float64) / 1e3
    paired = float(np.median(np.median(s.reshape(rounds, -1), axis=1) - np.median(w.reshape(rounds, -1), axis=1)))
    st = np.asarray(stages) * 1e3
    mismatches = raw.option_mismatches(model.session) if isinstance(raw, RawOrtTarget) else []
    return {
        "variant": model.variant.id,
        "backend": raw.backend,
        "sdk_path": "predict(model-ready tensor)",
        "raw_path": "InferenceSession.run" if isinstance(raw, RawOrtTarget) else "Interpreter set_tensor/invoke/get_tensor",
        "calls": per * rounds,
        "rounds": rounds,
        "raw_median_us": float(np.median(w)),
        "raw_p99_us": float(np.percentile(w, 99)),
        "sdk_median_us": float(np.median(s)),
        "sdk_p99_us": float(np.percentile(s, 99)),
        "added_us": float(np.median(s) - np.median(w)),
        "paired_added_us": paired,
        "ratio": float(np.median(s) / np.median(w)) if np.median(w) > 0 else None,
        "sdk_stages_us": {
            "validate": float(np.median(st[:, 0])),
            "inference": float(np.median(st[:, 1])),
            "decode": float(np.median(st[:, 2])),
        },
        "session_options_mismatches": mismatches,
    }


# ------------------------------------------------------------------------------------------ cold start rows


def _cold_row(variant: str, backend: str, state: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("import_ms", "open_ms", "load_ms", "session_create_ms", "first_inference_ms", "cold_start_ms", "process_ms")
    med = {k: float(np.median([s[k] for s in samples])) for k in keys}
    states = sorted({(s["optimized_cache"] or "none").split(" ")[0] for s in samples})
    return {
        "variant": variant,
        "backend": backend,
        "cache": state,
        "samples": len(samples),
        "median": med,
        "cache_state": ", ".join(states) if backend == "onnxruntime" else "n/a (no optimised-model cache)",
        "cache_used": [bool(s["cache_used"]) for s in samples],
        "runs": samples,
    }
