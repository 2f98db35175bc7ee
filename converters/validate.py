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
  with detection outputs read as ``[1, N, 6+]`` rows of ``x1, y1, x2, y2, score, class``;
- task figures against the reference (no labels needed), which the default gates use
  (:data:`DEFAULT_GATES`; cosine stays a reported diagnostic):
  ``sequence``: ``position_agreement`` (per-position argmax), ``sequence_exact_match`` and
  ``edit_distance`` of the greedy-CTC-decoded sequences (repeats collapsed, blank removed);
  ``detection``: ``box_recall`` and ``box_iou`` of the variant's boxes against the reference's
  (decoded by the package's detection decoder, else the raw head decoded by :class:`DetectionFormat`:
  YOLOv8, YOLOv5, SSD boxes + scores, BlazeFace, or rows; score threshold, then NMS);
  ``segmentation``: ``mask_iou`` of argmax masks (one channel: thresholded at 0.5);
- ``nonfinite_samples``: samples where the variant's outputs hold NaN/inf where the reference's
  are finite; any such sample fails the gate (:func:`check_gate`), and no non-finite figure is kept.

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
    # what a reader of the decoded text sees: 90 % of lines identical, 2 % of characters edited at most
    "sequence": {"sequence_exact_match": 0.9, "edit_distance": 0.02},
    # the reference's boxes found again (IoU >= 0.5, same class), and found where they were
    "detection": {"box_recall": 0.9, "box_iou": 0.8},
    "segmentation": {"mask_iou": 0.9},
}
FALLBACK_GATE: dict[str, float] = {"cosine": 0.99}
MAXIMA = frozenset(Quality.MAXIMA)  # gate figures that are upper bounds (max_abs_error, edit_distance, perplexity, ...)
SCORE_THRESHOLD = 0.25  # detection rows (and decoded boxes) below this score are not boxes
SLOWER_MARGIN = 1.03  # "slower than the reference" means over 3 % slower: medians of this size move ~1-2 % run to run


class ValidationError(ConverterError, ValueError):
    """The data or labels do not fit the package."""


def default_gate(task: str) -> dict[str, float]:
    """The default gate thresholds for ``task`` (a copy): classification cosine >= 0.99 and top-1 agreement >= 0.98;
    sequence exact match >= 0.9 and edit distance <= 0.02; detection box recall >= 0.9 and box IoU >= 0.8;
    segmentation mask IoU >= 0.9; other tasks ``FALLBACK_GATE`` (cosine >= 0.99)."""
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


def check_gate(q: Quality, thresholds: Mapping[str, float], what: str = "") -> tuple[bool, tuple[str, ...]]:
    """(passed, failures). A figure the variant has no measurement for fails; so does any sample whose outputs are
    non-finite where the reference's are finite (``what``, e.g. the precision, names the variant in that failure)."""
    failures = []
    if q.nonfinite_samples:
        of = f" of {q.samples}" if q.samples is not None else ""
        failures.append(f"{(what + ' ') if what else ''}outputs non-finite in {q.nonfinite_samples}{of} samples (the reference's are finite)")
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


def ctc_decode(ids: np.ndarray, blank: int = 0) -> list[int]:
    """Greedy CTC decoding of per-position class ids: collapse repeats, then drop ``blank``."""
    out: list[int] = []
    prev = None
    for t in ids.tolist():
        if t != prev and t != blank:
            out.append(int(t))
        prev = t
    return out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def sequence_figures(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], blank: int = 0) -> dict[str, float]:
    """``position_agreement``, ``sequence_exact_match`` and ``edit_distance`` (mean of Levenshtein distance over the
    longer decoded sequence's length, 0 when both are empty) of per-sample ``[batch, positions, classes]`` scores."""
    agree = total = exact = rows = 0
    dist = 0.0
    for r, g in zip(ref, got):
        if r.shape != g.shape or r.ndim != 3:
            raise ValidationError(f"sequence outputs: expected matching [batch, positions, classes] arrays, got {r.shape} and {g.shape}")
        ra, ga = r.argmax(-1), g.argmax(-1)
        agree += int((ra == ga).sum())
        total += ra.size
        for i in range(ra.shape[0]):
            a, b = ctc_decode(ra[i], blank), ctc_decode(ga[i], blank)
            exact += a == b
            dist += edit_distance(a, b) / max(len(a), len(b), 1)
            rows += 1
    return {
        "position_agreement": agree / total if total else 1.0,
        "sequence_exact_match": exact / rows if rows else 1.0,
        "edit_distance": dist / rows if rows else 0.0,
    }


