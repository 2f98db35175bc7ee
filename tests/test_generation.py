"""Text generation end to end on the tiny Llama shipped in tools/fixtures/tiny_llm (trained by
tools/train_tiny_llm.py), converted by ``edge-convert llm`` in the test run: KV sizing, greedy
against an independent numpy reference and the torch model that trained it, seeded
repeatability, stop rules, UTF-8-safe streaming, cancellation, deadlines, budget refusal, the
governor between tokens, telemetry, determinism, and bad input."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import (
    ContextBudgetError,
    OptionsError,
    PromptError,
    SamplingError,
    SelectionError,
    TemplateError,
    TokenizerError,
)
from edge_sdk.package import ModelPackage

TINY = Path(__file__).resolve().parents[1] / "tools" / "fixtures" / "tiny_llm"


@pytest.fixture(scope="module")
def model(tiny_llm_package: Path) -> Any:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", threads=1)
    yield m
    m.close()


@pytest.fixture(scope="module")
def int4(tiny_llm_package: Path) -> Any:
    m = edge_sdk.load(tiny_llm_package, "generic-x86_64", threads=1)
    yield m
    m.close()


def _profile(tmp_path: Path, budget_mb: int) -> Path:
    src = (Path(edge_sdk.__file__).parent.parent / "device_profiles" / "generic-x86_64.toml").read_text()
    p = tmp_path / "small-box.toml"
    p.write_text(src.replace('name = "generic-x86_64"', 'name = "small-box"').replace("memory_budget_mb = 8192", f"memory_budget_mb = {budget_mb}").replace("generic = true", "generic = false").replace("device_tree_model = []", 'device_tree_model = ["Small Box"]'))
    return p


# --- package and KV -------------------------------------------------------------------------


def test_package_records_kv_formula_quality_and_timings(tiny_llm_package: Path) -> None:
    pkg = ModelPackage.open(tiny_llm_package)
    m = pkg.manifest
    cfg = json.loads((TINY / "config.json").read_text())
    g = m.generation
    assert m.task == "text-generation" and g is not None
    assert (g.n_layers, g.n_kv_heads, g.head_dim, g.vocab_size) == (4, 2, 32, 1024)
    want = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    ids = [v.id for v in m.variants]
    assert ids == ["int4", "int8", "fp32"]
    for v in m.variants:
        assert v.generation is not None and v.generation.kv_bytes_per_token == want == 2048
        assert v.quality is not None and v.quality.perplexity is not None and v.quality.perplexity > 1
        assert v.gate is not None and v.gate.passed
        assert v.generation.tpot_ms is not None and v.generation.tpot_ms > 0
    fp32, int8, int4 = m.variant("fp32"), m.variant("int8"), m.variant("int4")
    assert fp32.quality.perplexity_gap == 0 and fp32.reference
    assert int8.generation.weight_bytes_per_token < fp32.generation.weight_bytes_per_token
    assert int4.generation.weight_bytes_per_token < int8.generation.weight_bytes_per_token
    # int8 can land on either side of fp32 (a Zen 3 without VNNI measured -0.03 %): measured, small, not zero
    assert int8.quality.perplexity_gap != 0 and abs(int8.quality.perplexity_gap) <= 0.02 and -0.02 <= int4.quality.perplexity_gap <= 0.10
    report = json.loads((tiny_llm_package / "conversion-report.json").read_text())
    assert {c["method"] for c in report["candidates"] if c["precision"] == "int4"} >= {"rtn", "hqq", "gptq"}
    best = min((c for c in report["candidates"] if c["precision"] == "int4" and not c["mixed_int8_tensors"]), key=lambda c: c["perplexity"])
    assert int4.generation.method == best["method"]  # picked by measured perplexity


def test_kv_buffer_is_sized_from_the_memory_budget(tiny_llm_package: Path, tmp_path: Path) -> None:
    pkg = ModelPackage.open(tiny_llm_package)
    v = pkg.manifest.variant("fp32")
    per = v.generation.kv_bytes_per_token
    # 68 MiB budget: 68 - 1.1 x weights - 64 MiB runtime, at 2 KiB per token
    budget = 68
    want = int((budget * 2**20 - v.total_size * 1.1 - 64 * 2**20) // per)
    assert 16 < want < 512
    with edge_sdk.load(tiny_llm_package, str(_profile(tmp_path, budget)), variant="fp32") as m:
        assert m.max_context == want
        assert m.context.kv_bytes == want * per
        assert "memory budget 68 MiB" in m.context.reason
    with edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32") as m:
        assert m.max_context == 512  # the model's context, under the default cap
    with pytest.raises(ContextBudgetError, match=r"300 tokens asked for, the KV budget holds \d+"):
        edge_sdk.load(tiny_llm_package, str(_profile(tmp_path, budget)), variant="fp32", context=300)
    (tmp_path / "b").mkdir()
    with pytest.raises(ContextBudgetError, match="at least 16"):
        edge_sdk.load(tiny_llm_package, str(_profile(tmp_path / "b", 67)), variant="fp32")


def test_prompt_that_does_not_fit_is_refused_unless_truncation_is_asked(tiny_llm_package: Path) -> None:
    with edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", context=64) as m:
        long = "the for statement " * 40
        n = len(m.encode(long))
        assert n > 64
        with pytest.raises(ContextBudgetError, match=rf"prompt of {n} tokens \+ max_new_tokens 8 = {n + 8} tokens > the KV budget of 64"):
            m.generate(long, max_new_tokens=8)
        r = m.generate(long, max_new_tokens=8, truncate=True, ignore_eos=True)
        assert r.usage.truncated_tokens == n + 8 - 64 and r.usage.prompt_tokens == 56
        assert r.usage.completion_tokens == 8


# --- correctness --------------------------------------------------------------------------


def test_greedy_equals_the_numpy_reference_and_the_torch_model(model: Any) -> None:
    from converters.llm.reference import ReferenceDecoder
    from converters.llm.sources import read_source

    ref = ReferenceDecoder(read_source(TINY))
    torch_ref = json.loads((TINY / "torch_reference.json").read_text())
    for case in torch_ref["prompts"]:
        ids = model.encode(case["prompt"])
        assert ids == case["prompt_ids"]
        r = model.generate(case["prompt"], max_new_tokens=20, ignore_eos=True)
        assert list(r.token_ids) == ref.greedy(ids, 20)
        assert list(r.token_ids) == case["greedy_20_ids"]


def test_int4_greedy_tracks_the_reference_on_its_own_weights(int4: Any) -> None:
    assert int4.variant.id == "int4"
    r1 = int4.generate("The with statement", max_new_tokens=24, ignore_eos=True)
    r2 = int4.generate("The with statement", max_new_tokens=24, ignore_eos=True)
    assert r1.token_ids == r2.token_ids and len(r1.token_ids) == 24


def test_seeded_sampling_repeats_and_seeds_differ(model: Any) -> None:
    kw = dict(max_new_tokens=30, temperature=1.0, top_p=0.95, top_k=50, ignore_eos=True)
    a = model.generate("A class is", seed=7, **kw)
    b = model.generate("A class is", seed=7, **kw)
    c = model.generate("A class is", seed=8, **kw)
    assert a.token_ids == b.token_ids and a.text == b.text and a.seed == 7
    assert a.token_ids != c.token_ids
    d = model.generate("A class is", **kw)  # no seed: one is drawn and reported, and it replays
    assert d.seed is not None
    assert model.generate("A class is", seed=d.seed, **kw).token_ids == d.token_ids


def test_deterministic_mode_prefills_one_token_per_run_for_int4(tiny_llm_package: Path) -> None:
    with edge_sdk.load(tiny_llm_package, "generic-x86_64", deterministic=True) as m:
        assert m.variant.id == "int4" and not m.variant.generation.batch_invariant
        assert "one token per run" in m.describe()["prefill"]
        runs0 = m._sess.runs
        r = m.generate("The with statement", max_new_tokens=5, ignore_eos=True)
        assert m._sess.runs - runs0 == r.usage.prompt_tokens + 4  # prompt one by one, then 4 steps
        assert m.generate("The with statement", max_new_tokens=5, ignore_eos=True).token_ids == r.token_ids
    with edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="fp32", deterministic=True) as m:
        assert "whole prompt" in m.describe()["prefill"]


# --- stop rules -----------------------------------------------------------------------------


def test_stop_rules(model: Any) -> None:
    base = model.generate("The with statement", max_new_tokens=20, ignore_eos=True)
    assert base.finish_reason == "length" and len(base.token_ids) == 20
    # a stop string taken from the greedy text: cut before it, not emitted
    word = base.text.strip().split()[2]
    r = model.generate("The with statement", max_new_tokens=20, stop=[word])
    assert r.finish_reason == "stop" and r.stop == word
    assert word not in r.text and base.text.startswith(r.text)
    # an EOS id: the first generated token made an end-of-sequence token ends it at once
    first = base.token_ids[0]
    r = model.generate("The with statement", max_new_tokens=20, stop_token_ids=[first])
    assert r.finish_reason == "stop" and r.stop == first and r.token_ids == ()
    # a chat answer ends on the model's <|im_end|> (eos id 2) long before 200 tokens
    r = model.chat([{"role": "user", "content": "What does the with statement do?"}], max_new_tokens=200)
    assert r.finish_reason in ("stop", "length")
    if r.finish_reason == "stop":
        assert r.stop == 2


def test_deadline_and_cancellation(model: Any) -> None:
    r = model.generate("The with statement", max_new_tokens=400, deadline_s=1e-4, ignore_eos=True)
    assert r.finish_reason == "deadline" and 1 <= len(r.token_ids) < 400
    ev = threading.Event()
    s = model.stream("The with statement", max_new_tokens=400, ignore_eos=True, cancel=ev)
    got = []
    for i, d in enumerate(s):
        got.append(d)
        if i == 3:
            threading.Thread(target=ev.set).start()  # from another thread
            time.sleep(0.05)
    assert s.result is not None and s.result.finish_reason == "cancelled"
    assert 4 <= len(s.result.token_ids) < 400
    s2 = model.stream("The with statement", max_new_tokens=400, ignore_eos=True)
    next(s2)
    s2.cancel()
    assert s2.until_done().finish_reason == "cancelled"


def test_stream_is_utf8_safe_and_adds_up_to_the_text(model: Any) -> None:
    tok = model.tokenizer
    # byte-level tokens that are not valid UTF-8 on their own exist in this vocabulary
    partial = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i])]
    assert partial, "the tiny vocabulary should split some characters"
    for seed in range(6):
        s = model.stream("Unicode: é € ü — ", max_new_tokens=40, temperature=1.3, seed=seed, ignore_eos=True)
        deltas = list(s)
        r = s.result
        assert "".join(deltas) == r.text
        assert r.text == tok.decode(list(r.token_ids), skip_special_tokens=True)
        for d in deltas[:-1]:
            assert not d.endswith("\ufffd")


# --- governor, telemetry ----------------------------------------------------------------------


def _governor() -> Any:
    from edge_sdk.budget import Budget, Governor
    from edge_sdk.budget.types import SensorSnapshot

    gov = Governor(lambda: SensorSnapshot(0.0, 40.0), Budget(soft_c=70.0, hard_c=85.0, hysteresis_c=1.0, min_dwell_s=0.0), actions=[])
    return gov, SensorSnapshot


def test_governor_critical_pauses_and_constrained_paces(model: Any, tmp_path: Path) -> None:
    gov, Snap = _governor()
    from edge_sdk.telemetry import EventLog

    detach = model.attach_governor(gov, constrained_tokens_per_s=40.0, poll_s=0.01)
    seen = []
    unsub = model.subscribe(seen.append)
    log_path = tmp_path / "events.jsonl"
    log = EventLog(log_path)
    log.watch(model)
    try:
        assert gov.step(Snap(0.0, 90.0)).value == "critical"

        def cool() -> None:
            time.sleep(0.3)
            gov.step(Snap(1.0, 50.0))
            gov.step(Snap(2.0, 50.0))

        t = threading.Thread(target=cool)
        t.start()
        r = model.generate("The with statement", max_new_tokens=6, ignore_eos=True)
        t.join()
        kinds = [e.kind for e in r.events]
        assert kinds[:2] == ["pause", "resume"] and r.finish_reason == "length" and len(r.token_ids) == 6
        assert r.timings.paused_ms >= 250
        assert [e.kind for e in seen] == kinds
        logged = [json.loads(ln) for ln in log_path.read_text().splitlines()]
        assert [(r["source"], r["kind"]) for r in logged] == [("generation", k) for k in kinds]
        assert logged[0]["provenance"]["variant"] == "fp32" and logged[0]["state"] == "critical"
        # CONSTRAINED: 10 tokens at 40/s take at least 9/40 s
        assert gov.step(Snap(3.0, 75.0)).value == "constrained"
        r = model.generate("The with statement", max_new_tokens=10, ignore_eos=True)
        assert [e.kind for e in r.events] == ["pace"]
        assert r.timings.total_ms >= 9 / 40 * 1000 * 0.95
        assert r.timings.tokens_per_s is not None and r.timings.tokens_per_s <= 40 * 1.05
    finally:
        detach()
        unsub()
        log.close()
    r = model.generate("The with statement", max_new_tokens=10, ignore_eos=True)
    assert r.events == () and r.timings.paused_ms == 0


def test_telemetry_counts_tokens_and_exports_histograms(tiny_llm_package: Path) -> None:
    from edge_sdk.telemetry import Registry

    with edge_sdk.load(tiny_llm_package, "generic-x86_64", variant="int8") as m:
        a = m.generate("The with statement", max_new_tokens=7, ignore_eos=True)
        b = m.generate("A class is", max_new_tokens=5, ignore_eos=True)
        t = m.telemetry()
        assert t["generated_tokens"] == 12 and t["prompt_tokens"] == a.usage.prompt_tokens + b.usage.prompt_tokens
        assert t["requests"] == {"length": 2}
        assert t["kv_bytes_allocated"] == m.context.kv_bytes
        reg = Registry()
        reg.track(m)
        text = reg.render()
        for family in ("edge_sdk_generation_ttft_seconds_count", "edge_sdk_generation_tpot_seconds_bucket", "edge_sdk_generation_tokens_per_second_bucket"):
            assert family in text
        assert 'edge_sdk_generation_generated_tokens_total{' in text and "} 12" in text
        assert a.provenance.variant == "int8" and a.provenance.sha256 == m.variant.sha256


# --- bad input -------------------------------------------------------------------------------


def test_bad_input_is_a_typed_error(model: Any) -> None:
    for bad in ("hello\x00world", "bell\x07", "\ud800 lone surrogate"):
        with pytest.raises(PromptError):
            model.generate(bad)
    with pytest.raises(PromptError, match="bytes"):
        model.generate(b"hello")
    with pytest.raises(PromptError):
        model.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(PromptError):
        model.chat("not a list")
    for kw in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -3}, {"min_p": 1.0}, {"repetition_penalty": 0.0}, {"seed": -1}):
        with pytest.raises(SamplingError):
            model.generate("x", **kw)
    for kw in ({"max_new_tokens": 0}, {"max_new_tokens": True}, {"deadline_s": -1}, {"stop": [""]}, {"stop_token_ids": [5000]}):
        with pytest.raises(OptionsError):
            model.generate("x", **kw)
    # nothing above broke the model
    assert len(model.generate("x", max_new_tokens=3, ignore_eos=True).token_ids) == 3


def _repackage(src: Path, dst: Path, *, tokenizer: str | None = None, template: str | None = None) -> Path:
    """A copy of the package with its tokenizer or template replaced and the digests redone."""
    import shutil

    from edge_sdk import _toml
    from edge_sdk.package import Manifest, file_ref

    shutil.copytree(src, dst)
    if tokenizer is not None:
        (dst / "tokenizer.json").write_text(tokenizer)
    if template is not None:
        (dst / "chat_template.jinja").write_text(template)
    d = _toml.loads((dst / "edge-model.toml").read_text())
    for key, name in (("tokenizer", "tokenizer.json"), ("chat_template", "chat_template.jinja")):
        r = file_ref(dst, name)
        d["generation"][key] = {"file": name, "sha256": r.sha256, "size": r.size}
    (dst / "edge-model.toml").write_text(Manifest.from_dict(d).to_toml())
    return dst


def test_tokenizer_that_does_not_match_the_model_is_refused(tiny_llm_package: Path, tmp_path: Path) -> None:
    tok = json.loads((tiny_llm_package / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 1500, "content": "<|extra|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    bad = _repackage(tiny_llm_package, tmp_path / "bad-tok", tokenizer=json.dumps(tok))
    with pytest.raises(TokenizerError, match=r"tokenizer has 1025 ids but the model has 1024 embedding rows"):
        edge_sdk.load(bad, "generic-x86_64")
    garbage = _repackage(tiny_llm_package, tmp_path / "garbage-tok", tokenizer="{not json")
    with pytest.raises(TokenizerError):
        edge_sdk.load(garbage, "generic-x86_64")


def test_template_escaping_its_sandbox_is_refused(tiny_llm_package: Path, tmp_path: Path) -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m.content }}{% endfor %}"
    bad = _repackage(tiny_llm_package, tmp_path / "evil", template=evil)
    with edge_sdk.load(bad, "generic-x86_64", variant="fp32") as m:
        with pytest.raises(TemplateError):
            m.chat([{"role": "user", "content": "hi"}])
        assert m.generate("plain prompts still work", max_new_tokens=2, ignore_eos=True).usage.completion_tokens == 2


def test_load_model_and_load_decoder_say_which_kind(tiny_llm_package: Path, mlp_package: Path) -> None:
    from edge_sdk.model import load_decoder, load_model

    with pytest.raises(SelectionError, match="text-generation"):
        load_model(tiny_llm_package)
    with pytest.raises(SelectionError, match="not text-generation"):
        load_decoder(mlp_package)
    with pytest.raises(OptionsError, match="context"):
        edge_sdk.load(mlp_package, context=64)
    d = edge_sdk.load(tiny_llm_package, "generic-x86_64")
    assert isinstance(d, edge_sdk.DecoderModel)
    desc = d.describe()
    assert desc["context"]["max_tokens"] == d.max_context and "int4" in desc["selection"]
    d.close()
    d.close()  # idempotent
    from edge_sdk.errors import SessionClosedError

    with pytest.raises(SessionClosedError):
        d.generate("x")


def test_selection_explains_generation_costs_and_quality_gap(tiny_llm_package: Path) -> None:
    with edge_sdk.load(tiny_llm_package, "generic-x86_64") as m:
        text = m.selection.explain()
    assert "KV 2.0 KiB per token" in text and "perplexity" in text and "vs reference" in text
    assert "text-generation order ['int4', 'int8', 'fp32']" in text
    assert np.isfinite(m.variant.quality.perplexity)


# --- CLI ------------------------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "edge_sdk.cli", *args], input=stdin, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1]
    )


def test_cli_generate_streams_and_json_has_the_fields(tiny_llm_package: Path) -> None:
    p = _cli("generate", str(tiny_llm_package), "--prompt", "The with statement", "--max-tokens", "12", "--profile", "generic-x86_64", "--variant", "fp32")
    assert p.returncode == 0, p.stderr
    torch_ref = json.loads((TINY / "torch_reference.json").read_text())["prompts"][0]
    assert torch_ref["prompt"] == "The with statement"
    assert p.stdout.startswith(torch_ref["greedy_20_text"][:8])  # the greedy text, streamed to stdout
    assert "12 tokens, length" in p.stderr and "TTFT" in p.stderr
    p = _cli("generate", str(tiny_llm_package), "--prompt", "The with statement", "--max-tokens", "12", "--profile", "generic-x86_64", "--variant", "fp32", "--json", "--seed", "3", "--temperature", "0.9")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for k in ("text", "token_ids", "finish_reason", "prompt_tokens", "generated_tokens", "ttft_ms", "tpot_ms", "tokens_per_s", "variant", "seed"):
        assert k in d, k
    assert d["variant"] == "fp32" and d["seed"] == 3 and len(d["token_ids"]) == d["generated_tokens"] <= 12
    bad = _cli("generate", str(tiny_llm_package), "--prompt", "x", "--top-p", "2", "--profile", "generic-x86_64")
    assert bad.returncode == 1 and "SamplingError" in bad.stderr and "top_p" in bad.stderr


def test_cli_chat_reads_one_message_per_line(tiny_llm_package: Path) -> None:
    p = _cli("chat", str(tiny_llm_package), "--profile", "generic-x86_64", "--max-tokens", "6", "--system", "Be brief.", stdin="What is a list?\nAnd a tuple?\n\n")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("> ") == 3  # two answers, then the empty line ends it
    assert len([ln for ln in p.stdout.splitlines() if ln.strip()]) >= 1


def test_cli_inspect_shows_generation_costs_and_quality_gap(tiny_llm_package: Path) -> None:
    p = _cli("inspect", str(tiny_llm_package), "--profile", "generic-x86_64")
    assert p.returncode == 0, p.stderr
    assert "generation: llama, 4 layers, 4/2 heads x 32, vocab 1024, context 512; chat template yes" in p.stdout
    assert "KV 2048 B/token (float32)" in p.stdout and "vs reference)" in p.stdout and "MiB of weights read per token" in p.stdout
    assert "chosen: int4" in p.stdout


def test_open_verified_hands_the_runtime_the_hashed_inode(tiny_llm_package: Path, tmp_path: Path) -> None:
    import os
    import shutil

    from edge_sdk.errors import IntegrityError

    pkg_dir = tmp_path / "pkg"
    shutil.copytree(tiny_llm_package, pkg_dir)
    pkg = ModelPackage.open(pkg_dir)
    v = pkg.manifest.variant("fp32")
    original = (pkg_dir / v.file).read_bytes()
    fd, path = pkg.open_verified(v)
    try:
        swap = pkg_dir / "swap.onnx"
        swap.write_bytes(b"\x00" * len(original))
        os.replace(swap, pkg_dir / v.file)  # the name now points at other bytes
        with open(path, "rb") as f:
            assert f.read() == original  # ... the path handed out still reads what was hashed
    finally:
        os.close(fd)
    with pytest.raises(IntegrityError, match="sha256"):
        pkg.open_verified(v)  # and the next open sees the swap


def test_fp16_variant_and_float16_kv(tmp_path: Path) -> None:
    from converters.cli import main as convert_main

    out = tmp_path / "pkg16"
    rc = convert_main(["llm", str(TINY), "--to", "int8,fp16", "--kv-dtype", "float16", "--out", str(out), "--eval-text", str(TINY / "heldout.txt"), "--json"])
    assert rc == 0
    m = ModelPackage.open(out).manifest
    assert [v.id for v in m.variants] == ["int8", "fp16"]
    for v in m.variants:
        assert v.generation.kv_dtype == "float16" and v.generation.kv_bytes_per_token == 1024  # half of float32's 2048
    assert m.variant("fp16").generation.bits == 16 and m.variant("fp16").quality.perplexity_gap <= 0.01
    with edge_sdk.load(out, "generic-x86_64", variant="int8") as d:
        assert d.context.kv_bytes == d.max_context * 1024
        r = d.generate("The with statement", max_new_tokens=8, ignore_eos=True)
        assert len(r.token_ids) == 8


def test_gate_failure_is_left_out_or_kept_marked_with_force(tmp_path: Path) -> None:
    from converters.cli import main as convert_main

    common = ["llm", str(TINY), "--eval-text", str(TINY / "heldout.txt"), "--int4-methods", "rtn", "--mixed", "never", "--no-timing", "--json"]
    # an impossible int4 gate: int4 is left out, int8 stays
    out = tmp_path / "a"
    assert convert_main([*common, "--to", "int4,int8", "--gate", "int4=0", "--out", str(out)]) == 0
    assert [v.id for v in ModelPackage.open(out).manifest.variants] == ["int8"]
    # --force keeps it, marked; selection passes it over unless it is asked for by id
    out = tmp_path / "b"
    assert convert_main([*common, "--to", "int4,int8", "--gate", "int4=0", "--force", "--out", str(out)]) == 0
    v = ModelPackage.open(out).manifest.variant("int4")
    assert v.gate is not None and not v.gate.passed and v.gate.forced and "perplexity_gap" in v.gate.failures[0]
    with edge_sdk.load(out, "generic-x86_64") as m:
        assert m.variant.id == "int8" and "failed its quality gate" in m.selection.explain()
    with edge_sdk.load(out, "generic-x86_64", variant="int4") as m:
        assert m.variant.id == "int4"
    # nothing passes and nothing is forced: a typed error, nothing written
    from converters.llm.convert import LLMConvertOptions, convert_llm
    from converters.llm.spec import LLMConvertError

    with pytest.raises(LLMConvertError, match="no variant passed its quality gate"):
        convert_llm(TINY, tmp_path / "c", LLMConvertOptions(targets=("int4",), int4_methods=("rtn",), mixed="never", gates={"int4": 0.0}, timing=False, eval_text=(TINY / "heldout.txt").read_text()))
    assert not (tmp_path / "c" / "edge-model.toml").exists()


def test_a_decoder_package_is_signed_installed_and_health_checked_by_the_store(tiny_llm_package: Path, tmp_path: Path) -> None:
    """The same store as every model: signature over the manifest (which holds the tokenizer's and the
    template's digests), health check in a child process (greedy tokens), then loadable from the store."""
    import shutil

    from edge_sdk.store import ModelStore, StoreConfig, generate_keypair, sign_package

    priv, pub = generate_keypair()
    store = ModelStore(tmp_path / "store", StoreConfig(require_signatures=True, trusted_keys=(pub,), health_start_method="fork", health_timeout_s=120.0))
    good = tmp_path / "good"
    shutil.copytree(tiny_llm_package, good)
    sign_package(good, priv)
    r = store.install(good)
    assert r.ok and r.health is not None and r.health.ok, r
    active = store.active_path(ModelPackage.open(good).manifest.name)
    assert active is not None
    with edge_sdk.load(active, "generic-x86_64") as m:
        assert len(m.generate("The with statement", max_new_tokens=3, ignore_eos=True).token_ids) == 3
    # a tokenizer swapped after signing: its digest no longer matches the signed manifest
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llm_package, bad)
    sign_package(bad, priv)
    (bad / "tokenizer.json").write_text((bad / "tokenizer.json").read_text().replace('"<|im_end|>"', '"<|im_fin|>"'))
    r = store.install(bad)
    assert not r.ok and "tokenizer" in r.reason


