"""Hostile images and inputs: every class is refused with an ImageError / SourceError (or, in a
folder pipeline, a dropped frame with its reason) before anything large is allocated or anything
blocks.

Classes: huge declared dimensions (PNG, JPEG, BMP, GIF, WebP, TIFF, PNM, JPEG 2000), preprocessing
intermediates (centre crop of a tall-thin image), huge and sparse files, non-regular files
(FIFOs, devices, folders) as images and as videos, truncated files, garbage with an image
extension, a decoder under a memory limit, and a folder pipeline with bad files among good ones.
The files are real (crafted headers, real encodings, sparse files via truncate, real FIFOs); every
call that could hang runs in a thread with a bounded wait so that a regression fails, not hangs.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import pytest

import edge_sdk
from edge_sdk.errors import ImageError, OptionsError
from edge_sdk.package import ImagePreprocess, TensorSpec
from edge_sdk.pipelines import FrameDrop, ImageFolderSource, OpenCVSource, SourceError, VisionPipeline, source_from_uri
from edge_sdk.processing.image import (
    MAX_IMAGE_PIXELS,
    decode_image_bgr,
    load_image,
    load_image_bgr,
    preprocess_image,
    read_image_file,
)
from edge_sdk.processing.image_header import FORMATS, NeedMoreBytes, probe_image

BOUND_S = 10.0  # every call that could block is given this long
posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need POSIX")


def bounded(fn: Callable[[], Any], timeout: float = BOUND_S) -> Any:
    """``fn()`` on a daemon thread: its result, or its exception re-raised; fails on a hang."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"call did not return within {timeout} s (it blocks)")
    if "error" in out:
        raise out["error"]
    return out.get("value")


# ----------------------------------------------------------------------------------------------
# builders: crafted headers (no pixel data needed: they must be refused from the header) and real files


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header(w: int, h: int) -> bytes:
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")


def real_png(w: int, h: int, grey: bool = False) -> bytes:
    """A valid, decodable PNG of w x h mid-grey pixels (tiny: the rows compress to nothing)."""
    ch = 1 if grey else 3
    row = b"\0" + b"\x80" * (w * ch)
    co = zlib.compressobj(6)
    idat = b"".join(co.compress(row) for _ in range(h)) + co.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0 if grey else 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def jpeg_header(w: int, h: int, app_bytes: int = 0) -> bytes:
    app = b""
    while app_bytes > 0:  # APP1 segments of up to 65533 payload bytes push the SOF back
        n = min(app_bytes, 65533)
        app += b"\xff\xe1" + struct.pack(">H", n + 2) + b"\0" * n
        app_bytes -= n
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00"
    return b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + app + sof + b"\0" * 64 + b"\xff\xd9"


def bmp_header(w: int, h: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + len(info), 0, 0, 54) + info


def gif_header(w: int, h: int, frame_wh: tuple[int, int] | None = None) -> bytes:
    fw, fh = frame_wh or (w, h)
    return b"GIF89a" + struct.pack("<HHBBB", w, h, 0, 0, 0) + b"\x2c" + struct.pack("<HHHHB", 0, 0, fw, fh, 0) + b"\x02\x02\x44\x01\x00\x3b"


def webp_vp8x(w: int, h: int) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0" + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def tiff_header(w: int, h: int, tile: tuple[int, int] | None = None, big_endian: bool = False) -> bytes:
    e = ">" if big_endian else "<"
    entries = [(256, 4, 1, w), (257, 4, 1, h)] + ([(322, 4, 1, tile[0]), (323, 4, 1, tile[1])] if tile else [])
    ifd = struct.pack(e + "H", len(entries)) + b"".join(struct.pack(e + "HHII", *x) for x in entries) + b"\0\0\0\0"
    return (b"MM\0*" if big_endian else b"II*\0") + struct.pack(e + "I", 8) + ifd


def encoded(ext: str, img: np.ndarray, params: list[int] | None = None) -> bytes:
    ok, buf = cv2.imencode(ext, img, params or [])
    assert ok, ext
    return bytes(buf.tobytes())


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    rng = np.random.default_rng(7)
    img = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    img[:, :20] = (40, 120, 200)
    return img


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    with edge_sdk.load(edge_sdk.demo_package_path(), "generic-x86_64", cache_dir=tmp_path_factory.mktemp("hostile-img-cache")) as m:
        yield m


