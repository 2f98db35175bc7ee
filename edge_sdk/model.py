"""Model: validate -> preprocess -> run -> decode, with typed results.

Two ways in::

    model = edge_sdk.load("shapes-classifier/")                 # one-liner
    model = edge_sdk.load(pkg, LoadOptions(variant="int8-onnx")) # full form

``load`` opens and verifies the package, resolves the device profile, selects
a variant (``model.selection.explain()`` says why), opens a session through
the backend seam, and checks the manifest against the model's own signature
before returning. ``predict`` is thread-safe; ``close()`` is idempotent.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence, TypeGuard, Union

import numpy as np

from ._record import frozen
from .backends import sandbox as _sandbox
from .backends.base import ModelSource, Session, SessionOptions, all_backend_status, open_session
from .errors import (
    ImageError,
    InputError,
    ManifestError,
    OptionsError,
    ResultCacheError,
    SelectionError,
    SessionClosedError,
    SignatureMismatchError,
)
from .package import ModelPackage, TensorSpec, Variant, default_cache_dir
from .processing.decoders import Classification, decode_classification
from .profiles import BoardMatch, DeviceProfile, resolve_profile, usable_cpus
from .result_cache import ResultCache, key_prefix
from .selection import Selection, describe_machine, lighter_variants, select_variant
from .telemetry.core import ModelTelemetry, Provenance, Sample, model_key, model_telemetry
from .validation import SCANNER, InputValidator, first_nonfinite

if TYPE_CHECKING:  # pragma: no cover - the decoders load when a model of their kind does
    from .generation.decoder import DecoderModel  # imported by _load_decoder: 50-70 ms a vision model's load does not need
    from .processing.detection import Detections
    from .processing.segmentation import SegmentationMask

_NS = 1e-6  # ns -> ms
_new = tuple.__new__

#: What :attr:`Result.decoded` holds, by the manifest's ``[decoder] kind``: "classification" ->
#: one tuple of :class:`~edge_sdk.processing.decoders.Classification` per batch row, best first;
#: "detection" -> :class:`~edge_sdk.processing.detection.Detections`; "segmentation" ->
#: :class:`~edge_sdk.processing.segmentation.SegmentationMask`; "raw" (and embeddings, audio) -> None.
Decoded = Union["tuple[tuple[Classification, ...], ...]", "Detections", "SegmentationMask", None]


@frozen
class LoadOptions:
    """Everything ``load`` can be told. ``None`` means "from the profile".

    variant: force this variant id. threads / allow_spinning / graph_optimization /
    providers / delegates: override the profile's runtime settings.
    measure_backends: when the choice is not proven by a measurement (the best precision exists for
    two backends, or a lighter precision wins by the profile's rank with no benchmark recorded on
    this CPU class), time the candidates here (bounded: ``measure_runs`` calls or
    ``measure_budget_s`` each) and keep the fastest, the more precise within the noise margin
    (:mod:`edge_sdk.selection`); the result is cached per device and package. False: the profile's
    rank decides.
    min_cosine: refuse variants whose measured cosine to the reference is lower.
    raw_io: pass/get quantized tensors as stored. check_finite: scan float inputs
    for NaN/Inf (one memory-bound pass over the input; like scipy's
    ``check_finite``, turn it off only for inputs you produce yourself). Where the
    session's threads leave a CPU free, ``predict`` scans inputs of 64K elements and
    more on it while the model runs (:class:`~edge_sdk.validation.FiniteScanner`),
    with the same verdict and error, before anything of the call is returned.
    root: where /proc and /sys are read from for detection (tests use fake trees).
    telemetry: record every call's stage latencies, requests and errors in the
    process-wide :mod:`edge_sdk.telemetry` table (a few hundred ns a call);
    False records nothing (results still carry their provenance).
    sandbox: before the runtime sees a model's bytes in this process, load them once
    in a child process under memory and time limits (:mod:`edge_sdk.backends.sandbox`), so a
    model that crashes, hangs or exhausts memory raises a SandboxError instead of
    taking this process down. A pass is remembered per model digest and runtime
    version (one child per model per device, ~0.3 s). None (default): on, except for
    packages installed in a model store (verified and health-checked at install).
    deterministic: repeatable results (docs/reproducibility.md): threads fixed (``threads``, else 1,
    never the machine's CPU count), no timing-based backend choice, and each backend's own settings
    (ONNX Runtime ``use_deterministic_compute``, CUDA ``cudnn_conv_algo_search=DEFAULT``; LiteRT
    ``num_threads``); ``describe()["determinism"]`` lists them.
    result_cache: keep the outputs of the last N distinct inputs (an LRU, :mod:`edge_sdk.result_cache`);
    0 (default): off. Refused (ResultCacheError) for stateful (streaming) models.
    context: text-generation packages: KV tokens to allocate (prompt + generated). None (default):
    what the profile's memory budget leaves after the weights, capped at the model's context length
    and at :data:`edge_sdk.generation.decoder.DEFAULT_MAX_CONTEXT`; more than the budget allows is a
    ContextBudgetError.
    """

    variant: str | None = None
    threads: int | None = None
    allow_spinning: bool | None = None
    graph_optimization: str | None = None
    providers: tuple[str, ...] | None = None
    delegates: tuple[str, ...] | None = None
    cache_dir: Path | None = None
    raw_io: bool = False
    measure_backends: bool = True
    measure_runs: int = 30
    measure_budget_s: float = 1.0
    min_cosine: float | None = None
    check_finite: bool = True
    root: str = "/"
    telemetry: bool = True
    sandbox: bool | None = None
    deterministic: bool = False
    result_cache: int = 0
    context: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.deterministic, bool):
            raise OptionsError(f"deterministic: expected True or False, got {self.deterministic!r}")
        if isinstance(self.result_cache, bool) or not isinstance(self.result_cache, int) or self.result_cache < 0:
            raise OptionsError(f"result_cache: expected an int >= 0 (entries; 0 = off), got {self.result_cache!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise OptionsError(f"threads: expected an int >= 1, got {self.threads!r}")
        if self.measure_runs < 1 or self.measure_budget_s <= 0:
            raise OptionsError(f"measure_runs / measure_budget_s: expected >= 1 / > 0, got {self.measure_runs} / {self.measure_budget_s}")
        if self.min_cosine is not None and not -1.0 <= self.min_cosine <= 1.0:
            raise OptionsError(f"min_cosine: expected a value in [-1, 1], got {self.min_cosine}")

    def session_options(self, profile: DeviceProfile, cache_dir: Path, cpu_count: int | None = None) -> SessionOptions:
        """The profile's runtime settings with these overrides applied. The
        profile's thread count is capped at ``cpu_count``, the CPUs this process may use
        (:attr:`~edge_sdk.profiles.HardwareFacts.usable_cpus`: the affinity mask, then the
        cgroup quota), so neither a generic profile on a 2-core box nor a process under
        ``taskset`` or in a CPU-limited container oversubscribes; an explicit ``threads``
        is taken as given."""
        rt = profile.runtime
        threads = self.threads if self.threads is not None else min(rt.threads, cpu_count or rt.threads)
        if self.deterministic and self.threads is None:
            threads = 1  # not the profile's count capped by this machine's CPUs: the same everywhere
        return SessionOptions(
            threads=threads,
            allow_spinning=self.allow_spinning if self.allow_spinning is not None else rt.allow_spinning,
            graph_optimization=self.graph_optimization or rt.graph_optimization,
            providers=tuple(self.providers) if self.providers is not None else tuple(rt.onnxruntime_providers),
            delegates=tuple(self.delegates) if self.delegates is not None else tuple(rt.litert_delegates),
            cache_dir=cache_dir,
            raw_io=self.raw_io,
            deterministic=self.deterministic,
        )


class Timings(NamedTuple):
    """Milliseconds per stage of one call (``total_ms`` is wall time of the call).

    Immutable (a NamedTuple: built in well under a microsecond on the hot path)."""

    validate_ms: float
    preprocess_ms: float
    inference_ms: float
    decode_ms: float
    total_ms: float


class Result(NamedTuple):
    """What one call returns (immutable; a NamedTuple for a cheap hot path).

    ``outputs``: raw output arrays by name. ``decoded``: for classification, a
    tuple per batch row of :class:`Classification` (best first); for detection,
    :class:`~edge_sdk.processing.detection.Detections` (boxes in source-image
    pixels when the call preprocessed an image, else in model-input pixels); for
    segmentation a :class:`~edge_sdk.processing.segmentation.SegmentationMask`;
    else None.
    ``batch_size``: rows run in the call that produced this result
    (``predict_batch`` runs several items at once; timings are the whole call's).
    ``provenance``: the model's :class:`~edge_sdk.telemetry.Provenance` (model, version,
    sha256, variant, backend, runtime and its version, profile, SDK version): one immutable
    object per loaded model, shared by all its results (None only for a Result built by hand).
    """

    outputs: Mapping[str, np.ndarray]
    decoded: Decoded
    timings: Timings
    variant_id: str
    backend: str
    model_name: str
    model_version: str
    model_sha256: str
    batch_size: int = 1
    transform: Any = None
    provenance: Provenance | None = None
    cached: bool = False

    @property
    def top1(self) -> Classification:
        """Best class of the first row (classification models only)."""
        if not self.decoded or not isinstance(self.decoded, tuple):
            raise ValueError("this result has no classification (decoder is not 'classification')")
        return self.decoded[0][0]

    def to_dict(self, *, with_outputs: bool = False) -> dict[str, Any]:
        """A JSON-able dict: model, version, variant, backend, sha256, per-stage timings, provenance, and the decoded
        classes/detections/mask; raw outputs too if ``with_outputs`` or nothing was decoded."""
        d: dict[str, Any] = {
            "model": self.model_name,
            "version": self.model_version,
            "variant": self.variant_id,
            "backend": self.backend,
            "sha256": self.model_sha256,
            "timings_ms": self.timings._asdict(),
        }
        if self.provenance is not None:
            d["provenance"] = self.provenance.to_dict()
        if self.cached:
            d["cached"] = True
        if isinstance(self.decoded, tuple):
            d["classes"] = [[{"index": c.index, "label": c.label, "score": c.score} for c in row] for row in self.decoded]
        elif self.decoded is not None and hasattr(self.decoded, "to_dict"):
            d.update(self.decoded.to_dict())
        if with_outputs or self.decoded is None:
            d["outputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "data": v.tolist()} for k, v in self.outputs.items()}
        return d

    def draw(self, image: np.ndarray, **options: Any) -> np.ndarray:
        """A new BGR uint8 image: ``image`` (HxWx3 uint8, BGR unless ``color="RGB"``; not modified)
        with this result drawn on it: boxes, labels, scores and keypoints, the segmentation mask,
        or the top classes. ``options``: those of :func:`edge_sdk.processing.draw.draw` (``labels``,
        ``scores``, ``masks``, ``keypoints``, ``conf``, ``color``, ``mask_alpha``, ``line_width``)."""
        from .processing.draw import draw

        return draw(image, self, **options)

    def plot(self, image: np.ndarray | str | Path | None = None, **options: Any) -> np.ndarray:
        """The annotated image, like :meth:`draw`, from ``image``: an array, an image file (read
        with the bounded loader, BGR), or None for a black canvas of the source image's size (the
        result's ``transform.source_hw``; a result without one, from ``predict`` on tensors, needs
        an image: ImageError). Returns a new BGR uint8 array."""
        from .processing.draw import draw

        if image is None:
            hw = getattr(self.transform, "source_hw", None)
            if hw is None:
                raise ImageError("Result.plot: this result has no source size (it was not made from an image); pass image=")
            image = np.zeros((int(hw[0]), int(hw[1]), 3), np.uint8)
        elif isinstance(image, (str, Path)):
            from .processing.image import load_image_bgr

            image = load_image_bgr(image)
            options = {**options, "color": "BGR"}
        return draw(image, self, **options)


class PreparedImage(NamedTuple):
    """An image preprocessed and validated for one model (:meth:`Model.prepare_image`),
    ready for :meth:`Model.predict_prepared`. ``feeds``: input name -> tensor (validated:
    do not modify the arrays). ``transform``: model pixels -> source pixels.
    ``preprocess_ns`` / ``validate_ns``: what the preparation took."""

    model: "Model"
    feeds: Mapping[str, np.ndarray]
    transform: Any
    preprocess_ns: int
    validate_ns: int


class InferredImage(NamedTuple):
    """A prepared image the model has run on, not decoded yet (:meth:`Model.run_prepared`), for
    :meth:`Model.decode_inferred`: the pipeline decodes on its output thread, so the worker is free
    for the next frame's inference. ``outputs``: output name -> array; the rest is bookkeeping for
    the result's timings (nanosecond counters of ``time.perf_counter_ns``)."""

    model: "Model"
    outputs: Mapping[str, np.ndarray]
    feeds: Mapping[str, np.ndarray]
    transform: Any
    t0: int
    t_ready: int
    t_ran: int
    preprocess_ns: int
    hit: bool


