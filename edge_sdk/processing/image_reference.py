"""The reference image preprocessing: the manifest's recipe in plain NumPy, written
independently of the OpenCV fast path (:func:`edge_sdk.processing.image.preprocess_image`) so
that each checks the other.

It is slow (a few ms per frame) and exists to define what the fast path must produce: tests run
both on real photographs for every resize mode, colour order, layout and dtype. Agreement: exact
for ``nearest`` resizing and for everything around the resize (padding, cropping, colour,
normalisation, layout, quantized dtypes); within 1 grey level for ``linear`` resizing, where
OpenCV rounds its 11-bit fixed-point weights (``INTER_RESIZE_COEF_BITS``) and this computes in
float64. ``area`` and ``cubic`` are OpenCV-only (the reference refuses them).

Conventions (OpenCV's, which the fast path uses):

- ``linear``: the source coordinate of output pixel ``x`` is ``(x + 0.5) * src / dst - 0.5``,
  clamped at 0; neighbours are clamped at the last pixel.
- ``nearest``: source pixel ``floor(x * (1 / (dst / src)))``, clamped at the last pixel
  (``cv2.INTER_NEAREST``, not the centre-aligned ``INTER_NEAREST_EXACT``).
- ``sampling_grid="top_left"`` (linear only): output pixel ``x`` samples source ``(x - pad) / scale``,
  in 1/32 pixel (``cv2.warpAffine``'s fixed point: ``AB_BITS`` 10, ``INTER_BITS`` 5), bilinear between its four
  neighbours, any of which outside the image is the padding value (``BORDER_CONSTANT``). OpenCV's
  own coordinate rounding lands on a neighbouring 1/32 pixel now and then: a few grey levels at a
  steep edge, on a few pixels in a thousand.
"""

from __future__ import annotations

import numpy as np

from ..errors import ImageError
from ..package import TensorSpec

__all__ = ["preprocess_image_reference", "resize_reference"]


def _linear_axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    x = np.maximum(x, 0.0)
    i0 = np.floor(x).astype(np.int64)
    i0 = np.minimum(i0, src - 1)
    i1 = np.minimum(i0 + 1, src - 1)
    w1 = np.where(i1 == i0, 0.0, x - i0)
    return i0, i1, w1


def resize_reference(img: np.ndarray, size_wh: tuple[int, int], interpolation: str = "linear") -> np.ndarray:
    """Resize an HxWxC uint8 image to ``size_wh`` (width, height) with OpenCV's conventions."""
    w, h = size_wh
    src_h, src_w = img.shape[:2]
    if interpolation == "nearest":
        # OpenCV's own arithmetic: the inverse of dst/src, not src/dst (they differ in the last bit,
        # and floor() at exact multiples such as 70 * 400/224 = 125 sees it)
        ys = np.minimum(np.floor(np.arange(h) * (1.0 / (h / src_h))).astype(np.int64), src_h - 1)
        xs = np.minimum(np.floor(np.arange(w) * (1.0 / (w / src_w))).astype(np.int64), src_w - 1)
        picked: np.ndarray = img[ys][:, xs]
        return picked
    if interpolation != "linear":
        raise ImageError(f"the reference path implements 'linear' and 'nearest' resizing, not {interpolation!r}")
    y0, y1, wy = _linear_axis(src_h, h)
    x0, x1, wx = _linear_axis(src_w, w)
    f = img.astype(np.float64)
    top = f[y0][:, x0] * (1 - wx)[None, :, None] + f[y0][:, x1] * wx[None, :, None]
    bot = f[y1][:, x0] * (1 - wx)[None, :, None] + f[y1][:, x1] * wx[None, :, None]
    out = top * (1 - wy)[:, None, None] + bot * wy[:, None, None]
    rounded: np.ndarray = np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)
    return rounded


def _top_left_linear(img: np.ndarray, size_wh: tuple[int, int], scale_xy: tuple[float, float], pad_xy: tuple[int, int], pad_value: int) -> np.ndarray:
    w, h = size_wh
    src_h, src_w, ch = img.shape
    padded = np.full((src_h + 2, src_w + 2, ch), pad_value, np.float64)  # one pixel of padding value around the image
    padded[1:-1, 1:-1] = img

    def axis(n: int, scale: float, pad: int, src: int, along_x: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # warpAffine's fixed point: the inverse map src = k / scale - pad / scale in 1/1024 (each term rounded:
        # along x the per-column term, along y the whole row term), then rounded down to 1/32 after + 16/1024
        k = np.arange(n, dtype=np.float64)
        if along_x:
            fixed = np.rint(k / scale * 1024) + np.rint(-pad / scale * 1024) + 16
        else:
            fixed = np.rint((k / scale - pad / scale) * 1024) + 16
        x = np.floor(fixed / 32) / 32
        i0 = np.floor(x)
        frac = x - i0
        lo = np.clip(i0.astype(np.int64) + 1, 0, src + 1)  # +1: index into the padded image
        hi = np.clip(i0.astype(np.int64) + 2, 0, src + 1)
        return lo, hi, frac

    y0, y1, wy = axis(h, scale_xy[1], pad_xy[1], src_h, False)
    x0, x1, wx = axis(w, scale_xy[0], pad_xy[0], src_w, True)
    top = padded[y0][:, x0] * (1 - wx)[None, :, None] + padded[y0][:, x1] * wx[None, :, None]
    bot = padded[y1][:, x0] * (1 - wx)[None, :, None] + padded[y1][:, x1] * wx[None, :, None]
    out = top * (1 - wy)[:, None, None] + bot * wy[:, None, None]
    rounded: np.ndarray = np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)
    return rounded


