"""Calibration of a classifier's confidence: ECE, reliability diagrams, temperature scaling.

Quantization can leave top-1 accuracy alone and still change how far the
scores can be trusted as probabilities, so ``edge-convert validate`` and
``edge-convert quantize`` measure, per variant, whenever class labels are known:

- ``ece``: expected calibration error. The top-1 confidences are put into
  ``n_bins`` (default 15) equal-width bins ``(lo, hi]`` over [0, 1] (a
  confidence of exactly 0 goes to the first bin); ECE is the sample-weighted
  mean of ``|accuracy(bin) - mean confidence(bin)|``;
- ``mce``: maximum calibration error, the largest of those gaps over non-empty bins;
- ``brier``: multi-class Brier score, mean over samples of ``sum_c (p_c - [c == y])^2``;
- ``nll``: mean negative log-likelihood of the true class (probabilities clipped at 1e-12).

Temperature scaling (Guo et al. 2017): one number ``T > 0`` per variant,
fitted by minimising the NLL of ``softmax(z / T)`` on labelled data, where
``z`` are the model's logits, or the log of its probabilities when the model
already outputs probabilities (the decoder's ``softmax = false``): then the
scores become ``softmax(log(p) / T)``, i.e. ``p ** (1/T)`` renormalised. The
NLL is convex in ``1/T``, so it is unimodal in ``log T``; a golden-section search
over ``log T`` in ``TEMPERATURE_BOUNDS`` finds it (numpy only). ``T`` leaves
the top-1 class unchanged.

:func:`plot_reliability` draws one PNG per variant (bars: accuracy per
confidence bin with its sample count, against the diagonal of perfect
calibration; a second panel after temperature scaling when there is one),
with matplotlib's object API on an Agg canvas (no pyplot, no global backend).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .errors import ConverterError

__all__ = [
    "DEFAULT_BINS", "TEMPERATURE_BOUNDS", "CalibrationQualityError", "CalibrationStats", "CalibrationResult",
    "to_probabilities", "log_scores", "calibration_stats", "expected_calibration_error", "fit_temperature",
    "assess", "describe", "diagram_name", "plot_reliability", "check_calibration_entry",
]  # fmt: skip

DEFAULT_BINS = 15
TEMPERATURE_BOUNDS = (0.05, 20.0)
_EPS = 1e-12
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


class CalibrationQualityError(ConverterError, ValueError):
    """Scores, labels or options that calibration cannot be measured on; the message names what was expected."""


# ------------------------------------------------------------------ scores -> probabilities


def _scores_2d(scores: Any, what: str = "scores") -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 1:
        s = s[None, :]
    elif s.ndim != 2:
        s = s.reshape(s.shape[0], -1) if s.ndim > 2 else s.reshape(1, -1)
    if s.shape[0] == 0 or s.shape[1] < 2:
        raise CalibrationQualityError(
            f"{what}: expected [samples, classes] with at least 1 sample and 2 classes, got shape {np.shape(scores)}"
        )
    if not np.isfinite(s).all():
        raise CalibrationQualityError(f"{what}: expected finite numbers, got {int((~np.isfinite(s)).sum())} NaN/inf value(s)")
    return s


def _check_temperature(t: Any, what: str = "temperature") -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float, np.floating, np.integer)) or not math.isfinite(float(t)) or float(t) <= 0:
        raise CalibrationQualityError(f"{what}: expected a finite number > 0, got {t!r}")
    return float(t)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def log_scores(scores: Any, *, logits: bool = True) -> np.ndarray:
    """The values temperature divides: ``scores`` themselves when they are logits, else the log of the
    (row-normalised) probabilities, clipped at 1e-12. float64 [samples, classes]."""
    s = _scores_2d(scores)
    if logits:
        return s
    if (s < 0).any():
        raise CalibrationQualityError("scores: the decoder says they are probabilities (softmax = false), but some are negative")
    tot = s.sum(axis=1, keepdims=True)
    if (tot <= 0).any():
        raise CalibrationQualityError("scores: a row of probabilities sums to 0")
    return np.log(np.maximum(s / tot, _EPS))


def to_probabilities(scores: Any, *, logits: bool = True, temperature: float | None = None) -> np.ndarray:
    """Class probabilities [samples, classes] (float64) as the classification decoder computes them:
    ``softmax(scores / T)`` for logits; for probabilities, the rows renormalised, or ``softmax(log(p) / T)`` when
    ``T`` is given and is not 1."""
    t = 1.0 if temperature is None else _check_temperature(temperature)
    if not logits and t == 1.0:
        z = log_scores(scores, logits=False)
        return np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return _softmax(log_scores(scores, logits=logits) / t)


def _labels(labels: Any, n: int, c: int) -> np.ndarray:
    try:
        y = np.asarray(labels)
    except Exception as e:  # ragged lists
        raise CalibrationQualityError(f"labels: expected {n} class indices, got {type(labels).__name__}: {e}") from None
    if y.shape != (n,) or (y.size and y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.all(y == np.round(y)))):
        raise CalibrationQualityError(f"labels: expected {n} integer class indices (shape ({n},)), got {y.dtype} shape {y.shape}")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= c):
        raise CalibrationQualityError(f"labels: expected class indices in 0..{c - 1}, got {int(y.min())}..{int(y.max())}")
    return y


# ------------------------------------------------------------------ figures


@dataclass(frozen=True)
class Bin:
    """One equal-width confidence bin ``(lo, hi]``: how many samples, their mean top-1 confidence and accuracy
    (None when empty)."""

    lo: float
    hi: float
    count: int
    confidence: float | None
    accuracy: float | None


@dataclass(frozen=True)
class CalibrationStats:
    """Calibration figures of one set of probabilities against labels (see the module docstring)."""

    ece: float
    mce: float
    brier: float
    nll: float
    accuracy: float
    confidence: float
    samples: int
    n_bins: int
    bins: tuple[Bin, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the figures, rounded to 6 decimals, and ``bins`` as ``{count, confidence, accuracy}`` per bin
        (bin ``i`` covers ``(i/n_bins, (i+1)/n_bins]``)."""
        r = lambda x: None if x is None else round(float(x), 6)  # noqa: E731
        return {
            "ece": r(self.ece), "mce": r(self.mce), "brier": r(self.brier), "nll": r(self.nll),
            "accuracy": r(self.accuracy), "confidence": r(self.confidence), "samples": self.samples, "n_bins": self.n_bins,
            "bins": [{"count": b.count, "confidence": r(b.confidence), "accuracy": r(b.accuracy)} for b in self.bins],
        }  # fmt: skip


