"""Variant selection: rules, ranking, reasons, forced variants."""

from __future__ import annotations

import dataclasses

import pytest

from edge_sdk import errors
from edge_sdk.backends.base import BackendStatus
from edge_sdk.package import Manifest
from edge_sdk.profiles import load_profile
from edge_sdk.selection import select_variant

ORT = BackendStatus("onnxruntime", True, "onnxruntime", "1.x")
LRT = BackendStatus("litert", True, "ai-edge-litert", "2.x")
NO_LRT = BackendStatus("litert", False, detail="pip install 'edge-sdk[litert]'")


def manifest(*variants: tuple[str, str, str, int, float | None]) -> Manifest:
    return Manifest.from_dict(
        {
            "schema": 1, "name": "m", "version": "1", "task": "raw",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}],
            "variants": [
                {"id": vid, "file": f"{vid}.bin", "backend": be, "precision": prec, "sha256": "a" * 64, "size": size,
                 **({"quality": {"cosine": cos}} if cos is not None else {})}
                for vid, be, prec, size, cos in variants
            ],
        }  # fmt: skip
    )


M = manifest(
    ("fp32-onnx", "onnxruntime", "fp32", 4_000_000, None),
    ("int8-onnx", "onnxruntime", "int8", 1_000_000, 0.999),
    ("int8-tfl", "litert", "int8", 1_000_000, 0.998),
    ("fp16-onnx", "onnxruntime", "fp16", 2_000_000, 0.9999),
    ("int4-onnx", "onnxruntime", "int4", 600_000, 0.95),
)
BOTH = {"onnxruntime": ORT, "litert": LRT}

# (profile, backends, options, expected choice, why)
CASES = [
    ("generic-x86_64", BOTH, {}, "int8-onnx", "int8 first; onnxruntime before litert on x86"),
    ("raspberry-pi-4", BOTH, {}, None, "int8 first; the Pi profile's backend order decides"),
    ("jetson-orin-nano", BOTH, {}, None, "fp16 first on a GPU board"),
    ("generic-x86_64", BOTH, {"min_cosine": 0.9995}, "fp32-onnx", "quality gate rejects both int8 variants"),
    ("generic-x86_64", BOTH, {"memory_budget_mb": 3.0}, "int8-onnx", "fp32 (7.6 MiB) over budget, int8 fits"),
    ("generic-x86_64", {"onnxruntime": ORT, "litert": NO_LRT}, {"variant": "fp32-onnx"}, "fp32-onnx", "forced"),
]


@pytest.mark.parametrize("profile,backends,opts,want,why", CASES)
def test_selection_table(profile, backends, opts, want, why) -> None:
    p = load_profile(profile)
    sel = select_variant(M, p, backends, **opts)
    if want is None:  # derive from the profile itself, so the test follows the vendor-sourced order
        rt = p.runtime
        ok = [v for v in M.variants if v.precision in rt.precisions and (opts.get("min_cosine") is None)]
        want = min(ok, key=lambda v: (rt.precisions.index(v.precision), rt.backends.index(v.backend))).id
    assert sel.variant_id == want, (why, sel.explain())
    assert len(sel.candidates) == len(M.variants)
    assert all(c.reasons for c in sel.candidates)  # every candidate says why
    assert want in sel.explain()


def test_reasons_name_the_rule() -> None:
    p = load_profile("generic-x86_64")
    sel = select_variant(M, p, {"onnxruntime": ORT, "litert": NO_LRT}, memory_budget_mb=3.0, min_cosine=0.99)
    by = {c.variant_id: c for c in sel.candidates}
    assert not by["int8-tfl"].accepted and any("not available" in r for r in by["int8-tfl"].reasons)
    assert not by["fp32-onnx"].accepted and any("over the 3 MiB budget" in r for r in by["fp32-onnx"].reasons)
    assert not by["int4-onnx"].accepted
    assert any("precision int4 not in the profile" in r or "below the 0.99 gate" in r for r in by["int4-onnx"].reasons)


