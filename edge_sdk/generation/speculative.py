"""Speculative decoding's numpy core: draft tokens cheaply, verify them in one target pass, pick the draft length.

Speculative decoding (Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via Speculative
Decoding", https://arxiv.org/abs/2211.17192) proposes ``k`` tokens with something cheap, runs the target model
once over all ``k + 1`` positions, and keeps a prefix of the proposal chosen so that the tokens produced follow
*exactly* the target's (warped) distribution. On a CPU a pass over ``k + 1`` positions costs far less than
``k + 1`` one-token steps (the weights are read once), so every accepted draft token is nearly free.

The pieces, each independent of the model runtime (``decoder.py`` wires them into its loop):

* :func:`warped_probs` / :func:`warped_rows`: the target's probability vectors after exactly the
  warping :class:`~edge_sdk.generation.sampling.Sampler` applies (through :meth:`Sampler.probs`, the same code
  path as :meth:`Sampler.sample`, so verifying and sampling cannot disagree);
* :class:`PromptLookupDrafter`: drafts by copying what followed the latest earlier occurrence of the last
  ``n`` tokens (prompt lookup decoding). It needs no draft model; its drafts are deterministic, so their
  draft distribution ``q`` is a point mass;
* :class:`ModelDrafter`: drafts with a smaller decoder that shares the tokenizer (another model, or the
  target's own first layers: ``edge-convert llm --draft-layers N``), sampled with the same warping, so
  its ``q`` rows go to :func:`verify`;
* :func:`verify` (Leviathan et al.'s Algorithm 1, one sequence) and :func:`verify_greedy` (its temperature-0
  special case on argmax ids);
* :class:`AdaptiveDraftLength`: a deterministic controller choosing ``k`` per step from the measured
  acceptance rate and a CPU cost model, falling back to plain decoding (``k = 0``) when drafts keep failing;
* :class:`SpeculationStats`: counters for results and telemetry.

Error policy: a bad configuration value raises :class:`~edge_sdk.errors.OptionsError`; bad data (token ids,
probability arrays, logits) raises :class:`~edge_sdk.errors.GenerationError`. Nothing is silently coerced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

import numpy as np
import numpy.typing as npt

from ..errors import GenerationError, OptionsError
from .sampling import History, Sampler

__all__ = [
    "DEFAULT_VERIFY_COST",
    "AdaptiveDraftLength",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SpeculationStats",
    "expected_tokens",
    "residual_distribution",
    "verify",
    "verify_greedy",
    "warped_probs",
    "warped_rows",
]

Tokens = Union[npt.NDArray[np.integer], Sequence[int]]

#: Row sums of a probability array must be within this of 1 (float32 sums over 150k entries stay far inside it).
_SUM_TOL = 1e-3

#: Time of one verification pass over ``k + 1`` positions relative to one 1-token decode step, measured on a
#: 2-core CPU with SmolLM2-135M int4 (1 token: 12.1 ms; k=1: 12.6, k=2: 15.9, k=4: 23.3, k=8: 33.0 ms). Other
#: ``k`` are interpolated linearly; beyond 8 the 4..8 slope is extended. ``k = 0`` is the plain step itself.
DEFAULT_VERIFY_COST: Mapping[int, float] = {0: 1.0, 1: 12.6 / 12.1, 2: 15.9 / 12.1, 4: 23.3 / 12.1, 8: 33.0 / 12.1}


def _int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """``value`` if it is an int (not bool) in ``[lo, hi]``, else OptionsError naming it and the range."""
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise OptionsError(f"{name}: expected an int {rng}, got {type(value).__name__} {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise OptionsError(f"{name}: expected an int {rng}, got {v}")
    return v


def _real(name: str, value: object, accepted: str) -> float:
    """``value`` as a float if it is a real number (int or float, not bool), else OptionsError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise OptionsError(f"{name}: expected a number {accepted}, got {type(value).__name__} {value!r}")
    return float(value)


