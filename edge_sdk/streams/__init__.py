"""Streams: feed a model from live sources.

:mod:`edge_sdk.streams.signal` cuts sampled signals (audio, IMU, any sensor) into model
windows with timestamp checks, gap and ordering policies, per-stream model state and a
router for many streams (batching across streams; stateful models too when their state
pairs declare ``batch_axis``)::

    from edge_sdk.streams import SignalStream, SignalStreamOptions, StreamRouter

Importing this package imports numpy only; no runtime is loaded until a model is.
"""

from __future__ import annotations

from .signal import *  # noqa: F403  (every name signal exports, one list: signal.__all__)
from .signal import __all__ as __all__
