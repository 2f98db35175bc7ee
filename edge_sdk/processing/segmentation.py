"""Semantic segmentation results: a class per source pixel.

Pure numpy. :func:`decode_segmentation` takes a model's output map, undoes the
resize/letterbox/crop that ``preprocess_image`` did (its
:class:`~edge_sdk.processing.image.ImageTransform`) and returns a
:class:`SegmentationMask` at the size of the source image.

Example::

    x, tf = preprocess_image(frame, spec)                         # letterbox 256x256
    prob = model_output                                            # [1, 256, 256, 1]
    seg = decode_segmentation(prob, layout="NHWC", threshold=0.5, transform=tf)
    person = seg.mask("foreground")                                # bool [H, W], source pixels
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import OptionsError

if TYPE_CHECKING:
    from .image import ImageTransform

__all__ = ["SegmentationMask", "decode_segmentation", "SEGMENTATION_LAYOUTS"]

#: Layouts of the output map: NCHW [1, C, H, W], NHWC [1, H, W, C], or NHW [1, H, W]
#: (a class-index map, e.g. a model with ArgMax inside).
SEGMENTATION_LAYOUTS = ("NCHW", "NHWC", "NHW")
_ACTIVATIONS = ("none", "sigmoid", "softmax")
_UPSAMPLE = ("bilinear", "nearest")


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class SegmentationMask:
    """A class index per source pixel (immutable: arrays are read-only).

    - ``class_map``: [H, W] uint8 (up to 256 classes) or int32, in source-image pixels.
    - ``labels``: class names by index (``str(i)`` where none was given).
    - ``probabilities``: optional float32 [H, W, C] per-class scores at source size
      (for a binary model C = 1: the foreground probability).
    """

    class_map: np.ndarray
    labels: tuple[str, ...] = ()
    probabilities: np.ndarray | None = None

    def __post_init__(self) -> None:
        cm = np.asarray(self.class_map)
        if cm.ndim != 2:
            raise ValueError(f"SegmentationMask.class_map: expected shape [H, W], got {list(cm.shape)}")
        if cm.dtype not in (np.uint8, np.int32):
            raise TypeError(f"SegmentationMask.class_map: expected uint8 or int32, got {cm.dtype}")
        labels = tuple(self.labels)
        if not all(isinstance(s, str) for s in labels):
            raise TypeError("SegmentationMask.labels: every label must be a str")
        pr = self.probabilities
        if pr is not None:
            pr = np.asarray(pr)
            if pr.dtype != np.float32 or pr.ndim != 3 or pr.shape[:2] != cm.shape:
                raise ValueError(
                    f"SegmentationMask.probabilities: expected float32 [{cm.shape[0]}, {cm.shape[1]}, C], got {pr.dtype} {list(pr.shape)}"
                )
            pr = _frozen(np.array(pr, copy=True))
        object.__setattr__(self, "class_map", _frozen(np.array(cm, copy=True)))
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "probabilities", pr)

    @property
    def shape_hw(self) -> tuple[int, int]:
        """(height, width) of the class map."""
        return (int(self.class_map.shape[0]), int(self.class_map.shape[1]))

    def class_index(self, cls: int | str) -> int:
        """The index of a class given by index or label. Raises KeyError for an unknown label."""
        if isinstance(cls, str):
            try:
                return self.labels.index(cls)
            except ValueError:
                raise KeyError(f"unknown label {cls!r}; labels: {list(self.labels)}") from None
        return int(cls)

    def mask(self, cls: int | str) -> np.ndarray:
        """bool [H, W]: the pixels of class ``cls`` (index or label)."""
        m: np.ndarray = self.class_map == self.class_index(cls)
        return m

    def label(self, index: int) -> str:
        """The label of class ``index``, or the index as text if there is no label for it."""
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    def pixel_counts(self) -> dict[str, int]:
        """Pixels per class present, by label, largest first (ties by class index)."""
        counts = np.bincount(self.class_map.reshape(-1).astype(np.int64))
        present = [(int(c), i) for i, c in enumerate(counts.tolist()) if c]
        present.sort(key=lambda t: (-t[0], t[1]))
        return {self.label(i): c for c, i in present}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the map itself is not included): size, labels, pixels per class."""
        return {"shape_hw": list(self.shape_hw), "labels": list(self.labels), "pixels": self.pixel_counts()}


