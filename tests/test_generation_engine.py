"""The generation engine on the tiny Llama (tools/fixtures/tiny_llm, converted in the test run):
continuous batching with per-stream KV slots, isolation under adversarial interleavings (the fp32
variant is batch-invariant, so every stream's output must equal the stream run alone), the bounded
queue, the KV budget, cancellation that frees the slot, the prefix cache, the governor, and the
deterministic single-stream mode of a variant that is not batch-invariant."""

from __future__ import annotations

import mmap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_sdk
from edge_sdk.backends.ort_decoder import DecoderShape, KVSlots
from edge_sdk.errors import GenerationBusyError, GenerationError, OptionsError, PromptError, SessionClosedError
from edge_sdk.generation import EngineOptions, GenerationEngine
from edge_sdk.generation.prefix_cache import PrefixCache, _block_keys

PROMPTS = [
    "The quick brown fox",
    "def foo(x):\n    return",
    "Hello",
    "import os\nimport sys\n\n",
    "class A:\n    def",
    "x = [1, 2,",
    "The with statement",
    "for i in range(",
]
SYSTEM = "You are a careful assistant. Answer in one short sentence, in plain words, and do not repeat the question. " * 2


@pytest.fixture(scope="module")
def model(tiny_llm_package: Path) -> Any:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", threads=1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def alone(model: Any) -> dict[tuple[str, int], tuple[int, ...]]:
    """Each prompt's greedy tokens run alone through the model's own single-sequence loop."""
    return {(p, n): model.generate(p, max_new_tokens=n, ignore_eos=True).token_ids for p in PROMPTS for n in (5, 17, 30)}


def _wait(pred: Any, timeout: float = 30.0) -> None:
    t = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < t, "condition not reached in time"
        time.sleep(0.005)


def test_batched_streams_equal_each_stream_alone_under_interleavings(model: Any, alone: Any) -> None:
    lengths = [5, 30, 17, 30, 5, 17, 30, 5]
    with GenerationEngine(model, EngineOptions(max_streams=4, queue_size=16, prefix_cache=False)) as eng:
        # all at once: 8 requests for 4 slots (the rest queue; streams end at different steps, slots are reused and compacted)
        streams = [eng.stream(p, max_new_tokens=n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)]
        got = [s.until_done().token_ids for s in streams]
        assert got == [alone[(p, n)] for p, n in zip(PROMPTS, lengths)]
        st = eng.stats()
        assert st["finished"] == 8 and st["running"] == 0 and st["kv_reserved_tokens"] == 0
        assert sum(st["batch_histogram"][2:]) > 0 and st["batch_histogram"][4] > 0  # they really ran together
        # staggered arrivals from several threads, one of them cancelled half way
        out: dict[int, Any] = {}

        def client(i: int) -> None:
            time.sleep(0.002 * i)
            out[i] = eng.generate(PROMPTS[i], max_new_tokens=lengths[i], ignore_eos=True)

        victim = eng.stream(PROMPTS[7], max_new_tokens=200, ignore_eos=True)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for _ in range(3):
            next(victim)
        victim.cancel()
        rest = victim.until_done()
        for t in threads:
            t.join(60)
        assert rest.finish_reason == "cancelled" and 3 <= len(rest.token_ids) < 200
        assert [out[i].token_ids for i in range(6)] == [alone[(PROMPTS[i], lengths[i])] for i in range(6)]
        assert all(out[i].details["engine"]["max_batch"] >= 1 for i in range(6))


