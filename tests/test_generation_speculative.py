"""edge_sdk.generation.speculative: the sampler's warped probabilities, Leviathan et al.'s verification (its output
follows the target distribution), prompt lookup drafting, the adaptive draft length, the stats, bad arguments."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest

from edge_sdk.errors import GenerationError, OptionsError
from edge_sdk.generation.sampling import Sampler, SamplingParams
from edge_sdk.generation.speculative import (
    DEFAULT_VERIFY_COST,
    AdaptiveDraftLength,
    PromptLookupDrafter,
    SpeculationStats,
    expected_tokens,
    residual_distribution,
    verify,
    verify_greedy,
    warped_probs,
    warped_rows,
)


def chi2_bound(df: int, z: float = 5.0) -> float:
    """The chi-square quantile ``z`` standard deviations out (Wilson-Hilferty): z = 5 is p ~ 3e-7, so a correct
    implementation fails it for essentially no seed, while the wrong distributions below exceed it many times."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's statistic over the cells with probability > 0 (a count in a zero cell makes it infinite)."""
    n = counts.sum()
    pos = probs > 0
    if counts[~pos].sum() > 0:
        return math.inf
    e = n * probs[pos]
    return float((((counts[pos] - e) ** 2) / e).sum())


def onehot(v: int, *ids: int) -> np.ndarray:
    out = np.zeros((len(ids), v))
    out[np.arange(len(ids)), list(ids)] = 1.0
    return out


# --- Sampler.probs / warped_probs ---------------------------------------------------------------------------


WARPS = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.7, top_k=6, seed=2),
    SamplingParams(temperature=1.3, top_p=0.8, seed=3),
    SamplingParams(temperature=0.9, min_p=0.05, repetition_penalty=1.4, seed=4),
    SamplingParams(temperature=1.1, top_k=8, top_p=0.9, min_p=0.02, repetition_penalty=0.8, seed=5),
]


@pytest.mark.parametrize("params", WARPS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}-r{p.repetition_penalty}")
def test_sampler_draws_follow_its_probs(params: SamplingParams) -> None:
    v, n = 12, 20_000
    x = np.linspace(2.0, -1.5, v).astype(np.float32)
    x[[3, 7]] = [2.4, -0.2]
    history = [0, 3, 3, 9]
    s = Sampler(params, v)
    dense = warped_probs(s, x, history)
    ids, probs = s.probs(x, history)
    assert dense.shape == (v,) and abs(dense.sum() - 1.0) < 1e-12
    np.testing.assert_allclose(dense[ids], probs)
    assert set(np.flatnonzero(dense).tolist()) == set(ids.tolist())
    counts = np.bincount([s.sample(x, history) for _ in range(n)], minlength=v)
    df = max(int((dense > 0).sum()) - 1, 1)
    assert chi2(counts, dense) < chi2_bound(df), (counts, n * dense)
    # the statistic can fail: the plain softmax (no filters, no penalty) is rejected whenever a warp changes it
    plain = np.exp(x.astype(np.float64) - x.max())
    plain /= plain.sum()
    if not np.allclose(plain, dense, atol=0.01):
        assert chi2(counts, plain) > chi2_bound(v - 1)


def test_probs_greedy_is_a_point_mass_at_the_penalised_argmax_and_draws_nothing() -> None:
    x = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    s = Sampler(SamplingParams(), 4)
    ids, probs = s.probs(x)
    assert ids.tolist() == [1] and probs.tolist() == [1.0]
    pen = Sampler(SamplingParams(repetition_penalty=1.5), 4)
    np.testing.assert_array_equal(warped_probs(pen, x, [1]), [0.0, 0.0, 1.0, 0.0])  # 3.0 / 1.5 < 2.9
    assert pen.sample(x, [1]) == 2
    # probs() does not advance the generator: the draws after it are the draws without it
    a = Sampler(SamplingParams(temperature=1.0, seed=9), 4)
    b = Sampler(SamplingParams(temperature=1.0, seed=9), 4)
    for _ in range(5):
        a.probs(x)
    assert [a.sample(x) for _ in range(50)] == [b.sample(x) for _ in range(50)]


