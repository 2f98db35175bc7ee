"""One error for bad options everywhere: every ``*Options`` / ``*Policy`` / ``Budget`` /
``Thresholds`` field and every argument that configures behaviour (a rate, size, threshold, mode,
a name from a fixed set) is rejected with :class:`~edge_sdk.errors.OptionsError` (a ValueError),
or :class:`~edge_sdk.errors.OptionsTypeError` (also a TypeError) for a wrong type, and the message
names the option."""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable

import numpy as np
import pytest

import edge_sdk
from edge_sdk.backends.base import SessionOptions
from edge_sdk.backends.sandbox import check_load
from edge_sdk.bench.options import BenchOptions
from edge_sdk.budget.actions import LowerRate
from edge_sdk.budget.governor import Budget, Governor
from edge_sdk.budget.simulator import ThermalModel, ThermalSimulator
from edge_sdk.budget.types import SensorSnapshot, finite_number
from edge_sdk.errors import EdgeSDKError, OptionsError, OptionsTypeError
from edge_sdk.model import LoadOptions
from edge_sdk.pipelines import CallbackSink, PipelineOptions, SourceOptions
from edge_sdk.pipelines.sources import Backoff
from edge_sdk.processing.decoders import decode_classification
from edge_sdk.processing.detection import decode_yolo, nms, ssd_anchors
from edge_sdk.processing.segmentation import decode_segmentation
from edge_sdk.quality.monitor import MonitorThresholds
from edge_sdk.remote.breaker import CircuitBreaker
from edge_sdk.remote.errors import RemoteConfigError, RemoteError
from edge_sdk.remote.privacy import PrivacyPolicy
from edge_sdk.remote.retry import RetryBudget, RetryPolicy
from edge_sdk.remote.router import RouterOptions
from edge_sdk.result_cache import ResultCache
from edge_sdk.serve.options import ServeOptions
from edge_sdk.streams.signal import SignalConfigError, SignalStreamOptions
from edge_sdk.telemetry import EventLog, Registry

_YOLO = np.zeros((1, 4, 6), np.float32)  # [1, N, 6]: "xyxy+score+class"


def _snapshot() -> SensorSnapshot:
    return SensorSnapshot(timestamp_ms=0.0, temp_c=None)


def _governor() -> Governor:
    return Governor(_snapshot, Budget(soft_c=70, hard_c=80))


def _track_twice() -> None:
    reg, gov = Registry(), _governor()
    reg.track(gov, name="g")
    reg.track(gov, name="g")