def test_tie_between_backends_is_reported_and_measurement_decides() -> None:
    p = load_profile("generic-x86_64")
    sel = select_variant(M, p, BOTH)
    assert [c.variant_id for c in sel.tied] == ["int8-tfl"]
    m = sel.with_measurement({"int8-onnx": 2.0, "int8-tfl": 1.5}, "test")
    assert m.variant_id == "int8-tfl" and m.measured
    assert any("fastest" in r for r in m.chosen.reasons)
    m2 = sel.with_measurement({"int8-onnx": 1.0, "int8-tfl": 1.5}, "test")
    assert m2.variant_id == "int8-onnx"


def test_nothing_fits_explains_each_variant() -> None:
    p = dataclasses.replace(load_profile("generic-x86_64"))
    with pytest.raises(errors.SelectionError) as ei:
        select_variant(M, p, BOTH, memory_budget_mb=0.5)
    for vid in ("fp32-onnx", "int8-onnx", "int4-onnx"):
        assert vid in str(ei.value)


def test_forced_variant_errors() -> None:
    p = load_profile("generic-x86_64")
    with pytest.raises(errors.SelectionError, match="not in package m"):
        select_variant(M, p, BOTH, variant="nope")
    with pytest.raises(errors.SelectionError, match="cannot run here"):
        select_variant(M, p, {"onnxruntime": ORT, "litert": NO_LRT}, variant="int8-tfl")


def _with(m: Manifest, vid: str, **fields) -> Manifest:
    return dataclasses.replace(m, variants=tuple(dataclasses.replace(v, **fields) if v.id == vid else v for v in m.variants))


def test_gate_failed_variant_is_skipped_unless_asked_for() -> None:
    from edge_sdk.package import Gate

    m = _with(M, "int8-onnx", gate=Gate(False, (("cosine", 0.99),), ("cosine 0.95 < 0.99",), forced=True))
    p = load_profile("generic-x86_64")
    sel = select_variant(m, p, {"onnxruntime": ORT, "litert": NO_LRT})
    assert sel.variant_id == "fp32-onnx"
    bad = next(c for c in sel.candidates if c.variant_id == "int8-onnx")
    assert not bad.accepted and any("failed its quality gate" in r and "cosine 0.95 < 0.99" in r for r in bad.reasons)
    assert select_variant(m, p, {"onnxruntime": ORT, "litert": NO_LRT}, variant="int8-onnx").variant_id == "int8-onnx"


def test_benchmarks_measured_slower_than_reference_are_ranked_after_it() -> None:
    from edge_sdk.package import Benchmark

    m = _with(M, "fp32-onnx", reference=True)
    # int8 measured slower than fp32 on this profile (e.g. Arm without dot product)
    m = _with(m, "int8-onnx", benchmarks=(Benchmark("raspberry-pi-4", 12.0, 4, 1, 9.0),))
    p = load_profile("raspberry-pi-4")
    sel = select_variant(m, p, {"onnxruntime": ORT, "litert": NO_LRT})
    assert sel.variant_id == "fp32-onnx", sel.explain()
    assert any("measured slower than the reference" in r for r in next(c for c in sel.candidates if c.variant_id == "int8-onnx").reasons)
    # a benchmark for another profile changes nothing
    m2 = _with(M, "int8-onnx", benchmarks=(Benchmark("raspberry-pi-5", 12.0, 4, 1, 9.0),))
    assert select_variant(m2, p, {"onnxruntime": ORT, "litert": NO_LRT}).variant_id == "int8-onnx"


def test_benchmarks_for_every_candidate_pick_the_fastest() -> None:
    from edge_sdk.package import Benchmark

    m = manifest(("fp32-onnx", "onnxruntime", "fp32", 4_000_000, None), ("int8-onnx", "onnxruntime", "int8", 1_000_000, 0.999))
    m = _with(m, "fp32-onnx", benchmarks=(Benchmark("generic-x86_64", 5.0, 2),))
    m = _with(m, "int8-onnx", benchmarks=(Benchmark("generic-x86_64", 2.5, 2),))
    p = load_profile("generic-x86_64")
    assert select_variant(m, p, {"onnxruntime": ORT}).variant_id == "int8-onnx"
    m = _with(m, "int8-onnx", benchmarks=(Benchmark("generic-x86_64", 6.0, 2),))
    sel = select_variant(m, p, {"onnxruntime": ORT})
    assert sel.variant_id == "fp32-onnx" and any("measured 5.000 ms" in r for r in sel.chosen.reasons)