def _source_to_output_coords(n_src: int, scale: float, pad: float, n_in: int, n_out: int) -> np.ndarray:
    """For each source pixel centre along one axis: its position in output-map pixel
    indices (continuous; pixel k covers [k, k + 1), so its centre is at index k + 0.5 - 0.5 = k).

    Source edge coordinate u -> model input u * scale + pad -> output * n_out / n_in.
    Positions are clamped to the output pixels whose centres lie on the image (not on
    letterbox padding), so interpolation never blends padding into the result."""
    r = n_out / n_in
    pos = ((np.arange(n_src, dtype=np.float64) + 0.5) * scale + pad) * r - 0.5
    lo = math.ceil(pad * r - 0.5 - 1e-9)
    hi = math.floor((pad + n_src * scale) * r - 0.5 + 1e-9)
    lo, hi = max(lo, 0), min(hi, n_out - 1)
    if lo > hi:  # the image covers no output pixel centre (a sliver): use the nearest ones
        lo, hi = 0, n_out - 1
    return np.clip(pos, lo, hi)


def _nearest(pos: np.ndarray, n: int) -> np.ndarray:
    return np.clip(np.floor(pos + 0.5), 0, n - 1).astype(np.intp)


def _bilinear_axis(a: np.ndarray, pos: np.ndarray, axis: int) -> np.ndarray:
    """Linear interpolation of ``a`` along ``axis`` at fractional indices ``pos`` (edges clamped)."""
    n = a.shape[axis]
    p = np.clip(pos, 0, n - 1)
    i0 = np.floor(p).astype(np.intp)
    i1 = np.minimum(i0 + 1, n - 1)
    w = (p - i0).astype(np.float32)
    shape = [1] * a.ndim
    shape[axis] = -1
    w = w.reshape(shape)
    out: np.ndarray = np.take(a, i0, axis=axis) * (1 - w) + np.take(a, i1, axis=axis) * w
    return out


