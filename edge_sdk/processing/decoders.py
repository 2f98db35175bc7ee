"""Output decoders: turn raw output tensors into typed results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Classification:
    """One class of a classification result: index, label (or ``str(index)``), score in [0, 1]."""

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
    rows = []
    for row in p:
        idx = np.argsort(-row, kind="stable")[:k]
        rows.append(
            tuple(Classification(int(i), labels[i] if i < len(labels) else str(int(i)), float(row[i])) for i in idx)
        )
    return tuple(rows)
