"""Shadow checks: a small sample of requests is also answered by a *reference* (the package's
fp32 variant on this device, or a remote server), off the request path, and the agreement
rate becomes a telemetry signal. Off by default: nothing happens unless a checker is made.

    checker = ShadowChecker.local_fp32(model, sample_every=50, max_per_s=2)   # or ShadowChecker(model, remote)
    checker.subscribe(print)                         # QualityEvent when agreement falls under the threshold / recovers
    r = checker.predict_image(frame)                 # the primary's Result, unchanged; every 50th is also checked
    checker.observe(inputs, r)                       # or: observe what you ran yourself
    checker.status()                                 # agreement (rolling window and totals), skips, reference latency

Cost on the caller's thread: a request that is not sampled costs a counter increment; a sampled
one costs the privacy decision, the budget check and (when admitted) a copy of its input and
outputs into a bounded queue. The reference runs on one background thread; the queue holds at
most ``max_in_flight`` requests (queued + running): when it is full the sample is skipped and
counted (``skipped_busy``), the caller never waits. ``max_per_s`` (a token bucket) and
``max_busy_fraction`` (the reference's busy time over wall time) bound what the reference costs;
a sample over them is skipped (``skipped_budget``).

Privacy: with a remote reference the model's :class:`~edge_sdk.remote.privacy.PrivacyPolicy` is
asked (``policy.check``, the same decision the remote session makes) before the input is even
copied; a refusal is counted (``privacy_blocked``) and nothing is sent.

Agreement, by the manifest's decoder (or ``agreement=fn(primary_result, reference_result)``):
classification: the same top-1 class (label when both have labels), and with ``max_score_delta``
top-1 scores within it; detection: every box matched one-to-one by a box of the same class with
IoU >= ``iou``; anything else: cosine of the outputs per row >= ``min_cosine``. Rates count rows
(a batch of 4 counts 4).
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import queue
import random
import threading
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._listeners import Listeners
from ..errors import EdgeSDKError, OptionsError, OptionsTypeError, SelectionError
from ..telemetry.core import Histogram, Sample
from .monitor import QualityEvent, _count_value, _Indicator, watch_quality_events

_log = logging.getLogger(__name__)

__all__ = [
    "ShadowChecker", "ShadowError", "ShadowMemoryError", "classification_agreement", "cosine_agreement",
    "detection_agreement", "shadow_samples",
]  # fmt: skip

INDICATOR = "shadow_disagreement"
_STOP = object()


class ShadowError(EdgeSDKError):
    """A shadow checker cannot be set up as asked (no fp32 variant to check against, or a reference that cannot answer for the model)."""


class ShadowMemoryError(ShadowError, SelectionError):
    """The memory budget cannot hold the model and its fp32 reference together (the message has both estimates and the budget)."""


# -- agreement functions ----------------------------------------------------------------------


def _rows(decoded: Any) -> list[Any]:
    if decoded is None:
        return []
    if isinstance(decoded, (list, tuple)):
        return list(decoded)
    return [decoded]


def classification_agreement(primary: Any, reference: Any, *, max_score_delta: float | None = None) -> list[bool]:
    """Per row: the same top-1 class (compared by label when both rows carry one, else by index),
    and, with ``max_score_delta``, top-1 scores that differ by at most that much. ``primary`` and
    ``reference`` are Results (or their ``decoded``: rows of top-k ``Classification``)."""
    a = _rows(getattr(primary, "decoded", primary))
    b = _rows(getattr(reference, "decoded", reference))
    if len(a) != len(b):
        raise ShadowError(f"classification agreement: the primary has {len(a)} rows, the reference {len(b)}")
    out = []
    for ra, rb in zip(a, b):
        if not ra or not rb:
            out.append(not ra and not rb)
            continue
        ta, tb = ra[0], rb[0]
        same = ta.label == tb.label if (ta.label and tb.label) else ta.index == tb.index
        if same and max_score_delta is not None:
            same = abs(float(ta.score) - float(tb.score)) <= max_score_delta
        out.append(bool(same))
    return out


def _det_rows(decoded: Any) -> list[Any]:
    from ..processing.detection import Detections

    if isinstance(decoded, Detections):
        return [decoded]
    return list(decoded or [])


def detection_agreement(primary: Any, reference: Any, *, iou: float = 0.5) -> list[bool]:
    """Per image: the two sets of boxes have the same size and match one-to-one (greedy, by
    IoU, best pairs first) with pairs of the same class and IoU >= ``iou``. Results, or their
    ``decoded`` (``Detections`` or a sequence of them)."""
    from ..processing.detection import box_iou

    a = _det_rows(getattr(primary, "decoded", primary))
    b = _det_rows(getattr(reference, "decoded", reference))
    if len(a) != len(b):
        raise ShadowError(f"detection agreement: the primary has {len(a)} images, the reference {len(b)}")
    out = []
    for da, db in zip(a, b):
        if len(da.xyxy) != len(db.xyxy):
            out.append(False)
            continue
        if len(da.xyxy) == 0:
            out.append(True)
            continue
        m = box_iou(da.xyxy, db.xyxy)
        m = np.where(np.asarray(da.class_ids)[:, None] == np.asarray(db.class_ids)[None, :], m, -1.0)
        used_a: set[int] = set()
        used_b: set[int] = set()
        for flat in np.argsort(-m, axis=None, kind="stable"):
            i, j = divmod(int(flat), m.shape[1])
            if m[i, j] < iou:
                break
            if i in used_a or j in used_b:
                continue
            used_a.add(i)
            used_b.add(j)
        out.append(len(used_a) == len(da.xyxy))
    return out


def cosine_agreement(primary: Any, reference: Any, *, min_cosine: float = 0.99, names: Sequence[str] | None = None) -> list[bool]:
    """Per batch row: the cosine similarity of the outputs (``names``, default every output both
    have, flattened and concatenated) >= ``min_cosine``. Two all-zero rows agree. Results, or
    their ``outputs`` mappings."""
    oa = getattr(primary, "outputs", primary)
    ob = getattr(reference, "outputs", reference)
    keys = list(names) if names is not None else [k for k in oa if k in ob]
    if not keys:
        raise ShadowError(f"cosine agreement: no output in common (primary {sorted(oa)}, reference {sorted(ob)})")
    xa = [np.asarray(oa[k], np.float64) for k in keys]
    xb = [np.asarray(ob[k], np.float64) for k in keys]
    n = xa[0].shape[0] if xa[0].ndim else 1
    for k, u, v in zip(keys, xa, xb):
        if u.shape != v.shape:
            raise ShadowError(f"cosine agreement: output {k!r} has shape {list(u.shape)} on the primary, {list(v.shape)} on the reference")
    ra = np.concatenate([u.reshape(n, -1) for u in xa], axis=1)
    rb = np.concatenate([v.reshape(n, -1) for v in xb], axis=1)
    na, nb = np.linalg.norm(ra, axis=1), np.linalg.norm(rb, axis=1)
    out = []
    for i in range(n):
        if na[i] == 0 or nb[i] == 0:
            out.append(bool(na[i] == 0 and nb[i] == 0))
        else:
            out.append(bool(float(ra[i] @ rb[i]) / (na[i] * nb[i]) >= min_cosine))
    return out


# -- the checker -------------------------------------------------------------------------------


class _Job:
    __slots__ = ("feeds", "prepared", "image", "color", "result", "t_submit")

    def __init__(self, feeds: Any, prepared: bool, image: Any, color: str, result: Any) -> None:
        self.feeds, self.prepared, self.image, self.color, self.result = feeds, prepared, image, color, result
        self.t_submit = time.monotonic()


class _Snapshot:
    """The primary's result as the worker needs it (outputs copied, decoded is immutable)."""

    __slots__ = ("outputs", "decoded", "transform", "variant_id")

    def __init__(self, r: Any) -> None:
        self.outputs = {k: np.array(v, copy=True) for k, v in r.outputs.items()}
        self.decoded = r.decoded
        self.transform = r.transform
        self.variant_id = r.variant_id