def max_batch_of(specs: Sequence[TensorSpec]) -> int:
    """Rows one call may carry: the upper bound of a dynamic axis 0 shared by every input, else 1."""
    hi: int | None = None
    for s in specs:
        d = s.shape[0] if s.shape else 1
        if isinstance(d, int):
            return 1
        b = s.bounds(d)
        hi = b[1] if b else 1
    return hi or 1


class Model:
    """A loaded model. Use :func:`load`."""

    def __init__(
        self,
        package: ModelPackage,
        variant: Variant,
        session: Session,
        selection: Selection,
        detection: BoardMatch,
        options: LoadOptions,
    ) -> None:
        try:
            _check_result_cache(package.manifest, options)
        except ResultCacheError:
            session.close()
            raise
        self.package = package
        self.manifest = package.manifest
        self.variant = variant
        self.selection = selection
        self.detection = detection
        self.options = options
        self._session = session
        self._inputs = self.manifest.inputs_for(variant)
        self._outputs = self.manifest.outputs_for(variant)
        self._validate = InputValidator(self._inputs)
        self._state_inputs = frozenset(s.input for s in self.manifest.state)
        dec = self.manifest.decoder
        self._cls_output = (dec.output or self._outputs[0].name) if dec.kind == "classification" else None
        self._decode_other = _build_decoder(self.manifest, self._inputs, self._outputs)
        self._decodes = self._cls_output is not None or self._decode_other is not None
        self._labels = self.manifest.labels
        self._meta = (variant.id, session.info.backend, self.manifest.name, self.manifest.version, variant.sha256)
        info = session.info
        self.provenance = Provenance(
            self.manifest.name, self.manifest.version, variant.sha256, variant.id, info.backend, info.runtime, info.runtime_version,
            detection.profile.name,
        )  # fmt: skip
        self._image_spec = next((s for s in self._inputs if s.preprocess is not None), None)
        self._finite = options.check_finite
        self._close_lock = threading.Lock()
        self._closed = False
        self._by_threads: dict[int, Model] = {}  # for_threads: this model with other thread counts, closed with it
        # Shared by every Model with this provenance; None when loaded with telemetry=False.
        self._tm: ModelTelemetry | None = model_telemetry(self.provenance) if options.telemetry else None
        if self._tm is not None:
            self._tm.opened()
        self._monitor: Any = None  # edge_sdk.quality.QualityMonitor (attach_monitor); None: nothing observed
        self._reference_stats: Any = False  # loaded on first use (False: not yet)
        self._cache: ResultCache | None = None
        if options.result_cache:
            prefix = key_prefix(variant.sha256, variant.id, self._inputs, options.raw_io)
            self._cache = ResultCache(options.result_cache, prefix, self._tm.result_cache_lookup if self._tm is not None else None)
            if self._tm is not None:
                self._tm.result_cache_enabled()
        # Scan large float inputs for NaN/Inf on a spare core while the model runs (FiniteScanner):
        # only when the session's threads leave one of the CPUs this process may use free.
        spare = usable_cpus() - (info.threads or 1 << 30)  # this host's CPUs (detection may have read a fake tree)
        self._overlap = self._finite and self._cache is None and spare > 0 and self._validate.may_defer

    # -- lifecycle ---------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The runtime session of the chosen variant."""
        return self._session

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The chosen variant's input specs (what :meth:`predict` validates against)."""
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The chosen variant's output specs."""
        return self._outputs

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    @property
    def telemetry(self) -> ModelTelemetry | None:
        """This model's latency histograms and counters (see :mod:`edge_sdk.telemetry`),
        shared with every Model of the same provenance; None when loaded with telemetry=False."""
        return self._tm

    def close(self) -> None:
        """Release the session (and those of the models :meth:`for_threads` made). Safe to call
        more than once. The telemetry series stay."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            others, self._by_threads = list(self._by_threads.values()), {}
            if self._tm is not None:
                self._tm.closed()
            self._session.close()
        for m in others:
            m.close()

    def for_threads(self, threads: int) -> "Model":
        """This model with ``threads`` inference threads: itself when its session has that many,
        else a Model of the same package, variant, profile and other load options with
        ``threads=threads``, made on the first call and returned again by later ones (every
        caller shares it), and closed by this model's :meth:`close`. Both stay loaded: the
        package's files are verified once (the digest cache), the weights are held twice.
        VisionPipeline's ``model_threads="auto"`` asks for one CPU fewer than a model that
        would take them all, leaving the capture thread a core (docs/pipelines.md)."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise OptionsError(f"threads: expected an int >= 1, got {threads!r}")
        if self._session.info.threads == threads:
            return self
        with self._close_lock:
            if self._closed:
                raise SessionClosedError(f"{self!r} is closed; for_threads needs an open model")
            m = self._by_threads.get(threads)
            if m is None:
                m = load_model(self.package, self.detection.profile, replace(self.options, variant=self.variant.id, threads=threads))
                self._by_threads[threads] = m
            return m

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Model({self.manifest.name!r} {self.manifest.version}, variant={self.variant.id!r}, backend={self._session.info.backend!r})"

    # -- for the governor (edge_sdk.budget.actions.SwappableModel) -------------------------

    def lighter_variant_ids(self) -> list[str]:
        """Variants of this package lighter than the loaded one that this device could run
        (:func:`edge_sdk.selection.lighter_variants` with this model's profile, memory budget and
        quality gate), the mildest step first; the governor's LighterVariant step asks this."""
        det = self.detection
        return lighter_variants(
            self.manifest,
            self.variant.id,
            det.profile,
            memory_budget_mb=det.memory_budget_mb,
            min_cosine=self.options.min_cosine,
            machine=describe_machine(det.facts),
        )

    def with_variant(self, variant_id: str) -> "Model":
        """A new Model: this package's ``variant_id`` on this model's profile, with its other load options (this one stays open)."""
        return load_model(self.package, self.detection.profile, replace(self.options, variant=variant_id))

    # -- telemetry: edge_sdk.telemetry Registry.track / EventLog.watch ------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "model", keyed by provenance (``name`` is not used)."""
        return "model", model_key(self.provenance)

    def telemetry_samples(self, label: str | None = None) -> list[Sample]:
        """``Registry.track``: this model's series (none when loaded with telemetry=False)."""
        return [] if self._tm is None else self._tm.samples()

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Any = None) -> Callable[[], None]:
        """``EventLog.watch``: this model's errors. ValueError when loaded with telemetry=False."""
        if self._tm is None:
            raise ValueError("watch: this model was loaded with telemetry=False, so it reports no events")
        return self._tm.watch_events(emit)

    # -- inference -----------------------------------------------------------------

    def predict(self, inputs: np.ndarray | Mapping[str, np.ndarray], *, top_k: int | None = None) -> Result:
        """Run on model-ready tensors: one array (single-input model) or a dict
        name -> array. Validation is strict (dtype, rank, dims within bounds,
        finite floats, C-contiguous); nothing is cast. Raises InputError
        subclasses, SessionClosedError, SessionError."""
        t0 = time.perf_counter_ns()
        try:
            if not self._overlap:
                feeds = self._validate(inputs, finite=self._finite)
                t1 = time.perf_counter_ns()
                return self._finish(feeds, t0, t1, top_k, None)
            deferred: list[tuple[str, np.ndarray]] = []
            feeds = self._validate(inputs, deferred=deferred)
            scan = None
            if deferred:
                scan = SCANNER.submit(deferred)
                if scan is None:  # the scanning thread is busy with another call's input: scan here
                    err = first_nonfinite(deferred)
                    if err is not None:
                        raise err
            t1 = time.perf_counter_ns()
            return self._finish(feeds, t0, t1, top_k, None, scan=scan)
        except Exception as e:
            self._failed(e, "predict")
            raise

    def _predict_made(self, feeds: dict[str, np.ndarray], batch: int = 1) -> Result:
        """:meth:`predict` on feeds the SDK assembled to this model's specs from inputs it already
        checked, not validated again (``validate_ms`` 0): a signal stream's windows (cut to the window
        shape and dtype validated when the stream was bound, of samples refused on NaN/Inf at the push;
        stacked at most the batch bound checked then), constants validated when bound, states the
        model itself produced. ``feeds`` is the caller's new dict, handed on as it is; ``batch``: the
        windows stacked in it (the Result's ``batch_size``)."""
        t0 = time.perf_counter_ns()
        try:
            return self._finish(feeds, t0, t0, None, None, batch=batch)
        except Exception as e:
            self._failed(e, "stream")
            raise

    def _failed(self, exc: BaseException, call: str) -> None:
        """Count a failed call (by exception type) and report it to event listeners."""
        if self._tm is not None:
            self._tm.error(exc, call)
        mon = self._monitor
        if mon is not None and isinstance(exc, InputError):
            mon.schema_violation(exc)

    def predict_image(self, image: np.ndarray | str | Path, *, color: str = "RGB", top_k: int | None = None) -> Result:
        """Run on an image (HxWx3 uint8 array in ``color`` order, or a file path),
        preprocessed as the manifest declares (resize, colour, mean/std, layout, dtype).
        The same as ``predict_prepared(prepare_image(image, color=color))``."""
        return self.predict_prepared(self.prepare_image(image, color=color), top_k=top_k)

    def prepare_image(self, image: np.ndarray | str | Path, *, color: str = "RGB") -> PreparedImage:
        """The first half of :meth:`predict_image`: preprocess and validate ``image``
        without running the model. Pipelines call it on another thread than
        :meth:`predict_prepared`, so preprocessing of one frame overlaps inference of
        the one before. Raises ImageError / InputError like predict_image."""
        from .processing.image import load_image_bgr, preprocess_image

        try:
            if self._image_spec is None:
                raise ImageError(f"model {self.manifest.name} declares no image input; use predict() with tensors")
            if len(self._inputs) - len(self._state_inputs) != 1:
                raise ImageError("predict_image supports models with one (non-state) input")
            t0 = time.perf_counter_ns()
            if isinstance(image, (str, Path)):
                image = load_image_bgr(image)  # no full-frame channel swap: preprocessing swaps the small image
                color = "BGR"
            x, tf = preprocess_image(image, self._image_spec, color=color)
            t1 = time.perf_counter_ns()
            # Made from uint8 pixels and finite constants: finite in float32/64; the scan
            # (a full pass over the input) is kept for float16, where a tiny std could overflow.
            feeds = self._validate({self._image_spec.name: x}, finite=self._finite and self._image_spec.dtype == "float16")
            t2 = time.perf_counter_ns()
        except Exception as e:
            self._failed(e, "prepare_image")
            raise
        return PreparedImage(self, feeds, tf, t1 - t0, t2 - t1)

    def predict_prepared(self, prepared: PreparedImage, *, top_k: int | None = None) -> Result:
        """The second half of :meth:`predict_image`: run the model on what
        :meth:`prepare_image` made (for this model) and decode. The result's timings
        count the preparation too (``total_ms`` = preprocess + validate + inference +
        decode; time spent waiting between the halves is not counted)."""
        try:
            self._check_prepared(prepared, "predict_prepared")
            t_ready = time.perf_counter_ns()
            return self._finish(
                dict(prepared.feeds),
                t_ready - prepared.preprocess_ns - prepared.validate_ns,
                t_ready,
                top_k,
                prepared.transform,
                pre_ns=prepared.preprocess_ns,
            )
        except Exception as e:
            self._failed(e, "predict_prepared")
            raise

    def _check_prepared(self, prepared: Any, where: str) -> None:
        if not isinstance(prepared, PreparedImage):
            raise InputError(f"{where}: expected a PreparedImage from prepare_image(), got {type(prepared).__name__}")
        if prepared.model is not self:
            raise InputError(f"{where}: this PreparedImage was made by another model ({prepared.model!r}), not {self!r}")

    def run_prepared(self, prepared: PreparedImage) -> InferredImage:
        """:meth:`predict_prepared` up to the model's outputs, without decoding them: what
        :meth:`decode_inferred` turns into the Result (the two make ``predict_prepared``). A
        pipeline runs this on its inference worker and the decode on another thread. Raises
        InputError for a PreparedImage not made by this model, and what the runtime raises."""
        try:
            self._check_prepared(prepared, "run_prepared")
            t_ready = time.perf_counter_ns()
            feeds = dict(prepared.feeds)
            outs, hit = self._run_feeds(feeds, None)
            return _new(
                InferredImage,
                (self, outs, feeds, prepared.transform, t_ready - prepared.preprocess_ns - prepared.validate_ns, t_ready,
                 time.perf_counter_ns(), prepared.preprocess_ns, hit),
            )
        except Exception as e:
            self._failed(e, "run_prepared")
            raise

    def decode_inferred(self, inferred: InferredImage, *, top_k: int | None = None) -> Result:
        """The Result of what :meth:`run_prepared` ran: decoded (as ``predict_prepared`` decodes),
        timed (``total_ms`` = preprocess + validate + inference + decode; the wait between the
        calls is not counted), recorded in telemetry and the quality monitor. Raises InputError for
        an InferredImage of another model, and what the decoder raises."""
        try:
            if not isinstance(inferred, InferredImage):
                raise InputError(f"decode_inferred: expected an InferredImage from run_prepared(), got {type(inferred).__name__}")
            if inferred.model is not self:
                raise InputError(f"decode_inferred: this InferredImage was run by another model ({inferred.model!r}), not {self!r}")
            i = inferred
            t_dec = time.perf_counter_ns()
            return self._complete(dict(i.feeds), dict(i.outputs), i.hit, i.t0, i.t_ready, i.t_ran, top_k, i.transform, i.preprocess_ns, 1, t_dec)
        except Exception as e:
            self._failed(e, "decode_inferred")
            raise

    @property
    def decodes(self) -> bool:
        """True when results carry a decoded form (:attr:`Result.decoded`: the manifest names a decoder)."""
        return self._decodes

    def _decode_outputs(self, outs: Mapping[str, np.ndarray], top_k: int | None, transform: Any) -> Decoded:
        if self._cls_output is not None:
            dec = self.manifest.decoder
            return decode_classification(
                outs[self._cls_output],
                self._labels,
                top_k=top_k or dec.top_k,
                apply_softmax=dec.softmax,
                temperature=self.variant.temperature or 1.0,
            )
        if self._decode_other is not None:
            return self._decode_other(outs, transform)
        return None

    def _finish(
        self,
        feeds: dict[str, np.ndarray],
        t0: int,
        t_ready: int,
        top_k: int | None,
        transform: Any,
        pre_ns: int = 0,
        batch: int = 1,
        scan: Any = None,
    ) -> Result:
        outs, hit = self._run_feeds(feeds, scan)
        t2 = time.perf_counter_ns()
        return self._complete(feeds, outs, hit, t0, t_ready, t2, top_k, transform, pre_ns, batch, t2)

    def _run_feeds(self, feeds: dict[str, np.ndarray], scan: Any) -> tuple[dict[str, np.ndarray], bool]:
        """The session's outputs for ``feeds`` (or the result cache's), and whether the cache had them."""
        cache = self._cache
        outs: dict[str, np.ndarray] | None
        if cache is None:
            hit = False
            if scan is None:
                outs = self._session.run(feeds)
            else:
                try:
                    outs = self._session.run(feeds)
                finally:  # the overlapped NaN/Inf scan decides first: before anything is kept, over a run error too
                    err = scan.wait()
                    if err is not None:
                        raise err
        else:  # a hit does not run the model (inference 0 ms, not recorded); hashing counts as inference on a miss
            key = cache.key(feeds)
            outs = cache.get(key)
            hit = outs is not None
            if outs is None:
                outs = self._session.run(feeds)
                cache.put(key, outs)
        return outs, hit

    def _complete(
        self,
        feeds: dict[str, np.ndarray],
        outs: dict[str, np.ndarray],
        hit: bool,
        t0: int,
        t_ready: int,
        t2: int,
        top_k: int | None,
        transform: Any,
        pre_ns: int,
        batch: int,
        t_dec: int,
    ) -> Result:
        """Decode, time and record one run: ``t0`` start, ``t_ready`` inputs ready, ``t2`` the run's
        end, ``t_dec`` the decode's start (``t2`` unless decoded later, on another thread: the wait
        between them is not counted in ``total_ms``)."""
        # on a hit too: this call's top_k and transform (a model without a decoder skips the call)
        decoded = self._decode_outputs(outs, top_k, transform) if self._decodes else None
        t3 = time.perf_counter_ns()
        val_ns, inf_ns, dec_ns = t_ready - t0 - pre_ns, t2 - t_ready, t3 - t_dec
        tot_ns = t3 - t0 - (t_dec - t2)
        tm = self._tm
        if tm is not None:  # a few list appends, no lock (see edge_sdk.telemetry)
            if hit:
                tm.record_cached(val_ns, pre_ns, dec_ns, tot_ns)
            else:
                tm.record(val_ns, pre_ns, inf_ns, dec_ns, tot_ns)
        if self._monitor is not None:  # quality monitor: a counter increment unless this call is sampled
            self._monitor.observe(feeds, outs, decoded)
        vid, backend, name, version, sha = self._meta
        # tuple.__new__ with every field: the NamedTuples' own __new__ is one more Python frame per call
        timings = _new(Timings, (val_ns * _NS, pre_ns * _NS, 0.0 if hit else inf_ns * _NS, dec_ns * _NS, tot_ns * _NS))
        return _new(Result, (outs, decoded, timings, vid, backend, name, version, sha, batch, transform, self.provenance, hit))

    def attach_monitor(self, monitor: Any) -> Any:
        """Let ``monitor`` (an :class:`edge_sdk.quality.QualityMonitor`) observe every successful call
        (``observe(feeds, outputs, decoded)``: a counter increment unless sampled) and every input
        refused by validation (``schema_violation(exc)``). One monitor per model; returns a function
        that detaches it."""
        if not (callable(getattr(monitor, "observe", None)) and callable(getattr(monitor, "schema_violation", None))):
            raise TypeError(f"attach_monitor: expected a QualityMonitor (observe + schema_violation), got {type(monitor).__name__}")
        if self._monitor is not None and self._monitor is not monitor:
            raise ValueError(f"model {self.manifest.name} already has a monitor attached; detach it first")
        bind = getattr(monitor, "bind", None)
        if bind is not None:
            bind(self)
        self._monitor = monitor

        def detach() -> None:
            if self._monitor is monitor:
                self._monitor = None

        return detach

    @property
    def monitor(self) -> Any:
        """The attached quality monitor, or None."""
        return self._monitor

    @property
    def reference_stats(self) -> Any:
        """The package's reference statistics (:class:`edge_sdk.quality.ReferenceStats`, read from the
        file the manifest's ``[reference_stats]`` covers by digest, verified again), or None if it has none."""
        if self._reference_stats is False:
            from .package.reference_stats import ReferenceStats

            ref = self.manifest.reference_stats
            data = self.package.read_reference_stats()  # None exactly when ref is
            self._reference_stats = None if data is None or ref is None else ReferenceStats.from_json(data, ref.file)
        return self._reference_stats

    @property
    def result_cache(self) -> ResultCache | None:
        """This instance's :class:`~edge_sdk.result_cache.ResultCache` (``.stats()``), None when off."""
        return self._cache

    def predict_batch(self, items: Sequence[np.ndarray | Mapping[str, np.ndarray]], *, top_k: int | None = None) -> list[Result]:
        """Run several single-row items. Each is validated like ``predict``; when
        the model's batch dim (axis 0 of every input) is dynamic, rows are stacked
        into calls of up to its upper bound, else (and for detection and segmentation
        decoders, which decode one image per call) run one by one. One Result per
        item, in order; ``Result.batch_size`` says how many rows shared the call."""
        if not items:
            e = InputError("predict_batch: expected at least one item, got an empty sequence")
            self._failed(e, "predict_batch")
            raise e
        max_b = self._max_batch()
        if max_b <= 1 or self._decode_other is not None:  # detection / segmentation decode one image per call
            return [self.predict(x, top_k=top_k) for x in items]
        try:
            return self._predict_stacked(items, max_b, top_k)
        except Exception as e:
            self._failed(e, "predict_batch")
            raise

    def _predict_stacked(self, items: Sequence[np.ndarray | Mapping[str, np.ndarray]], max_b: int, top_k: int | None) -> list[Result]:
        results: list[Result] = []
        for start in range(0, len(items), max_b):
            chunk = items[start : start + max_b]
            t0 = time.perf_counter_ns()
            fed = [self._validate(x, finite=self._finite) for x in chunk]
            for i, f in enumerate(fed):
                for k, v in f.items():
                    if v.shape[0] != 1:
                        raise InputError(f"predict_batch item {start + i}: input {k!r} must have batch 1, got shape {v.shape}")
            feeds = {k: np.concatenate([f[k] for f in fed], axis=0) for k in fed[0]}
            t1 = time.perf_counter_ns()
            r = self._finish(feeds, t0, t1, top_k, None, batch=len(chunk))
            rows = r.decoded if isinstance(r.decoded, tuple) else None  # classification rows (or nothing decoded)
            for i in range(len(chunk)):
                results.append(
                    r._replace(outputs={k: v[i : i + 1] for k, v in r.outputs.items()}, decoded=None if rows is None else (rows[i],))
                )
        return results

    def _max_batch(self) -> int:
        return max_batch_of(self._inputs)

    def stream(self) -> "Stream":
        """Per-stream state for streaming models (manifest ``state`` pairs)."""
        if self._closed:
            raise SessionClosedError("model is closed")
        if self._cache is not None:
            raise ResultCacheError("model.stream() refused: this model was loaded with result_cache; a stream carries state between calls")
        return Stream(self)

    # -- description ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary: model, version, variant, precision, sha256, backend, runtime, threads, providers/delegates used, session
        notes, profile, the selection and provenance."""
        info = self._session.info
        return {
            "model": self.manifest.name,
            "version": self.manifest.version,
            "variant": self.variant.id,
            "precision": self.variant.precision,
            "sha256": self.variant.sha256,
            "backend": info.backend,
            "runtime": f"{info.runtime} {info.runtime_version}",
            "threads": info.threads,
            "providers": list(info.providers_used),
            "delegates": list(info.delegates_used),
            "notes": list(info.notes),
            "optimized_cache": info.optimized_cache,
            "session_create_ms": round(info.create_ms, 2),
            "profile": self.detection.profile.name,
            "selection": self.selection.to_dict(),
            "provenance": self.provenance.to_dict(),
            "deterministic": self.options.deterministic,
            "determinism": list(info.determinism),
            "result_cache": self._cache.stats()._asdict() if self._cache is not None else None,
        }


class Stream:
    """Carries state tensors between calls of a streaming model.

    ``predict(x)`` takes the non-state inputs; state inputs are fed from the
    previous call's paired outputs (initially filled with ``initial``).
    One Stream per source keeps their state apart; ``reset()`` starts over.
    """

    def __init__(self, model: Model) -> None:
        self._model = model
        self._pairs = model.manifest.state
        self._specs = {s.name: s for s in model.inputs}
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Start over: every state input back to its ``initial`` value."""
        with self._lock:
            self._state = {
                p.input: np.full(self._specs[p.input].min_shape(), p.initial, dtype=self._specs[p.input].dtype) for p in self._pairs
            }

    @property
    def state(self) -> dict[str, np.ndarray]:
        """A copy of the state tensors the next call will be fed, by input name."""
        return {k: v.copy() for k, v in self._state.items()}

    def predict(self, inputs: np.ndarray | Mapping[str, np.ndarray], *, top_k: int | None = None) -> Result:
        """Like :meth:`Model.predict` with the state inputs fed from the previous call; passing a state input raises
        :class:`~edge_sdk.errors.InputError`. The result's paired outputs become the next call's state."""
        m = self._model
        if isinstance(inputs, Mapping):
            given = [k for k in inputs if k in m._state_inputs]
            if given:
                rest = [n for n in m._validate.names if n not in m._state_inputs]
                e = InputError(f"state input(s) {given} are fed by the stream; pass only {rest}")
                m._failed(e, "stream")
                raise e
        return self._call(inputs, m._finite, top_k)

    def _predict_made(self, feeds: dict[str, np.ndarray]) -> Result:
        """:meth:`predict` on non-state feeds the SDK assembled to the model's specs (see
        :meth:`Model._predict_made`: not validated again), with this stream's state added."""
        return self._call(feeds, False, None, made=True)

    def _call(self, inputs: Any, finite: bool, top_k: int | None, made: bool = False) -> Result:
        m = self._model
        with self._lock:
            t0 = time.perf_counter_ns()
            try:
                feeds = inputs if made else m._validate(inputs, skip=m._state_inputs, finite=finite)
                feeds.update(self._state)
                t1 = t0 if made else time.perf_counter_ns()
                r = m._finish(feeds, t0, t1, top_k, None)
            except Exception as e:
                m._failed(e, "stream")
                raise
            self._state = {p.input: np.ascontiguousarray(r.outputs[p.output]) for p in self._pairs}
            return r