def test_seeded_sampling_in_a_batch_equals_alone(model: Any) -> None:
    kw = {"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.9, "seed": 7, "ignore_eos": True}
    want = [model.generate(p, **kw).token_ids for p in PROMPTS[:4]]
    with GenerationEngine(model, EngineOptions(max_streams=4, prefix_cache=False)) as eng:
        assert [s.until_done().token_ids for s in [eng.stream(p, **kw) for p in PROMPTS[:4]]] == want


def test_stop_rules_and_text_hold_in_the_engine(model: Any) -> None:
    ref = model.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True)
    stop = ref.text[5:8]
    want = model.generate(PROMPTS[1], max_new_tokens=30, ignore_eos=True, stop=[stop])
    with GenerationEngine(model, EngineOptions(max_streams=2)) as eng:
        s = eng.stream(PROMPTS[1], max_new_tokens=30, ignore_eos=True, stop=[stop])
        other = eng.stream(PROMPTS[0], max_new_tokens=30, ignore_eos=True)
        text = "".join(s)
        r = s.result
        assert r is not None and r.finish_reason == "stop" and r.stop == stop and text == r.text == want.text
        assert other.until_done().text == model.generate(PROMPTS[0], max_new_tokens=30, ignore_eos=True).text


def test_full_queue_refuses_with_a_retry_estimate(model: Any) -> None:
    with GenerationEngine(model, EngineOptions(max_streams=1, queue_size=2, prefix_cache=False)) as eng:
        running = [eng.stream(PROMPTS[0], max_new_tokens=400, ignore_eos=True)]
        next(running[0])
        running += [eng.stream(PROMPTS[i], max_new_tokens=4) for i in (1, 2)]  # the queue's two places
        with pytest.raises(GenerationBusyError) as ei:
            eng.stream(PROMPTS[3], max_new_tokens=4)
        assert ei.value.retry_after_s >= 1 and "queue_size 2" in str(ei.value)
        assert eng.stats()["refused"] == 1
        running[0].cancel()
        assert [r.until_done().finish_reason for r in running] == ["cancelled", "length", "length"]
        assert eng.generate(PROMPTS[3], max_new_tokens=3).usage.completion_tokens == 3  # room again


def test_kv_budget_admits_only_what_fits_and_cancel_frees_it_at_once(model: Any) -> None:
    # a 450-token budget holds one request of prompt + 400 tokens, not two
    with GenerationEngine(model, EngineOptions(max_streams=4, kv_budget_tokens=450, prefix_cache=False)) as eng:
        a = eng.stream(PROMPTS[0], max_new_tokens=400, ignore_eos=True)
        next(a)
        b = eng.stream(PROMPTS[1], max_new_tokens=400, ignore_eos=True)
        st = eng.stats()
        assert st["running"] == 1 and st["waiting"] == 1 and st["kv_reserved_tokens"] <= 450
        a.cancel()
        first = next(b)  # b is admitted once a's KV is freed
        assert first and a.until_done().finish_reason == "cancelled"
        assert b.until_done().finish_reason == "length"
    with pytest.raises(OptionsError, match="kv_budget_tokens"):
        EngineOptions(kv_budget_tokens=0)


def test_consumer_that_stops_reading_cancels_its_stream(model: Any) -> None:
    with GenerationEngine(model, EngineOptions(max_streams=2)) as eng:
        s = eng.stream(PROMPTS[0], max_new_tokens=500, ignore_eos=True)
        next(s)
        s.close()
        _wait(lambda: eng.stats()["running"] == 0)
        assert eng.stats()["kv_reserved_tokens"] == 0


def test_kv_slot_release_gives_the_pages_back() -> None:
    kv = KVSlots(DecoderShape(2, 2, 8, 10), slots=3, max_len=64)
    for a in kv.arrays:
        a[:] = 1.0
    kv.release(1)
    assert kv.slot_bytes % mmap.PAGESIZE == 0
    for a in kv.arrays:
        assert not a[1].any() and a[0].all() and a[2].all()  # released pages read as zeros; the neighbours keep theirs
    kv.move(2, 1, 10)
    assert all(a[1, :, :10].all() and not a[1, :, 10:].any() for a in kv.arrays)
    kv.close()