def spec(resize: str = "center_crop", size: tuple[int, int] = (224, 224)) -> TensorSpec:
    return TensorSpec("image", "float32", (1, 3, *size), "NCHW", preprocess=ImagePreprocess(size, resize=resize))


# ----------------------------------------------------------------------------------------------
# the header probe agrees with OpenCV on real files of every format it reads


REAL = [
    (".png", None, "PNG"),
    (".jpg", None, "JPEG"),
    (".bmp", None, "BMP"),
    (".webp", None, "WebP"),  # lossy VP8
    (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101], "WebP"),  # lossless VP8L
    (".tif", None, "TIFF"),
    (".ppm", None, "PNM"),
    (".pam", None, "PAM"),
    (".ras", None, "Sun raster"),
    (".gif", None, "GIF"),
    (".jp2", None, "JPEG 2000"),
]


# OpenJPEG cannot encode an image under 32 pixels a side: JPEG 2000 is tried at the sizes it can make
CASES = [(r, hw) for r in REAL for hw in [(37, 53), (1, 1), (300, 7), (64, 40)] if r[0] != ".jp2" or min(hw) >= 32]


@pytest.mark.parametrize(("real", "hw"), CASES, ids=[f"{r[0]}-{r[2]}{'-lossless' if r[1] else ''}-{hw[0]}x{hw[1]}" for r, hw in CASES])
def test_probe_matches_what_opencv_decodes(photo: np.ndarray, real: tuple[str, list[int] | None, str], hw: tuple[int, int]) -> None:
    ext, params, fmt = real
    img = cv2.resize(photo, (hw[1], hw[0]), interpolation=cv2.INTER_NEAREST)
    data = encoded(ext, img, params)
    hdr = probe_image(data)
    assert (hdr.format, hdr.width, hdr.height) == (fmt, hw[1], hw[0])
    assert decode_image_bgr(data).shape == (*hw, 3)
    assert hdr.format in FORMATS


@pytest.mark.parametrize("ext", [".pgm", ".pbm", ".pfm", ".hdr"])
def test_probe_grey_and_float_formats(photo: np.ndarray, ext: str) -> None:
    src = photo.astype(np.float32) / 255 if ext in (".pfm", ".hdr") else photo[:, :, 0]
    data = encoded(ext, src)
    hdr = probe_image(data)
    assert (hdr.width, hdr.height) == (53, 37)
    assert decode_image_bgr(data).shape == (37, 53, 3)


def test_jpeg_whose_frame_header_is_past_the_first_64_kib(tmp_path: Path, photo: np.ndarray) -> None:
    data = encoded(".jpg", photo)
    big_app = b"\xff\xe1" + struct.pack(">H", 65535) + b"\0" * 65533
    f = tmp_path / "exif.jpg"
    f.write_bytes(data[:2] + big_app * 2 + data[2:])  # a real JPEG behind 128 KiB of APP1
    with pytest.raises(NeedMoreBytes):
        probe_image(f.read_bytes()[:65536], complete=False)
    assert load_image_bgr(f).shape == (37, 53, 3)
    (tmp_path / "huge.jpg").write_bytes(jpeg_header(60000, 60000, app_bytes=200_000))
    with pytest.raises(ImageError, match=r"60000x60000.*pixel budget"):
        load_image_bgr(tmp_path / "huge.jpg")


# ----------------------------------------------------------------------------------------------
# huge declared dimensions: refused from the header, before decoding