#: (id, what raises, a word the message must hold: the option's name)
BAD_VALUES: list[tuple[str, Callable[[], Any], str]] = [
    ("load(threads=0)", lambda: edge_sdk.load("no-such-package", threads=0), "threads"),
    ("LoadOptions.min_cosine", lambda: LoadOptions(min_cosine=2.0), "min_cosine"),
    ("LoadOptions.measure_runs", lambda: LoadOptions(measure_runs=0), "measure_runs"),
    ("LoadOptions.result_cache", lambda: LoadOptions(result_cache=-1), "result_cache"),
    ("SessionOptions.threads", lambda: SessionOptions(threads=0), "threads"),
    ("SessionOptions.graph_optimization", lambda: SessionOptions(graph_optimization="max"), "graph_optimization"),
    ("PipelineOptions.queue_size", lambda: PipelineOptions(queue_size=0), "queue_size"),
    ("PipelineOptions.rate_mode", lambda: PipelineOptions(rate_mode="fastest"), "rate_mode"),
    ("PipelineOptions.max_fps", lambda: PipelineOptions(max_fps=-1), "max_fps"),
    ("SourceOptions.fps", lambda: SourceOptions(fps=0), "fps"),
    ("SourceOptions.flip_method", lambda: SourceOptions(flip_method=9), "flip_method"),
    ("Backoff.multiplier", lambda: Backoff(multiplier=0.5), "multiplier"),
    ("SignalStreamOptions.window", lambda: SignalStreamOptions(sample_rate_hz=16000, window=0), "window"),
    ("SignalStreamOptions.gap_policy", lambda: SignalStreamOptions(sample_rate_hz=16000, window=16, gap_policy="ignore"), "gap_policy"),
    ("RouterOptions.deadline_s", lambda: RouterOptions(deadline_s=0), "deadline_s"),
    ("RouterOptions.cascade_threshold", lambda: RouterOptions(cascade_threshold=1.5), "cascade_threshold"),
    ("RetryPolicy.max_attempts", lambda: RetryPolicy(max_attempts=0), "max_attempts"),
    ("RetryBudget.ratio", lambda: RetryBudget(ratio=2.0), "ratio"),
    ("RetryBudget.window_s", lambda: RetryBudget(window_s=0), "window_s"),
    ("CircuitBreaker.failure_ratio", lambda: CircuitBreaker(failure_ratio=0), "failure_ratio"),
    ("CircuitBreaker.min_calls", lambda: CircuitBreaker(min_calls=0), "min_calls"),
    ("PrivacyPolicy.mode", lambda: PrivacyPolicy(mode="sometimes"), "mode"),
    ("PrivacyPolicy.allow_inputs", lambda: PrivacyPolicy(mode="allowlist"), "allow_inputs"),
    ("ServeOptions.queue_size", lambda: ServeOptions(queue_size=0), "queue_size"),
    ("ServeOptions.max_queue_delay_ms", lambda: ServeOptions(max_queue_delay_ms=-1), "max_queue_delay_ms"),
    ("BenchOptions.warmup", lambda: BenchOptions(warmup=-1), "warmup"),
    ("BenchOptions.input_mode", lambda: BenchOptions(input_mode="video"), "input_mode"),
    ("MonitorThresholds.consecutive", lambda: MonitorThresholds(consecutive=0), "consecutive"),
    ("Budget.soft_c", lambda: Budget(soft_c=90, hard_c=80), "soft_c"),
    ("Budget.unknown_policy", lambda: Budget(soft_c=70, hard_c=80, unknown_policy="guess"), "unknown_policy"),
    ("Budget.power_budget_w", lambda: Budget(soft_c=70, hard_c=80, power_budget_w=0), "power_budget_w"),
    ("finite_number", lambda: finite_number("soft_c", float("nan")), "soft_c"),
    ("LowerRate.factor", lambda: LowerRate([], factor=2.0), "factor"),
    ("ThermalModel.tau_s", lambda: ThermalModel(tau_s=0), "tau_s"),
    ("ThermalSimulator.workers", lambda: ThermalSimulator("/no-such-zone-root", workers=0), "workers"),
    ("sandbox limits", lambda: check_load("onnxruntime", b"", memory_limit_mb=1), "memory_limit_mb"),
    ("sandbox backend", lambda: check_load("tensorrt", b""), "backend"),
    ("ResultCache capacity", lambda: ResultCache(0, b""), "result_cache"),
    ("EventLog", lambda: EventLog(), "path"),
    ("Registry.track duplicate name", _track_twice, "name"),
    ("decode_yolo.score_threshold", lambda: decode_yolo(_YOLO, layout="xyxy+score+class", score_threshold=2.0), "score_threshold"),
    ("nms.iou_threshold", lambda: nms(np.zeros((0, 4)), np.zeros(0), iou_threshold=-0.1), "iou_threshold"),
    ("decode_yolo.layout", lambda: decode_yolo(_YOLO, layout="yxyx"), "layout"),
    ("decode_yolo.normalized", lambda: decode_yolo(_YOLO, layout="xyxy+score+class", normalized=True), "input_size"),
    ("nms.max_detections", lambda: nms(np.zeros((0, 4)), np.zeros(0), max_detections=0), "max_detections"),
    ("ssd_anchors.strides", lambda: ssd_anchors(num_layers=2, input_size_hw=(128, 128), strides=[8], min_scale=0.1, max_scale=0.9), "strides"),
    ("decode_segmentation.threshold", lambda: decode_segmentation(np.zeros((1, 1, 4, 4), np.float32), layout="NCHW", threshold=2), "threshold"),
    ("decode_segmentation.activation", lambda: decode_segmentation(np.zeros((1, 1, 4, 4), np.float32), layout="NCHW", activation="relu"), "activation"),
    ("decode_classification.temperature", lambda: decode_classification(np.zeros((1, 3), np.float32), ("a", "b", "c"), temperature=-1.0), "temperature"),
]  # fmt: skip

#: (id, what raises, the option's name): a wrong type
BAD_TYPES: list[tuple[str, Callable[[], Any], str]] = [
    ("SourceOptions.reconnect", lambda: SourceOptions(reconnect=3), "reconnect"),  # type: ignore[arg-type]
    ("CallbackSink", lambda: CallbackSink(42), "CallbackSink"),  # type: ignore[arg-type]
    ("EventLog.callback", lambda: EventLog(callback=42), "callback"),  # type: ignore[arg-type]
    ("Registry.add", lambda: Registry().add(42), "collector"),  # type: ignore[arg-type]
    ("Governor budget", lambda: Governor(_snapshot, {"soft_c": 70}), "budget"),  # type: ignore[arg-type]
    ("Governor action", lambda: Governor(_snapshot, Budget(soft_c=70, hard_c=80), actions=[object()]), "action"),  # type: ignore[list-item]
]  # fmt: skip


