"""The backend seam.

Only the modules in this package import a runtime (onnxruntime, ai_edge_litert,
tflite_runtime).  Everything above sees :class:`Session`, :class:`TensorInfo`,
:class:`SessionInfo` and :class:`SessionOptions`: plain Python and numpy.

A backend is a module with ``NAME``, ``status() -> BackendStatus`` and
``open_session(model, options) -> Session``; :data:`BACKENDS` maps names to
modules (a table, not an if/elif chain), imported lazily.
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from dataclasses import field
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping

import numpy as np

from .._record import frozen
from ..errors import BackendUnavailableError, OptionsError, SessionClosedError

BACKENDS: dict[str, str] = {
    "onnxruntime": "edge_sdk.backends.ort",
    "litert": "edge_sdk.backends.litert",
}

GRAPH_OPT_LEVELS = ("disable", "basic", "extended", "all")


@frozen
class TensorInfo:
    """A model tensor as the runtime reports it.

    ``dtype`` is what callers pass/get (the real-valued dtype for quantized
    tensors unless raw I/O was asked for); ``raw_dtype`` is the tensor's own
    type; ``quant`` is (scale, zero_point) for affine-quantized tensors.
    ``shape`` uses None (or a name) for dynamic dims.
    """

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]
    raw_dtype: str | None = None
    quant: tuple[float, int] | None = None


@frozen
class SessionOptions:
    """How to open a session; built from the device profile, overridable per load.

    ``threads``: intra-op threads (LiteRT ``num_threads``). ``allow_spinning``:
    ONNX Runtime's thread-pool spin-wait after each run. ``providers`` /
    ``delegates``: wanted in order; what is missing falls back, and the session
    reports what it used. ``cache_dir``: where optimised models are kept.
    ``raw_io``: pass and get quantized tensors as stored (no scale/zero point).
    ``deterministic``: ask the runtime for repeatable results; each backend maps it to its
    own settings (see docs/reproducibility.md) and lists them in ``SessionInfo.determinism``.
    """

    threads: int = 1
    allow_spinning: bool = False
    graph_optimization: str = "all"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    delegates: tuple[str, ...] = ()
    cache_dir: Path | None = None
    raw_io: bool = False
    deterministic: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise OptionsError(f"threads: expected an int >= 1, got {self.threads!r}")
        if self.graph_optimization not in GRAPH_OPT_LEVELS:
            raise OptionsError(f"graph_optimization: expected one of {GRAPH_OPT_LEVELS}, got {self.graph_optimization!r}")


@frozen
class SessionInfo:
    """What a session actually runs on, for ``model.describe()`` and the CLI."""

    backend: str
    runtime: str
    runtime_version: str
    threads: int
    providers_requested: tuple[str, ...] = ()
    providers_used: tuple[str, ...] = ()
    delegates_used: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    optimized_cache: str | None = None
    create_ms: float = 0.0
    #: the runtime settings deterministic mode made (empty when it is off)
    determinism: tuple[str, ...] = ()


@frozen
class BackendStatus:
    """Whether a backend can run here: its runtime package and version, or (``available`` false) why not in ``detail``;
    ``providers``: the execution providers the runtime offers; ``build``: the installed distribution that provides the
    runtime module (``onnxruntime``, ``onnxruntime-gpu``, ``onnxruntime-openvino``, ..., ``ai-edge-litert``,
    ``tflite-runtime``); ``notes``: warnings about the install (two ONNX Runtime builds overwriting each other)."""
    name: str
    available: bool
    runtime: str = ""
    version: str = ""
    detail: str = ""
    providers: tuple[str, ...] = field(default_factory=tuple)
    build: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)


class ModelSource:
    """Verified model bytes plus the on-disk path (for external data).

    ``read`` (instead of ``data``): a function that reads and verifies the bytes, called the first
    time :attr:`data` is asked for, so a backend that needs no bytes (ONNX Runtime loading its
    cached optimised model, which it verifies against its own digest) never reads the original."""

    __slots__ = ("_data", "_read", "path", "sha256", "has_external_data")

    def __init__(
        self, data: bytes | None, path: Path, sha256: str, has_external_data: bool = False, *, read: Callable[[], bytes] | None = None
    ) -> None:
        if (data is None) == (read is None):
            raise TypeError("ModelSource: pass either data or read")
        self._data, self._read = data, read
        self.path, self.sha256, self.has_external_data = path, sha256, has_external_data

    @property
    def data(self) -> bytes:
        """The verified bytes (read now if they were deferred)."""
        if self._data is None:
            assert self._read is not None
            self._data = self._read()
        return self._data

    @property
    def bytes_read(self) -> bool:
        """Whether the bytes are in memory (given, or read on demand)."""
        return self._data is not None

    def __repr__(self) -> str:
        return f"ModelSource(path={str(self.path)!r}, sha256={self.sha256[:12]!r}, bytes_read={self.bytes_read})"


class Session(ABC):
    """An open runtime session. Thread-safe ``run``; ``close()`` is idempotent."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    info: SessionInfo

    def __init__(self) -> None:
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"{self.info.backend} session is closed")

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` must already be validated; returns outputs by name,
        in the model's output order."""

    def close(self) -> None:
        """Release the runtime session; idempotent and thread-safe. Later calls raise
        :class:`~edge_sdk.errors.SessionClosedError`."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._release()

    @abstractmethod
    def _release(self) -> None:
        """Free runtime resources; called once."""

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _module(name: str) -> ModuleType:
    try:
        mod = BACKENDS[name]
    except KeyError:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}") from None
    return importlib.import_module(mod)


def backend_status(name: str) -> BackendStatus:
    """Is the runtime for ``name`` importable here, and which version/providers."""
    status: BackendStatus = _module(name).status()  # each backend module's status() (ort, litert)
    return status


def all_backend_status() -> dict[str, BackendStatus]:
    """The :class:`BackendStatus` of every known backend, by name."""
    return {n: backend_status(n) for n in BACKENDS}


def open_session(backend: str, model: ModelSource, options: SessionOptions) -> Session:
    """Open a session on ``backend``. Raises BackendUnavailableError (names the
    extra to install) or SessionError (the runtime refused the model)."""
    session: Session = _module(backend).open_session(model, options)
    return session


# numpy dtype names for the dtypes manifests use
NUMPY_DTYPES: dict[str, np.dtype] = {
    n: np.dtype(n) for n in ("float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32", "int64", "bool")
}
