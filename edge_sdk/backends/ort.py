"""ONNX Runtime backend.

Providers come from the profile, filtered to what this onnxruntime build has
(in order; CPU is always last). Threads, spinning and the graph optimisation
level come from :class:`SessionOptions`. The optimised graph is written once to
the cache (keyed by model digest, ORT version, providers, level and machine)
with a digest sidecar; the next cold start loads it with optimisation off.
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._deps import ORT_INSTALL, onnxruntime_builds
from ..errors import BackendUnavailableError, SessionClosedError, SessionError
from ..package.archive import read_digest
from .base import BackendStatus, ModelSource, Session, SessionInfo, SessionOptions, TensorInfo

NAME = "onnxruntime"

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(uint16)": "uint16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}
# Execution providers that compile subgraphs into opaque nodes: an optimised
# model cannot be serialised with them, they keep caches of their own.
_COMPILING_EPS = frozenset(
    {"TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider", "OpenVINOExecutionProvider", "QNNExecutionProvider", "CoreMLExecutionProvider", "XnnpackExecutionProvider"}
)


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as e:  # no build installed: the runtime flavour is an extra (docs/install.md)
        raise BackendUnavailableError(f"onnxruntime is not installed ({e}); {ORT_INSTALL}") from e
    return onnxruntime


# The execution provider only one build has -> that build (onnxruntime.ai/docs/execution-providers/).
_PROVIDER_BUILDS = {
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "QNNExecutionProvider": "onnxruntime-qnn",
    "DmlExecutionProvider": "onnxruntime-directml",
}


def status() -> BackendStatus:
    """Whether ONNX Runtime is importable, its version, its available execution providers and which
    build it is (``build``: ``onnxruntime``, ``onnxruntime-gpu``, ...; ``notes``: a warning when two
    builds are installed, since they overwrite each other's files)."""
    builds = onnxruntime_builds()
    try:
        ort = _ort()
    except BackendUnavailableError as e:
        return BackendStatus(NAME, False, "onnxruntime", "", str(e), (), builds.active or "", builds.warnings)
    providers = tuple(ort.get_available_providers())
    build, notes = builds.active, builds.warnings
    if build is None:
        # Undecided from the metadata (or no metadata at all): the imported module says what it was built with.
        build = next((b for p, b in _PROVIDER_BUILDS.items() if p in providers), None)
        if build is None and str(ort.get_device()).upper() == "CPU":
            build = "onnxruntime"
        if build is not None:
            notes += (f"build {build} told from the imported module (get_device() {ort.get_device()!r}, providers {list(providers)})",)
    return BackendStatus(NAME, True, "onnxruntime", ort.__version__, "", providers, build or "unknown", notes)


def choose_providers(wanted: tuple[str, ...], available: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(providers to use in order, notes on the ones skipped). CPU is always kept last."""
    use: list[str] = []
    notes: list[str] = []
    for p in wanted:
        if p in available:
            if p not in use:
                use.append(p)
        else:
            notes.append(f"{p} requested by the profile but not in this onnxruntime build; falling back")
    if "CPUExecutionProvider" in use:
        use.remove("CPUExecutionProvider")
    use.append("CPUExecutionProvider")
    return tuple(use), tuple(notes)


_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


# Deterministic mode, per execution provider: what makes repeated runs and fresh loads agree.
# CUDA: the default search (EXHAUSTIVE) times every cuDNN conv algorithm at the first run and keeps
# the fastest, so two loads can pick different algorithms (different bits); DEFAULT always uses
# IMPLICIT_PRECOMP_GEMM. (use_deterministic_compute, a session option, covers the CUDA kernels
# that have a deterministic variant, e.g. reductions without atomics.)
DETERMINISTIC_PROVIDER_OPTIONS: dict[str, dict[str, str]] = {
    "CUDAExecutionProvider": {"cudnn_conv_algo_search": "DEFAULT"},
}


def _provider_options(p: str, options: SessionOptions) -> dict[str, str]:
    """The provider options this SDK sets for execution provider ``p`` (empty: the EP's defaults)."""
    out: dict[str, str] = {}
    if p == "TensorrtExecutionProvider" and options.cache_dir is not None:
        path = options.cache_dir / "tensorrt"
        path.mkdir(parents=True, exist_ok=True)
        out.update({"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(path)})
    if options.deterministic:
        out.update(DETERMINISTIC_PROVIDER_OPTIONS.get(p, {}))
    return out


def determinism_settings(options: SessionOptions, providers: tuple[str, ...], level: str) -> tuple[str, ...]:
    """What deterministic mode sets on an ONNX Runtime session with ``providers`` (empty when off)."""
    if not options.deterministic:
        return ()
    out = [
        f"intra_op_num_threads={options.threads}",
        "inter_op_num_threads=1, ORT_SEQUENTIAL",
        "use_deterministic_compute=True",
        f"graph_optimization_level={level} (fixed)",
    ]
    for p in providers:
        out += [f"{p} {k}={v}" for k, v in DETERMINISTIC_PROVIDER_OPTIONS.get(p, {}).items()]
    return tuple(out)


def base_session_options(ort: Any, options: SessionOptions) -> Any:
    """An ``onnxruntime.SessionOptions`` with this SDK's settings from ``options``: intra-op threads,
    one inter-op thread, sequential execution, spinning on or off, warnings silenced, and
    ``use_deterministic_compute`` in deterministic mode."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    spin = "1" if options.allow_spinning else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", spin)
    so.log_severity_level = 3
    if options.deterministic:
        so.use_deterministic_compute = True
    return so


def provider_args(providers: tuple[str, ...], options: SessionOptions) -> list[tuple[str, dict[str, str]]]:
    """``providers`` with the options this SDK sets for each (the ``providers=`` of an InferenceSession)."""
    return [(p, _provider_options(p, options)) for p in providers]


def session_info(ort: Any, sess: Any, options: SessionOptions, providers: tuple[str, ...], notes: list[str], cache: str, t0: float) -> SessionInfo:
    """What session ``sess`` (asked for ``providers``) runs on, with a note for each provider ONNX Runtime
    fell back from; ``t0``: ``perf_counter`` when its creation began."""
    used = tuple(sess.get_providers())
    notes = notes + [f"{p} could not be initialised; onnxruntime fell back to {used[0]}" for p in providers if p not in used]
    return SessionInfo(
        backend=NAME,
        runtime="onnxruntime",
        runtime_version=ort.__version__,
        threads=options.threads,
        providers_requested=tuple(options.providers),
        providers_used=used,
        notes=tuple(notes),
        optimized_cache=cache,
        create_ms=(time.perf_counter() - t0) * 1e3,
        determinism=determinism_settings(options, used, options.graph_optimization),
    )


class OrtSession(Session):
    def __init__(self, model: ModelSource, options: SessionOptions) -> None:
        super().__init__()
        ort = _ort()
        t0 = time.perf_counter()
        providers, choice_notes = choose_providers(options.providers, tuple(ort.get_available_providers()))
        notes = list(choice_notes)
        so = base_session_options(ort, options)
        if options.deterministic:
            if "TensorrtExecutionProvider" in providers:
                notes.append("deterministic: TensorRT picks kernels by timing when it builds an engine; results repeat once its engine cache holds the engine")

        level = options.graph_optimization
        cache_file: Path | None = None
        use_cache = options.cache_dir is not None and not model.has_external_data and not (set(providers) & _COMPILING_EPS) and level != "disable"
        source: bytes | str
        if model.has_external_data:
            # ORT resolves external data relative to the model file: load by path
            # (the package has verified every external file's digest).
            source = str(model.path)
        cached_state = "off"
        if use_cache:
            assert options.cache_dir is not None
            key = hashlib.sha256(
                "|".join([model.sha256, ort.__version__, ",".join(providers), level, platform.machine(), _cpu_fingerprint()]).encode()
            ).hexdigest()[:32]
            cdir = options.cache_dir / "ort-optimized"
            cache_file = cdir / f"{key}.onnx"
            side = cdir / f"{key}.sha256"
            cached = _read_cached(cache_file, side)
            if cached is not None:
                source = cached
                level = "disable"  # already optimised at `options.graph_optimization`
                cached_state = f"hit {cache_file}"
            else:
                source = model.data
                cdir.mkdir(parents=True, exist_ok=True)
                so.optimized_model_filepath = _temp_path(cdir, key)
                cached_state = f"written {cache_file}"
        elif not model.has_external_data:
            source = model.data
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])

        prov_arg = provider_args(providers, options)
        try:
            self._sess: Any = ort.InferenceSession(source, sess_options=so, providers=prov_arg)
        except Exception as e:  # onnxruntime raises its own pybind exception types
            if not cached_state.startswith("hit"):
                raise SessionError(f"onnxruntime could not load the model ({model.path.name}): {e}") from e
            # A cached optimised model that verifies but does not load (written by
            # another ORT build, torn by a crash before hashing): drop it, rebuild.
            assert cache_file is not None
            cache_file.unlink(missing_ok=True)
            cache_file.with_suffix(".sha256").unlink(missing_ok=True)
            level = options.graph_optimization
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
            so.optimized_model_filepath = _temp_path(cache_file.parent, cache_file.stem)
            cached_state = f"written {cache_file} (cached entry was unloadable: {str(e)[:80]})"
            try:
                self._sess = ort.InferenceSession(model.data, sess_options=so, providers=prov_arg)
            except Exception as e2:
                raise SessionError(f"onnxruntime could not load the model ({model.path.name}): {e2}") from e2

        if use_cache and cached_state.startswith("written"):
            assert cache_file is not None
            tmp = Path(so.optimized_model_filepath)
            try:
                digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
                os.replace(tmp, cache_file)
                (cache_file.with_suffix(".sha256")).write_text(digest)
            except OSError as e:
                cached_state = f"not written ({e})"
                tmp.unlink(missing_ok=True)

        self._out_names = [o.name for o in self._sess.get_outputs()]
        self._crun = _binding_run(self._sess)
        self.inputs = tuple(_info(i) for i in self._sess.get_inputs())
        self.outputs = tuple(_info(o) for o in self._sess.get_outputs())
        self.info = session_info(ort, self._sess, options, providers, notes, cached_state, t0)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        crun = self._crun
        try:
            if crun is not None:
                outs = crun(self._out_names, feeds, None)
            else:
                sess = self._sess
                if sess is None:
                    self._check_open()
                outs = sess.run(None, feeds)
        except SessionClosedError:
            raise
        except Exception as e:
            raise SessionError(f"onnxruntime run failed: {e}") from e
        return dict(zip(self._out_names, outs))

    def _release(self) -> None:
        # A run() already holding `sess` (or `crun`) finishes; later calls see None -> SessionClosedError.
        self._crun = None
        self._sess = None


def _binding_run(sess: Any) -> Any:
    """The compiled binding's ``run(output_names, feeds, run_options)`` where calling it directly means the same
    as ``InferenceSession.run``, else None. The Python wrapper checks, on every call, WebGPU graph capture, that
    every input is fed, OrtValue ownership, and falls back to other providers on an EP failure
    (``InferenceSession.run`` in onnxruntime/python/onnxruntime_inference_collection.py); about 2.5 us a call on a
    trivial model (Zen 3). None of it applies to a CPU-only session fed numpy arrays the SDK's validator has
    checked by name; a missing or mistyped feed is still refused by the binding (SessionError)."""
    c = getattr(sess, "_sess", None)
    if c is None or not callable(getattr(c, "run", None)):
        return None
    try:
        if list(sess.get_providers()) != ["CPUExecutionProvider"]:
            return None
        capture = getattr(c, "is_webgpu_graph_capture_enabled", None)
        if capture is not None and capture():
            return None
    except Exception:  # an ORT build whose binding differs: keep the public path
        return None
    return c.run


def _info(x: Any) -> TensorInfo:
    dtype = _ORT_TYPES.get(x.type, x.type)
    shape = tuple(d if isinstance(d, int) else (d if isinstance(d, str) else None) for d in x.shape)
    return TensorInfo(name=x.name, dtype=dtype, shape=shape, raw_dtype=dtype)


def _temp_path(cdir: Path, key: str) -> str:
    """A fresh, unique temp file name (threads and processes may build the same key)."""
    fd, name = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp.onnx", dir=cdir)
    os.close(fd)
    return name


_CPU_FP: str | None = None


def _cpu_fingerprint() -> str:
    """A digest of the CPU's feature flags: an ENABLE_ALL graph may use kernels
    (AVX-512, VNNI, dotprod) that another CPU of the same arch lacks."""
    global _CPU_FP
    if _CPU_FP is None:
        flags = ""
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):
                        flags = line.split(":", 1)[-1].strip()
                        break
        except OSError:
            pass
        _CPU_FP = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return _CPU_FP


def _read_cached(path: Path, side: Path) -> bytes | None:
    """The cached optimised model if present and intact, else None. Its digest comes from
    :data:`~edge_sdk.package.archive.DIGESTS` when the file is unchanged since it was last hashed."""
    try:
        want = side.read_text().strip()
        with open(path, "rb") as f:
            data, got = read_digest(f, os.fstat(f.fileno()).st_size)
    except OSError:
        return None
    if got != want:
        return None
    return data


def open_session(model: ModelSource, options: SessionOptions) -> Session:
    """Open an ONNX Runtime session on ``model`` with ``options``."""
    return OrtSession(model, options)