# ------------------------------------------------------------------------------
# loading


def _build_decoder(
    manifest: Any, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> Callable[[Mapping[str, np.ndarray], Any], Detections | SegmentationMask] | None:
    """A function (outputs, transform) -> Detections | SegmentationMask for the
    manifest's detection/segmentation decoder, or None. Built once per model."""
    dec = manifest.decoder
    if dec.kind not in ("detection", "segmentation"):
        return None
    pre = next((s.preprocess for s in inputs if s.preprocess is not None), None)
    size = pre.size_hw if pre is not None else None
    labels = manifest.labels
    p = dict(dec.params)
    if dec.kind == "segmentation":
        from .processing.segmentation import decode_segmentation

        out = dec.output or outputs[0].name
        kw = {k: p[k] for k in ("threshold", "activation", "upsample", "keep_probabilities") if k in p}
        layout = p.get("layout", "NCHW")
        return lambda outs, tf: decode_segmentation(outs[out], layout=layout, labels=labels, transform=tf, input_size=size, **kw)
    from .processing import detection as D

    common = {k: p[k] for k in ("score_threshold", "iou_threshold", "max_detections", "clip") if k in p}
    if p["format"] == "blazeface":
        anchors = None
        if "anchors" in p:
            anchor_kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in dict(p["anchors"]).items()}
            anchors = D.ssd_anchors(**anchor_kw)
        box_out, score_out = p["outputs"]
        weighted = p.get("nms", "weighted") == "weighted"
        label = labels[0] if labels else "face"
        return lambda outs, tf: D.decode_blazeface(
            outs[box_out], outs[score_out], anchors, input_size=size or (128, 128), transform=tf, weighted=weighted, label=label, **common
        )
    out = dec.output or (p.get("outputs") or (outputs[0].name,))[0]
    kw = {k: p[k] for k in ("class_aware", "normalized", "apply_sigmoid") if k in p}
    layout = p["layout"]
    return lambda outs, tf: D.decode_yolo(outs[out], layout=layout, labels=labels, transform=tf, input_size=size, **kw, **common)


