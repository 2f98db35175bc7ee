"""Output decoders: turn raw output tensors into typed results."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np


class Classification(NamedTuple):
    """One class of a classification result: index, label (or ``str(index)``), score in [0, 1].

    Immutable (a NamedTuple, cheap to build on the hot path)."""

    index: int
    label: str
    score: float


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x.astype(np.float32, copy=False)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def decode_classification(
    scores: np.ndarray, labels: Sequence[str], *, top_k: int = 5, apply_softmax: bool = True
) -> tuple[tuple[Classification, ...], ...]:
    """Top-k classes per batch row of ``scores`` [batch, classes] (or [classes]),
    best first. Ties keep the lower index first."""
    s = np.asarray(scores)
    if s.ndim == 1:
        s = s[None, :]
    if s.ndim != 2:
        s = s.reshape(s.shape[0], -1)
    p = softmax(s) if apply_softmax else s.astype(np.float32, copy=False)
    k = min(top_k, p.shape[1])
    idx = np.argsort(-p, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(p, idx, axis=1).tolist()
    n = len(labels)
    return tuple(
        tuple(Classification(i, labels[i] if i < n else str(i), sc) for i, sc in zip(ri, rs))
        for ri, rs in zip(idx.tolist(), top)
    )