def test_warped_rows_penalise_with_history_plus_drafts() -> None:
    v = 6
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, v)).astype(np.float32) * 2
    s = Sampler(SamplingParams(temperature=0.8, top_k=4, repetition_penalty=1.7, seed=0), v)
    rows = warped_rows(s, logits, [0, 1], [4, 5])
    assert rows.shape == (3, v)
    for i, h in enumerate(([0, 1], [0, 1, 4], [0, 1, 4, 5])):
        np.testing.assert_array_equal(rows[i], warped_probs(s, logits[i], h))
    assert not np.array_equal(rows[1], warped_probs(s, logits[1], [0, 1]))  # the draft counts for the penalty
    with pytest.raises(GenerationError, match=r"shape \(3, 6\)"):
        warped_rows(s, logits[:2], [0], [4, 5])
    with pytest.raises(OptionsError, match="sampler"):
        warped_probs("s", logits[0])  # type: ignore[arg-type]


# --- verify: the output follows the target distribution ----------------------------------------------------


def _random_case(seed: int, v: int = 5, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    p = r.dirichlet(np.full(v, 0.7), size=k + 1)
    q = r.dirichlet(np.full(v, 0.7), size=k)
    return p, q


def _run(
    p: np.ndarray, q: np.ndarray | None, n: int, seed: int, fn: Callable[..., tuple[list[int], int]] = verify
) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    k, v = p.shape[0] - 1, p.shape[1]
    if q is None:
        drafts = np.tile(np.arange(k), (n, 1))  # a deterministic drafter: always 0, 1, ...
    else:  # x_i ~ q_i, drawn up front (vectorised) from a generator of their own
        u = np.random.default_rng(seed + 10_000).random((n, k))
        drafts = np.stack([np.minimum(np.searchsorted(np.cumsum(q[i]), u[:, i], side="right"), v - 1) for i in range(k)], axis=1)
    return [fn(p, d.tolist(), q, rng) for d in drafts]


def _always_accept(p: np.ndarray, drafts: list[int], q: np.ndarray | None, rng: np.random.Generator) -> tuple[list[int], int]:
    """A wrong verifier: keeps every draft (its output follows q, not p)."""
    return drafts + [_pick(p[-1], rng)], len(drafts)


def _pick(row: np.ndarray, rng: np.random.Generator) -> int:
    return min(int(np.searchsorted(np.cumsum(row), rng.random(), side="right")), row.size - 1)


def _resample_from_p(p: np.ndarray, drafts: list[int], q: np.ndarray | None, rng: np.random.Generator) -> tuple[list[int], int]:
    """A wrong verifier: the right acceptance test, but a rejected position is redrawn from p, not the residual."""
    for i, x in enumerate(drafts):
        qx = 1.0 if q is None else q[i, x]
        if rng.random() * qx >= p[i, x]:
            return drafts[:i] + [_pick(p[i], rng)], i
    return drafts + [_pick(p[-1], rng)], len(drafts)


@pytest.mark.parametrize("case", [0, 1, 2])
def test_verify_first_token_follows_the_target_not_the_draft(case: int) -> None:
    p, q = _random_case(100 + case)
    n = 30_000
    runs = _run(p, q, n, seed=case)
    first = np.bincount([toks[0] for toks, _ in runs], minlength=5)
    assert chi2(first, p[0]) < chi2_bound(4), (first / n, p[0])
    assert chi2(first, q[0]) > 10 * chi2_bound(4)  # it is not the draft's distribution
    # Leviathan's acceptance rate at a position: sum_x min(p(x), q(x))
    alpha = float(np.minimum(p[0], q[0]).sum())
    rate = sum(n_acc > 0 for _, n_acc in runs) / n
    assert abs(rate - alpha) < 5 * math.sqrt(alpha * (1 - alpha) / n)
    # the same bound rejects wrong verifiers, so it can fail
    for wrong in (_always_accept, _resample_from_p):
        bad = np.bincount([toks[0] for toks, _ in _run(p, q, n, seed=case, fn=wrong)], minlength=5)
        assert chi2(bad, p[0]) > chi2_bound(4), wrong.__name__


def test_verify_later_tokens_follow_the_target_given_the_prefix() -> None:
    p, q = _random_case(7)
    n = 40_000
    runs = _run(p, q, n, seed=8)
    # position 1, among runs whose position 0 was an accepted draft: distributed as p[1]
    second = np.bincount([toks[1] for toks, n_acc in runs if n_acc >= 1], minlength=5)
    assert second.sum() > 5000
    assert chi2(second, p[1]) < chi2_bound(4), (second / second.sum(), p[1])
    assert all(1 <= len(toks) == n_acc + 1 <= 4 for toks, n_acc in runs)


def test_point_mass_draft_for_prompt_lookup() -> None:
    p, _ = _random_case(11, k=2)
    n = 30_000
    runs = _run(p, None, n, seed=12)  # drafts [0, 1], q = point masses
    first = np.bincount([toks[0] for toks, _ in runs], minlength=5)
    assert chi2(first, p[0]) < chi2_bound(4)
    assert abs(sum(n_acc > 0 for _, n_acc in runs) / n - p[0, 0]) < 5 * math.sqrt(p[0, 0] * (1 - p[0, 0]) / n)
    # draft_probs=None is exactly explicit one-hot rows, draw for draw
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(200):
        assert verify(p, [0, 1], None, r1) == verify(p, [0, 1], onehot(5, 0, 1), r2)
    bad = np.bincount([toks[0] for toks, _ in _run(p, None, n, seed=12, fn=_resample_from_p)], minlength=5)
    assert chi2(bad, p[0]) > chi2_bound(4)


def test_greedy_special_case_matches_verify_greedy() -> None:
    v = 7
    target = [3, 5, 1, 6]  # the target's argmax at each of k + 1 = 4 positions
    p = onehot(v, *target)
    rng = np.random.default_rng(0)
    for drafts, want in (
        ([3, 5, 1], ([3, 5, 1, 6], 3)),  # all accepted: the bonus is the last argmax
        ([3, 5, 2], ([3, 5, 1], 2)),  # third rejected: replaced by the target's token there
        ([0, 5, 1], ([3], 0)),
    ):
        for _ in range(20):
            assert verify(p, drafts, None, rng) == want
        assert verify_greedy(np.array(target), drafts) == want
        assert verify_greedy(target, drafts) == want
        logits = np.random.default_rng(1).standard_normal((4, v)).astype(np.float32)
        logits[np.arange(4), target] = 10.0
        assert verify_greedy(logits, drafts) == want
    assert verify_greedy([4], []) == ([4], 0)
    # lowest id among equal maxima, like the sampler
    assert verify_greedy(np.array([[1.0, 2.0, 2.0]], np.float32), []) == ([1], 0)


def test_all_accepted_gives_k_plus_one_tokens_with_the_bonus_from_the_last_row() -> None:
    v, n = 5, 20_000
    last = np.array([0.1, 0.2, 0.3, 0.4, 0.0])
    p = np.vstack([onehot(v, 2, 0, 4), last])  # every draft has target probability 1: always accepted
    rng = np.random.default_rng(3)
    runs = [verify(p, [2, 0, 4], None, rng) for _ in range(n)]
    assert all(n_acc == 3 and toks[:3] == [2, 0, 4] and len(toks) == 4 for toks, n_acc in runs)
    bonus = np.bincount([toks[3] for toks, _ in runs], minlength=v)
    assert bonus[4] == 0 and chi2(bonus, last) < chi2_bound(3)


def test_first_rejection_truncates_and_draws_from_the_residual() -> None:
    v = 5
    p = np.array(
        [
            [0.0, 1.0, 0.0, 0.0, 0.0],
            [0.5, 0.0, 0.3, 0.2, 0.0],  # the draft 4 has target probability 0: always rejected here
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.2, 0.2, 0.2, 0.2, 0.2],
        ]
    )
    rng = np.random.default_rng(4)
    n = 20_000
    runs = [verify(p, [1, 4, 0], None, rng) for _ in range(n)]
    assert all(n_acc == 1 and len(toks) == 2 and toks[0] == 1 and toks[1] != 4 for toks, n_acc in runs)
    second = np.bincount([toks[1] for toks, _ in runs], minlength=v)
    assert chi2(second, p[1]) < chi2_bound(2)
    # with an explicit q the residual is norm(max(0, p - q))
    q = np.array([[0.0, 1.0, 0.0, 0.0, 0.0], [0.4, 0.0, 0.4, 0.0, 0.2], [0.2] * 5])
    np.testing.assert_allclose(residual_distribution(p[1], q[1]), [0.1 / 0.3, 0, 0, 0.2 / 0.3, 0])
    got = [verify(p, [1, 4, 0], q, rng) for _ in range(n)]
    assert all(toks[1] in (0, 3) for toks, _ in got)
    resid = np.bincount([toks[1] for toks, _ in got], minlength=v)
    assert chi2(resid, residual_distribution(p[1], q[1])) < chi2_bound(1)