def _n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or not 1 <= n_bins <= 1000:
        raise CalibrationQualityError(f"n_bins: expected an integer 1..1000, got {n_bins!r}")
    return int(n_bins)


def calibration_stats(probs: Any, labels: Any, n_bins: int = DEFAULT_BINS) -> CalibrationStats:
    """ECE, MCE, Brier score and NLL of ``probs`` [samples, classes] (rows are probabilities) against ``labels``
    (class indices), with top-1 confidences in ``n_bins`` equal-width bins."""
    nb = _n_bins(n_bins)
    p = _scores_2d(probs, "probabilities")
    if (p < -1e-6).any() or (p > 1 + 1e-6).any() or not np.allclose(p.sum(axis=1), 1.0, atol=1e-3):
        raise CalibrationQualityError(
            "probabilities: expected rows of values in [0, 1] summing to 1 (pass logits through to_probabilities first)"
        )
    n, c = p.shape
    y = _labels(labels, n, c)
    conf = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    idx = np.clip(np.ceil(conf * nb).astype(np.int64) - 1, 0, nb - 1)  # (lo, hi]; 0 joins the first bin
    bins, ece, mce = [], 0.0, 0.0
    for b in range(nb):
        sel = idx == b
        k = int(sel.sum())
        if k:
            cb, ab = float(conf[sel].mean()), float(correct[sel].mean())
            gap = abs(ab - cb)
            ece += k / n * gap
            mce = max(mce, gap)
            bins.append(Bin(b / nb, (b + 1) / nb, k, cb, ab))
        else:
            bins.append(Bin(b / nb, (b + 1) / nb, 0, None, None))
    onehot = np.zeros_like(p)
    onehot[np.arange(n), y] = 1.0
    brier = float(((p - onehot) ** 2).sum(axis=1).mean())
    nll = max(0.0, float(-np.log(np.maximum(p[np.arange(n), y], _EPS)).mean()))  # no -0.0
    return CalibrationStats(float(ece), float(mce), brier, nll, float(correct.mean()), float(conf.mean()), n, nb, tuple(bins))