def _check_result_cache(manifest: Any, opts: LoadOptions) -> None:
    """Refuse ``result_cache`` for a model whose output is not a function of its input alone."""
    if opts.result_cache and manifest.state:
        pairs = [(s.input, s.output) for s in manifest.state]
        raise ResultCacheError(
            f"result_cache refused for {manifest.name}: its manifest declares state pairs {pairs} (a streaming model), "
            "so an output depends on earlier calls, not on the input alone; load it without result_cache"
        )


def _signature_check(v: Variant, specs_in: Sequence[TensorSpec], specs_out: Sequence[TensorSpec], session: Session) -> None:
    """The manifest must agree with the model's own signature (names, dtypes,
    ranks, fixed dims). Raises SignatureMismatchError listing every difference."""
    problems: list[str] = []
    for kind, specs, infos in (("input", specs_in, session.inputs), ("output", specs_out, session.outputs)):
        by_name = {i.name: i for i in infos}
        declared = {s.name for s in specs}
        if set(by_name) != declared:
            problems.append(f"{kind} names: manifest {sorted(declared)}, model {sorted(by_name)}")
            continue
        for s in specs:
            i = by_name[s.name]
            if i.dtype != s.dtype:
                problems.append(f"{kind} {s.name!r} dtype: manifest {s.dtype}, model {i.dtype}")
            if len(i.shape) != len(s.shape):
                problems.append(f"{kind} {s.name!r} rank: manifest {len(s.shape)} {list(s.shape)}, model {len(i.shape)} {list(i.shape)}")
                continue
            for ax, (md, sd) in enumerate(zip(i.shape, s.shape)):
                if isinstance(md, int) and isinstance(sd, int) and md != sd:
                    problems.append(f"{kind} {s.name!r} dim {ax}: manifest {sd}, model {md}")
                elif isinstance(md, int) and not isinstance(sd, int) and kind == "input":
                    b = s.bounds(sd)
                    if b and (b[0] != md or b[1] != md):
                        problems.append(f"{kind} {s.name!r} dim {ax}: manifest says dynamic {sd} in {list(b)}, model fixes it at {md}")
    if problems:
        raise SignatureMismatchError(f"variant {v.id}: manifest disagrees with the model: " + "; ".join(problems))


