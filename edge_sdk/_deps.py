"""Optional dependencies, imported when first needed, with errors that name the extra."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib import metadata

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


@dataclass(frozen=True)
class RuntimeBuild:
    """One installed distribution that provides a runtime module: its name, version and where its metadata is."""

    name: str
    version: str
    location: str


@dataclass(frozen=True)
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


def _record_hash(dist: metadata.Distribution, relative: str) -> str | None:
    for f in dist.files or ():
        if f.as_posix() == relative and f.hash is not None and f.hash.mode == "sha256":
            return str(f.hash.value)
    return None


def _file_hash(path: Path) -> str | None:
    try:
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _package_name_in(info: Path) -> str | None:
    try:
        text = info.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r"^package_name\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return _normalise(found.group(1)) if found else None


def _candidate_distributions() -> list[metadata.Distribution]:
    """The ``*.dist-info`` / ``*.egg-info`` folders on ``sys.path`` whose name could be an ONNX Runtime
    build, as importlib.metadata distributions (a glob per path entry: reading every installed
    distribution's METADATA would cost tens of milliseconds)."""
    import sys
    from importlib import metadata  # here, not at the top: it costs tens of ms of import time

    out: list[metadata.Distribution] = []
    for entry in sys.path:
        base = Path(entry or ".")
        if not base.is_dir():
            continue
        for pattern in ("onnxruntime*.dist-info", "onnxruntime*.egg-info", "ort_nightly*.dist-info", "ort-nightly*.dist-info"):
            out.extend(metadata.Distribution.at(p) for p in sorted(base.glob(pattern)))
    return out


@functools.lru_cache(maxsize=1)
def onnxruntime_builds() -> RuntimeBuilds:
    """The ONNX Runtime builds installed on ``sys.path``, read from their ``importlib.metadata``
    (``*.dist-info``) without importing ``onnxruntime``; read once per process (``cache_clear()`` to read again).

    With more than one, the active build is the one whose RECORD hash of
    ``onnxruntime/capi/build_and_package_info.py`` matches the file on disk (the last one
    installed wrote it), else the ``package_name`` that file names; a warning says that the
    builds overwrite each other's files and how to repair it."""
    import importlib.util

    found: dict[str, RuntimeBuild] = {}
    dists: dict[str, metadata.Distribution] = {}
    for dist in _candidate_distributions():
        raw = dist.metadata["Name"] if dist.metadata is not None else None
        if not raw:
            continue
        name = _normalise(str(raw))
        if name in found or not _is_ort_name(name):
            continue
        files = {f.as_posix() for f in (dist.files or ())}
        if _ORT_MARKER not in files:
            continue
        location = str(dist.locate_file(""))
        found[name] = RuntimeBuild(name, str(dist.version), location)
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
