"""Object detection results and decoders: boxes, NMS, SSD anchors, BlazeFace, YOLO.

Pure numpy; no runtime is imported. Coordinates are pixels, ``xyxy`` =
(x_min, y_min, x_max, y_max) with x to the right and y down; a box covers the
continuous area between its edges (a 1-pixel box at column 3 is x 3..4).

Decoders return boxes in the *source image* frame when given the
:class:`~edge_sdk.processing.image.ImageTransform` that ``preprocess_image``
returned (``x_src = (x_model - pad_x) / scale_x``), otherwise in model-input
pixels.

Example::

    x, tf = preprocess_image(img, spec)                      # letterbox 128x128
    reg, cls = interpreter_outputs(x)                        # [1,896,16], [1,896,1]
    faces = decode_blazeface(reg, cls, blazeface_short_range_anchors(),
                             input_size=(128, 128), transform=tf)
    for f in faces:                                          # Detection rows
        print(f.label, round(f.score, 2), f.bbox.xyxy, f.keypoints[0])
    big = faces[faces.areas() > 50 * 50]                     # boolean-mask indexing
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import OptionsError

if TYPE_CHECKING:  # only for annotations: image.py is not needed to decode
    from .image import ImageTransform

__all__ = [
    "BBox",
    "Detection",
    "Detections",
    "WeightedNMS",
    "box_iou",
    "nms",
    "weighted_nms",
    "ssd_anchors",
    "blazeface_short_range_anchors",
    "BLAZEFACE_SHORT_RANGE_ANCHORS",
    "BLAZEFACE_KEYPOINTS",
    "decode_blazeface",
    "decode_yolo",
    "YOLO_LAYOUTS",
]


# --------------------------------------------------------------------------
# single box


@dataclass(frozen=True)
class BBox:
    """One axis-aligned box in pixels (immutable). ``xmax >= xmin`` and ``ymax >= ymin``.

    >>> BBox(0, 0, 10, 10).iou(BBox(5, 0, 15, 10))
    0.3333333333333333
    """

    xmin: float
    ymin: float
    xmax: float
    ymax: float

    def __post_init__(self) -> None:
        vals = []
        for name in ("xmin", "ymin", "xmax", "ymax"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"BBox.{name}: expected a number, got {type(v).__name__} {v!r}")
            v = float(v)
            if not math.isfinite(v):
                raise ValueError(f"BBox.{name}: expected a finite number, got {v}")
            object.__setattr__(self, name, v)
            vals.append(v)
        if vals[2] < vals[0] or vals[3] < vals[1]:
            raise ValueError(f"BBox: expected xmin <= xmax and ymin <= ymax, got xyxy={tuple(vals)}")

    @classmethod
    def from_xywh(cls, x: float, y: float, w: float, h: float) -> "BBox":
        """From the top-left corner and size."""
        return cls(x, y, x + w, y + h)

    @property
    def xyxy(self) -> tuple[float, float, float, float]:
        """(xmin, ymin, xmax, ymax)."""
        return (self.xmin, self.ymin, self.xmax, self.ymax)

    @property
    def width(self) -> float:
        """xmax - xmin."""
        return self.xmax - self.xmin

    @property
    def height(self) -> float:
        """ymax - ymin."""
        return self.ymax - self.ymin

    @property
    def area(self) -> float:
        """width * height."""
        return self.width * self.height

    @property
    def center(self) -> tuple[float, float]:
        """(x, y) of the centre."""
        return ((self.xmin + self.xmax) / 2.0, (self.ymin + self.ymax) / 2.0)

    def contains(self, x: float, y: float) -> bool:
        """True when the point (x, y) lies inside or on the edge."""
        return self.xmin <= x <= self.xmax and self.ymin <= y <= self.ymax

    def intersect(self, other: "BBox") -> "BBox | None":
        """The overlap of two boxes, or None when they do not overlap (touching edges give a 0-area box)."""
        x0, y0 = max(self.xmin, other.xmin), max(self.ymin, other.ymin)
        x1, y1 = min(self.xmax, other.xmax), min(self.ymax, other.ymax)
        if x1 < x0 or y1 < y0:
            return None
        return BBox(x0, y0, x1, y1)

    def iou(self, other: "BBox") -> float:
        """Intersection over union in [0, 1]; 0.0 when both boxes have no area."""
        inter = self.intersect(other)
        ia = inter.area if inter is not None else 0.0
        union = self.area + other.area - ia
        return ia / union if union > 0 else 0.0

    def scale(self, sx: float, sy: float) -> "BBox":
        """Every coordinate multiplied (x by ``sx``, y by ``sy``; both > 0)."""
        if not (sx > 0 and sy > 0):
            raise ValueError(f"BBox.scale: expected positive factors, got sx={sx}, sy={sy}")
        return BBox(self.xmin * sx, self.ymin * sy, self.xmax * sx, self.ymax * sy)

    def translate(self, dx: float, dy: float) -> "BBox":
        """The box moved by (``dx``, ``dy``)."""
        return BBox(self.xmin + dx, self.ymin + dy, self.xmax + dx, self.ymax + dy)


class Detection(NamedTuple):
    """One row of :class:`Detections` (what iterating over it yields).

    ``keypoints``: ((x, y), ...) in the same frame as ``bbox``, or None."""

    bbox: BBox
    score: float
    class_id: int
    label: str
    keypoints: tuple[tuple[float, float], ...] | None


# --------------------------------------------------------------------------
# many boxes


_I32 = np.iinfo(np.int32)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _names(d: "Detections") -> tuple[str, ...]:
    """``d.labels``: always a tuple once ``__post_init__`` has run (None is only the constructor's default)."""
    labels = d.labels
    assert labels is not None
    return labels


def _as_float32(name: str, v: Any) -> np.ndarray:
    a = np.asarray(v)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"Detections.{name}: expected a numeric array, got dtype {a.dtype}")
    return np.array(a, dtype=np.float32, copy=True)


