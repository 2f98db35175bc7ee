"""Copy the converter corpus's measurements into the model catalog.

``tools/bench/bench_corpus.py`` runs ``edge-convert quantize`` over the converter corpus
(tools/fixtures/corpus.py) and writes ``tools/bench/results/corpus_<machine>.json``. For every corpus
model that is also a catalog entry (same name, and the same file: fetch_pretrained's pinned sha256
equals the catalog member's), this writes the entry's ``converter`` table in
``edge_sdk/assets/catalog.json``: per variant other than the fp32 reference, its outcome (written or
refused), its quality figure against fp32 (the first gate figure it failed, else the task's figure:
box recall, mask IoU, top-1 agreement, sequence exact match; else cosine), its size ratio and speed-up
against the fp32 ONNX variant and its gate failures, with the machine and date of the run. Entries
the corpus does not cover lose a stale table. ``edge-sdk models catalog`` shows them.

Usage::

    python tools/catalog_measurements.py            # rewrite the catalog's tables from the JSON
    python tools/catalog_measurements.py --check    # exit 1 (and say which) when they differ
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CATALOG = ROOT / "edge_sdk" / "assets" / "catalog.json"
CORPUS = ROOT / "tools" / "bench" / "results" / f"corpus_{platform.machine()}.json"
#: The quality figure a variant is summarised by, in this order (the task gates' figures, then cosine).
FIGURES = ("box_recall", "mask_iou", "top1_agreement", "sequence_exact_match", "edit_distance", "cosine")
REFERENCE = "fp32-onnx"


def _round(x: Any, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def _figure(quality: Mapping[str, Any] | None, failures: list[str]) -> tuple[str | None, float | None]:
    q = dict(quality or {})
    for f in failures:  # "box_recall 0.465025 < 0.9": the figure that failed
        key = f.split(" ", 1)[0]
        if key in q:
            return key, _round(q[key])
    for key in FIGURES:
        if q.get(key) is not None:
            return key, _round(q[key])
    return None, None


def _machine(env: Mapping[str, Any]) -> str:
    cpu = env.get("cpu", {})
    flags = [k for k, on in (cpu.get("flags") or {}).items() if on]
    return f"{cpu.get('machine') or '?'} {cpu.get('cpu_model') or 'unknown CPU'} x{cpu.get('cpu_count') or '?'}" + (f" ({', '.join(flags)})" if flags else "")


def measurements(row: Mapping[str, Any], env: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The catalog's ``converter`` table for one corpus row (``bench_corpus._row``) of a run in environment ``env``."""
    out: dict[str, Any] = {"source": source, "measured": str(env.get("started", "")), "machine": _machine(env), "onnxruntime": str(env.get("onnxruntime", ""))}
    if row.get("error"):
        out["error"] = str(row["error"])
    variants: dict[str, Any] = {}
    for vid, v in (row.get("variants") or {}).items():
        if vid == REFERENCE:
            continue
        failures = [str(f) for f in v.get("gate_failures") or []]
        metric, value = _figure(v.get("quality"), failures)
        variants[vid] = {
            "outcome": "written" if v.get("written") else "refused", "metric": metric, "value": value,
            "size_ratio": _round(v.get("size_ratio"), 3), "speedup": _round(v.get("speedup"), 3), "gate_failures": failures,
        }  # fmt: skip
    out["variants"] = variants
    return out


def expected(corpus_path: Path = CORPUS, catalog_path: Path = CATALOG) -> dict[str, dict[str, Any]]:
    """Catalog name -> the ``converter`` table the corpus JSON gives it (only names the corpus covers, for the same file)."""
    from tools.fixtures.fetch_pretrained import AUX_MODELS, MODELS

    corpus = json.loads(corpus_path.read_text(encoding="utf-8"))
    catalog = json.loads(catalog_path.read_text(encoding="utf-8"))["models"]
    try:
        source = corpus_path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        source = str(corpus_path)
    want: dict[str, dict[str, Any]] = {}
    for row in corpus["models"]:
        name = row["model"]
        pin = MODELS.get(name) or AUX_MODELS.get(name)
        if name in catalog and pin is not None and pin.sha256 == catalog[name]["member"]["sha256"]:
            want[name] = measurements(row, corpus["environment"], source)
    return want


def sync(corpus_path: Path = CORPUS, catalog_path: Path = CATALOG, *, write: bool = True) -> list[str]:
    """Make the catalog's ``converter`` tables what the corpus JSON says; returns the names that changed
    (``write=False``: only says so)."""
    data = json.loads(catalog_path.read_text(encoding="utf-8"))
    want = expected(corpus_path, catalog_path)
    changed = []
    for name, entry in data["models"].items():
        new = want.get(name)
        if entry.get("converter") != new:
            changed.append(name)
            if new is None:
                entry.pop("converter", None)
            else:
                entry["converter"] = new
    if changed and write:
        catalog_path.write_text(json.dumps(data, indent=1), encoding="utf-8")  # the file's own layout
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS, help=f"the corpus results (default {CORPUS.relative_to(ROOT)})")
    ap.add_argument("--catalog", type=Path, default=CATALOG, help=f"the catalog to update (default {CATALOG.relative_to(ROOT)})")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when the catalog differs from the corpus")
    args = ap.parse_args(argv)
    changed = sync(args.corpus, args.catalog, write=not args.check)
    if args.check:
        print(f"out of date: {', '.join(changed)}" if changed else "the catalog's converter figures are the corpus's")
        return 1 if changed else 0
    print(f"updated {', '.join(changed)} in {args.catalog}" if changed else "nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