def test_gate_and_benchmark_manifest_fields_round_trip() -> None:
    from edge_sdk import _toml

    d = {
        "schema": 1, "name": "m", "version": "1", "task": "raw",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}],
        "variants": [{"id": "a", "file": "a.onnx", "backend": "onnxruntime", "precision": "int8", "sha256": "a" * 64, "size": 1,
                      "gate": {"passed": False, "forced": True, "thresholds": {"cosine": 0.99}, "failures": ["cosine 0.9 < 0.99"]},
                      "benchmarks": [{"profile": "generic-x86_64", "latency_ms": 1.5, "threads": 2, "reference_latency_ms": 2.0}],
                      "quality": {"cosine": 0.9, "max_abs_error": 0.3, "top5_agreement": 1.0}}],
    }  # fmt: skip
    m = Manifest.from_dict(d)
    assert Manifest.from_dict(_toml.loads(m.to_toml())) == m
    d["variants"][0]["gate"]["forced"] = False  # a failed gate without --force cannot be in a package
    with pytest.raises(errors.ManifestError, match="only be in a package when forced"):
        Manifest.from_dict(d)
    d["variants"][0]["gate"] = {"passed": True, "thresholds": {"speed": 1.0}}
    with pytest.raises(errors.ManifestError, match="not a quality figure"):
        Manifest.from_dict(d)


# -- selection by measurement: recorded on a matching machine, or timed here ----------------------

VNNI = "x86_64 Intel Xeon x2 (avx512_vnni, avx512f, avx2)"
AVX2 = "x86_64 AMD EPYC x2 (avx2)"


def _two() -> Manifest:
    m = manifest(("fp32-onnx", "onnxruntime", "fp32", 4_000_000, None), ("int8-onnx", "onnxruntime", "int8", 1_000_000, 0.999))
    return _with(m, "fp32-onnx", reference=True)


def test_machine_class_reads_what_describe_machine_writes() -> None:
    from edge_sdk.profiles import HardwareFacts
    from edge_sdk.selection import describe_machine, machine_class, same_machine_class

    f = HardwareFacts(machine="x86_64", cpu_model="Xeon", cpu_count=2, cpu_features=frozenset({"avx2", "avx512_vnni", "sse4_2"}))
    d = describe_machine(f)
    assert machine_class(d) == ("x86_64", frozenset({"avx2", "avx512_vnni"}))
    assert same_machine_class(d, d) and not same_machine_class(d, AVX2)
    assert not same_machine_class(d, d.replace("x86_64", "aarch64", 1)) and machine_class("") is None
    # a string from an older converter that listed fewer features is compared on those it could list
    assert same_machine_class("x86_64 Xeon x4 (avx512_vnni, avx2)", "x86_64 Xeon x2 (amx_int8, avx512_vnni, avx512f, avx2)")


def test_lighter_winner_without_a_matching_measurement_is_unproven() -> None:
    p = load_profile("generic-x86_64")
    sel = select_variant(_two(), p, {"onnxruntime": ORT}, machine=VNNI)
    assert sel.variant_id == "int8-onnx" and sel.unproven == ("fp32-onnx",)
    assert [c.variant_id for c in sel.to_time] == ["fp32-onnx"]
    assert "timed against fp32-onnx on this device" in sel.explain()
    # without a machine (the old call) nothing is unproven
    assert select_variant(_two(), p, {"onnxruntime": ORT}).to_time == ()


def test_recorded_benchmark_counts_only_on_the_same_cpu_class() -> None:
    from edge_sdk.package import Benchmark

    p = load_profile("generic-x86_64")
    # int8 measured slower than fp32 on an AVX2-only machine (no VNNI: no fast int8 dot product)
    m = _with(_two(), "int8-onnx", benchmarks=(Benchmark("generic-x86_64", 6.0, 2, 1, 5.0, AVX2),))
    on_avx2 = select_variant(m, p, {"onnxruntime": ORT}, machine=AVX2)
    assert on_avx2.variant_id == "fp32-onnx" and on_avx2.to_time == ()
    assert any("when packaged" in r and AVX2 in r for r in next(c for c in on_avx2.candidates if c.variant_id == "int8-onnx").reasons)
    # the same package on a VNNI machine: the AVX2 figure does not speak for it, so int8 must be timed here
    on_vnni = select_variant(m, p, {"onnxruntime": ORT}, machine=VNNI)
    assert on_vnni.variant_id == "int8-onnx" and on_vnni.unproven == ("fp32-onnx",)
    # a benchmark without a machine counts for a board profile (the board fixes its CPU), not for a generic one
    m2 = _with(_two(), "int8-onnx", benchmarks=(Benchmark("raspberry-pi-4", 12.0, 4, 1, 9.0),))
    assert select_variant(m2, load_profile("raspberry-pi-4"), {"onnxruntime": ORT}, machine="aarch64 Cortex-A72 x4").variant_id == "fp32-onnx"
    m3 = _with(_two(), "int8-onnx", benchmarks=(Benchmark("generic-x86_64", 12.0, 4, 1, 9.0),))
    assert select_variant(m3, p, {"onnxruntime": ORT}, machine=VNNI).unproven == ("fp32-onnx",)