def test_prefix_cache_serves_a_shared_system_prompt_and_never_a_foreign_one(model: Any) -> None:
    q1 = SYSTEM + "What is a list?"
    q2 = SYSTEM + "What is a dict?"
    other = SYSTEM.replace("careful", "curious") + "What is a list?"  # differs in the first block
    want = {p: model.generate(p, max_new_tokens=10, ignore_eos=True).token_ids for p in (q1, q2, other)}
    e1, e2 = model.encode(q1), model.encode(q2)
    common = next(i for i, (a, b) in enumerate(zip(e1, e2)) if a != b)  # the system prompt and a little more
    with GenerationEngine(model, EngineOptions(max_streams=2, prefix_block=16)) as eng:
        r1 = eng.generate(q1, max_new_tokens=10, ignore_eos=True)
        r2 = eng.generate(q2, max_new_tokens=10, ignore_eos=True)
        r3 = eng.generate(other, max_new_tokens=10, ignore_eos=True)
        assert r1.details["engine"]["prefix_cached_tokens"] == 0
        hit = r2.details["engine"]["prefix_cached_tokens"]
        assert common >= 64 and hit == common // 16 * 16  # the shared prefix's whole blocks
        assert r3.details["engine"]["prefix_cached_tokens"] == 0
        assert (r1.token_ids, r2.token_ids, r3.token_ids) == (want[q1], want[q2], want[other])
        st = eng.stats()["prefix_cache"]
        assert st["hits"] == 1 and st["entries"] >= 2 and st["tokens"] <= eng.kv_budget_tokens


def test_prefix_cache_checks_tokens_and_evicts_least_recently_used() -> None:
    c = PrefixCache(block=4, capacity_tokens=12)
    kv = np.zeros((2, 1, 8, 2), np.float32)
    a = np.arange(8)
    c.insert(a, kv)
    assert c.lookup(np.r_[a, 99])[1] == 8 and c.lookup(np.r_[a[:4], 50, 51, 52, 53, 54])[1] == 4
    assert c.lookup(a)[1] == 4  # the last token always runs
    assert c.lookup(np.r_[7, a])[0] is None
    b = np.arange(100, 108)
    c.insert(b, kv)  # 16 > 12 tokens: the least recently used (a) goes
    assert c.lookup(np.r_[a, 1])[0] is None and c.lookup(np.r_[b, 1])[1] == 8 and c.tokens == 8
    # a hash collision cannot hand out another prefix: a forged index entry is checked token by token
    forged = np.r_[np.arange(200, 204), 5]
    c._index[_block_keys(forged, 4, 4)[0]] = [next(iter(c._entries))]
    assert c.lookup(forged)[0] is None
    with pytest.raises(OptionsError):
        c.insert(np.arange(5), kv)


def test_new_request_is_prefilled_between_the_running_streams_steps(model: Any) -> None:
    with GenerationEngine(model, EngineOptions(max_streams=4, prefill_chunk=8, prefix_cache=False)) as eng:
        runners = [eng.stream(p, max_new_tokens=300, ignore_eos=True) for p in PROMPTS[:3]]
        for r in runners:
            next(r)
        late = eng.stream(SYSTEM + PROMPTS[3], max_new_tokens=3)
        late_r = late.until_done()  # it finishes while the three long streams still run
        assert all(r.result is None for r in runners)
        assert late_r.usage.completion_tokens == 3 and late_r.details["engine"]["max_batch"] >= 2
        assert eng.stats()["prefill_passes"] >= 3 + len(model.encode(SYSTEM)) // 8
        for r in runners:
            r.cancel()
            assert r.until_done().finish_reason == "cancelled"


def test_governor_critical_holds_every_stream(model: Any) -> None:
    from test_generation import _governor  # the same fake-sensor governor as the single-stream tests

    gov, Snap = _governor()
    detach = model.attach_governor(gov, poll_s=0.01)
    try:
        with GenerationEngine(model, EngineOptions(max_streams=2)) as eng:
            assert gov.step(Snap(0.0, 90.0)).value == "critical"
            ss = [eng.stream(p, max_new_tokens=4, ignore_eos=True) for p in PROMPTS[:2]]
            time.sleep(0.2)
            assert eng.stats()["steps"] == 0 and eng.stats()["prefill_passes"] == 0
            gov.step(Snap(1.0, 50.0))
            gov.step(Snap(2.0, 50.0))
            rs = [s.until_done() for s in ss]
            for r in rs:
                assert [e.kind for e in r.events][:2] == ["pause", "resume"] and r.timings.paused_ms >= 150
                assert len(r.token_ids) == 4
    finally:
        detach()


