"""The benchmark report: rows built from the harness logs, the JSON document, the text table.

The JSON document follows ``edge_sdk/bench/schema.json`` (:func:`load_schema`,
:func:`validate_report`); ``docs/benchmarks/README.md`` explains every part. Numbers keep 6 significant
digits (kept latency samples: 4 decimals of a millisecond) so reports stay small and diffable.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .options import BenchError
from .scenarios import Log, WarmUp
from .stats import summary
from .targets import Target

__all__ = [
    "SCHEMA_VERSION",
    "build_row",
    "clean",
    "dumps",
    "load_schema",
    "read_json",
    "render_markdown",
    "render_text",
    "validate_report",
    "write_json",
]

SCHEMA_VERSION = 1

#: per-repetition metrics each scenario records (the comparison works on these)
REP_METRICS: dict[str, tuple[str, ...]] = {
    "single-stream": ("latency_p50_ms", "latency_p90_ms", "throughput_qps"),
    "multi-stream": ("latency_p50_ms", "latency_p99_ms", "dropped_pct", "late_pct"),
    "server": ("latency_p50_ms", "latency_p99_ms"),
    "offline": ("throughput_qps",),
}

DESCRIPTIONS = {
    "single-stream": "one query at a time; the next is issued when the previous completes (latency = the call)",
    "multi-stream": "N streams of frames at a fixed rate each; latency from the frame's due time",
    "server": "Poisson arrivals at a target rate, open loop; latency from the scheduled arrival",
    "offline": "all queries issued at once; throughput (latency from the common issue time)",
}


def clean(o: Any, digits: int = 6) -> Any:
    """JSON-ready: numpy scalars to Python, floats to ``digits`` significant digits (an energy of
    1e-4 J keeps its precision), NaN/inf to None."""
    if isinstance(o, Mapping):
        return {str(k): clean(v, digits) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v, digits) for v in o]
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, (int, np.integer)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        f = float(o)
        return float(f"{f:.{digits}g}") if math.isfinite(f) else None
    return o


def _stage(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(values.mean()), "p50": float(np.median(values)), "p99": float(np.percentile(values, 99))}


def _rep_values(scenario: str, a: np.ndarray, log: Log, deadline_ms: float | None) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {m: [] for m in REP_METRICS[scenario]}
    for b in sorted(log.blocks, key=lambda b: b.rep):
        r = a[a[:, 0] == b.rep] if a.size else a
        lat = (r[:, 3] - r[:, 1]) * 1e3 if r.size else np.zeros(0)
        wall = b.end - b.begin
        for m in out:
            v: float | None
            if m == "latency_p50_ms":
                v = float(np.median(lat)) if lat.size else None
            elif m == "latency_p90_ms":
                v = float(np.percentile(lat, 90)) if lat.size else None
            elif m == "latency_p99_ms":
                v = float(np.percentile(lat, 99)) if lat.size else None
            elif m == "throughput_qps":
                v = len(r) / wall if wall > 0 else None
            elif m == "dropped_pct":
                v = 100.0 * b.dropped / b.issued if b.issued else None
            elif m == "late_pct":
                late = int(np.sum(lat > deadline_ms)) if deadline_ms is not None else 0
                v = 100.0 * late / b.issued if b.issued else None
            else:  # pragma: no cover - REP_METRICS and this table move together
                raise KeyError(m)
            out[m].append(v)
    return out


def _subsample(t: np.ndarray, y: np.ndarray, keep: int) -> dict[str, list[float]]:
    if t.size > keep:
        idx = np.linspace(0, t.size - 1, keep).round().astype(int)
        t, y = t[idx], y[idx]
    return {"t_s": [round(float(v), 3) for v in t], "latency_ms": [round(float(v), 4) for v in y]}


def build_row(
    scenario: str,
    target: Target,
    log: Log,
    warm: WarmUp | None,
    resources_: Mapping[str, Any] | None,
    *,
    origin: float,
    keep_samples: int,
    deadline_ms: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One target's results in one scenario (see the schema's ``row``)."""
    a = log.array()
    lat = (a[:, 3] - a[:, 1]) * 1e3 if a.size else np.zeros(0)
    queue = (a[:, 2] - a[:, 1]) * 1e3 if a.size else np.zeros(0)
    service = (a[:, 3] - a[:, 2]) * 1e3 if a.size else np.zeros(0)
    completed = int(len(a))
    measured_s = sum(b.end - b.begin for b in log.blocks)
    late = int(np.sum(lat > deadline_ms)) if deadline_ms is not None and lat.size else 0
    stages = {"queue": _stage(queue)}
    for j, name in enumerate(target.stage_names):
        stages[name] = _stage(a[:, 4 + j] if a.size else np.zeros(0))
    stages["service"] = _stage(service)
    res = dict(resources_ or {})
    row: dict[str, Any] = {
        "label": target.label,
        "variant": target.variant_id,
        "arm": target.arm,
        "backend": target.backend,
        "input": target.input_desc,
        "warmup": None
        if warm is None
        else {"queries": warm.queries, "seconds": warm.seconds, "first_ms": warm.first_ms, "median_ms": warm.median_ms},
        "counts": {"issued": log.issued, "completed": completed, "dropped": log.dropped, "errors": log.errors, "late": late},
        "latency_ms": summary(lat),
        "throughput_qps": completed / measured_s if measured_s > 0 else None,
        "measured_s": measured_s,
        "stages_ms": stages,
        "repetitions": _rep_values(scenario, a, log, deadline_ms),
        "resources": res or None,
        "scenario": dict(extra or {}),
        "errors": list(log.error_messages),
        "notes": list(log.notes),
        "samples": _subsample(a[:, 1] - origin if a.size else np.zeros(0), lat, keep_samples),
    }
    return row


