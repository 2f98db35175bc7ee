"""What ``edge-sdk bench`` can be told: :class:`BenchOptions`, the scenario names, :class:`BenchError`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import EdgeSDKError, OptionsError

__all__ = ["SCENARIOS", "INPUT_MODES", "BenchError", "BenchOptions"]

#: The MLPerf Inference scenarios, in the order they run.
SCENARIOS: tuple[str, ...] = ("single-stream", "multi-stream", "server", "offline")
#: How queries are made: ``image`` (random uint8 frames through ``predict_image``), ``tensor``
#: (model-ready tensors through ``predict``), ``auto`` (image when the input declares preprocessing).
INPUT_MODES: tuple[str, ...] = ("auto", "image", "tensor")


class BenchError(EdgeSDKError):
    """A benchmark could not be set up or run (bad settings, nothing to measure, a cold-start child failed)."""


def named_variants(manifest: Any, statuses: Any, all_variants: bool, variants: Any, warnings: list[str]) -> list[str] | None:
    """The variant ids ``--all-variants`` (those whose backend is available here; the others get a warning)
    or ``--variant`` names (BenchError for an unknown one), or None when neither was given (the SDK selects)."""
    if all_variants:
        ids = []
        for v in manifest.variants:
            st = statuses.get(v.backend)
            if st is None or not st.available:
                warnings.append(f"variant {v.id} skipped: backend {v.backend} is not available here ({st.detail if st else 'unknown'})")
            else:
                ids.append(v.id)
        return ids
    if variants:
        known = [v.id for v in manifest.variants]
        unknown = [i for i in variants if i not in known]
        if unknown:
            raise BenchError(f"variant(s) {unknown} not in package {manifest.name}; it has {known}")
        return list(dict.fromkeys(variants))
    return None


def _positive(name: str, value: Any, *, integer: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        kind = "an int" if integer else "a number"
        raise OptionsError(f"{name}: expected {kind} > 0{' or None' if allow_none else ''}, got {value!r}")


@dataclass(frozen=True)
class BenchOptions:
    """Every setting of one benchmark run (all recorded in the JSON report, seed included).

    Scope: ``scenarios`` (names from :data:`SCENARIOS`); ``variants`` (ids; empty with
    ``all_variants`` False: the variant ``load`` selects here); ``vs_raw``: add a raw-runtime arm
    per variant (same verified bytes, same thread settings) and measure the SDK's overhead.
    Bounds, per target and scenario: ``duration_s`` of measured time, split over ``repetitions``
    interleaved blocks; ``count``: at most this many queries (offline: exactly this many, split
    over the repetitions); ``warmup``: queries run first, excluded from every count and reported.
    Inputs: ``seed``; ``input_mode`` (:data:`INPUT_MODES`); ``pool``: distinct inputs generated;
    ``image_hw``: frame size for image mode (default: the input's preprocess size).
    Loading: ``profile``, ``threads`` (None: the profile's), ``cache_dir``, ``root``.
    Multi-stream: ``streams`` at ``fps`` each; a frame is late when it finishes after
    ``deadline_ms`` from when it was due (default: one frame period).
    Server: Poisson arrivals at ``rate_qps`` (None: the highest rate the search found),
    ``objective_ms`` at ``objective_percentile``; ``search``: find the highest rate meeting it
    (doubling then bisection, at most ``max_probes`` probes of ``probe_s`` each, stopping when the
    bracket is within ``search_tolerance``, never above ``max_rate_qps``); ``server_workers``
    queries served at once.
    Offline: ``offline_batch`` (None: the model's largest batch; 1 or a fixed batch dim: a worker
    pool of ``offline_workers``, None: one per CPU).
    Cold start: ``cold_start`` on/off, ``cold_samples`` fresh processes per cache state.
    Remote: ``remote_url``: also measure the package's reference variant served there (Open
    Inference Protocol; the generated inputs are sent to it), bearer token from the environment
    variable ``remote_token_env``.
    Monitoring: ``sample_interval_s`` between sensor / governor / CPU samples.
    Report: ``keep_samples`` latencies kept per target and scenario for plots (evenly spaced).
    """

    scenarios: tuple[str, ...] = ("single-stream",)
    variants: tuple[str, ...] = ()
    all_variants: bool = False
    vs_raw: bool = False
    duration_s: float = 5.0
    count: int | None = None
    repetitions: int = 5
    warmup: int = 10
    seed: int = 0
    input_mode: str = "auto"
    pool: int = 16
    image_hw: tuple[int, int] | None = None
    profile: str | None = None
    threads: int | None = None
    cache_dir: str | None = None
    root: str = "/"
    streams: int = 4
    fps: float = 30.0
    deadline_ms: float | None = None
    rate_qps: float | None = None
    objective_ms: float = 15.0
    objective_percentile: float = 99.0
    search: bool = True
    probe_s: float = 1.0
    max_probes: int = 10
    search_tolerance: float = 0.1
    max_rate_qps: float = 20000.0
    server_workers: int = 1
    offline_batch: int | None = None
    offline_workers: int | None = None
    cold_start: bool = True
    cold_samples: int = 3
    sample_interval_s: float = 0.5
    keep_samples: int = 1000
    remote_url: str | None = None
    remote_token_env: str | None = None

    def __post_init__(self) -> None:
        scen = tuple(self.scenarios)
        object.__setattr__(self, "scenarios", scen)
        object.__setattr__(self, "variants", tuple(self.variants))
        if not scen:
            raise OptionsError(f"scenarios: expected at least one of {list(SCENARIOS)}")
        bad = [s for s in scen if s not in SCENARIOS]
        if bad:
            raise OptionsError(f"scenarios: unknown {bad}; expected names from {list(SCENARIOS)}")
        if len(set(scen)) != len(scen):
            raise OptionsError(f"scenarios: {list(scen)} names one twice")
        if self.all_variants and self.variants:
            raise OptionsError("variants and all_variants exclude each other")
        if self.input_mode not in INPUT_MODES:
            raise OptionsError(f"input_mode: expected one of {list(INPUT_MODES)}, got {self.input_mode!r}")
        for name in ("duration_s", "fps", "objective_ms", "probe_s", "max_rate_qps", "sample_interval_s", "search_tolerance"):
            _positive(name, getattr(self, name))
        for name in ("repetitions", "pool", "streams", "max_probes", "server_workers", "cold_samples", "keep_samples"):
            _positive(name, getattr(self, name), integer=True)
        for name in ("count", "threads", "offline_batch", "offline_workers"):
            _positive(name, getattr(self, name), integer=True, allow_none=True)
        for name in ("deadline_ms", "rate_qps"):
            _positive(name, getattr(self, name), allow_none=True)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise OptionsError(f"warmup: expected an int >= 0, got {self.warmup!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise OptionsError(f"seed: expected an int >= 0, got {self.seed!r}")
        if not 50.0 <= self.objective_percentile < 100.0:
            raise OptionsError(f"objective_percentile: expected a percentile in [50, 100), got {self.objective_percentile!r}")
        if self.search_tolerance >= 1:
            raise OptionsError(f"search_tolerance: expected a fraction in (0, 1), got {self.search_tolerance!r}")
        if self.image_hw is not None:
            hw = tuple(self.image_hw)
            if len(hw) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in hw):
                raise OptionsError(f"image_hw: expected (height, width) ints >= 1, got {self.image_hw!r}")
            object.__setattr__(self, "image_hw", hw)
        if "server" in scen and not self.search and self.rate_qps is None:
            raise OptionsError("server: without the rate search (search=False) a rate_qps is needed")
        if self.count is not None and self.count < self.repetitions:
            raise OptionsError(f"count: expected at least one query per repetition ({self.repetitions}), got {self.count}")

    @property
    def frame_deadline_ms(self) -> float:
        """Multi-stream deadline: ``deadline_ms`` or one frame period."""
        return self.deadline_ms if self.deadline_ms is not None else 1000.0 / self.fps

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (tuples as lists)."""
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        d["frame_deadline_ms"] = self.frame_deadline_ms
        return d