@dataclass(frozen=True, eq=False)
class Detections:
    """N detections of one image as a struct of arrays (immutable: the arrays are read-only copies).

    - ``xyxy``: float32 [N, 4] boxes in pixels (finite, x1 <= x2, y1 <= y2).
    - ``scores``: float32 [N] in [0, 1] for the decoders here.
    - ``class_ids``: int32 [N].
    - ``labels``: one name per detection (``str(class_id)`` when not given).
    - ``keypoints``: optional float32 [N, K, 2] (x, y) in the same frame as the boxes.

    Indexing with a boolean mask, an integer array, a slice or an int gives a new
    ``Detections`` (``dets[dets.scores > 0.5]``); iterating yields :class:`Detection` rows.
    Shapes are checked on construction (ValueError says expected vs actual).
    """

    xyxy: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    labels: tuple[str, ...] | None = None
    keypoints: np.ndarray | None = None

    def __post_init__(self) -> None:
        xyxy = _as_float32("xyxy", self.xyxy)
        if xyxy.size == 0 and xyxy.ndim < 2:
            xyxy = xyxy.reshape(0, 4)
        if xyxy.ndim != 2 or xyxy.shape[1] != 4:
            raise ValueError(f"Detections.xyxy: expected shape [N, 4], got {list(xyxy.shape)}")
        n = xyxy.shape[0]
        if not np.isfinite(xyxy).all():
            raise ValueError("Detections.xyxy: boxes must be finite (found NaN or Inf)")
        bad = np.flatnonzero((xyxy[:, 2] < xyxy[:, 0]) | (xyxy[:, 3] < xyxy[:, 1]))
        if bad.size:
            raise ValueError(f"Detections.xyxy: expected x1 <= x2 and y1 <= y2, row {int(bad[0])} is {xyxy[bad[0]].tolist()}")
        scores = _as_float32("scores", self.scores)
        if scores.size == 0 and n == 0:
            scores = scores.reshape(0)
        if scores.shape != (n,):
            raise ValueError(f"Detections.scores: expected shape [{n}], got {list(scores.shape)}")
        cid = np.asarray(self.class_ids)
        if cid.size == 0:
            cid = cid.reshape(0).astype(np.int32)
        if cid.dtype.kind not in "iu":
            raise TypeError(f"Detections.class_ids: expected integers, got dtype {cid.dtype}")
        if cid.shape != (n,):
            raise ValueError(f"Detections.class_ids: expected shape [{n}], got {list(cid.shape)}")
        if n and not np.can_cast(cid.dtype, np.int32) and (cid.min() < _I32.min or cid.max() > _I32.max):
            raise ValueError("Detections.class_ids: values do not fit int32")
        cid = np.array(cid, dtype=np.int32, copy=True)
        if self.labels is None:
            labels = tuple(str(int(c)) for c in cid)
        else:
            if isinstance(self.labels, str):
                raise TypeError("Detections.labels: expected a sequence of names, got one str")
            labels = tuple(self.labels)
            if len(labels) != n:
                raise ValueError(f"Detections.labels: expected {n} names (one per detection), got {len(labels)}")
            if not all(isinstance(s, str) for s in labels):
                raise TypeError("Detections.labels: every label must be a str")
        kp = None
        if self.keypoints is not None:
            kp = _as_float32("keypoints", self.keypoints)
            if kp.ndim != 3 or kp.shape[0] != n or kp.shape[2] != 2:
                raise ValueError(f"Detections.keypoints: expected shape [{n}, K, 2], got {list(kp.shape)}")
            kp = _frozen(kp)
        object.__setattr__(self, "xyxy", _frozen(xyxy))
        object.__setattr__(self, "scores", _frozen(scores))
        object.__setattr__(self, "class_ids", _frozen(cid))
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "keypoints", kp)

    # -- constructors ---------------------------------------------------------

    @classmethod
    def _made(
        cls, xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, labels: tuple[str, ...], keypoints: np.ndarray | None
    ) -> "Detections":
        """For the decoders here: arrays they made themselves (fresh, unshared: float32 [N, 4] boxes,
        float32 [N] scores, int32 [N] ids, N labels, float32 [N, K, 2] keypoints or None), frozen in
        place instead of copied. The boxes' checks still run (finite, x1 <= x2, y1 <= y2), in two
        reductions; a box that fails them goes through the full constructor, which says which."""
        if not (np.isfinite(xyxy).all() and (xyxy[:, 2:] >= xyxy[:, :2]).all()):
            return cls(xyxy, scores, class_ids, labels, keypoints)
        d = object.__new__(cls)
        object.__setattr__(d, "xyxy", _frozen(xyxy))
        object.__setattr__(d, "scores", _frozen(scores))
        object.__setattr__(d, "class_ids", _frozen(class_ids))
        object.__setattr__(d, "labels", labels)
        object.__setattr__(d, "keypoints", None if keypoints is None else _frozen(keypoints))
        return d

    @classmethod
    def empty(cls, num_keypoints: int | None = None) -> "Detections":
        """No detections (with a [0, K, 2] keypoints array when ``num_keypoints`` is given)."""
        kp = None if num_keypoints is None else np.zeros((0, num_keypoints, 2), np.float32)
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), (), kp)

    @classmethod
    def merge(cls, items: Iterable["Detections"]) -> "Detections":
        """Concatenate in order. Empty items are skipped; the rest must agree on
        keypoints (all None, or all with the same K). ``merge([])`` is ``empty()``."""
        items = list(items)
        for d in items:
            if not isinstance(d, Detections):
                raise TypeError(f"Detections.merge: expected Detections, got {type(d).__name__}")
        full = [d for d in items if len(d)]
        if not full:
            return items[0] if items else cls.empty()
        ks = {None if d.keypoints is None else d.keypoints.shape[1] for d in full}
        if len(ks) != 1:
            raise ValueError(f"Detections.merge: keypoints disagree (K per item: {sorted(ks, key=str)}); all or none must have the same K")
        k = ks.pop()
        return cls(
            np.concatenate([d.xyxy for d in full]),
            np.concatenate([d.scores for d in full]),
            np.concatenate([d.class_ids for d in full]),
            tuple(s for d in full for s in _names(d)),
            None if k is None else np.concatenate([d.keypoints for d in full if d.keypoints is not None]),  # k: all have them
        )

    # -- container protocol ---------------------------------------------------

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    def __getitem__(self, index: Any) -> "Detections":
        n = len(self)
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            i = int(index)
            if not -n <= i < n:
                raise IndexError(f"detection index {i} out of range for {n} detections")
            idx = np.array([i % n])
        elif isinstance(index, slice):
            idx = np.arange(n)[index]
        else:
            a = np.asarray(index)
            if a.dtype == np.bool_:
                if a.shape != (n,):
                    raise IndexError(f"boolean mask: expected shape [{n}], got {list(a.shape)}")
                idx = np.flatnonzero(a)
            elif a.dtype.kind in "iu" or a.size == 0:
                idx = a.astype(np.intp).reshape(-1)
                if idx.size and (idx.min() < -n or idx.max() >= n):
                    raise IndexError(f"index array has values outside [-{n}, {n}) for {n} detections")
            else:
                raise IndexError(
                    f"Detections index: expected int, slice, bool mask or int array, got {type(index).__name__} of dtype {a.dtype}"
                )
        names = _names(self)
        return Detections(
            self.xyxy[idx],
            self.scores[idx],
            self.class_ids[idx],
            tuple(names[int(i)] for i in idx),
            None if self.keypoints is None else self.keypoints[idx],
        )

    def __iter__(self) -> Iterator[Detection]:
        return (self._row(i) for i in range(len(self)))

    def __repr__(self) -> str:
        k = "" if self.keypoints is None else f", keypoints={self.keypoints.shape[1]}"
        return f"Detections(n={len(self)}, labels={sorted(set(_names(self)))}{k})"

    def _row(self, i: int) -> Detection:
        kp = None
        if self.keypoints is not None:
            kp = tuple((float(x), float(y)) for x, y in self.keypoints[i].tolist())
        return Detection(BBox(*self.xyxy[i].tolist()), float(self.scores[i]), int(self.class_ids[i]), _names(self)[i], kp)

    # -- derived ----------------------------------------------------------------

    def boxes(self) -> tuple[BBox, ...]:
        """One :class:`BBox` per detection."""
        return tuple(BBox(*r) for r in self.xyxy.tolist())

    def areas(self) -> np.ndarray:
        """float32 [N] box areas in square pixels."""
        areas: np.ndarray = (self.xyxy[:, 2] - self.xyxy[:, 0]) * (self.xyxy[:, 3] - self.xyxy[:, 1])
        return areas

    def sorted(self) -> "Detections":
        """Best score first; ties keep their order."""
        return self[np.argsort(-self.scores, kind="stable")]

    def nms(
        self,
        iou_threshold: float = 0.5,
        *,
        class_aware: bool = True,
        weighted: bool = False,
        max_detections: int | None = None,
    ) -> "Detections":
        """Non-maximum suppression over these detections (best first in the result).

        ``weighted``: MediaPipe-style blending (see :func:`weighted_nms`): each kept
        detection's box and keypoints become the score-weighted mean of the boxes it
        suppressed; its score stays the best one."""
        cls_ids = self.class_ids if class_aware else None
        if not weighted:
            return self[nms(self.xyxy, self.scores, iou_threshold, class_ids=cls_ids, max_detections=max_detections)]
        w = weighted_nms(self.xyxy, self.scores, iou_threshold, class_ids=cls_ids, keypoints=self.keypoints, max_detections=max_detections)
        kept = self[w.indices]
        return Detections(w.xyxy, kept.scores, kept.class_ids, kept.labels, w.keypoints)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"detections": [{"xyxy", "score", "class_id", "label"[, "keypoints"]}, ...]}``."""
        rows = []
        names = _names(self)
        for i in range(len(self)):
            r: dict[str, Any] = {
                "xyxy": [float(v) for v in self.xyxy[i]],
                "score": float(self.scores[i]),
                "class_id": int(self.class_ids[i]),
                "label": names[i],
            }
            if self.keypoints is not None:
                r["keypoints"] = self.keypoints[i].tolist()
            rows.append(r)
        return {"detections": rows}


# --------------------------------------------------------------------------
# NMS


def _check_boxes(boxes: Any, scores: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(boxes, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if b.size == 0:
        b = b.reshape(0, 4)
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"{where}: boxes: expected shape [N, 4] (xyxy), got {list(b.shape)}")
    if s.shape != (b.shape[0],):
        raise ValueError(f"{where}: scores: expected shape [{b.shape[0]}], got {list(s.shape)}")
    if not (np.isfinite(b).all() and np.isfinite(s).all()):
        raise ValueError(f"{where}: boxes and scores must be finite (found NaN or Inf)")
    return b, s


def _check_classes(class_ids: Any, n: int, where: str) -> np.ndarray | None:
    if class_ids is None:
        return None
    c = np.asarray(class_ids)
    if c.shape != (n,):
        raise ValueError(f"{where}: class_ids: expected shape [{n}], got {list(c.shape)}")
    return c


def _check_threshold(t: float, where: str) -> float:
    if not (isinstance(t, (int, float, np.floating)) and 0.0 <= float(t) <= 1.0):
        raise OptionsError(f"{where}: iou_threshold: expected a number in [0, 1], got {t!r}")
    return float(t)


def _check_max(m: int | None, where: str) -> int | None:
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise OptionsError(f"{where}: max_detections: expected None or an int >= 1, got {m!r}")
    return int(m)


def box_iou(a: Any, b: Any) -> np.ndarray:
    """Pairwise IoU: a [N, 4], b [M, 4] (xyxy) -> float64 [N, M]; 0 where the union is empty."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    return _iou(a[:, None, :], _areas(a)[:, None], b[None, :, :], _areas(b)[None, :])


