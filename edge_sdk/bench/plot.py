"""``--plot FILE.png``: latency distributions per target and a time series of latency and temperature.

Drawn from the report alone (its kept latency samples and the monitor timeline), so a saved JSON
can be plotted again. matplotlib runs on the Agg backend (no display needed); it is an optional
dependency (the ``converter`` extra has it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import MissingDependencyError

__all__ = ["write_plot"]

MATPLOTLIB = "pip install 'edge-sdk[converter]' (or just: pip install matplotlib)"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise MissingDependencyError(f"--plot needs matplotlib: {MATPLOTLIB}") from e
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _log_axis(ax: Any, which: str) -> None:
    """Log scale on ``which`` ("x" or "y") with plain numbers (0.1, 1, 10) and no minor labels (they collide)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def write_plot(report: Mapping[str, Any], path: str | Path, *, dpi: int = 100) -> Path:
    """Write a PNG: one panel per scenario with each target's latency distribution (empirical
    CDF on a log axis, p50 and p99 marked), and a time series of every kept latency sample with
    the temperature (or a note saying it is unknown) and the scenario phases. Raises
    MissingDependencyError naming the extra when matplotlib is missing."""
    plt = _pyplot()
    scen = report["scenarios"]
    labels = list(dict.fromkeys(r["label"] for s in scen.values() for r in s["rows"]))
    cmap = plt.get_cmap("tab10")
    color = {lab: cmap(i % 10) for i, lab in enumerate(labels)}
    n = len(scen)
    cols = 2 if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig = plt.figure(figsize=(12, 3.6 * rows + 3.8))
    gs = fig.add_gridspec(rows + 1, cols, height_ratios=[3.6] * rows + [3.8])
    pkg = report["package"]
    fig.suptitle(
        f"edge-sdk bench: {pkg['name']} {pkg['version']} on {report['profile']['name']} ({report['environment']['machine']}, "
        f"{report['environment']['cpu_count']} CPUs), {report['created_utc']}",
        fontsize=10,
    )
    for k, (name, s) in enumerate(scen.items()):
        ax = fig.add_subplot(gs[k // cols, k % cols])
        for r in s["rows"]:
            y = np.sort(np.asarray(r["samples"]["latency_ms"], dtype=np.float64))
            y = y[y > 0]
            if y.size == 0:
                continue
            p = np.arange(1, y.size + 1) / y.size
            ax.step(y, p, where="post", color=color[r["label"]], label=r["label"], linewidth=1.2)
            for q, mk in (("p50", "o"), ("p99", "^")):
                v = r["latency_ms"][q]
                if v is not None and v > 0:
                    ax.plot([v], [0.5 if q == "p50" else 0.99], mk, color=color[r["label"]], markersize=4)
        _log_axis(ax, "x")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("fraction of queries")
        ax.set_title(f"{name}: latency distribution (o p50, ^ p99)", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="lower right")
    ts = fig.add_subplot(gs[rows, :])
    for s in scen.values():
        for r in s["rows"]:
            t = np.asarray(r["samples"]["t_s"], dtype=np.float64)
            y = np.asarray(r["samples"]["latency_ms"], dtype=np.float64)
            ok = y > 0
            ts.scatter(t[ok], y[ok], s=2, color=color[r["label"]], alpha=0.5, linewidths=0)
    for lab in labels:
        ts.scatter([], [], s=12, color=color[lab], label=lab)
    _log_axis(ts, "y")
    ts.set_xlabel("time since the run started (s)")
    ts.set_ylabel("latency (ms, log)")
    ts.grid(True, which="both", alpha=0.25)
    timeline = report.get("timeline") or []
    for ph in report.get("phases") or []:
        if ph["end_s"] is not None and ph["end_s"] - ph["start_s"] < 1e-3:
            continue  # replaced at once by a sub-phase
        ts.axvline(ph["start_s"], color="grey", linestyle=":", linewidth=0.8)
        ts.annotate(ph["name"], (ph["start_s"], 0.98), xycoords=("data", "axes fraction"), fontsize=7, va="top", ha="left", color="dimgray")
    temp = [(smp["t_s"], smp["temp_c"]) for smp in timeline if smp.get("temp_c") is not None]
    tw = ts.twinx()
    if temp:
        tt, tc = zip(*temp)
        tw.plot(tt, tc, color="black", linewidth=1.2, label="temperature (C)")
        tw.set_ylabel("temperature (C)")
        tw.legend(fontsize=7, loc="upper right")
    else:
        why = report["sensors"].get("temperature_unknown_reason") or "no sensor"
        tw.set_yticks([])
        tw.text(0.99, 0.04, f"temperature unknown: {why}", transform=tw.transAxes, ha="right", fontsize=8, color="dimgray")
    ts.set_title("latency of every kept sample over the run, with temperature", fontsize=9)
    ts.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), markerscale=1.5, ncol=min(6, max(1, len(labels))), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, format="png")
    plt.close(fig)
    return out
