"""``edge-sdk bench --compare A.json B.json``: what changed between two runs, and which metric
differences are beyond the noise of the runs.

What changed: every setting, the environment (machine, CPU, Python, numpy, runtimes, edge_sdk,
profile) and the digests (package manifest, each variant's model file).

Metrics: each run records, per target and scenario, the value of its headline metrics in every
repetition (``row["repetitions"]``: e.g. single-stream p50 latency per block). For each metric in
both runs, the comparison takes the median of each run's repetition values and a distribution-free
95 % confidence interval of that median (order statistics; with 5 repetitions or fewer the
interval is [min, max], 93.75 % for 5). A difference is **significant** only when

1. the two intervals do not overlap, and
2. the medians differ by at least ``min_effect`` (default 5 %) of run A's median (for a
   percentage metric whose A median is 0: by at least 1 percentage point).

Otherwise it is **within noise**. With 5 repetitions per run, two runs of the same system have
non-overlapping [min, max] ranges with probability 2 / C(10, 5) < 1 % (if repetitions are
exchangeable); the effect floor keeps real but negligible shifts (a very tight distribution moving
by 0.5 %) from being called out. A metric with fewer than 2 repetition values in either run has
no noise estimate and is reported as such, never as significant. Cold starts are compared the same
way over their fresh-process samples.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import OptionsError
from .stats import median_interval

__all__ = ["compare_reports", "render_comparison"]

_ENV_KEYS = ("machine", "platform", "cpu_model", "cpu_count", "mem_total_mb", "python", "python_implementation", "numpy")


def _lower_is_better(metric: str) -> bool:
    return not metric.endswith("_qps")


def _diff(path: str, a: Any, b: Any, out: list[dict[str, Any]]) -> None:
    if a != b:
        out.append({"what": path, "a": a, "b": b})


def compare_metric(a: Sequence[float | None], b: Sequence[float | None], metric: str, *, min_effect: float = 0.05) -> dict[str, Any]:
    """One metric's comparison (see the module docs): medians, intervals, change and verdict."""
    va = [float(x) for x in a if x is not None]
    vb = [float(x) for x in b if x is not None]
    out: dict[str, Any] = {"metric": metric, "n_a": len(va), "n_b": len(vb)}
    if len(va) < 2 or len(vb) < 2:
        out.update(a=va[0] if len(va) == 1 else None, b=vb[0] if len(vb) == 1 else None, change_pct=None, significant=False,
                   verdict="no noise estimate (fewer than 2 repetitions)")  # fmt: skip
        return out
    ma, la, ha = median_interval(va)
    mb, lb, hb = median_interval(vb)
    overlap = not (ha < lb or hb < la)
    if ma != 0:
        change = (mb - ma) / abs(ma)
        big = abs(change) >= min_effect
    else:
        change = None
        big = abs(mb - ma) >= (1.0 if metric.endswith("_pct") else 0.0) and mb != ma
    significant = (not overlap) and big
    better = (mb < ma) if _lower_is_better(metric) else (mb > ma)
    if significant:
        verdict = ("better" if better else "worse") + " (significant)"
    elif not overlap:
        verdict = f"within noise (intervals apart but the change is under {min_effect:.0%})"
    else:
        verdict = "within noise"
    out.update(a=ma, a_interval=[la, ha], b=mb, b_interval=[lb, hb], change_pct=None if change is None else 100.0 * change,
               significant=significant, better=better if significant else None, verdict=verdict)  # fmt: skip
    return out


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any], *, min_effect: float = 0.05) -> dict[str, Any]:
    """What changed from run ``a`` to run ``b`` and which differences are significant."""
    if not 0 <= min_effect < 10:
        raise OptionsError(f"min_effect: expected a fraction >= 0, got {min_effect!r}")
    settings: list[dict[str, Any]] = []
    for k in sorted(set(a["settings"]) | set(b["settings"])):
        _diff(k, a["settings"].get(k), b["settings"].get(k), settings)
    _diff("input.mode", a["input"]["mode"], b["input"]["mode"], settings)
    env: list[dict[str, Any]] = []
    for k in _ENV_KEYS:
        _diff(k, a["environment"].get(k), b["environment"].get(k), env)
    for k in sorted(set(a["environment"]["runtimes"]) | set(b["environment"]["runtimes"])):
        _diff(f"runtime {k}", a["environment"]["runtimes"].get(k), b["environment"]["runtimes"].get(k), env)
    _diff("edge_sdk", a["tool"]["edge_sdk_version"], b["tool"]["edge_sdk_version"], env)
    _diff("profile", a["profile"]["name"], b["profile"]["name"], env)
    digests: list[dict[str, Any]] = []
    _diff("package", f"{a['package']['name']} {a['package']['version']}", f"{b['package']['name']} {b['package']['version']}", digests)
    _diff("package manifest sha256", a["package"]["manifest_sha256"], b["package"]["manifest_sha256"], digests)
    va = {v["id"]: v for v in a["variants"]}
    vb = {v["id"]: v for v in b["variants"]}
    for vid in sorted(set(va) & set(vb)):
        _diff(f"variant {vid} sha256", va[vid]["sha256"], vb[vid]["sha256"], digests)
        _diff(f"variant {vid} runtime", va[vid]["runtime"], vb[vid]["runtime"], digests)
        _diff(f"variant {vid} threads", va[vid]["threads"], vb[vid]["threads"], digests)

    metrics: list[dict[str, Any]] = []
    only_a: list[str] = []
    only_b: list[str] = []
    notes: list[str] = []
    sa, sb = a["scenarios"], b["scenarios"]
    for name in [s for s in sa if s not in sb]:
        only_a.append(f"scenario {name}")
    for name in [s for s in sb if s not in sa]:
        only_b.append(f"scenario {name}")
    for name in [s for s in sa if s in sb]:
        ra = {r["label"]: r for r in sa[name]["rows"]}
        rb = {r["label"]: r for r in sb[name]["rows"]}
        only_a += [f"{name} {label}" for label in ra if label not in rb]
        only_b += [f"{name} {label}" for label in rb if label not in ra]
        for label in [x for x in ra if x in rb]:
            reps_a, reps_b = ra[label]["repetitions"], rb[label]["repetitions"]
            for metric in [m for m in reps_a if m in reps_b]:
                m = compare_metric(reps_a[metric], reps_b[metric], metric, min_effect=min_effect)
                metrics.append({"scenario": name, "target": label, **m})
            if name == "server":
                xa, xb = ra[label]["scenario"], rb[label]["scenario"]
                ta, tb = xa.get("target_rate_qps"), xb.get("target_rate_qps")
                if ta and tb and abs(ta - tb) > 0.01 * max(ta, tb):
                    notes.append(
                        f"server {label}: measured at {ta:.1f} vs {tb:.1f} q/s: its latencies compare different loads "
                        "(pass --rate for comparable runs)"
                    )
                if xa.get("meets_objective") != xb.get("meets_objective"):
                    notes.append(f"server {label}: meets the objective {xa.get('meets_objective')} -> {xb.get('meets_objective')}")
                qa = (xa.get("search") or {}).get("max_rate_qps")
                qb = (xb.get("search") or {}).get("max_rate_qps")
                if qa != qb:
                    notes.append(
                        f"server {label}: highest rate meeting the objective {_q(qa)} -> {_q(qb)} (one search each: no noise estimate)"
                    )
    ca = {(c["variant"], c["cache"]): c for c in a.get("cold_start") or []}
    cb = {(c["variant"], c["cache"]): c for c in b.get("cold_start") or []}
    for key in [k for k in ca if k in cb]:
        m = compare_metric([r["cold_start_ms"] for r in ca[key]["runs"]], [r["cold_start_ms"] for r in cb[key]["runs"]], "cold_start_ms",
                           min_effect=min_effect)  # fmt: skip
        metrics.append({"scenario": "cold-start", "target": f"{key[0]} ({key[1]} cache)", **m})
    return {
        "a": _ident(a),
        "b": _ident(b),
        "min_effect": min_effect,
        "settings": settings,
        "environment": env,
        "digests": digests,
        "metrics": metrics,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "notes": notes,
        "significant": sum(1 for m in metrics if m["significant"]),
        "within_noise": sum(1 for m in metrics if not m["significant"]),
    }