def _areas(b: np.ndarray) -> np.ndarray:
    """Box areas, a negative side counted as 0 (float64 [N, 4] -> [N])."""
    area: np.ndarray = np.maximum(b[:, 2] - b[:, 0], 0.0) * np.maximum(b[:, 3] - b[:, 1], 0.0)
    return area


def _iou(a: np.ndarray, area_a: np.ndarray, b: np.ndarray, area_b: np.ndarray) -> np.ndarray:
    """IoU of boxes ``a`` and ``b`` broadcast against each other (last axis xyxy), given their
    areas; 0 where the union is empty. (np.maximum rather than np.clip: the same values, NaN
    included, without np.clip's Python layers; the masked divide needs no errstate.)"""
    iw = np.maximum(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0.0)
    ih = np.maximum(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0.0)
    inter = iw * ih
    union = area_a + area_b - inter
    out: np.ndarray = np.divide(inter, union, out=np.zeros(inter.shape), where=union > 0)
    return out


def _iou_one(i: int, rest: np.ndarray, b: np.ndarray, areas: np.ndarray) -> np.ndarray:
    """IoU of box ``i`` of ``b`` with the boxes ``rest`` (indices), ``areas`` precomputed."""
    return _iou(b[i], areas[i], b[rest], areas[rest])


