"""An opt-in LRU cache of a model's raw outputs, keyed by what determines them.

``edge_sdk.load(pkg, result_cache=256)`` keeps the outputs of the last 256 distinct inputs. The
key is the SHA-256 of the model file's digest, the variant id, the I/O mode (``raw_io``), every
input's preprocessing spec and each input tensor's name, dtype, shape and bytes, as the model is
fed them (after validation; for ``predict_image`` the preprocessed tensor, so two images that
preprocess to the same tensor share an entry). A hit returns the stored outputs without running
the model; the decoder still runs, with the call's own ``top_k`` and image transform, so a hit's
``decoded`` equals a miss's for the same call.

The stored arrays are copies made read-only: a hit can never hand out an array another caller
may change (``np.array(r.outputs[k])`` for a writable copy). A miss returns the runtime's own
(writable) arrays, as without the cache.

A cache is refused (:class:`~edge_sdk.errors.ResultCacheError`) where the output is not a
function of the input alone: a manifest with ``state`` pairs (streaming models) and
``model.stream()``. A model that samples (random decoding) would be the same case; manifests have
no field that says so, so it is the caller's to leave the cache off for one.

Thread-safe: lookups and inserts take one lock (the model runs outside it; two threads that miss
the same key both run the model, and the second insert replaces the first with equal outputs).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from .errors import OptionsError


class CacheStats(NamedTuple):
    """Counters of one :class:`ResultCache`: ``hits``, ``misses``, ``evictions`` (LRU drops),
    ``size`` (entries now) and ``capacity``."""

    hits: int
    misses: int
    evictions: int
    size: int
    capacity: int

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses), None before the first lookup."""
        n = self.hits + self.misses
        return self.hits / n if n else None


def key_prefix(model_sha256: str, variant_id: str, specs: Iterable[Any], raw_io: bool) -> bytes:
    """The part of every key that is fixed for one loaded model: digest, variant, I/O mode and
    each input's preprocessing spec (``repr`` of frozen dataclasses: stable across runs)."""
    h = hashlib.sha256()
    h.update(f"edge-sdk result cache v1\0{model_sha256}\0{variant_id}\0raw_io={bool(raw_io)}\0".encode())
    for s in specs:
        h.update(f"{s.name}\0{s.dtype}\0{s.preprocess!r}\0".encode())
    return h.digest()


def input_key(prefix: bytes, feeds: Mapping[str, np.ndarray]) -> bytes:
    """SHA-256 of ``prefix`` and each input's name, dtype, shape and bytes (by name)."""
    h = hashlib.sha256(prefix)
    for name in sorted(feeds):
        x = feeds[name]
        h.update(f"\0{name}\0{x.dtype.str}\0{x.shape}\0".encode())
        h.update(np.ascontiguousarray(x).data.cast("B"))  # .data: the array's memoryview
    return h.digest()


def _frozen(outs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in outs.items():
        a = np.array(v, copy=True)
        a.setflags(write=False)
        out[k] = a
    return out


class ResultCache:
    """A bounded LRU map key -> read-only output arrays, with hit/miss/eviction counters.

    ``on_lookup(hit)`` (optional) is called after each lookup, outside the lock: the model's
    telemetry counts hits and misses through it."""

    def __init__(self, capacity: int, prefix: bytes, on_lookup: Callable[[bool], Any] | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise OptionsError(f"result_cache: expected an int >= 1 (entries), got {capacity!r}")
        self.capacity = capacity
        self._prefix = prefix
        self._on_lookup = on_lookup
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()
        self._hits = self._misses = self._evictions = 0

    def key(self, feeds: Mapping[str, np.ndarray]) -> bytes:
        """The key of ``feeds`` for this model."""
        return input_key(self._prefix, feeds)

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The stored outputs (read-only arrays, a new dict) or None; counts a hit or a miss."""
        with self._lock:
            outs = self._entries.get(key)
            if outs is None:
                self._misses += 1
            else:
                self._entries.move_to_end(key)
                self._hits += 1
        if self._on_lookup is not None:
            self._on_lookup(outs is not None)
        return None if outs is None else dict(outs)

    def put(self, key: bytes, outs: Mapping[str, np.ndarray]) -> None:
        """Store read-only copies of ``outs`` under ``key``, dropping the least recently used
        entry when full."""
        frozen = _frozen(outs)
        with self._lock:
            self._entries[key] = frozen
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
                self._evictions += 1

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def stats(self) -> CacheStats:
        """The counters now."""
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries), self.capacity)

    def __repr__(self) -> str:
        s = self.stats()
        return f"ResultCache({s.size}/{s.capacity} entries, {s.hits} hits, {s.misses} misses)"