def _check_real(name: str, value: object, lo: float, hi: float, lo_open: bool, hi_open: bool) -> float:
    """A finite float in the interval (``lo_open``/``hi_open`` exclude the ends), else OptionsError."""
    accepted = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    v = _real(name, value, accepted)
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        raise OptionsError(f"{name}: expected a finite number {accepted}, got {value!r}")
    return v


def _token_array(name: str, tokens: object) -> npt.NDArray[np.int64]:
    """``tokens`` as a 1-D int64 array (a view when it already is one); GenerationError if not 1-D integers."""
    if isinstance(tokens, np.ndarray):
        a = tokens
    elif isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise GenerationError(f"{name}: expected a 1-D sequence of int token ids, got {type(tokens).__name__}")
    elif len(tokens) == 0:
        return np.empty(0, dtype=np.int64)
    else:
        a = np.asarray(tokens)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise GenerationError(f"{name}: expected a 1-D sequence of int token ids, got dtype {a.dtype} shape {a.shape}")
    return a if a.dtype == np.int64 else a.astype(np.int64)


# --- the target's warped distribution --------------------------------------------------------------------------


def warped_probs(sampler: Sampler, logits: npt.NDArray[np.floating], history: History = ()) -> npt.NDArray[np.float64]:
    """The full-vocabulary probability vector (``[vocab_size]`` float64, summing to 1) that ``sampler.sample``
    draws from for ``logits`` and ``history``: repetition penalty, temperature, top-k, top-p, min-p, exactly as
    the sampler applies them (it is :meth:`Sampler.probs` scattered into a dense vector). Greedy gives a one-hot
    vector at the (penalised) argmax. Raises GenerationError as ``sampler.sample`` does."""
    if not isinstance(sampler, Sampler):
        raise OptionsError(f"sampler: expected a Sampler, got {type(sampler).__name__}")
    ids, probs = sampler.probs(logits, history)
    out = np.zeros(sampler.vocab_size, dtype=np.float64)
    out[ids] = probs
    return out


def warped_rows(sampler: Sampler, logits: npt.NDArray[np.floating], history: History, draft_tokens: Tokens) -> npt.NDArray[np.float64]:
    """The ``target_probs`` argument of :func:`verify`: row ``i`` of ``logits`` (shape ``[len(draft) + 1,
    vocab_size]``, the target's output at the position after ``history + draft[:i]``) warped by ``sampler``
    with the repetition penalty counting ``history + draft[:i]``, as ``sampler.sample`` would have seen it had
    the tokens been decoded one by one. Returns ``[len(draft) + 1, vocab_size]`` float64."""
    if not isinstance(sampler, Sampler):
        raise OptionsError(f"sampler: expected a Sampler, got {type(sampler).__name__}")
    drafts = _token_array("draft_tokens", draft_tokens)
    m = drafts.size + 1
    if not isinstance(logits, np.ndarray) or logits.ndim != 2 or logits.shape != (m, sampler.vocab_size):
        got = logits.shape if isinstance(logits, np.ndarray) else type(logits).__name__
        raise GenerationError(f"logits: expected shape ({m}, {sampler.vocab_size}) (one row per draft token plus one), got {got}")
    penalised = sampler.params.repetition_penalty != 1.0
    hist = _token_array("history", history) if penalised else np.empty(0, dtype=np.int64)
    out = np.empty((m, sampler.vocab_size), dtype=np.float64)
    for i in range(m):
        h: History = np.concatenate([hist, drafts[:i]]) if penalised else ()
        out[i] = warped_probs(sampler, logits[i], h)
    return out


# --- prompt lookup drafting ------------------------------------------------------------------------------------