def _copy_feeds(inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return {k: np.array(v, copy=True) for k, v in inputs.items()}
    return np.array(inputs, copy=True)


def _same_specs(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return [(s.name, s.dtype, tuple(s.shape), s.preprocess) for s in a] == [(s.name, s.dtype, tuple(s.shape), s.preprocess) for s in b]


class ShadowChecker:
    """Answers a sample of ``model``'s requests with ``reference`` too, in the background, and
    tracks how often they agree (module docs).

    ``model``: the primary (a loaded Model). ``reference``: a Model answering the same package
    (local, e.g. :meth:`local_fp32`, or ``remote_model``; see :meth:`remote`). ``sample_every``:
    check every N-th request (deterministic), or ``rate``: each with this probability (``seed``).
    ``max_in_flight``: requests queued or running on the reference at most. ``max_per_s``: reference
    calls per second at most (token bucket, burst 1). ``max_busy_fraction``: the reference's busy
    time over the checker's lifetime at most (e.g. 0.05). ``agreement``: ``fn(primary_result,
    reference_result) -> bool | sequence of bool per row``; default by the manifest's decoder with
    ``max_score_delta``, ``iou``, ``min_cosine``. ``window``: rows in the rolling agreement rate.
    ``threshold``: the rolling rate under which the ``shadow_disagreement`` alarm is entered (after
    ``min_rows`` rows in the window), ``exit_threshold`` (default ``threshold`` + 0.05, at most 1)
    the rate at or over which it is left; ``consecutive`` checks in a row must agree (hysteresis).
    ``name``: the telemetry label (default the model name). ``owns_reference``: close the
    reference with the checker (set by :meth:`local_fp32` / :meth:`remote`)."""

    def __init__(
        self,
        model: Any,
        reference: Any,
        *,
        sample_every: int = 100,
        rate: float | None = None,
        seed: int | None = None,
        max_in_flight: int = 1,
        max_per_s: float | None = None,
        max_busy_fraction: float | None = None,
        agreement: Callable[[Any, Any], Any] | None = None,
        max_score_delta: float | None = None,
        iou: float = 0.5,
        min_cosine: float = 0.99,
        window: int = 200,
        threshold: float = 0.9,
        exit_threshold: float | None = None,
        min_rows: int = 20,
        consecutive: int = 2,
        name: str | None = None,
        owns_reference: bool = False,
    ) -> None:
        from ..model import Model

        if not isinstance(model, Model):
            raise TypeError(f"model: expected an edge_sdk Model, got {type(model).__name__}")
        if not isinstance(reference, Model):
            raise TypeError(f"reference: expected an edge_sdk Model (local, or remote_model), got {type(reference).__name__}")
        if reference is model:
            raise ShadowError("reference: expected another model than the primary (a model agrees with itself)")
        if not isinstance(sample_every, int) or isinstance(sample_every, bool) or sample_every < 1:
            raise OptionsError(f"sample_every: expected an int >= 1, got {sample_every!r}")
        if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate <= 1):
            raise OptionsError(f"rate: expected a probability in (0, 1], got {rate!r}")
        if not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool) or max_in_flight < 1:
            raise OptionsError(f"max_in_flight: expected an int >= 1, got {max_in_flight!r}")
        if max_per_s is not None and not (isinstance(max_per_s, (int, float)) and max_per_s > 0 and math.isfinite(max_per_s)):
            raise OptionsError(f"max_per_s: expected a number > 0 (reference calls per second), got {max_per_s!r}")
        if max_busy_fraction is not None and not (isinstance(max_busy_fraction, (int, float)) and 0 < max_busy_fraction <= 1):
            raise OptionsError(f"max_busy_fraction: expected a fraction in (0, 1], got {max_busy_fraction!r}")
        if agreement is not None and not callable(agreement):
            raise OptionsTypeError(f"agreement: expected a callable (primary_result, reference_result) -> bool(s), got {type(agreement).__name__}")
        if not isinstance(window, int) or window < 1:
            raise OptionsError(f"window: expected an int >= 1, got {window!r}")
        ex = min(1.0, threshold + 0.05) if exit_threshold is None else exit_threshold
        if not (isinstance(threshold, (int, float)) and isinstance(ex, (int, float)) and 0 <= threshold <= ex <= 1):
            raise OptionsError(f"threshold / exit_threshold: expected 0 <= threshold <= exit_threshold <= 1, got {threshold!r} and {ex!r}")
        if not isinstance(min_rows, int) or not 1 <= min_rows <= window:
            raise OptionsError(f"min_rows: expected an int in [1, window={window}], got {min_rows!r}")
        if not isinstance(consecutive, int) or consecutive < 1:
            raise OptionsError(f"consecutive: expected an int >= 1, got {consecutive!r}")
        if reference.manifest.decoder.kind != model.manifest.decoder.kind and agreement is None:
            raise ShadowError(
                f"reference decodes {reference.manifest.decoder.kind!r}, the model {model.manifest.decoder.kind!r}: pass agreement="
            )
        self.model = model
        self.reference = reference
        self.sample_every = sample_every
        self.rate = rate
        self.max_in_flight = max_in_flight
        self.max_per_s = max_per_s
        self.max_busy_fraction = max_busy_fraction
        self.window = window
        self.threshold = float(threshold)
        self.exit_threshold = float(ex)
        self.min_rows = min_rows
        self.consecutive = consecutive
        self.name = name or model.manifest.name
        self.owns_reference = owns_reference
        self._agree = agreement or self._default_agreement(model.manifest.decoder.kind, max_score_delta, iou, min_cosine)
        self._same_inputs = _same_specs(model.inputs, reference.inputs)
        self._privacy, self._remote_name, self._region = self._remote_policy(reference)
        self.kind = "remote" if self._privacy is not None else "local"
        self.latency = Histogram()  # reference call durations (checked and failed)
        self._rng = random.Random(seed)
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._t0 = time.monotonic()
        self._tokens = 1.0
        self._t_tokens = self._t0
        self._in_flight = 0
        self._busy_s = 0.0
        self._ewma_s: float | None = None
        self._ring: collections.deque[bool] = collections.deque(maxlen=window)
        self._ind = _Indicator()  # the shadow_disagreement alarm
        self._listeners: Listeners[QualityEvent] = Listeners(f"shadow checker {self.name}")
        self.events: collections.deque[QualityEvent] = collections.deque(maxlen=256)
        self._c = dict.fromkeys(
            (
                "sampled",
                "submitted",
                "checked",
                "rows_checked",
                "rows_agreed",
                "skipped_budget",
                "skipped_busy",
                "privacy_blocked",
                "errors",
            ),
            0,
        )
        self._error_types: dict[str, int] = {}

    # -- construction helpers --------------------------------------------------------------

    @staticmethod
    def _default_agreement(kind: str, max_score_delta: float | None, iou: float, min_cosine: float) -> Callable[[Any, Any], list[bool]]:
        if kind == "classification":
            return lambda a, b: classification_agreement(a, b, max_score_delta=max_score_delta)
        if kind == "detection":
            return lambda a, b: detection_agreement(a, b, iou=iou)
        return lambda a, b: cosine_agreement(a, b, min_cosine=min_cosine)

    @staticmethod
    def _remote_policy(reference: Any) -> tuple[Any, str | None, str | None]:
        from ..remote.session import RemoteSession

        s = reference.session
        if isinstance(s, RemoteSession):
            return s.privacy, s.model_name, s.client.region
        return None, None, None

    @classmethod
    def local_fp32(cls, model: Any, *, variant: str | None = None, threads: int = 1, **kw: Any) -> "ShadowChecker":
        """A checker whose reference is the package's fp32 variant loaded here (``variant``: a
        given id; default the fp32 variant on the primary's backend, else the package's reference
        variant when it is fp32, else the first fp32 one), with ``threads`` runtime threads and
        no telemetry of its own. Refused with :class:`ShadowMemoryError` when the device
        profile's memory budget cannot hold both variants (the estimate of
        :mod:`edge_sdk.selection`: file bytes x MEMORY_FACTOR), :class:`ShadowError` when the
        package has no fp32 variant or the primary is it. Other keywords go to the checker."""
        from ..model import LoadOptions, load_model
        from ..selection import MEMORY_FACTOR, MiB

        m = model.manifest
        if variant is not None:
            try:
                ref = m.variant(variant)
            except KeyError:
                raise ShadowError(f"variant {variant!r} is not in package {m.name}; it has {[v.id for v in m.variants]}") from None
        else:
            fp32 = [v for v in m.variants if v.precision == "fp32"]
            if not fp32:
                raise ShadowError(
                    f"package {m.name} has no fp32 variant to check against (variants {[(v.id, v.precision) for v in m.variants]})"
                )
            ref = next(
                (v for v in fp32 if v.backend == model.variant.backend),
                next((v for v in fp32 if v.id == m.reference_variant.id), fp32[0]),
            )
        if ref.id == model.variant.id:
            raise ShadowError(f"model {m.name} already runs {ref.id}; a shadow reference must be another variant (or a remote model)")
        budget = model.detection.memory_budget_mb
        need_p = model.variant.total_size * MEMORY_FACTOR / MiB
        need_r = ref.total_size * MEMORY_FACTOR / MiB
        if budget is not None and need_p + need_r > budget:
            raise ShadowMemoryError(
                f"model {m.name}: the primary {model.variant.id} (~{need_p:.2f} MiB) and the reference {ref.id} (~{need_r:.2f} MiB) "
                f"need ~{need_p + need_r:.2f} MiB together, over the {budget:.0f} MiB memory budget of profile "
                f"{model.detection.profile.name}; use a remote reference (ShadowChecker.remote) or no shadow checks"
            )
        o = model.options
        opts = LoadOptions(
            variant=ref.id, threads=threads, telemetry=False, measure_backends=False, root=o.root, cache_dir=o.cache_dir,
            sandbox=o.sandbox, check_finite=o.check_finite,
        )  # fmt: skip
        reference = load_model(model.package, model.detection.profile, opts)
        try:
            return cls(model, reference, owns_reference=True, **kw)
        except BaseException:
            reference.close()
            raise

    @classmethod
    def remote(cls, model: Any, client: Any, *, privacy: Any, variant: str | None = None, **kw: Any) -> "ShadowChecker":
        """A checker whose reference is ``remote_model(model.package, client, privacy=privacy)``
        (``variant``: whose specs the server serves, default the package's reference variant).
        Nothing leaves the device unless ``privacy`` allows it: refused samples are counted as
        ``privacy_blocked``. Other keywords go to the checker."""
        from ..remote.session import remote_model

        reference = remote_model(
            model.package, client, privacy=privacy, profile=model.detection.profile, variant=variant, root=model.options.root
        )
        return cls(model, reference, owns_reference=True, **kw)

    # -- hooks on the request path ---------------------------------------------------------

    def predict(self, inputs: np.ndarray | Mapping[str, np.ndarray], *, top_k: int | None = None) -> Any:
        """``model.predict(inputs)``, returned unchanged; the request is offered to the checker."""
        r = self.model.predict(inputs, top_k=top_k)
        self.observe(inputs, r)
        return r

    def predict_image(self, image: Any, *, color: str = "RGB", top_k: int | None = None) -> Any:
        """``model.predict_image(image)``, returned unchanged; the request is offered to the
        checker (the reference gets the same preprocessed tensor when its inputs are the model's,
        else the image)."""
        prepared = self.model.prepare_image(image, color=color)
        r = self.model.predict_prepared(prepared, top_k=top_k)
        if self._same_inputs:
            self.observe(prepared, r)
        elif self._sample():
            self._offer(None, False, image, color, r)
        return r

    def observe(self, inputs: Any, result: Any) -> None:
        """Offer a request the caller ran itself: ``inputs`` as given to ``model.predict`` (an
        array or a mapping) or the ``PreparedImage`` given to ``predict_prepared``, and its
        ``result``. Never raises for the reference's sake and never waits for it."""
        if not self._sample():
            return
        from ..model import PreparedImage

        if isinstance(inputs, PreparedImage):
            if not self._same_inputs:  # the reference needs other tensors, and the image is gone
                with self._lock:
                    self._count_error(ShadowError("the reference's inputs differ from the model's; use checker.predict_image"))
                return
            self._offer(inputs.feeds, True, None, "RGB", result)
        else:
            self._offer(inputs, False, None, "RGB", result)

    def _sample(self) -> bool:
        n = next(self._counter)
        if self._closed:
            return False
        if self.rate is None:
            hit = n % self.sample_every == 0
        else:
            hit = self._rng.random() < self.rate
        if hit:
            with self._lock:
                self._c["sampled"] += 1
        return hit

    def _input_names(self, feeds: Any, image: Any) -> list[str]:
        """The names the reference would send: the mapping's keys, else its (image) input."""
        if isinstance(feeds, Mapping) and image is None:
            return list(feeds)
        state = {st.input for st in self.reference.manifest.state}
        specs = [s for s in self.reference.inputs if s.name not in state]
        if image is not None:
            specs = [s for s in specs if s.preprocess is not None] or specs
        return [s.name for s in specs]

    def _offer(self, feeds: Any, prepared: bool, image: Any, color: str, result: Any) -> None:
        if self._privacy is not None:
            from ..remote.errors import PrivacyError

            try:
                self._privacy.check(self._remote_name, self._input_names(feeds, image), self._region)
            except PrivacyError:
                with self._lock:
                    self._c["privacy_blocked"] += 1
                return
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            if self._in_flight >= self.max_in_flight:
                self._c["skipped_busy"] += 1
                return
            if self.max_busy_fraction is not None:
                pending = self._in_flight * (self._ewma_s or 0.0)
                if (self._busy_s + pending) > self.max_busy_fraction * (now - self._t0):
                    self._c["skipped_budget"] += 1
                    return
            if self.max_per_s is not None:
                self._tokens = min(1.0, self._tokens + (now - self._t_tokens) * self.max_per_s)
                self._t_tokens = now
                if self._tokens < 1.0:
                    self._c["skipped_budget"] += 1
                    return
                self._tokens -= 1.0
            self._in_flight += 1
            self._c["submitted"] += 1
            self._ensure_worker()
        try:
            job = _Job(
                _copy_feeds(feeds) if feeds is not None else None,
                prepared,
                None if image is None else _copy_image(image),
                color,
                _Snapshot(result),
            )
        except Exception as e:  # a result without outputs (not a Result) or inputs numpy cannot copy
            with self._lock:
                self._in_flight -= 1
                self._count_error(e)
            return
        self._queue.put(job)

    def _ensure_worker(self) -> None:
        if self._thread is None:
            # The thread holds the checker weakly between jobs: a checker dropped without close()
            # is collected, and its finalizer stops the thread.
            self._thread = threading.Thread(
                target=_worker, args=(weakref.ref(self), self._queue), name=f"edge-sdk-shadow-{self.name}", daemon=True
            )
            self._thread.start()
            weakref.finalize(self, self._queue.put, _STOP)

    # -- the background worker -------------------------------------------------------------

    def _handle(self, job: _Job) -> None:
        """Run the reference on one job, compare, count (the worker thread)."""
        t0 = time.monotonic()
        try:
            ref = self._run_reference(job)
            dt = time.monotonic() - t0
            agree = self._agree(job.result, ref)
            rows = [bool(agree)] if isinstance(agree, (bool, np.bool_)) else [bool(x) for x in agree]
        except Exception as e:
            dt = time.monotonic() - t0
            self.latency.record_s(dt)
            with self._lock:
                self._busy_s += dt
                self._in_flight -= 1
                self._count_error(e)
            _log.debug("shadow checker %s: the reference failed: %s", self.name, e)
            return
        self.latency.record_s(dt)
        with self._lock:
            self._busy_s += dt
            self._ewma_s = dt if self._ewma_s is None else 0.8 * self._ewma_s + 0.2 * dt
            self._in_flight -= 1
            self._c["checked"] += 1
            self._c["rows_checked"] += len(rows)
            self._c["rows_agreed"] += sum(rows)
            self._ring.extend(rows)
            ev = self._evaluate()
        if ev is not None:
            self._listeners.emit(ev)

    def _run_reference(self, job: _Job) -> Any:
        ref = self.reference
        if job.image is not None:
            return ref.predict_image(job.image, color=job.color)
        if job.prepared:
            from ..model import PreparedImage

            return ref.predict_prepared(PreparedImage(ref, job.feeds, job.result.transform, 0, 0))
        return ref.predict(job.feeds)

    def _count_error(self, e: BaseException) -> None:
        self._c["errors"] += 1
        t = type(e).__name__
        self._error_types[t] = self._error_types.get(t, 0) + 1

    def _evaluate(self) -> QualityEvent | None:
        n = len(self._ring)
        if n < self.min_rows:
            return None
        rate = sum(self._ring) / n
        self._ind.value = rate
        if not self._ind.step(rate < self.threshold, rate >= self.exit_threshold, self.consecutive):
            return None
        detail = {
            "agreement": round(rate, 6), "window_rows": n, "threshold": self.threshold, "exit_threshold": self.exit_threshold,
            "reference": self.reference_label, "primary": self.model.variant.id,
        }  # fmt: skip
        ev = QualityEvent(
            "entered" if self._ind.alarm else "left", INDICATOR, rate, detail, self._c["rows_checked"], self._requests(), time.time()
        )
        self.events.append(ev)
        return ev

    # -- reading and lifecycle -------------------------------------------------------------

    def subscribe(self, callback: Callable[[QualityEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` on every :class:`~edge_sdk.quality.QualityEvent` of indicator
        ``shadow_disagreement`` (kind entered | left; value: the rolling agreement rate), from the
        checker's worker thread; exceptions are logged, never raised. Returns an unsubscribe function."""
        return self._listeners.add(callback)

    def _requests(self) -> int:
        return _count_value(self._counter)

    @property
    def reference_label(self) -> str:
        """``local:<variant id>`` or ``remote:<endpoint url>``."""
        if self.kind == "remote":
            from ..remote.session import RemoteSession  # loaded already: the reference is remote

            s = self.reference.session
            assert isinstance(s, RemoteSession)  # what remote_model opens
            return f"remote:{s.client.endpoint.url}"
        return f"local:{self.reference.variant.id}"

    @property
    def alarm(self) -> bool:
        """True while the rolling agreement is in the ``shadow_disagreement`` alarm."""
        return self._ind.alarm

    @property
    def in_flight(self) -> int:
        """Requests queued or running on the reference now."""
        return self._in_flight

    @property
    def agreement(self) -> float | None:
        """Rolling agreement rate over the last ``window`` rows (None before any check)."""
        with self._lock:
            return sum(self._ring) / len(self._ring) if self._ring else None

    @property
    def agreement_total(self) -> float | None:
        """Agreement rate over every row checked (None before any check)."""
        with self._lock:
            n = self._c["rows_checked"]
            return self._c["rows_agreed"] / n if n else None

    @property
    def counts(self) -> dict[str, int]:
        """requests, sampled, submitted, checked, rows_checked, rows_agreed, skipped_budget,
        skipped_busy, privacy_blocked, errors."""
        with self._lock:
            return {"requests": self._requests(), **self._c}

    def status(self) -> dict[str, Any]:
        """A JSON-ready snapshot: counts, agreement (window, total), alarm, in flight, the
        reference's busy time and latency percentiles (ms), errors by type."""
        pct = self.latency.percentiles((50.0, 90.0, 99.0))
        with self._lock:
            n = self._c["rows_checked"]
            return {
                "name": self.name, "primary": self.model.variant.id, "reference": self.reference_label, "requests": self._requests(),
                **self._c, "agreement": (sum(self._ring) / len(self._ring)) if self._ring else None,
                "agreement_total": self._c["rows_agreed"] / n if n else None, "window_rows": len(self._ring), "alarm": self._ind.alarm,
                "in_flight": self._in_flight, "reference_busy_s": self._busy_s, "uptime_s": time.monotonic() - self._t0,
                "reference_latency_ms": {f"p{round(q)}": (None if v is None else v * 1e3) for q, v in pct.items()},
                "errors_by_type": dict(self._error_types),
            }  # fmt: skip

    def samples(self) -> list[Sample]:
        """The Prometheus samples (:class:`edge_sdk.telemetry.Sample`) described at :func:`shadow_samples`."""
        st = self.status()
        lab = {"model": str(st["name"]), "reference": st["reference"]}
        out = [
            Sample("edge_sdk_shadow_agreement", st["agreement"], "share of checked rows where the model agreed with the reference", "gauge", {**lab, "scope": "window"}),
            Sample("edge_sdk_shadow_agreement", st["agreement_total"], "share of checked rows where the model agreed with the reference", "gauge", {**lab, "scope": "total"}),
            Sample("edge_sdk_shadow_disagreement", 1.0 if st["alarm"] else 0.0, "1 while the rolling agreement is in alarm", "gauge", lab),
            Sample("edge_sdk_shadow_requests_total", st["requests"], "requests the shadow checker saw", "counter", lab),
            Sample("edge_sdk_shadow_sampled_total", st["sampled"], "requests sampled for a shadow check", "counter", lab),
            Sample("edge_sdk_shadow_checked_total", st["checked"], "requests answered by the reference and compared", "counter", lab),
            Sample("edge_sdk_shadow_rows_checked_total", st["rows_checked"], "rows compared with the reference", "counter", lab),
            Sample("edge_sdk_shadow_rows_agreed_total", st["rows_agreed"], "rows where the model agreed with the reference", "counter", lab),
            Sample("edge_sdk_shadow_errors_total", st["errors"], "reference calls that failed", "counter", lab),
            Sample("edge_sdk_shadow_in_flight", st["in_flight"], "requests queued or running on the reference", "gauge", lab),
            Sample("edge_sdk_shadow_reference_busy_seconds_total", st["reference_busy_s"], "time the reference spent answering", "counter", lab),
        ]  # fmt: skip
        for reason, key in (("budget", "skipped_budget"), ("busy", "skipped_busy"), ("privacy", "privacy_blocked")):
            out.append(
                Sample(
                    "edge_sdk_shadow_skipped_total",
                    st[key],
                    "sampled requests not checked, by reason",
                    "counter",
                    {**lab, "reason": reason},
                )
            )
        out += self.latency.histogram_samples("edge_sdk_shadow_reference_latency_seconds", "reference call duration", lab)
        return out

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until nothing is queued or running on the reference (at most ``timeout_s``);
        True when idle. For tests and orderly shutdown, never needed on the request path."""
        end = time.monotonic() + timeout_s
        while self._in_flight > 0:
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop sampling, let the worker finish what is queued (at most ``timeout_s``), and close
        the reference when the checker made it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            t = self._thread
        if t is not None:
            self._queue.put(_STOP)
            t.join(timeout_s)
        while t is None or not t.is_alive():  # a job offered while closing, queued behind the stop: dropped
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP:
                with self._lock:
                    self._in_flight -= 1
        if self.owns_reference and (t is None or not t.is_alive()):
            self.reference.close()

    def __enter__(self) -> "ShadowChecker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- telemetry: edge_sdk.telemetry Registry.track / EventLog.watch --------------------------------

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "shadow", label ``model`` = ``name`` (which becomes the checker's name) or its name."""
        if name is not None:
            self.name = name
        return "shadow", self.name

    def telemetry_samples(self, label: str | None = None) -> list[Sample]:
        """``Registry.track``: :meth:`samples`."""
        return self.samples()

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Any = None) -> Callable[[], None]:
        """``EventLog.watch``: the disagreement alarm entered and left, as "quality" events. Returns the unsubscribe."""
        return watch_quality_events(self, emit, name or self.name or "model")

    def __repr__(self) -> str:
        return f"ShadowChecker({self.name!r}, {self.model.variant.id} vs {self.reference_label}, agreement={self.agreement})"


def _worker(ref: "weakref.ReferenceType[ShadowChecker]", jobs: "queue.Queue[Any]") -> None:
    while True:
        job = jobs.get()
        checker = ref() if job is not _STOP else None
        if checker is None:
            return
        checker._handle(job)
        del checker


def _copy_image(image: Any) -> Any:
    if isinstance(image, np.ndarray):
        return np.array(image, copy=True)
    return image  # a path: read by the reference's predict_image


def shadow_samples(checker: ShadowChecker) -> Callable[[], list[Sample]]:
    """A telemetry collector (``Registry.add`` / ``Registry.track``) for a checker, labels
    ``model`` and ``reference``: agreement rate (``scope`` window | total), alarm, requests,
    sampled, checked and agreed rows, skips by ``reason`` (budget | busy | privacy), reference
    errors, in flight, reference busy seconds and a reference latency histogram."""
    return checker.samples
