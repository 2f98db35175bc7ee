"""Measure a decoder variant against the float reference: teacher-forced perplexity on held-out
text, top-1 next-token agreement, and TTFT/TPOT on this machine.

Perplexity is ``exp(mean negative log-likelihood)`` of each next token given the ones before it,
over windows of ``window`` tokens (each window starts with an empty KV cache), computed from an
``all_logits`` build of the variant (one pass per window). Top-1 agreement is the fraction of
positions where the variant's most likely next token equals the reference's.

With ``accuracy_level`` 4 (int8 activations), MatMulNBits' logits for a multi-row pass differ
slightly from one-row decode steps (GENERATIVE facts: 0.5-0.9 in logits): the figures here are
teacher-forced, as llama.cpp's ``perplexity`` tool measures them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edge_sdk.profiles.facts import usable_cpus

from .graph import empty_kv
from .spec import DecoderConfig, LLMConvertError

__all__ = ["TeacherForced", "Timing", "agreement", "default_eval_text", "teacher_forced", "time_decoder"]


@dataclass(frozen=True)
class TeacherForced:
    """Per-position results of one variant on the eval tokens."""

    nll: np.ndarray  # float64 [positions]: -log p(next token)
    top1: np.ndarray  # int64 [positions]: the most likely next token

    @property
    def perplexity(self) -> float:
        """``exp(mean NLL)`` over the positions."""
        return float(np.exp(self.nll.mean()))

    @property
    def positions(self) -> int:
        """How many next tokens were scored."""
        return int(self.nll.size)


def agreement(a: TeacherForced, b: TeacherForced) -> float:
    """Fraction of positions where ``a`` and ``b`` predict the same next token."""
    if a.positions != b.positions:
        raise LLMConvertError(f"agreement: {a.positions} vs {b.positions} positions")
    return float((a.top1 == b.top1).mean())


def default_eval_text(max_chars: int = 20_000) -> str:
    """English held-out text when none is given: the documentation topics that ship with CPython
    (``pydoc_data.topics``), in sorted topic order, cut at ``max_chars``."""
    from pydoc_data.topics import topics

    parts: list[str] = []
    n = 0
    for k in sorted(topics):
        parts.append(topics[k])
        n += len(topics[k])
        if n >= max_chars:
            break
    return "".join(parts)[:max_chars]


def _session(path: Path | str, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def teacher_forced(model_path: Path | str, cfg: DecoderConfig, ids: Sequence[int], *, window: int = 256, threads: int | None = None, kv_dtype: Any = np.float32) -> TeacherForced:
    """Run an ``all_logits`` graph over ``ids`` in windows of ``window`` tokens; the next-token
    NLL and top-1 at every position but each window's last."""
    if len(ids) < 2:
        raise LLMConvertError(f"eval text: {len(ids)} tokens; at least 2 are needed (give a longer --eval-text)")
    sess = _session(model_path, threads or min(2, usable_cpus()))
    arr = np.asarray(ids, dtype=np.int64)
    nll: list[np.ndarray] = []
    top: list[np.ndarray] = []
    past = empty_kv(cfg, window, kv_dtype)
    for start in range(0, len(arr) - 1, window):
        chunk = arr[start : start + window + 1]
        if len(chunk) < 2:
            break
        x = chunk[:-1][None, :]
        feeds = {"input_ids": x, "attention_mask": np.ones_like(x), **past}
        logits = sess.run(["logits"], feeds)[0][0].astype(np.float64)  # [seq, vocab]
        if logits.shape[0] != x.shape[1]:
            raise LLMConvertError(f"teacher_forced: {model_path} gave logits for {logits.shape[0]} positions, expected {x.shape[1]} (not an all_logits build?)")
        m = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
        tgt = chunk[1:]
        nll.append(lse - logits[np.arange(len(tgt)), tgt])
        top.append(logits.argmax(axis=1))
    return TeacherForced(np.concatenate(nll), np.concatenate(top).astype(np.int64))


@dataclass(frozen=True)
class Timing:
    """Median TTFT (prefill of ``prompt_tokens`` + the first token) and TPOT over ``runs`` runs."""

    ttft_ms: float
    tpot_ms: float
    prompt_tokens: int
    new_tokens: int
    threads: int
    runs: int


def time_decoder(model_bytes: bytes, cfg: DecoderConfig, kv_dtype: str, *, prompt_tokens: int = 64, new_tokens: int = 32, threads: int | None = None, runs: int = 3) -> Timing:
    """Time greedy generation on the runtime's own loop (the SDK's ONNX Runtime seam)."""
    from edge_sdk.backends.base import SessionOptions
    from edge_sdk.backends.ort_decoder import DecoderShape, OrtDecoderSession

    th = threads or min(2, usable_cpus())
    shape = DecoderShape(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size, kv_dtype)
    sess = OrtDecoderSession(model_bytes, shape, SessionOptions(threads=th, allow_spinning=True), prompt_tokens + new_tokens + 1)  # as the runtime runs it
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, cfg.vocab_size, size=prompt_tokens).tolist()
    ttft: list[float] = []
    tpot: list[float] = []
    try:
        for _ in range(runs + 1):  # the first run warms up (prepacking, allocations)
            sess.reset()
            t0 = time.perf_counter()
            tok = int(sess.prefill(prompt).argmax())
            t1 = time.perf_counter()
            for _ in range(new_tokens - 1):
                tok = int(sess.step(tok).argmax())
            t2 = time.perf_counter()
            ttft.append((t1 - t0) * 1e3)
            tpot.append((t2 - t1) * 1e3 / max(1, new_tokens - 1))
    finally:
        sess.close()
    return Timing(statistics.median(ttft[1:]), statistics.median(tpot[1:]), prompt_tokens, new_tokens, th, runs)
