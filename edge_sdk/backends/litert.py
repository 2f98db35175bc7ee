"""LiteRT (TFLite) backend.

Prefers ``ai_edge_litert``; accepts ``tflite_runtime`` where that is what the
platform has (note: tflite-runtime 2.14, its last release, cannot create an
interpreter under numpy 2). Delegates named by the profile are loaded in order
with ``load_delegate``; one that fails is reported and the interpreter runs on
the CPU (XNNPACK) instead.

Quantized inputs/outputs are converted with their scale and zero point, so
callers pass and receive real values, unless ``raw_io`` is set.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping

import numpy as np

from ..errors import BackendUnavailableError, SessionError
from .base import BackendStatus, ModelSource, Session, SessionInfo, SessionOptions, TensorInfo

NAME = "litert"
_INSTALL = "pip install 'edge-sdk[litert]' (ai-edge-litert), or tflite-runtime where only that exists"

_interp_mod: tuple[Any, str, str] | None = None


def _litert() -> tuple[Any, str, str]:
    """(interpreter module, runtime name, version), imported once."""
    global _interp_mod
    if _interp_mod is not None:
        return _interp_mod
    errors = []
    for modname, runtime in (("ai_edge_litert.interpreter", "ai-edge-litert"), ("tflite_runtime.interpreter", "tflite-runtime")):
        try:
            import importlib

            mod = importlib.import_module(modname)
        except ImportError as e:
            errors.append(f"{modname}: {e}")
            continue
        version = _version(modname.split(".")[0], runtime)
        _interp_mod = (mod, runtime, version)
        return _interp_mod
    raise BackendUnavailableError(f"no LiteRT runtime is installed ({'; '.join(errors)}); {_INSTALL}")


def _version(package: str, dist: str) -> str:
    # The package's own __version__ first: importlib.metadata costs ~30 ms of import time.
    import sys

    v = getattr(sys.modules.get(package), "__version__", None)
    if isinstance(v, str) and v:
        return v
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "unknown"


def status() -> BackendStatus:
    """Whether a LiteRT runtime (``ai-edge-litert`` or ``tflite-runtime``) is importable, and which."""
    try:
        _, runtime, version = _litert()
    except BackendUnavailableError as e:
        return BackendStatus(NAME, False, "", "", str(e))
    # ai_edge_litert and tflite_runtime are different modules: both can be installed without clashing; the first wins.
    return BackendStatus(NAME, True, runtime, version, build=runtime)


def _quant(detail: Mapping[str, Any]) -> tuple[float, int] | None:
    scale, zp = detail.get("quantization", (0.0, 0))
    if detail["dtype"] in (np.int8, np.uint8, np.int16) and scale:
        return float(scale), int(zp)
    return None


def _tinfo(detail: Mapping[str, Any], raw_io: bool) -> TensorInfo:
    raw = np.dtype(detail["dtype"]).name
    q = _quant(detail)
    sig = detail.get("shape_signature")
    shape_src = sig if sig is not None and len(sig) else detail["shape"]
    shape = tuple(None if int(d) < 0 else int(d) for d in shape_src)
    dtype = raw if (q is None or raw_io) else "float32"
    return TensorInfo(name=detail["name"], dtype=dtype, shape=shape, raw_dtype=raw, quant=q)


class LiteRTSession(Session):
    def __init__(self, model: ModelSource, options: SessionOptions) -> None:
        super().__init__()
        mod, runtime, version = _litert()
        t0 = time.perf_counter()
        delegates = []
        used: list[str] = []
        notes: list[str] = []
        for lib in options.delegates:
            try:
                delegates.append(mod.load_delegate(lib))
                used.append(lib)
            except (ValueError, OSError, RuntimeError) as e:
                notes.append(f"delegate {lib} could not be loaded ({e}); running on the CPU")
        try:
            self._it = mod.Interpreter(
                model_content=model.data,
                num_threads=options.threads,
                experimental_delegates=delegates or None,
            )
            self._it.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            raise SessionError(f"LiteRT could not load the model ({model.path.name}): {e}") from e
        self._raw = options.raw_io
        self._lock = threading.Lock()
        self._in = self._it.get_input_details()
        self._out = self._it.get_output_details()
        self._in_by_name = {d["name"]: d for d in self._in}
        self._shapes = {d["name"]: tuple(int(x) for x in d["shape"]) for d in self._in}
        self.inputs = tuple(_tinfo(d, self._raw) for d in self._in)
        self.outputs = tuple(_tinfo(d, self._raw) for d in self._out)
        self._in_q = {d["name"]: (None if self._raw else _quant(d)) for d in self._in}
        self._out_q = [(d["index"], d["name"], None if self._raw else _quant(d), np.dtype(d["dtype"])) for d in self._out]
        determinism: tuple[str, ...] = ()
        if options.deterministic:
            # The default op resolver (XNNPACK for float ops) is kept on purpose: measured
            # batch-invariant, unlike the builtin optimised kernels without it (docs/reproducibility.md).
            determinism = (f"num_threads={options.threads}", "op resolver: builtin + XNNPACK default delegate")
            notes += [f"deterministic: delegate {d} is not covered (its own kernels decide)" for d in used]
        self.info = SessionInfo(
            backend=NAME,
            runtime=runtime,
            runtime_version=version,
            threads=options.threads,
            delegates_used=tuple(used) or ("cpu (xnnpack)",),
            notes=tuple(notes),
            create_ms=(time.perf_counter() - t0) * 1e3,
            determinism=determinism,
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # An interpreter is not thread-safe: one call at a time per session.
        with self._lock:
            if self._closed:
                self._check_open()
            try:
                resized = False
                for name, x in feeds.items():
                    if self._shapes[name] != x.shape:
                        self._it.resize_tensor_input(self._in_by_name[name]["index"], list(x.shape), strict=True)
                        self._shapes[name] = x.shape
                        resized = True
                if resized:
                    self._it.allocate_tensors()
                for name, x in feeds.items():
                    d = self._in_by_name[name]
                    q = self._in_q[name]
                    if q is not None:
                        x = _quantize(x, q, np.dtype(d["dtype"]))
                    self._it.set_tensor(d["index"], x)
                self._it.invoke()
                out = {}
                for index, name, q, _dt in self._out_q:
                    y = self._it.get_tensor(index)
                    if q is not None:
                        y = (y.astype(np.float32) - np.float32(q[1])) * np.float32(q[0])
                    out[name] = y
                return out
            except (ValueError, RuntimeError) as e:
                raise SessionError(f"LiteRT run failed: {e}") from e

    def _release(self) -> None:
        with self._lock:
            del self._it


def _quantize(x: np.ndarray, q: tuple[float, int], dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    v = np.rint(x / np.float32(q[0])) + q[1]
    out: np.ndarray = np.clip(v, info.min, info.max).astype(dtype)
    return out


def open_session(model: ModelSource, options: SessionOptions) -> Session:
    """Open a LiteRT interpreter session on ``model`` with ``options``."""
    return LiteRTSession(model, options)