#: Most bytes of inputs :func:`_measure` builds to time one variant (they are at the smallest declared
#: shapes, so real models need kilobytes); a manifest that declares more is refused before allocating.
MAX_MEASURE_FEED_BYTES = 256 * 1024**2


def _check_feed_size(specs: Sequence[TensorSpec], limit: int = MAX_MEASURE_FEED_BYTES) -> None:
    need = sum(s.nbytes(s.min_shape()) for s in specs)
    if need > limit:
        worst = max(specs, key=lambda s: s.nbytes(s.min_shape()))
        raise ManifestError(
            f"inputs: timing the tied variants needs {need} bytes of inputs at the smallest declared shapes "
            f"(input {worst.name!r}: {list(worst.min_shape())} {worst.dtype}), over the limit of {limit} bytes"
        )


def _random_feeds(specs: Sequence[TensorSpec], seed: int = 0, limit: int = MAX_MEASURE_FEED_BYTES) -> dict[str, np.ndarray]:
    _check_feed_size(specs, limit)
    rng = np.random.default_rng(seed)
    out = {}
    for s in specs:
        shape = s.min_shape()
        if s.dtype.startswith("float"):
            out[s.name] = rng.standard_normal(shape).astype(s.dtype)
        else:
            out[s.name] = np.zeros(shape, dtype=s.dtype)
    return out


