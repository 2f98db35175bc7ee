"""Optional dependencies, imported when first needed, with errors that name the extra."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

from ._record import frozen
from .errors import MissingDependencyError

VISION = "pip install 'edge-sdk[vision]' (opencv-python-headless, pillow)"
GENERATE = "pip install 'edge-sdk[generate]' (tokenizers, jinja2)"


def require_cv2(purpose: str) -> Any:
    """The ``cv2`` module, or MissingDependencyError saying ``purpose`` needs OpenCV."""
    try:
        import cv2
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs OpenCV: {VISION}") from e
    return cv2


def require_tokenizers(purpose: str) -> Any:
    """The ``tokenizers`` module, or MissingDependencyError saying ``purpose`` needs it."""
    try:
        import tokenizers
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs the 'tokenizers' package: {GENERATE}") from e
    return tokenizers


def require_jinja2(purpose: str) -> Any:
    """The ``jinja2`` module, or MissingDependencyError saying ``purpose`` needs it."""
    try:
        import jinja2
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs the 'jinja2' package: {GENERATE}") from e
    return jinja2


# --------------------------------------------------------------------------- ONNX Runtime builds
#
# Every ONNX Runtime wheel installs the same top-level module, ``onnxruntime/``: the CPU build
# (``onnxruntime``), ``onnxruntime-gpu`` (CUDA; also the name of NVIDIA's Jetson wheels), and the
# OpenVINO, QNN, DirectML, training and nightly builds. pip treats them as unrelated projects, so
# installing one over another overwrites the other's files (ONNX Runtime's install docs say to
# uninstall the other build first: https://onnxruntime.ai/docs/install/). This is why the CPU build
# is an extra (``edge-sdk[cpu]``), not a base dependency: the base install keeps whatever build is there.

ORT_INSTALL = (
    "install one ONNX Runtime build: pip install \"edge-sdk[cpu]\" (onnxruntime, the CPU build), "
    "pip install \"edge-sdk[gpu]\" (onnxruntime-gpu, CUDA on x86_64), or on a Jetson the onnxruntime-gpu "
    "wheel built for your JetPack from NVIDIA's Jetson pip index (docs/install.md)"
)
#: Distribution names (PEP 503-normalised) that ship the ``onnxruntime`` module; ``ort-nightly*``
#: are matched by prefix. Any other name starting with ``onnxruntime-`` counts too if its RECORD
#: lists ``onnxruntime/__init__.py`` (``onnxruntime-genai`` does not: it ships ``onnxruntime_genai``).
ORT_DISTRIBUTIONS: tuple[str, ...] = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
    "onnxruntime-directml",
    "onnxruntime-training",
)
_ORT_MARKER = "onnxruntime/__init__.py"
_ORT_INFO = "onnxruntime/capi/build_and_package_info.py"  # the wheel's own `package_name = '...'`


@frozen
class RuntimeBuild:
    """One installed distribution that provides a runtime module: its name, version and where its metadata is."""

    name: str
    version: str
    location: str


@frozen
class RuntimeBuilds:
    """Which builds of a runtime module are installed, and which one the module on disk is.

    ``installed``: every distribution providing the module (usually one). ``active``: the name of
    the one whose files are on disk (``None`` when none is installed, or it cannot be told);
    ``how``: how ``active`` was decided. ``warnings``: for humans (two builds installed overwrite
    each other's files)."""

    module: str
    installed: tuple[RuntimeBuild, ...] = ()
    active: str | None = None
    how: str = ""
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "module": self.module,
            "installed": [{"name": b.name, "version": b.version, "location": b.location} for b in self.installed],
            "active": self.active,
            "how": self.how,
            "warnings": list(self.warnings),
        }


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_ort_name(name: str) -> bool:
    return name in ORT_DISTRIBUTIONS or name.startswith(("ort-nightly", "onnxruntime-"))