def nms(
    boxes: Any,
    scores: Any,
    iou_threshold: float = 0.5,
    *,
    class_ids: Any = None,
    max_detections: int | None = None,
) -> np.ndarray:
    """Greedy non-maximum suppression; returns the kept indices (int64), best score first.

    A box is dropped when its IoU with an already kept box is *greater than*
    ``iou_threshold`` (as torchvision and MediaPipe do; IoU equal to the threshold
    survives). With ``class_ids`` only boxes of the same class suppress each other.
    Order is deterministic: higher score first, equal scores by lower index.
    ``max_detections`` stops after that many are kept. Raises ValueError on bad shapes
    or NaN/Inf.

    >>> nms([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30]], [0.9, 0.8, 0.7], 0.5).tolist()
    [0, 2]
    """
    b, s = _check_boxes(boxes, scores, "nms")
    thr = _check_threshold(iou_threshold, "nms")
    cls = _check_classes(class_ids, b.shape[0], "nms")
    cap = _check_max(max_detections, "nms")
    order = np.argsort(-s, kind="stable")
    areas = _areas(b)
    keep: list[int] = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        if cap is not None and len(keep) >= cap:
            break
        rest = order[1:]
        drop = _iou_one(i, rest, b, areas) > thr
        if cls is not None:
            drop &= cls[rest] == cls[i]
        order = rest[~drop]
    return np.asarray(keep, dtype=np.int64)


class WeightedNMS(NamedTuple):
    """What :func:`weighted_nms` returns: ``indices`` of the leading (best) detection of
    each cluster, best first; ``xyxy`` float32 [M, 4] blended boxes; ``keypoints``
    float32 [M, K, 2] blended keypoints (None when none were given)."""

    indices: np.ndarray
    xyxy: np.ndarray
    keypoints: np.ndarray | None


def weighted_nms(
    boxes: Any,
    scores: Any,
    iou_threshold: float = 0.3,
    *,
    class_ids: Any = None,
    keypoints: Any = None,
    max_detections: int | None = None,
) -> WeightedNMS:
    """MediaPipe's WEIGHTED non-maximum suppression (used by BlazeFace).

    Take the best remaining detection; every remaining detection (of the same class
    when ``class_ids`` is given) whose IoU with it is greater than ``iou_threshold``
    joins its cluster, itself included. The cluster becomes one detection whose box
    and keypoints are the score-weighted means of the members'; its score and index
    are the leader's. Repeat on what is left. Ties: lower index first.
    """
    b, s = _check_boxes(boxes, scores, "weighted_nms")
    thr = _check_threshold(iou_threshold, "weighted_nms")
    cls = _check_classes(class_ids, b.shape[0], "weighted_nms")
    cap = _check_max(max_detections, "weighted_nms")
    kp = None
    if keypoints is not None:
        kp = np.asarray(keypoints, dtype=np.float64)
        if kp.ndim != 3 or kp.shape[0] != b.shape[0] or kp.shape[2] != 2:
            raise ValueError(f"weighted_nms: keypoints: expected shape [{b.shape[0]}, K, 2], got {list(kp.shape)}")
    return _weighted_nms(b, s, thr, cls, cap, kp)