def _time_session(session: Session, feeds: Mapping[str, np.ndarray], runs: int, budget_s: float) -> float:
    """Median ms of up to ``runs`` calls within ``budget_s`` (after 2 warm-ups)."""
    for _ in range(2):
        session.run(feeds)
    times = []
    deadline = time.perf_counter() + budget_s
    for _ in range(runs):
        t = time.perf_counter_ns()
        session.run(feeds)
        times.append((time.perf_counter_ns() - t) * _NS)
        if time.perf_counter() > deadline:
            break
    return float(np.median(times))


def _open(pkg: ModelPackage, v: Variant, sopts: SessionOptions, opts: LoadOptions) -> Session:
    if v.external_data:  # loaded by path: the graph file and every external file are verified now
        vm = pkg.read_verified(v)
        src = ModelSource(vm.data, vm.path, vm.sha256, True)
    else:
        # read (and checked again: size, digest, format) only when something needs the bytes: not when
        # ONNX Runtime loads its cached optimised model and the sandbox remembers this digest passing
        src = ModelSource(None, pkg.path_of(v.file), v.sha256, read=lambda: pkg.read_verified(v).data)
    if _sandbox.enabled(opts.sandbox, pkg.root):
        ext = sum(e.size for e in v.external_data) if v.external_data else None
        _sandbox.check_verified_once(v.backend, v.sha256, lambda: src.data, src.path, external_bytes=ext)
    session = open_session(v.backend, src, sopts)
    try:
        _signature_check(v, pkg.manifest.inputs_for(v), pkg.manifest.outputs_for(v), session)
    except BaseException:
        session.close()
        raise
    return session