class PromptLookupDrafter:
    """Drafts by prompt lookup: the tokens that followed the most recent earlier occurrence of the context's
    last ``n`` tokens, trying ``n = max_ngram`` down to ``min_ngram`` (a longer match is better evidence).

    Stateless and vectorised: each :meth:`draft` call compares ``n`` shifted views of the context with the
    suffix (``max_ngram + ... + min_ngram`` elementwise passes over the context), about 15 us on a 2k-token
    int64 array; a Python list is converted first (about 60 us more for 2k tokens), so pass an array.
    The drafts are deterministic: pass ``draft_probs=None`` (point masses) to :func:`verify`.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.min_ngram = _int("min_ngram", min_ngram, 1)
        self.max_ngram = _int("max_ngram", max_ngram, 1)
        if self.max_ngram < self.min_ngram:
            raise OptionsError(f"max_ngram: expected an int >= min_ngram ({self.min_ngram}), got {self.max_ngram}")

    def draft(self, tokens: Tokens, k: int) -> list[int]:
        """Up to ``k`` tokens predicted to follow ``tokens`` (the prompt plus the output so far): for ``n`` from
        :attr:`max_ngram` down to :attr:`min_ngram`, find the latest ``j < len(tokens) - n`` with
        ``tokens[j:j+n] == tokens[-n:]`` and return ``tokens[j+n : j+n+k]`` (fewer when the context ends first).
        ``[]`` when no n-gram recurs or ``k == 0``. Raises OptionsError for a bad ``k``, GenerationError for
        tokens that are not a 1-D sequence of ints."""
        k = _int("k", k, 0)
        seq = _token_array("tokens", tokens)
        length = seq.size
        if k == 0:
            return []
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            span = length - n  # candidate starts 0 .. span-1: each leaves at least one token after the match
            hit = seq[:span] == seq[span]
            for t in range(1, n):
                hit &= seq[t : t + span] == seq[span + t]
            found = np.flatnonzero(hit)
            if found.size:
                start = int(found[-1]) + n
                return [int(t) for t in seq[start : start + k]]
        return []


class ModelDrafter:
    """Drafts with a draft model's decoder session (anything with ``prefill(ids)``, ``step(id)``,
    ``reset(position)``, ``position`` and ``max_len``, e.g. an
    :class:`~edge_sdk.backends.ort_decoder.OrtDecoderSession`) that shares the target's tokenizer.

    The draft's KV keeps the longest prefix of the sequence it has seen: each :meth:`draft` rewinds to
    where the sequence and what it fed last time part (the rejected drafts) and feeds only the rest,
    then drafts ``k`` tokens, greedy, or drawn from ``sampler``'s warping of its logits (the ``q``
    rows for :func:`verify`). Not thread-safe: one stream at a time.
    """

    def __init__(self, session: object) -> None:
        for name in ("prefill", "step", "reset"):
            if not callable(getattr(session, name, None)):
                raise OptionsError(f"draft session: expected prefill/step/reset methods, {type(session).__name__} has no {name}()")
        self.session: Any = session
        self._fed: list[int] = []

    def reset(self) -> None:
        """Forget the sequence (a new stream starts)."""
        self._fed = []
        self.session.reset(0)

    def draft(
        self, tokens: Tokens, k: int, sampler: Sampler | None = None, history: History = ()
    ) -> tuple[list[int], npt.NDArray[np.float64] | None]:
        """Up to ``k`` tokens to follow ``tokens``, and their draft distributions ``[k, vocab]`` (None when greedy:
        point masses). Fewer (or none) when the draft's KV would overflow."""
        k = _int("k", k, 0)
        seq = [int(t) for t in _token_array("tokens", tokens)]
        sess = self.session
        max_len = int(sess.max_len)
        if k == 0 or not seq or len(seq) + k > max_len:
            return [], None
        n = 0
        for a, b in zip(self._fed, seq):
            if a != b:
                break
            n += 1
        n = min(n, len(seq) - 1)  # the last token must run to give the next one's logits
        sess.reset(n)
        logits = sess.prefill(seq[n:])
        fed = list(seq)
        out: list[int] = []
        rows: list[npt.NDArray[np.float64]] = []
        greedy = sampler is None or sampler.params.greedy
        hist = np.asarray(history, dtype=np.int64) if len(history) else np.empty(0, dtype=np.int64)
        for i in range(k):
            if greedy:
                tok = int(np.argmax(logits))
            else:
                assert sampler is not None
                q = warped_probs(sampler, logits, np.concatenate([hist, np.asarray(out, dtype=np.int64)]))
                tok = _draw(q, sampler.rng)
                rows.append(q)
            out.append(tok)
            if i < k - 1:
                logits = sess.step(tok)
                fed.append(tok)
        self._fed = fed
        return out, (np.stack(rows) if rows else None)


