"""Choosing the next token from a decoder's logits: greedy, or seeded sampling with the usual filters.

The filters run in Hugging Face transformers' logits-processor order
(https://huggingface.co/docs/transformers/main/en/internal/generation_utils#logitsprocessor;
``GenerationMixin._get_logits_processor`` appends them in this order):

1. repetition penalty (``RepetitionPenaltyLogitsProcessor``, https://arxiv.org/abs/1909.05858): for each
   *distinct* token id in the history, a logit ``> 0`` is divided by the penalty, any other is multiplied;
2. temperature (``TemperatureLogitsWarper``): logits / temperature;
3. top-k (``TopKLogitsWarper``): keep the ``k`` largest;
4. top-p (``TopPLogitsWarper``, nucleus sampling, https://arxiv.org/abs/1904.09751): keep the most probable
   tokens until their mass reaches ``top_p``;
5. min-p (``MinPLogitsWarper``, https://arxiv.org/abs/2407.01082): keep tokens whose probability is at least
   ``min_p`` times the largest probability;

then one draw from the survivors, renormalised, with ``numpy.random.Generator(PCG64(seed))``.
``temperature == 0`` is greedy: the argmax after the repetition penalty (the other filters cannot change it).

Ties, where this differs from transformers (whose result among equal logits depends on ``torch.sort``'s order):

* top-k keeps exactly ``k`` tokens; among tokens equal to the ``k``-th largest logit the lowest ids win;
* top-p keeps or drops equal-probability tokens together: a token is kept iff the mass of the tokens strictly
  more probable than it is below ``top_p`` (so the kept set never depends on an order among equals);
* greedy takes the lowest id among equal maxima (``numpy.argmax``).

Speed: this runs once per generated token over vocabularies of ~150k. Nothing sorts the whole vocabulary
unless it must: top-k uses ``numpy.argpartition``; top-p first takes the ids within a factor 1e-3 of the most
likely one, then (if those do not prove the nucleus complete) the ``64, 256, 1024, ...`` most likely ids
(``argpartition``), until a candidate falls outside the nucleus (which proves the nucleus is complete: every
more likely id is a candidate), sorting only those; min-p is a threshold test. The full-vocabulary work is O(V) elementwise
(exp in float32, sums in float64); probabilities of the candidates are float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import numpy.typing as npt

from ..errors import GenerationError, SamplingError

__all__ = ["SamplingParams", "Sampler"]

History = Union[npt.NDArray[np.integer], Sequence[int]]

#: First candidate count for the exact top-p search; multiplied by 4 until the nucleus is proven complete.
_TOP_P_FIRST_K = 64
_MAX_INV_T = 1e30
#: Top-p's first candidate set: ids with weight >= this fraction of the max, used if there are at most _FIRST_MAX.
_TOP_P_FIRST_WEIGHT = 1e-3
_TOP_P_FIRST_MAX = 4096


def _real(name: str, value: object, accepted: str) -> float:
    """``value`` as a float if it is a real number (int or float, not bool), else SamplingError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingError(f"{name}: expected a number {accepted}, got {type(value).__name__} {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. The defaults are greedy decoding.

    * ``temperature`` >= 0 and finite; ``0`` is greedy (argmax), larger flattens the distribution.
    * ``top_k`` >= 0 (an int); ``0`` turns it off.
    * ``top_p`` in (0, 1]; ``1`` turns it off.
    * ``min_p`` in [0, 1); ``0`` turns it off.
    * ``repetition_penalty`` > 0 and finite; ``1`` turns it off, > 1 discourages repeats.
    * ``seed``: an int >= 0 for repeatable draws, or None for fresh OS entropy.

    Every field is checked on construction; a bad one raises SamplingError naming the parameter, the
    accepted range and the value.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = _real("temperature", self.temperature, ">= 0")
        if not (math.isfinite(t) and t >= 0.0):
            raise SamplingError(f"temperature: expected a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise SamplingError(f"top_k: expected an int >= 0 (0 = off), got {type(self.top_k).__name__} {self.top_k!r}")
        if self.top_k < 0:
            raise SamplingError(f"top_k: expected an int >= 0 (0 = off), got {self.top_k!r}")
        p = _real("top_p", self.top_p, "in (0, 1]")
        if not (0.0 < p <= 1.0):  # also false for NaN
            raise SamplingError(f"top_p: expected a number in (0, 1] (1 = off), got {self.top_p!r}")
        mp = _real("min_p", self.min_p, "in [0, 1)")
        if not (0.0 <= mp < 1.0):
            raise SamplingError(f"min_p: expected a number in [0, 1) (0 = off), got {self.min_p!r}")
        rp = _real("repetition_penalty", self.repetition_penalty, "> 0")
        if not (math.isfinite(rp) and rp > 0.0):
            raise SamplingError(f"repetition_penalty: expected a finite number > 0 (1 = off), got {self.repetition_penalty!r}")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise SamplingError(f"seed: expected None or an int >= 0, got {type(self.seed).__name__} {self.seed!r}")
            if self.seed < 0:
                raise SamplingError(f"seed: expected None or an int >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """True when decoding is the argmax (temperature 0); top-k/top-p/min-p and the seed are then unused."""
        return self.temperature == 0.0


class Sampler:
    """Picks token ids from logits under fixed :class:`SamplingParams` (see the module docstring for the order).

    One sampler serves one generation: its random generator advances with each draw, so the same seed, the
    same logits and the same history give the same sequence of ids. :meth:`fork` copies the generator's
    state; :meth:`reset` re-seeds it.
    """

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        if not isinstance(params, SamplingParams):
            raise SamplingError(f"params: expected SamplingParams, got {type(params).__name__}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise SamplingError(f"vocab_size: expected an int >= 1 (the logits' length), got {vocab_size!r}")
        self.params = params
        self.vocab_size = vocab_size
        #: The seed in use: ``params.seed``, or (when that is None) one drawn from OS entropy, so that a run can be
        #: repeated from the seed a result reports.
        self.seed: int = params.seed if params.seed is not None else _fresh_seed()
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        #: How many ids the last :meth:`sample` drew among (1 for greedy), and how many it sorted to get them (0 for
        #: greedy and plain temperature sampling). Lets tests and benchmarks see that no full sort happened.
        self.last_candidates = 0
        self.last_sorted = 0

    # -- repeatability ------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> None:
        """Restart the generator: from ``seed`` (which becomes :attr:`seed`), else from the current :attr:`seed`,
        so the draws repeat from the start."""
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise SamplingError(f"seed: expected None or an int >= 0, got {seed!r}")
            self.seed = seed
        self._rng = np.random.Generator(np.random.PCG64(self.seed))

    def fork(self) -> Sampler:
        """A new sampler with the same parameters whose generator continues from this one's current state:
        both then draw the same ids from the same logits."""
        twin = Sampler(self.params, self.vocab_size)
        twin.seed = self.seed
        twin._rng.bit_generator.state = self._rng.bit_generator.state
        return twin

    @property
    def rng(self) -> np.random.Generator:
        """The generator :meth:`sample` draws from (after :meth:`reset`, the new one). Speculative verification
        (``edge_sdk.generation.speculative.verify``) draws from it too, so a seeded generation stays repeatable."""
        return self._rng

    # -- sampling -----------------------------------------------------------------------------------

    def sample(self, logits: npt.NDArray[np.floating], history: History = ()) -> int:
        """The next token id for ``logits`` (1-D, ``vocab_size`` floats), ``history`` being the ids the repetition
        penalty counts (typically the prompt plus what was generated). ``logits`` is never modified.

        Raises GenerationError for logits of the wrong shape/dtype, NaN or +inf logits (naming how many), all
        logits -inf, or a history id outside ``[0, vocab_size)``.
        """
        ids, weights, n_sorted = self._candidates(logits, history)
        self.last_candidates, self.last_sorted = int(ids.size), n_sorted
        if self.params.greedy:
            return int(ids[0])  # greedy draws nothing: the generator does not advance
        return self._draw(ids, weights)

    def probs(self, logits: npt.NDArray[np.floating], history: History = ()) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
        """The distribution :meth:`sample` draws from for these ``logits`` and ``history``: the candidate ids that
        survive the penalty, temperature, top-k, top-p and min-p, and their probabilities (float64, summing to 1).
        Greedy (temperature 0) is a point mass: ``([argmax], [1.0])``.

        Speculative decoding's verification needs these exact probabilities (``edge_sdk.generation.speculative``);
        both methods go through :meth:`_candidates`, so a draw and its probability cannot disagree. Does not
        advance the random generator or change :attr:`last_candidates`. Raises as :meth:`sample` does.
        """
        ids, weights, _ = self._candidates(logits, history)
        return ids, weights / weights.sum()

    def _candidates(self, logits: npt.NDArray[np.floating], history: History) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], int]:
        """The one warping path behind :meth:`sample` and :meth:`probs`: checked and penalised logits, then (unless
        greedy) the filters. Returns the surviving ids, their unnormalised weights and how many ids were sorted."""
        x = self._check_logits(logits)
        x = self._penalise(x, history)
        if self.params.greedy:
            return np.array([int(np.argmax(x))], dtype=np.intp), np.ones(1, dtype=np.float64), 0
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            return self._filter(x)

    def _check_logits(self, logits: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        if not isinstance(logits, np.ndarray):
            raise GenerationError(f"logits: expected a numpy array, got {type(logits).__name__}")
        if logits.ndim != 1 or logits.shape[0] != self.vocab_size:
            raise GenerationError(f"logits: expected shape ({self.vocab_size},), got {logits.shape}")
        if not np.issubdtype(logits.dtype, np.floating):
            raise GenerationError(f"logits: expected a floating dtype, got {logits.dtype}")
        # float16/float64 logits are computed on in float32 (a copy; the caller's array is untouched).
        x: npt.NDArray[np.float32] = logits if logits.dtype == np.float32 else logits.astype(np.float32)
        top = float(np.max(x))  # NaN propagates through max, so this one pass screens the whole vector
        if math.isnan(top) or top == math.inf:
            n_nan = int(np.count_nonzero(np.isnan(x)))
            n_inf = int(np.count_nonzero(np.isposinf(x)))
            raise GenerationError(f"logits: {n_nan} NaN and {n_inf} +inf of {self.vocab_size}; the model's output is not usable")
        if top == -math.inf:
            raise GenerationError(f"logits: all {self.vocab_size} are -inf; no token can be chosen")
        return x

    def _penalise(self, x: npt.NDArray[np.float32], history: History) -> npt.NDArray[np.float32]:
        rp = self.params.repetition_penalty
        if rp == 1.0:
            return x
        h = np.asarray(history)
        if h.size == 0:
            return x
        if h.ndim != 1 or not np.issubdtype(h.dtype, np.integer):
            raise GenerationError(f"history: expected a 1-D sequence of int token ids, got dtype {h.dtype} shape {h.shape}")
        lo, hi = int(h.min()), int(h.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise GenerationError(f"history: token id {bad} is outside [0, {self.vocab_size})")
        ids = np.unique(h)
        out: npt.NDArray[np.float32] = x.copy()  # never modify the caller's logits
        g = out[ids]
        out[ids] = np.where(g > 0, g / np.float32(rp), g * np.float32(rp))
        return out

    def _filter(self, x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], int]:
        """Temperature, top-k, top-p, min-p: the surviving ids, their unnormalised weights (float64), and how many
        ids were sorted on the way."""
        p = self.params
        v = x.shape[0]
        # 1/T capped at 1e30 (T below 1e-30 behaves as T = 1e-30: every non-maximal weight is 0 either way),
        # so that (x - max) * (1/T) never meets 0 * inf.
        inv_t = min(1.0 / p.temperature, _MAX_INV_T)
        if 0 < p.top_k < v:
            ids = _top_k_ids(x, p.top_k)
            n_sorted = p.top_k
            vals = x[ids].astype(np.float64)
            order = np.lexsort((ids, -vals))  # value descending, then id ascending
            ids, vals = ids[order], vals[order]
            w = np.exp((vals - vals[0]) * inv_t)  # softmax over the k survivors is the exact distribution now
            if p.top_p < 1.0:
                keep = _nucleus_size(vals, w / w.sum(), p.top_p)
                ids, vals, w = ids[:keep], vals[:keep], w[:keep]
        elif p.top_p < 1.0:
            ids, vals, w, n_sorted = _nucleus_full(x, inv_t, p.top_p)
        else:
            m = float(np.max(x))
            w32 = np.exp((x - np.float32(m)) * np.float32(inv_t))
            if p.min_p > 0.0:
                ids = np.flatnonzero(w32 >= np.float32(p.min_p))  # the max's weight is exactly 1
                return ids, w32[ids].astype(np.float64), 0
            return np.arange(v), w32.astype(np.float64), 0
        if p.min_p > 0.0:
            keep_mask = w >= p.min_p * w.max()
            ids, w = ids[keep_mask], w[keep_mask]
        return ids, w, n_sorted

    def _draw(self, ids: npt.NDArray[np.intp], weights: npt.NDArray[np.float64]) -> int:
        if ids.size == 1:
            self._rng.random()  # keep the generator's stream one value per draw, whatever the candidate count
            return int(ids[0])
        cdf = np.cumsum(weights)
        u = self._rng.random() * cdf[-1]
        pos = int(np.searchsorted(cdf, u, side="right"))
        return int(ids[min(pos, ids.size - 1)])


def _fresh_seed() -> int:
    """A 63-bit seed from OS entropy (small enough to print and to pass back as ``SamplingParams.seed``)."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))


def _top_k_ids(x: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.intp]:
    """Exactly ``k`` ids of the largest values; among values equal to the k-th largest, the lowest ids."""
    v = x.shape[0]
    part = np.argpartition(x, v - k)[v - k :]
    kth = x[part].min()
    above = part[x[part] > kth]
    need = k - above.size
    ties = np.flatnonzero(x == kth)[:need]
    return np.concatenate([above, ties])


def _nucleus_size(vals: npt.NDArray[np.float64], probs: npt.NDArray[np.float64], top_p: float) -> int:
    """For candidates sorted by value descending with their probabilities (of the whole distribution), how many
    are kept: those whose strictly-more-probable mass is below ``top_p`` (ties kept or dropped together).
    Returns ``len(vals)`` when every candidate is kept (the nucleus may then extend past them)."""
    before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])  # mass of the candidates ahead of each
    # mass ahead of each token's tie group = ``before`` at the group's first member
    starts = np.concatenate([[True], vals[1:] != vals[:-1]])
    group_first = np.maximum.accumulate(np.where(starts, np.arange(vals.size), 0))
    dropped = np.flatnonzero(before[group_first] >= top_p)
    return int(dropped[0]) if dropped.size else int(vals.size)


def _nucleus_full(
    x: npt.NDArray[np.float32], inv_t: float, top_p: float
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.float64], int]:
    """Exact top-p over the whole vocabulary without sorting it: grow the candidate set (64, 256, ...) until one
    candidate is outside the nucleus; then every token with a larger value is a candidate, so the kept set is
    complete. Returns kept ids (sorted by value desc, id asc), their logits, weights ``exp((x - max) / T)``, and
    how many ids were sorted in all."""
    v = x.shape[0]
    m = np.float32(np.max(x))
    w32 = np.exp((x - m) * np.float32(inv_t))
    total = float(w32.sum(dtype=np.float64))

    # Cheap first try: the ids whose weight is >= 1e-3 of the max (a threshold set also holds every id above it,
    # so the same completeness test applies). Usually a handful; skipped when the distribution is flat.
    def ranked(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``ids`` best first (ties by id), their logits and weights, and how many of them are in the nucleus."""
        vals = x[ids].astype(np.float64)
        order = np.lexsort((ids, -vals))
        ids, vals = ids[order], vals[order]
        w = w32[ids].astype(np.float64)
        return ids, vals, w, _nucleus_size(vals, w / total, top_p)

    ids = np.flatnonzero(w32 >= np.float32(_TOP_P_FIRST_WEIGHT))
    n_sorted = 0
    if ids.size <= _TOP_P_FIRST_MAX:
        n_sorted += ids.size
        ids, vals, w, keep = ranked(ids)
        # Complete if a candidate is outside the nucleus, or if the candidates' mass already reaches top_p (every
        # other id then has at least that mass ahead of it; a threshold set holds all ties of its members).
        if keep < ids.size or w.sum() / total >= top_p:
            return ids[:keep], vals[:keep], w[:keep], n_sorted
    k = _TOP_P_FIRST_K
    while True:
        if k >= v:
            ids = np.arange(v)
        else:
            ids = np.argpartition(x, v - k)[v - k :]
        n_sorted += ids.size
        ids, vals, w, keep = ranked(ids)
        if keep < ids.size or k >= v:
            return ids[:keep], vals[:keep], w[:keep], n_sorted
        k *= 4