def preprocess_image_reference(img: np.ndarray, spec: TensorSpec, *, color: str = "RGB") -> np.ndarray:
    """The model input for ``img`` (HxWx3 or HxW uint8 in ``color`` order) per ``spec``'s
    preprocessing, with a batch axis of 1: what ``preprocess_image`` returns (its tensor)."""
    pre = spec.preprocess
    if pre is None:
        raise ImageError(f"input {spec.name!r} declares no image preprocessing")
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
        raise ImageError("expected a uint8 numpy image")
    if img.ndim == 2:
        img = img[:, :, None]
    src_h, src_w, ch = img.shape
    th, tw = pre.size_hw
    if pre.sampling_grid == "top_left":
        if pre.interpolation != "linear":
            raise ImageError(f"sampling_grid 'top_left' samples with interpolation 'linear' only, got {pre.interpolation!r}")
        if pre.resize == "stretch":
            sxy, pxy = (tw / src_w, th / src_h), (0, 0)
        elif pre.resize == "letterbox":
            s = min(th / src_h, tw / src_w)
            nh, nw = max(1, round(src_h * s)), max(1, round(src_w * s))
            sxy, pxy = (nw / src_w, nh / src_h), ((tw - nw) // 2, (th - nh) // 2)
        else:  # center_crop
            s = max(th, tw) / pre.crop_fraction / min(src_h, src_w)
            nh, nw = max(th, round(src_h * s)), max(tw, round(src_w * s))
            sxy, pxy = (nw / src_w, nh / src_h), (-((nw - tw) // 2), -((nh - th) // 2))
        out = _top_left_linear(img, (tw, th), sxy, pxy, pre.pad_value)
    elif pre.resize == "stretch":
        out = resize_reference(img, (tw, th), pre.interpolation)
    elif pre.resize == "letterbox":
        s = min(th / src_h, tw / src_w)
        nh, nw = max(1, round(src_h * s)), max(1, round(src_w * s))
        out = np.full((th, tw, ch), pre.pad_value, np.uint8)
        py, px = (th - nh) // 2, (tw - nw) // 2
        out[py : py + nh, px : px + nw] = resize_reference(img, (nw, nh), pre.interpolation)
    else:  # center_crop
        s = max(th, tw) / pre.crop_fraction / min(src_h, src_w)
        nh, nw = max(th, round(src_h * s)), max(tw, round(src_w * s))
        big = resize_reference(img, (nw, nh), pre.interpolation)
        py, px = (nh - th) // 2, (nw - tw) // 2
        out = big[py : py + th, px : px + tw]
    # colour: channel count, then order
    if ch == 1 and pre.channels == 3:
        out = np.concatenate([out] * 3, axis=2)
    elif ch == 3 and pre.channels == 1:
        r, g, b = (out[:, :, 0], out[:, :, 1], out[:, :, 2]) if color == "RGB" else (out[:, :, 2], out[:, :, 1], out[:, :, 0])
        # ITU-R BT.601 luma, as cv2.COLOR_RGB2GRAY (fixed point: within 1 level)
        out = np.floor(0.299 * r + 0.587 * g + 0.114 * b + 0.5).astype(np.uint8)[:, :, None]
    elif ch == 3 and color != pre.color:
        out = out[:, :, ::-1]
    dt = spec.dtype
    if dt in ("float32", "float16", "float64"):
        x = (out.astype(np.float64) * pre.scale - np.asarray(pre.mean, np.float64)) / np.asarray(pre.std, np.float64)
        x = x.astype(dt)
    elif dt == "uint8":
        x = out.copy()
    elif dt == "int8":
        x = (out.astype(np.int16) - 128).astype(np.int8)
    else:
        raise ImageError(f"input {spec.name!r} has dtype {dt}; image preprocessing makes float, uint8 or int8 tensors")
    if spec.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x[None])
