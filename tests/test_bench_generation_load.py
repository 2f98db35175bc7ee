"""``edge-sdk bench PKG --scenario offline|multi-stream|server`` on a text-generation package
(edge_sdk/bench/generation_load.py): the generation engine under load on the tiny Llama package,
with small counts. Checked: the report's structure, that every submitted request is accounted for
(completed + refused + failed), relations between figures that hold on a machine 5x slower (never
a wall-clock threshold), the server search's logic (a pure function with a fake trial, and on the
real engine with an impossible objective and with a queue that refuses), and the CLI with --json."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from edge_sdk.bench.generation_load import (
    INTERFERENCE_TARGET,
    SCALING_TARGETS,
    GenerationLoadOptions,
    canonical_scenario,
    chat_prompts,
    render_generation_load_text,
    run_generation_load,
    search_rate,
)
from edge_sdk.cli import main
from edge_sdk.errors import OptionsError

G = 8


def _ordered(p: dict[str, float]) -> None:
    assert p["min"] <= p["p50"] <= p["p90"] <= p["p99"] <= p["max"], p
    assert p["min"] <= p["mean"] <= p["max"], p


def _accounted(block: dict[str, Any]) -> None:
    assert block["submitted"] == block["completed"] + block["refused"] + block["failed"], block
    cpu = block["cpu"]  # what says whether the figure is clean: this process's CPU time, the others' share
    assert cpu["process_cpu_s"] >= 0 and cpu["wall_s"] > 0
    if "others_busy_fraction" in cpu:
        assert 0.0 <= cpu["others_busy_fraction"] <= cpu["machine_busy_fraction"] <= 1.0
    assert block["output_tokens"] == block["completed"] * G  # ignore_eos: every completed request generates exactly G


@pytest.fixture(scope="module")
def report(tiny_llm_package: Path) -> dict[str, Any]:
    opts = GenerationLoadOptions(
        scenarios=("offline", "multistream", "server"), variant="int4", streams=(1, 2, 4), requests=6, requests_per_stream=2,
        probe_runs=3, trial_requests=6, max_trials=3, new_tokens=G, threads=1,
    )  # fmt: skip
    return run_generation_load(tiny_llm_package, opts, argv=["test"])


def test_report_structure_and_environment(report: dict[str, Any]) -> None:
    assert report["kind"] == "text-generation-load" and report["package"]["name"] == "tiny_llm" and report["variant"] == "int4"
    assert report["threads"] == 1 and report["argv"] == ["test"]
    assert list(report["scenarios"]) == ["offline", "multi-stream", "server"]
    env = report["environment"]
    assert env["cpu"]["cpu_count"] >= 1 and "avx2" in env["cpu"]["flags"] and "loadavg_before" in env and "loadavg_after" in env
    s = report["settings"]
    assert s["greedy"] is True and s["ignore_eos"] is True and s["streams"] == [1, 2, 4] and s["new_tokens"] == G
    assert "mlperf.conf" in report["references"]["llm_latency_constraints"]
    assert "chat" in report["prompts"]["source"]
    text = render_generation_load_text(report)
    assert "offline" in text and "multi-stream" in text and "server" in text and "TTFT" in text
    json.dumps(report, allow_nan=False)  # JSON-ready


def test_offline_counts_and_relations(report: dict[str, Any]) -> None:
    o = report["scenarios"]["offline"]
    assert o["streams"] == 4 and o["effective_streams"] == 4 and o["submitted"] == 6
    _accounted(o)
    assert o["refused"] == 0 and o["failed"] == 0 and o["queue_size"] >= 6  # offline sizes the queue to hold every request
    assert o["tokens_per_s"] == pytest.approx(o["output_tokens"] / o["wall_s"])
    assert o["requests_per_s"] == pytest.approx(o["completed"] / o["wall_s"])
    for k in ("ttft_ms", "tpot_ms", "queued_ms"):
        _ordered(o[k])
    assert o["ttft_ms"]["max"] <= o["wall_s"] * 1e3  # a request's first token comes before the last request's last one
    assert 1 <= o["max_batch_seen"] <= 4
    e = o["engine"]
    assert e["finished"] == o["warmup"]["rounds"] * 4 + 6 and e["refused"] == 0
    assert len(e["batch_histogram"]) == 5 and sum(e["batch_histogram"][2:]) > 0  # they ran together
    assert o["warmup"]["requests_per_round"] == 4 and len(o["warmup"]["new_tokens"]) == 4


def test_multistream_rows_ratios_and_interference(report: dict[str, Any]) -> None:
    m = report["scenarios"]["multi-stream"]
    rows = m["rows"]
    assert [r["streams"] for r in rows] == [1, 2, 4] and m["baseline_streams"] == 1
    for r in rows:
        _accounted(r)
        assert r["submitted"] == r["streams"] * 2 and r["completed"] == r["streams"] * 2  # count-bounded, far below the time limit
        assert r["time_limited_clients"] == 0 and r["refused"] == 0
        assert 1 <= r["max_batch_seen"] <= r["streams"]
        _ordered(r["ttft_ms"])
        _ordered(r["tpot_ms"])
        assert r["tokens_per_s"] == pytest.approx(r["output_tokens"] / r["wall_s"])
        assert r["ratio_vs_baseline"] == pytest.approx(r["tokens_per_s"] / rows[0]["tokens_per_s"])
    assert rows[0]["ratio_vs_baseline"] == pytest.approx(1.0) and rows[0]["max_batch_seen"] == 1
    t = m["scaling_targets"]
    assert set(t) == {"4"}  # 8 streams was not run
    assert t["4"]["target_ratio"] == SCALING_TARGETS[4] and t["4"]["met"] == (t["4"]["ratio"] >= SCALING_TARGETS[4])
    i = m["interference"]
    assert i["background_streams"] == 3 and i["engine_streams"] == 4 and i["prefix_cache"] is False and i["probe_runs"] == 3
    assert i["failed"] == 0 and len(i["background_decoding_at_submit"]) == 3
    assert all(0 <= n <= 3 for n in i["background_decoding_at_submit"])
    _ordered(i["idle_ttft_ms"])
    _ordered(i["busy_ttft_ms"])
    assert i["ratio_p99"] == pytest.approx(i["busy_ttft_ms"]["p99"] / i["idle_ttft_ms"]["p99"])
    assert i["met"] == (i["ratio_p99"] <= INTERFERENCE_TARGET)
    assert all(1 <= b <= 4 for b in i["probe_max_batch"])


def test_server_trials_follow_the_search(report: dict[str, Any]) -> None:
    s = report["scenarios"]["server"]
    trials = s["trials"]
    assert 1 <= len(trials) <= 3 and s["start_rate"] == trials[0]["rate"]
    for t in trials:
        assert t["requests"] == 6
        assert t["submitted"] == t["completed"] + t["refused"] + t["failed"]
        assert t["passed"] == (not t["reasons"])
        if t["ttft_p99_ms"] is not None:
            assert t["passed"] <= (t["ttft_p99_ms"] <= s["ttft_p99_ms"] and t["tpot_p99_ms"] <= s["tpot_p99_ms"])
    for a, b in zip(trials, trials[1:]):  # doubling after a pass while nothing failed, halving while nothing passed
        if all(t["passed"] for t in trials[: trials.index(b)]):
            assert b["rate"] == pytest.approx(min(2 * a["rate"], report["settings"]["max_rate"]))
    passed = [t["rate"] for t in trials if t["passed"]]
    failed = [t["rate"] for t in trials if not t["passed"]]
    assert s["highest_passing_rate"] == (max(passed) if passed else None)
    assert not passed or not failed or max(passed) < min(failed)
    assert (s["tokens_per_s_at_highest"] is None) == (s["highest_passing_rate"] is None)


def test_search_rate_logic() -> None:
    def fake(limit: float) -> Any:
        return lambda rate: {"passed": rate <= limit}

    r = search_rate(fake(3.7), 1.0, max_trials=20, max_rate=1000.0, tolerance=0.05)
    rates = [t["rate"] for t in r["trials"]]
    assert rates[:3] == [1.0, 2.0, 4.0]  # doubling until the first failure
    assert r["stopped"] == "converged" and r["highest_passing_rate"] <= 3.7 < r["lowest_failing_rate"]
    assert r["lowest_failing_rate"] <= r["highest_passing_rate"] * 1.05
    # impossible: halving, every trial fails, the highest passing rate is None and it says so
    r = search_rate(fake(0.0), 8.0, max_trials=4, max_rate=1000.0)
    assert [t["rate"] for t in r["trials"]] == [8.0, 4.0, 2.0, 1.0]
    assert r["highest_passing_rate"] is None and r["stopped"] == "max_trials" and "no rate" in r["message"]
    # always passing: doubling up to max_rate, then it stops with a lower bound
    r = search_rate(fake(1e9), 3.0, max_trials=10, max_rate=20.0)
    assert [t["rate"] for t in r["trials"]] == [3.0, 6.0, 12.0, 20.0] and r["stopped"] == "max_rate"
    assert r["highest_passing_rate"] == 20.0 and r["lowest_failing_rate"] is None and "lower bound" in r["message"]
    # a failure first, then passes: the bracket only narrows
    r = search_rate(fake(1.3), 4.0, max_trials=12, max_rate=100.0, tolerance=0.01)
    ok = [t["rate"] for t in r["trials"] if t["passed"]]
    bad = [t["rate"] for t in r["trials"] if not t["passed"]]
    assert max(ok) < min(bad) and r["highest_passing_rate"] == max(ok) and r["lowest_failing_rate"] == min(bad)
    # no search: one trial
    r = search_rate(fake(1.0), 5.0, max_trials=8, max_rate=100.0, search=False)
    assert len(r["trials"]) == 1 and r["stopped"] == "no search" and r["highest_passing_rate"] is None
    with pytest.raises(OptionsError):
        search_rate(fake(1.0), 0.0, max_trials=2, max_rate=10.0)


def test_server_with_an_impossible_objective_and_refusals(tiny_llm_package: Path) -> None:
    base = dict(scenarios=("server",), variant="int4", streams=(2,), trial_requests=4, new_tokens=G, threads=1, warmup=1)
    r = run_generation_load(tiny_llm_package, GenerationLoadOptions(**base, ttft_p99_ms=1e-6, max_trials=2, rate=50.0))
    s = r["scenarios"]["server"]
    assert [t["rate"] for t in s["trials"]] == [50.0, 25.0]  # failing: halving, bounded by max_trials
    assert all(not t["passed"] and any("TTFT p99" in x for x in t["reasons"]) for t in s["trials"])
    assert s["highest_passing_rate"] is None and "no rate" in s["message"] and s["tokens_per_s_at_highest"] is None
    assert "no rate" in render_generation_load_text(r)
    # a queue of 0 and one slot: arrivals all but at once, the second is refused, which fails the trial
    opts = GenerationLoadOptions(**{**base, "streams": (1,), "trial_requests": 5}, queue_size=0, rate=1e6, search=False, max_rate=1e7)
    t = run_generation_load(tiny_llm_package, opts)["scenarios"]["server"]["trials"]
    assert len(t) == 1 and t[0]["submitted"] == 5 and t[0]["refused"] >= 1 and not t[0]["passed"]
    assert t[0]["submitted"] == t[0]["completed"] + t[0]["refused"] + t[0]["failed"]
    assert any("refused" in x for x in t[0]["reasons"])


def test_token_prompts_have_the_asked_length(tiny_llm_package: Path) -> None:
    opts = GenerationLoadOptions(scenarios=("offline",), streams=(2,), requests=3, prompt_tokens=12, new_tokens=G, threads=1)
    r = run_generation_load(tiny_llm_package, opts)
    o = r["scenarios"]["offline"]
    assert o["prompt_tokens"]["min"] == o["prompt_tokens"]["max"] == 12 and o["completed"] == 3
    assert "12 random token ids" in r["prompts"]["source"]


def test_options_and_prompts() -> None:
    assert canonical_scenario("multistream") == canonical_scenario("Multi-Stream") == "multi-stream"
    o = GenerationLoadOptions(scenarios=("server", "offline", "multistream"))
    assert o.scenarios == ("offline", "multi-stream", "server") and o.engine_streams() == 4 and o.multistream_streams() == (1, 2, 4, 8)
    assert GenerationLoadOptions(streams=(8, 2)).engine_streams() == 8 and GenerationLoadOptions(streams=(8, 2)).multistream_streams() == (
        2,
        8,
    )
    for bad in ({"scenarios": ("nope",)}, {"streams": (0,)}, {"requests": 0}, {"ttft_p99_ms": -1.0}, {"rate": 0.0}):
        with pytest.raises(OptionsError):
            GenerationLoadOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="rate"):
        GenerationLoadOptions(scenarios=("server",), search=False)
    qs = chat_prompts(200, seed=3)
    assert len(set(qs)) == 200 and qs == chat_prompts(200, seed=3) and qs != chat_prompts(200, seed=4)
    assert chat_prompts(5, seed=3, start=10) == qs[10:15]


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["bench", *args])
    return rc, out.getvalue(), err.getvalue()


def test_cli_json_and_usage_errors(tiny_llm_package: Path, mlp_package: Path, tmp_path: Path) -> None:
    pkg = str(tiny_llm_package)
    out = tmp_path / "load.json"
    rc, text, _ = _cli(
        pkg, "--scenario", "multistream", "--streams", "1,2", "--requests-per-stream", "2", "--probe-runs", "2", "--new-tokens", str(G),
        "--threads", "1", "--json", str(out), "--quiet",
    )  # fmt: skip
    assert rc == 0 and "multi-stream" in text and f"report: {out}" in text
    r = json.loads(out.read_text())
    assert list(r["scenarios"]) == ["multi-stream"] and [x["streams"] for x in r["scenarios"]["multi-stream"]["rows"]] == [1, 2]
    assert r["settings"]["requests_per_stream"] == 2 and r["settings"]["probe_runs"] == 2
    for args, needle in (
        ((pkg, "--scenario", "offline", "--runs", "2"), "--runs"),
        ((pkg, "--scenario", "offline", "--vs-raw"), "--vs-raw"),
        ((pkg, "--scenario", "bogus"), "bogus"),
        ((pkg, "--scenario", "offline,single-stream"), "single-stream"),
        ((pkg, "--scenario", "server", "--no-search"), "--no-search needs --rate"),
        ((pkg, "--scenario", "offline", "--variant", "int4", "--variant", "int8"), "one --variant"),
        ((pkg, "--requests", "4"), "--scenario offline, multi-stream or server"),
        ((pkg, "--streams", "2"), "--streams"),
        ((pkg, "--scenario", "offline", "--requests", "0"), "requests"),
        ((str(mlp_package), "--requests", "4"), "text-generation packages only"),
        ((str(mlp_package), "--streams", "1,2"), "one number"),
    ):
        rc, _, err = _cli(*args, "--quiet")
        assert rc == 2 and needle in err, (args, err)