def test_degenerate_residual_falls_back_to_p() -> None:
    p = np.array([0.5, 0.25, 0.25, 0.0])
    np.testing.assert_array_equal(residual_distribution(p, p), p)  # p == q: the residual is all zero
    q = np.array([0.5, 0.25, 0.25 + 1e-12, 0.0])
    np.testing.assert_allclose(residual_distribution(p, q), p)  # p <= q everywhere (rounding)
    # p == q: nothing is ever rejected, and the bonus follows the last row
    rows = np.vstack([p, p, p])
    rng = np.random.default_rng(6)
    for _ in range(500):
        drafts = [int(rng.choice(4, p=p)) for _ in range(2)]
        toks, n_acc = verify(rows, drafts, np.vstack([p, p]), rng)
        assert n_acc == 2 and toks[:2] == drafts and toks[2] != 3
    # point-mass q on a point-mass p, a hair below 1 by rounding: a rejection (if drawn) falls back to p
    hair = np.array([[1.0 - 1e-9, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    assert all(verify(hair, [0], None, rng) == ([0, 1], 1) for _ in range(100))
    with pytest.raises(GenerationError, match="same length"):
        residual_distribution(p, p[:3])


def test_verify_without_drafts_and_reproducibility() -> None:
    p, q = _random_case(21)
    a = _run(p, q, 300, seed=77)
    assert a == _run(p, q, 300, seed=77)
    assert a != _run(p, q, 300, seed=78)
    rng = np.random.default_rng(0)
    zero = np.bincount([verify(p[:1], [], None, rng)[0][0] for _ in range(20_000)], minlength=5)
    assert chi2(zero, p[0]) < chi2_bound(4)
    assert verify(p[:1], np.array([], dtype=np.int64), np.empty((0, 5)), rng)[1] == 0


def test_verify_bad_arguments() -> None:
    p, q = _random_case(0)
    rng = np.random.default_rng(0)
    with pytest.raises(GenerationError, match=r"target_probs: expected shape \(4, V\)"):
        verify(p[:3], [0, 1, 2], q, rng)
    with pytest.raises(GenerationError, match=r"draft_probs: expected shape \(3, 5\)"):
        verify(p, [0, 1, 2], q[:, :4], rng)
    with pytest.raises(GenerationError, match="row 2 sums to"):
        verify(p * np.array([[1], [1], [2], [1]]), [0, 1, 2], q, rng)
    neg = p.copy()
    neg[1, :2] = [neg[1, 0] + 0.5, neg[1, 1] - 0.5]
    with pytest.raises(GenerationError, match=">= 0, row 1"):
        verify(neg, [0, 1, 2], q, rng)
    nan = p.copy()
    nan[0, 0] = np.nan
    with pytest.raises(GenerationError, match="row 0"):
        verify(nan, [0, 1, 2], q, rng)
    with pytest.raises(GenerationError, match=r"token id 5 is outside \[0, 5\)"):
        verify(p, [0, 5, 2], q, rng)
    with pytest.raises(GenerationError, match="int token ids"):
        verify(p, [0.0, 1.0, 2.0], q, rng)  # type: ignore[list-item]
    with pytest.raises(GenerationError, match="floating"):
        verify(p.astype(np.int64), [0, 1, 2], q, rng)
    zq = q.copy()
    zq[0] = [0.0, 0.25, 0.25, 0.25, 0.25]
    with pytest.raises(GenerationError, match="probability 0"):
        verify(p, [0, 1, 2], zq, rng)
    with pytest.raises(OptionsError, match=r"numpy.random.Generator"):
        verify(p, [0, 1, 2], q, np.random.RandomState(0))  # type: ignore[arg-type]
    with pytest.raises(GenerationError, match="expected 3 argmax ids"):
        verify_greedy([1, 2], [1, 2])
    with pytest.raises(GenerationError, match=r"shape \(3, V\)"):
        verify_greedy(np.zeros((2, 4), np.float32), [1, 2])
    with pytest.raises(GenerationError, match="NaN"):
        verify_greedy(np.full((3, 4), np.nan, np.float32), [1, 2])


# --- prompt lookup -----------------------------------------------------------------------------------------


def test_prompt_lookup_latest_match_longest_ngram_and_k() -> None:
    d = PromptLookupDrafter()
    assert (d.max_ngram, d.min_ngram) == (3, 1)
    #         0  1  2  3  4  5  6  7  8  9 10 11
    toks = [7, 1, 2, 8, 9, 1, 2, 5, 6, 4, 1, 2]
    # suffix [4, 1, 2] and [... 1, 2]: no earlier 3-gram; the 2-gram [1, 2] occurs at 1 and 5 -> latest is 5
    assert d.draft(toks, 3) == [5, 6, 4]
    assert d.draft(np.array(toks, dtype=np.int32), 3) == [5, 6, 4]
    assert d.draft(toks, 1) == [5]
    assert d.draft(toks, 0) == []
    # a longer n-gram wins over a later shorter one: [3, 1, 2] at 0 beats [1, 2] at 5
    toks2 = [3, 1, 2, 20, 21, 9, 1, 2, 30, 31, 3, 1, 2]
    assert d.draft(toks2, 2) == [20, 21]
    assert PromptLookupDrafter(max_ngram=2).draft(toks2, 2) == [30, 31]
    # fewer than k when the context ends first; the match may overlap the suffix
    assert d.draft([5, 6, 5, 6, 5, 6], 4) == [5, 6]
    assert d.draft([4, 4, 4, 4], 8) == [4]
    # no match: []
    assert d.draft([1, 2, 3, 4, 5], 4) == []
    assert d.draft([1], 4) == [] and d.draft([], 4) == [] and d.draft(np.array([], np.int64), 2) == []
    # min_ngram: a 1-gram match is not used when min_ngram is 2
    assert d.draft([9, 1, 5, 1], 2) == [5, 1]
    assert PromptLookupDrafter(max_ngram=3, min_ngram=2).draft([9, 1, 5, 1], 2) == []


def test_prompt_lookup_on_a_long_context_is_exact() -> None:
    """A 2k-token context (no timing asserted): the copied passage is found at its latest occurrence."""
    rng = np.random.default_rng(0)
    ctx = rng.integers(1000, 50_000, 2048)
    passage = ctx[700:720]
    seq = np.concatenate([ctx, passage[:5]])
    assert PromptLookupDrafter().draft(seq, 8) == passage[5:13].tolist()
    assert PromptLookupDrafter().draft(seq.tolist(), 8) == passage[5:13].tolist()


def test_prompt_lookup_bad_arguments() -> None:
    with pytest.raises(OptionsError, match="min_ngram: expected an int >= 1"):
        PromptLookupDrafter(min_ngram=0)
    with pytest.raises(OptionsError, match="max_ngram: expected an int >= min_ngram"):
        PromptLookupDrafter(max_ngram=2, min_ngram=3)
    with pytest.raises(OptionsError, match="max_ngram"):
        PromptLookupDrafter(max_ngram=2.0)  # type: ignore[arg-type]
    d = PromptLookupDrafter()
    with pytest.raises(OptionsError, match="k: expected an int >= 0"):
        d.draft([1, 2, 1], -1)
    with pytest.raises(OptionsError, match="k"):
        d.draft([1, 2, 1], True)
    with pytest.raises(GenerationError, match="int token ids"):
        d.draft([1.0, 2.0], 2)  # type: ignore[list-item]
    with pytest.raises(GenerationError, match="int token ids"):
        d.draft(np.zeros((2, 2), np.int64), 2)
    with pytest.raises(GenerationError, match="int token ids"):
        d.draft("abc", 2)  # type: ignore[arg-type]


# --- the adaptive draft length -----------------------------------------------------------------------------


def simulate(
    ctl: AdaptiveDraftLength, acceptance: Callable[[int], float], steps: int, seed: int = 0, true_cost: list[float] | None = None
) -> tuple[float, list[int]]:
    """Drive the controller as the decode loop does, with i.i.d. acceptance; returns (tokens per unit of plain-step
    time relative to plain decoding, the chosen k per step). The controller is told the true timings."""
    r = np.random.default_rng(seed)
    cost = list(ctl.costs()) if true_cost is None else true_cost
    spent, tokens, ks = 0.0, 0, []
    for t in range(steps):
        k = ctl.choose()
        ks.append(k)
        if k == 0:
            spent, tokens = spent + 1.0, tokens + 1
            ctl.update(0, 0)
            ctl.observe_step(0.012)
            continue
        n = 0
        while n < k and r.random() < acceptance(t):
            n += 1
        spent, tokens = spent + cost[k], tokens + n + 1
        ctl.update(k, n)
        ctl.observe_cost(k, cost[k] * 0.012)
    return tokens / spent, ks


def test_expected_tokens_and_default_costs() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx((1 - 0.5**3) / 0.5)
    ctl = AdaptiveDraftLength()
    c = ctl.costs()
    assert len(c) == 9 and c[0] == 1.0
    for k, want in DEFAULT_VERIFY_COST.items():
        assert c[k] == pytest.approx(want)
    assert c[3] == pytest.approx((15.9 + 23.3) / 2 / 12.1) and c[6] == pytest.approx((23.3 + 33.0) / 2 / 12.1)
    assert AdaptiveDraftLength(k_max=12).cost(12) == pytest.approx((33.0 + 4 * (33.0 - 23.3) / 4) / 12.1)
    assert ctl.choose() == 4  # k_init before any pass


@pytest.mark.parametrize("rate", [0.0, 0.03, 0.1])
def test_low_acceptance_goes_plain_quickly_and_loses_under_5_percent(rate: float) -> None:
    ctl = AdaptiveDraftLength()
    speed, ks = simulate(ctl, lambda t: rate, 200, seed=1)
    assert speed > 0.95, (speed, ks[:40])
    if rate == 0.0:
        first_zero = ks.index(0)
        assert first_zero <= 12, ks[:20]
        assert sum(k > 0 for k in ks[first_zero:]) <= len(ks[first_zero:]) // ctl.probe_every + 1  # only probes
    # with a pass that truly costs more (say the runtime's overhead), the observed cost turns speculation off sooner
    dear = [1.0] + [1.2 + 0.3 * (k - 1) for k in range(1, 9)]
    ctl2 = AdaptiveDraftLength()
    speed2, ks2 = simulate(ctl2, lambda t: rate, 200, seed=2, true_cost=dear)
    assert speed2 > 0.95, (speed2, ks2[:40])
    assert ctl2.cost(1) == pytest.approx(1.2)


def test_high_acceptance_drafts_long() -> None:
    ctl = AdaptiveDraftLength()
    speed, ks = simulate(ctl, lambda t: 1.0, 60)
    assert ks[-20:] == [8] * 20 and speed > 3.0
    ctl = AdaptiveDraftLength()
    speed, ks = simulate(ctl, lambda t: 0.9, 300, seed=3)
    assert np.mean(ks[50:]) >= 4 and speed > 2.0


def test_probes_back_after_n_plain_steps_and_recovers_on_repetitive_text() -> None:
    ctl = AdaptiveDraftLength(probe_every=10)
    passes = 0
    while (k := ctl.choose()) > 0:  # failing passes until the first plain step
        ctl.update(k, 0)
        passes += 1
        assert passes <= 12
    for _ in range(9):
        ctl.update(0, 0)
        assert ctl.choose() == 0
    ctl.update(0, 0)
    assert ctl.choose() == ctl.probe_k == 1
    ctl.update(0, 0)  # the drafter found nothing: still probing
    assert ctl.choose() == 1
    ctl.update(1, 0)  # the probe failed: plain again for another 10 steps
    assert ctl.choose() == 0
    # free text, then a copied passage: speculation comes back and grows
    speed, ks = simulate(AdaptiveDraftLength(), lambda t: 0.0 if t < 200 else 1.0, 300, seed=4)
    assert all(k in (0, 1) for k in ks[30:200])
    assert ks[-30:] == [8] * 30, ks[200:]


def test_observed_costs_replace_the_defaults() -> None:
    ctl = AdaptiveDraftLength()
    for _ in range(6):
        ctl.update(2, 1)  # acceptance about one half
    assert ctl.choose() == 1
    ctl.observe_step(0.010)
    ctl.observe_cost(1, 0.013)  # measured: k=1 costs 1.3 plain steps, not 1.04
    assert ctl.cost(1) == pytest.approx(1.3)
    assert ctl.cost(2) == pytest.approx(DEFAULT_VERIFY_COST[2] * 1.3 / DEFAULT_VERIFY_COST[1])  # rescaled
    ctl.observe_cost(4, 0.020)
    assert ctl.cost(4) == pytest.approx(2.0)
    assert ctl.choose() == 1  # 1.5 / 1.3 = 1.15 > 1.02 still pays
    for _ in range(5):
        ctl.observe_cost(1, 0.0155)  # exponential moving average towards 1.55
    assert 1.45 < ctl.cost(1) < 1.55
    assert ctl.choose() == 0  # below break-even now
    # only pass timings: the plain step is inferred through the default curve
    only = AdaptiveDraftLength()
    only.observe_cost(2, DEFAULT_VERIFY_COST[2] * 0.02)
    assert only.cost(2) == pytest.approx(DEFAULT_VERIFY_COST[2])


def test_adaptive_is_deterministic_and_checks_arguments() -> None:
    seq = [(4, 4), (8, 3), (5, 0), (0, 0), (1, 1), (7, 7)]
    a, b = AdaptiveDraftLength(), AdaptiveDraftLength()
    out_a, out_b = [], []
    for kd, na in seq:
        a.update(kd, na)
        b.update(kd, na)
        out_a.append((a.choose(), a.acceptance))
        out_b.append((b.choose(), b.acceptance))
    assert out_a == out_b
    assert AdaptiveDraftLength(k_init=0, probe_every=2).choose() == 0
    assert AdaptiveDraftLength(k_max=2).choose() == 2  # the default k_init is min(4, k_max)
    # the sampler's own generator can drive verify: the same seed gives the same tokens
    s = Sampler(SamplingParams(temperature=1.0, seed=3), 4)
    rows, fresh = np.full((1, 4), 0.25), np.random.Generator(np.random.PCG64(3))
    assert [verify(rows, [], None, s.rng) for _ in range(20)] == [verify(rows, [], None, fresh) for _ in range(20)]
    with pytest.raises(OptionsError, match=r"k_init: expected an int in \[0, 8\]"):
        AdaptiveDraftLength(k_init=9)
    with pytest.raises(OptionsError, match="k_max"):
        AdaptiveDraftLength(k_max=0)
    with pytest.raises(OptionsError, match="decay"):
        AdaptiveDraftLength(decay=0.0)
    with pytest.raises(OptionsError, match="prior"):
        AdaptiveDraftLength(prior=(1.0, -1.0))
    with pytest.raises(OptionsError, match=r"costs\[0\]"):
        AdaptiveDraftLength(costs={0: 2.0, 1: 1.1})
    with pytest.raises(OptionsError, match=r"costs\[2\]"):
        AdaptiveDraftLength(costs={1: 1.1, 2: math.nan})
    with pytest.raises(OptionsError, match="n_accepted: expected an int in"):
        a.update(2, 3)
    with pytest.raises(OptionsError, match="seconds"):
        a.observe_cost(1, 0.0)
    with pytest.raises(OptionsError, match="seconds"):
        a.observe_step(math.inf)
    with pytest.raises(OptionsError, match=r"k: expected an int in \[1, 8\]"):
        a.observe_cost(9, 0.01)
    with pytest.raises(OptionsError, match="acceptance"):
        expected_tokens(1.5, 2)
    custom = AdaptiveDraftLength(k_max=4, costs={1: 1.5, 4: 3.0})
    assert custom.costs() == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0])


# --- stats -------------------------------------------------------------------------------------------------


def test_speculation_stats() -> None:
    s = SpeculationStats()
    assert s.to_dict() == {"drafted": 0, "accepted": 0, "passes": 0, "acceptance_rate": 0.0, "tokens_per_pass": 0.0}
    s.record(4, 3)
    s.record(4, 0)
    s.record(2, 2)
    d = s.to_dict()
    assert d["drafted"] == 10 and d["accepted"] == 5 and d["passes"] == 3
    assert d["acceptance_rate"] == 0.5 and d["tokens_per_pass"] == pytest.approx(8 / 3)
    with pytest.raises(OptionsError, match="n_accepted"):
        s.record(1, 2)


def test_an_expensive_probe_is_tried_less_often() -> None:
    """A probe that costs four plain steps (a draft model catching its KV up) comes at most once per
    (4 - 1) / 0.03 = 100 plain steps, so failed probes stay within 3 % of the time."""
    cheap = AdaptiveDraftLength(k_max=4, k_init=1)
    dear = AdaptiveDraftLength(k_max=4, k_init=1)
    for a in (cheap, dear):
        a.observe_step(0.010)
        for _ in range(10):
            a.update(1, 0)  # every pass failed: plain decoding pays
    dear.observe_cost(1, 0.040)
    cheap.observe_cost(1, 0.0104)
    assert cheap.probe_interval() == cheap.probe_every == 16
    assert dear.probe_interval() == 100

    def plain_steps_until_probe(a: AdaptiveDraftLength) -> int:
        for n in range(1, 1000):
            if a.choose() > 0:
                return n
            a.update(0, 0)
        return -1

    assert plain_steps_until_probe(cheap) == 17 and plain_steps_until_probe(dear) == 101