def test_deterministic_int4_runs_one_stream_with_one_token_prefill(tiny_llm_package: Path) -> None:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", threads=1, deterministic=True)
    try:
        want = [m.generate(p, max_new_tokens=8, ignore_eos=True).token_ids for p in PROMPTS[:3]]
        with GenerationEngine(m, EngineOptions(max_streams=4, speculative="prompt-lookup")) as eng:
            assert eng.options.max_streams == 1 and eng.options.speculative is None
            got = [s.until_done().token_ids for s in [eng.stream(p, max_new_tokens=8, ignore_eos=True) for p in PROMPTS[:3]]]
            assert got == want
            assert len(eng.stats()["batch_histogram"]) == 2  # batches of 0 or 1
            assert eng.stats()["prefill_passes"] == sum(len(m.encode(p)) for p in PROMPTS[:3])
    finally:
        m.close()


def test_engine_bad_input_and_close(model: Any) -> None:
    eng = GenerationEngine(model, EngineOptions(max_streams=2))
    with pytest.raises(PromptError):
        eng.stream(b"bytes")
    with pytest.raises(OptionsError, match="max_new_tokens"):
        eng.stream("x", max_new_tokens=0)
    with pytest.raises(OptionsError, match="speculative"):
        EngineOptions(speculative="guess")
    with pytest.raises(OptionsError, match="max_streams"):
        EngineOptions(max_streams=0)
    s = eng.stream(PROMPTS[0], max_new_tokens=400, ignore_eos=True)
    next(s)
    eng.close()
    with pytest.raises(SessionClosedError):
        s.until_done()
    with pytest.raises(SessionClosedError):
        eng.stream("x")
    eng.close()  # idempotent


def test_greedy_speculation_equals_plain_greedy_and_drafts_pay_on_repeated_text(model: Any) -> None:
    text = "for i in range(10):\n    print(i)\n" * 6  # input-grounded: the continuation repeats the prompt
    prompts = [text, PROMPTS[0], PROMPTS[1]]
    want = [model.generate(p, max_new_tokens=40, ignore_eos=True).token_ids for p in prompts]
    with GenerationEngine(model, EngineOptions(max_streams=2, speculative="prompt-lookup", prefix_cache=False)) as eng:
        got = [eng.generate(prompts[0], max_new_tokens=40, ignore_eos=True)]
        steps = eng.stats()["steps"]  # model passes after the prefill: fewer than the 39 plain decoding needs
        got += [eng.generate(p, max_new_tokens=40, ignore_eos=True) for p in prompts[1:]]
        assert [r.token_ids for r in got] == want
        spec = got[0].details["speculation"]
        assert (
            spec["mode"] == "prompt-lookup" and spec["accepted"] > 0 and steps <= 40 - spec["accepted"]
        )  # each accepted draft token saves a pass
        # two streams at once are batched, not speculated
        both = [eng.stream(p, max_new_tokens=20, ignore_eos=True) for p in prompts[1:]]
        rs = [b.until_done() for b in both]
        assert [r.token_ids for r in rs] == [w[:20] for w in want[1:]]


