"""Measure every variant of a package against its reference, and gate it.

Quality (on held-out data, each variant loaded with ``edge_sdk.load`` and the
variant forced, so the same runtime path as on a device is measured):

- ``cosine``: cosine similarity of all outputs, flattened and concatenated;
- ``max_abs_error``: largest absolute difference over all outputs;
- ``top1_agreement``: the variant's top-1 class equals the reference's
  (classification, or any output shaped [batch, classes]);
- ``top5_agreement``: the reference's top-1 class is in the variant's top-5;
- a task metric when labels are given: ``accuracy`` for classification;
  ``f1@iou0.5`` for detection (IoU-matched precision and recall are in the notes),
  with detection outputs read as ``[1, N, 6+]`` rows of ``x1, y1, x2, y2, score, class``.

Latency: median wall time of ``Model.predict`` at batch 1, variants interleaved
in rounds so drift of the machine's speed hits all of them alike.

Calibration (classification with class labels; :mod:`converters.calibration_quality`):
ECE, MCE, Brier score and NLL of each variant's top-1 confidence, on its raw
scores and, when the variant has a manifest ``temperature`` or one is fitted
(``calibrate_temperature``), after temperature scaling.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edge_sdk.package import ModelPackage, Quality, TensorSpec

from .calibration_quality import DEFAULT_BINS, CalibrationQualityError, CalibrationResult, assess
from .errors import ConverterError

DEFAULT_GATES: dict[str, dict[str, float]] = {
    # cosine >= 0.99 and top-1 agreement >= 98 % for classification (the defaults)
    "classification": {"cosine": 0.99, "top1_agreement": 0.98},
}
FALLBACK_GATE: dict[str, float] = {"cosine": 0.99}
MAXIMA = frozenset({"max_abs_error"})  # gate figures that are upper bounds
SLOWER_MARGIN = 1.03  # "slower than the reference" means over 3 % slower: medians of this size move ~1-2 % run to run


class ValidationError(ConverterError, ValueError):
    """The data or labels do not fit the package."""


def default_gate(task: str) -> dict[str, float]:
    """The default gate thresholds for ``task`` (a copy); tasks without their own get ``FALLBACK_GATE`` (cosine >=
    0.99)."""
    return dict(DEFAULT_GATES.get(task, FALLBACK_GATE))


def parse_gate(text: str) -> dict[str, float]:
    """``"cosine=0.995,top1_agreement=0.99"`` -> dict; names must be quality figures."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        if name not in Quality.FIGURES or not value:
            raise ValidationError(f"--gate: expected NAME=VALUE with NAME in {list(Quality.FIGURES)}, got {part!r}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValidationError(f"--gate: {name} needs a number, got {value!r}") from None
    return out


def check_gate(q: Quality, thresholds: Mapping[str, float]) -> tuple[bool, tuple[str, ...]]:
    """(passed, failures). A figure the variant has no measurement for fails."""
    failures = []
    for name, limit in thresholds.items():
        v = getattr(q, name)
        if v is None:
            failures.append(f"{name} not measured (gate {limit})")
        elif name in MAXIMA and v > limit:
            failures.append(f"{name} {v:.6g} > {limit:g}")
        elif name not in MAXIMA and v < limit:
            failures.append(f"{name} {v:.6g} < {limit:g}")
    return (not failures, tuple(failures))


# ------------------------------------------------------------------ metrics


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of xyxy boxes a [N,4] and b [M,4]."""
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:4], b[None, :, 2:4])
    inter = np.clip(br - tl, 0, None).prod(-1)
    area = lambda x: np.clip(x[:, 2] - x[:, 0], 0, None) * np.clip(x[:, 3] - x[:, 1], 0, None)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def detection_precision_recall(
    preds: Sequence[np.ndarray], truths: Sequence[np.ndarray], *, iou: float = 0.5, score_threshold: float = 0.25
) -> tuple[float, float]:
    """Greedy IoU matching per image, highest score first, same class only.
    ``preds[i]``: [N, 6] x1,y1,x2,y2,score,class; ``truths[i]``: [M, 5] x1,y1,x2,y2,class."""
    tp = fp = fn = 0
    for p, t in zip(preds, truths):
        p = p[p[:, 4] >= score_threshold] if len(p) else p
        p = p[np.argsort(-p[:, 4], kind="stable")] if len(p) else p
        used = np.zeros(len(t), bool)
        ious = box_iou(p[:, :4], t[:, :4]) if len(p) and len(t) else np.zeros((len(p), len(t)))
        for i in range(len(p)):
            cand = [(ious[i, j], j) for j in range(len(t)) if not used[j] and int(t[j, 4]) == int(p[i, 5]) and ious[i, j] >= iou]
            if cand:
                used[max(cand)[1]] = True
                tp += 1
            else:
                fp += 1
        fn += int((~used).sum())
    precision = tp / (tp + fp) if tp + fp else (1.0 if fn == 0 else 0.0)
    recall = tp / (tp + fn) if tp + fn else 1.0
    return precision, recall


@dataclass(frozen=True)
class Comparison:
    """The quality figures of one variant's outputs against the reference's, with notes on what could not be measured."""
    quality: Quality
    notes: tuple[str, ...] = ()


def compare(
    ref: Mapping[str, np.ndarray],
    got: Mapping[str, np.ndarray],
    *,
    task: str,
    class_output: str | None,
    labels: Sequence[Any] | None,
    reference_id: str,
    dataset: str,
) -> Comparison:
    """Quality of ``got`` against ``ref`` (outputs stacked over samples on axis 0)."""
    names = sorted(ref)
    a = np.concatenate([ref[n].astype(np.float64).ravel() for n in names])
    b = np.concatenate([got[n].astype(np.float64).ravel() for n in names])
    n = next(iter(ref.values())).shape[0]
    kw: dict[str, Any] = {"reference": reference_id, "cosine": round(_cosine(a, b), 6), "max_abs_error": float(np.abs(a - b).max()), "dataset": dataset, "samples": n}
    notes: list[str] = []
    co = class_output
    if co is None and task != "detection" and len(names) == 1 and ref[names[0]].ndim == 2 and ref[names[0]].shape[1] > 1:
        co = names[0]
    if co is not None:
        r, g = ref[co].reshape(n, -1), got[co].reshape(n, -1)
        r1 = r.argmax(1)
        kw["top1_agreement"] = float((g.argmax(1) == r1).mean())
        k = min(5, g.shape[1])
        top5 = np.argpartition(-g, k - 1, axis=1)[:, :k]
        kw["top5_agreement"] = float((top5 == r1[:, None]).any(1).mean())
        if labels is not None and task != "detection":
            y = np.asarray(labels, dtype=np.int64)
            if y.shape != (n,):
                raise ValidationError(f"labels: expected {n} class indices, got shape {y.shape}")
            kw["metric"], kw["value"] = "accuracy", float((g.argmax(1) == y).mean())
    if task == "detection" and labels is not None:
        out = got[names[0]]
        preds = [out[i].reshape(-1, out.shape[-1]) for i in range(n)]
        truths = [np.asarray(t, dtype=np.float64).reshape(-1, 5) for t in labels]
        if len(truths) != n:
            raise ValidationError(f"labels: expected boxes for {n} samples, got {len(truths)}")
        p, rcl = detection_precision_recall(preds, truths)
        kw["metric"], kw["value"] = "f1@iou0.5", (2 * p * rcl / (p + rcl) if p + rcl else 0.0)
        notes.append(f"IoU-matched precision {p:.4f}, recall {rcl:.4f} (IoU 0.5, score >= 0.25)")
    return Comparison(Quality(**kw), tuple(notes))


# ------------------------------------------------------------------ running variants


def adapt(x: np.ndarray, src: TensorSpec, dst: TensorSpec) -> np.ndarray:
    """A sample made for ``src`` laid out for ``dst`` (NCHW <-> NHWC)."""
    if src.layout == dst.layout or src.layout is None or dst.layout is None:
        return x
    pair = (src.layout, dst.layout)
    if pair == ("NCHW", "NHWC"):
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    if pair == ("NHWC", "NCHW"):
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    raise ValidationError(f"cannot lay out input {src.name!r} from {src.layout} for {dst.layout}")


@dataclass(frozen=True)
class VariantReport:
    """One variant's measured result: quality against the reference (None for the reference itself), notes, median
    latency and the reference's on this machine, and file size in bytes."""
    variant_id: str
    quality: Quality | None
    notes: tuple[str, ...] = ()
    latency_ms: float | None = None
    reference_latency_ms: float | None = None
    size: int = 0
    calibration: CalibrationResult | None = None  # classification with class labels only

    @property
    def slower_than_reference(self) -> bool:
        """True if the variant's latency is more than ``SLOWER_MARGIN`` (3 %) above the reference's; False if either is
        unknown."""
        return self.latency_ms is not None and self.reference_latency_ms is not None and self.latency_ms > self.reference_latency_ms * SLOWER_MARGIN


@dataclass
class Measurer:
    """Loads each variant once (forced, no backend measurement) and keeps it open."""

    pkg: ModelPackage
    profile: Any = None
    threads: int | None = None
    cache_dir: Path | None = None
    _models: dict[str, Any] = field(default_factory=dict)

    def model(self, vid: str) -> Any:
        """The loaded model of variant ``vid`` (loaded on first use, then kept)."""
        import edge_sdk

        if vid not in self._models:
            kw: dict[str, Any] = {"variant": vid, "measure_backends": False}
            if self.threads:
                kw["threads"] = self.threads
            if self.cache_dir:
                kw["cache_dir"] = self.cache_dir
            self._models[vid] = edge_sdk.load(self.pkg, self.profile, **kw)
        return self._models[vid]

    def close(self) -> None:
        """Close every model loaded so far."""
        for m in self._models.values():
            m.close()
        self._models.clear()

    def feeds(self, vid: str, sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``sample`` (laid out for the reference variant's inputs) laid out for variant ``vid``'s inputs (NCHW <-> NHWC)."""
        m = self.pkg.manifest
        ref_specs = {s.name: s for s in m.inputs}
        specs = {s.name: s for s in m.inputs_for(m.variant(vid))}
        return {k: adapt(v, ref_specs[k], specs[k]) for k, v in sample.items()}

    def outputs(self, vid: str, samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Run variant ``vid`` on each sample and return its outputs, concatenated along the batch axis per output name."""
        model = self.model(vid)
        per: dict[str, list[np.ndarray]] = {}
        for s in samples:
            r = model.predict(self.feeds(vid, s))
            for k, v in r.outputs.items():
                per.setdefault(k, []).append(np.asarray(v))
        return {k: np.concatenate(v, axis=0) for k, v in per.items()}

    def latencies(self, vids: Sequence[str], sample: Mapping[str, np.ndarray], *, rounds: int = 15, per_round: int = 10, budget_s: float = 20.0) -> dict[str, float]:
        """Median ms per ``predict`` call, variants interleaved (order rotated per round)."""
        calls = {v: (self.model(v), self.feeds(v, sample)) for v in vids}
        for m, f in calls.values():
            for _ in range(3):
                m.predict(f)
        times: dict[str, list[float]] = {v: [] for v in vids}
        deadline = time.perf_counter() + budget_s
        order = list(vids)
        for r in range(rounds):
            for v in order[r % len(order) :] + order[: r % len(order)]:
                m, f = calls[v]
                for _ in range(per_round):
                    t = time.perf_counter_ns()
                    m.predict(f)
                    times[v].append((time.perf_counter_ns() - t) / 1e6)
            if time.perf_counter() > deadline:
                break
        return {v: float(np.median(t)) for v, t in times.items()}


def validate_package(
    package: str | Path | ModelPackage,
    samples: Sequence[Mapping[str, np.ndarray]],
    *,
    labels: Sequence[Any] | None = None,
    dataset: str = "",
    profile: Any = None,
    threads: int | None = None,
    cache_dir: Path | None = None,
    latency: bool = True,
    calibrate_temperature: bool = False,
    fit_samples: Sequence[Mapping[str, np.ndarray]] | None = None,
    fit_labels: Sequence[int] | None = None,
    fit_source: str | None = None,
    n_bins: int = DEFAULT_BINS,
) -> dict[str, VariantReport]:
    """Measure every variant against the reference. ``samples`` are laid out for
    the package-level input specs (the reference's).

    With a classification decoder and class ``labels``, each report's ``calibration`` holds the ECE (``n_bins``
    bins) on the raw scores and after the variant's manifest ``temperature``; with ``calibrate_temperature`` a
    temperature is fitted per variant instead, on ``fit_samples``/``fit_labels`` when given (``fit_source`` names
    them), else on ``samples``/``labels`` themselves (then the after figures are optimistic)."""
    pkg = package if isinstance(package, ModelPackage) else ModelPackage.open(package)
    m = pkg.manifest
    if not samples:
        raise ValidationError("no validation samples")
    ref = m.reference_variant
    meas = Measurer(pkg, profile, threads, cache_dir)
    try:
        ref_out = meas.outputs(ref.id, samples)
        class_output = m.decoder.output if m.decoder.kind == "classification" else None
        if m.decoder.kind == "classification" and class_output is None:
            class_output = m.outputs[0].name
        calibrated = class_output is not None and labels is not None and m.task != "detection"
        if calibrate_temperature and not calibrated:
            raise ValidationError("fitting a temperature needs a classification decoder and class labels for the data (--labels, or labelled data)")
        if fit_samples is not None and (fit_labels is None or len(fit_labels) != len(fit_samples)):
            raise ValidationError(f"fit_labels: expected {len(fit_samples)} class indices for the temperature-fitting samples")
        out: dict[str, VariantReport] = {}
        for v in m.variants:
            got = ref_out if v.id == ref.id else meas.outputs(v.id, samples)
            c = compare(ref_out, got, task=m.task, class_output=class_output, labels=labels, reference_id=ref.id, dataset=dataset)
            cal = None
            if calibrated:
                n = got[class_output].shape[0]
                fit_scores = None
                if calibrate_temperature and fit_samples is not None:
                    fit_scores = meas.outputs(v.id, fit_samples)[class_output].reshape(len(fit_samples), -1)
                try:
                    cal = assess(
                        got[class_output].reshape(n, -1), labels, logits=m.decoder.softmax, temperature=v.temperature,
                        fit=calibrate_temperature, fit_scores=fit_scores, fit_labels=fit_labels, n_bins=n_bins,
                        fitted_on=(fit_source or "temperature-fitting data") if fit_scores is not None else f"{dataset or 'the validation data'} (the data measured: optimistic)",
                    )  # fmt: skip
                except CalibrationQualityError as e:
                    raise ValidationError(f"calibration of variant {v.id}: {e}") from None
            out[v.id] = VariantReport(v.id, c.quality, c.notes, size=v.total_size, calibration=cal)
        if latency:
            lat = meas.latencies([v.id for v in m.variants], samples[0])
            out = {k: replace(r, latency_ms=lat[k], reference_latency_ms=lat[ref.id]) for k, r in out.items()}
        return out
    finally:
        meas.close()


def finite_or_none(x: float | None) -> float | None:
    """``x``, or None if it is None, NaN or infinite (for JSON)."""
    return None if x is None or not math.isfinite(x) else x
