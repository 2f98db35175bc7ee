"""edge_sdk.generation.sampling: each filter on hand-built logits, determinism, the distribution, bad parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_sdk.errors import GenerationError, OptionsError, SamplingError
from edge_sdk.generation.sampling import Sampler, SamplingParams


def logits_for(probs: list[float], vocab: int | None = None) -> np.ndarray:
    """Logits whose softmax is ``probs`` (padded with -inf up to ``vocab``)."""
    x = np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)
    if vocab is not None:
        x = np.concatenate([x, np.full(vocab - len(probs), -np.inf, dtype=np.float32)])
    return x


def support(params: SamplingParams, logits: np.ndarray, draws: int = 400, history: object = ()) -> set[int]:
    s = Sampler(params, logits.shape[0])
    return {s.sample(logits, history) for _ in range(draws)}  # type: ignore[arg-type]


# --- parameters -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": None}, "top_p"),
        ({"min_p": -0.01}, "min_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"seed": False}, "seed"),
    ],
)
def test_bad_parameter_raises_sampling_error_naming_it(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(SamplingError, match=name) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert repr(next(iter(kwargs.values()))) in str(info.value) or type(next(iter(kwargs.values()))).__name__ in str(info.value)
    assert isinstance(info.value, OptionsError)


def test_defaults_are_greedy_and_valid_edges_accepted() -> None:
    assert SamplingParams().greedy
    p = SamplingParams(temperature=2, top_k=0, top_p=1, min_p=0, repetition_penalty=1, seed=0)
    assert not p.greedy
    SamplingParams(top_p=1e-9, min_p=0.999, repetition_penalty=1e-3, seed=2**64)


def test_sampler_checks_its_arguments_and_logits() -> None:
    with pytest.raises(SamplingError, match="vocab_size"):
        Sampler(SamplingParams(), 0)
    s = Sampler(SamplingParams(temperature=1.0, seed=0), 4)
    with pytest.raises(GenerationError, match=r"shape \(4,\)"):
        s.sample(np.zeros(5, np.float32))
    with pytest.raises(GenerationError, match=r"shape"):
        s.sample(np.zeros((1, 4), np.float32))
    with pytest.raises(GenerationError, match="floating"):
        s.sample(np.zeros(4, np.int64))  # type: ignore[arg-type]
    with pytest.raises(GenerationError, match="2 NaN"):
        s.sample(np.array([0.0, np.nan, 1.0, np.nan], np.float32))
    with pytest.raises(GenerationError, match=r"1 \+inf"):
        s.sample(np.array([0.0, np.inf, 1.0, 2.0], np.float32))
    with pytest.raises(GenerationError, match="all 4 are -inf"):
        s.sample(np.full(4, -np.inf, np.float32))
    pen = Sampler(SamplingParams(repetition_penalty=1.3), 4)
    with pytest.raises(GenerationError, match="token id 4"):
        pen.sample(np.zeros(4, np.float32), [1, 4])


# --- greedy and the repetition penalty ----------------------------------------------------------------------------


def test_greedy_is_argmax_lowest_id_on_ties_and_leaves_logits_alone() -> None:
    x = np.array([0.5, 3.0, -1.0, 3.0], np.float32)
    before = x.copy()
    s = Sampler(SamplingParams(), 4)
    assert s.sample(x) == 1
    assert s.last_candidates == 1
    np.testing.assert_array_equal(x, before)


def test_repetition_penalty_both_signs_hf_semantics() -> None:
    # token 0: positive logit 2.0 -> 2.0 / 2 = 1.0 ; token 2: negative -0.4 -> -0.4 * 2 = -0.8
    x = np.array([2.0, 1.5, -0.4, -0.6], np.float32)
    before = x.copy()
    s = Sampler(SamplingParams(repetition_penalty=2.0), 4)
    assert s.sample(x, [0, 0, 0]) == 1  # 1.0 < 1.5: the repeated best token loses
    np.testing.assert_array_equal(x, before)  # the caller's logits are not modified
    # with 0 and 1 both penalised: 1.0 vs 0.75 -> 0 wins again; negative side: -0.4*2 = -0.8 < -0.6
    assert s.sample(x, np.array([1, 0, 1])) == 0
    neg = np.array([-1.0, -0.4, -0.6, -5.0], np.float32)
    assert Sampler(SamplingParams(), 4).sample(neg) == 1
    assert s.sample(neg, [1]) == 2  # -0.4 * 2 = -0.8 < -0.6: multiplied, not divided
    # a penalty < 1 rewards repeats; duplicates in the history count once
    assert Sampler(SamplingParams(repetition_penalty=0.5), 4).sample(np.array([2.0, 1.5, 0, 0], np.float32), [1, 1, 1]) == 1


def test_temperature_to_zero_limit_equals_greedy() -> None:
    rng = np.random.default_rng(3)
    for trial in range(20):
        x = rng.standard_normal(50).astype(np.float32) * 3
        want = int(np.argmax(x))
        for t in (1e-3, 1e-8, 1e-30, 1e-300):
            s = Sampler(SamplingParams(temperature=t, seed=trial), 50)
            assert {s.sample(x) for _ in range(20)} == {want}


# --- top-k, top-p, min-p ------------------------------------------------------------------------------------------


def test_top_k_keeps_exactly_k_with_lowest_ids_on_ties() -> None:
    x = np.array([1.0, 5.0, 3.0, 3.0, 3.0, 4.0, -2.0, 0.0], np.float32)
    assert support(SamplingParams(temperature=50.0, top_k=1, seed=0), x) == {1}
    assert support(SamplingParams(temperature=50.0, top_k=2, seed=0), x) == {1, 5}
    # k=4: 5.0, 4.0 and two of the three 3.0s -- the lowest ids (2, 3), never 4
    assert support(SamplingParams(temperature=50.0, top_k=4, seed=0), x, draws=2000) == {1, 5, 2, 3}
    assert support(SamplingParams(temperature=50.0, top_k=100, seed=0), x, draws=3000) == set(range(8))


def test_top_p_exact_nucleus_boundary() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    x = logits_for(probs)
    hi = dict(temperature=1.0, seed=1)
    # the token that crosses top_p is kept; the next is not
    assert support(SamplingParams(top_p=0.39, **hi), x) == {0}  # type: ignore[arg-type]
    assert support(SamplingParams(top_p=0.41, **hi), x) == {0, 1}  # type: ignore[arg-type]
    assert support(SamplingParams(top_p=0.69, **hi), x) == {0, 1}  # type: ignore[arg-type]
    assert support(SamplingParams(top_p=0.71, **hi), x) == {0, 1, 2}  # type: ignore[arg-type]
    assert support(SamplingParams(top_p=0.91, **hi), x, draws=2000) == {0, 1, 2, 3}  # type: ignore[arg-type]


def test_top_p_keeps_ties_together() -> None:
    # probabilities 0.4, 0.2, 0.2, 0.2 : top_p=0.5 crosses inside the tie group -> all three 0.2s are kept
    x = logits_for([0.2, 0.4, 0.2, 0.2])
    assert support(SamplingParams(temperature=1.0, top_p=0.5, seed=2), x, draws=2000) == {0, 1, 2, 3}
    assert support(SamplingParams(temperature=1.0, top_p=0.39, seed=2), x) == {1}
    # a tie for the top: both kept even for a tiny top_p
    y = np.array([1.0, 2.0, 2.0, 0.0], np.float32)
    assert support(SamplingParams(temperature=1.0, top_p=0.01, seed=2), y) == {1, 2}


def test_top_p_over_a_large_vocabulary_matches_the_full_sort_definition() -> None:
    """The candidate search (64, 256, ... ids) gives exactly the nucleus a full sort gives, for peaked and flat
    distributions, and sorts far fewer ids than the vocabulary when the distribution is peaked."""
    v = 150_000
    rng = np.random.default_rng(7)
    for scale, top_p in ((6.0, 0.9), (3.0, 0.5), (0.5, 0.3)):
        x = (rng.standard_normal(v) * scale).astype(np.float32)
        p = np.exp((x - x.max()).astype(np.float64))
        p /= p.sum()
        order = np.argsort(-x, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
        nucleus = set(order[before < top_p].tolist())
        s = Sampler(SamplingParams(temperature=1.0, top_p=top_p, seed=0), v)
        got = {s.sample(x) for _ in range(300)}
        assert got <= nucleus
        if len(nucleus) <= 3:
            assert got == nucleus
        assert s.last_candidates == len(nucleus)


def test_greedy_and_top_p_do_not_sort_the_vocabulary() -> None:
    """Behavioural check, not timing: on a peaked 150k distribution the top-p draw considers a few dozen ids."""
    v = 150_000
    x = np.random.default_rng(0).standard_normal(v).astype(np.float32)
    x[[10, 20, 30]] = [30.0, 29.5, 29.0]
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=0), v)
    tok = s.sample(x)
    assert tok in (10, 20, 30)
    assert s.last_candidates == 3 and 0 < s.last_sorted <= 64
    g = Sampler(SamplingParams(), v)
    assert g.sample(x) == 10 and g.last_candidates == 1 and g.last_sorted == 0
    # min-p alone is a threshold, no sort either: only the three high logits pass 0.1 * max
    m = Sampler(SamplingParams(temperature=1.0, min_p=0.1, seed=0), v)
    assert m.sample(x) in (10, 20, 30) and m.last_candidates == 3 and m.last_sorted == 0
    # a flat distribution does need many candidates: the search grows until the nucleus is proven complete
    flat = Sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=0), v)
    flat.sample((np.random.default_rng(1).standard_normal(v) * 0.01).astype(np.float32))
    assert flat.last_sorted >= flat.last_candidates > v // 3


def test_min_p_threshold() -> None:
    probs = [0.5, 0.25, 0.15, 0.1]  # relative to the max: 1, 0.5, 0.3, 0.2
    x = logits_for(probs)
    assert support(SamplingParams(temperature=1.0, min_p=0.51, seed=4), x) == {0}
    assert support(SamplingParams(temperature=1.0, min_p=0.49, seed=4), x) == {0, 1}
    assert support(SamplingParams(temperature=1.0, min_p=0.29, seed=4), x, draws=1000) == {0, 1, 2}
    assert support(SamplingParams(temperature=1.0, min_p=0.19, seed=4), x, draws=2000) == {0, 1, 2, 3}
    # after top-k, and after temperature (T=0.5 squares the ratios: 0.25, 0.09, 0.04)
    assert support(SamplingParams(temperature=0.5, min_p=0.2, seed=4), x) == {0, 1}
    assert support(SamplingParams(temperature=1.0, top_k=3, min_p=0.29, seed=4), x, draws=1000) == {0, 1, 2}


def test_order_is_temperature_then_top_p_then_min_p() -> None:
    x = logits_for([0.4, 0.3, 0.2, 0.1])
    # T=0.25 sharpens to ~[0.68, 0.22, 0.04, 0.003]: top_p=0.8 now keeps only two (at T=1 it keeps three)
    assert support(SamplingParams(temperature=0.25, top_p=0.8, seed=5), x, draws=1000) == {0, 1}
    assert support(SamplingParams(temperature=1.0, top_p=0.8, seed=5), x, draws=1000) == {0, 1, 2}


# --- randomness -------------------------------------------------------------------------------------------------


def test_same_seed_same_draws_fork_and_reset() -> None:
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal(1000).astype(np.float32) for _ in range(50)]
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, min_p=0.01, repetition_penalty=1.1, seed=1234)
    a, b = Sampler(params, 1000), Sampler(params, 1000)
    seq_a = [a.sample(x, [1, 2, 3]) for x in xs]
    assert seq_a == [b.sample(x, [1, 2, 3]) for x in xs]
    assert len(set(seq_a)) > 5  # it does sample
    a.reset()
    assert [a.sample(x, [1, 2, 3]) for x in xs] == seq_a
    a.reset()
    for x in xs[:20]:
        a.sample(x)
    twin = a.fork()
    assert [twin.sample(x) for x in xs[20:]] == [a.sample(x) for x in xs[20:]]
    c = Sampler(params, 1000)
    c.reset(99)
    assert c.seed == 99 and [c.sample(x, [1, 2, 3]) for x in xs] != seq_a


def test_unseeded_sampler_reports_a_seed_that_replays_it() -> None:
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal(300).astype(np.float32) for _ in range(40)]
    s = Sampler(SamplingParams(temperature=1.0), 300)
    first = [s.sample(x) for x in xs]
    replay = Sampler(SamplingParams(temperature=1.0, seed=s.seed), 300)
    assert [replay.sample(x) for x in xs] == first
    assert Sampler(SamplingParams(temperature=1.0), 300).seed != s.seed


def test_frequencies_follow_softmax() -> None:
    """Chi-square goodness of fit on a 4-token distribution, fixed seed, 20k draws (df=3; 16.27 is p=0.001)."""
    x = np.array([1.0, 0.0, -0.5, 0.7], np.float32)
    for t in (1.0, 0.7):
        p = np.exp(x.astype(np.float64) / t)
        p /= p.sum()
        s = Sampler(SamplingParams(temperature=t, seed=2024), 4)
        n = 20_000
        counts = np.bincount([s.sample(x) for _ in range(n)], minlength=4)
        chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
        assert chi2 < 16.27, (t, counts, n * p)
    # and a clearly wrong distribution is rejected by the same statistic (the test can fail)
    wrong = np.array([0.25, 0.25, 0.25, 0.25])
    chi2_wrong = float((((counts - n * wrong) ** 2) / (n * wrong)).sum())
    assert chi2_wrong > 100


def test_float16_and_float64_logits_accepted_unchanged() -> None:
    for dt in (np.float16, np.float64):
        x = np.array([0.0, 2.0, 1.0], dt)
        before = x.copy()
        assert Sampler(SamplingParams(repetition_penalty=1.5), 3).sample(x, [1]) == 1
        np.testing.assert_array_equal(x, before)
