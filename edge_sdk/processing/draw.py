"""Draw a model's result on an image: boxes, labels, scores, keypoints, masks, top-k classes.

::

    from edge_sdk.processing.draw import draw

    r = model.predict_image(frame, color="BGR")
    annotated = draw(frame, r)                 # a new BGR uint8 image; ``frame`` is not touched
    annotated = r.draw(frame)                  # the same, as a Result method
    annotated = r.plot("photo.jpg")            # a path, an array, or None (a black canvas)

What is drawn depends on the result's ``decoded`` field (:class:`~edge_sdk.model.Result`):

- classification (a tuple of rows of ``Classification``): the first row's classes, best first,
  as text lines in a dark box at the top left (classes scoring under ``conf`` are left out);
- detection (:class:`~edge_sdk.processing.detection.Detections`): one rectangle per detection
  with ``score >= conf`` in its class's colour, its label and score above it, and its keypoints
  (BlazeFace's six landmarks, for example) as dots;
- segmentation (:class:`~edge_sdk.processing.segmentation.SegmentationMask`): every class but
  the ones labelled "background" alpha-blended in its colour over the pixels of that class (no
  other pixel changes), and with ``labels`` a legend of the painted classes at the top left;
- anything else (a raw model): nothing; the copy is returned as it is.

Coordinates: a result of ``predict_image`` carries boxes, keypoints and masks in source-image
pixels (the letterbox, stretch or crop undone) and its ``transform.source_hw``. When the image
given here has another size (a thumbnail, a display buffer), boxes and keypoints are scaled by
the ratio of the sizes and the class map is resized to the image (nearest neighbour); a result
without a transform (``predict`` on tensors) is drawn in the image's pixels as it is.

Colours are fixed per class id (:func:`class_color`): hues stepped by the golden ratio around the
HSV circle, so neighbouring ids get distant hues and a class keeps its colour across frames and
runs. Drawing uses OpenCV (``cv2.rectangle``, ``cv2.putText``, ``cv2.circle``; see
https://docs.opencv.org/4.x/d6/d6e/group__imgproc__draw.html), imported at the first call.
"""

from __future__ import annotations

import colorsys
import math
from functools import lru_cache
from typing import Any

import numpy as np

from .._deps import require_cv2
from ..errors import ImageError, OptionsError, OptionsTypeError
from .decoders import Classification
from .detection import Detections
from .segmentation import SegmentationMask

__all__ = ["class_color", "draw", "DRAW_COLORS"]

#: The colour orders :func:`draw` accepts for its input image (the output is always BGR).
DRAW_COLORS = ("BGR", "RGB", "GRAY")
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # 0.618...: successive hues as far apart as possible
_FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX
_WHITE = (255, 255, 255)
_BLACK = (0, 0, 0)


@lru_cache(maxsize=4096)
def class_color(class_id: int) -> tuple[int, int, int]:
    """The BGR colour of class ``class_id``: hue ``(0.1 + id * 0.618...) mod 1``, saturation 0.85,
    value 0.95. Deterministic (the same id always gives the same colour) and never black or white."""
    if isinstance(class_id, bool) or not isinstance(class_id, (int, np.integer)):
        raise OptionsTypeError(f"class_color: expected an int class id, got {type(class_id).__name__}")
    h = (0.1 + int(class_id) * _GOLDEN) % 1.0
    r, g, b = colorsys.hsv_to_rgb(h, 0.85, 0.95)
    return (int(b * 255 + 0.5), int(g * 255 + 0.5), int(r * 255 + 0.5))


