"""Output decoders: turn raw output tensors into typed results."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import OptionsError


class Classification(NamedTuple):
    """One class of a classification result: index, label (or ``str(index)``), score in [0, 1].

    Immutable (a NamedTuple, cheap to build on the hot path)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index; the public field name stays
    label: str
    score: float


_SMALL = 32  # classes per row below which decoding stays in Python


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``, as float32."""
    x = x.astype(np.float32, copy=False)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    p: np.ndarray = e / e.sum(axis=axis, keepdims=True)
    return p


def decode_classification(
    scores: np.ndarray, labels: Sequence[str], *, top_k: int = 5, apply_softmax: bool = True, temperature: float = 1.0
) -> tuple[tuple[Classification, ...], ...]:
    """Top-k classes per batch row of ``scores`` [batch, classes] (or [classes]),
    best first. Ties keep the lower index first.

    ``temperature`` T (> 0; a variant's manifest ``temperature``): with ``apply_softmax`` the scores are
    ``softmax(logits / T)``; when the output already is probabilities (``apply_softmax=False``) T applies to their
    logarithm, ``softmax(log(p) / T)`` (= ``p ** (1/T)`` renormalised). T = 1 changes nothing; T never changes the
    order of the classes."""
    s = np.asarray(scores)
    if s.ndim == 1:
        s = s[None, :]
    if s.ndim != 2:
        s = s.reshape(s.shape[0], -1)
    if temperature != 1.0:
        if not (math.isfinite(temperature) and temperature > 0):
            raise OptionsError(f"decode_classification: temperature must be a finite number > 0, got {temperature!r}")
        if not apply_softmax:  # probabilities: scale their logarithm
            s = np.log(np.maximum(s.astype(np.float64), 1e-12))
            apply_softmax = True
        s = s / temperature
    k = min(top_k, s.shape[1])
    n = len(labels)
    if s.shape[1] <= _SMALL:
        # Few classes: plain Python beats numpy's per-call overhead (~3 us vs ~12 us for 4 classes).
        rows = []
        for row in s.tolist():
            if apply_softmax:
                m = max(row)
                e = [math.exp(v - m) for v in row]
                t = sum(e)
                row = [v / t for v in e]
            idx = sorted(range(len(row)), key=row.__getitem__, reverse=True)[:k]  # stable: ties keep lower index first
            rows.append(tuple(Classification(i, labels[i] if i < n else str(i), row[i]) for i in idx))
        return tuple(rows)
    # Many classes: softmax is monotonic, so the top-k of the logits are the top-k
    # classes; only their probabilities and the denominator are computed.
    rows = []
    c = s.shape[1]
    for row in s.astype(np.float32, copy=False):
        kth = np.partition(row, c - k)[c - k]
        cand = np.flatnonzero(row >= kth)  # every value tied with the k-th is a candidate
        vals = row[cand].tolist()
        ids = cand.tolist()
        order = sorted(range(len(ids)), key=lambda j: (-vals[j], ids[j]))[:k]
        if apply_softmax:
            m = float(row.max())
            denom = float(np.exp(row - m).sum())
            rows.append(tuple(Classification(ids[j], labels[ids[j]] if ids[j] < n else str(ids[j]), math.exp(vals[j] - m) / denom) for j in order))
        else:
            rows.append(tuple(Classification(ids[j], labels[ids[j]] if ids[j] < n else str(ids[j]), vals[j]) for j in order))
    return tuple(rows)