def test_measurement_prefers_the_more_precise_within_the_noise_margin() -> None:
    p = load_profile("generic-x86_64")
    sel = select_variant(_two(), p, {"onnxruntime": ORT}, machine=VNNI)
    close = sel.with_measurement({"int8-onnx": 1.00, "fp32-onnx": 1.02}, "test")
    assert close.variant_id == "fp32-onnx" and close.measured and close.to_time == ()
    assert any("more precise" in r for r in close.chosen.reasons)
    faster = sel.with_measurement({"int8-onnx": 0.50, "fp32-onnx": 1.00}, "test")
    assert faster.variant_id == "int8-onnx" and any("fastest" in r for r in faster.chosen.reasons)
    slower = sel.with_measurement({"int8-onnx": 1.30, "fp32-onnx": 1.00}, "test")
    assert slower.variant_id == "fp32-onnx"


def test_recorded_benchmarks_for_all_prefer_the_more_precise_within_the_margin() -> None:
    from edge_sdk.package import Benchmark

    m = _with(_two(), "fp32-onnx", benchmarks=(Benchmark("generic-x86_64", 5.0, 2, 1, None, VNNI),))
    m = _with(m, "int8-onnx", benchmarks=(Benchmark("generic-x86_64", 4.95, 2, 1, 5.0, VNNI),))
    p = load_profile("generic-x86_64")
    assert select_variant(m, p, {"onnxruntime": ORT}, machine=VNNI).variant_id == "fp32-onnx"
    m = _with(m, "int8-onnx", benchmarks=(Benchmark("generic-x86_64", 3.0, 2, 1, 5.0, VNNI),))
    assert select_variant(m, p, {"onnxruntime": ORT}, machine=VNNI).variant_id == "int8-onnx"


def test_load_times_an_unproven_choice_once_and_caches_it(tmp_path) -> None:
    """The demo package records no benchmark: loading it times int8 against fp32 on this machine, keeps
    what the rule says for the measured figures, and the next load reuses the cached measurement."""
    import json

    import edge_sdk
    from edge_sdk.assets import demo_package_path
    from edge_sdk.selection import SLOWER_MARGIN

    with edge_sdk.load(demo_package_path(), "generic-x86_64", cache_dir=tmp_path) as m:
        sel = m.selection
    assert sel.measured
    timed = {c.variant_id: c.measured_ms for c in sel.candidates if c.measured_ms is not None}
    assert set(timed) == {"int8-onnx", "fp32-onnx", "fp32-tflite"}  # every more precise variant, on either backend
    # the rule, on the figures it measured: within the margin of the fastest, the most bits, then the fastest
    close = [k for k in timed if timed[k] <= min(timed.values()) * SLOWER_MARGIN]
    want = min(close, key=lambda k: (k == "int8-onnx", timed[k]))
    assert sel.variant_id == want, sel.explain()
    assert "on this device" in sel.explain()
    stored = json.loads((tmp_path / "selection.json").read_text())
    assert list(stored.values()) == [timed]
    with edge_sdk.load(demo_package_path(), "generic-x86_64", cache_dir=tmp_path) as again:
        assert again.selection.variant_id == want and "cached measurement on this device" in again.selection.explain()
    with edge_sdk.load(demo_package_path(), "generic-x86_64", cache_dir=tmp_path / "b", measure_backends=False) as plain:
        assert plain.selection.variant_id == "int8-onnx" and not plain.selection.measured
        assert "not timed here (measure_backends=False)" in plain.selection.explain()