HUGE = {
    "png 30000x30000": (".png", png_header(30000, 30000), "30000x30000"),
    "png 2^31-1 wide": (".png", png_header(2**31 - 1, 1), "2147483647x1"),
    "jpeg 65535x65535": (".jpg", jpeg_header(65535, 65535), "65535x65535"),
    "bmp 100000x100000": (".bmp", bmp_header(100000, 100000), "100000x100000"),
    "bmp top-down (negative height)": (".bmp", bmp_header(20000, -20000), "20000x20000"),
    "gif 65535x65535": (".gif", gif_header(65535, 65535), "65535x65535"),
    "webp vp8x 16M x 16M": (".webp", webp_vp8x(2**24, 2**24), "16777216x16777216"),
    "tiff 1M x 1M": (".tif", tiff_header(10**6, 10**6), "1000000x1000000"),
    "tiff big-endian": (".tiff", tiff_header(50000, 50000, big_endian=True), "50000x50000"),
    "ppm 40000x40000": (".ppm", b"P6\n# a comment\n40000 40000\n255\n", "40000x40000"),
}


@pytest.mark.parametrize("case", sorted(HUGE))
def test_huge_declared_dims_are_refused_before_decoding(tmp_path: Path, case: str) -> None:
    ext, data, dims = HUGE[case]
    f = tmp_path / f"huge{ext}"
    f.write_bytes(data)
    for call in (lambda: load_image_bgr(f), lambda: load_image(f), lambda: decode_image_bgr(data, name="x")):
        with pytest.raises(ImageError, match=rf"{dims} pixels .*over the pixel budget of {MAX_IMAGE_PIXELS}"):
            bounded(call)


@pytest.mark.parametrize(
    "data",
    [tiff_header(100, 100, tile=(65536, 65536)), gif_header(10, 10, frame_wh=(60000, 60000))],
    ids=["tiff huge tile", "gif frame larger than its screen"],
)
def test_a_small_image_with_a_huge_block_is_refused(data: bytes) -> None:
    with pytest.raises(ImageError, match="block of .* pixels"):
        decode_image_bgr(data)


def test_the_pixel_budget_is_the_callers(tmp_path: Path) -> None:
    f = tmp_path / "a.png"
    f.write_bytes(real_png(200, 100))
    assert load_image_bgr(f).shape == (100, 200, 3)
    assert load_image_bgr(f, max_pixels=20000).shape == (100, 200, 3)
    with pytest.raises(ImageError, match=r"200x100 pixels \(0.0 Mpx\), over the pixel budget of 19999"):
        load_image_bgr(f, max_pixels=19999)
    for bad in (0, -1, 1.5, True, "64"):
        with pytest.raises(OptionsError, match="max_pixels"):
            load_image_bgr(f, max_pixels=bad)  # type: ignore[arg-type]


def test_predict_image_refuses_a_huge_png_quickly(tmp_path: Path, model) -> None:
    f = tmp_path / "bomb.png"
    f.write_bytes(png_header(30000, 30000))
    t0 = time.perf_counter()
    with pytest.raises(ImageError, match="30000x30000"):
        bounded(lambda: model.predict_image(f))
    assert time.perf_counter() - t0 < 2.0


def test_peak_rss_of_a_real_30000x30000_png_stays_small(tmp_path: Path) -> None:
    """The real 2.6 MB file (grey here: 0.9 MB, made in ~3 s) peaked at 5.2 GB RSS before the fix."""
    f = tmp_path / "real.png"
    f.write_bytes(real_png(30000, 30000, grey=True))
    # VmHWM (the kernel's high-water mark of this process's RSS), not ru_maxrss: on Linux ru_maxrss
    # survives exec, so a child started by a big test process would report its parent's peak
    code = textwrap.dedent(f"""
        from edge_sdk.errors import ImageError
        from edge_sdk.processing.image import load_image_bgr
        try:
            load_image_bgr({str(f)!r})
        except ImageError as e:
            print("refused", e)
        hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()[1]
        print("rss_mib", int(hwm) // 1024)
    """)
    if sys.platform != "linux":
        pytest.skip("/proc/self/status is Linux's")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "refused" in out and "30000x30000" in out, out
    assert int(out.split("rss_mib")[1]) < 400, out


# ----------------------------------------------------------------------------------------------
# preprocessing's own intermediates