def expected_calibration_error(probs: Any, labels: Any, n_bins: int = DEFAULT_BINS) -> float:
    """ECE of ``probs`` against ``labels`` (see :func:`calibration_stats`)."""
    return calibration_stats(probs, labels, n_bins).ece


# ------------------------------------------------------------------ temperature


def _nll_at(z: np.ndarray, y: np.ndarray, t: float) -> float:
    a = z / t
    m = a.max(axis=1)
    lse = m + np.log(np.exp(a - m[:, None]).sum(axis=1))
    return float((lse - a[np.arange(len(y)), y]).mean())


def fit_temperature(
    scores: Any,
    labels: Any,
    *,
    logits: bool = True,
    bounds: tuple[float, float] = TEMPERATURE_BOUNDS,
    tol: float = 1e-6,
    max_iter: int = 200,
) -> float:
    """The ``T`` in ``bounds`` minimising the NLL of ``softmax(z / T)`` against ``labels``, ``z`` being
    :func:`log_scores` of ``scores``. Golden-section search on ``log T`` (the NLL is unimodal there) to a relative
    tolerance ``tol`` on ``T``; at most ``max_iter`` steps. A bound is returned when the optimum lies beyond it (e.g.
    every sample right with a margin: sharper is always better)."""
    lo, hi = (_check_temperature(b, "bounds") for b in bounds)
    if not lo < hi:
        raise CalibrationQualityError(f"bounds: expected (low, high) with low < high, got {bounds!r}")
    z = log_scores(scores, logits=logits)
    y = _labels(labels, z.shape[0], z.shape[1])
    a, b = math.log(lo), math.log(hi)
    f = lambda u: _nll_at(z, y, math.exp(u))  # noqa: E731
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(max_iter):
        if b - a <= tol:
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    best = min(((f(math.log(lo)), lo), (fc, math.exp(c)), (fd, math.exp(d)), (f(math.log(hi)), hi)), key=lambda x: x[0])
    return float(best[1])


@dataclass(frozen=True)
class CalibrationResult:
    """One variant's calibration: ``before`` on its raw scores (T = 1), and ``after`` with ``temperature`` when there is
    one (the manifest's, or fitted on ``fitted_on`` when ``fitted``)."""

    before: CalibrationStats
    after: CalibrationStats | None = None
    temperature: float | None = None
    fitted: bool = False
    fitted_on: str | None = None

    def to_dict(self, diagram: str | None = None) -> dict[str, Any]:
        """JSON-ready, as in report.json's per-variant ``calibration``; ``diagram``: the reliability PNG's file name."""
        d: dict[str, Any] = {"n_bins": self.before.n_bins, "samples": self.before.samples, "before": self.before.to_dict()}
        if self.after is not None:
            d["after"] = self.after.to_dict()
        d["temperature"] = None if self.temperature is None else round(self.temperature, 6)
        d["fitted"] = self.fitted
        if self.fitted_on is not None:
            d["fitted_on"] = self.fitted_on
        if diagram is not None:
            d["diagram"] = diagram
        return d


