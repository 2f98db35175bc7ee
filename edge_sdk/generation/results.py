"""What a generation returns: :class:`GenerationResult` (text, token ids, why it stopped, token
counts, timings, provenance, the governor's actions on it) and :class:`GenerationEvent`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..telemetry.core import Provenance

__all__ = ["FINISH_REASONS", "GenerationEvent", "GenerationResult", "GenerationTimings", "Usage"]

#: Why a generation ended: "stop" (an end-of-sequence token or a stop string), "length"
#: (``max_new_tokens``), "deadline" (``deadline_s`` passed), "cancelled" (``cancel()`` or the
#: ``cancel`` event was set from another thread).
FINISH_REASONS = ("stop", "length", "deadline", "cancelled")


@dataclass(frozen=True)
class Usage:
    """Token counts (OpenAI's ``usage`` names): ``prompt_tokens`` as run (after any truncation that was
    asked for), ``completion_tokens`` generated, and ``truncated_tokens`` dropped from the prompt's start."""

    prompt_tokens: int
    completion_tokens: int
    truncated_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """prompt + completion."""
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        """OpenAI-style dict, plus ``truncated_tokens``."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "truncated_tokens": self.truncated_tokens,
        }


@dataclass(frozen=True)
class GenerationTimings:
    """Milliseconds. ``ttft_ms``: call start to the first generated token (tokenize + prefill + the
    first sample); ``tpot_ms``: mean time per output token after the first; ``decode_ms``: the
    runtime's own time in decode steps (the rest of a token's time is the Python loop:
    sampling, detokenizing, stop checks); ``paused_ms``: time held by the governor (paused or
    paced), included in ``total_ms``."""

    ttft_ms: float
    tpot_ms: float | None
    total_ms: float
    prefill_ms: float
    decode_ms: float
    paused_ms: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens per second after the first (1000 / tpot_ms), None with < 2 tokens."""
        return None if not self.tpot_ms else 1000.0 / self.tpot_ms

    def to_dict(self) -> dict[str, float | None]:
        """Every figure, by name."""
        return {
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "tokens_per_s": self.tokens_per_s,
            "total_ms": self.total_ms,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "paused_ms": self.paused_ms,
        }


@dataclass(frozen=True)
class GenerationEvent:
    """Something that happened to a generation between tokens: the governor paced it ("pace"),
    paused it ("pause"), let it go on ("resume"); ``t_ms`` from the call's start, ``token`` the
    number of tokens generated when it happened."""

    kind: str
    t_ms: float
    token: int
    state: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Every field, by name."""
        return {"kind": self.kind, "t_ms": self.t_ms, "token": self.token, "state": self.state, "detail": self.detail}


@dataclass(frozen=True)
class GenerationResult:
    """One generation: ``text`` (stop strings cut off), ``token_ids`` generated (the EOS token, when
    that ended it, is not included), ``finish_reason`` (:data:`FINISH_REASONS`), ``stop`` (the stop
    string or EOS id that ended it), ``usage``, ``timings``, ``provenance``, ``variant``, ``events``
    and ``seed`` (the seed used, so a sampled result can be repeated). ``details``: how it was run,
    where a runner says more (the engine: batch, prefix-cache hit, speculation; the router: where
    each part was generated and why)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage
    timings: GenerationTimings
    provenance: Provenance
    stop: str | int | None = None
    seed: int | None = None
    events: tuple[GenerationEvent, ...] = field(default_factory=tuple)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def variant(self) -> str:
        """The variant that generated it."""
        return self.provenance.variant

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the CLI's ``--json`` form (flat figures first, then the details)."""
        t = self.timings
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "stop": self.stop,
            "prompt_tokens": self.usage.prompt_tokens,
            "generated_tokens": self.usage.completion_tokens,
            "truncated_tokens": self.usage.truncated_tokens,
            "ttft_ms": round(t.ttft_ms, 3),
            "tpot_ms": None if t.tpot_ms is None else round(t.tpot_ms, 3),
            "tokens_per_s": None if t.tokens_per_s is None else round(t.tokens_per_s, 2),
            "variant": self.variant,
            "seed": self.seed,
            "timings": t.to_dict(),
            "events": [e.to_dict() for e in self.events],
            "details": self.details,
            "provenance": self.provenance.to_dict(),
        }
