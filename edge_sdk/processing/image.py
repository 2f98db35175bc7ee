"""Image preprocessing declared by a package manifest.

Input images are HxWx3 (or HxW / HxWx1 grey) ``uint8`` arrays in the colour
order the caller names (``RGB`` by default; OpenCV frames are ``BGR``).
The output is a contiguous tensor with a batch axis of 1, in the input spec's
layout and dtype, plus a :class:`ImageTransform` that maps model coordinates
back to the source image (for detection decoders).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .._deps import require_cv2
from ..errors import ImageError, OptionsError
from ..package import TensorSpec
from ..package.archive import file_kind
from .image_header import ImageHeader, NeedMoreBytes, probe_image


def _cv2() -> Any:
    return require_cv2("image preprocessing")


@dataclass(frozen=True)  # built per frame: the generated __init__ (0.6 us) over @frozen's (1.1 us, see edge_sdk._record)
class ImageTransform:
    """Model pixel (x, y) -> source pixel: ``((x - pad_x) / scale_x, (y - pad_y) / scale_y)``."""

    source_hw: tuple[int, int]
    scale_xy: tuple[float, float]
    pad_xy: tuple[float, float]


#: The default pixel budget of decoding and preprocessing: 64 Mpx (8192 x 8192). A decoded frame
#: of that size is 192 MiB (BGR); the budget also bounds preprocessing's own intermediates.
MAX_IMAGE_PIXELS = 64 * 1024 * 1024
#: The default size cap of an image file read from disk (checked with fstat before reading).
MAX_IMAGE_FILE_BYTES = 256 * 1024 * 1024
_HEAD_BYTES = 64 * 1024  # what is read first to check the header


def _mpx(n: int) -> str:
    return f"{n / 1e6:.1f} Mpx"


def _check_pixels(hdr: ImageHeader, name: str, max_pixels: int) -> None:
    w, h = hdr.width, hdr.height
    if w < 1 or h < 1:
        raise ImageError(f"{name}: the {hdr.format} header declares an empty image ({w}x{h})")
    if w * h > max_pixels:
        raise ImageError(
            f"{name}: the {hdr.format} header declares {w}x{h} pixels ({_mpx(w * h)}), over the pixel budget of "
            f"{max_pixels} ({_mpx(max_pixels)}); refused before decoding (pass max_pixels= to allow more)"
        )
    if hdr.alloc_pixels > max_pixels:
        raise ImageError(
            f"{name}: the {hdr.format} file declares a block of {hdr.alloc_pixels} pixels ({_mpx(hdr.alloc_pixels)}, "
            f"a tile, strip or frame) for a {w}x{h} image, over the pixel budget of {max_pixels} ({_mpx(max_pixels)})"
        )


def _check_budget_arg(max_pixels: int, max_bytes: int | None = None) -> None:
    if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 1:
        raise OptionsError(f"max_pixels: expected an int >= 1, got {max_pixels!r}")
    if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1):
        raise OptionsError(f"max_bytes: expected an int >= 1, got {max_bytes!r}")


def _read_fd(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd`` (fewer only at the end of the file)."""
    parts, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 24))
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def read_image_file(path: str | Path, *, max_bytes: int = MAX_IMAGE_FILE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> bytes:
    """The bytes of the image file ``path``, read with bounds: only a regular file is read (a FIFO,
    device or socket is refused without blocking: it is opened with O_NONBLOCK and checked with
    fstat), its size must be at most ``max_bytes``, and the header (the first 64 KiB) must declare
    at most ``max_pixels`` pixels before the rest is read. Raises ImageError naming the cause."""
    _check_budget_arg(max_pixels, max_bytes)
    p = Path(path)
    name = repr(str(p))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise ImageError(f"image file {name} does not exist") from None
    except IsADirectoryError:
        raise ImageError(f"image file {name} is a directory, not an image file") from None
    except OSError as e:
        raise ImageError(f"image file {name} cannot be opened: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ImageError(f"image file {name} is a {file_kind(st.st_mode)}, not a regular file; refused without reading it")
        if st.st_size == 0:
            raise ImageError(f"image file {name} is empty")
        if st.st_size > max_bytes:
            raise ImageError(
                f"image file {name} is {st.st_size} bytes ({st.st_size / 2**20:.1f} MiB), over the image file size cap of "
                f"{max_bytes} bytes ({max_bytes / 2**20:.1f} MiB); refused without reading it (pass max_bytes= to allow more)"
            )
        try:
            head = _read_fd(fd, min(_HEAD_BYTES, st.st_size))
            try:
                hdr = probe_image(head, complete=len(head) >= st.st_size)
            except NeedMoreBytes:
                hdr = None  # the header goes on (a JPEG with large APPn segments): checked again on the whole file
            except ImageError as e:
                raise ImageError(f"image file {name}: {e}") from None
            if hdr is not None:
                _check_pixels(hdr, name, max_pixels)
            data = head + _read_fd(fd, max_bytes + 1 - len(head))
        except OSError as e:
            raise ImageError(f"image file {name} cannot be read: {e.strerror or e}") from e
        if len(data) > max_bytes:
            raise ImageError(f"image file {name} grew past the image file size cap of {max_bytes} bytes while it was read")
        return data
    finally:
        os.close(fd)


def decode_image_bgr(
    data: bytes | bytearray | memoryview | np.ndarray, *, name: str = "image", max_pixels: int = MAX_IMAGE_PIXELS
) -> np.ndarray:
    """Decode an encoded image (the bytes of a file) as HxWx3 uint8 BGR, after checking the size its
    header declares against ``max_pixels`` (:func:`~edge_sdk.processing.image_header.probe_image`:
    PNG, JPEG, BMP, GIF, WebP, TIFF, PNM/PAM/PFM, Sun raster, Radiance HDR, JPEG 2000; another format
    (AVIF, EXR, ...) is refused).
    A JPEG without its end-of-image marker is refused (libjpeg would fill the rest grey). Every
    failure is an ImageError whose message starts with ``name``."""
    _check_budget_arg(max_pixels)
    buf = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if not buf:
        raise ImageError(f"{name}: empty file")
    try:
        hdr = probe_image(buf)
    except ImageError as e:
        raise ImageError(f"{name}: {e}") from None
    _check_pixels(hdr, name, max_pixels)
    if hdr.format == "JPEG" and b"\xff\xd9" not in buf[-1024:]:
        raise ImageError(f"{name}: truncated JPEG (no end-of-image marker)")
    cv2 = _cv2()
    try:
        img: np.ndarray | None = cv2.imdecode(np.frombuffer(buf, dtype=np.uint8), cv2.IMREAD_COLOR)
    except MemoryError as e:
        raise ImageError(f"{name}: out of memory decoding a {hdr.width}x{hdr.height} {hdr.format} image") from e
    except cv2.error as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ImageError(f"{name}: OpenCV failed to decode the {hdr.width}x{hdr.height} {hdr.format} image: {msg}") from e
    if img is None:
        raise ImageError(f"{name}: OpenCV cannot decode it as {hdr.format} (truncated or corrupt)")
    if img.ndim == 2:
        img = img[:, :, None]
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ImageError(f"{name}: decoded to an unexpected array {img.dtype} {img.shape}")
    if img.shape[0] * img.shape[1] > max_pixels:  # a decoder that disagrees with its header
        raise ImageError(f"{name}: decoded to {img.shape[1]}x{img.shape[0]} pixels, over the pixel budget of {max_pixels}")
    return img


def load_image(path: str | Path, *, max_pixels: int = MAX_IMAGE_PIXELS, max_bytes: int = MAX_IMAGE_FILE_BYTES) -> np.ndarray:
    """Read an image file as an HxWx3 uint8 RGB array (bounds as :func:`load_image_bgr`). Raises ImageError."""
    return np.ascontiguousarray(load_image_bgr(path, max_pixels=max_pixels, max_bytes=max_bytes)[:, :, ::-1])


def load_image_bgr(path: str | Path, *, max_pixels: int = MAX_IMAGE_PIXELS, max_bytes: int = MAX_IMAGE_FILE_BYTES) -> np.ndarray:
    """Read an image file as OpenCV decodes it: HxWx3 uint8 BGR. Raises ImageError.

    Bounded before anything is decoded: a regular file only (:func:`read_image_file`), at most
    ``max_bytes`` long, whose header declares at most ``max_pixels`` pixels (default
    :data:`MAX_IMAGE_PIXELS`, 64 Mpx)."""
    data = read_image_file(path, max_bytes=max_bytes, max_pixels=max_pixels)
    return decode_image_bgr(data, name=repr(str(Path(path))), max_pixels=max_pixels)


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


@lru_cache(maxsize=64)
def _affine(scale: float, mean: tuple[float, ...], std: tuple[float, ...], reps: int) -> tuple[np.ndarray, np.ndarray]:
    """``x * scale`` then ``(x - mean) / std`` as ``x * a + b``: the per-channel float32 pair, each
    repeated ``reps`` times (one image row's constants when ``reps`` is the width). Read-only and
    made once per preprocessing and width, not once per frame."""
    sd = np.asarray(std, dtype=np.float64)
    a = np.tile((scale / sd).astype(np.float32), reps)
    b = np.tile((-np.asarray(mean, dtype=np.float64) / sd).astype(np.float32), reps)
    a.setflags(write=False)
    b.setflags(write=False)
    return a, b


def _geometry(pre: Any, src_h: int, src_w: int) -> tuple[int, int, int, int]:
    """Where ``pre``'s resize puts the source: its resized size (nh, nw) and the offset (py, px) of
    that resized image's top-left in the output (negative for a centre crop). Both sampling grids."""
    th, tw = pre.size_hw
    if pre.resize == "stretch":
        return th, tw, 0, 0
    if pre.resize == "letterbox":
        s = min(th / src_h, tw / src_w)
        nh, nw = max(1, round(src_h * s)), max(1, round(src_w * s))
        return nh, nw, (th - nh) // 2, (tw - nw) // 2
    # center_crop: scale the short side to size/crop_fraction, then crop the centre
    s = max(th, tw) / pre.crop_fraction / min(src_h, src_w)
    nh, nw = max(th, round(src_h * s)), max(tw, round(src_w * s))
    return nh, nw, -((nh - th) // 2), -((nw - tw) // 2)


@lru_cache(maxsize=8)
def _integer_grid(src_h: int, src_w: int, nh: int, nw: int) -> np.ndarray | None:
    """The source pixel each pixel of a ``nh x nw`` image sampled from ``src_h x src_w`` on the
    top_left grid reads, when the source is a whole multiple ``k`` of it along both axes (640x480,
    1280x720 and 1920x1080 to 128 wide): pixel (x, y) samples source (k_x * x, k_y * y), a whole
    pixel, where bilinear weights are 1 and 0. As a ``cv2.remap`` map (int16 x, y pairs; read-only,
    cached); None for any other size."""
    if src_w % nw or src_h % nh:
        return None
    kx, ky = src_w // nw, src_h // nh
    if kx * (nw - 1) > 32767 or ky * (nh - 1) > 32767:  # beyond an int16 map
        return None
    grid = np.empty((nh, nw, 2), np.int16)
    grid[:, :, 0] = np.arange(nw, dtype=np.int16)[None, :] * kx
    grid[:, :, 1] = np.arange(nh, dtype=np.int16)[:, None] * ky
    grid.setflags(write=False)
    return grid


def _sample_top_left(img: np.ndarray, nh: int, nw: int, py: int, px: int, th: int, tw: int, pad: int) -> np.ndarray:
    """``img`` scaled to ``nh x nw`` on the top_left grid and placed at (px, py) of a ``th x tw``
    image filled with ``pad``: output pixel k samples source (k - pad) / scale, bilinear, the
    padding blended at the image's border (MediaPipe's ImageToTensorCalculator on the CPU, a
    cv2.warpPerspective of the ROI's corners onto the tensor's). Where every sample falls on a
    whole source pixel (see :func:`_integer_grid`), the bilinear weights are 1 and 0, and a
    nearest-neighbour remap on that grid gives warpAffine's bytes exactly in about a third of its
    time (tests/test_preprocess_reference.py compares the two)."""
    cv2 = _cv2()
    src_h, src_w = img.shape[:2]
    grid = _integer_grid(src_h, src_w, nh, nw) if 0 <= py and py + nh <= th and 0 <= px and px + nw <= tw else None
    if grid is None:
        m = np.array([[nw / src_w, 0.0, px], [0.0, nh / src_h, py]], np.float64)
        out: np.ndarray = cv2.warpAffine(img, m, (tw, th), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=(pad,) * 4)
        return out
    out = np.full((th, tw, img.shape[2] if img.ndim == 3 else 1), pad, np.uint8)
    out[py : py + nh, px : px + nw] = cv2.remap(img, grid, None, cv2.INTER_NEAREST).reshape(nh, nw, -1)
    return out


def preprocess_image(
    img: np.ndarray, spec: TensorSpec, *, color: str = "RGB", max_pixels: int = MAX_IMAGE_PIXELS
) -> tuple[np.ndarray, ImageTransform]:
    """Resize, reorder colour, normalise and lay out ``img`` for ``spec``.

    ``color`` is the caller's channel order ("RGB", "BGR" or "GRAY").
    Raises ImageError for a wrong image; the spec must declare preprocessing.
    Every array preprocessing allocates (the resized image before a centre crop, the output) is
    checked against ``max_pixels`` first (a 1x1000000 image centre-cropped would be resized to
    292x292 million pixels): ImageError naming the size and the budget.
    """
    try:
        return _preprocess(img, spec, color, max_pixels)
    except ImageError:
        raise
    except MemoryError as e:
        raise ImageError(f"out of memory preprocessing a {_shape_text(img)} image for input {spec.name!r}") from e
    except Exception as e:
        cv2 = _cv2()
        if isinstance(e, cv2.error):
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ImageError(f"OpenCV failed preprocessing a {_shape_text(img)} image for input {spec.name!r}: {msg}") from e
        raise


def _shape_text(img: object) -> str:
    shape = getattr(img, "shape", None)
    return f"{shape[1]}x{shape[0]}" if isinstance(shape, tuple) and len(shape) >= 2 else type(img).__name__


def _check_alloc(what: str, h: int, w: int, src: tuple[int, int], max_pixels: int) -> None:
    if h * w > max_pixels:
        raise ImageError(
            f"{what} would be {w}x{h} pixels ({_mpx(w * h)}) for the {src[1]}x{src[0]} image, over the pixel budget of "
            f"{max_pixels} ({_mpx(max_pixels)}); refused before allocating it"
        )


def _preprocess(img: np.ndarray, spec: TensorSpec, color: str, max_pixels: int) -> tuple[np.ndarray, ImageTransform]:
    _check_budget_arg(max_pixels)
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
    _check_alloc(f"the output of input {spec.name!r}", th, tw, (src_h, src_w), max_pixels)
    interp = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST, "cubic": cv2.INTER_CUBIC}[pre.interpolation]
    nh, nw, py, px = _geometry(pre, src_h, src_w)
    tf = ImageTransform((src_h, src_w), (nw / src_w, nh / src_h), (float(px), float(py)))
    if pre.sampling_grid == "top_left":
        # output pixel k samples source (k - pad) / scale: one warpAffine, bilinear, the padding value outside the
        # image blended at its border (MediaPipe's ImageToTensorCalculator on the CPU: a cv2.warpPerspective of
        # the ROI's corners onto the tensor's)
        if pre.interpolation != "linear":
            raise ImageError(f"sampling_grid 'top_left' samples with interpolation 'linear' only, got {pre.interpolation!r}")
        out = _sample_top_left(rgb, nh, nw, py, px, th, tw, pre.pad_value)
    elif pre.resize == "stretch":
        out = cv2.resize(rgb, (tw, th), interpolation=interp)
    elif pre.resize == "letterbox":
        resized = cv2.resize(rgb, (nw, nh), interpolation=interp)
        out = np.full((th, tw, rgb.shape[2]), pre.pad_value, dtype=np.uint8)
        out[py : py + nh, px : px + nw] = resized.reshape(nh, nw, -1)
    else:  # center_crop
        _check_alloc("center_crop's resized image (before the crop)", nh, nw, (src_h, src_w), max_pixels)
        resized = cv2.resize(rgb, (nw, nh), interpolation=interp).reshape(nh, nw, -1)
        out = resized[-py : -py + th, -px : -px + tw]
    if out.ndim == 2:
        out = out[:, :, None]
    if out.shape[2] == 1 and pre.channels == 3:
        out = np.repeat(out, 3, axis=2)
    elif out.shape[2] == 3 and pre.channels == 1:
        code = cv2.COLOR_RGB2GRAY if color == "RGB" else cv2.COLOR_BGR2GRAY
        out = cv2.cvtColor(np.ascontiguousarray(out), code)[:, :, None]
    elif out.shape[2] == 3 and color != pre.color:
        # RGB <-> BGR on the small image; cv2's swap writes it contiguous (the float conversion of a
        # reversed view, what out[:, :, ::-1] gives, cost ~0.1 ms more per 128x128 frame)
        out = cv2.cvtColor(np.ascontiguousarray(out), cv2.COLOR_BGR2RGB)
    dt = spec.dtype
    if dt in ("float32", "float16", "float64"):
        # (x * scale - mean) / std as one multiply-add: x * (scale/std) + (-mean/std)
        x = out.astype(np.float32)  # C-contiguous [H, W, C]
        h, w, c = x.shape
        if len(pre.mean) == c:
            # per-channel constants repeated along a row: numpy's inner loop then runs over W*C
            # values, not over the C of each pixel (broadcasting a (3,) array over [H, W, 3]
            # made 0.25 ms of a 128x128 frame's 0.45); the same float32 operations, the same result
            a, b = _affine(pre.scale, tuple(pre.mean), tuple(pre.std), w)
            rows = x.reshape(h, w * c)
            rows *= a
            rows += b
        else:  # constants that broadcast otherwise (one value for three channels)
            a, b = _affine(pre.scale, tuple(pre.mean), tuple(pre.std), 1)
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