def test_tall_thin_png_with_center_crop_is_refused_and_stretch_works(tmp_path: Path) -> None:
    f = tmp_path / "tall.png"
    f.write_bytes(real_png(1, 1_000_000))  # 4 KB; center_crop would ask for 256 x 256e6 pixels
    assert f.stat().st_size < 10_000
    img = load_image_bgr(f)
    assert img.shape == (1_000_000, 1, 3)
    with pytest.raises(ImageError, match=r"center_crop's resized image .* 256x256000000 pixels .* 1x1000000 image, over the pixel budget"):
        bounded(lambda: preprocess_image(img, spec("center_crop"), color="BGR"))
    for mode in ("stretch", "letterbox"):
        x, _ = preprocess_image(img, spec(mode), color="BGR")
        assert x.shape == (1, 3, 224, 224)


@pytest.mark.parametrize(
    ("hw", "ok"),
    [((1, 300_000), False), ((300_000, 1), False), ((2, 100_000), False), ((100, 10_000), True), ((480, 640), True)],
)
def test_center_crop_intermediate_is_bounded(hw: tuple[int, int], ok: bool) -> None:
    img = np.zeros((*hw, 3), np.uint8)
    if ok:
        assert preprocess_image(img, spec())[0].shape == (1, 3, 224, 224)
    else:
        with pytest.raises(ImageError, match="center_crop's resized image"):
            preprocess_image(img, spec())


def test_intermediate_budget_is_configurable_and_output_counts_too() -> None:
    img = np.zeros((100, 10_000, 3), np.uint8)  # resized to 256 x 25600 = 6.6 Mpx before the crop
    with pytest.raises(ImageError, match="over the pixel budget of 1000000"):
        preprocess_image(img, spec(), max_pixels=1_000_000)
    with pytest.raises(ImageError, match="the output of input 'image'"):
        preprocess_image(np.zeros((8, 8, 3), np.uint8), spec("stretch"), max_pixels=1000)


# ----------------------------------------------------------------------------------------------
# huge and sparse files; non-regular files as images


def test_sparse_files_are_refused_by_size_without_reading(tmp_path: Path) -> None:
    for name, size, head in (("sparse.png", 10 * 2**30, png_header(64, 64)), ("sparse.jpg", 300 * 2**20, jpeg_header(64, 64))):
        f = tmp_path / name
        f.write_bytes(head)
        os.truncate(f, size)
        t0 = time.perf_counter()
        with pytest.raises(ImageError, match=rf"is {size} bytes .* over the image file size cap"):
            bounded(lambda f=f: load_image_bgr(f))
        assert time.perf_counter() - t0 < 1.0
    f = tmp_path / "big.png"  # within a raised cap, the header is checked before the rest is read
    f.write_bytes(png_header(40000, 40000))
    os.truncate(f, 2**30)
    t0 = time.perf_counter()
    with pytest.raises(ImageError, match="40000x40000"):
        bounded(lambda: read_image_file(f, max_bytes=2**31))
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(ImageError, match="file size cap of 100 bytes"):
        read_image_file(f, max_bytes=100)


@posix_only
def test_fifo_as_image_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    for call in (lambda: load_image_bgr(fifo), lambda: read_image_file(fifo), lambda: load_image(str(fifo))):
        with pytest.raises(ImageError, match=r"is a FIFO \(named pipe\), not a regular file"):
            bounded(call)
    with pytest.raises(SourceError, match="FIFO"):
        bounded(lambda: ImageFolderSource(fifo).open())
    with pytest.raises(SourceError, match="FIFO"):
        bounded(lambda: source_from_uri(str(fifo)))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_devices_and_folders_as_images(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="character device"):
        bounded(lambda: load_image_bgr("/dev/zero"))
    link = tmp_path / "zero.png"
    link.symlink_to("/dev/zero")
    with pytest.raises(ImageError, match="character device"):
        bounded(lambda: load_image_bgr(link))
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(ImageError, match="folder|directory"):
        load_image_bgr(tmp_path / "dir.png")
    with pytest.raises(ImageError, match="does not exist"):
        load_image_bgr(tmp_path / "nope.png")


# ----------------------------------------------------------------------------------------------
# FIFOs and devices as videos