def test_one_sequence_per_model_abandoned_stream_and_two_threads(model: Any) -> None:
    from edge_sdk.errors import GenerationError

    s = model.stream("The with statement", max_new_tokens=50, ignore_eos=True)
    next(s)  # open, suspended in this thread
    with pytest.raises(GenerationError, match="still open in this thread"):
        model.generate("x", max_new_tokens=2)
    s.close()  # releases the model
    assert len(model.generate("x", max_new_tokens=2, ignore_eos=True).token_ids) == 2
    # two threads: the second waits for the first; both get their full, correct answers
    want = model.generate("The with statement", max_new_tokens=12, ignore_eos=True).token_ids
    got: list[Any] = []
    ts = [threading.Thread(target=lambda: got.append(model.generate("The with statement", max_new_tokens=12, ignore_eos=True).token_ids)) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert got == [want, want]


def test_repetition_penalty_reaches_the_sampler_through_the_loop(model: Any) -> None:
    plain = model.generate("The with statement", max_new_tokens=30, ignore_eos=True)
    pen = model.generate("The with statement", max_new_tokens=30, ignore_eos=True, repetition_penalty=1.8)
    assert pen.token_ids != plain.token_ids  # greedy both: only the penalty differs
    assert len(set(pen.token_ids)) >= len(set(plain.token_ids))  # fewer repeats, not more
    assert model.generate("The with statement", max_new_tokens=30, ignore_eos=True, repetition_penalty=1.8).token_ids == pen.token_ids
