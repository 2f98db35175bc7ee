"""Per-model generation telemetry: TTFT, TPOT and tokens/s histograms, prompt and generated token
counters, generations by finish reason, KV bytes in use and allocated.

Exposed through ``Registry.track(model)`` (:mod:`edge_sdk.telemetry.exposition`) like any model:
``edge_sdk_generation_ttft_seconds``, ``edge_sdk_generation_tpot_seconds`` (histograms, the
SDK's fixed exponential buckets), ``edge_sdk_generation_tokens_per_second`` (a histogram with
buckets 1 .. 1000 tokens/s), ``edge_sdk_generation_prompt_tokens_total``,
``edge_sdk_generation_generated_tokens_total``, ``edge_sdk_generation_requests_total{finish_reason}``,
``edge_sdk_generation_kv_bytes{kind="in_use"|"allocated"}``.
"""

from __future__ import annotations

import threading
from bisect import bisect_left

from ..telemetry.core import Histogram, Provenance, Sample, _histogram_samples, format_value

__all__ = ["GenerationTelemetry", "TOKENS_PER_S_BUCKETS"]

#: Upper edges of the tokens/s histogram.
TOKENS_PER_S_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


class GenerationTelemetry:
    """Counters and histograms of one decoder model (thread-safe)."""

    def __init__(self, provenance: Provenance, kv_bytes_allocated: int) -> None:
        self.provenance = provenance
        self.labels = provenance.labels()
        self.ttft = Histogram()
        self.tpot = Histogram()
        self._tps = [0] * (len(TOKENS_PER_S_BUCKETS) + 1)
        self._tps_sum = 0.0
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.by_reason: dict[str, int] = {}
        self.kv_bytes_allocated = kv_bytes_allocated
        self.kv_bytes_in_use = 0
        self.errors: dict[str, int] = {}

    def record(self, prompt_tokens: int, generated: int, finish_reason: str, ttft_s: float, tpot_s: float | None) -> None:
        """One finished generation."""
        self.ttft.record_s(ttft_s)
        if tpot_s:
            self.tpot.record_s(tpot_s)
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += generated
            self.by_reason[finish_reason] = self.by_reason.get(finish_reason, 0) + 1
            if tpot_s:
                tps = 1.0 / tpot_s
                self._tps[bisect_left(TOKENS_PER_S_BUCKETS, tps)] += 1
                self._tps_sum += tps

    def error(self, exc: BaseException) -> None:
        """A generation that raised."""
        with self._lock:
            t = type(exc).__name__
            self.errors[t] = self.errors.get(t, 0) + 1

    def snapshot(self) -> dict[str, object]:
        """The figures now, as a dict (percentiles in ms)."""
        with self._lock:
            d: dict[str, object] = {
                "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens,
                "requests": dict(self.by_reason),
                "errors": dict(self.errors),
                "kv_bytes_in_use": self.kv_bytes_in_use,
                "kv_bytes_allocated": self.kv_bytes_allocated,
            }
        for name, h in (("ttft_ms", self.ttft), ("tpot_ms", self.tpot)):
            d[name] = {f"p{q:g}": (None if v is None else v * 1e3) for q, v in h.percentiles((50.0, 90.0, 99.0)).items()}
        return d

    def samples(self) -> list[Sample]:
        """Prometheus samples (see the module docs)."""
        lab = dict(self.labels)
        out = [Sample("edge_sdk_model_info", 1, "provenance of each model loaded (value 1)", "gauge", self.provenance.to_dict())]
        out += _histogram_samples(self.ttft.snapshot(), "edge_sdk_generation_ttft_seconds", "time to first token", lab)
        out += _histogram_samples(self.tpot.snapshot(), "edge_sdk_generation_tpot_seconds", "time per output token after the first", lab)
        with self._lock:
            cum = 0
            for edge, n in zip(TOKENS_PER_S_BUCKETS, self._tps):
                cum += n
                out.append(Sample("edge_sdk_generation_tokens_per_second_bucket", cum, "decode tokens/s per generation", "histogram", {**lab, "le": format_value(edge)}))
            cum += self._tps[-1]
            out.append(Sample("edge_sdk_generation_tokens_per_second_bucket", cum, "decode tokens/s per generation", "histogram", {**lab, "le": "+Inf"}))
            out.append(Sample("edge_sdk_generation_tokens_per_second_sum", self._tps_sum, "decode tokens/s per generation", "histogram", lab))
            out.append(Sample("edge_sdk_generation_tokens_per_second_count", cum, "decode tokens/s per generation", "histogram", lab))
            out.append(Sample("edge_sdk_generation_prompt_tokens_total", self.prompt_tokens, "prompt tokens run", "counter", lab))
            out.append(Sample("edge_sdk_generation_generated_tokens_total", self.generated_tokens, "tokens generated", "counter", lab))
            for r, n in sorted(self.by_reason.items()):
                out.append(Sample("edge_sdk_generation_requests_total", n, "generations by finish reason", "counter", {**lab, "finish_reason": r}))
            for t, n in sorted(self.errors.items()):
                out.append(Sample("edge_sdk_generation_errors_total", n, "generations that raised, by exception type", "counter", {**lab, "type": t}))
            out.append(Sample("edge_sdk_generation_kv_bytes", self.kv_bytes_in_use, "KV cache bytes holding tokens now", "gauge", {**lab, "kind": "in_use"}))
            out.append(Sample("edge_sdk_generation_kv_bytes", self.kv_bytes_allocated, "KV cache bytes allocated", "gauge", {**lab, "kind": "allocated"}))
        return out
