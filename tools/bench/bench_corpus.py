"""Run the converter corpus (tools/fixtures/corpus.py) and tabulate it.

For each model: exporter (the ONNX file's producer_name/version and opset), task, input size,
the variants ``edge-convert quantize`` wrote and refused (with the gate failure or error), each
written variant's size relative to fp32, its speed-up against fp32 (the converter's own median
latencies on this machine) and its task metric on real check inputs. Writes
``tools/bench/results/corpus_<machine>.json`` and a markdown table: under the ``## Corpus``
heading of docs/converter.md when that heading exists, else docs/converter_corpus.md.
The CPU model, its flags and the load average before and after are recorded with the figures
(:func:`edge_sdk.bench.generation.cpu_facts`, :func:`~edge_sdk.bench.generation.environment`).

Usage::

    python tools/bench/bench_corpus.py [--only NAME ...] [--threads N] [--no-docs]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARK_START = "<!-- corpus table: written by tools/bench/bench_corpus.py -->"
MARK_END = "<!-- end corpus table -->"


def _row(run: Any) -> dict[str, Any]:
    e = run.entry
    out: dict[str, Any] = {
        "model": run.name, "exporter": e.exporter, "route": e.route, "producer": run.exporter, "task": e.task,
        "converter_task": e.convert_task, "targets": list(e.targets), "metric": e.metric, "seconds": round(run.seconds, 1),
        "error": run.error, "written": list(run.written), "refused": list(run.refused), "input_shapes": run.input_shapes,
        "variants": {},
    }  # fmt: skip
    rows = {r["id"]: r for r in run.report.get("variants", [])}
    ref = rows.get("fp32-onnx", {})
    for vid, r in rows.items():
        c = run.checks.get(vid)
        lat, rlat = r.get("latency_ms"), ref.get("latency_ms")
        out["variants"][vid] = {
            "written": r["written"], "size": r.get("size"), "size_ratio": round(r["size"] / ref["size"], 3) if r.get("size") and ref.get("size") else None,
            "latency_ms": lat, "speedup": round(rlat / lat, 3) if lat and rlat else None, "quality": r.get("quality"),
            "gate_failures": r["gate"]["failures"], "task_metric": None if c is None else round(c.metric, 4), "method": r.get("method"),
        }  # fmt: skip
    return out


def _cell(v: dict[str, Any]) -> str:
    bits = []
    if v["size_ratio"] is not None:
        bits.append(f"{v['size_ratio']:.2f}x size")
    if v["speedup"] is not None:
        bits.append(f"{v['speedup']:.2f}x speed")
    if v["task_metric"] is not None:
        bits.append(f"metric {v['task_metric']:.3f}")
    return ", ".join(bits)


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    cpu = env["cpu"]
    flags = ", ".join(k for k, on in cpu.get("flags", {}).items() if on) or "none"
    lines = [
        MARK_START,
        "",
        f"Measured {env['started']} on {cpu.get('cpu_model') or 'an unknown CPU'} ({cpu.get('machine')}, {cpu.get('cpu_count')} CPUs; "
        f"flags: {flags}), load average {env['loadavg_before']} before, {env['loadavg_after']} after; ONNX Runtime {env['onnxruntime']}. "
        "Size and speed are against the fp32 ONNX variant (the converter's median latencies on this machine); the metric is "
        "the model's task metric against fp32 on real inputs it was not calibrated on. `python tools/bench/bench_corpus.py` rewrites this table.",
        "",
        "| model | exporter (producer, opset) | task | input | written: size / speed / metric | refused (why) |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["models"]:
        p = r["producer"]
        prod = f"{r['exporter']} (`{p['producer_name'] or '-'}` {p['producer_version'] or ''}, opset {p['opset']})"
        if r["route"] != "ONNX as shipped":
            prod += f"; {r['route']}"
        shape = "; ".join("x".join(str(d) for d in s) for s in r["input_shapes"]) or "-"
        if r["error"]:
            lines.append(f"| {r['model']} | {prod} | {r['task']} | {shape} | converter error | `{r['error'][:160]}` |")
            continue
        written = "<br>".join(f"{vid}: {_cell(v)}" if vid != "fp32-onnx" else f"fp32-onnx ({r['metric']})" for vid, v in r["variants"].items() if v["written"])
        refused = "<br>".join(f"{vid}: {'; '.join(str(f) for f in v['gate_failures'])[:140]}" for vid, v in r["variants"].items() if not v["written"]) or "-"
        lines.append(f"| {r['model']} | {prod} | {r['task']} ({r['converter_task']}) | {shape} | {written} | {refused} |")
    lines += ["", MARK_END]
    return "\n".join(lines) + "\n"


def write_docs(table: str, docs: Path) -> Path:
    """Put ``table`` under ``## Corpus`` of docs/converter.md (replacing an earlier table), else into
    docs/converter_corpus.md."""
    conv = docs / "converter.md"
    text = conv.read_text(encoding="utf-8") if conv.is_file() else ""
    if "\n## Corpus" in text:
        if MARK_START in text and MARK_END in text:
            a, b = text.index(MARK_START), text.index(MARK_END) + len(MARK_END)
            text = text[:a] + table.rstrip("\n") + text[b:]
        else:
            i = text.index("\n## Corpus")
            j = text.index("\n", i + 1)
            text = text[: j + 1] + "\n" + table + text[j + 1 :]
        conv.write_text(text, encoding="utf-8")
        return conv
    out = docs / "converter_corpus.md"
    out.write_text("# Converter corpus\n\nReal pretrained models from different exporters through `edge-convert quantize` "
                   "(tools/fixtures/corpus.py; tested by tests/test_converter_corpus.py).\n\n" + table, encoding="utf-8")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    from edge_sdk.bench.generation import cpu_facts, environment
    from tools.fixtures.corpus import CORPUS, run_one

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="corpus model names (default: all)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "tools" / "bench" / "results" / f"corpus_{platform.machine()}.json")
    ap.add_argument("--no-docs", action="store_true", help="do not write the markdown table into docs/")
    args = ap.parse_args(argv)
    names = args.only or sorted(CORPUS)
    unknown = [n for n in names if n not in CORPUS]
    if unknown:
        ap.error(f"unknown corpus model(s) {unknown}; known: {sorted(CORPUS)}")
    started, t0, cpu = _dt.datetime.now(_dt.timezone.utc), time.perf_counter(), cpu_facts()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as tmp:
        for n in names:
            print(f"converting {n} ...", file=sys.stderr, flush=True)
            rows.append(_row(run_one(n, Path(tmp) / n, threads=args.threads)))
    la = [round(x, 2) for x in os.getloadavg()]
    report = {"environment": environment(started, time.perf_counter() - t0, "generic-x86_64", cpu, la), "models": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    table = markdown(report)
    print(table)
    if not args.no_docs:
        print(f"wrote {args.out} and {write_docs(table, ROOT / 'docs')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
