"""Small statistics the report and the comparison share."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["PERCENTILES", "busy_union_s", "median_interval", "summary"]

#: Latency percentiles every row reports (p99.9 is named ``p99_9``).
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9))


def summary(values: Sequence[float] | np.ndarray) -> dict[str, float | int | None]:
    """n, min, mean, p50, p90, p99, p99.9, max (linear interpolation; None when empty).
    Ordered by construction: p50 <= p90 <= p99 <= p99_9 <= max."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "min": None, "mean": None, **{k: None for k, _ in PERCENTILES}, "max": None}
    qs = np.percentile(a, [q for _, q in PERCENTILES])
    out: dict[str, float | int | None] = {"n": int(a.size), "min": float(a.min()), "mean": float(a.mean())}
    out.update({k: float(v) for (k, _), v in zip(PERCENTILES, qs)})
    out["max"] = float(a.max())
    return out


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): a distribution-free confidence interval for the median of ``values``
    from order statistics (binomial). With 5 values or fewer no pair of order statistics reaches
    ``confidence``; the interval is then [min, max] (93.75 % for 5 values, 87.5 % for 4)."""
    a = np.sort(np.asarray(values, dtype=np.float64))
    n = a.size
    if n == 0:
        return (math.nan, math.nan, math.nan)
    med = float(np.median(a))
    if n <= 5:
        return (med, float(a[0]), float(a[-1]))
    # the largest k such that P(X_(k) <= median <= X_(n-k+1)) >= confidence, X ~ Binomial(n, 1/2)
    from math import comb

    best = 1
    for k in range(1, n // 2 + 1):
        miss = 2 * sum(comb(n, j) for j in range(k)) / 2**n
        if 1 - miss >= confidence:
            best = k
        else:
            break
    return (med, float(a[best - 1]), float(a[n - best]))


def busy_union_s(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals [start, end]: time with at least one query running."""
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    total = 0.0
    cur_s, cur_e = float(s[0]), float(e[0])
    for a, b in zip(s[1:], e[1:]):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = float(a), float(b)
        elif b > cur_e:
            cur_e = float(b)
    return total + (cur_e - cur_s)