def test_seeded_sampled_speculation_repeats_plain_seeded_sampling(model: Any) -> None:
    """Prompt-lookup drafts are point masses: each position's token is drawn as plain decoding draws
    it and the draft is accepted while it matches (Leviathan et al.'s rule for a deterministic draft)."""
    text = "for i in range(10):\n    print(i)\n" * 6
    kw = {"max_new_tokens": 24, "temperature": 0.4, "top_p": 0.95, "ignore_eos": True}
    plain = [model.generate(text, seed=s, **kw).token_ids for s in range(6)]
    with GenerationEngine(model, EngineOptions(max_streams=1, speculative="prompt-lookup", prefix_cache=False)) as eng:
        spec = [eng.generate(text, seed=s, **kw) for s in range(6)]
    # one draw per token, in order, with the stream's own sampler: the same tokens as plain seeded sampling
    assert [r.token_ids for r in spec] == plain
    assert sum(r.details["speculation"]["accepted"] for r in spec if "speculation" in r.details) > 0


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Self-speculation: the tiny model's own first 2 of 4 layers with its head (edge-convert llm --draft-layers 2)."""
    from converters.cli import main as convert_main

    out = tmp_path_factory.mktemp("draft") / "pkg"
    tiny = Path(__file__).resolve().parents[1] / "tools" / "fixtures" / "tiny_llm"
    rc = convert_main(
        [
            "llm",
            str(tiny),
            "--to",
            "fp32",
            "--draft-layers",
            "2",
            "--out",
            str(out),
            "--eval-text",
            str(tiny / "heldout.txt"),
            "--no-timing",
        ]
    )
    assert rc == 0
    m = edge_sdk.load(out, "generic-x86_64", threads=1)
    yield m
    m.close()


def test_draft_model_speculation_is_exact_in_greedy_and_needs_the_same_tokenizer(model: Any, draft: Any, tiny_llm_package: Path) -> None:
    assert draft.spec.n_layers == 2 and draft.package.manifest.name.endswith("-draft2") and "draft" in draft.spec.source
    want = [model.generate(p, max_new_tokens=30, ignore_eos=True).token_ids for p in PROMPTS[:3]]
    with GenerationEngine(model, EngineOptions(max_streams=1, speculative="draft", prefix_cache=False), draft=draft) as eng:
        got = [eng.generate(p, max_new_tokens=30, ignore_eos=True) for p in PROMPTS[:3]]
        assert [r.token_ids for r in got] == want  # fp32 is batch-invariant: verification changes nothing
        spec = [r.details.get("speculation") for r in got]
        assert any(x is not None and x["accepted"] > 0 for x in spec)
    with GenerationEngine(model, EngineOptions(max_streams=1, speculative="draft", prefix_cache=False), draft=draft) as eng:
        # sampled: Leviathan's rule with the draft's q rows (that the output keeps the target's distribution
        # is tested in test_generation_speculative); a fresh engine drafts on its first step
        r = eng.generate(PROMPTS[0], max_new_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
        assert len(r.token_ids) == 12 and r.details["speculation"]["drafted"] > 0
    with pytest.raises(OptionsError, match="draft"):
        GenerationEngine(model, EngineOptions(speculative="prompt-lookup"), draft=draft)


def test_a_draft_with_another_tokenizer_is_refused(model: Any, tmp_path: Path) -> None:
    import json
    import shutil

    from converters.cli import main as convert_main

    tiny = Path(__file__).resolve().parents[1] / "tools" / "fixtures" / "tiny_llm"
    src = tmp_path / "src"
    shutil.copytree(tiny, src)
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped: another tokenizer
    (src / "tokenizer.json").write_text(json.dumps(tok))
    out = tmp_path / "pkg"
    assert (
        convert_main(
            [
                "llm",
                str(src),
                "--to",
                "fp32",
                "--draft-layers",
                "1",
                "--out",
                str(out),
                "--eval-text",
                str(tiny / "heldout.txt"),
                "--no-timing",
                "--force",
            ]
        )
        == 0
    )
    foreign = edge_sdk.load(out, "generic-x86_64", threads=1)
    try:
        with pytest.raises(GenerationError, match="must share the tokenizer"):
            GenerationEngine(model, EngineOptions(speculative="draft"), draft=foreign)
    finally:
        foreign.close()
