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