def box_agreement(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], *, iou: float = 0.5) -> tuple[float, float, float, int]:
    """(box recall, mean IoU, precision, reference boxes) of the variant's boxes ``got[i]`` [N, 6] (x1, y1, x2, y2,
    score, class) against the reference's ``ref[i]``, both already filtered by score: greedy one-to-one matching per
    image, reference boxes by descending score, same class only. The mean IoU is over reference boxes (0 when
    unmatched); with no reference boxes at all, recall and IoU are 1 when the variant found none either, else 0."""
    found = n_ref = n_got = 0
    ious: list[float] = []
    for r, g in zip(ref, got):
        n_ref += len(r)
        n_got += len(g)
        if not len(r):
            continue
        r = r[np.argsort(-r[:, 4], kind="stable")]
        m = box_iou(r[:, :4], g[:, :4]) if len(g) else np.zeros((len(r), 0))
        used = np.zeros(len(g), bool)
        for i in range(len(r)):
            cand = [(m[i, j], j) for j in range(len(g)) if not used[j] and int(g[j, 5]) == int(r[i, 5])]
            best = max(cand) if cand else (0.0, -1)
            if best[1] >= 0 and best[0] >= iou:
                used[best[1]] = True
                found += 1
            ious.append(float(best[0]) if best[1] >= 0 else 0.0)
    if n_ref == 0:
        v = 1.0 if n_got == 0 else 0.0
        return v, v, v, 0
    return found / n_ref, float(np.mean(ious)), (found / n_got if n_got else 0.0), n_ref


def _channel_axis(shape: tuple[int, ...], layout: str) -> int:
    """The class axis of one sample's 3-D score map: the layout's (NCHW: 0, NHWC: 2), unless the other end is the
    narrow one (a [H, W, 1] map under an NCHW image input: MediaPipe's selfie segmenter), where the layout of the
    *input* said nothing about the output's."""
    hinted, other = (0, 2) if layout == "NCHW" else (2, 0)
    if shape[other] < shape[hinted] and shape[other] <= 64:
        return other
    return hinted


def mask_iou(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], layout: str = "NCHW") -> tuple[float, str]:
    """(mean mask IoU, how masks were made): per sample, argmax over the channel axis (``layout`` NCHW: axis 1, NHWC:
    the last; NHW or one channel: the mask is ``score >= 0.5``, or ``>= 0`` when the scores leave [0, 1], i.e. logits),
    then the IoU of each class present in either mask, averaged (a sample where both masks are empty counts 1)."""
    vals: list[float] = []
    how = ""
    for r, g in zip(ref, got):
        if r.shape != g.shape:
            raise ValidationError(f"segmentation outputs: expected matching shapes, got {r.shape} and {g.shape}")
        for i in range(r.shape[0]):
            a, b = r[i], g[i]
            c_ax = None if layout == "NHW" or a.ndim < 3 else _channel_axis(a.shape, layout)
            if c_ax is not None and a.shape[c_ax] > 1:
                ma, mb = a.argmax(c_ax), b.argmax(c_ax)
                how = f"argmax over {a.shape[c_ax]} channels"
            else:
                a2 = a if c_ax is None else a.take(0, axis=c_ax)
                b2 = b if c_ax is None else b.take(0, axis=c_ax)
                t = 0.5 if float(a2.min()) >= 0.0 and float(a2.max()) <= 1.0 else 0.0
                ma, mb = (a2 >= t).astype(np.int64), (b2 >= t).astype(np.int64)
                how = f"one channel thresholded at {t:g}"
                ma, mb = np.where(ma > 0, 1, -1), np.where(mb > 0, 1, -1)  # background is not a class here
            per = []
            for k in np.union1d(np.unique(ma), np.unique(mb)):
                if k < 0:
                    continue
                inter = np.logical_and(ma == k, mb == k).sum()
                union = np.logical_or(ma == k, mb == k).sum()
                per.append(inter / union if union else 1.0)
            vals.append(float(np.mean(per)) if per else 1.0)
    return (float(np.mean(vals)) if vals else 1.0), how