def _text_color(bg: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black on a light background, white on a dark one (Rec. 601 luma of the BGR colour)."""
    b, g, r = bg
    return _BLACK if 0.299 * r + 0.587 * g + 0.114 * b > 140 else _WHITE


def _as_bgr(image: Any, color: str, cv2: Any) -> np.ndarray:
    """A new, writable, C-contiguous HxWx3 uint8 BGR copy of ``image`` (never a view of it)."""
    if color not in DRAW_COLORS:
        raise OptionsError(f"draw: color: expected one of {DRAW_COLORS}, got {color!r}")
    if not isinstance(image, np.ndarray):
        raise ImageError(f"draw: expected the image as a numpy uint8 array HxWx3 (or HxW grey), got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise ImageError(f"draw: expected image dtype uint8, got {image.dtype} with shape {image.shape}; nothing is cast")
    grey = image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1)
    if not grey and not (image.ndim == 3 and image.shape[2] == 3):
        hint = " (BGRA: drop alpha with cv2.cvtColor(img, cv2.COLOR_BGRA2BGR))" if image.ndim == 3 and image.shape[2] == 4 else ""
        raise ImageError(f"draw: expected an image of shape HxWx3, HxWx1 or HxW, got {image.shape}{hint}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ImageError(f"draw: the image has an empty side: shape {image.shape}")
    if grey != (color == "GRAY"):
        raise ImageError(f"draw: color {color!r} does not fit an image of shape {image.shape}")
    if grey:
        return np.ascontiguousarray(cv2.cvtColor(np.ascontiguousarray(image.reshape(image.shape[:2])), cv2.COLOR_GRAY2BGR))
    if color == "RGB":
        return np.ascontiguousarray(cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR))
    return np.array(image, dtype=np.uint8, copy=True, order="C")


def _decoded_and_size(result: Any) -> tuple[Any, tuple[int, int] | None]:
    """(decoded, source (h, w) or None) of a Result, or of a decoded value given directly."""
    if not hasattr(result, "decoded"):  # first: a Result is a NamedTuple, so a tuple too
        if isinstance(result, (Detections, SegmentationMask, tuple)) or result is None:
            return result, None
        raise OptionsTypeError(
            "draw: expected an edge_sdk Result (or its decoded Detections, SegmentationMask or classification rows), "
            f"got {type(result).__name__}"
        )
    tf = getattr(result, "transform", None)
    hw = getattr(tf, "source_hw", None)
    size = (int(hw[0]), int(hw[1])) if hw is not None and len(hw) == 2 else None
    return result.decoded, size


def _classes(decoded: Any) -> tuple[Classification, ...] | None:
    """The first row of a classification result, else None."""
    if isinstance(decoded, tuple) and decoded and isinstance(decoded[0], tuple):
        row = decoded[0]
        if all(isinstance(c, Classification) for c in row):
            return row
    return None


class _Style:
    """Line width, font scale and text thickness for an image of height ``h`` and width ``w``."""

    def __init__(self, h: int, w: int, line_width: int | None) -> None:
        self.lw = line_width if line_width is not None else max(1, round((h + w) / 2 * 0.003))
        self.font_scale = max(0.35, self.lw / 3.0)
        self.font_thick = max(1, self.lw - 1)


def _text_box(
    img: np.ndarray, cv2: Any, text: str, org_xy: tuple[int, int], style: _Style, bg: tuple[int, int, int], *, above: bool
) -> None:
    """``text`` on a filled box of colour ``bg``: above the point ``org_xy`` (its bottom-left
    corner there) when ``above`` and there is room, else below it; kept inside the image."""
    (tw, th), base = cv2.getTextSize(text, _FONT, style.font_scale, style.font_thick)
    h, w = img.shape[:2]
    pad = max(1, style.lw)
    bw, bh = tw + 2 * pad, th + base + 2 * pad
    x0 = min(max(org_xy[0], 0), max(w - bw, 0))
    y0 = org_xy[1] - bh if above and org_xy[1] - bh >= 0 else org_xy[1]
    y0 = min(max(y0, 0), max(h - bh, 0))
    cv2.rectangle(img, (x0, y0), (x0 + bw - 1, y0 + bh - 1), bg, -1)
    cv2.putText(img, text, (x0 + pad, y0 + pad + th), _FONT, style.font_scale, _text_color(bg), style.font_thick, cv2.LINE_AA)


def _text_lines(img: np.ndarray, cv2: Any, lines: list[tuple[str, tuple[int, int, int] | None]], style: _Style) -> None:
    """Lines of text at the top left on one dark box; a line with a colour gets a swatch of it."""
    if not lines:
        return
    sizes = [cv2.getTextSize(t, _FONT, style.font_scale, style.font_thick) for t, _ in lines]
    line_h = max(th + base for (_, th), base in sizes) + 2 * style.lw
    swatch = line_h - 2 * style.lw if any(c is not None for _, c in lines) else 0
    gap = style.lw * 2 if swatch else 0
    pad = max(2, style.lw * 2)
    box_w = pad * 2 + swatch + gap + max(tw for (tw, _), _ in sizes)
    box_h = pad * 2 + line_h * len(lines)
    h, w = img.shape[:2]
    cv2.rectangle(img, (0, 0), (min(box_w, w) - 1, min(box_h, h) - 1), (32, 32, 32), -1)
    for i, ((text, col), ((_, th), _base)) in enumerate(zip(lines, sizes)):
        top = pad + i * line_h
        if col is not None:
            cv2.rectangle(img, (pad, top + style.lw), (pad + swatch - 1, top + style.lw + swatch - 1), col, -1)
        cv2.putText(img, text, (pad + swatch + gap, top + style.lw + th), _FONT, style.font_scale, _WHITE, style.font_thick, cv2.LINE_AA)


def _draw_mask(img: np.ndarray, cv2: Any, seg: SegmentationMask, alpha: float, legend: bool, style: _Style) -> None:
    cm = seg.class_map
    h, w = img.shape[:2]
    if cm.shape != (h, w):  # a map at model size (no transform), or an image of another size
        src = cm if cm.dtype == np.uint8 else cm.astype(np.int32)
        cm = cv2.resize(np.ascontiguousarray(src), (w, h), interpolation=cv2.INTER_NEAREST)
    present = np.unique(cm) if cm.dtype != np.uint8 else np.flatnonzero(np.bincount(cm.reshape(-1), minlength=256))
    painted = [int(c) for c in present if seg.label(int(c)).lower() != "background"]
    if not painted:
        return
    if cm.dtype == np.uint8 or int(present.max()) < 65536:
        lut = np.zeros((int(present.max()) + 1, 3), np.float32)
        on = np.zeros(int(present.max()) + 1, bool)
        for c in painted:
            lut[c] = class_color(c)
            on[c] = True
        idx = cm.astype(np.intp, copy=False)
        sel = on[idx]
        colors = lut[idx[sel]]
    else:  # sparse huge class ids: map them through their rank among the present ones
        ranks = np.searchsorted(present, cm)
        on_r = np.isin(present, painted)
        lut_r = np.array([class_color(int(c)) for c in present], np.float32)
        sel = on_r[ranks]
        colors = lut_r[ranks[sel]]
    px = img[sel].astype(np.float32)
    img[sel] = np.clip(px * (1.0 - alpha) + colors * alpha + 0.5, 0, 255).astype(np.uint8)
    if legend:
        _text_lines(img, cv2, [(seg.label(c), class_color(c)) for c in painted], style)


def _draw_detections(
    img: np.ndarray,
    cv2: Any,
    det: Detections,
    scale_xy: tuple[float, float],
    conf: float,
    style: _Style,
    labels: bool,
    scores: bool,
    keypoints: bool,
) -> None:
    sx, sy = scale_xy
    keep = np.flatnonzero(det.scores >= conf)
    names = det.labels or ()
    texts: list[tuple[str, tuple[int, int], tuple[int, int, int]]] = []
    for i in keep.tolist():
        x1, y1, x2, y2 = (float(v) for v in det.xyxy[i])
        p1 = (int(round(x1 * sx)), int(round(y1 * sy)))
        p2 = (int(round(x2 * sx)), int(round(y2 * sy)))
        col = class_color(int(det.class_ids[i]))
        cv2.rectangle(img, p1, p2, col, style.lw, cv2.LINE_8)
        if keypoints and det.keypoints is not None:
            r = max(2, style.lw + 1)
            for kx, ky in det.keypoints[i].tolist():
                c = (int(round(kx * sx)), int(round(ky * sy)))
                cv2.circle(img, c, r + 1, _WHITE, -1, cv2.LINE_AA)
                cv2.circle(img, c, r, col, -1, cv2.LINE_8)
        parts = ([names[i]] if labels and i < len(names) else []) + ([f"{float(det.scores[i]):.2f}"] if scores else [])
        if parts:
            texts.append((" ".join(parts), (p1[0] - style.lw // 2, p1[1] - style.lw // 2), col))
    for text, org, col in texts:  # after every box, so no box is drawn over a label
        _text_box(img, cv2, text, org, style, col, above=True)


def draw(
    image: np.ndarray,
    result: Any,
    *,
    labels: bool = True,
    scores: bool = True,
    masks: bool = True,
    keypoints: bool = True,
    conf: float = 0.0,
    color: str = "BGR",
    mask_alpha: float = 0.5,
    line_width: int | None = None,
) -> np.ndarray:
    """A new BGR uint8 image: ``image`` with ``result`` drawn on it (see the module docs). The
    input array is never modified.

    ``image``: HxWx3 uint8 in ``color`` order ("BGR", OpenCV's, by default; "RGB"), or HxW /
    HxWx1 grey (``color="GRAY"``). ``result``: an edge_sdk ``Result`` (anything with ``decoded``
    and ``transform``), or a decoded ``Detections``, ``SegmentationMask`` or classification rows.
    ``labels`` / ``scores``: the class names and scores next to boxes (and the segmentation
    legend); ``masks``: blend segmentation masks; ``keypoints``: the detections' keypoints;
    ``conf``: detections and classes scoring below it are not drawn; ``mask_alpha``: the mask
    colour's weight in (0, 1]; ``line_width``: box line width in pixels (default: about 0.3 % of
    the image's mean side, at least 1).

    Raises ImageError for an image outside that contract and OptionsError for a bad option."""
    for name, v in (("labels", labels), ("scores", scores), ("masks", masks), ("keypoints", keypoints)):
        if not isinstance(v, bool):
            raise OptionsTypeError(f"draw: {name}: expected a bool, got {type(v).__name__}")
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0.0 <= conf <= 1.0:
        raise OptionsError(f"draw: conf: expected a number in [0, 1], got {conf!r}")
    if isinstance(mask_alpha, bool) or not isinstance(mask_alpha, (int, float)) or not 0.0 < mask_alpha <= 1.0:
        raise OptionsError(f"draw: mask_alpha: expected a number in (0, 1], got {mask_alpha!r}")
    if line_width is not None and (isinstance(line_width, bool) or not isinstance(line_width, int) or not 1 <= line_width <= 64):
        raise OptionsError(f"draw: line_width: expected an int in [1, 64] or None, got {line_width!r}")
    cv2 = require_cv2("draw")
    decoded, src_hw = _decoded_and_size(result)
    img = _as_bgr(image, color, cv2)
    h, w = img.shape[:2]
    style = _Style(h, w, line_width)
    classes = _classes(decoded)
    if classes is not None:
        shown = [c for c in classes if float(c.score) >= conf]
        _text_lines(img, cv2, [(f"{c.label} {float(c.score):.2f}" if scores else str(c.label), None) for c in shown], style)
    elif isinstance(decoded, Detections):
        scale = (1.0, 1.0) if src_hw is None else (w / src_hw[1], h / src_hw[0])
        _draw_detections(img, cv2, decoded, scale, float(conf), style, labels, scores, keypoints)
    elif isinstance(decoded, SegmentationMask) and masks:
        _draw_mask(img, cv2, decoded, float(mask_alpha), labels, style)
    return img
