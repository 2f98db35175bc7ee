"""Image dimensions from the first bytes of a file, before anything is decoded.

:func:`probe_image` reads the width and height an encoded image declares (PNG IHDR, JPEG SOFn,
BMP, GIF, WebP, TIFF / BigTIFF, PNM / PAM / PFM, Sun raster, Radiance HDR, JPEG 2000) so that a decoder is
never asked to allocate a frame the caller's pixel budget does not allow. A file in another
format (or none) is refused: the SDK decodes only what it can size first. The parsers touch only
the header; a header that is cut short raises :class:`NeedMoreBytes` (the caller may retry with
more of the file) or, for a complete buffer, :class:`~edge_sdk.errors.ImageError`.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

from ..errors import ImageError

__all__ = ["FORMATS", "ImageHeader", "NeedMoreBytes", "probe_image"]

#: The formats whose dimensions :func:`probe_image` reads (and so the formats the SDK decodes).
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WebP", "TIFF", "PNM", "PAM", "PFM", "Sun raster", "Radiance HDR", "JPEG 2000")


class ImageHeader(NamedTuple):
    """What a header declares: ``format`` (one of :data:`FORMATS`), ``width`` and ``height`` in
    pixels, and ``alloc_pixels``: the largest block of pixels the decoder allocates besides the
    frame (a TIFF tile or strip, a GIF frame larger than its screen), ``0`` when none is known."""

    format: str
    width: int
    height: int
    alloc_pixels: int = 0


class NeedMoreBytes(ImageError):
    """The header continues past the bytes given (only raised when ``complete=False``)."""


def _short(fmt: str, data: bytes, complete: bool, what: str = "header") -> ImageError:
    if complete:
        return ImageError(f"truncated {fmt} file: its {what} ends after {len(data)} bytes")
    return NeedMoreBytes(f"{fmt} {what} continues past the first {len(data)} bytes")


def _png(d: bytes, complete: bool) -> ImageHeader:
    if len(d) < 24:
        raise _short("PNG", d, complete)
    if d[12:16] != b"IHDR":
        raise ImageError(f"not a valid PNG file: the first chunk is {d[12:16]!r}, not IHDR")
    w, h = struct.unpack(">II", d[16:24])
    return ImageHeader("PNG", w, h)


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(d: bytes, complete: bool) -> ImageHeader:
    i, n = 2, len(d)
    while True:
        while i < n and d[i] != 0xFF:  # junk between segments: libjpeg skips it too (with a warning)
            i += 1
        while i < n and d[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            raise _short("JPEG", d, complete, "header (no frame header SOFn)")
        marker = d[i]
        i += 1
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # standalone markers
            continue
        if marker == 0xD9:
            raise ImageError("not a valid JPEG file: end of image before any frame header (SOFn)")
        if i + 2 > n:
            raise _short("JPEG", d, complete, "header (no frame header SOFn)")
        seg = (d[i] << 8) | d[i + 1]
        if seg < 2:
            raise ImageError(f"not a valid JPEG file: segment 0xFF{marker:02X} has length {seg}")
        if marker in _SOF:
            if i + 7 > n:
                raise _short("JPEG", d, complete, "frame header (SOFn)")
            h, w = struct.unpack(">HH", d[i + 3 : i + 7])
            if h == 0:
                raise ImageError("JPEG frame header declares height 0 (defined later by a DNL marker); not supported")
            return ImageHeader("JPEG", w, h)
        if marker == 0xDA:
            raise ImageError("not a valid JPEG file: scan data before any frame header (SOFn)")
        i += seg


def _bmp(d: bytes, complete: bool) -> ImageHeader:
    if len(d) < 26:
        raise _short("BMP", d, complete)
    (dib,) = struct.unpack("<I", d[14:18])
    if dib == 12:  # BITMAPCOREHEADER (OS/2 1.x): 16-bit sides
        w, h = struct.unpack("<HH", d[18:22])
    elif dib >= 16:
        w, h = struct.unpack("<ii", d[18:26])
    else:
        raise ImageError(f"not a valid BMP file: info header size {dib}")
    return ImageHeader("BMP", abs(w), abs(h))  # a negative height is a top-down bitmap


def _gif(d: bytes, complete: bool) -> ImageHeader:
    if len(d) < 13:
        raise _short("GIF", d, complete)
    sw, sh, flags = struct.unpack("<HHB", d[6:11])
    i = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    fw = fh = 0
    while True:  # the first image descriptor: a frame may be larger than the screen
        if i >= len(d):
            if complete:
                break  # no frame: the decoder fails on its own, allocating only the screen
            raise _short("GIF", d, complete, "first image descriptor")
        b = d[i]
        if b == 0x2C:
            if i + 9 > len(d):
                raise _short("GIF", d, complete, "image descriptor")
            x, y, w, h = struct.unpack("<HHHH", d[i + 1 : i + 9])
            fw, fh = x + w, y + h
            break
        if b == 0x21:  # extension: label, then sub-blocks up to a zero length
            i += 2
            while i < len(d) and d[i]:
                i += d[i] + 1
            i += 1
            continue
        break  # trailer or junk
    return ImageHeader("GIF", sw, sh, fw * fh if fw * fh > sw * sh else 0)


def _webp(d: bytes, complete: bool) -> ImageHeader:
    if len(d) < 30:
        raise _short("WebP", d, complete)
    kind = d[12:16]
    if kind == b"VP8 ":
        if d[23:26] != b"\x9d\x01\x2a":
            raise ImageError("not a valid WebP file: VP8 frame without its start code")
        w, h = struct.unpack("<HH", d[26:30])
        return ImageHeader("WebP", w & 0x3FFF, h & 0x3FFF)
    if kind == b"VP8L":
        if d[20] != 0x2F:
            raise ImageError("not a valid WebP file: VP8L bitstream without its signature")
        (bits,) = struct.unpack("<I", d[21:25])
        return ImageHeader("WebP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if kind == b"VP8X":
        w = int.from_bytes(d[24:27], "little") + 1
        h = int.from_bytes(d[27:30], "little") + 1
        return ImageHeader("WebP", w, h)
    raise ImageError(f"not a valid WebP file: unknown chunk {kind!r}")


def _tiff(d: bytes, complete: bool) -> ImageHeader:
    e = "<" if d[:2] == b"II" else ">"
    if len(d) < 16:
        raise _short("TIFF", d, complete)
    (version,) = struct.unpack(e + "H", d[2:4])
    big = version == 43
    if big:
        (off,) = struct.unpack(e + "Q", d[8:16])
        cnt_fmt, cnt_size, ent_size, val_off = "Q", 8, 20, 12
    else:
        (off,) = struct.unpack(e + "I", d[4:8])
        cnt_fmt, cnt_size, ent_size, val_off = "H", 2, 12, 8
    if off + cnt_size > len(d):
        raise _short("TIFF", d, complete, "first image directory")
    (count,) = struct.unpack(e + cnt_fmt, d[off : off + cnt_size])
    if off + cnt_size + count * ent_size > len(d):
        raise _short("TIFF", d, complete, "first image directory")
    tags: dict[int, int] = {}
    for k in range(count):
        p = off + cnt_size + k * ent_size
        tag, typ = struct.unpack(e + "HH", d[p : p + 4])
        v = d[p + val_off : p + val_off + 8]
        if typ == 3:  # SHORT
            tags[tag] = struct.unpack(e + "H", v[:2])[0]
        elif typ == 4:  # LONG
            tags[tag] = struct.unpack(e + "I", v[:4])[0]
        elif typ == 16 and big:  # LONG8
            tags[tag] = struct.unpack(e + "Q", v[:8])[0]
    if 256 not in tags or 257 not in tags:
        raise ImageError("not a valid TIFF file: the first image directory has no ImageWidth/ImageLength")
    w, h = tags[256], tags[257]
    if 322 in tags or 323 in tags:  # tiles
        block = tags.get(322, 0) * tags.get(323, 0)
    else:  # strips: RowsPerStrip rows of the image width (default: the whole image)
        block = w * min(tags.get(278, h), max(h, 1))
    return ImageHeader("TIFF", w, h, block)


_PNM_TOKEN = re.compile(rb"(?:\s|#[^\n]*(?:\n|$))*(\S+)")


def _pnm(d: bytes, complete: bool) -> ImageHeader:
    fmt = "PFM" if d[1:2] in (b"F", b"f") else "PNM"
    pos, vals = 2, list[int]()
    while len(vals) < 2:
        m = _PNM_TOKEN.match(d, pos)
        if m is None or m.end() >= len(d):  # a number must be followed by whitespace
            raise _short(fmt, d, complete)
        tok = m.group(1)
        if not tok.isdigit():
            raise ImageError(f"not a valid {fmt} file: expected the width and height, found {tok[:16]!r}")
        vals.append(int(tok))
        pos = m.end()
    return ImageHeader(fmt, vals[0], vals[1])


def _pam(d: bytes, complete: bool) -> ImageHeader:
    end = d.find(b"ENDHDR")
    if end < 0:
        if len(d) > 4096:
            raise ImageError("not a valid PAM file: no ENDHDR within 4096 bytes")
        raise _short("PAM", d, complete)
    head = d[:end].decode("ascii", "replace")
    w = re.search(r"^\s*WIDTH\s+(\d+)", head, re.M)
    h = re.search(r"^\s*HEIGHT\s+(\d+)", head, re.M)
    if w is None or h is None:
        raise ImageError("not a valid PAM file: no WIDTH or HEIGHT line")
    return ImageHeader("PAM", int(w.group(1)), int(h.group(1)))


def _sunras(d: bytes, complete: bool) -> ImageHeader:
    if len(d) < 12:
        raise _short("Sun raster", d, complete)
    w, h = struct.unpack(">ii", d[4:12])
    if w < 0 or h < 0:
        raise ImageError(f"not a valid Sun raster file: size {w}x{h}")
    return ImageHeader("Sun raster", w, h)


_HDR_RES = re.compile(rb"\n\n?([-+][YX])\s+(\d+)\s+([-+][YX])\s+(\d+)\s*\n")


def _hdr(d: bytes, complete: bool) -> ImageHeader:
    m = _HDR_RES.search(d[:65536])
    if m is None:
        if len(d) >= 65536:
            raise ImageError("not a valid Radiance HDR file: no resolution line within 64 KiB")
        raise _short("Radiance HDR", d, complete)
    a, b = int(m.group(2)), int(m.group(4))
    return ImageHeader("Radiance HDR", b, a) if m.group(1).endswith(b"Y") else ImageHeader("Radiance HDR", a, b)


def _jp2(d: bytes, complete: bool) -> ImageHeader:
    i = 0
    while True:  # top-level boxes up to the jp2h header box, then its ihdr box
        if i + 8 > len(d):
            raise _short("JPEG 2000", d, complete, "header (no ihdr box)")
        size, kind = struct.unpack(">I4s", d[i : i + 8])
        if kind == b"jp2h":
            j = d.find(b"ihdr", i + 8, i + 8 + 64)
            if j < 0:
                raise ImageError("not a valid JPEG 2000 file: the jp2h box does not start with ihdr")
            if j + 12 > len(d):
                raise _short("JPEG 2000", d, complete, "ihdr box")
            h, w = struct.unpack(">II", d[j + 4 : j + 12])
            return ImageHeader("JPEG 2000", w, h)
        if size < 8:
            raise ImageError(f"not a valid JPEG 2000 file: box {kind!r} has size {size}")
        i += size


def _j2k(d: bytes, complete: bool) -> ImageHeader:
    if len(d) < 24:
        raise _short("JPEG 2000", d, complete)
    if d[2:4] != b"\xff\x51":
        raise ImageError("not a valid JPEG 2000 codestream: no SIZ marker after SOC")
    xs, ys, xo, yo = struct.unpack(">IIII", d[8:24])
    return ImageHeader("JPEG 2000", max(0, xs - xo), max(0, ys - yo))


def probe_image(data: bytes, *, complete: bool = True) -> ImageHeader:
    """The format and declared size of the encoded image ``data`` (the file, or its first bytes
    with ``complete=False``). Raises :class:`~edge_sdk.errors.ImageError` for a format it does not
    know (the message lists :data:`FORMATS`) or a header that is invalid or cut short, and
    :class:`NeedMoreBytes` when ``complete=False`` and the header goes on past ``data``."""
    d = bytes(data[:16]) if len(data) < 16 else data
    if d[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data, complete)
    if d[:3] == b"\xff\xd8\xff":
        return _jpeg(data, complete)
    if d[:2] == b"BM":
        return _bmp(data, complete)
    if d[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data, complete)
    if d[:4] == b"RIFF" and d[8:12] == b"WEBP":
        return _webp(data, complete)
    if d[:4] in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"):
        return _tiff(data, complete)
    if d[:1] == b"P" and d[1:2] in b"123456Ff" and len(d) > 2:
        return _pnm(data, complete)
    if d[:3] == b"P7\n":
        return _pam(data, complete)
    if d[:4] == b"\x59\xa6\x6a\x95":
        return _sunras(data, complete)
    if d[:10] == b"#?RADIANCE" or d[:6] == b"#?RGBE":
        return _hdr(data, complete)
    if d[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n":
        return _jp2(data, complete)
    if d[:2] == b"\xff\x4f":
        return _j2k(data, complete)
    if not complete and len(data) < 16:
        raise NeedMoreBytes(f"{len(data)} bytes are too few to tell the image format")
    if len(data) < 16 and (not data or b"\x89PNG\r\n\x1a\n".startswith(bytes(data[:8])) or bytes(data[:3]) in (b"\xff\xd8", b"\xff")):
        raise ImageError(f"truncated image file: {len(data)} bytes")
    raise ImageError(
        f"not an image in a format the SDK decodes (its dimensions are checked before decoding): "
        f"supported {', '.join(FORMATS)}; the file starts with {bytes(data[:8])!r}"
    )