def decode_segmentation(
    output: np.ndarray,
    *,
    layout: str,
    threshold: float = 0.5,
    activation: str = "none",
    labels: Sequence[str] = (),
    transform: "ImageTransform | None" = None,
    input_size: int | tuple[int, int] | None = None,
    upsample: str = "bilinear",
    keep_probabilities: bool = False,
) -> SegmentationMask:
    """A class map at source-image size from a segmentation output.

    ``output``: [1, C, H, W] (``layout="NCHW"``), [1, H, W, C] (``"NHWC"``), or a
    class-index map [1, H, W] (``"NHW"``, integer dtype). The batch axis may be left
    out. ``C == 1`` is a binary model: pixels with probability >= ``threshold`` are
    class 1 (labels default to ``("background", "foreground")``); ``C > 1``: the
    class with the highest score.

    ``activation``: what turns the output into probabilities: ``"none"`` (already
    probabilities), ``"sigmoid"`` (binary logits) or ``"softmax"`` (over C). It only
    matters for the threshold and ``keep_probabilities``; the argmax is unchanged.

    ``transform`` (from ``preprocess_image``) maps the result back to the source
    frame: letterbox padding is cut away, stretch and crop undone; source pixels the
    model never saw (outside a centre crop) take the nearest edge value. The model
    input size is ``input_size`` ((height, width) or an int), by default the output's
    own H x W; an output map smaller than the input (e.g. stride 8) is handled.
    Without a transform the map stays at output size.

    ``upsample``: ``"bilinear"`` resamples the scores, then classifies each source
    pixel (smooth edges; costs H x W x C floats at source size); ``"nearest"``
    classifies at output size and picks the nearest output pixel (cheap). Raises
    ValueError for a shape that does not match the layout.
    """
    if layout not in SEGMENTATION_LAYOUTS:
        raise OptionsError(f"decode_segmentation: layout: expected one of {list(SEGMENTATION_LAYOUTS)}, got {layout!r}")
    if activation not in _ACTIVATIONS:
        raise OptionsError(f"decode_segmentation: activation: expected one of {list(_ACTIVATIONS)}, got {activation!r}")
    if upsample not in _UPSAMPLE:
        raise OptionsError(f"decode_segmentation: upsample: expected one of {list(_UPSAMPLE)}, got {upsample!r}")
    if not 0.0 <= threshold <= 1.0:
        raise OptionsError(f"decode_segmentation: threshold: expected [0, 1], got {threshold}")
    out = np.asarray(output)
    want_rank = 3 if layout == "NHW" else 4
    if out.ndim == want_rank:
        if out.shape[0] != 1:
            raise ValueError(f"decode_segmentation: one image at a time; output batch is {out.shape[0]}")
        out = out[0]
    if out.ndim != want_rank - 1:
        raise ValueError(f"decode_segmentation: output: expected rank {want_rank} for layout {layout}, got shape {list(np.shape(output))}")

    labels = tuple(labels)
    index_map: np.ndarray | None = None
    scores: np.ndarray | None = None  # H x W x C float32
    if layout == "NHW":
        if out.dtype.kind not in "iu":
            raise ValueError(f"decode_segmentation: layout NHW is a class-index map and needs an integer dtype, got {out.dtype}")
        index_map = out.astype(np.int64)
        if index_map.size and index_map.min() < 0:
            raise ValueError(f"decode_segmentation: a class-index map holds negative values (min {int(index_map.min())})")
        upsample = "nearest"
        n_classes = max(len(labels), int(index_map.max()) + 1 if index_map.size else 1)
    else:
        scores = out.transpose(1, 2, 0) if layout == "NCHW" else out
        if scores.shape[2] < 1 or min(scores.shape[:2]) < 1:
            raise ValueError(f"decode_segmentation: output has an empty axis: {list(np.shape(output))}")
        scores = scores.astype(np.float32)
        if not np.isfinite(scores).all():
            raise ValueError("decode_segmentation: output holds NaN or Inf")
        c = scores.shape[2]
        if c == 1:
            if activation == "softmax":
                raise OptionsError("decode_segmentation: activation: softmax over one channel is always 1; use 'sigmoid' for binary logits")
            if activation == "sigmoid":
                scores = 1.0 / (1.0 + np.exp(-np.clip(scores, -60.0, 60.0)))
            labels = labels or ("background", "foreground")
            n_classes = 2
        else:
            if activation == "softmax":
                e = np.exp(scores - scores.max(axis=2, keepdims=True))
                scores = e / e.sum(axis=2, keepdims=True)
            elif activation == "sigmoid":
                scores = 1.0 / (1.0 + np.exp(-np.clip(scores, -60.0, 60.0)))
            n_classes = max(c, len(labels))
        if upsample == "nearest" and not keep_probabilities:
            index_map = _classify(scores, threshold)

    grid = index_map if index_map is not None else scores
    assert grid is not None  # layout NHW sets index_map, the others scores
    out_h, out_w = grid.shape[:2]
    if transform is not None:
        if input_size is None:
            in_h, in_w = out_h, out_w
        elif isinstance(input_size, (int, np.integer)):
            in_h = in_w = int(input_size)
        else:
            in_h, in_w = (int(v) for v in input_size)
        src_h, src_w = (int(v) for v in transform.source_hw)
        (sx, sy), (px, py) = transform.scale_xy, transform.pad_xy
        ys = _source_to_output_coords(src_h, sy, py, in_h, out_h)
        xs = _source_to_output_coords(src_w, sx, px, in_w, out_w)
        if index_map is not None:
            index_map = index_map[_nearest(ys, out_h)][:, _nearest(xs, out_w)]
        if scores is not None and (index_map is None or keep_probabilities):
            if upsample == "nearest":
                scores = scores[_nearest(ys, out_h)][:, _nearest(xs, out_w)]
            else:
                scores = _bilinear_axis(_bilinear_axis(scores, ys, 0), xs, 1)
    if index_map is None:
        assert scores is not None  # as above
        index_map = _classify(scores, threshold)
    dtype = np.uint8 if n_classes <= 256 else np.int32
    return SegmentationMask(
        index_map.astype(dtype), labels, scores.astype(np.float32) if (keep_probabilities and scores is not None) else None
    )


def _classify(scores: np.ndarray, threshold: float) -> np.ndarray:
    if scores.shape[2] == 1:
        return (scores[:, :, 0] >= threshold).astype(np.int64)
    best: np.ndarray = np.argmax(scores, axis=2)
    return best