# --- verification ----------------------------------------------------------------------------------------------


def _check_prob_rows(name: str, probs: object, rows: int, vocab: int | None) -> npt.NDArray[np.floating]:
    """``probs`` if it is a ``[rows, vocab]`` floating array of finite, non-negative rows summing to 1."""
    if not isinstance(probs, np.ndarray):
        raise GenerationError(f"{name}: expected a numpy array of probabilities, got {type(probs).__name__}")
    if probs.ndim != 2 or probs.shape[0] != rows or (vocab is not None and probs.shape[1] != vocab) or probs.shape[1] < 1:
        want = f"({rows}, {vocab if vocab is not None else 'V'})"
        raise GenerationError(f"{name}: expected shape {want}, got {probs.shape}")
    if not np.issubdtype(probs.dtype, np.floating):
        raise GenerationError(f"{name}: expected a floating dtype, got {probs.dtype}")
    if rows == 0:
        return probs
    sums = probs.sum(axis=1, dtype=np.float64)
    bad = np.flatnonzero(~(np.abs(sums - 1.0) <= _SUM_TOL))  # also catches NaN and +inf
    if bad.size:
        i = int(bad[0])
        raise GenerationError(f"{name}: expected each row to sum to 1 (finite, within {_SUM_TOL}), row {i} sums to {float(sums[i])!r}")
    lo = float(probs.min())
    if lo < 0.0:
        i = int(np.flatnonzero((probs < 0).any(axis=1))[0])
        raise GenerationError(f"{name}: expected probabilities >= 0, row {i} has {lo!r}")
    return probs


def _draw(p: npt.NDArray[np.floating], rng: np.random.Generator) -> int:
    """One id from the non-negative weights ``p`` (not necessarily normalised; the total must be > 0), by
    inverting the cumulative sum with one uniform from ``rng``. A zero-weight id is never returned."""
    cdf = np.cumsum(p, dtype=np.float64)
    u = rng.random() * cdf[-1]
    pos = int(np.searchsorted(cdf, u, side="right"))
    if pos >= cdf.size:  # u rounded up to the total: the last id with weight
        pos = int(np.flatnonzero(p)[-1])
    return pos


