"""Image preprocessing declared by a package manifest.

Input images are HxWx3 (or HxW / HxWx1 grey) ``uint8`` arrays in the colour
order the caller names (``RGB`` by default; OpenCV frames are ``BGR``).
The output is a contiguous tensor with a batch axis of 1, in the input spec's
layout and dtype, plus a :class:`ImageTransform` that maps model coordinates
back to the source image (for detection decoders).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._deps import require_cv2
from ..errors import ImageError
from ..package import ImagePreprocess, TensorSpec


def _cv2() -> Any:
    return require_cv2("image preprocessing")


@dataclass(frozen=True)
class ImageTransform:
    """Model pixel (x, y) -> source pixel: ``((x - pad_x) / scale_x, (y - pad_y) / scale_y)``."""

    source_hw: tuple[int, int]
    scale_xy: tuple[float, float]
    pad_xy: tuple[float, float]


def load_image(path: str | Path) -> np.ndarray:
    """Read an image file as an HxWx3 uint8 RGB array. Raises ImageError."""
    return np.ascontiguousarray(load_image_bgr(path)[:, :, ::-1])


def load_image_bgr(path: str | Path) -> np.ndarray:
    """Read an image file as OpenCV decodes it: HxWx3 uint8 BGR. Raises ImageError."""
    cv2 = _cv2()
    p = Path(path)
    data = np.fromfile(p, dtype=np.uint8) if p.is_file() else None
    if data is None or data.size == 0:
        raise ImageError(f"image file {str(p)!r} does not exist or is empty")
    img: np.ndarray | None = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if img is None:
        raise ImageError(f"{str(p)!r} is not an image OpenCV can decode (expected PNG, JPEG, BMP, ...)")
    return img


def _check_image(img: object) -> np.ndarray:
    if not isinstance(img, np.ndarray):
        raise ImageError(f"expected an image as a numpy uint8 array HxWx3, got {type(img).__name__}")
    if img.dtype != np.uint8:
        raise ImageError(f"expected image dtype uint8, got {img.dtype}; nothing is cast silently")
    if img.ndim == 2:
        img = img[:, :, None]
    if img.ndim != 3 or img.shape[2] not in (1, 3):
        raise ImageError(f"expected an image of shape HxWx3 or HxW (grey), got {img.shape}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ImageError(f"image has an empty side: shape {img.shape}")
    return img


def _affine(pre: ImagePreprocess) -> tuple[np.ndarray, np.ndarray]:
    std = np.asarray(pre.std, dtype=np.float64)
    a = (pre.scale / std).astype(np.float32)
    b = (-np.asarray(pre.mean, dtype=np.float64) / std).astype(np.float32)
    return a, b


def preprocess_image(img: np.ndarray, spec: TensorSpec, *, color: str = "RGB") -> tuple[np.ndarray, ImageTransform]:
    """Resize, reorder colour, normalise and lay out ``img`` for ``spec``.

    ``color`` is the caller's channel order ("RGB", "BGR" or "GRAY").
    Raises ImageError for a wrong image; the spec must declare preprocessing.
    """
    pre = spec.preprocess
    if pre is None:
        raise ImageError(f"input {spec.name!r} declares no image preprocessing; pass a tensor to predict() instead")
    if color not in ("RGB", "BGR", "GRAY"):
        raise ImageError(f"color: expected 'RGB', 'BGR' or 'GRAY', got {color!r}")
    cv2 = _cv2()
    img = _check_image(img)
    src_h, src_w = img.shape[:2]
    # Resize in the caller's channel order and fix the order afterwards, on the
    # small image: a channel swap of a full 640x480 frame costs ~1 ms, of the
    # resized one a few microseconds (and the float conversion copies anyway).
    if img.shape[2] == 3 and color == "GRAY":
        raise ImageError(f"color='GRAY' but the image has 3 channels: shape {img.shape}")
    if not img.flags.c_contiguous:
        img = np.ascontiguousarray(img)
    rgb = img
    th, tw = pre.size_hw
    interp = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST, "cubic": cv2.INTER_CUBIC}[pre.interpolation]
    if pre.resize == "stretch":
        out = cv2.resize(rgb, (tw, th), interpolation=interp)
        tf = ImageTransform((src_h, src_w), (tw / src_w, th / src_h), (0.0, 0.0))
    elif pre.resize == "letterbox":
        s = min(th / src_h, tw / src_w)
        nh, nw = max(1, round(src_h * s)), max(1, round(src_w * s))
        resized = cv2.resize(rgb, (nw, nh), interpolation=interp)
        out = np.full((th, tw, rgb.shape[2]), pre.pad_value, dtype=np.uint8)
        py, px = (th - nh) // 2, (tw - nw) // 2
        out[py : py + nh, px : px + nw] = resized.reshape(nh, nw, -1)
        tf = ImageTransform((src_h, src_w), (nw / src_w, nh / src_h), (float(px), float(py)))
    else:  # center_crop: scale the short side to size/crop_fraction, then crop the centre
        s = max(th, tw) / pre.crop_fraction / min(src_h, src_w)
        nh, nw = max(th, round(src_h * s)), max(tw, round(src_w * s))
        resized = cv2.resize(rgb, (nw, nh), interpolation=interp).reshape(nh, nw, -1)
        py, px = (nh - th) // 2, (nw - tw) // 2
        out = resized[py : py + th, px : px + tw]
        tf = ImageTransform((src_h, src_w), (nw / src_w, nh / src_h), (float(-px), float(-py)))
    if out.ndim == 2:
        out = out[:, :, None]
    if out.shape[2] == 1 and pre.channels == 3:
        out = np.repeat(out, 3, axis=2)
    elif out.shape[2] == 3 and pre.channels == 1:
        code = cv2.COLOR_RGB2GRAY if color == "RGB" else cv2.COLOR_BGR2GRAY
        out = cv2.cvtColor(np.ascontiguousarray(out), code)[:, :, None]
    elif out.shape[2] == 3 and color != pre.color:
        out = out[:, :, ::-1]  # RGB <-> BGR, a view; copied below
    dt = spec.dtype
    if dt in ("float32", "float16", "float64"):
        # (x * scale - mean) / std as one multiply-add: x * (scale/std) + (-mean/std)
        a, b = _affine(pre)
        x = out.astype(np.float32)
        x *= a
        x += b
        x = x.astype(dt, copy=False)
    elif dt == "uint8":
        x = np.ascontiguousarray(out)
    elif dt == "int8":
        x = (out.astype(np.int16) - 128).astype(np.int8)
    else:
        raise ImageError(f"input {spec.name!r} has dtype {dt}; image preprocessing makes float, uint8 or int8 tensors")
    if spec.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None]), tf
