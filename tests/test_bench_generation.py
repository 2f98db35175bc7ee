"""``edge-sdk bench`` on a text-generation package (edge_sdk/bench/generation.py): the CLI end to
end on the tiny Llama package (real conversion, real ONNX Runtime sessions, real child processes
for peak RSS), the report's relations between figures (never their speed beyond loose bounds),
the prompt maker, the usage errors, and ``--vs-raw`` against onnxruntime-genai where it is
installed (it is not a CI dependency: only that test is skipped without it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_sdk.bench.generation import GenerationBenchOptions, first_difference, make_prompt, require_genai
from edge_sdk.cli import main
from edge_sdk.errors import MissingDependencyError, OptionsError

P, G = 24, 12


def _bench(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, dict[str, Any] | None, str, str]:
    out = tmp_path / "gen.json"
    rc = main(["bench", *args, "--json", str(out), "--quiet"])
    cap = capsys.readouterr()
    return rc, (json.loads(out.read_text()) if out.exists() else None), cap.out, cap.err


@pytest.fixture(scope="module")
def int4_report(tiny_llm_package: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("genbench") / "r.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(
            ["bench", str(tiny_llm_package), "--variant", "int4", "--prompt-tokens", str(P), "--new-tokens", str(G), "--runs", "4"]
            + ["--threads", "1", "--json", str(out), "--quiet"]
        )
    assert rc == 0
    return json.loads(out.read_text()), buf.getvalue()


def test_cli_prints_a_table_and_writes_the_report(int4_report: tuple[dict[str, Any], str]) -> None:
    r, text = int4_report
    assert "TTFT p50/p90/p99 ms" in text and "tok/s" in text and "int4" in text and "edge_sdk" in text
    assert r["kind"] == "text-generation" and r["package"]["name"] == "tiny_llm"
    env = r["environment"]
    assert env["cpu"]["cpu_count"] >= 1 and isinstance(env["cpu"]["flags"], dict) and "avx2" in env["cpu"]["flags"]
    assert env["onnxruntime"] and "loadavg_before" in env and "loadavg_after" in env
    assert r["prompt"]["tokens"] == P and len(r["prompt"]["token_ids"]) == P
    (row,) = r["rows"]
    assert row["variant"] == "int4" and row["runtime"] == "edge_sdk" and row["threads"] == 1
    assert row["runs"] == 4 and row["generated_tokens"] == G and row["prompt_tokens"] == P and row["new_tokens"] == G
    assert row["greedy_repeatable"] is True and len(row["token_ids"]) == G
    assert r["comparisons"] == []


def test_figures_hold_their_relations(int4_report: tuple[dict[str, Any], str]) -> None:
    (row,) = int4_report[0]["rows"]
    for k in ("ttft_ms", "tpot_ms", "prefill_ms", "session_step_ms"):
        s = row[k]
        assert 0 < s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"], (k, s)
    assert row["tokens_per_s"] == pytest.approx(1000.0 / row["tpot_ms"]["p50"], rel=1e-4)
    assert row["prefill_tokens_per_s"] == pytest.approx(P / (row["prefill_ms"]["p50"] / 1e3), rel=1e-4)
    assert row["ttft_ms"]["p50"] >= row["prefill_ms"]["p50"]  # TTFT = tokenize + prefill + first sample, run by run
    # the session's step is part of a token's time: the loop's own overhead is what is left, >= 0
    assert row["tpot_ms"]["p50"] >= row["session_step_ms"]["p50"] * 0.98
    assert row["loop_overhead_ms_per_token"]["p50"] >= -0.01
    assert row["tpot_ms"]["p50"] < 1000 and row["ttft_ms"]["p50"] < 5000  # loose: a tiny model on any CPU
    kv = row["kv"]
    assert kv["allocated_bytes"] == kv["allocated_tokens"] * kv["bytes_per_token"]
    assert kv["allocated_tokens"] >= P + G
    # after a run the buffer holds the prompt and every generated token but the last (sampled, never run)
    assert kv["in_use_tokens"] == P + G - 1
    assert kv["in_use_bytes"] == (P + G - 1) * kv["bytes_per_token"]


def test_peak_rss_comes_from_a_child_process(int4_report: tuple[dict[str, Any], str]) -> None:
    r = int4_report[0]
    (row,) = r["rows"]
    m = row["peak_rss"]
    assert m["runtime"] == "edge_sdk" and m["generated_tokens"] == G
    assert "child process" in m["source"]
    assert m["peak_rss_mb"] >= m["rss_after_load_mb"] >= m["rss_before_load_mb"] > 0
    if sys.platform.startswith("linux"):
        assert m["source"].startswith("VmHWM")
        # a fresh child: its peak is its own, not this (bigger, test-running) process's
        assert m["peak_rss_before_load_mb"] < m["peak_rss_mb"]
    b = row["rss_budget"]
    assert b["weights_plus_kv_plus_100mib_mb"] == pytest.approx((row["file_bytes"] + row["kv"]["allocated_bytes"]) / 2**20 + 100)
    assert b["within"] == (m["peak_rss_mb"] <= b["weights_plus_kv_plus_100mib_mb"])


def test_all_variants_without_memory(tiny_llm_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, r, out, _ = _bench(
        capsys, tmp_path, str(tiny_llm_package), "--all-variants", "--runs", "2", "--new-tokens", "6", "--prompt-tokens", "8", "--no-memory"
    )
    assert rc == 0 and r is not None
    assert [x["variant"] for x in r["rows"]] == ["int4", "int8", "fp32"]
    assert all("peak_rss" not in x for x in r["rows"])
    bits = {x["variant"]: x["bits"] for x in r["rows"]}
    assert bits == {"int4": 4, "int8": 8, "fp32": 32}
    # fewer weight bytes per token for fewer bits (the manifest's figure, reported per row)
    w = {x["variant"]: x["weight_bytes_per_token"] for x in r["rows"]}
    assert w["int4"] < w["int8"] < w["fp32"]


def test_prompt_text_and_seeded_random_prompts(tiny_llm_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, r, _, _ = _bench(
        capsys, tmp_path, str(tiny_llm_package), "--prompt", "The module defines", "--runs", "1", "--new-tokens", "4", "--no-memory"
    )
    assert rc == 0 and r is not None
    assert r["prompt"]["text"] == "The module defines" and r["prompt"]["source"].startswith("given text")
    assert r["rows"][0]["prompt_tokens"] == r["prompt"]["tokens"] == len(r["prompt"]["token_ids"])

    import edge_sdk

    with edge_sdk.load(tiny_llm_package, variant="fp32") as m:
        for n in (1, 7, 64):
            text, ids, _ = make_prompt(m, n, seed=3)
            assert len(ids) == n and m.encode(text) == ids
        assert make_prompt(m, 16, seed=5) == make_prompt(m, 16, seed=5)
        assert make_prompt(m, 16, seed=5)[1] != make_prompt(m, 16, seed=6)[1]


def test_usage_errors(tiny_llm_package: Path, mlp_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pkg = str(tiny_llm_package)
    # the load scenarios (offline, multi-stream, server) take no --runs: that is the single-stream bench's
    rc, _, _, err = _bench(capsys, tmp_path, pkg, "--scenario", "offline", "--runs", "2")
    assert rc == 2 and "--runs" in err and "text-generation" in err
    rc, _, _, err = _bench(capsys, tmp_path, pkg, "--runs", "0")
    assert rc == 2 and "runs" in err
    rc, _, _, err = _bench(capsys, tmp_path, str(mlp_package), "--prompt-tokens", "8")
    assert rc == 2 and "--prompt-tokens" in err and "text-generation packages only" in err
    rc, _, _, err = _bench(capsys, tmp_path, pkg, "--variant", "int3")
    assert rc == 1 and "BenchError" in err and "int3" in err
    # prompt + new tokens over the KV buffer asked for: a typed error naming both
    rc, _, _, err = _bench(capsys, tmp_path, pkg, "--context", "20", "--prompt-tokens", "16", "--new-tokens", "16", "--no-memory")
    assert rc == 1 and "ContextBudgetError" in err and "16" in err and "20" in err
    with pytest.raises(OptionsError, match="new_tokens"):
        GenerationBenchOptions(new_tokens=0)


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_vs_raw_needs_onnxruntime_genai(
    tiny_llm_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # what an environment without it sees: ImportError
    with pytest.raises(MissingDependencyError, match="pip install onnxruntime-genai"):
        require_genai()
    rc, _, _, err = _bench(capsys, tmp_path, str(tiny_llm_package), "--vs-raw", "--runs", "1", "--new-tokens", "4")
    assert rc == 1 and "MissingDependencyError" in err and "pip install onnxruntime-genai" in err


def test_vs_raw_against_onnxruntime_genai(tiny_llm_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import platform

    if os.environ.get("CI") and platform.machine() == "x86_64":
        import onnxruntime_genai  # noqa: F401  (in the dev extra on x86_64: CI must run this, never skip it)
    else:
        pytest.importorskip("onnxruntime_genai")
    rc, r, out, _ = _bench(
        capsys, tmp_path, str(tiny_llm_package), "--variant", "int4", "--variant", "fp32", "--vs-raw", "--runs", "3",
        "--prompt-tokens", str(P), "--new-tokens", str(G), "--threads", "1",
    )  # fmt: skip
    assert rc == 0 and r is not None
    assert "vs onnxruntime-genai" in out and "greedy ids equal" in out
    assert [(x["variant"], x["runtime"]) for x in r["rows"]] == [
        ("int4", "edge_sdk"), ("int4", "onnxruntime-genai"), ("fp32", "edge_sdk"), ("fp32", "onnxruntime-genai"),
    ]  # fmt: skip
    for c in r["comparisons"]:
        assert c["greedy_equal"] is True and c["first_difference"] is None and c["runs_compared"] == 3, c
        ours, genai = (x for x in r["rows"] if x["variant"] == c["variant"])
        assert ours["token_ids"] == genai["token_ids"] and len(genai["token_ids"]) == G
        assert c["tokens_per_s_ratio"] == pytest.approx(ours["tokens_per_s"] / genai["tokens_per_s"], rel=1e-3)
        assert genai["kv"]["allocated_tokens"] == P + G
        assert genai["peak_rss"]["runtime"] == "onnxruntime-genai" and genai["peak_rss"]["generated_tokens"] == G
        assert genai["peak_rss"]["peak_rss_mb"] > 0
        # genai never saw its end-of-sequence id (set to one the SDK did not generate), so it ran all G tokens
        assert genai["eos_token_id_set"] not in ours["token_ids"]
    assert r["environment"]["onnxruntime_genai"]