def residual_distribution(p: npt.NDArray[np.floating], q: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """``norm(max(0, p - q))``, the distribution a rejected draft position is resampled from (Leviathan et al.,
    Algorithm 1). When it is all zero (``p == q``, or ``p <= q`` everywhere by rounding) the position is
    resampled from ``p`` itself, which is then the exact answer: a rejection has probability 0 when ``p == q``,
    and ``p`` is the residual's limit as ``q -> p``. Both 1-D of the same length; returns float64."""
    if not isinstance(p, np.ndarray) or not isinstance(q, np.ndarray) or p.ndim != 1 or p.shape != q.shape:
        raise GenerationError(
            f"p, q: expected two 1-D arrays of the same length, got {getattr(p, 'shape', p)!r} and {getattr(q, 'shape', q)!r}"
        )
    r = np.maximum(p.astype(np.float64) - q.astype(np.float64), 0.0)
    total = float(r.sum())
    if total > 0.0:
        return r / total
    pp = p.astype(np.float64)
    return pp / float(pp.sum())


def verify(
    target_probs: npt.NDArray[np.floating],
    draft_tokens: Tokens,
    draft_probs: npt.NDArray[np.floating] | None,
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """Speculative sampling's verification step for one sequence (Leviathan, Kalman and Matias 2023, "Fast
    Inference from Transformers via Speculative Decoding", arXiv 2211.17192, Algorithm 1).

    ``target_probs`` is ``[k + 1, V]``: the target's warped distribution at each draft position plus the one
    after the last draft (:func:`warped_rows`). ``draft_tokens`` are the ``k`` proposed ids and
    ``draft_probs`` (``[k, V]``) the distributions they were drawn from, or None for a deterministic drafter
    (point masses at the drafts, e.g. :class:`PromptLookupDrafter`).

    Draft ``x_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection one token
    is drawn from ``norm(max(0, p_i - q_i))`` (:func:`residual_distribution`) and verification stops; when all
    ``k`` are accepted a bonus token is drawn from ``p_k``. Whatever ``q`` is, each produced token then follows
    the target distribution exactly. Returns ``(tokens, n_accepted)``: the accepted drafts plus that one extra
    token, so ``1 <= len(tokens) == n_accepted + 1 <= k + 1``. All randomness comes from ``rng`` (one uniform per
    tried draft plus one for the extra token), so a seeded generator repeats the result. With point-mass
    ``target_probs`` (greedy) this reduces to :func:`verify_greedy`.

    Raises GenerationError for arrays of the wrong shape or dtype, rows that are not probability vectors, draft
    ids outside ``[0, V)``, or a draft whose own ``q_i(x_i)`` is 0; OptionsError when ``rng`` is not a
    ``numpy.random.Generator``.
    """
    if not isinstance(rng, np.random.Generator):
        raise OptionsError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    drafts = _token_array("draft_tokens", draft_tokens)
    k = drafts.size
    p = _check_prob_rows("target_probs", target_probs, k + 1, None)
    vocab = p.shape[1]
    if k and (int(drafts.min()) < 0 or int(drafts.max()) >= vocab):
        bad = int(drafts.min()) if int(drafts.min()) < 0 else int(drafts.max())
        raise GenerationError(f"draft_tokens: token id {bad} is outside [0, {vocab})")
    q = None if draft_probs is None else _check_prob_rows("draft_probs", draft_probs, k, vocab)
    out: list[int] = []
    for i in range(k):
        x = int(drafts[i])
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        if qx <= 0.0:
            raise GenerationError(f"draft_probs: row {i} gives its own draft token {x} probability 0; a draft must be drawn from q")
        if rng.random() * qx < px:  # u < p/q, i.e. accepted with probability min(1, p/q)
            out.append(x)
            continue
        if q is None:
            resid = p[i].astype(np.float64)  # max(0, p - onehot(x)): p with x removed
            resid[x] = 0.0
            if not resid.sum() > 0.0:
                resid = p[i].astype(np.float64)
        else:
            resid = residual_distribution(p[i], q[i])
        out.append(_draw(resid, rng))
        return out, i
    out.append(_draw(p[k], rng))
    return out, k


def verify_greedy(target: npt.NDArray[np.generic] | Sequence[int], draft_tokens: Tokens) -> tuple[list[int], int]:
    """The temperature-0 case of :func:`verify`, without probabilities or randomness: drafts are accepted while
    they equal the target's argmax at their position; the extra token is the target's argmax at the first
    mismatch (or after the last draft). ``target`` is either the ``k + 1`` argmax ids (1-D ints; pass the ids
    ``Sampler.sample`` returns for greedy params when there is a repetition penalty, since the penalty can move
    the argmax) or a ``[k + 1, V]`` float array of logits or probabilities (argmax per row, lowest id on ties,
    like the sampler). Returns ``(tokens, n_accepted)`` as :func:`verify` does."""
    drafts = _token_array("draft_tokens", draft_tokens)
    k = drafts.size
    if isinstance(target, np.ndarray) and target.ndim == 2:
        if not np.issubdtype(target.dtype, np.floating) or target.shape[0] != k + 1 or target.shape[1] < 1:
            raise GenerationError(
                f"target: expected {k + 1} argmax ids or float logits of shape ({k + 1}, V), got {target.dtype} {target.shape}"
            )
        if np.isnan(target).any():
            raise GenerationError("target: logits contain NaN; no argmax can be taken")
        best = np.argmax(target, axis=1).astype(np.int64)
    else:
        best = _token_array("target", target)
        if best.size != k + 1:
            raise GenerationError(f"target: expected {k + 1} argmax ids (one per draft token plus one), got {best.size}")
    miss = np.flatnonzero(best[:k] != drafts)
    n = int(miss[0]) if miss.size else k
    return [int(t) for t in drafts[:n]] + [int(best[n])], n


# --- choosing the draft length ---------------------------------------------------------------------------------


def expected_tokens(acceptance: float, k: int) -> float:
    """Expected tokens from one verification pass over ``k`` drafts when each is accepted independently with
    probability ``acceptance``: ``1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)`` (Leviathan et al., eq. 1)."""
    a = _check_real("acceptance", acceptance, 0.0, 1.0, False, False)
    k = _int("k", k, 0)
    return float(sum(a**i for i in range(k + 1)))


def _interp_cost(table: Mapping[int, float], k: int) -> float:
    """``table`` (relative costs at some k, including 0) at ``k``: linear between points, the last slope beyond."""
    ks = sorted(table)
    if k in table:
        return table[k]
    if k > ks[-1]:
        if len(ks) == 1:
            return table[ks[-1]]
        k1, k2 = ks[-2], ks[-1]
        return table[k2] + (table[k2] - table[k1]) / (k2 - k1) * (k - k2)
    return float(np.interp(k, ks, [table[j] for j in ks]))


class AdaptiveDraftLength:
    """Chooses how many tokens to draft each step, from the measured acceptance rate and the cost of a
    verification pass; deterministic (no randomness), so a seeded generation repeats.

    Acceptance: each tried draft position is a Bernoulli trial (accepted, or the first rejection; positions after
    a rejection are never tried, so ``n_accepted / k`` would be biased low). The rate is the mean of a Beta
    posterior with prior ``prior = (alpha, beta)`` over counts that decay by ``decay`` per verification pass, so
    the estimate follows the text (a copied passage, then free text) within a few passes.

    Cost: ``cost(k)`` is the time of one pass over ``k + 1`` positions relative to one plain 1-token step;
    ``cost(0) == 1``. It starts from ``costs`` (default :data:`DEFAULT_VERIFY_COST`, interpolated); once
    :meth:`observe_cost` / :meth:`observe_step` report real timings (exponential moving averages), the measured
    ratio replaces the default at each measured ``k`` and the default curve is rescaled by the measured/default
    factor (interpolated in ``k``) where it is not measured. With only pass timings, the plain step's time is
    estimated from them through the default curve.

    :meth:`choose` returns the ``k`` in ``0..k_max`` maximising :func:`expected_tokens` ``/ cost(k)``, but ``k > 0``
    only if that beats plain decoding by ``min_gain`` (so a rate near break-even does not pay the pass's
    overhead). ``k = 0`` is plain decoding; after ``probe_every`` plain steps it returns ``probe_k`` once, so a
    stream that turns repetitive gets speculation back -- or after more steps when a probe is dear: the
    interval is at least ``(cost(probe_k) - 1) / max_probe_loss`` steps, so failed probes never cost more
    than ``max_probe_loss`` (3 %) of the time (a draft model's probe, which also catches the draft's KV
    up, can cost several plain steps). Until the first verified pass it returns ``k_init``
    (default ``min(4, k_max)``).

    The loop calls, per step: ``k = choose()``; draft up to ``k`` tokens (``[]`` and ``k = 0`` both mean a plain
    step); then ``update(len(draft), n_accepted)`` (``update(0, 0)`` after a plain step: that is what counts the
    steps towards the next probe) and, if it timed the step, ``observe_cost(len(draft), s)`` or
    ``observe_step(s)``.

    With the default costs, one pass of ``k = 1`` costs 4 % more than a plain step, so at zero acceptance the
    controller loses at most that per pass while it learns (about ten passes) and ``cost(probe_k) - 1`` per
    ``probe_every`` steps after; tests/test_generation_speculative.py simulates it at several rates.
    """

    def __init__(
        self,
        k_max: int = 8,
        k_init: int | None = None,
        *,
        probe_every: int = 16,
        probe_k: int = 1,
        decay: float = 0.9,
        prior: tuple[float, float] = (0.5, 1.5),
        min_gain: float = 0.02,
        costs: Mapping[int, float] | None = None,
        timing_smoothing: float = 0.25,
        max_probe_loss: float = 0.03,
    ) -> None:
        self.k_max = _int("k_max", k_max, 1)
        self.k_init = min(4, self.k_max) if k_init is None else _int("k_init", k_init, 0, self.k_max)
        self.probe_every = _int("probe_every", probe_every, 1)
        self.probe_k = _int("probe_k", probe_k, 1, self.k_max)
        self.decay = _check_real("decay", decay, 0.0, 1.0, True, False)
        if not isinstance(prior, tuple) or len(prior) != 2:
            raise OptionsError(f"prior: expected a tuple (alpha, beta) of two numbers > 0, got {prior!r}")
        self.prior = (
            _check_real("prior[0] (alpha)", prior[0], 0.0, math.inf, True, True),
            _check_real("prior[1] (beta)", prior[1], 0.0, math.inf, True, True),
        )
        self.min_gain = _check_real("min_gain", min_gain, 0.0, math.inf, False, True)
        self.timing_smoothing = _check_real("timing_smoothing", timing_smoothing, 0.0, 1.0, True, False)
        self.max_probe_loss = _check_real("max_probe_loss", max_probe_loss, 0.0, 1.0, True, False)
        table = dict(DEFAULT_VERIFY_COST) if costs is None else self._check_costs(costs)
        #: Relative cost at every k in 0..k_max before any timing is observed.
        self.default_costs: tuple[float, ...] = tuple(_interp_cost(table, k) for k in range(self.k_max + 1))
        self._successes = 0.0
        self._trials = 0.0
        self._updates = 0
        self._plain_run = 0  # plain steps since speculation was last tried
        self._step_s: float | None = None
        self._pass_s: dict[int, float] = {}
        self._cost_cache: list[float] | None = None  # _costs(), until the next observation

    @staticmethod
    def _check_costs(costs: Mapping[int, float]) -> dict[int, float]:
        if not isinstance(costs, Mapping) or not costs:
            raise OptionsError(f"costs: expected a non-empty mapping {{k: relative cost}}, got {costs!r}")
        table: dict[int, float] = {0: 1.0}
        for k, c in costs.items():
            kk = _int("costs key", k, 0)
            v = _check_real(f"costs[{kk}]", c, 0.0, math.inf, True, True)
            if kk == 0 and v != 1.0:
                raise OptionsError(f"costs[0]: expected 1.0 (the plain step is the unit), got {c!r}")
            table[kk] = v
        if len(table) < 2:
            raise OptionsError("costs: expected the relative cost of at least one k >= 1")
        return table

    # -- measurements -----------------------------------------------------------------------------------------

    def update(self, k_drafted: int, n_accepted: int) -> None:
        """Record one step: ``k_drafted`` tokens were verified and ``n_accepted`` of them accepted
        (``0 <= n_accepted <= k_drafted``); ``k_drafted == 0`` records a plain step."""
        k = _int("k_drafted", k_drafted, 0)
        n = _int("n_accepted", n_accepted, 0, k)
        if k == 0:
            self._plain_run += 1
            return
        trials = n + (1 if n < k else 0)
        self._successes = self.decay * self._successes + n
        self._trials = self.decay * self._trials + trials
        self._updates += 1
        self._plain_run = 0

    def observe_cost(self, k: int, seconds: float) -> None:
        """A measured verification pass over ``k`` drafts (``k + 1`` positions) took ``seconds``."""
        k = _int("k", k, 1, self.k_max)
        s = _check_real("seconds", seconds, 0.0, math.inf, True, True)
        old = self._pass_s.get(k)
        self._pass_s[k] = s if old is None else old + self.timing_smoothing * (s - old)
        self._cost_cache = None

    def observe_step(self, seconds: float) -> None:
        """A measured plain 1-token decode step took ``seconds`` (the unit of :meth:`cost`)."""
        s = _check_real("seconds", seconds, 0.0, math.inf, True, True)
        self._step_s = s if self._step_s is None else self._step_s + self.timing_smoothing * (s - self._step_s)
        self._cost_cache = None

    # -- estimates ----------------------------------------------------------------------------------------------

    @property
    def acceptance(self) -> float:
        """The estimated per-draft-token acceptance probability (posterior mean)."""
        a0, b0 = self.prior
        return (self._successes + a0) / (self._trials + a0 + b0)

    def cost(self, k: int) -> float:
        """Time of a verification pass over ``k`` drafts relative to one plain step (``cost(0) == 1``)."""
        k = _int("k", k, 0, self.k_max)
        return self._costs()[k]

    def costs(self) -> list[float]:
        """:meth:`cost` for every ``k`` in ``0..k_max`` (a copy)."""
        return list(self._costs())

    def _costs(self) -> list[float]:
        if self._cost_cache is None:
            self._cost_cache = self._compute_costs()
        return self._cost_cache

    def _compute_costs(self) -> list[float]:
        d = self.default_costs
        if not self._pass_s:
            return list(d)
        unit = self._step_s
        if unit is None:  # no plain step timed yet: infer it from the passes through the default curve
            unit = float(np.median([s / d[j] for j, s in self._pass_s.items()]))
        ks = sorted(self._pass_s)
        factors = [self._pass_s[j] / unit / d[j] for j in ks]
        out = [1.0]
        for k in range(1, self.k_max + 1):
            out.append(d[k] * float(np.interp(k, ks, factors)))
        return out

    def choose(self) -> int:
        """The draft length for the next step (0 = plain decoding). Reads the state; :meth:`update` advances it."""
        if self._updates == 0:  # no pass verified yet: k_init (and, from k_init = 0, the usual probes)
            return self.probe_k if self.k_init == 0 and self._probe_due() else self.k_init
        costs = self._costs()
        a = self.acceptance
        best_k, best_v = 0, 1.0
        tokens, term = 1.0, 1.0
        for k in range(1, self.k_max + 1):
            term *= a
            tokens += term  # expected_tokens(a, k), accumulated
            v = tokens / costs[k]
            if v > best_v:
                best_k, best_v = k, v
        if best_k and best_v >= 1.0 + self.min_gain:
            return best_k
        return self.probe_k if self._probe_due() else 0

    def probe_interval(self) -> int:
        """Plain steps between two probes: ``probe_every``, or more when a probe costs more than
        ``max_probe_loss`` of that many steps."""
        extra = max(0.0, self._costs()[self.probe_k] - 1.0)
        return max(self.probe_every, math.ceil(extra / self.max_probe_loss))

    def _probe_due(self) -> bool:
        return self._plain_run >= self.probe_interval()


# --- statistics ------------------------------------------------------------------------------------------------


@dataclass
class SpeculationStats:
    """Counters over one generation: draft tokens verified, how many were accepted, and verification passes
    (each yields its accepted drafts plus one token)."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0

    def record(self, k_drafted: int, n_accepted: int) -> None:
        """Count one verification pass of ``k_drafted`` drafts with ``n_accepted`` accepted."""
        k = _int("k_drafted", k_drafted, 0)
        n = _int("n_accepted", n_accepted, 0, k)
        self.drafted += k
        self.accepted += n
        self.passes += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (0.0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens produced per verification pass, ``(accepted + passes) / passes`` (0.0 before any pass)."""
        return (self.accepted + self.passes) / self.passes if self.passes else 0.0

    def to_dict(self) -> dict[str, float | int]:
        """The counters and both rates, for results and telemetry (JSON-ready)."""
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "passes": self.passes,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_pass": self.tokens_per_pass,
        }