Outputs = Mapping[str, "np.ndarray | Sequence[np.ndarray]"]


def per_sample(v: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """One output over samples as a list of per-sample arrays (a stacked array is split along axis 0)."""
    if isinstance(v, np.ndarray):
        return [v[i : i + 1] for i in range(v.shape[0])]
    return [np.asarray(x) for x in v]


def stack_outputs(per: Mapping[str, Sequence[np.ndarray]]) -> dict[str, np.ndarray | list[np.ndarray]]:
    """Per-sample outputs stacked along axis 0 where every sample's shape agrees; kept as a list where shapes vary
    (dynamic dims: a text line's positions follow its width)."""
    out: dict[str, np.ndarray | list[np.ndarray]] = {}
    for k, v in per.items():
        out[k] = np.concatenate(v, axis=0) if len({x.shape[1:] for x in v}) <= 1 else list(v)
    return out


def detection_rows(decoded: Any) -> np.ndarray:
    """A decoder's detections (an object with ``xyxy``, ``scores``, ``class_ids``, or a list of them) as [N, 6] rows."""
    items = decoded if isinstance(decoded, (list, tuple)) else [decoded]
    rows = [
        np.column_stack([np.asarray(d.xyxy, np.float64).reshape(-1, 4), np.asarray(d.scores, np.float64).reshape(-1), np.asarray(d.class_ids, np.float64).reshape(-1)])
        for d in items if d is not None
    ]  # fmt: skip
    return np.concatenate(rows) if rows else np.zeros((0, 6))


# ------------------------------------------------------------------ raw detection heads

#: ``--detection-format`` values: how a raw detection head (no decoder in the package) is read.
DETECTION_FORMATS = ("auto", "yolov8", "yolov5", "ssd", "blazeface", "rows")
BLAZEFACE_SCORE = 0.5  # MediaPipe's face detection graph: min_score_thresh 0.5
NMS_IOU = 0.45


@dataclass(frozen=True)
class DetectionFormat:
    """How the converter decodes a raw detection head into [N, 6] rows (x1, y1, x2, y2, score, class), the same way
    for the reference and every variant: boxes with score >= ``score_threshold``, then NMS (``NMS_IOU``, per class).

    ``kind``: ``yolov8`` (one output [B, 4 + C, N] or [B, N, 4 + C]: cx, cy, w, h, class scores; the box axis is the
    longer one), ``yolov5`` ([B, N, 5 + C]: cx, cy, w, h, objectness, class scores; score = obj x class),
    ``ssd`` (boxes [B, N, 4] x1, y1, x2, y2 and scores [B, N, C]; logits go through a sigmoid), ``blazeface``
    (MediaPipe's regressors [B, 896, 4 + 2K] and logits [B, 896, 1] on the short-range anchors; weighted NMS, as
    MediaPipe's graph) or ``rows`` ([B, N, 6+]: x1, y1, x2, y2, score, class; no NMS). ``outputs``: the output names it
    reads; ``why``: what it assumed, for the notes."""

    kind: str
    outputs: tuple[str, ...]
    score_threshold: float = SCORE_THRESHOLD
    input_hw: tuple[int, int] | None = None
    why: str = ""

    def decode(self, outs: Mapping[str, np.ndarray]) -> np.ndarray:
        """One sample's outputs -> [N, 6] rows."""
        from edge_sdk.processing import detection as D

        if self.kind == "rows":
            x = np.asarray(outs[self.outputs[0]], np.float64)
            r = x.reshape(-1, x.shape[-1])[:, :6]
            r = r[np.isfinite(r).all(1)]
            return r[r[:, 4] >= self.score_threshold] if len(r) else r.reshape(0, 6)
        if self.kind in ("yolov8", "yolov5"):
            layout = "xywh+classes" if self.kind == "yolov8" else "xywh+obj+classes"
            d = D.decode_yolo(np.asarray(outs[self.outputs[0]]), layout=layout, score_threshold=self.score_threshold, iou_threshold=NMS_IOU, max_detections=None, clip=False)
            return detection_rows(d)
        if self.kind == "blazeface":
            d = D.decode_blazeface(outs[self.outputs[0]], outs[self.outputs[1]], input_size=self.input_hw or (128, 128), score_threshold=self.score_threshold)
            return detection_rows(d)
        boxes = np.asarray(outs[self.outputs[0]], np.float64).reshape(-1, 4)
        sc = np.asarray(outs[self.outputs[1]], np.float64)
        sc = sc.reshape(boxes.shape[0], -1)
        if sc.size and (float(np.nanmin(sc)) < 0.0 or float(np.nanmax(sc)) > 1.0):
            sc = 1.0 / (1.0 + np.exp(-np.clip(sc, -100, 100)))
        cid = sc.argmax(1) if sc.shape[1] else np.zeros(len(boxes), np.int64)
        score = sc[np.arange(len(boxes)), cid] if sc.shape[1] else np.zeros(len(boxes))
        ok = (score >= self.score_threshold) & np.isfinite(boxes).all(1) & np.isfinite(score)
        boxes, score, cid = boxes[ok], score[ok], cid[ok]
        keep = D.nms(boxes, score, NMS_IOU, class_ids=cid)
        return np.column_stack([boxes[keep], score[keep], cid[keep].astype(np.float64)]) if len(keep) else np.zeros((0, 6))


def detection_format(sample: Mapping[str, np.ndarray], fmt: str = "auto", input_hw: tuple[int, int] | None = None) -> DetectionFormat | None:
    """The :class:`DetectionFormat` of a raw head, from one sample's outputs (name -> array with batch 1): ``fmt``
    names it (a ValidationError when the outputs do not have that form), or ``"auto"`` tells it from the shapes:
    one [1, A, B] output: ``rows`` when B == 6, ``yolov8`` when A < B (channels first, as Ultralytics exports it),
    ``yolov5`` when A > B > 6; two outputs over the same N: ``blazeface`` for [1, 896, 4 + 2K] + [1, 896, 1], else
    ``ssd`` for [1, N, 4] + [1, N, C]. None when auto finds none of these."""
    if fmt not in DETECTION_FORMATS:
        raise ValidationError(f"detection format: expected one of {list(DETECTION_FORMATS)}, got {fmt!r}")
    r3 = {k: v.shape for k, v in sample.items() if v.ndim == 3 and v.shape[0] == 1}
    shapes = {k: list(v.shape) for k, v in sample.items()}
    one = next(iter(r3), None)
    pair = None
    for a in r3:
        for b in r3:
            if a == b or r3[a][1] != r3[b][1] or pair is not None:
                continue
            if r3[a][2] == 4 or (r3[a][2] > 4 and (r3[a][2] - 4) % 2 == 0 and r3[b][2] == 1):
                pair = (a, b)  # (boxes or regressors, scores)
    if fmt == "auto":
        if pair is not None:
            a, b = pair
            if r3[a][1] == 896 and r3[b][2] == 1 and r3[a][2] > 4:
                return DetectionFormat("blazeface", pair, BLAZEFACE_SCORE, input_hw, f"auto: BlazeFace (regressors {a!r} {list(r3[a])}, logits {b!r} {list(r3[b])}, MediaPipe's 896 short-range anchors)")
            if r3[a][2] == 4:
                return DetectionFormat("ssd", pair, SCORE_THRESHOLD, input_hw, f"auto: SSD-style boxes {a!r} {list(r3[a])} (x1, y1, x2, y2) + scores {b!r} {list(r3[b])}")
        if len(r3) == 1 and one is not None:
            _, d1, d2 = r3[one]
            if d2 == 6:
                return DetectionFormat("rows", (one,), why=f"auto: rows of {one!r} {list(r3[one])} (x1, y1, x2, y2, score, class)")
            if 5 <= d1 < d2:
                return DetectionFormat("yolov8", (one,), why=f"auto: YOLOv8 head {one!r} {list(r3[one])} = [B, 4 + {d1 - 4} classes, {d2} boxes] (cx, cy, w, h, class scores)")
            if d1 > d2 > 6:
                return DetectionFormat("yolov5", (one,), why=f"auto: YOLOv5 head {one!r} {list(r3[one])} = [B, {d1} boxes, 5 + {d2 - 5} classes] (cx, cy, w, h, objectness, class scores); give --detection-format yolov8 for a [B, N, 4 + C] head without objectness")
        return None
    if fmt in ("blazeface", "ssd"):
        if pair is None:
            raise ValidationError(f"detection format {fmt}: expected two outputs [1, N, 4 + 2K or 4] and [1, N, C] over the same N, got {shapes}")
        score = BLAZEFACE_SCORE if fmt == "blazeface" else SCORE_THRESHOLD
        return DetectionFormat(fmt, pair, score, input_hw, f"--detection-format {fmt}: outputs {list(pair)}")
    if one is None:
        raise ValidationError(f"detection format {fmt}: expected a [1, A, B] output, got {shapes}")
    _, d1, d2 = r3[one]
    need = {"yolov8": min(d1, d2) >= 5, "yolov5": d2 >= 6, "rows": d2 >= 6}[fmt]
    if not need:
        raise ValidationError(f"detection format {fmt}: output {one!r} {list(r3[one])} does not have that form")
    return DetectionFormat(fmt, (one,), why=f"--detection-format {fmt}: output {one!r} {list(r3[one])}")


def input_hw(specs: Sequence[TensorSpec]) -> tuple[int, int] | None:
    """(height, width) of the first image input: its preprocess size, else fixed H and W dims of an NCHW/NHWC input."""
    for sp in specs:
        if sp.preprocess is not None:
            return (int(sp.preprocess.size_hw[0]), int(sp.preprocess.size_hw[1]))
        if sp.layout in ("NCHW", "NHWC") and len(sp.shape) == 4:
            h, w = (sp.shape[2], sp.shape[3]) if sp.layout == "NCHW" else (sp.shape[1], sp.shape[2])
            if isinstance(h, int) and isinstance(w, int):
                return (h, w)
    return None


@dataclass(frozen=True)
class Comparison:
    """The quality figures of one variant's outputs against the reference's, with notes on what could not be measured."""
    quality: Quality
    notes: tuple[str, ...] = ()


def compare(
    ref: Outputs,
    got: Outputs,
    *,
    task: str,
    class_output: str | None,
    labels: Sequence[Any] | None,
    reference_id: str,
    dataset: str,
    blank: int = 0,
    ref_boxes: Sequence[np.ndarray] | None = None,
    got_boxes: Sequence[np.ndarray] | None = None,
    seg_layout: str = "NCHW",
    detection: str | DetectionFormat = "auto",
    input_hw: tuple[int, int] | None = None,
) -> Comparison:
    """Quality of ``got`` against ``ref``: per output name, either an array stacked over samples on axis 0 or a list
    of per-sample arrays (shapes that vary from sample to sample).

    Task figures: ``sequence`` (CTC/token outputs ``[batch, positions, classes]``, the first rank-3 output):
    position agreement, decoded exact match and edit distance (``blank`` is the CTC blank index); ``detection``: box
    recall and IoU of the variant's boxes against the reference's (``ref_boxes``/``got_boxes``, decoded [N, 6] rows per
    sample, when the package has a detection decoder; else the raw head decoded the same way for both by
    ``detection``, a :class:`DetectionFormat` or a ``--detection-format`` name, ``"auto"`` by default, with
    ``input_hw`` the model input's (height, width)); ``segmentation``: mask IoU (the first output, ``seg_layout``).
    A task figure that cannot be measured is left out, with a note saying why.

    Outputs that are NaN or infinite where the reference's are finite (an fp16 overflow) are counted per sample in
    ``nonfinite_samples`` (a gate failure); cosine and max abs error are then over the values finite in both, and a
    figure that still comes out non-finite is left out (None) with a note: nothing non-finite reaches a manifest."""
    names = sorted(ref)
    rs = {k: per_sample(ref[k]) for k in names}
    gs = {k: per_sample(got[k]) for k in names}
    a = np.concatenate([x.astype(np.float64).ravel() for k in names for x in rs[k]])
    b = np.concatenate([x.astype(np.float64).ravel() for k in names for x in gs[k]])
    n = len(rs[names[0]])
    if a.shape != b.shape:
        raise ValidationError(f"outputs differ in size from the reference's ({b.size} vs {a.size} values)")
    notes: list[str] = []
    both = np.isfinite(a) & np.isfinite(b)
    bad = 0
    if not both.all():
        for i in range(n):
            bad += any(bool((~np.isfinite(gs[k][i]) & np.isfinite(rs[k][i])).any()) for k in names if gs[k][i].shape == rs[k][i].shape)
        if bad:
            notes.append(f"outputs non-finite (NaN or inf) in {bad} of {n} samples where the reference's are finite; cosine and max abs error over the {int(both.sum())} of {a.size} values finite in both")
        a, b = a[both], b[both]
    kw: dict[str, Any] = {"reference": reference_id, "cosine": round(_cosine(a, b), 6), "max_abs_error": float(np.abs(a - b).max()) if a.size else 0.0, "dataset": dataset, "samples": n}
    if bad:
        kw["nonfinite_samples"] = bad
    stacked = {k: ref[k] if isinstance(ref[k], np.ndarray) else None for k in names}
    co = class_output
    if co is None and task not in ("detection", "sequence", "segmentation") and len(names) == 1:
        r0 = stacked[names[0]]
        if r0 is not None and r0.ndim == 2 and r0.shape[1] > 1:
            co = names[0]
    if co is not None and isinstance(ref[co], np.ndarray) and isinstance(got[co], np.ndarray):
        rc, gc = np.asarray(ref[co]), np.asarray(got[co])
        r, g = rc.reshape(n, -1), gc.reshape(n, -1)
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
    if task == "sequence":
        seq = next((k for k in names if rs[k][0].ndim == 3), None)
        if seq is None:
            notes.append(f"sequence figures not measured: no output is [batch, positions, classes] (shapes {[rs[k][0].shape for k in names]})")
        else:
            kw.update(sequence_figures(rs[seq], gs[seq], blank))
            notes.append(f"sequence figures on output {seq!r} (greedy CTC decoding, blank {blank})")
    if task == "detection":
        rb = gb = None
        thr = SCORE_THRESHOLD
        if ref_boxes is not None and got_boxes is not None:
            rb, gb, src = list(ref_boxes), list(got_boxes), "decoded by the package's detection decoder"
        else:
            fmt = detection if isinstance(detection, DetectionFormat) else detection_format({k: rs[k][0] for k in names}, detection, input_hw)
            if fmt is None:
                notes.append(
                    f"box figures not measured: the package has no detection decoder and the outputs {[list(rs[k][0].shape) for k in names]} are none of "
                    "the raw heads read (YOLOv8 [B, 4+C, N], YOLOv5 [B, N, 5+C], SSD boxes [B, N, 4] + scores [B, N, C], BlazeFace, [B, N, 6] rows); give --detection-format"
                )
            else:
                try:
                    rb = [fmt.decode({k: rs[k][i] for k in names}) for i in range(n)]
                    gb = [fmt.decode({k: gs[k][i] for k in names}) for i in range(n)]
                except (ValueError, KeyError) as e:
                    notes.append(f"box figures not measured: decoding the outputs as {fmt.kind} failed: {e}")
                    rb = gb = None
                src = f"raw head decoded as {fmt.kind}: {fmt.why}; NMS IoU {NMS_IOU}" if fmt.kind != "rows" else f"{fmt.why}"
                thr = fmt.score_threshold
        if rb is not None and gb is not None:
            keep = lambda x: x[x[:, 4] >= thr] if len(x) else x.reshape(0, 6)  # noqa: E731
            rec, iou, prec, nref = box_agreement([keep(x) for x in rb], [keep(x) for x in gb])
            kw["box_recall"], kw["box_iou"] = rec, iou
            notes.append(f"box figures ({src}, score >= {thr}): {nref} reference box(es), recall {rec:.4f}, mean IoU {iou:.4f}, precision {prec:.4f}")
        if labels is not None:
            out = got[names[0]]
            if not isinstance(out, np.ndarray):
                raise ValidationError("detection labels: the first output varies in shape between samples; expected [1, N, 6+] rows")
            preds = [out[i].reshape(-1, out.shape[-1]) for i in range(n)]
            truths = [np.asarray(t, dtype=np.float64).reshape(-1, 5) for t in labels]
            if len(truths) != n:
                raise ValidationError(f"labels: expected boxes for {n} samples, got {len(truths)}")
            p, rcl = detection_precision_recall(preds, truths)
            kw["metric"], kw["value"] = "f1@iou0.5", (2 * p * rcl / (p + rcl) if p + rcl else 0.0)
            notes.append(f"IoU-matched precision {p:.4f}, recall {rcl:.4f} (IoU 0.5, score >= 0.25)")
    if task == "segmentation":
        seg = names[0]
        if rs[seg][0].ndim < 3:
            notes.append(f"mask IoU not measured: output {seg!r} is {rs[seg][0].shape}, expected [1, C, H, W], [1, H, W, C] or [1, H, W]")
        else:
            kw["mask_iou"], how = mask_iou(rs[seg], gs[seg], seg_layout if rs[seg][0].ndim == 4 else "NHW")
            notes.append(f"mask IoU on output {seg!r} ({how})")
    for k, v in list(kw.items()):
        if isinstance(v, float) and not math.isfinite(v):
            notes.append(f"{k} not recorded: it came out {v}")
            kw[k] = None
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

    def outputs(self, vid: str, samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
        """Run variant ``vid`` on each sample and return its outputs, concatenated along the batch axis per output name
        (a list of per-sample arrays where their shapes vary, :func:`stack_outputs`)."""
        return self.outputs_and_boxes(vid, samples)[0]

    def outputs_and_boxes(self, vid: str, samples: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, Any], list[np.ndarray] | None]:
        """:meth:`outputs`, and with a detection decoder each sample's decoded boxes as [N, 6] rows (else None)."""
        model = self.model(vid)
        per: dict[str, list[np.ndarray]] = {}
        boxes: list[np.ndarray] | None = [] if self.pkg.manifest.decoder.kind == "detection" else None
        for s in samples:
            r = model.predict(self.feeds(vid, s))
            for k, v in r.outputs.items():
                per.setdefault(k, []).append(np.asarray(v))
            if boxes is not None:
                boxes.append(detection_rows(r.decoded))
        return stack_outputs(per), boxes

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
    blank: int = 0,
    detection: str = "auto",
) -> dict[str, VariantReport]:
    """Measure every variant against the reference. ``samples`` are laid out for
    the package-level input specs (the reference's).

    With a classification decoder and class ``labels``, each report's ``calibration`` holds the ECE (``n_bins``
    bins) on the raw scores and after the variant's manifest ``temperature``; with ``calibrate_temperature`` a
    temperature is fitted per variant instead, on ``fit_samples``/``fit_labels`` when given (``fit_source`` names
    them), else on ``samples``/``labels`` themselves (then the after figures are optimistic). ``blank``: the CTC blank
    index for ``task = "sequence"`` (:func:`compare`); ``detection``: how a raw detection head is read when the package
    has no detection decoder (:data:`DETECTION_FORMATS`, :func:`detection_format`)."""
    pkg = package if isinstance(package, ModelPackage) else ModelPackage.open(package)
    m = pkg.manifest
    if not samples:
        raise ValidationError("no validation samples")
    ref = m.reference_variant
    meas = Measurer(pkg, profile, threads, cache_dir)
    try:
        ref_out, ref_boxes = meas.outputs_and_boxes(ref.id, samples)
        seg_layout = str(m.decoder.param("layout", "NCHW")) if m.decoder.kind == "segmentation" else "NCHW"
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
            got, got_boxes = (ref_out, ref_boxes) if v.id == ref.id else meas.outputs_and_boxes(v.id, samples)
            c = compare(
                ref_out, got, task=m.task, class_output=class_output, labels=labels, reference_id=ref.id, dataset=dataset,
                blank=blank, ref_boxes=ref_boxes, got_boxes=got_boxes, seg_layout=seg_layout, detection=detection,
                input_hw=input_hw(m.inputs),
            )  # fmt: skip
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