class _DistInfo:
    """One ``*.dist-info`` / ``*.egg-info`` folder, read without ``importlib.metadata`` (whose import
    alone costs 50-80 ms, email and zipfile included, on the path of every ``edge_sdk.load``).

    ``METADATA`` (``PKG-INFO`` for egg-info) is read for its ``Name:`` and ``Version:`` header lines
    (the core metadata format: https://packaging.python.org/en/latest/specifications/core-metadata/),
    ``RECORD`` (``installed-files.txt`` for egg-info) for its ``path,sha256=<urlsafe b64>,size`` rows
    (https://packaging.python.org/en/latest/specifications/recording-installed-packages/)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        meta = folder / ("PKG-INFO" if folder.suffix == ".egg-info" else "METADATA")
        self.name: str | None = None
        self.version = ""
        try:
            with open(meta, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    key, sep, value = line.partition(":")
                    if sep and key == "Name" and self.name is None:
                        self.name = value.strip()
                    elif sep and key == "Version" and not self.version:
                        self.version = value.strip()
        except OSError:
            pass
        self._files: dict[str, str | None] | None = None

    @property
    def files(self) -> dict[str, str | None]:
        """Installed path (relative to the site folder, posix) -> its RECORD sha256 (urlsafe b64) or None."""
        if self._files is None:
            import csv

            out: dict[str, str | None] = {}
            rec = self.folder / "RECORD"
            try:
                if rec.is_file():
                    with open(rec, encoding="utf-8", errors="replace", newline="") as f:
                        for row in csv.reader(f):
                            if row:
                                h = row[1] if len(row) > 1 else ""
                                out[row[0]] = h[len("sha256=") :] if h.startswith("sha256=") else None
                else:
                    listed = self.folder / "installed-files.txt"
                    for line in listed.read_text(encoding="utf-8", errors="replace").splitlines():
                        rel = (self.folder / line.strip()).resolve()
                        try:
                            out[rel.relative_to(self.folder.parent.resolve()).as_posix()] = None
                        except ValueError:
                            continue
            except OSError:
                pass
            self._files = out
        return self._files

    def locate(self) -> str:
        return str(self.folder.parent)


def _record_hash(dist: _DistInfo, relative: str) -> str | None:
    return dist.files.get(relative)


def _file_hash(path: Path) -> str | None:
    try:
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None
    import base64  # only where a wheel's RECORD digest is checked

    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _package_name_in(info: Path) -> str | None:
    try:
        text = info.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r"^package_name\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return _normalise(found.group(1)) if found else None


def _candidate_distributions() -> list[_DistInfo]:
    """The ``*.dist-info`` / ``*.egg-info`` folders on ``sys.path`` whose name could be an ONNX Runtime
    build (a glob per path entry: reading every installed distribution's METADATA would cost tens of
    milliseconds)."""
    import sys

    out: list[_DistInfo] = []
    for entry in sys.path:
        base = Path(entry or ".")
        if not base.is_dir():
            continue
        for pattern in ("onnxruntime*.dist-info", "onnxruntime*.egg-info", "ort_nightly*.dist-info", "ort-nightly*.dist-info"):
            out.extend(_DistInfo(p) for p in sorted(base.glob(pattern)))
    return out


@functools.lru_cache(maxsize=1)
def onnxruntime_builds() -> RuntimeBuilds:
    """The ONNX Runtime builds installed on ``sys.path``, read from their ``*.dist-info`` folders
    (:class:`_DistInfo`) without importing ``onnxruntime`` or ``importlib.metadata``; read once per process (``cache_clear()`` to read again).

    With more than one, the active build is the one whose RECORD hash of
    ``onnxruntime/capi/build_and_package_info.py`` matches the file on disk (the last one
    installed wrote it), else the ``package_name`` that file names; a warning says that the
    builds overwrite each other's files and how to repair it."""
    import importlib.util

    found: dict[str, RuntimeBuild] = {}
    dists: dict[str, _DistInfo] = {}
    for dist in _candidate_distributions():
        if not dist.name:
            continue
        name = _normalise(dist.name)
        if name in found or not _is_ort_name(name):
            continue
        if _ORT_MARKER not in dist.files:
            continue
        found[name] = RuntimeBuild(name, dist.version, dist.locate())
        dists[name] = dist
    installed = tuple(sorted(found.values(), key=lambda b: b.name))
    spec = importlib.util.find_spec("onnxruntime")
    package_dir = Path(spec.origin).parent if spec is not None and spec.origin else None
    if not installed:
        how = f"no distribution provides it, but the module is at {package_dir}" if package_dir else "not installed"
        return RuntimeBuilds("onnxruntime", (), None, how)
    if len(installed) == 1:
        return RuntimeBuilds("onnxruntime", installed, installed[0].name, "the only installed build")
    active: str | None = None
    how = ""
    if package_dir is not None:
        info = package_dir / "capi" / "build_and_package_info.py"
        on_disk = _file_hash(info)
        matches = [b.name for b in installed if on_disk is not None and _record_hash(dists[b.name], _ORT_INFO) == on_disk]
        if len(matches) == 1:
            active, how = matches[0], f"its RECORD hash of {_ORT_INFO} matches {info}"
        else:
            named = _package_name_in(info)
            if named in found:
                active, how = named, f"{info} says package_name = {named!r}"
    names = ", ".join(f"{b.name} {b.version}" for b in installed)
    repair = f"pip uninstall {' '.join(b.name for b in installed)}, then install one"
    won = f"; the files on disk are {active}'s ({how})" if active else "; which one's files are on disk cannot be told"
    warning = f"{len(installed)} ONNX Runtime builds are installed ({names}): they share the onnxruntime/ folder and overwrite each other's files{won}; {repair}"
    return RuntimeBuilds("onnxruntime", installed, active, how or "undecided", (warning,))
