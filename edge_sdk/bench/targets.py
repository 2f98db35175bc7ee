"""What a scenario runs: inputs made from the manifest, and *targets* that answer one query.

A :class:`Target` answers ``one(i)`` (query ``i`` of the input pool, batch 1) and ``batch(idx)``
(several pool items in one call, at most ``max_batch``); both return the call's stage times in
milliseconds ``(preprocess, validate, inference, decode)``. The scenario harness times the call
itself (wall clock), so a stage the target cannot see (queueing) is the harness's to add.

- :class:`SdkTarget`: an ``edge_sdk`` model (or anything with its ``predict`` / ``predict_image`` /
  ``prepare_image`` / ``predict_batch`` methods, e.g. a wrapper): stage times from ``Result.timings``.
  A remote model (backend ``"remote"``) reports its round trip as the ``remote`` stage.
- :class:`RawOrtTarget` / :class:`RawLiteRTTarget`: the same verified model bytes in a bare
  ``onnxruntime.InferenceSession`` / LiteRT ``Interpreter`` with the SDK's thread settings, fed
  model-ready tensors (the SDK's preprocessing of the same frames, done before timing).

Inputs (:class:`InputPool`): ``pool`` items from one seed. Image mode: random uint8 RGB frames
at the input's preprocess size (or ``image_hw``), the same frames for every variant. Tensor mode:
per variant and input, random values within the dtype at the smallest shape the spec admits
(batch 1): floats standard normal; 8/16-bit integers over their whole range; 32/64-bit integers
in [0, 128) (indices and token ids would overflow an embedding table otherwise); bools 50/50.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import OptionsError
from ..model import max_batch_of
from ..package import TensorSpec

__all__ = ["InputPool", "RawLiteRTTarget", "RawOrtTarget", "SdkTarget", "Target", "make_tensor", "max_batch_of"]

Stages = tuple[float, float, float, float]  # preprocess, validate, inference (or remote), decode: ms
_NS = 1e-6


def make_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """A random tensor for ``spec`` at its smallest admitted shape (see the module docs)."""
    shape = spec.min_shape()
    dt = np.dtype(spec.dtype)
    if dt.kind == "f":
        return np.ascontiguousarray(rng.standard_normal(shape).astype(dt))
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.itemsize <= 2:
        info = np.iinfo(dt)
        return rng.integers(int(info.min), int(info.max) + 1, size=shape, dtype=np.int64).astype(dt)
    return rng.integers(0, 128, size=shape, dtype=np.int64).astype(dt)


def image_spec_of(specs: Sequence[TensorSpec]) -> TensorSpec | None:
    """The single image input (preprocess declared), when the model has exactly one input."""
    image = [s for s in specs if s.preprocess is not None]
    return image[0] if len(image) == 1 and len(specs) == 1 else None


class InputPool:
    """``size`` queries from ``seed``: frames (image mode) or per-variant tensors (tensor mode)."""

    def __init__(self, mode: str, size: int, seed: int, image_hw: tuple[int, int] | None = None) -> None:
        if mode not in ("image", "tensor"):
            raise OptionsError(f"mode: expected 'image' or 'tensor', got {mode!r}")
        self.mode = mode
        self.size = size
        self.seed = seed
        self.image_hw = image_hw
        self._images: list[np.ndarray] | None = None
        self._tensors: dict[tuple[tuple[str, str, tuple[Any, ...]], ...], list[dict[str, np.ndarray]]] = {}
        self._lock = threading.Lock()

    def images(self, spec: TensorSpec) -> list[np.ndarray]:
        """The frames: HxWx3 uint8 RGB, noise, ``image_hw`` or the spec's preprocess size."""
        with self._lock:
            if self._images is None:
                assert spec.preprocess is not None
                h, w = self.image_hw or spec.preprocess.size_hw
                rng = np.random.default_rng([self.seed, 1])
                self._images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for _ in range(self.size)]
            return self._images

    def tensors(self, specs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        """Model-ready feeds for ``specs``: the frames preprocessed (image mode) or random tensors."""
        key = tuple((s.name, s.dtype, tuple(s.shape)) for s in specs)
        with self._lock:
            if key in self._tensors:
                return self._tensors[key]
        if self.mode == "image":
            from ..processing.image import preprocess_image

            spec = image_spec_of(specs)
            if spec is None:
                raise OptionsError("image mode needs a model with one image input")
            feeds = [{spec.name: preprocess_image(img, spec)[0]} for img in self.images(spec)]
        else:
            rng = np.random.default_rng([self.seed, 2, len(key)])
            feeds = [{s.name: make_tensor(s, rng) for s in specs} for _ in range(self.size)]
        with self._lock:
            return self._tensors.setdefault(key, feeds)


class Target:
    """One thing a scenario measures. ``label`` is unique in a run (``"<variant>"`` for the SDK
    arm, ``"<variant> [raw]"`` for the raw arm); ``stage_names`` name the 4 stage times."""

    label: str
    variant_id: str
    arm: str
    backend: str
    max_batch: int
    stage_names: tuple[str, str, str, str] = ("preprocess", "validate", "inference", "decode")
    input_desc: str = ""

    def one(self, i: int) -> Stages:  # pragma: no cover - interface
        """Run sample ``i`` (modulo the samples held) once; return the 4 stage times in ms (0 for a stage this target
        does not have)."""
        raise NotImplementedError

    def batch(self, idx: Sequence[int]) -> Stages:  # pragma: no cover - interface
        """Run the samples ``idx`` as one batch (concatenated on axis 0); return the 4 stage times in ms for the whole
        batch."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the target holds (its model, session or interpreter)."""
        pass


class SdkTarget(Target):
    """An edge_sdk model. ``mode``: ``"image"`` (``predict_image`` on the pool's frames) or
    ``"tensor"`` (``predict`` on model-ready tensors)."""

    arm = "sdk"

    def __init__(self, model: Any, pool: InputPool, mode: str, label: str | None = None) -> None:
        self.model = model
        self.variant_id = model.variant.id
        self.label = label or self.variant_id
        self.backend = model.session.info.backend
        self.max_batch = max_batch_of(model.inputs)
        self.mode = mode
        if self.backend == "remote":
            self.stage_names = ("preprocess", "validate", "remote", "decode")
        if mode == "image":
            spec = image_spec_of(model.inputs)
            if spec is None:
                raise OptionsError(f"variant {self.variant_id}: image mode needs one image input")
            self._images = pool.images(spec)
            h, w = self._images[0].shape[:2]
            self.input_desc = f"predict_image({h}x{w}x3 uint8 RGB frame)"
        else:
            self._feeds = pool.tensors(model.inputs)
            self.input_desc = "predict(" + ", ".join(f"{k} {v.dtype} {list(v.shape)}" for k, v in self._feeds[0].items()) + ")"
        self._n = pool.size

    def one(self, i: int) -> Stages:
        m = self.model
        r = m.predict_image(self._images[i % self._n]) if self.mode == "image" else m.predict(self._feeds[i % self._n])
        t = r.timings
        return (t.preprocess_ms, t.validate_ms, t.inference_ms, t.decode_ms)

    def batch(self, idx: Sequence[int]) -> Stages:
        m = self.model
        pre = val = 0.0
        if self.mode == "image":
            items = []
            for i in idx:
                p = m.prepare_image(self._images[i % self._n])
                pre += p.preprocess_ns * _NS
                val += p.validate_ns * _NS
                items.append(dict(p.feeds))
        else:
            items = [self._feeds[i % self._n] for i in idx]
        results = m.predict_batch(items)
        # predict_batch splits at the model's bound: sum each call's timings once
        inf = dec = 0.0
        k = 0
        while k < len(results):
            t = results[k].timings
            val += t.validate_ms
            inf += t.inference_ms
            dec += t.decode_ms
            k += max(1, results[k].batch_size)
        return (pre, val, inf, dec)

    def close(self) -> None:
        self.model.close()
        client = getattr(self.model.session, "client", None)  # a remote model's client (the session does not own it)
        if self.arm == "remote" and client is not None:
            client.close()


def _feeds_for_raw(feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return [{k: np.ascontiguousarray(v) for k, v in f.items()} for f in feeds]


_ORT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
ORT_SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def raw_ort_session(data: bytes, sopts: Any) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``data`` built with onnxruntime alone, with the options
    ``backends/ort.py`` derives from ``sopts`` (threads, inter-op 1, sequential, spinning,
    optimisation level, providers filtered to the build with CPU last): mirrored here rather than
    imported, so a raw arm owes nothing to the SDK's session code."""
    from ..backends.ort import _ort  # the runtime's module (only backends import runtimes)

    ort = _ort()
    available = ort.get_available_providers()
    providers = [p for p in dict.fromkeys(sopts.providers) if p in available and p != "CPUExecutionProvider"] + ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = sopts.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    spin = "1" if sopts.allow_spinning else "0"
    for key in ORT_SPIN_KEYS:
        so.add_session_config_entry(key, spin)
    so.log_severity_level = 3
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[sopts.graph_optimization])
    return ort.InferenceSession(data, sess_options=so, providers=providers)


def ort_option_mismatches(
    sdk: Any, raw: Any, attrs: Sequence[str] = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode")
) -> list[str]:
    """Differences between two ``InferenceSession``s' effective options (``attrs``, the spinning
    entries, the providers); empty: the same."""
    a, b = sdk.get_session_options(), raw.get_session_options()
    diff = [f"{attr}: edge_sdk {getattr(a, attr)}, raw {getattr(b, attr)}" for attr in attrs if getattr(a, attr) != getattr(b, attr)]
    for key in ORT_SPIN_KEYS:
        if a.get_session_config_entry(key) != b.get_session_config_entry(key):
            diff.append(f"{key}: edge_sdk {a.get_session_config_entry(key)}, raw {b.get_session_config_entry(key)}")
    if sdk.get_providers() != raw.get_providers():
        diff.append(f"providers: edge_sdk {sdk.get_providers()}, raw {raw.get_providers()}")
    return diff


class RawOrtTarget(Target):
    """``onnxruntime.InferenceSession`` built from ``data`` with the options ``backends/ort.py``
    derives from ``sopts`` (threads, inter-op 1, sequential, spinning, optimisation level,
    providers), mirrored here rather than imported so the arm owes nothing to the SDK."""

    arm = "raw"
    backend = "onnxruntime"

    def __init__(self, variant_id: str, data: bytes, sopts: Any, feeds: Sequence[Mapping[str, np.ndarray]], max_batch: int) -> None:
        from ..backends.ort import _ort

        self.variant_id = variant_id
        self.label = f"{variant_id} [raw]"
        self.max_batch = max_batch
        self.session = raw_ort_session(data, sopts)
        self.runtime_version = _ort().__version__
        self.threads = sopts.threads
        self._feeds = _feeds_for_raw(feeds)
        self._n = len(self._feeds)
        self.input_desc = "InferenceSession.run(" + ", ".join(f"{k} {v.dtype} {list(v.shape)}" for k, v in self._feeds[0].items()) + ")"

    def one(self, i: int) -> Stages:
        t0 = time.perf_counter_ns()
        self.session.run(None, self._feeds[i % self._n])
        return (0.0, 0.0, (time.perf_counter_ns() - t0) * _NS, 0.0)

    def batch(self, idx: Sequence[int]) -> Stages:
        t0 = time.perf_counter_ns()
        rows = [self._feeds[i % self._n] for i in idx]
        feeds = {k: np.concatenate([r[k] for r in rows], axis=0) for k in rows[0]}
        t1 = time.perf_counter_ns()
        self.session.run(None, feeds)
        return (0.0, (t1 - t0) * _NS, (time.perf_counter_ns() - t1) * _NS, 0.0)

    def option_mismatches(self, sdk_session: Any) -> list[str]:
        """Differences between the SDK's ORT session options and this one's (empty: the same)."""
        inner = getattr(sdk_session, "_sess", None)
        if inner is None:
            return ["the SDK session exposes no onnxruntime session to compare"]
        return ort_option_mismatches(inner, self.session)


class RawLiteRTTarget(Target):
    """A LiteRT ``Interpreter`` from ``data`` with ``num_threads`` = the SDK's threads and the
    profile's delegates (none: XNNPACK on the CPU). Inputs are converted to the interpreter's
    dtypes (quantized with the tensor's scale/zero point) before timing; outputs are read raw."""

    arm = "raw"
    backend = "litert"

    def __init__(self, variant_id: str, data: bytes, sopts: Any, feeds: Sequence[Mapping[str, np.ndarray]], max_batch: int) -> None:
        from ..backends.litert import _litert

        mod, runtime, version = _litert()
        self.variant_id = variant_id
        self.label = f"{variant_id} [raw]"
        self.max_batch = max_batch
        delegates = []
        for lib in sopts.delegates:
            try:
                delegates.append(mod.load_delegate(lib))
            except (ValueError, OSError, RuntimeError):
                pass  # the SDK arm reports the same failure and runs on the CPU too
        self._it = mod.Interpreter(model_content=data, num_threads=sopts.threads, experimental_delegates=delegates or None)
        self._it.allocate_tensors()
        self.runtime_version = f"{runtime} {version}"
        self.threads = sopts.threads
        self._in = {d["name"]: d for d in self._it.get_input_details()}
        self._out = [d["index"] for d in self._it.get_output_details()]
        self._shapes = {n: tuple(int(x) for x in d["shape"]) for n, d in self._in.items()}
        self._feeds = [{k: self._convert(k, v) for k, v in f.items()} for f in _feeds_for_raw(feeds)]
        self._n = len(self._feeds)
        self._lock = threading.Lock()
        self.input_desc = "Interpreter.invoke(" + ", ".join(f"{k} {v.dtype} {list(v.shape)}" for k, v in self._feeds[0].items()) + ")"

    def _convert(self, name: str, x: np.ndarray) -> np.ndarray:
        d = self._in[name]
        dt = np.dtype(d["dtype"])
        scale, zp = d.get("quantization", (0.0, 0))
        if dt.kind in "iu" and x.dtype.kind == "f" and scale:
            info = np.iinfo(dt)
            q: np.ndarray = np.clip(np.rint(x / np.float32(scale)) + zp, info.min, info.max).astype(dt)
            return q
        return np.ascontiguousarray(x.astype(dt, copy=False))

    def _run(self, feeds: Mapping[str, np.ndarray]) -> None:
        it = self._it
        resized = False
        for name, x in feeds.items():
            if self._shapes[name] != x.shape:
                it.resize_tensor_input(self._in[name]["index"], list(x.shape), strict=True)
                self._shapes[name] = x.shape
                resized = True
        if resized:
            it.allocate_tensors()
        for name, x in feeds.items():
            it.set_tensor(self._in[name]["index"], x)
        it.invoke()
        for index in self._out:
            it.get_tensor(index)

    def one(self, i: int) -> Stages:
        with self._lock:  # an interpreter is not thread-safe
            t0 = time.perf_counter_ns()
            self._run(self._feeds[i % self._n])
            return (0.0, 0.0, (time.perf_counter_ns() - t0) * _NS, 0.0)

    def batch(self, idx: Sequence[int]) -> Stages:
        with self._lock:
            t0 = time.perf_counter_ns()
            rows = [self._feeds[i % self._n] for i in idx]
            feeds = {k: np.concatenate([r[k] for r in rows], axis=0) for k in rows[0]}
            t1 = time.perf_counter_ns()
            self._run(feeds)
            return (0.0, (t1 - t0) * _NS, (time.perf_counter_ns() - t1) * _NS, 0.0)

    def close(self) -> None:
        with self._lock:
            self._it = None