def _weighted_nms(
    b: np.ndarray, s: np.ndarray, thr: float, cls: np.ndarray | None, cap: int | None, kp: np.ndarray | None
) -> WeightedNMS:
    """:func:`weighted_nms` on checked arrays: float64 boxes [N, 4] (finite) and scores [N],
    keypoints float64 [N, K, 2] or None."""
    order = np.argsort(-s, kind="stable")
    areas = _areas(b)
    lead: list[int] = []
    out_b: list[np.ndarray] = []
    out_k: list[np.ndarray] = []
    while order.size:
        i = int(order[0])
        member = _iou_one(i, order, b, areas) > thr
        member[0] = True  # the leader is always in its own cluster (even a zero-area box)
        if cls is not None:
            member &= cls[order] == cls[i]
        m = order[member]
        w = s[m]
        total = w.sum()
        if total > 0:
            out_b.append((b[m] * w[:, None]).sum(0) / total)
            if kp is not None:
                out_k.append((kp[m] * w[:, None, None]).sum(0) / total)
        else:  # all-zero scores: no weights to blend with, keep the leader as it is
            out_b.append(b[i])
            if kp is not None:
                out_k.append(kp[i])
        lead.append(i)
        order = order[~member]
        if cap is not None and len(lead) >= cap:
            break
    k_dim = 0 if kp is None else kp.shape[1]
    return WeightedNMS(
        np.asarray(lead, dtype=np.int64),
        np.asarray(out_b, dtype=np.float32).reshape(-1, 4),
        None if kp is None else np.asarray(out_k, dtype=np.float32).reshape(-1, k_dim, 2),
    )


# --------------------------------------------------------------------------
# SSD anchors (MediaPipe SsdAnchorsCalculator)


def _calc_scale(min_scale: float, max_scale: float, i: int, n: int) -> float:
    if n == 1:
        return (min_scale + max_scale) * 0.5
    return min_scale + (max_scale - min_scale) * i / (n - 1.0)


def ssd_anchors(
    *,
    input_size_hw: tuple[int, int],
    num_layers: int,
    strides: Sequence[int],
    min_scale: float,
    max_scale: float,
    aspect_ratios: Sequence[float] = (1.0,),
    anchor_offset_xy: tuple[float, float] = (0.5, 0.5),
    feature_map_hw: Sequence[tuple[int, int]] | None = None,
    reduce_boxes_in_lowest_layer: bool = False,
    interpolated_scale_aspect_ratio: float = 1.0,
    fixed_anchor_size: bool = False,
) -> np.ndarray:
    """SSD anchors exactly as MediaPipe's ``SsdAnchorsCalculator`` makes them (its
    non-multiscale path; same option names and defaults).

    Returns float32 [N, 4] rows of (x_center, y_center, w, h), normalised to [0, 1]
    of the input. Consecutive layers with the same stride are merged (their anchors
    interleave per cell), as MediaPipe does. With ``fixed_anchor_size`` every w and h
    is 1 (the model predicts sizes in pixels). ``feature_map_hw`` overrides the
    per-layer grid sizes, otherwise ``ceil(input / stride)`` (strides are still needed:
    they decide which layers merge).
    """
    in_h, in_w = (int(v) for v in input_size_hw)
    strides = [int(s) for s in strides]
    if in_h < 1 or in_w < 1:
        raise OptionsError(f"ssd_anchors: input_size_hw must be positive, got {input_size_hw}")
    if len(strides) != num_layers:
        raise OptionsError(f"ssd_anchors: expected {num_layers} strides (num_layers), got {len(strides)}")
    if feature_map_hw is not None and len(feature_map_hw) != num_layers:
        raise OptionsError(f"ssd_anchors: expected {num_layers} feature_map_hw entries, got {len(feature_map_hw)}")
    if any(s < 1 for s in strides):
        raise OptionsError(f"ssd_anchors: strides must be >= 1, got {strides}")
    if not aspect_ratios:
        raise OptionsError("ssd_anchors: aspect_ratios must not be empty")
    n_strides = len(strides)
    out: list[np.ndarray] = []
    layer = 0
    while layer < num_layers:
        ratios: list[float] = []
        scales: list[float] = []
        last = layer
        # MediaPipe merges the run of layers that share this layer's stride
        while last < n_strides and strides[last] == strides[layer]:
            scale = _calc_scale(min_scale, max_scale, last, n_strides)
            if last == 0 and reduce_boxes_in_lowest_layer:
                ratios += [1.0, 2.0, 0.5]
                scales += [0.1, scale, scale]
            else:
                for ar in aspect_ratios:
                    ratios.append(float(ar))
                    scales.append(scale)
                if interpolated_scale_aspect_ratio > 0.0:
                    nxt = 1.0 if last == n_strides - 1 else _calc_scale(min_scale, max_scale, last + 1, n_strides)
                    scales.append(math.sqrt(scale * nxt))
                    ratios.append(float(interpolated_scale_aspect_ratio))
            last += 1
        sq = np.sqrt(np.asarray(ratios, dtype=np.float64))
        sc = np.asarray(scales, dtype=np.float64)
        a_h, a_w = sc / sq, sc * sq
        if feature_map_hw is not None:
            fh, fw = (int(v) for v in feature_map_hw[layer])
        else:
            fh, fw = math.ceil(in_h / strides[layer]), math.ceil(in_w / strides[layer])
        ys, xs = np.meshgrid(np.arange(fh, dtype=np.float64), np.arange(fw, dtype=np.float64), indexing="ij")
        k = len(ratios)
        xc = np.repeat(((xs + anchor_offset_xy[0]) / fw).reshape(-1), k)
        yc = np.repeat(((ys + anchor_offset_xy[1]) / fh).reshape(-1), k)
        if fixed_anchor_size:
            w = np.ones_like(xc)
            h = np.ones_like(xc)
        else:
            w = np.tile(a_w, fh * fw)
            h = np.tile(a_h, fh * fw)
        out.append(np.stack([xc, yc, w, h], axis=1))
        layer = last
    return _frozen(np.concatenate(out).astype(np.float32))