def load(
    package: str | os.PathLike[str] | ModelPackage,
    profile: str | os.PathLike[str] | DeviceProfile | None = None,
    options: LoadOptions | None = None,
    **overrides: Any,
) -> "Model | DecoderModel":
    """Open ``package`` and pick the variant and backend for ``profile``.

    ``profile``: a DeviceProfile, a bundled profile name or a .toml path; by
    default ``$EDGE_SDK_PROFILE`` or the detected device. ``options`` and/or
    keyword overrides are :class:`LoadOptions` fields (an unknown keyword is a
    TypeError). A ``task = "text-generation"`` package gives a
    :class:`~edge_sdk.generation.DecoderModel` (``generate``/``stream``/``chat``), any other a
    :class:`Model`; :func:`load_model` and :func:`load_decoder` say which in their type. Raises
    ModelPackageError subclasses, ProfileError, SelectionError, BackendError subclasses.
    """
    opts, pkg, cache = _open_package(package, options, overrides)
    if pkg.manifest.task == "text-generation":
        return _load_decoder(pkg, profile, opts, cache)
    return _load_model(pkg, profile, opts, cache)


def load_model(
    package: str | os.PathLike[str] | ModelPackage,
    profile: str | os.PathLike[str] | DeviceProfile | None = None,
    options: LoadOptions | None = None,
    **overrides: Any,
) -> Model:
    """:func:`load` for a single-pass model (``predict``); a text-generation package is a SelectionError
    that says to use :func:`load_decoder`."""
    opts, pkg, cache = _open_package(package, options, overrides)
    if pkg.manifest.task == "text-generation":
        raise SelectionError(
            f"package {pkg.manifest.name} is a text-generation package: load it with load() or load_decoder() and call generate/chat"
        )
    return _load_model(pkg, profile, opts, cache)


