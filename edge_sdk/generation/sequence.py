"""One generation's bookkeeping between tokens, shared by the single-sequence loop of
:class:`~edge_sdk.generation.decoder.DecoderModel` and the batched loop of
:class:`~edge_sdk.generation.engine.GenerationEngine`: sampling with the repetition history,
end-of-sequence ids, stop strings, ``max_new_tokens``, cancellation and the deadline, incremental
detokenizing, the governor's events, timings, and the :class:`GenerationResult` at the end.

Whoever runs the model calls :meth:`GenerationState.sample` on the logits after the sequence's last token,
then :meth:`GenerationState.accept` with the chosen token: it returns the text that token completes
(never half a UTF-8 character, nothing that could still become a stop string) and whether the
generation is over.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import numpy.typing as npt

from ..telemetry.core import Provenance
from .results import GenerationEvent, GenerationResult, GenerationTimings, Usage
from .sampling import Sampler, SamplingParams
from .text import IncrementalDetokenizer, StopMatcher, Tokenizer

__all__ = ["GenerationState", "Request"]


@dataclass(frozen=True)
class Request:
    """One generation's checked inputs (made by ``DecoderModel._prepare``)."""

    ids: list[int]
    truncated: int
    params: SamplingParams
    matcher: StopMatcher
    eos: frozenset[int]
    max_new: int
    deadline: float | None  # perf_counter seconds, or None
    cancel: threading.Event
    t0: float

    def interrupted(self) -> str | None:
        """ "cancelled" or "deadline" when the generation must end now, else None."""
        if self.cancel.is_set():
            return "cancelled"
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return "deadline"
        return None


class GenerationState:
    """The state of one generation between tokens (see the module docs)."""

    def __init__(
        self, req: Request, tokenizer: Tokenizer, vocab_size: int, on_event: Callable[[GenerationEvent], None] | None = None
    ) -> None:
        self.req = req
        self.sampler = Sampler(req.params, vocab_size)
        # the repetition penalty's view of the tokens so far (kept only when there is a penalty)
        n = len(req.ids)
        self._history: npt.NDArray[np.int64] | None = (
            np.empty(n + req.max_new, dtype=np.int64) if req.params.repetition_penalty != 1.0 else None
        )
        if self._history is not None:
            self._history[:n] = req.ids
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids=req.ids[-8:], skip_special_tokens=True)
        self.out: list[int] = []
        self.events: list[GenerationEvent] = []
        self._on_event = on_event
        self.finish = "length"
        self.stop: str | int | None = None
        self.done = False
        self.t_first = 0.0
        self.t_last = 0.0
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.held_s = 0.0
        self.mode = ""  # "paced" / "paused" while the governor holds it
        self.extra: dict[str, object] = {}  # what a runner adds to the result's provenance of parts (engine, speculation)

    @property
    def tokens(self) -> int:
        """Prompt + generated tokens."""
        return len(self.req.ids) + len(self.out)

    def history(self) -> npt.NDArray[np.int64] | tuple[()]:
        """What the repetition penalty looks at (empty without a penalty)."""
        return () if self._history is None else self._history[: self.tokens]

    def sample(self, logits: npt.NDArray[np.floating]) -> int:
        """The next token from ``logits`` (the distribution after the last token)."""
        return self.sampler.sample(logits, self.history())

    def accept(self, tok: int) -> tuple[str, bool]:
        """Take ``tok`` as the next token: the text it completes and whether the generation ended
        (an EOS id, a stop string, ``max_new_tokens``)."""
        now = time.perf_counter()
        if not self.out and self.t_first == 0.0:
            self.t_first = now
        self.t_last = now
        if tok in self.req.eos:
            self.finish, self.stop, self.done = "stop", tok, True
            return "", True
        self.out.append(tok)
        if self._history is not None:
            self._history[self.tokens - 1] = tok
        text, stopped = self.req.matcher.feed(self.detok.push(tok))
        if stopped:
            self.finish, self.stop, self.done = "stop", self.req.matcher.matched, True
        elif len(self.out) >= self.req.max_new:
            self.done = True
        return text, self.done

    def interrupt(self) -> bool:
        """End the generation if it was cancelled or its deadline passed; True if it ended."""
        why = self.req.interrupted()
        if why is not None and not self.done:
            self.finish, self.done = why, True
        return why is not None

    def end(self, reason: str) -> None:
        """End the generation for ``reason`` (one of :data:`~edge_sdk.generation.results.FINISH_REASONS`)."""
        if not self.done:
            self.finish, self.done = reason, True

    def emit(self, kind: str, state: str, detail: str) -> None:
        """Record a governor action on this generation (and tell the model's listeners)."""
        e = GenerationEvent(kind, (time.perf_counter() - self.req.t0) * 1e3, len(self.out), state, detail)
        self.events.append(e)
        if self._on_event is not None:
            self._on_event(e)

    def tail(self) -> str:
        """Text held back for a possible stop string, released at the end (none after a matched stop string)."""
        if isinstance(self.stop, str):
            return ""
        return self.req.matcher.flush(self.detok.flush())

    def result(self, provenance: Provenance) -> GenerationResult:
        """The generation's result (call once it ended)."""
        end = time.perf_counter()
        n = len(self.out)
        t0 = self.req.t0
        ttft_s = (self.t_first - t0) if self.t_first else (end - t0)
        tpot_s = (self.t_last - self.t_first) / (n - 1) if n > 1 else None
        timings = GenerationTimings(
            ttft_ms=ttft_s * 1e3,
            tpot_ms=None if tpot_s is None else tpot_s * 1e3,
            total_ms=(end - t0) * 1e3,
            prefill_ms=self.prefill_s * 1e3,
            decode_ms=self.decode_s * 1e3,
            paused_ms=self.held_s * 1e3,
        )
        return GenerationResult(
            text=self.req.matcher.text,
            token_ids=tuple(self.out),
            finish_reason=self.finish,
            usage=Usage(len(self.req.ids), n, self.req.truncated),
            timings=timings,
            provenance=provenance,
            stop=self.stop,
            seed=self.sampler.seed,
            events=tuple(self.events),
            details=dict(self.extra),
        )

    def ttft_tpot_s(self) -> tuple[float, float | None]:
        """TTFT and TPOT in seconds (for telemetry)."""
        n = len(self.out)
        t0 = self.req.t0
        ttft = (self.t_first - t0) if self.t_first else (time.perf_counter() - t0)
        return ttft, ((self.t_last - self.t_first) / (n - 1) if n > 1 else None)