#: The SsdAnchorsCalculator options of MediaPipe's face_detection_short_range graph
#: (mediapipe/modules/face_detection/face_detection_short_range_common.pbtxt;
#: interpolated_scale_aspect_ratio is the proto default 1.0, which
#: face_detection_short_range.pbtxt also sets). 16x16x2 + 8x8x6 = 896 anchors.
BLAZEFACE_SHORT_RANGE_ANCHORS: Mapping[str, Any] = MappingProxyType(
    {
        "input_size_hw": (128, 128),
        "num_layers": 4,
        "min_scale": 0.1484375,
        "max_scale": 0.75,
        "anchor_offset_xy": (0.5, 0.5),
        "strides": (8, 16, 16, 16),
        "aspect_ratios": (1.0,),
        "fixed_anchor_size": True,
        "interpolated_scale_aspect_ratio": 1.0,
        "reduce_boxes_in_lowest_layer": False,
    }
)

#: BlazeFace's 6 keypoints in output order (MediaPipe FaceKeypoint; the subject's
#: right eye appears on the left of an unmirrored photo).
BLAZEFACE_KEYPOINTS = ("right_eye", "left_eye", "nose_tip", "mouth_center", "right_ear_tragion", "left_ear_tragion")


@lru_cache(maxsize=1)
def blazeface_short_range_anchors() -> np.ndarray:
    """The 896 anchors of MediaPipe's short-range face detector (read-only, cached)."""
    return ssd_anchors(**BLAZEFACE_SHORT_RANGE_ANCHORS)


# --------------------------------------------------------------------------
# mapping back to the source image


def _hw(size: int | tuple[int, int], where: str) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        return int(size), int(size)
    try:
        h, w = size  # type: ignore[misc]  # a bool lands here (and fails, as it must): mypy cannot narrow int out
    except (TypeError, ValueError):
        raise OptionsError(f"{where}: input_size: expected an int or (height, width), got {size!r}") from None
    if int(h) < 1 or int(w) < 1:
        raise OptionsError(f"{where}: input_size: expected positive sizes, got {size!r}")
    return int(h), int(w)


