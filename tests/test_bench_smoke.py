"""Smoke test for tools/bench/bench_overhead.py.

Runs it as a user does, ``python tools/bench/bench_overhead.py --quick --json OUT``, in a
subprocess (fresh interpreter, bounded by a timeout) and checks the JSON's shape and sanity:
every section is there, every latency is a finite positive number, cosines lie in [-1, 1], and
the fp32-vs-fp32 self-comparison agrees exactly.  Nothing here asserts on
timing: how fast things run is the benchmark's business, not the tests'.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]

# Optional extras the benchmark needs beyond the base install (onnx builds the
# models, OpenCV draws the images, ai-edge-litert runs the LiteRT section).
pytest.importorskip("onnx")
pytest.importorskip("cv2")
pytest.importorskip("ai_edge_litert")

SECTIONS = ("overhead", "predict_image", "precision", "litert_vs_ort", "cold_start", "settings", "meta")
TIMEOUT_S = 600  # a quick run takes ~10-40 s; generous for a loaded CI machine


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    script = REPO / "tools" / "bench" / "bench_overhead.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"benchmark failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "## A." in proc.stdout and "## E." in proc.stdout, proc.stdout[-2000:]
    return json.loads(out.read_text())


def _numbers(o: Any, path: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(o, (int, float)) and not isinstance(o, bool):
        yield path, float(o)


# Differences of two measurements (may be <= 0 on a noisy machine) and the
# stage medians that are legitimately zero (predict has no preprocess stage).
_MAY_BE_ZERO_OR_NEGATIVE = (
    "added_median_us",
    "added_pct",
    "paired_added_us",
    "outside_timers",
    "inference_minus_raw",
    "preprocess",
    "rest_median_ms",
)


def test_every_section_present(result: dict[str, Any]) -> None:
    for s in SECTIONS:
        assert s in result and result[s], f"section {s!r} missing or empty"
    assert {"latency", "agreement"} <= set(result["precision"])


def test_numbers_finite_and_latencies_positive(result: dict[str, Any]) -> None:
    nums = list(_numbers({k: result[k] for k in SECTIONS if k not in ("meta", "settings")}))
    assert nums
    for path, v in nums:
        assert math.isfinite(v), f"{path} = {v}"
        if not any(path.endswith(s) or f".{s}." in path for s in _MAY_BE_ZERO_OR_NEGATIVE):
            assert v > 0, f"{path} = {v} (expected > 0)"


def test_overhead_rows(result: dict[str, Any]) -> None:
    rows = result["overhead"]
    models = {r["model"].split(" ")[0] for r in rows}
    assert models == {"trivial", "MobileNetV2"}
    for r in rows:
        assert r["outputs_identical"], f"raw and predict disagree for {r['model']} at {r['threads']} threads"
        assert r["session_options_match"], r["session_options_mismatches"]
        for arm in ("raw", "predict"):
            assert r[arm]["n"] > 0 and r[arm]["p99_us"] >= r[arm]["median_us"] > 0
        assert set(r["stages_us"]) >= {"validate", "inference", "decode"}
        assert isinstance(r["meets_target"], bool)
    # the threads asked for (default 1,2) each got a row per model, with the settings recorded
    assert sorted({r["threads"] for r in rows}) == [1, 2]
    assert [s["threads"] for s in result["settings"]] == [1, 2]
    assert all(isinstance(s["allow_spinning"], bool) for s in result["settings"])


def test_agreement_and_sanity_row(result: dict[str, Any]) -> None:
    agree = result["precision"]["agreement"]
    assert agree
    for a in agree:
        for key in ("cosine", "min_image_cosine"):
            assert -1.0 <= a[key] <= 1.0, a
        assert 0.0 <= a["top1_agreement"] <= 1.0
    sanity = [a for a in agree if a["comparison"].startswith("fp32 vs fp32")]
    assert len(sanity) == 2  # demo and MobileNetV2
    for a in sanity:
        assert a["cosine"] == 1.0 and a["top1_agreement"] == 1.0, a
    demo = [a for a in agree if a["model"].startswith("shapes") and a["comparison"] == "fp32 vs int8"]
    assert demo and demo[0]["images"] == 500


def test_cold_start_cache_states(result: dict[str, Any]) -> None:
    states = {r["cache"]: set(r["cache_state"]) for r in result["cold_start"]}
    assert states == {"empty": {"written"}, "warm": {"hit"}}