def _q(v: float | None) -> str:
    return "none" if v is None else f"{v:.1f} q/s"


def _ident(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "created_utc": r["created_utc"],
        "package": f"{r['package']['name']} {r['package']['version']}",
        "profile": r["profile"]["name"],
        "loadavg_before": r["environment"].get("loadavg_before"),
    }


def _v(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
    return str(x)


def render_comparison(c: Mapping[str, Any], label_a: str = "A", label_b: str = "B") -> str:
    """The comparison as text."""
    from .report import _table

    L = [f"{lab}: {c[k]['package']} on {c[k]['profile']}, {c[k]['created_utc']} (load average {c[k]['loadavg_before']})"
         for lab, k in ((label_a, "a"), (label_b, "b"))]  # fmt: skip
    for title, items in (("settings", c["settings"]), ("environment", c["environment"]), ("digests", c["digests"])):
        if items:
            L.append(f"{title} changed:")
            L += [f"  {d['what']}: {_v(d['a'])} -> {_v(d['b'])}" for d in items]
        else:
            L.append(f"{title}: identical")
    L.append("")
    L.append(
        f"metrics: median of the per-repetition values [95 % interval of the median]; significant = intervals apart and change >= "
        f"{c['min_effect']:.0%}"
    )
    rows = []
    for m in c["metrics"]:
        ia = f" [{_v(m['a_interval'][0])}, {_v(m['a_interval'][1])}]" if "a_interval" in m else ""
        ib = f" [{_v(m['b_interval'][0])}, {_v(m['b_interval'][1])}]" if "b_interval" in m else ""
        ch = "-" if m["change_pct"] is None else f"{m['change_pct']:+.1f} %"
        rows.append([m["scenario"], m["target"], m["metric"], _v(m["a"]) + ia, _v(m["b"]) + ib, ch, m["verdict"]])
    L += _table(["scenario", "target", "metric", label_a, label_b, "change", "verdict"], rows, align="lllrrrl")
    for n in c["notes"]:
        L.append(f"note: {n}")
    if c["only_in_a"]:
        L.append(f"only in {label_a}: {', '.join(c['only_in_a'])}")
    if c["only_in_b"]:
        L.append(f"only in {label_b}: {', '.join(c['only_in_b'])}")
    L.append(f"{c['significant']} significant difference(s), {c['within_noise']} within noise")
    return "\n".join(L) + "\n"
