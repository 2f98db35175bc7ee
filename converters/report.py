"""The conversion report written into a package: ``report.json``, ``report.md``, ``report.png``.

:func:`write_report` validates a report mapping (schema below), then writes

* ``report.json`` -- the mapping itself, pretty-printed with sorted keys
  (strict JSON: a non-finite number such as a NaN cosine is written as
  ``null``; everything else round-trips exactly);
* ``report.md`` -- for people: the model, the machine, the calibration and
  validation data, one table row per variant (backend, precision, method,
  size, latency, speed-up, quality against the reference, gate result) and,
  per variant, why its gate failed and what was noted;
* ``report.png`` -- three bar panels (size, median latency, cosine vs the
  reference), bars colored by gate result, the reference hatched.  Drawn with
  matplotlib's object API on an Agg canvas created in the call, so neither
  importing this module nor calling it touches pyplot or the process-wide
  backend.

Schema (``?`` = optional key; values after ``|`` are alternatives)::

    {"model": {"name": str, "version": str, "task": str, "source": str|None, "source_sha256": str|None, ...},
     "machine": {"profile": str, "machine": str, "threads": int, ...},
     "reference": str,                       # id of one of the variants
     "calibration"?: {"source": str, "samples": int} | None,
     "validation"?: {"source": str, "samples": int} | None,
     "gate"?: {figure: number},              # the default thresholds, listed in report.md
     "notes"?: [str],                        # graph normalisation, assumed dim bounds (a section of report.md)
     "variants": [{
        "id": str, "backend": str, "precision": str, "file": str|None (never made), "size": int (bytes),
        "method": str, "written": bool,
        "quality": {cosine?, max_abs_error?, top1_agreement?, top5_agreement?, value?,
                    position_agreement?, sequence_exact_match?, edit_distance?, box_recall?, box_iou?, mask_iou?: number,
                    metric?: str, reference?: str, dataset?: str, samples?: int,
                    nonfinite_samples?: int},   # may be {}; nonfinite_samples: outputs NaN/inf where fp32's are finite
        "gate": {"passed": bool, "thresholds"?: {figure: number}, "failures"?: [str], "forced"?: bool},
        "latency_ms"?: number|None, "reference_latency_ms"?: number|None,
        "slower_than_reference"?: bool, "kept_float_nodes"?: [str], "notes"?: [str],
        "candidates"?: [{"method": str, "passed": bool, "chosen": bool, "quality": {figure: number},
                         "latency_ms"?: number|None, "reference_latency_ms"?: number|None, "error"?: str, "why"?: str}],
        "calibration"?: {"n_bins": int, "samples": int, "before": {ece, mce, brier, nll, ...},
                         "after"?: {...} | None, "temperature"?: number|None, "fitted"?: bool,
                         "fitted_on"?: str, "diagram"?: str}}, ...]}

A variant's ``calibration`` (classification with class labels; see
:mod:`converters.calibration_quality`) adds a "Calibration" table to
report.md, and its ``diagram`` (``reliability_<variant>.png``), a reliability
diagram drawn next to report.png.

``...`` marks where extra keys are welcome: they are kept in report.json,
and the machine's are listed in report.md (e.g. ``"python": "3.11.9"``).
Anywhere else an unknown key is refused (a misspelt variant, quality or gate
key would otherwise vanish from the report), as is a variant that failed its gate but was written without being
forced (or forced but not written).  Every problem raises ``ValueError``
naming the key, e.g. ``variants[2].gate.passed``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["REPORT_FILES", "gate_status", "render_markdown", "validate_report", "write_report"]

REPORT_FILES = {"json": "report.json", "md": "report.md", "png": "report.png"}

_TASK_NUMS = ("position_agreement", "sequence_exact_match", "edit_distance", "box_recall", "box_iou", "mask_iou")
_QUALITY_NUMS = ("cosine", "max_abs_error", "top1_agreement", "top5_agreement", "value", *_TASK_NUMS)
_QUALITY_KEYS = (*_QUALITY_NUMS, "metric", "reference", "dataset", "samples", "nonfinite_samples")
_VARIANT_REQUIRED = ("id", "backend", "precision", "file", "size", "method", "written", "quality", "gate")
_VARIANT_OPTIONAL = ("latency_ms", "reference_latency_ms", "slower_than_reference", "kept_float_nodes", "notes", "calibration", "candidates")
_CANDIDATE_KEYS = ("method", "passed", "chosen", "quality", "latency_ms", "reference_latency_ms", "error", "why")
_GATE_COLORS = {"PASS": "#2e7d32", "FAIL": "#c62828", "FORCED": "#ef6c00"}
_MAX_LISTED_NODES = 50


# --------------------------------------------------------------------------
# validation


class _Checker:
    """Type and key checks that raise ValueError naming the key's path."""

    @staticmethod
    def mapping(v: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            raise ValueError(f"report: {where or 'report'}: expected a mapping, got {type(v).__name__}")
        return v

    @staticmethod
    def keys(d: Mapping[str, Any], required: Sequence[str], optional: Sequence[str], where: str, *, extra_ok: bool = False) -> None:
        for k in required:
            if k not in d:
                raise ValueError(f"report: missing required key '{_join(where, k)}'")
        for k in d:
            if not isinstance(k, str):
                raise ValueError(f"report: key {k!r} in {where or 'the report'} is not a string")
        if extra_ok:
            return
        extra = sorted(str(k) for k in d if k not in required and k not in optional)
        if extra:
            raise ValueError(f"report: unknown key '{_join(where, extra[0])}' (allowed at {where or 'top level'}: {sorted([*required, *optional])})")

    @staticmethod
    def typed(v: Any, typ: type | tuple[type, ...], where: str, *, nullable: bool = False) -> Any:
        if v is None and nullable:
            return v
        types = typ if isinstance(typ, tuple) else (typ,)
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            names = " or ".join(t.__name__ for t in types) + (" or None" if nullable else "")
            raise ValueError(f"report: '{where}' must be {names}, got {type(v).__name__} {v!r}")
        return v

    def number(self, v: Any, where: str, *, nullable: bool = False, positive: bool = False) -> Any:
        self.typed(v, (int, float), where, nullable=nullable)
        if positive and v is not None and not (v > 0):  # also refuses NaN
            raise ValueError(f"report: '{where}' must be > 0, got {v!r}")
        return v

    def strings(self, v: Any, where: str) -> None:
        self.typed(v, (list, tuple), where)
        for i, s in enumerate(v):
            self.typed(s, str, f"{where}[{i}]")


def _thresholds(c: _Checker, th: Any, where: str) -> None:
    c.mapping(th, where)
    for k, x in th.items():
        if k not in _QUALITY_NUMS:
            raise ValueError(f"report: '{where}.{k}' is not a quality figure; expected one of {list(_QUALITY_NUMS)}")
        c.number(x, f"{where}.{k}")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def validate_report(report: Mapping[str, Any]) -> None:
    """Check ``report`` against the schema; raise ``ValueError`` naming the offending key."""
    c = _Checker()
    c.mapping(report, "")
    c.keys(report, ("model", "machine", "reference", "variants"), ("calibration", "validation", "gate"), "", extra_ok=True)
    model = c.mapping(report["model"], "model")
    c.keys(model, ("name", "version", "task", "source", "source_sha256"), (), "model", extra_ok=True)
    for k in ("name", "version", "task"):
        c.typed(model[k], str, f"model.{k}")
    for k in ("source", "source_sha256"):
        c.typed(model[k], str, f"model.{k}", nullable=True)
    machine = c.mapping(report["machine"], "machine")
    c.keys(machine, ("profile", "machine", "threads"), (), "machine", extra_ok=True)
    c.typed(machine["profile"], str, "machine.profile")
    c.typed(machine["machine"], str, "machine.machine")
    c.typed(machine["threads"], int, "machine.threads")
    for k in ("calibration", "validation"):
        data = report.get(k)
        if data is not None:
            c.mapping(data, k)
            c.keys(data, ("source", "samples"), (), k)
            c.typed(data["source"], str, f"{k}.source")
            c.typed(data["samples"], int, f"{k}.samples")
    if "gate" in report:
        _thresholds(c, report["gate"], "gate")
    if "notes" in report:
        c.strings(report["notes"], "notes")
    ref = c.typed(report["reference"], str, "reference")
    variants = c.typed(report["variants"], (list, tuple), "variants")
    if not variants:
        raise ValueError("report: 'variants' must list at least one variant")
    seen: set[str] = set()
    for i, v in enumerate(variants):
        w = f"variants[{i}]"
        c.mapping(v, w)
        c.keys(v, _VARIANT_REQUIRED, _VARIANT_OPTIONAL, w)
        vid = c.typed(v["id"], str, f"{w}.id")
        if vid in seen:
            raise ValueError(f"report: '{w}.id' repeats variant id {vid!r}")
        seen.add(vid)
        for k in ("backend", "precision", "method"):
            c.typed(v[k], str, f"{w}.{k}")
        c.typed(v["file"], str, f"{w}.file", nullable=True)  # None: the variant was never made
        size = c.typed(v["size"], int, f"{w}.size")
        if size < 0:
            raise ValueError(f"report: '{w}.size' must be >= 0 bytes, got {size}")
        written = c.typed(v["written"], bool, f"{w}.written")
        q = c.mapping(v["quality"], f"{w}.quality")
        c.keys(q, (), _QUALITY_KEYS, f"{w}.quality")
        for k in _QUALITY_NUMS:
            if k in q:
                c.number(q[k], f"{w}.quality.{k}", nullable=True)
        for k in ("metric", "reference", "dataset"):
            if k in q:
                c.typed(q[k], str, f"{w}.quality.{k}", nullable=True)
        if "samples" in q:
            c.typed(q["samples"], int, f"{w}.quality.samples", nullable=True)
        g = c.mapping(v["gate"], f"{w}.gate")
        c.keys(g, ("passed",), ("thresholds", "failures", "forced"), f"{w}.gate")
        passed = c.typed(g["passed"], bool, f"{w}.gate.passed")
        _thresholds(c, g.get("thresholds", {}), f"{w}.gate.thresholds")
        c.strings(g.get("failures", []), f"{w}.gate.failures")
        forced = c.typed(g.get("forced", False), bool, f"{w}.gate.forced")
        if not passed and written != forced:
            why = "written to the package without gate.forced" if written else "forced but not written"
            raise ValueError(f"report: '{w}.gate' failed and the variant was {why}; a failed variant is written exactly when forced")
        c.number(v.get("latency_ms"), f"{w}.latency_ms", nullable=True, positive=True)
        c.number(v.get("reference_latency_ms"), f"{w}.reference_latency_ms", nullable=True, positive=True)
        if "slower_than_reference" in v:
            c.typed(v["slower_than_reference"], bool, f"{w}.slower_than_reference")
        for k in ("kept_float_nodes", "notes"):
            if k in v:
                c.strings(v[k], f"{w}.{k}")
        for j, cand in enumerate(c.typed(v.get("candidates", []), (list, tuple), f"{w}.candidates")):
            cw = f"{w}.candidates[{j}]"
            c.mapping(cand, cw)
            c.keys(cand, ("method", "passed", "chosen", "quality"), _CANDIDATE_KEYS[4:], cw)
            c.typed(cand["method"], str, f"{cw}.method")
            c.typed(cand["passed"], bool, f"{cw}.passed")
            c.typed(cand["chosen"], bool, f"{cw}.chosen")
            for k, x in c.mapping(cand["quality"], f"{cw}.quality").items():
                c.number(x, f"{cw}.quality.{k}", nullable=True)
            c.number(cand.get("latency_ms"), f"{cw}.latency_ms", nullable=True, positive=True)
            c.number(cand.get("reference_latency_ms"), f"{cw}.reference_latency_ms", nullable=True, positive=True)
            for k in ("error", "why"):
                if k in cand:
                    c.typed(cand[k], str, f"{cw}.{k}")
        if v.get("calibration") is not None:
            from .calibration_quality import check_calibration_entry

            check_calibration_entry(v["calibration"], f"{w}.calibration")
    if ref not in seen:
        raise ValueError(f"report: 'reference' names {ref!r}, which is not one of the variants {sorted(seen)}")


# --------------------------------------------------------------------------
# shared helpers


def gate_status(variant: Mapping[str, Any]) -> str:
    """``"PASS"``, ``"FORCED"`` (failed, written because forced) or ``"FAIL"``."""
    gate = variant["gate"]
    if gate["passed"]:
        return "PASS"
    return "FORCED" if gate.get("forced", False) else "FAIL"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ref_latency(v: Mapping[str, Any], ref: Mapping[str, Any]) -> float | None:
    r = v.get("reference_latency_ms")
    if r is None:
        r = ref.get("latency_ms")
    return r


def _speedup(v: Mapping[str, Any], ref: Mapping[str, Any]) -> float | None:
    lat, r = v.get("latency_ms"), _ref_latency(v, ref)
    if lat is None or r is None:
        return None
    return r / lat


def _slower(v: Mapping[str, Any], ref: Mapping[str, Any]) -> bool:
    if "slower_than_reference" in v:
        return bool(v["slower_than_reference"])
    s = _speedup(v, ref)
    return s is not None and s < 1.0 and v is not ref


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


# --------------------------------------------------------------------------
# markdown


def _md(text: Any) -> str:
    """Make ``text`` safe inside a markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _num(x: Any, fmt: str) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def _pct(x: Any) -> str:
    return "—" if x is None else ("NaN" if isinstance(x, float) and math.isnan(x) else f"{100 * x:.1f}%")


def _threshold_text(name: str, value: float, metric: str | None) -> str:
    label = (metric or "metric") if name == "value" else name
    return f"{label} {'≤' if name == 'max_abs_error' else '≥'} {value:g}"


def _data_line(d: Mapping[str, Any] | None, absent: str) -> str:
    return absent if d is None else f"{_md(d['source'])} ({d['samples']} samples)"


def render_markdown(report: Mapping[str, Any]) -> str:
    """``report.md``'s text for a validated ``report``.

    Being slower than the reference is stated from ``slower_than_reference``
    (or, when absent, from the two latencies) unless a note already starts
    with "slower than"."""
    model, machine = report["model"], report["machine"]
    variants = list(report["variants"])
    ref = next(v for v in variants if v["id"] == report["reference"])
    src = model["source"] or "—"
    sha = f" (sha256 `{model['source_sha256']}`)" if model["source_sha256"] else ""
    lines = [
        f"# Conversion report: {_md(model['name'])} {_md(model['version'])}",
        "",
        f"- **Model**: {_md(model['name'])} {_md(model['version'])}, task `{_md(model['task'])}`",
        f"- **Source**: `{_md(src)}`{sha}",
        f"- **Machine**: {_md(machine['machine'])} (profile `{_md(machine['profile'])}`, {machine['threads']} threads"
        + "".join(f", {_md(k)} {_md(x)}" for k, x in machine.items() if k not in ("machine", "profile", "threads"))
        + ")",
        f"- **Reference variant**: `{_md(ref['id'])}` — quality figures compare each variant's outputs with it",
        f"- **Calibration data**: {_data_line(report.get('calibration'), 'none (no statically calibrated variant)')}",
        f"- **Validation data**: {_data_line(report.get('validation'), 'none (quality not measured)')}",
    ]
    if report.get("gate"):
        lines.append("- **Quality gate**: " + ", ".join(_threshold_text(k, x, None) for k, x in report["gate"].items()))
    lines += [
        "",
        "## Variants",
        "",
        "| variant | backend | precision | method | size KiB | latency ms | speed-up | cosine | max abs err "
        "| top-1 agree | top-5 agree | metric | gate | in package | kept float | notes |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|---|---|--:|---|",
    ]
    for v in variants:
        q = v["quality"]
        status = gate_status(v)
        failures = list(v["gate"].get("failures", []))
        gate_cell = f"**{status}**" + (": " + "; ".join(_md(f) for f in failures) if failures else "")
        is_ref = v is ref
        vid = f"**`{_md(v['id'])}`** (reference)" if is_ref else f"`{_md(v['id'])}`"
        speed = _speedup(v, ref)
        metric = "—"
        if q.get("metric") is not None or q.get("value") is not None:
            metric = f"{_md(q.get('metric') or 'metric')} {_num(q.get('value'), '.4g')}"
        task_figs = [f"{k} {_num(q[k], '.4g')}" for k in _TASK_NUMS if q.get(k) is not None]
        if task_figs:
            metric = "; ".join(([] if metric == "—" else [metric]) + task_figs)
        cosine = q.get("cosine")
        if cosine is None and is_ref:
            cosine_text = "1 (ref)"
        else:
            cosine_text = _num(cosine, ".6f")
        notes = [_md(n) for n in v.get("notes", [])]
        if _slower(v, ref) and not is_ref and not any(n.lower().startswith("slower than") for n in notes):
            notes.insert(0, "slower than the reference")
        kept = len(v.get("kept_float_nodes", []))
        row = [
            vid,
            _md(v["backend"]),
            _md(v["precision"]),
            _md(v["method"]),
            "—" if v["file"] is None else f"{v['size'] / 1024:.1f}",
            _num(v.get("latency_ms"), ".3f"),
            "—" if speed is None else f"{speed:.2f}×",
            cosine_text,
            _num(q.get("max_abs_error"), ".3g"),
            _pct(q.get("top1_agreement")),
            _pct(q.get("top5_agreement")),
            metric,
            gate_cell,
            "yes" if v["written"] else "no",
            str(kept) if kept else "—",
            "; ".join(notes) if notes else "—",
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Size is the variant's file; latency is the median per call on the machine above; speed-up is the "
        "reference's latency divided by the variant's (above 1 = faster). Agreement is the share of samples whose "
        "top-1 / top-5 classes match the reference's.",
        "",
        f"![size, latency and cosine per variant]({REPORT_FILES['png']})",
        "",
    ]
    if report.get("notes"):
        lines += ["## Normalisation and assumptions", "", *(f"- {_md(n)}" for n in report["notes"]), ""]
    lines += _candidates_section(variants)
    lines += _calibration_section(variants)
    detail = _details(variants, ref)
    if detail:
        lines += ["## Gate failures and notes", "", *detail]
    return "\n".join(lines).rstrip() + "\n"


def _candidates_section(variants: list[Mapping[str, Any]]) -> list[str]:
    """report.md's "Candidates" table: the int8 forms that were made and measured, and which one was kept."""
    out: list[str] = []
    for v in variants:
        cands = v.get("candidates") or []
        if not cands:
            continue
        out += [f"## Candidates for `{_md(v['id'])}`", "", "| method | gate | quality | latency ms | fp32 ms | kept | why |", "|---|---|---|--:|--:|---|---|"]
        for cand in cands:
            qual = ", ".join(f"{k} {_num(x, '.4g')}" for k, x in cand["quality"].items()) or _md(cand.get("error", "—"))
            out.append(
                f"| {_md(cand['method'])} | {'PASS' if cand['passed'] else 'FAIL'} | {qual} | {_num(cand.get('latency_ms'), '.3f')} "
                f"| {_num(cand.get('reference_latency_ms'), '.3f')} | {'**yes**' if cand['chosen'] else 'no'} | {_md(cand.get('why', ''))} |"
            )
        out.append("")
    return out


def _calibration_section(variants: list[Mapping[str, Any]]) -> list[str]:
    """report.md's "Calibration" table and reliability diagrams (variants with a ``calibration`` entry only)."""
    cal = [(v, v["calibration"]) for v in variants if v.get("calibration")]
    if not cal:
        return []
    first = cal[0][1]
    lines = [
        "## Calibration",
        "",
        f"Top-1 confidence against accuracy on the validation data, {first.get('n_bins', '?')} equal-width bins. "
        "ECE: sample-weighted mean gap between accuracy and confidence per bin; MCE: the largest gap; Brier and NLL "
        "of the true class. \"after T\": with the variant's temperature (fitted at conversion, or from the manifest).",
        "",
        "| variant | samples | ECE | MCE | Brier | NLL | T | ECE after T | MCE after T | NLL after T | fitted on | diagram |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|",
    ]
    for v, c in cal:
        b, a = c["before"], c.get("after") or {}
        diagram = f"[{_md(c['diagram'])}]({c['diagram']})" if c.get("diagram") else "—"
        lines.append("| " + " | ".join([
            f"`{_md(v['id'])}`", str(c.get("samples", "—")), _num(b.get("ece"), ".4f"), _num(b.get("mce"), ".4f"),
            _num(b.get("brier"), ".4f"), _num(b.get("nll"), ".4f"), _num(c.get("temperature"), ".4g"),
            _num(a.get("ece"), ".4f"), _num(a.get("mce"), ".4f"), _num(a.get("nll"), ".4f"),
            _md(c.get("fitted_on") or ("manifest" if c.get("temperature") is not None else "—")), diagram,
        ]) + " |")  # fmt: skip
    lines.append("")
    for v, c in cal:
        if c.get("diagram"):
            lines += [f"![reliability diagram of {_md(v['id'])}]({c['diagram']})", ""]
    return lines


def _details(variants: list[Mapping[str, Any]], ref: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    # gate failures first, then variants with only notes
    order = sorted(variants, key=lambda v: gate_status(v) == "PASS")
    for v in order:
        status = gate_status(v)
        gate = v["gate"]
        kept = list(v.get("kept_float_nodes", []))
        notes = list(v.get("notes", []))
        slower = _slower(v, ref) and v is not ref
        if status == "PASS" and not (kept or notes or slower):
            continue
        body: list[str] = []
        if status != "PASS":
            failures = gate.get("failures", [])
            if failures:
                body += [f"- Failed: {_md(f)}" for f in failures]
            else:
                body.append("- Failed its quality gate (no failure text was recorded).")
            th = gate.get("thresholds", {})
            if th:
                metric = v["quality"].get("metric")
                body.append("- Gate thresholds: " + ", ".join(_threshold_text(k, x, metric) for k, x in th.items()))
            if status == "FORCED":
                body.append(
                    "- Written to the package only because the conversion was forced; edge_sdk's variant selection "
                    "skips it unless it is requested by id."
                )
            elif v["file"] is None:
                body.append("- Not made (no file), so not in the package.")
            else:
                body.append("- Not written to the package.")
        if slower and not any(str(n).lower().startswith("slower than") for n in notes):
            r = _ref_latency(v, ref)
            body.append(
                f"- Slower than the reference on this machine: {_num(v.get('latency_ms'), '.3f')} ms vs "
                f"{_num(r, '.3f')} ms."
            )
        if kept:
            shown = ", ".join(f"`{_md(n)}`" for n in kept[:_MAX_LISTED_NODES])
            more = f" and {len(kept) - _MAX_LISTED_NODES} more (see report.json)" if len(kept) > _MAX_LISTED_NODES else ""
            body.append(f"- Kept in float ({len(kept)} node{'s' if len(kept) != 1 else ''}): {shown}{more}")
        body += [f"- Note: {_md(n)}" for n in notes]
        out += [f"### `{_md(v['id'])}` — {status}", "", *body, ""]
    return out


# --------------------------------------------------------------------------
# plot


def _cosine_text(x: float) -> str:
    """Enough decimals to show how far below 1 a cosine is (0.9123, 0.999973)."""
    gap = 1.0 - x
    if gap <= 0:
        return f"{x:.4f}"
    return f"{x:.{max(4, min(8, math.ceil(-math.log10(gap)) + 1))}f}"


def _plot(report: Mapping[str, Any], path: Path) -> None:
    # Object API on an explicit Agg canvas: no pyplot, no process-wide backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    variants = list(report["variants"])
    ref_id = report["reference"]
    n = len(variants)
    labels = [v["id"] + ("\n(reference)" if v["id"] == ref_id else "") for v in variants]
    colors = [_GATE_COLORS[gate_status(v)] for v in variants]
    xs = list(range(n))

    sizes = [None if v["file"] is None else v["size"] / 1024 for v in variants]  # None: never made
    lats = [v.get("latency_ms") for v in variants]
    cos: list[float | None] = []
    for v in variants:
        c = v["quality"].get("cosine")
        cos.append(1.0 if c is None and v["id"] == ref_id else c)

    width = max(12.0, 3 * (1.2 + 0.55 * n))
    fig = Figure(figsize=(width, 5.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    panels = (
        (axes[0], sizes, "Size (KiB)", "{:.1f}"),
        (axes[1], lats, "Median latency (ms)", "{:.3g}"),
        (axes[2], cos, "Cosine vs reference", _cosine_text),
    )
    for ax, values, title, fmt in panels:
        fmt = fmt.format if isinstance(fmt, str) else fmt
        heights = [x if _finite(x) else 0.0 for x in values]
        bars = ax.bar(xs, heights, color=colors, edgecolor="#222222", linewidth=0.8)
        for i, (bar, x) in enumerate(zip(bars, values)):
            if variants[i]["id"] == ref_id:
                bar.set_hatch("//")
                bar.set_linewidth(1.6)
            cx = bar.get_x() + bar.get_width() / 2
            if _finite(x):
                up = x >= 0
                ax.annotate(fmt(x), (cx, x), xytext=(0, 2 if up else -2), textcoords="offset points",
                            ha="center", va="bottom" if up else "top", fontsize=8)  # fmt: skip
            else:  # no bar: say why at the bottom of the panel, whatever the y range
                ax.annotate("n/a" if x is None else "NaN", (cx, 0.02), xycoords=("data", "axes fraction"),
                            ha="center", va="bottom", fontsize=9, color=colors[i], fontweight="bold")  # fmt: skip
        ax.set_title(title, fontsize=11)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        finite = [x for x in values if _finite(x)]
        if ax is not axes[2]:
            ax.set_ylim(0, (max(finite) if finite and max(finite) > 0 else 1.0) * 1.18)
    # cosine: zoom in where the values are (they crowd near 1), keep 1.0 in view
    finite = [x for x in cos if _finite(x)]
    thresholds = sorted({float(th["cosine"]) for v in variants if "cosine" in (th := v["gate"].get("thresholds", {}))})
    lo = min([*finite, *thresholds], default=0.0)
    if lo >= 0.5:
        span = max(1.0 - lo, 1e-4)
        axes[2].set_ylim(max(0.0, lo - 0.6 * span), 1.0 + 0.35 * span)
    else:
        axes[2].set_ylim(min(0.0, lo) - 0.12, 1.12)
    for t in thresholds:
        axes[2].axhline(t, color="#555555", linestyle="--", linewidth=1, zorder=3)
    if thresholds:
        axes[2].set_title(f"Cosine vs reference (gate ≥ {', '.join(f'{t:g}' for t in thresholds)}, dashed)", fontsize=11)
    model, machine = report["model"], report["machine"]
    fig.suptitle(
        f"{model['name']} {model['version']} — {machine['machine']} ({machine['profile']}, {machine['threads']} threads)",
        fontsize=12,
    )
    present = {gate_status(v) for v in variants}
    handles = [Patch(facecolor=c, edgecolor="#222222", label=s) for s, c in _GATE_COLORS.items() if s in present]
    handles.append(Patch(facecolor="white", edgecolor="#222222", hatch="//", label="reference"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9, frameon=False)
    fig.savefig(path, format="png")


# --------------------------------------------------------------------------
# entry point


def write_report(package_dir: str | Path, report: Mapping[str, Any], *, plot: bool = True) -> dict[str, Path]:
    """Validate ``report`` and write ``report.json``, ``report.md`` and (with
    ``plot``) ``report.png`` into the existing folder ``package_dir``.

    Returns ``{"json": path, "md": path, "png": path}`` (``png`` only when
    plotted), plus ``"reliability:<variant id>": path`` for each reliability
    diagram drawn (variants whose ``calibration`` names a ``diagram``).  Raises ``ValueError`` naming the key for a bad mapping,
    ``NotADirectoryError`` when ``package_dir`` is not a folder and
    ``ImportError`` when ``plot`` is set and matplotlib is missing -- all
    before anything is written.
    """
    validate_report(report)
    root = Path(package_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: package folder does not exist")
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as e:
            raise ImportError("report.png needs matplotlib: pip install 'edge-sdk[converter]' (or pass plot=False)") from e
    paths = {k: root / name for k, name in REPORT_FILES.items()}
    text = json.dumps(_json_safe(report), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
    paths["json"].write_text(text + "\n", encoding="utf-8")
    paths["md"].write_text(render_markdown(report), encoding="utf-8")
    if plot:
        _plot(report, paths["png"])
        from .calibration_quality import plot_reliability

        for v in report["variants"]:
            c = v.get("calibration")
            if c and c.get("diagram"):
                name = Path(c["diagram"]).name  # a file next to the report, never elsewhere
                paths[f"reliability:{v['id']}"] = plot_reliability(c, root / name, f"{report['model']['name']} {v['id']}")
    else:
        del paths["png"]
    return paths