@pytest.mark.parametrize("make, option", [pytest.param(f, o, id=i) for i, f, o in BAD_VALUES])
def test_a_bad_option_is_an_options_error(make: Callable[[], Any], option: str) -> None:
    with pytest.raises(OptionsError) as e:
        make()
    assert isinstance(e.value, ValueError) and isinstance(e.value, EdgeSDKError)
    assert option in str(e.value), f"the message does not name {option!r}: {e.value}"


@pytest.mark.parametrize("make, option", [pytest.param(f, o, id=i) for i, f, o in BAD_TYPES])
def test_an_option_of_the_wrong_type_is_an_options_type_error(make: Callable[[], Any], option: str) -> None:
    with pytest.raises(OptionsTypeError) as e:
        make()
    assert isinstance(e.value, TypeError) and isinstance(e.value, OptionsError) and isinstance(e.value, ValueError)
    assert option in str(e.value), f"the message does not name {option!r}: {e.value}"


def test_the_subsystem_option_errors_are_options_errors() -> None:
    assert issubclass(OptionsError, EdgeSDKError) and issubclass(OptionsError, ValueError)
    assert issubclass(OptionsTypeError, OptionsError) and issubclass(OptionsTypeError, TypeError)
    assert issubclass(SignalConfigError, OptionsError)
    assert issubclass(RemoteConfigError, OptionsError) and issubclass(RemoteConfigError, RemoteError)
    with pytest.raises(SignalConfigError):
        SignalStreamOptions(sample_rate_hz=0, window=16)


# --- every option dataclass: whatever it rejects, it rejects with OptionsError ------------------

_OPTION_MODULES = [
    "edge_sdk.model", "edge_sdk.backends.base", "edge_sdk.pipelines.vision", "edge_sdk.pipelines.sources",
    "edge_sdk.streams.signal", "edge_sdk.budget.governor", "edge_sdk.budget.simulator", "edge_sdk.serve.options",
    "edge_sdk.remote.router", "edge_sdk.remote.retry", "edge_sdk.remote.privacy", "edge_sdk.bench.options",
    "edge_sdk.quality.monitor",
]  # fmt: skip
_OPTION_NAME = re.compile(r"(Options|Policy|Thresholds|Budget|Backoff|ThermalModel)$")
_REQUIRED = {"SignalStreamOptions": {"sample_rate_hz": 16000, "window": 16}, "Budget": {"soft_c": 70, "hard_c": 80}}


def _option_classes() -> list[type]:
    out = []
    for mod_name in _OPTION_MODULES:
        mod = importlib.import_module(mod_name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod_name and _OPTION_NAME.search(obj.__name__):
                out.append(obj)
    return out


def test_the_walk_finds_the_option_classes() -> None:
    names = {c.__name__ for c in _option_classes()}
    assert {"LoadOptions", "SessionOptions", "PipelineOptions", "SourceOptions", "SignalStreamOptions", "Budget", "ThermalModel",
            "ServeOptions", "RouterOptions", "RetryPolicy", "PrivacyPolicy", "BenchOptions", "MonitorThresholds"} <= names  # fmt: skip


@pytest.mark.parametrize("cls", _option_classes(), ids=lambda c: c.__name__)
def test_every_option_field_is_rejected_with_an_options_error(cls: type) -> None:
    """Each number field set to -1 (and to its negation) and each name field to an unknown name:
    when the class refuses the value (a ValueError), that is an OptionsError."""
    base = _REQUIRED.get(cls.__name__, {})
    defaults = cls(**base)  # the defaults are valid
    stray, refused = [], 0
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        v = getattr(defaults, f.name)
        if isinstance(v, bool) or v is None:
            continue
        bads: tuple[Any, ...] = (-1, -v) if isinstance(v, (int, float)) else ("no-such-value",) if isinstance(v, str) else ()
        for bad in bads:
            try:
                cls(**{**base, f.name: bad})
            except ValueError as e:
                refused += 1
                if not isinstance(e, OptionsError):
                    stray.append(f"{cls.__name__}({f.name}={bad!r}): {type(e).__name__}: {e}")
    assert not stray, "bad options not raised as OptionsError:\n" + "\n".join(stray)
    assert refused, f"{cls.__name__} refused none of the bad values tried"
