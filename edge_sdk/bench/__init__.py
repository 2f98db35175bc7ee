"""``edge-sdk bench``: measure a model package on this device the way MLPerf Inference defines
its scenarios (single-stream, multi-stream, server, offline), compare variants, backends and the
raw runtime, and compare two runs.

::

    from edge_sdk.bench import BenchOptions, run_bench, render_text, compare_reports

    report = run_bench("shapes-classifier/", BenchOptions(scenarios=("single-stream", "offline"), all_variants=True))
    print(render_text(report))              # the table the CLI prints
    write_json(report, "run.json")          # follows edge_sdk/bench/schema.json
    write_plot(report, "run.png")           # needs matplotlib
    print(render_comparison(compare_reports(old, report)))

A text-generation package gets its own benchmarks: :mod:`edge_sdk.bench.generation` (one
stream: TTFT, TPOT, tokens/s, memory, ``--vs-raw`` onnxruntime-genai) and, with ``--scenario
offline|multi-stream|server``, :mod:`edge_sdk.bench.generation_load` (the generation engine under
load after MLPerf Inference's LLM rules: tokens/s with every request at once, closed-loop scaling
over stream counts and the TTFT of a request while others decode, and the highest Poisson rate
whose TTFT p99 and TPOT p99 meet the constraints)::

    from edge_sdk.bench.generation_load import GenerationLoadOptions, run_generation_load, render_generation_load_text

    report = run_generation_load("smollm2-135m/", GenerationLoadOptions(scenarios=("multi-stream",), streams=(1, 2, 4, 8)))

``docs/benchmarks/README.md`` explains the scenarios, the report and how to read a comparison.
The names below load on first use (``python -m edge_sdk.bench.coldstart`` must start light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # for type checkers and readers: the same names, imported eagerly
    from .coldstart import measure_cold_start
    from .compare import compare_reports, render_comparison
    from .options import SCENARIOS, BenchError, BenchOptions
    from .plot import write_plot
    from .report import SCHEMA_VERSION, load_schema, read_json, render_markdown, render_text, validate_report, write_json
    from .runner import run_bench, search_max_rate


_LAZY = {
    "BenchOptions": "options",
    "BenchError": "options",
    "SCENARIOS": "options",
    "run_bench": "runner",
    "search_max_rate": "runner",
    "render_text": "report",
    "render_markdown": "report",
    "write_json": "report",
    "read_json": "report",
    "load_schema": "report",
    "validate_report": "report",
    "SCHEMA_VERSION": "report",
    "compare_reports": "compare",
    "render_comparison": "compare",
    "write_plot": "plot",
    "measure_cold_start": "coldstart",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