def load_decoder(
    package: str | os.PathLike[str] | ModelPackage,
    profile: str | os.PathLike[str] | DeviceProfile | None = None,
    options: LoadOptions | None = None,
    **overrides: Any,
) -> "DecoderModel":
    """:func:`load` for a text-generation package; any other package is a SelectionError."""
    opts, pkg, cache = _open_package(package, options, overrides)
    if pkg.manifest.task != "text-generation":
        raise SelectionError(
            f"package {pkg.manifest.name} has task {pkg.manifest.task!r}, not text-generation: load it with load() or load_model()"
        )
    return _load_decoder(pkg, profile, opts, cache)


def _open_package(
    package: str | os.PathLike[str] | ModelPackage, options: LoadOptions | None, overrides: Mapping[str, Any]
) -> tuple[LoadOptions, ModelPackage, Path]:
    opts = replace(options or LoadOptions(), **overrides) if overrides else (options or LoadOptions())
    cache = Path(opts.cache_dir) if opts.cache_dir else default_cache_dir()
    pkg = package if isinstance(package, ModelPackage) else ModelPackage.open(package, cache_dir=cache)
    return opts, pkg, cache


def _select(pkg: ModelPackage, profile: str | os.PathLike[str] | DeviceProfile | None, opts: LoadOptions) -> tuple[Selection, BoardMatch]:
    detection = resolve_profile(profile, root=opts.root)
    # Probe only the runtimes this package's variants use: importing an unused one
    # (onnxruntime for a TFLite-only package) costs tens of ms of cold start.
    from .backends.base import backend_status

    statuses = {b: backend_status(b) for b in sorted({v.backend for v in pkg.manifest.variants})}
    sel = select_variant(
        pkg.manifest,
        detection.profile,
        statuses,
        memory_budget_mb=detection.memory_budget_mb,
        variant=opts.variant,
        min_cosine=opts.min_cosine,
        machine=describe_machine(detection.facts),
    )
    return sel, detection


def _load_decoder(
    pkg: ModelPackage, profile: str | os.PathLike[str] | DeviceProfile | None, opts: LoadOptions, cache: Path
) -> DecoderModel:
    if opts.result_cache:
        raise ResultCacheError(
            f"result_cache: {pkg.manifest.name} generates text token by token; a result cache applies to single-pass models"
        )
    from .generation.decoder import open_decoder

    sel, detection = _select(pkg, profile, opts)
    sopts = opts.session_options(detection.profile, cache, detection.facts.usable_cpus)
    # A decode step is ~300 small kernels back to back: waking the thread pool for each costs more than
    # letting it spin (SmolLM2-135M int4, 2 threads: 15.0 -> 8.6 ms per token). The profile's setting is
    # for pipelines that share the CPU; an explicit allow_spinning wins.
    sopts = replace(sopts, cache_dir=None, allow_spinning=True if opts.allow_spinning is None else opts.allow_spinning)
    return open_decoder(
        pkg,
        pkg.manifest.variant(sel.variant_id),
        sel,
        detection,
        sopts,
        context=opts.context,
        telemetry=opts.telemetry,
        deterministic=opts.deterministic,
    )


def _load_model(pkg: ModelPackage, profile: str | os.PathLike[str] | DeviceProfile | None, opts: LoadOptions, cache: Path) -> Model:
    if opts.context is not None:
        raise OptionsError(f"context: applies to text-generation packages; {pkg.manifest.name} has task {pkg.manifest.task!r}")
    _check_result_cache(pkg.manifest, opts)  # before any session is opened
    sel, detection = _select(pkg, profile, opts)
    sopts = opts.session_options(detection.profile, cache, detection.facts.usable_cpus)
    to_time = sel.to_time
    if to_time and opts.measure_backends and not opts.deterministic:  # a timing-based choice can differ between loads
        sel, session = _measure(pkg, sel, to_time, sopts, opts, cache, detection.profile.name, describe_machine(detection.facts))
    else:
        if to_time:
            why = "deterministic mode" if opts.deterministic else "measure_backends=False"
            sel = replace(sel, chosen=replace(sel.chosen, reasons=sel.chosen.reasons + (f"not timed here ({why}): the profile's rank decides",)))
            sel = replace(sel, candidates=tuple(sel.chosen if c.variant_id == sel.chosen.variant_id else c for c in sel.candidates))
        session = _open(pkg, pkg.manifest.variant(sel.variant_id), sopts, opts)
    return Model(pkg, pkg.manifest.variant(sel.variant_id), session, sel, detection, opts)


def _measure(
    pkg: ModelPackage, sel: Selection, to_time: tuple[Any, ...], sopts: SessionOptions, opts: LoadOptions, cache: Path, profile: str,
    machine: str,
) -> tuple[Selection, Session]:
    """Time the chosen candidate and ``to_time`` (tied backends, unproven lighter precisions) on this device,
    or reuse a cached measurement (keyed by profile, CPU, thread count, providers, variants and runtime versions)."""
    ids = [sel.chosen.variant_id] + [c.variant_id for c in to_time]
    variants = [pkg.manifest.variant(i) for i in ids]
    key = hashlib.sha256(
        json.dumps(
            [profile, machine, sopts.threads, sopts.providers, sopts.delegates, [(v.id, v.sha256) for v in variants], _runtime_versions()]
        ).encode()
    ).hexdigest()[:24]
    store = cache / "selection.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}  # a damaged store only costs a re-measurement
    entry = known.get(key)
    if _valid_measurement(entry, ids):
        sel = sel.with_measurement(entry, "cached measurement on this device")
        return sel, _open(pkg, pkg.manifest.variant(sel.variant_id), sopts, opts)
    sessions: dict[str, Session] = {}
    timings: dict[str, float] = {}
    for v in variants:  # every declared feed size is checked before the first session is opened or array allocated
        _check_feed_size(pkg.manifest.inputs_for(v))
    try:
        for v in variants:
            s = _open(pkg, v, sopts, opts)
            sessions[v.id] = s
            timings[v.id] = _time_session(s, _random_feeds(pkg.manifest.inputs_for(v)), opts.measure_runs, opts.measure_budget_s)
    except BaseException:
        for s in sessions.values():
            s.close()
        raise
    sel = sel.with_measurement(timings, f"{opts.measure_runs} runs max on this device")
    for vid, s in sessions.items():
        if vid != sel.variant_id:
            s.close()
    known[key] = timings
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, store)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
    return sel, sessions[sel.variant_id]


def _valid_measurement(entry: Any, ids: Sequence[str]) -> TypeGuard[dict[str, float]]:
    return (
        isinstance(entry, dict)
        and set(entry) == set(ids)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in entry.values())
    )


def _runtime_versions() -> list[str]:
    return [f"{n}={s.version}" for n, s in sorted(all_backend_status().items())]