def assess(
    scores: Any,
    labels: Any,
    *,
    logits: bool = True,
    temperature: float | None = None,
    fit: bool = False,
    fit_scores: Any = None,
    fit_labels: Any = None,
    fitted_on: str | None = None,
    n_bins: int = DEFAULT_BINS,
) -> CalibrationResult:
    """Calibration of ``scores`` against ``labels``: before (T = 1) and after ``temperature``, or after a ``T`` fitted
    on ``fit_scores``/``fit_labels`` (default: on ``scores``/``labels`` themselves, which flatters the after figures)
    when ``fit``."""
    before = calibration_stats(to_probabilities(scores, logits=logits), labels, n_bins)
    t = None if temperature is None else _check_temperature(temperature)
    if fit:
        fs, fl = (scores, labels) if fit_scores is None else (fit_scores, fit_labels)
        t = fit_temperature(fs, fl, logits=logits)
    after = None if t is None else calibration_stats(to_probabilities(scores, logits=logits, temperature=t), labels, n_bins)
    return CalibrationResult(before, after, t, fit, fitted_on if fit else None)


# ------------------------------------------------------------------ report entries and diagrams


def diagram_name(variant_id: str) -> str:
    """The reliability diagram's file name for a variant: ``reliability_<id>.png`` (characters outside
    ``[A-Za-z0-9._-]`` become ``_``)."""
    return "reliability_" + re.sub(r"[^A-Za-z0-9._-]", "_", variant_id) + ".png"


def _stats_entry(d: Any, where: str) -> None:
    if not isinstance(d, Mapping):
        raise ValueError(f"report: '{where}' must be a mapping, got {type(d).__name__}")
    for k in ("ece", "mce", "brier", "nll", "accuracy", "confidence"):
        v = d.get(k)
        if k in ("ece", "mce", "brier", "nll") and k not in d:
            raise ValueError(f"report: missing required key '{where}.{k}'")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"report: '{where}.{k}' must be a number, got {type(v).__name__} {v!r}")
    extra = sorted(set(d) - {"ece", "mce", "brier", "nll", "accuracy", "confidence", "samples", "n_bins", "bins"})
    if extra:
        raise ValueError(f"report: unknown key '{where}.{extra[0]}'")
    bins = d.get("bins", [])
    if not isinstance(bins, (list, tuple)):
        raise ValueError(f"report: '{where}.bins' must be a list, got {type(bins).__name__}")
    for i, b in enumerate(bins):
        if not isinstance(b, Mapping) or not isinstance(b.get("count"), int) or isinstance(b.get("count"), bool):
            raise ValueError(f"report: '{where}.bins[{i}]' must be a mapping with an integer 'count'")


def check_calibration_entry(d: Any, where: str) -> None:
    """Check a report.json per-variant ``calibration`` mapping (as :meth:`CalibrationResult.to_dict` writes it);
    raise ``ValueError`` naming the key."""
    if not isinstance(d, Mapping):
        raise ValueError(f"report: '{where}' must be a mapping, got {type(d).__name__}")
    allowed = {"n_bins", "samples", "before", "after", "temperature", "fitted", "fitted_on", "diagram"}
    extra = sorted(set(d) - allowed)
    if extra:
        raise ValueError(f"report: unknown key '{where}.{extra[0]}' (allowed: {sorted(allowed)})")
    if "before" not in d:
        raise ValueError(f"report: missing required key '{where}.before'")
    _stats_entry(d["before"], f"{where}.before")
    if d.get("after") is not None:
        _stats_entry(d["after"], f"{where}.after")
    t = d.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise ValueError(f"report: '{where}.temperature' must be a finite number > 0 or None, got {t!r}")
    for k in ("diagram", "fitted_on"):
        if d.get(k) is not None and not isinstance(d[k], str):
            raise ValueError(f"report: '{where}.{k}' must be str or None, got {type(d[k]).__name__}")
    dg = d.get("diagram")
    if dg is not None and (Path(dg).name != dg or not dg.endswith(".png")):
        raise ValueError(f"report: '{where}.diagram' must be a .png file name next to the report (no folders), got {dg!r}")
    if "fitted" in d and not isinstance(d["fitted"], bool):
        raise ValueError(f"report: '{where}.fitted' must be bool, got {type(d['fitted']).__name__}")


