"""``edge-sdk bench``: the scenarios' invariants (never their timings), the report schema, the
plot, cold start with and without the optimised-model cache, ``--compare``, and the CLI end to end.

Every run here is bounded to a few seconds: a tiny ONNX MLP built in the test (dynamic batch 1..8),
the bundled demo package, and a real wrapper that makes a model slower by a fixed sleep where a
test needs a known service time.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, mlp_manifest, mlp_onnx

from edge_sdk.bench import BenchError, BenchOptions, compare_reports, load_schema, run_bench, validate_report
from edge_sdk.bench.coldstart import measure_cold_start

pytest.importorskip("onnx")

FAST: dict[str, Any] = {"cold_start": False, "warmup": 3, "sample_interval_s": 0.2}


class Slowed:
    """A model wrapper: every inference call sleeps ``delay_s`` first, then delegates (and counts)."""

    def __init__(self, model: Any, delay_s: float) -> None:
        self._m = model
        self.delay_s = delay_s
        self.calls = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    def _tick(self, n: int = 1) -> None:
        with self._lock:
            self.calls += n
        if self.delay_s:
            time.sleep(self.delay_s)

    def predict(self, x: Any, **kw: Any) -> Any:
        self._tick()
        return self._m.predict(x, **kw)

    def predict_image(self, x: Any, **kw: Any) -> Any:
        self._tick()
        return self._m.predict_image(x, **kw)

    def predict_batch(self, items: Any, **kw: Any) -> Any:
        self._tick(len(items))
        return self._m.predict_batch(items, **kw)

    def close(self) -> None:
        self._m.close()


def _wrap(delay_s: float, keep: list[Slowed] | None = None) -> Any:
    def wrap(m: Any) -> Slowed:
        w = Slowed(m, delay_s)
        if keep is not None:
            keep.append(w)
        return w

    return wrap


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from converters.packaging import write_package

    root = tmp_path_factory.mktemp("bench") / "mlp"
    write_package(root, mlp_manifest(), {"m.onnx": mlp_onnx()})
    return root


@pytest.fixture(scope="module")
def tiny_fixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP with a fixed batch of 1 (offline must use a worker pool)."""
    from converters.packaging import write_package

    root = tmp_path_factory.mktemp("bench") / "mlp-fixed"
    man = mlp_manifest()
    man["inputs"] = [{"name": "x", "dtype": "float32", "shape": [1, 8]}]
    man["outputs"] = [{"name": "y", "dtype": "float32", "shape": [1, 4]}]
    write_package(root, man, {"m.onnx": mlp_onnx(batch=1)})
    return root


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for s in report["scenarios"].values() for r in s["rows"]]


def _check_invariants(report: dict[str, Any]) -> None:
    """Counts add up and percentiles are ordered, in every row of every scenario."""
    for r in _rows(report):
        c, lat = r["counts"], r["latency_ms"]
        assert c["issued"] == c["completed"] + c["dropped"] + c["errors"], (r["label"], c)
        assert 0 <= c["late"] <= c["completed"]
        assert lat["n"] == c["completed"]
        if lat["n"]:
            assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"] <= lat["max"], (r["label"], lat)
            assert r["stages_ms"]["queue"]["p50"] >= 0
        assert len(r["samples"]["t_s"]) == len(r["samples"]["latency_ms"]) <= report["settings"]["keep_samples"]


# --------------------------------------------------------------------------------- scenarios


def test_single_stream_counts_exclude_the_warm_up(tiny: Path) -> None:
    made: list[Slowed] = []
    opts = BenchOptions(scenarios=("single-stream",), count=40, duration_s=30.0, repetitions=4, **{**FAST, "warmup": 7})
    r = run_bench(tiny, opts, wrap=_wrap(0.0, made))
    validate_report(r)
    _check_invariants(r)
    (row,) = r["scenarios"]["single-stream"]["rows"]
    assert row["counts"] == {"issued": 40, "completed": 40, "dropped": 0, "errors": 0, "late": 0}
    assert row["warmup"]["queries"] == 7
    assert made[0].calls == 7 + 40  # the model saw the warm-up; the counts did not
    assert [len(v) for v in row["repetitions"].values()] == [4, 4, 4]
    assert r["input"]["mode"] == "tensor" and r["variants"][0]["id"] == "fp32" and r["variant_selection"].startswith("selected")