@posix_only
@pytest.mark.parametrize("name", ["clip.mp4", "clip.avi", "noext"])
def test_fifo_as_video_is_refused_without_blocking(tmp_path: Path, name: str, model) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match=r"FIFO \(named pipe\)"):
        bounded(lambda: source_from_uri(str(fifo)))
    with pytest.raises(SourceError, match=r"FIFO \(named pipe\)"):
        bounded(lambda: source_from_uri(f"file://{fifo}"))
    with pytest.raises(SourceError, match=r"FIFO \(named pipe\)"):
        bounded(lambda: OpenCVSource(str(fifo)).open())
    p = VisionPipeline(model, OpenCVSource(str(fifo)))
    with pytest.raises(SourceError, match="FIFO"):
        bounded(p.start)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_character_device_as_video_is_refused() -> None:
    with pytest.raises(SourceError, match="character device"):
        bounded(lambda: source_from_uri("/dev/zero"))
    with pytest.raises(SourceError, match="character device"):
        bounded(lambda: OpenCVSource("/dev/urandom").open())


# ----------------------------------------------------------------------------------------------
# truncated files and garbage with an image extension


def _truncations(photo: np.ndarray) -> dict[str, bytes]:
    png, jpg, bmp, webp = (encoded(e, photo) for e in (".png", ".jpg", ".bmp", ".webp"))
    return {
        "png signature only": png[:8],
        "png 5 bytes": png[:5],
        "png mid IHDR": png[:20],
        "png mid IDAT": png[: len(png) // 2],
        "png without IEND": png[:-12],
        "jpeg header only": jpg[:40],
        "jpeg mid scan": jpg[: len(jpg) // 2],
        "jpeg 2 bytes": jpg[:2],
        "bmp mid header": bmp[:10],
        "bmp half the pixels": bmp[: len(bmp) // 2],
        "webp half": webp[: len(webp) // 2],
    }


@pytest.mark.parametrize(
    "case",
    [
        "png signature only",
        "png 5 bytes",
        "png mid IHDR",
        "png mid IDAT",
        "png without IEND",
        "jpeg header only",
        "jpeg mid scan",
        "jpeg 2 bytes",
        "bmp mid header",
        "bmp half the pixels",
        "webp half",
    ],
)
def test_truncated_files_raise_image_error(tmp_path: Path, photo: np.ndarray, case: str) -> None:
    data = _truncations(photo)[case]
    f = tmp_path / "t.img"
    f.write_bytes(data)
    with pytest.raises(ImageError, match=r"truncated|cannot decode|ends after|not a valid"):
        bounded(lambda: load_image_bgr(f))


GARBAGE = {
    "random.png": bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)),
    "text.jpg": b"hello, I am not an image\n" * 10,
    "html.png": b"<!doctype html><html><body>404</body></html>",
    "zip.webp": b"PK\x03\x04" + b"\0" * 100,
    "onnx.bmp": b"\x08\x07\x12\x04\x74\x65\x73\x74" + b"\0" * 100,
    "zeros.tif": b"\0" * 1000,
    "avif.png": b"\0\0\0\x20ftypavif" + b"\0" * 100,
    "riff-not-webp.webp": b"RIFF\x10\0\0\0WAVEfmt " + b"\0" * 32,
    "png with a bad first chunk.png": b"\x89PNG\r\n\x1a\n" + b"\0" * 20,
    "jpeg with scan before frame.jpg": b"\xff\xd8\xff\xda\x00\x02" + b"\0" * 30 + b"\xff\xd9",
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_with_an_image_extension(tmp_path: Path, name: str) -> None:
    f = tmp_path / name
    f.write_bytes(GARBAGE[name])
    with pytest.raises(ImageError, match=r"not an image in a format|not a valid|truncated|cannot decode"):
        bounded(lambda: load_image_bgr(f))


def test_empty_file_and_empty_buffer() -> None:
    with pytest.raises(ImageError, match="empty"):
        decode_image_bgr(b"")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.png").write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        load_image_bgr(tmp_path / "e.png")


# ----------------------------------------------------------------------------------------------
# a decoder under a memory limit: a typed error, not a raw cv2.error


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is Linux's")
def test_decode_under_a_memory_limit_is_an_image_error(tmp_path: Path) -> None:
    f = tmp_path / "big.png"
    f.write_bytes(real_png(12000, 12000))  # 432 MB decoded, allowed by the budget below
    code = textwrap.dedent(f"""
        import resource
        import numpy as np
        from edge_sdk.errors import ImageError
        from edge_sdk.package import ImagePreprocess, TensorSpec
        from edge_sdk.processing.image import load_image_bgr, preprocess_image
        import cv2
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + 200 * 2**20, resource.RLIM_INFINITY))
        try:
            load_image_bgr({str(f)!r}, max_pixels=10**9)
            print("decoded")
        except ImageError as e:
            print("ImageError", e)
        spec = TensorSpec("image", "float32", (1, 3, 224, 224), "NCHW", preprocess=ImagePreprocess((224, 224), resize="center_crop"))
        try:
            preprocess_image(np.zeros((20, 60000, 3), np.uint8), spec, max_pixels=10**10)  # a 590 MB intermediate
            print("preprocessed")
        except ImageError as e:
            print("ImageError", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout + r.stderr
    assert lines[0].startswith("ImageError") and "12000x12000" in lines[0], r.stdout
    assert lines[1].startswith("ImageError") and ("memory" in lines[1] or "OpenCV failed" in lines[1]), r.stdout


# ----------------------------------------------------------------------------------------------
# a folder pipeline with bad files among good ones: each bad file is a dropped frame with a reason


def test_folder_pipeline_drops_each_bad_file_and_goes_on(tmp_path: Path, model, photo: np.ndarray) -> None:
    d = tmp_path / "shots"
    d.mkdir()
    good = {
        "00.png": encoded(".png", photo),
        "02.jpg": encoded(".jpg", photo),
        "04.bmp": encoded(".bmp", photo),
        "07.webp": encoded(".webp", photo),
        "09.png": real_png(64, 48),
    }
    bad = {
        "01.png": (png_header(30000, 30000), "30000x30000"),
        "03.jpg": (encoded(".jpg", photo)[:300], "truncated"),
        "05.png": (b"garbage" * 50, "not an image in a format"),
        "06.tif": (tiff_header(70000, 70000), "70000x70000"),
        "08.png": (png_header(64, 64), "size cap"),  # made sparse below
    }
    for name, data in good.items():
        (d / name).write_bytes(data)
    for name, (data, _) in bad.items():
        (d / name).write_bytes(data)
    os.truncate(d / "08.png", 5 * 2**30)
    if hasattr(os, "mkfifo"):
        os.mkfifo(d / "10.png")
        bad["10.png"] = (b"", "FIFO")
    drops: list[FrameDrop] = []
    results: list[Any] = []
    p = VisionPipeline(model, f"file://{d}/", sinks=[results.append], on_drop=drops.append)
    p.start()
    assert p.join(30), f"pipeline did not finish: {p.counters()}"
    c = p.counters()
    assert c.unaccounted == 0 and c.in_flight == 0, c
    assert c.frames_in == len(good) + len(bad), c
    assert c.processed == len(good), (c, drops)
    assert c.dropped["decode_error"] == len(bad), c
    assert p.error is None
    names = [f.name for f in p.source.paths]  # type: ignore[attr-defined]
    by_index = {dr.index: dr for dr in drops}
    for name, (_, why) in bad.items():
        dr = by_index[names.index(name)]
        assert dr.reason == "decode_error" and name in dr.detail and why in dr.detail, dr
    assert sorted(r.index for r in results) == sorted(names.index(n) for n in good)


def test_folder_source_drop_details_name_the_budget(tmp_path: Path, photo: np.ndarray) -> None:
    (tmp_path / "a.png").write_bytes(encoded(".png", photo))
    (tmp_path / "b.png").write_bytes(png_header(9000, 9000))
    (tmp_path / "c.jpg").write_bytes(jpeg_header(2000, 2000))
    with ImageFolderSource(tmp_path, max_pixels=1_000_000) as src:
        items = bounded(lambda: list(src))
    assert [type(i).__name__ for i in items] == ["Frame", "FrameDrop", "FrameDrop"]
    assert "b.png" in items[1].detail and "9000x9000" in items[1].detail and "budget of 1000000" in items[1].detail
    assert "c.jpg" in items[2].detail and "2000x2000" in items[2].detail
    with pytest.raises(OptionsError, match="max_bytes"):
        ImageFolderSource(tmp_path, max_bytes=0)