def _to_source(
    xyxy: np.ndarray, kps: np.ndarray | None, transform: "ImageTransform | None", *, clip: bool, input_hw: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Model pixels -> source pixels (``(x - pad_x) / scale_x``, likewise y); with
    ``clip`` boxes are clipped to the source frame (to ``input_hw`` without a transform)."""
    xyxy = xyxy.astype(np.float64)
    if kps is not None:
        kps = kps.astype(np.float64)
    frame = input_hw
    if transform is not None:
        (sx, sy), (px, py) = transform.scale_xy, transform.pad_xy
        # the same (v - pad) / scale per element as column by column, in one pass per array
        xyxy = (xyxy - (px, py, px, py)) / (sx, sy, sx, sy)
        if kps is not None:
            kps = (kps - (px, py)) / (sx, sy)
        frame = (int(transform.source_hw[0]), int(transform.source_hw[1]))
    if clip and frame is not None:
        h, w = frame
        xyxy = np.minimum(np.maximum(xyxy, 0.0), (w, h, w, h))
    return xyxy.astype(np.float32), None if kps is None else kps.astype(np.float32)


def _labels_for(ids: np.ndarray, labels: Sequence[str]) -> tuple[str, ...]:
    n = len(labels)
    return tuple(labels[i] if 0 <= i < n else str(i) for i in ids.tolist())


def _sigmoid(x: np.ndarray) -> np.ndarray:
    s: np.ndarray = 1.0 / (1.0 + np.exp(-np.minimum(np.maximum(x, -100.0), 100.0)))
    return s


def _blazeface_keep(logits: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The anchors whose score sigmoid(clip(logit, +-100)) (float64) is >= ``threshold``, and those
    scores. The sigmoid is increasing, so a logit under log(t / (1 - t)) cannot score t: only the
    logits from just under that cut (a margin far wider than the rounding of either side) are
    scored, and the exact test on their scores decides, so the result is the same as scoring all
    (a few of the 896 anchors pass, and scoring them alone saves most of the decode's time)."""
    if 0.0 < threshold < 1.0:
        cand = np.flatnonzero(logits >= math.log(threshold / (1.0 - threshold)) - 1e-3)
        scores = _sigmoid(logits[cand].astype(np.float64))
    else:
        cand = np.arange(logits.shape[0])
        scores = _sigmoid(logits.astype(np.float64))
    ok = scores >= threshold
    return cand[ok], scores[ok]


# --------------------------------------------------------------------------
# BlazeFace


def decode_blazeface(
    regressors: np.ndarray,
    classificators: np.ndarray,
    anchors: np.ndarray | None = None,
    *,
    input_size: int | tuple[int, int] = (128, 128),
    score_threshold: float = 0.5,
    iou_threshold: float = 0.3,
    transform: "ImageTransform | None" = None,
    weighted: bool = True,
    max_detections: int | None = None,
    clip: bool = True,
    label: str = "face",
) -> Detections:
    """Decode MediaPipe BlazeFace outputs into faces, best first.

    ``regressors`` [1, N, 4 + 2K] per anchor: box centre offset x, y, box w, h, then
    K keypoints (x, y), all in input pixels relative to the anchor centre (MediaPipe's
    ``reverse_output_order``; x/y/w/h scale = input width/height). ``classificators``
    [1, N, 1] are logits: score = sigmoid(clip(logit, +-100)). ``anchors`` [N, 4]
    (x_center, y_center, w, h) normalised, from :func:`ssd_anchors`; default: the
    short-range model's 896. ``input_size``: the model input (height, width) or an int.

    Detections with score >= ``score_threshold`` are kept, boxes with negative size
    dropped, then suppressed with weighted NMS at ``iou_threshold`` (MediaPipe's
    graph: 0.5 and 0.3, WEIGHTED) or plain NMS (``weighted=False``). Boxes and the
    K keypoints (:data:`BLAZEFACE_KEYPOINTS` for K = 6) are mapped to the source image
    through ``transform`` and boxes clipped to its frame (``clip``); without a
    transform they stay in input pixels (clipped to the input).
    """
    h_in, w_in = _hw(input_size, "decode_blazeface")
    reg = np.asarray(regressors, dtype=np.float32)
    cls = np.asarray(classificators, dtype=np.float32)
    if reg.ndim == 3:
        if reg.shape[0] != 1:
            raise ValueError(f"decode_blazeface: one image at a time; regressors batch is {reg.shape[0]}")
        reg = reg[0]
    if reg.ndim != 2 or reg.shape[1] < 4 or (reg.shape[1] - 4) % 2:
        raise ValueError(f"decode_blazeface: regressors: expected [1, N, 4 + 2K], got {list(np.shape(regressors))}")
    n = reg.shape[0]
    if cls.size != n:
        raise ValueError(f"decode_blazeface: classificators: expected [1, {n}, 1], got {list(np.shape(classificators))}")
    anc = blazeface_short_range_anchors() if anchors is None else np.asarray(anchors, dtype=np.float32)
    if anc.shape != (n, 4):
        raise ValueError(f"decode_blazeface: anchors: expected [{n}, 4] for {n} regressor rows, got {list(anc.shape)}")
    if not 0.0 <= score_threshold <= 1.0:
        raise OptionsError(f"decode_blazeface: score_threshold: expected [0, 1], got {score_threshold}")
    keep, scores = _blazeface_keep(cls.reshape(n), score_threshold)
    k = (reg.shape[1] - 4) // 2
    if keep.size == 0:
        return Detections.empty(num_keypoints=k)
    r = reg[keep].astype(np.float64)
    a = (_short_range_anchors64() if anchors is None else anc.astype(np.float64))[keep]
    # normalised units, exactly TensorsToDetectionsCalculator::DecodeBoxes: every (x, y) column pair
    # is value / input size * anchor size, plus the anchor centre for the box centre and the K
    # keypoints (not for the box's w, h); the whole [kept, 4 + 2K] block in a few passes
    size_cols, centre_cols, per_input = _blazeface_columns(k, w_in, h_in)
    d = r / per_input * a[:, size_cols]
    d[:, :2] += a[:, :2]
    d[:, 4:] += a[:, centre_cols]
    ok = (d[:, 2] >= 0) & (d[:, 3] >= 0)
    half = d[:, 2:4] / 2
    boxes = np.concatenate((d[:, :2] - half, d[:, :2] + half), axis=1)[ok]
    kps = d[:, 4:].reshape(-1, k, 2)[ok]
    sc = scores[ok]
    if sc.size == 0:
        return Detections.empty(num_keypoints=k)
    # to input pixels (IoU is unchanged by this axis-aligned scaling, so NMS may run here)
    boxes *= (w_in, h_in, w_in, h_in)
    kps *= (w_in, h_in)
    kept_kps: np.ndarray | None
    if weighted:
        # weighted_nms's own checks, on what this function made: the scores are finite (a sigmoid
        # of clipped logits), the shapes are right; a NaN or Inf regressor makes a box fail here
        if not np.isfinite(boxes).all():
            raise ValueError("weighted_nms: boxes and scores must be finite (found NaN or Inf)")
        thr = _check_threshold(iou_threshold, "weighted_nms")
        wn = _weighted_nms(boxes, sc, thr, None, _check_max(max_detections, "weighted_nms"), kps)
        idx, boxes, kept_kps = wn.indices, wn.xyxy, wn.keypoints
    else:
        idx = nms(boxes, sc, iou_threshold, max_detections=max_detections)
        boxes, kept_kps = boxes[idx], kps[idx]
    boxes, kept_kps = _to_source(boxes, kept_kps, transform, clip=clip, input_hw=(h_in, w_in))
    m = idx.size
    return Detections._made(boxes, sc[idx].astype(np.float32), np.zeros(m, np.int32), (label,) * m, kept_kps)


@lru_cache(maxsize=1)
def _short_range_anchors64() -> np.ndarray:
    """:func:`blazeface_short_range_anchors` in float64 (exact: every float32 is a float64)."""
    a = blazeface_short_range_anchors().astype(np.float64)
    a.setflags(write=False)
    return a


@lru_cache(maxsize=16)
def _blazeface_columns(k: int, w_in: int, h_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a [kept, 4 + 2K] regressor block: the anchor columns that scale each (x, y) pair (w, h),
    those that offset the K keypoints (x_center, y_center), and the input size per column."""
    pairs = 2 + k
    cols = (np.array([2, 3] * pairs), np.array([0, 1] * k), np.array((w_in, h_in) * pairs, np.float64))
    for c in cols:
        c.setflags(write=False)  # shared by every call (lru_cache)
    return cols


# --------------------------------------------------------------------------
# YOLO

#: Output layouts :func:`decode_yolo` reads.
YOLO_LAYOUTS = ("xywh+obj+classes", "xywh+classes", "xyxy+score+class")


def decode_yolo(
    output: np.ndarray,
    *,
    layout: str,
    score_threshold: float = 0.25,
    iou_threshold: float = 0.45,
    labels: Sequence[str] = (),
    transform: "ImageTransform | None" = None,
    input_size: int | tuple[int, int] | None = None,
    normalized: bool = False,
    apply_sigmoid: bool = False,
    class_aware: bool = True,
    max_detections: int | None = 300,
    clip: bool = True,
) -> Detections:
    """Decode a YOLO detection head that already holds boxes (exported with its
    grid/anchor decoding inside the graph, as Ultralytics and YOLOv5 exports do).

    ``layout``:

    - ``"xywh+obj+classes"``: YOLOv5/v7-style [1, N, 5 + C]: centre x, y, width,
      height, objectness, C class probabilities; score = obj * class prob.
    - ``"xywh+classes"``: YOLOv8/v11-style [1, 4 + C, N] (channels first, as exported)
      or [1, N, 4 + C]; score = class prob. The channel axis is the one of size
      4 + len(labels), else the smaller one.
    - ``"xyxy+score+class"``: end-to-end exports with NMS inside (YOLOv10,
      ``nms=True``) [1, N, 6]: x1, y1, x2, y2, score, class id; no NMS is run here.

    Raw per-level grids (before the in-graph decode: sigmoid, grid offsets, anchor
    or DFL sizes) are not supported.

    Boxes are in input pixels, or in [0, 1] with ``normalized=True`` (then
    ``input_size`` (height, width) is required). ``apply_sigmoid`` for heads that emit
    logits. The best class per box is taken, boxes with score >= ``score_threshold``
    kept, then NMS at ``iou_threshold`` (per class when ``class_aware``) and at most
    ``max_detections``. With ``transform`` boxes are mapped to the source image and
    clipped to it (``clip``). ``labels[class_id]`` names each detection.
    """
    if layout not in YOLO_LAYOUTS:
        raise OptionsError(f"decode_yolo: layout: expected one of {list(YOLO_LAYOUTS)}, got {layout!r}")
    if not 0.0 <= score_threshold <= 1.0:
        raise OptionsError(f"decode_yolo: score_threshold: expected [0, 1], got {score_threshold}")
    out = np.asarray(output)
    if out.ndim == 3:
        if out.shape[0] != 1:
            raise ValueError(f"decode_yolo: one image at a time; output batch is {out.shape[0]}")
        out = out[0]
    if out.ndim != 2:
        raise ValueError(f"decode_yolo: output: expected [1, N, D] or [1, D, N], got {list(np.shape(output))}")
    out = out.astype(np.float64)
    if layout == "xywh+classes":
        want = 4 + len(labels) if labels else None
        rows_are_boxes = out.shape[1] == want if want else out.shape[1] < out.shape[0]
        if want and want not in out.shape:
            raise ValueError(f"decode_yolo: output {list(np.shape(output))} has no axis of size 4 + {len(labels)} classes")
        if not want and out.shape[0] == out.shape[1]:
            raise ValueError(f"decode_yolo: cannot tell boxes from channels in {list(np.shape(output))}; pass labels")
        if not rows_are_boxes:
            out = out.T
        if out.shape[1] < 5:
            raise ValueError(f"decode_yolo: 'xywh+classes' needs 4 + C >= 5 channels, got {out.shape[1]}")
        cls_p = out[:, 4:]
        if apply_sigmoid:
            cls_p = _sigmoid(cls_p)
        cid = np.argmax(cls_p, axis=1)
        score = cls_p[np.arange(out.shape[0]), cid]
    elif layout == "xywh+obj+classes":
        if out.shape[1] < 6:
            raise ValueError(f"decode_yolo: 'xywh+obj+classes' needs [1, N, 5 + C] with C >= 1, got {list(np.shape(output))}")
        obj, cls_p = out[:, 4], out[:, 5:]
        if apply_sigmoid:
            obj, cls_p = _sigmoid(obj), _sigmoid(cls_p)
        cid = np.argmax(cls_p, axis=1)
        score = obj * cls_p[np.arange(out.shape[0]), cid]
    else:
        if out.shape[1] != 6:
            raise ValueError(f"decode_yolo: 'xyxy+score+class' needs [1, N, 6], got {list(np.shape(output))}")
        score = _sigmoid(out[:, 4]) if apply_sigmoid else out[:, 4]
        cid = np.rint(out[:, 5]).astype(np.int64)
    keep = np.flatnonzero(score >= score_threshold)
    out, score, cid = out[keep], score[keep], cid[keep]
    if layout == "xyxy+score+class":
        boxes = out[:, :4].copy()
    else:
        cx, cy, w, h = out[:, 0], out[:, 1], out[:, 2], out[:, 3]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    size = None if input_size is None else _hw(input_size, "decode_yolo")
    if normalized:
        if size is None:
            raise OptionsError("decode_yolo: normalized=True needs input_size=(height, width) to get pixels")
        boxes *= (size[1], size[0], size[1], size[0])
    ok = (boxes[:, 2] >= boxes[:, 0]) & (boxes[:, 3] >= boxes[:, 1]) & np.isfinite(boxes).all(1)
    boxes, score, cid = boxes[ok], score[ok], cid[ok]
    if layout != "xyxy+score+class":
        idx = nms(boxes, score, iou_threshold, class_ids=cid if class_aware else None, max_detections=max_detections)
    else:
        idx = np.argsort(-score, kind="stable")[: max_detections or None]
    boxes, score, cid = boxes[idx], score[idx], cid[idx]
    boxes, _ = _to_source(boxes, None, transform, clip=clip, input_hw=size)
    return Detections(boxes, score.astype(np.float32), cid.astype(np.int32), _labels_for(cid, labels))