def test_multi_stream_frames_drops_and_late_add_up(tiny: Path) -> None:
    # 30 ms per frame at 50 fps (a frame every 20 ms): each stream must drop frames, and every frame is late
    opts = BenchOptions(scenarios=("multi-stream",), streams=2, fps=50.0, duration_s=1.0, repetitions=2, **FAST)
    r = run_bench(tiny, opts, wrap=_wrap(0.03))
    _check_invariants(r)
    (row,) = r["scenarios"]["multi-stream"]["rows"]
    s, c = row["scenario"], row["counts"]
    assert s["frames_per_stream"] == [50, 50] and s["expected_frames_per_stream"] == 50  # fps x duration per stream
    assert c["issued"] == 100
    assert [d + k for d, k in zip(s["dropped_per_stream"], s["completed_per_stream"])] == [50, 50]  # no errors here
    assert c["dropped"] > 0 and c["late"] > 0 and s["deadline_ms"] == pytest.approx(20.0)
    assert s["dropped_pct"] == pytest.approx(100.0 * c["dropped"] / c["issued"], abs=1e-3)
    # a fast model at another rate: frames per stream still follow rate x duration
    r2 = run_bench(tiny, BenchOptions(scenarios=("multi-stream",), streams=3, fps=40.0, duration_s=0.5, repetitions=1, **FAST))
    _check_invariants(r2)
    s2 = r2["scenarios"]["multi-stream"]["rows"][0]["scenario"]
    assert all(abs(n - 40.0 * 0.5) <= 1 for n in s2["frames_per_stream"]) and len(s2["frames_per_stream"]) == 3


def test_server_open_loop_rate_and_latency_from_arrival(tiny: Path) -> None:
    opts = BenchOptions(scenarios=("server",), rate_qps=300.0, search=False, duration_s=1.0, repetitions=2, objective_ms=50.0, **FAST)
    r = run_bench(tiny, opts)
    validate_report(r)
    _check_invariants(r)
    (row,) = r["scenarios"]["server"]["rows"]
    s = row["scenario"]
    assert s["target_rate_qps"] == 300.0 and s["search"] is None and s["window_s"] == pytest.approx(1.0)
    assert abs(s["achieved_rate_qps"] - 300.0) / 300.0 < 0.15  # Poisson, seeded: about 300 arrivals in 1 s
    assert row["counts"]["issued"] == round(s["achieved_rate_qps"] * s["window_s"])
    lat = row["latency_ms"]
    assert s["latency_at_objective_ms"] == pytest.approx(lat["p99"], rel=1e-3)
    assert s["meets_objective"] == (row["counts"]["dropped"] == 0 and lat["p99"] <= 50.0)
    # latency counts from the arrival: never less than the queue wait plus the call
    assert lat["mean"] >= row["stages_ms"]["service"]["mean"] - 1e-3


def test_server_search_is_bounded_and_brackets_the_capacity(tiny: Path) -> None:
    service_s = 0.004  # the wrapper's sleep: about 250 queries/s at most with one worker
    opts = BenchOptions(scenarios=("server",), objective_ms=40.0, probe_s=0.3, max_probes=5, duration_s=0.4, repetitions=1, **FAST)
    t0 = time.perf_counter()
    r = run_bench(tiny, opts, wrap=_wrap(service_s))
    took = time.perf_counter() - t0
    _check_invariants(r)
    s = r["scenarios"]["server"]["rows"][0]["scenario"]
    se = s["search"]
    assert 1 <= len(se["probes"]) <= 5
    assert se["max_rate_qps"] is not None and 0 < se["max_rate_qps"] < 1.5 / service_s
    assert se["max_rate_qps"] == max(p["rate_qps"] for p in se["probes"] if p["meets"])
    assert s["target_rate_qps"] == pytest.approx(0.8 * se["max_rate_qps"], rel=1e-3)  # one common rate for every target
    assert took < 5 * (0.3 + 0.25 + 1.0) + 10  # probes bounded in count and time


def test_offline_batches_or_a_worker_pool(tiny: Path, tiny_fixed: Path) -> None:
    r = run_bench(tiny, BenchOptions(scenarios=("offline",), count=48, repetitions=2, **FAST))
    _check_invariants(r)
    (row,) = r["scenarios"]["offline"]["rows"]
    assert row["scenario"]["mode"] == "batch" and row["scenario"]["batch"] == 8 and row["scenario"]["queries_per_repetition"] == 24
    assert row["counts"]["issued"] == row["counts"]["completed"] == 48 and row["throughput_qps"] > 0
    r2 = run_bench(tiny_fixed, BenchOptions(scenarios=("offline",), count=20, repetitions=2, offline_workers=2, **FAST))
    _check_invariants(r2)
    (row2,) = r2["scenarios"]["offline"]["rows"]
    assert row2["scenario"]["mode"] == "pool" and row2["scenario"]["workers"] == 2
    assert row2["counts"]["issued"] == row2["counts"]["completed"] == 20