def _panel(ax: Any, stats: Mapping[str, Any], title: str) -> None:
    bins = list(stats.get("bins", []))
    nb = len(bins) or int(stats.get("n_bins") or DEFAULT_BINS)
    w = 1.0 / nb
    centers = [(i + 0.5) * w for i in range(nb)]
    acc = [b["accuracy"] if b.get("accuracy") is not None else 0.0 for b in bins]
    conf = [b["confidence"] for b in bins]
    ax.plot([0, 1], [0, 1], linestyle="--", color="#555555", linewidth=1, label="perfect calibration", zorder=1)
    ax.bar(centers, acc, width=w, color="#1e88e5", edgecolor="#0d2f57", linewidth=0.8, label="accuracy", zorder=2)
    full = [i for i, b in enumerate(bins) if b["count"]]
    if full:  # one call for all the gaps (drawing is the slow part)
        ax.bar([centers[i] for i in full], [conf[i] - acc[i] for i in full], bottom=[acc[i] for i in full], width=w,
               color="#e53935", alpha=0.35, edgecolor="#b71c1c", linewidth=0.5, zorder=3, label="gap to mean confidence")  # fmt: skip
    for i in full:
        ax.text(centers[i], max(acc[i], conf[i]) + 0.01, str(bins[i]["count"]), ha="center", va="bottom", fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("top-1 confidence")
    ax.set_ylabel("accuracy")
    ece, mce = stats.get("ece"), stats.get("mce")
    ax.set_title(f"{title}\nECE {ece:.4f}, MCE {mce:.4f}" if ece is not None and mce is not None else title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)


def plot_reliability(entry: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Write the reliability diagram of one variant's calibration ``entry`` (:meth:`CalibrationResult.to_dict`) to
    ``path`` as PNG: accuracy per confidence bin (blue, sample count on top) against the diagonal, the gap to the bin's
    mean confidence in red; a second panel after temperature scaling when ``entry`` has ``after``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [(entry["before"], "raw scores (T = 1)")]
    if entry.get("after") is not None:
        t = entry.get("temperature")
        how = "fitted" if entry.get("fitted") else "manifest"
        panels.append((entry["after"], f"temperature-scaled (T = {t:.4g}, {how})" if t is not None else "temperature-scaled"))
    fig = Figure(figsize=(5.2 * len(panels), 5.0), dpi=100)
    fig.subplots_adjust(left=0.14 if len(panels) == 1 else 0.07, right=0.96 if len(panels) == 1 else 0.98, bottom=0.1, top=0.84, wspace=0.2)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (stats, name) in zip(axes, panels):
        _panel(ax, stats, name)
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{title} — {entry.get('samples', '?')} samples, {entry.get('n_bins', '?')} bins".lstrip(" —"), fontsize=11)
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def describe(entry: Mapping[str, Any]) -> str:
    """One line: ``ECE 0.0412 (MCE 0.12, NLL 0.21) -> 0.0123 at T 1.7 (fitted)``."""
    b = entry["before"]
    s = f"ECE {b['ece']:.4f} (MCE {b['mce']:.4f}, Brier {b['brier']:.4f}, NLL {b['nll']:.4f})"
    a = entry.get("after")
    if a is not None:
        how = "fitted" if entry.get("fitted") else "from the manifest"
        s += f" -> ECE {a['ece']:.4f} (MCE {a['mce']:.4f}, NLL {a['nll']:.4f}) at T {entry.get('temperature'):.4g} ({how})"
    return s