# ----------------------------------------------------------------------------------------- schema


def load_schema() -> dict[str, Any]:
    """The report's JSON Schema (shipped as ``edge_sdk/bench/schema.json``)."""
    text = resources.files(__package__).joinpath("schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def validate_report(report: Mapping[str, Any]) -> None:
    """Raise BenchError when ``report`` does not follow the schema. Needs ``jsonschema``
    (the dev extra); without it only the top-level keys and the schema version are checked."""
    schema = load_schema()
    try:
        import jsonschema
    except ImportError:
        missing = [k for k in schema.get("required", []) if k not in report]
        if missing or report.get("schema_version") != SCHEMA_VERSION:
            raise BenchError(f"not an edge-sdk bench report (schema {SCHEMA_VERSION}): missing {missing}") from None
        return
    try:
        jsonschema.validate(report, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise BenchError(f"report does not follow the schema at {where}: {e.message}") from None


def dumps(o: Any, indent: int = 1, _level: int = 0) -> str:
    """JSON with objects indented and lists of scalars on one line (sample arrays stay compact)."""
    pad = " " * (indent * (_level + 1))
    end = " " * (indent * _level)
    if isinstance(o, Mapping):
        if not o:
            return "{}"
        items = [f"{pad}{json.dumps(str(k))}: {dumps(v, indent, _level + 1)}" for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(o, (list, tuple)):
        if all(not isinstance(v, (Mapping, list, tuple)) for v in o):
            return "[" + ", ".join(json.dumps(v) for v in o) + "]"
        return "[\n" + ",\n".join(pad + dumps(v, indent, _level + 1) for v in o) + "\n" + end + "]"
    return json.dumps(o)


def write_json(report: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``report`` (see :func:`dumps`); creates the folder."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(dumps(report) + "\n", encoding="utf-8")
    return p


def read_json(path: str | Path) -> dict[str, Any]:
    """A report from ``path``, checked against the schema. Raises BenchError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot read report {str(path)!r}: {e}") from e
    if not isinstance(data, dict):
        raise BenchError(f"{path}: not a bench report (expected a JSON object)")
    validate_report(data)
    return data


# ------------------------------------------------------------------------------------------- text


def _f(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ", align: str = "") -> list[str]:
    """A plain-text table; ``align``: one letter per column, ``l`` or ``r`` (default: the first left, the rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for k, r in enumerate(cells):
        out.append(indent + "  ".join(c.ljust(w) if align[i] == "l" else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if k == 0:
            out.append(indent + "  ".join("-" * w for w in widths))
    return out


def _at_most(count: int | None) -> str:
    return "" if count is None else f" (at most {count} queries)"


def _energy(v: Any) -> str:
    return "unknown" if v is None else f"{v * 1e3:.3f} mJ"


def render_text(report: Mapping[str, Any]) -> str:
    """The human summary printed on stdout."""
    L: list[str] = []
    pkg, env, st, prof = report["package"], report["environment"], report["settings"], report["profile"]
    L.append(f"edge-sdk bench: {pkg['name']} {pkg['version']} (manifest sha256 {pkg['manifest_sha256'][:16]}), profile {prof['name']}")
    rts = ", ".join(v for v in env["runtimes"].values() if v)
    L.append(
        f"machine: {env['machine']}, {env['cpu_count']} CPUs ({env.get('cpu_model') or 'cpu model unknown'}), Python {env['python']}, {rts}"
    )
    L.append(
        f"settings: input {report['input']['mode']}, pool {st['pool']}, seed {st['seed']}, {st['duration_s']:g} s x {st['repetitions']} "
        f"repetitions per target{_at_most(st['count'])}, warm-up {st['warmup']} queries, "
        f"threads {st['threads'] or 'profile'}"
    )
    sen = report["sensors"]
    temp = "temperature read" if sen["temperature_available"] else f"temperature unknown ({sen['temperature_unknown_reason']})"
    power = "board power read" if sen["power_available"] else f"board power unknown ({sen['power_unknown_reason']})"
    L.append(f"sensors: {temp}; {power}; governor (observing, no actions) ended {sen['governor']['final_state']}")
    for name, sc in report["scenarios"].items():
        L.append("")
        L.append(f"== {name}: {sc['description']}")
        rows = sc["rows"]
        header = ["target", "issued", "done", "drop", "err"]
        if name == "multi-stream":
            header.append("late")
        header += ["p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "qps", "cpu %", "energy/inf"]
        body = []
        for r in rows:
            c, lat, res = r["counts"], r["latency_ms"], r["resources"] or {}
            line = [r["label"], c["issued"], c["completed"], c["dropped"], c["errors"]]
            if name == "multi-stream":
                line.append(c["late"])
            line += [_f(lat["p50"]), _f(lat["p90"]), _f(lat["p99"]), _f(lat["p99_9"]), _f(lat["max"]), _f(r["throughput_qps"], 1)]
            line += [_f(res.get("process_cpu_pct"), 0), _energy(res.get("energy_per_inference_j"))]
            body.append(line)
        L += _table(header, body)
        stage_names = ["queue", "preprocess", "validate", "inference", "remote", "decode", "service"]
        present = [s for s in stage_names if any(s in r["stages_ms"] for r in rows)]
        L.append("  stages (median ms):")
        L += _table(
            ["target", *present], [[r["label"], *(_f((r["stages_ms"].get(s) or {}).get("p50")) for s in present)] for r in rows], "    "
        )
        if name == "multi-stream":
            for r in rows:
                s = r["scenario"]
                L.append(
                    f"  {r['label']}: {s['streams']} streams x {s['fps']:g} fps, deadline {s['deadline_ms']:.1f} ms; frames per stream "
                    f"{s['frames_per_stream']} (expected {s['expected_frames_per_stream']}); "
                    f"dropped {s['dropped_pct']:.2f} %, late {s['late_pct']:.2f} %"
                )
        if name == "server":
            for r in rows:
                s = r["scenario"]
                verdict = "meets" if s["meets_objective"] else "MISSES"
                L.append(
                    f"  {r['label']}: rate {s['target_rate_qps']:.1f} q/s target, {s['achieved_rate_qps']:.1f} achieved; "
                    f"p{s['objective_percentile']:g} {_f(s['latency_at_objective_ms'])} ms {verdict} the {s['objective_ms']:g} ms objective"
                    f" (p99 {_f(r['latency_ms']['p99'])}, p99.9 {_f(r['latency_ms']['p99_9'])})"
                )
                se = s.get("search")
                if se:
                    best = "none of the probed rates" if se["max_rate_qps"] is None else f"{se['max_rate_qps']:.1f} q/s"
                    L.append(f"    highest rate meeting it: {best} ({len(se['probes'])} probes of {se['probe_s']:g} s; {se['stopped']})")
        if name == "offline":
            for r in rows:
                s = r["scenario"]
                how = f"predict_batch, batch {s['batch']}" if s["mode"] == "batch" else f"{s['workers']} worker threads"
                L.append(f"  {r['label']}: {r['counts']['completed']} queries, {how}: {_f(r['throughput_qps'], 1)} queries/s")
        warm = ", ".join(f"{r['label']} {r['warmup']['queries']} ({_f(r['warmup']['first_ms'])} ms first)" for r in rows if r["warmup"])
        if warm:
            L.append(f"  warm-up (excluded): {warm}")
        for r in rows:
            for n in r["notes"] + [f"error: {e}" for e in r["errors"]]:
                L.append(f"  note ({r['label']}): {n}")
    cs = report.get("cold_start")
    if cs:
        L.append("")
        L.append("== cold start: package open + first inference in a fresh process (median ms)")
        body = []
        for c in cs:
            m = c["median"]
            body.append([c["variant"], c["cache"], c["samples"], _f(m["open_ms"]), _f(m["load_ms"]), _f(m["first_inference_ms"]),
                         _f(m["cold_start_ms"]), _f(m["process_ms"], 1), c["cache_state"]])  # fmt: skip
        L += _table(["variant", "cache", "n", "open", "load", "first inference", "cold start", "process", "optimised-model cache"], body)
    ov = report.get("overhead")
    if ov:
        L.append("")
        L.append("== SDK vs raw runtime (same bytes, same threads; predict(tensor) vs the runtime's own call; interleaved)")
        body = [
            [o["variant"], o["backend"], o["calls"], _f(o["raw_median_us"], 1), _f(o["sdk_median_us"], 1), _f(o["added_us"], 1),
             _f(o["paired_added_us"], 1), f"{o['ratio']:.3f}x", "same" if not o["session_options_mismatches"] else "DIFFER"]
            for o in ov
        ]  # fmt: skip
        L += _table(["variant", "backend", "calls/arm", "raw us", "sdk us", "added us", "paired added us", "sdk/raw", "options"], body)
    if report.get("warnings"):
        L.append("")
        L += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------------------- markdown


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def render_markdown(report: Mapping[str, Any]) -> str:
    """A markdown summary: the run, the number to quote per target and scenario, the stage split,
    cold start and the SDK's overhead (what ``docs/benchmarks/*/README.md`` shows)."""
    pkg, env, st, sen = report["package"], report["environment"], report["settings"], report["sensors"]
    L = [f"### {pkg['name']} {pkg['version']} on `{report['profile']['name']}`", ""]
    L.append(
        f"{env['machine']}, {env['cpu_count']} CPUs ({env.get('cpu_model') or '?'}), {env.get('mem_total_mb') or '?'} MB; "
        f"Python {env['python']}; "
        + ", ".join(v for v in env["runtimes"].values() if v)
        + f"; numpy {env['numpy']}; edge_sdk {report['tool']['edge_sdk_version']}. Load average before {env['loadavg_before']}, "
        f"after {env['loadavg_after']}. Started {report['created_utc']}, took {report['duration_s']:.0f} s."
    )
    L.append("")
    if report.get("command"):
        L += [f"Command: `edge-sdk {' '.join(report['command'])}`", ""]
    L.append(
        f"Input: {report['input']['mode']} mode, {st['pool']} inputs from seed {st['seed']}; {st['duration_s']:g} s x {st['repetitions']} "
        f"interleaved repetitions per target and scenario, {st['warmup']} warm-up queries (excluded); package manifest sha256 "
        f"`{pkg['manifest_sha256'][:16]}`; variants "
        + ", ".join(f"`{v['id']}` ({v['runtime']}, {v['threads']} threads, sha256 `{v['sha256'][:12]}`)" for v in report["variants"])
        + "."
    )
    L.append("")
    temp = "read" if sen["temperature_available"] else f"unknown ({sen['temperature_unknown_reason']})"
    power = "read" if sen["power_available"] else f"unknown ({sen['power_unknown_reason']}): no energy figures"
    L += [f"Sensors: temperature {temp}; board power {power}; observing governor ended `{sen['governor']['final_state']}`.", ""]
    sc = report["scenarios"]
    labels = list(dict.fromkeys(r["label"] for s in sc.values() for r in s["rows"]))
    by = {name: {r["label"]: r for r in s["rows"]} for name, s in sc.items()}
    header = ["target"]
    if "single-stream" in sc:
        header += ["single-stream p90 ms (p50 / p99)"]
    if "multi-stream" in sc:
        r0 = sc["multi-stream"]["rows"][0]["scenario"]
        header += [f"multi-stream {r0['streams']} x {r0['fps']:g} fps: dropped / late %, p99 ms"]
    if "server" in sc:
        r0 = sc["server"]["rows"][0]["scenario"]
        header += [
            f"server: highest rate with p{r0['objective_percentile']:g} <= {r0['objective_ms']:g} ms",
            f"server p99 / p99.9 ms at {r0['target_rate_qps']:.0f} q/s",
        ]
    if "offline" in sc:
        header += ["offline queries/s"]
    body = []
    for lab in labels:
        row: list[Any] = [lab]
        if "single-stream" in sc:
            lat = by["single-stream"][lab]["latency_ms"]
            row.append(f"**{_f(lat['p90'])}** ({_f(lat['p50'])} / {_f(lat['p99'])})")
        if "multi-stream" in sc:
            r = by["multi-stream"][lab]
            row.append(f"**{r['scenario']['dropped_pct']:.2f} / {r['scenario']['late_pct']:.2f}**, {_f(r['latency_ms']['p99'])}")
        if "server" in sc:
            r = by["server"][lab]
            se = r["scenario"]["search"] or {}
            best = se.get("max_rate_qps")
            row.append("-" if not se else ("none probed" if best is None else f"**{best:,.0f} q/s**"))
            ok = "" if r["scenario"]["meets_objective"] else " (misses)"
            row.append(f"{_f(r['latency_ms']['p99'])} / {_f(r['latency_ms']['p99_9'])}{ok}")
        if "offline" in sc:
            row.append(f"**{_f(by['offline'][lab]['throughput_qps'], 0)}**")
        body.append(row)
    L += _md_table(header, body) + [""]
    for name, s in sc.items():
        stages = [
            x
            for x in ("queue", "preprocess", "validate", "inference", "remote", "decode", "service")
            if any(x in r["stages_ms"] for r in s["rows"])
        ]
        L += [f"Stage medians, {name} (ms):", ""]
        L += _md_table(
            ["target", *stages], [[r["label"], *(_f((r["stages_ms"].get(x) or {}).get("p50")) for x in stages)] for r in s["rows"]]
        )
        L.append("")
    if report.get("cold_start"):
        L += ["Cold start (package open + first inference, fresh process; medians, ms):", ""]
        rows = [
            [c["variant"], c["cache"], c["samples"], _f(c["median"]["open_ms"], 1), _f(c["median"]["load_ms"], 1),
             _f(c["median"]["first_inference_ms"], 1), f"**{_f(c['median']['cold_start_ms'], 1)}**", _f(c["median"]["process_ms"], 0),
             c["cache_state"]]
            for c in report["cold_start"]
        ]  # fmt: skip
        L += _md_table(
            ["variant", "cache", "runs", "open", "load", "first inference", "cold start", "process", "optimised-model cache"],
            rows,
            "llrrrrrrl",
        )
        L.append("")
    if report.get("overhead"):
        L += ["SDK vs raw runtime (`predict` on a model-ready tensor vs the runtime's call; interleaved rounds; us):", ""]
        rows = [
            [o["variant"], o["backend"], o["calls"], _f(o["raw_median_us"], 1), _f(o["sdk_median_us"], 1),
             f"**{_f(o['paired_added_us'], 1)}**",
             f"{o['ratio']:.2f}x", _f(o["sdk_stages_us"]["validate"], 1), _f(o["sdk_stages_us"]["decode"], 1),
             "identical" if not o["session_options_mismatches"] else "; ".join(o["session_options_mismatches"])]
            for o in report["overhead"]
        ]  # fmt: skip
        L += _md_table(
            ["variant", "backend", "calls/arm", "raw", "sdk", "paired added", "sdk/raw", "validate", "decode", "session options"],
            rows,
            "llrrrrrrrl",
        )
        L.append("")
    if report.get("warnings"):
        L += [f"- warning: {w}" for w in report["warnings"]] + [""]
    return "\n".join(L)