def test_report_schema_refuses_a_broken_report(tiny: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    r = run_bench(tiny, BenchOptions(scenarios=("single-stream",), count=10, repetitions=2, **FAST))
    jsonschema.validate(r, load_schema())
    broken = copy.deepcopy(r)
    del broken["scenarios"]["single-stream"]["rows"][0]["counts"]["issued"]
    with pytest.raises(BenchError, match="counts"):
        validate_report(broken)
    broken = copy.deepcopy(r)
    broken["package"]["manifest_sha256"] = "not-a-digest"
    with pytest.raises(BenchError, match="manifest_sha256"):
        validate_report(broken)


def test_remote_model_reports_a_remote_stage(demo_package: Path) -> None:
    from remote_faults import FaultServer, package_model

    with FaultServer(model=package_model(demo_package)) as srv:
        opts = BenchOptions(scenarios=("single-stream",), variants=("fp32-onnx",), remote_url=srv.url, count=10, repetitions=2, **FAST)
        r = run_bench(demo_package, opts)
    validate_report(r)
    local, remote = r["scenarios"]["single-stream"]["rows"]
    assert local["arm"] == "sdk" and "inference" in local["stages_ms"] and "remote" not in local["stages_ms"]
    assert remote["label"] == "fp32-onnx [remote]" and remote["arm"] == "remote" and remote["stages_ms"]["remote"]["p50"] > 0
    assert "inference" not in remote["stages_ms"] and remote["counts"]["completed"] == 10
    assert r["remote"]["url"] == srv.url and r["remote"]["runtime"].startswith("kserve-v2")


def test_temperature_power_and_energy_from_a_device_tree(tiny: Path, tmp_path: Path) -> None:
    """A recorded Jetson Orin sysfs (47.875 C; VDD_IN 5.064 V x 1.296 A): the run reports what it
    reads, energy = board power x busy time / completed queries, and the plot draws the temperature."""
    import shutil

    root = tmp_path / "orin"
    shutil.copytree(ROOT / "tests" / "fixtures" / "budget" / "jetson-orin-nano-jp6", root)
    opts = BenchOptions(
        scenarios=("single-stream",),
        duration_s=0.6,
        repetitions=2,
        root=str(root),
        profile="jetson-orin-nano",
        **{**FAST, "sample_interval_s": 0.05},
    )
    r = run_bench(tiny, opts)
    validate_report(r)
    assert r["sensors"]["temperature_available"] and r["sensors"]["power_available"] and r["warnings"] == []
    res = r["scenarios"]["single-stream"]["rows"][0]["resources"]
    assert res["samples"] >= 2 and res["temp_c"] == {"min": 47.875, "max": 47.875, "mean": 47.875}
    assert res["power_w_mean"] == pytest.approx(5.064 * 1.296, rel=1e-5) and res["governor_states"] == ["normal"]
    completed = r["scenarios"]["single-stream"]["rows"][0]["counts"]["completed"]
    assert 0 < res["busy_s"] <= 0.6 + 0.1
    assert res["energy_per_inference_j"] == pytest.approx(res["power_w_mean"] * res["busy_s"] / completed, rel=1e-3)
    assert any(s["temp_c"] == 47.875 for s in r["timeline"])
    pytest.importorskip("matplotlib")
    from edge_sdk.bench.plot import write_plot

    assert write_plot(r, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------------- cold start


def test_cold_start_with_a_clear_and_a_warm_optimised_model_cache(demo_package: Path, tmp_path: Path) -> None:
    got = measure_cold_start(str(demo_package), "fp32-onnx", samples=1, input_mode="tensor", seed=0, threads=1, work_dir=tmp_path)
    (clear,), (warm,) = got["clear"], got["warm"]
    assert clear["optimized_cache"].startswith("written ") and not clear["cache_used"]
    assert warm["optimized_cache"].startswith("hit ") and warm["cache_used"]
    assert warm["cache_file"] == clear["cache_file"] and Path(warm["cache_file"]).is_file()  # the warm run really read that file
    assert Path(warm["cache_file"]).with_suffix(".sha256").is_file()
    for run in (clear, warm):
        assert run["cold_start_ms"] == pytest.approx(run["open_ms"] + run["load_ms"] + run["first_inference_ms"], rel=1e-6)
        assert run["first_inference_ms"] > 0 and run["process_ms"] > run["cold_start_ms"]


# --------------------------------------------------------------------------------- compare


def test_compare_flags_a_real_difference_and_calls_equal_runs_within_noise(tiny: Path, tmp_path: Path, capsys: Any) -> None:
    from edge_sdk.bench.report import write_json
    from edge_sdk.cli import main

    opts = BenchOptions(scenarios=("single-stream",), count=25, duration_s=30.0, repetitions=5, **FAST)
    # a 20 ms service time dwarfs scheduler jitter (the 5 % effect floor is 1 ms); twice that is a real difference
    a = run_bench(tiny, opts, wrap=_wrap(0.020))
    b = run_bench(tiny, opts, wrap=_wrap(0.020))
    slow = run_bench(tiny, opts, wrap=_wrap(0.040))
    same = compare_reports(a, b)
    assert same["significant"] == 0 and same["settings"] == [] and same["digests"] == []
    assert all(m["verdict"].startswith("within noise") for m in same["metrics"])
    diff = compare_reports(a, slow)
    p50 = next(m for m in diff["metrics"] if m["metric"] == "latency_p50_ms")
    assert p50["significant"] and p50["verdict"] == "worse (significant)" and p50["change_pct"] > 50
    qps = next(m for m in diff["metrics"] if m["metric"] == "throughput_qps")
    assert qps["significant"] and qps["better"] is False
    changed = copy.deepcopy(b)
    changed["settings"]["seed"] = 1
    changed["variants"][0]["sha256"] = "f" * 64
    c = compare_reports(a, changed)
    assert {"what": "seed", "a": 0, "b": 1} in c["settings"] and c["digests"][0]["what"] == "variant fp32 sha256"
    # the CLI
    pa, pb, ps = (write_json(x, tmp_path / f"{n}.json") for n, x in (("a", a), ("b", b), ("slow", slow)))
    assert main(["bench", "--compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "settings: identical" in out and "0 significant difference(s)" in out and "within noise" in out
    assert main(["bench", "--compare", str(pa), str(ps), "--json", str(tmp_path / "cmp.json")]) == 0
    out = capsys.readouterr().out
    assert "worse (significant)" in out and json.loads((tmp_path / "cmp.json").read_text())["significant"] >= 2


# --------------------------------------------------------------------------------- plot and CLI


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from edge_sdk.bench.plot import write_plot
    from edge_sdk.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(MissingDependencyError, match=r"edge-sdk\[converter\]"):
        write_plot({}, tmp_path / "x.png")


def test_cli_end_to_end_on_the_demo_package(demo_package: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    mpl_image = pytest.importorskip("matplotlib.image")
    out_json, out_png = tmp_path / "run.json", tmp_path / "run.png"
    cmd = [
        sys.executable, "-m", "edge_sdk.cli", "bench", str(demo_package), "--variant", "fp32-onnx", "--variant", "fp32-tflite",
        "--vs-raw", "--scenario", "all", "--duration-s", "0.4", "--repetitions", "2", "--warmup", "3", "--probe-s", "0.2",
        "--max-probes", "3", "--streams", "2", "--fps", "20", "--cold-samples", "1", "--threads", "1", "--json", str(out_json),
        "--plot", str(out_png), "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    for head in ("== single-stream", "== multi-stream", "== server", "== offline", "== cold start", "== SDK vs raw runtime"):
        assert head in p.stdout
    report = json.loads(out_json.read_text())
    jsonschema.validate(report, load_schema())
    _check_invariants(report)
    assert list(report["scenarios"]) == ["single-stream", "multi-stream", "server", "offline"]
    labels = [r["label"] for r in report["scenarios"]["offline"]["rows"]]
    assert labels == ["fp32-onnx", "fp32-tflite", "fp32-onnx [raw]", "fp32-tflite [raw]"]
    from edge_sdk.package import ModelPackage

    man = ModelPackage.open(demo_package).manifest
    assert {v["id"]: v["sha256"] for v in report["variants"]} == {
        v.id: man.variant(v.id).sha256 for v in man.variants if v.id != "int8-onnx"
    }
    assert report["settings"]["seed"] == 0 and report["command"][:2] == ["bench", str(demo_package)]
    assert report["sensors"]["temperature_available"] or report["sensors"]["temperature_unknown_reason"]
    cold = {(c["variant"], c["cache"]): c for c in report["cold_start"]}
    assert cold[("fp32-onnx", "warm")]["cache_used"] == [True] and cold[("fp32-onnx", "clear")]["cache_used"] == [False]
    assert cold[("fp32-tflite", "warm")]["cache_state"].startswith("n/a")
    assert [o["variant"] for o in report["overhead"]] == ["fp32-onnx", "fp32-tflite"]
    assert report["overhead"][0]["session_options_mismatches"] == [] and report["overhead"][0]["ratio"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpl_image.imread(str(out_png))
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200 and np.isfinite(img).all()


def test_cli_usage_errors(tmp_path: Path, capsys: Any) -> None:
    from edge_sdk.cli import main

    assert main(["bench"]) == 2
    assert "PACKAGE is required" in capsys.readouterr().err
    assert main(["bench", str(tmp_path), "--scenario", "nope"]) == 2
    assert "unknown ['nope']" in capsys.readouterr().err
    assert main(["bench", str(tmp_path), "--scenario", "server", "--no-search"]) == 2
    assert "--no-search needs --rate" in capsys.readouterr().err
