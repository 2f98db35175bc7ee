"""The decoder model: prompt -> tokens -> prefill -> decode loop -> text, streamed.

``edge_sdk.load(pkg)`` on a ``task = "text-generation"`` package returns a :class:`DecoderModel`::

    model = edge_sdk.load("smollm2-135m/")
    print(model.chat([{"role": "user", "content": "What is the capital of France?"}]).text)
    for delta in model.stream("Once upon a time", max_new_tokens=32, temperature=0.7, seed=1):
        print(delta, end="", flush=True)

One model holds one KV buffer (one sequence at a time: a second call waits for the first),
sized at load from the device profile's memory budget minus the weights (:func:`plan_context`).
Between two tokens the loop checks, in order: end-of-sequence ids, stop strings, ``max_new_tokens``,
cancellation, the deadline, and the governor (CONSTRAINED: tokens are paced to a tokens/s cap;
CRITICAL: the stream pauses until the state drops, the deadline passes or it is cancelled).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .._listeners import Listeners
from ..backends.ort_decoder import DecoderShape, OrtDecoderSession
from ..errors import ContextBudgetError, GenerationError, OptionsError, PromptError, SessionClosedError, TemplateError
from ..telemetry.core import Provenance, Sample, model_key
from .results import GenerationEvent, GenerationResult
from .sampling import SamplingParams
from .sequence import GenerationState, Request
from .telemetry import GenerationTelemetry
from .template import ChatTemplate
from .text import StopMatcher, Tokenizer, validate_prompt

if TYPE_CHECKING:  # pragma: no cover
    from ..package import GenerationSpec, ModelPackage, Variant
    from ..profiles import BoardMatch
    from ..selection import Selection

__all__ = ["DEFAULT_MAX_CONTEXT", "ContextPlan", "DecoderModel", "TextStream", "plan_context"]

MiB = 1024 * 1024
#: KV tokens allocated by default when the budget allows more: the model's full context (8192 for
#: SmolLM2) would hold hundreds of MiB that a board's short prompts never use. ``context=`` asks for more.
DEFAULT_MAX_CONTEXT = 2048
#: Memory the runtime needs besides weights and KV (ONNX Runtime's arenas, the Python process's share).
RUNTIME_OVERHEAD_MB = 64.0
#: ONNX Runtime holds the weights once as loaded and once prepacked for MatMulNBits only briefly;
#: a loaded int4 model's RSS is ~1.1x its file.
WEIGHT_FACTOR = 1.1
MIN_CONTEXT = 16


@dataclass(frozen=True)
class ContextPlan:
    """How many tokens the KV buffer holds and why."""

    max_tokens: int
    kv_bytes_per_token: int
    budget_tokens: int | None  # what the memory budget allows (None: no budget known)
    reason: str

    @property
    def kv_bytes(self) -> int:
        """Bytes the KV buffer takes."""
        return self.max_tokens * self.kv_bytes_per_token


def plan_context(
    spec: "GenerationSpec", kv_bytes_per_token: int, weight_bytes: int, memory_budget_mb: float | None, requested: int | None = None
) -> ContextPlan:
    """The KV buffer size: the memory budget minus the weights and the runtime's overhead, divided by
    the KV bytes per token; capped at the model's context length and, unless ``requested``, at
    :data:`DEFAULT_MAX_CONTEXT`. Raises ContextBudgetError when ``requested`` exceeds either, or when
    the budget leaves fewer than :data:`MIN_CONTEXT` tokens."""
    per = kv_bytes_per_token
    budget_tokens: int | None = None
    why = f"{per} B/token"
    if memory_budget_mb is not None:
        avail = memory_budget_mb * MiB - weight_bytes * WEIGHT_FACTOR - RUNTIME_OVERHEAD_MB * MiB
        budget_tokens = max(0, int(avail // per))
        why = (
            f"memory budget {memory_budget_mb:.0f} MiB - weights {weight_bytes * WEIGHT_FACTOR / MiB:.1f} MiB - runtime "
            f"{RUNTIME_OVERHEAD_MB:.0f} MiB = {max(avail, 0) / MiB:.1f} MiB at {per} B/token -> {budget_tokens} tokens"
        )
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise OptionsError(f"context: expected an int >= 1 (KV tokens), got {requested!r}")
        if requested > spec.context_length:
            raise ContextBudgetError(f"context: {requested} tokens asked for, the model's context length is {spec.context_length}")
        if budget_tokens is not None and requested > budget_tokens:
            raise ContextBudgetError(f"context: {requested} tokens asked for, the KV budget holds {budget_tokens} ({why})")
        return ContextPlan(requested, per, budget_tokens, f"{requested} tokens as asked ({why})")
    n = min(spec.context_length, DEFAULT_MAX_CONTEXT, budget_tokens if budget_tokens is not None else spec.context_length)
    if n < MIN_CONTEXT:
        raise ContextBudgetError(f"KV budget: {n} tokens fit, at least {MIN_CONTEXT} are needed ({why})")
    caps = [f"model context {spec.context_length}", f"default cap {DEFAULT_MAX_CONTEXT}"]
    return ContextPlan(n, per, budget_tokens, f"{n} tokens: min of {', '.join(caps)}, budget ({why})")


_Messages = Sequence[Mapping[str, Any]]


class TextStream:
    """An iterator of text deltas (never half a UTF-8 character); ``result`` once it is exhausted.

    ``cancel()`` (from any thread) ends it before the next token; iterate to the end (or
    ``close()``) to release the model for the next call."""

    def __init__(self, gen: Iterator[str], cancel: threading.Event) -> None:
        self._gen = gen
        self._cancel = cancel
        self.result: GenerationResult | None = None

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def cancel(self) -> None:
        """Stop before the next token (finish_reason "cancelled")."""
        self._cancel.set()

    def close(self) -> None:
        """Abandon the stream now (releases the model); ``result`` stays None unless it had finished."""
        close = getattr(self._gen, "close", None)
        if close is not None:
            close()

    def until_done(self) -> GenerationResult:
        """Consume the rest and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result


class DecoderModel:
    """A loaded decoder package: ``generate``, ``stream``, ``chat`` (see the module docs)."""

    kind = "text-generation"

    def __init__(
        self,
        pkg: "ModelPackage",
        variant: "Variant",
        session: OrtDecoderSession,
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        selection: "Selection",
        detection: "BoardMatch",
        plan: ContextPlan,
        *,
        telemetry: bool = True,
        deterministic: bool = False,
    ) -> None:
        spec = pkg.manifest.generation
        assert spec is not None and variant.generation is not None
        self.package = pkg
        self.spec = spec
        self.variant = variant
        self.selection = selection
        self.detection = detection
        self.context = plan
        self.tokenizer = tokenizer
        self.template = template
        self.deterministic = deterministic
        self._sess: OrtDecoderSession | None = session
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread whose generation holds the KV buffer
        self._governor: Any = None
        self._pace_tps: float | None = None
        self._poll_s = 0.05
        self._listeners: Listeners[GenerationEvent] = Listeners("generation")
        info = session.info
        self.provenance = Provenance(
            model=pkg.manifest.name,
            version=pkg.manifest.version,
            sha256=variant.sha256,
            variant=variant.id,
            backend="onnxruntime",
            runtime=info.runtime,
            runtime_version=info.runtime_version,
            profile=detection.profile.name,
        )
        self._tm = GenerationTelemetry(self.provenance, plan.kv_bytes) if telemetry else None
        self.eos_ids = frozenset(spec.eos_token_ids)
        # int4/int8 with int8 activations give different logits for a 1-row step and a multi-row pass:
        # deterministic mode prefills one token per run, so a prompt's logits never depend on how it is chunked.
        self._prefill_one_by_one = deterministic and not variant.generation.batch_invariant

    # -- lifecycle --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        return self._sess is None

    def close(self) -> None:
        """Release the session and the KV buffer (idempotent; waits for a running generation)."""
        with self._lock:
            if self._sess is not None:
                self._sess.close()
                self._sess = None

    def __enter__(self) -> "DecoderModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DecoderModel({self.package.manifest.name!r} variant={self.variant.id} context={self.context.max_tokens})"

    @property
    def session_info(self) -> Any:
        """What the session runs on (providers, threads)."""
        s = self._sess
        if s is None:
            raise SessionClosedError("model is closed")
        return s.info

    @property
    def max_context(self) -> int:
        """Tokens the KV buffer holds (prompt + generated)."""
        return self.context.max_tokens

    def describe(self) -> dict[str, Any]:
        """What was chosen and why: variant, selection, KV plan, session, tokenizer, template."""
        g = self.variant.generation
        assert g is not None
        return {
            "model": self.package.manifest.name,
            "version": self.package.manifest.version,
            "task": "text-generation",
            "variant": self.variant.id,
            "precision": self.variant.precision,
            "generation": g.to_dict(),
            "quality": self.variant.quality.to_dict() if self.variant.quality else None,
            "selection": self.selection.explain(),
            "context": {"max_tokens": self.context.max_tokens, "kv_bytes": self.context.kv_bytes, "reason": self.context.reason},
            "session": self._sess.info.__dict__ if self._sess is not None else None,
            "vocab_size": self.tokenizer.vocab_size,
            "chat_template": self.template is not None,
            "deterministic": self.deterministic,
            "prefill": "one token per run (deterministic, kernel not batch-invariant)"
            if self._prefill_one_by_one
            else "whole prompt per run",
            "provenance": self.provenance.to_dict(),
        }

    # -- governor, events, telemetry -----------------------------------------------------

    def attach_governor(self, governor: Any, *, constrained_tokens_per_s: float | None = None, poll_s: float = 0.05) -> Callable[[], None]:
        """Let ``governor`` (an :class:`edge_sdk.budget.Governor`, or anything with a ``state`` whose
        ``.value`` is "normal" / "constrained" / "critical") act between tokens: CONSTRAINED paces
        tokens to ``constrained_tokens_per_s`` (None: no pacing), CRITICAL pauses the stream. Returns
        the detach callable."""
        if constrained_tokens_per_s is not None and not (
            isinstance(constrained_tokens_per_s, (int, float)) and constrained_tokens_per_s > 0
        ):
            raise OptionsError(f"constrained_tokens_per_s: expected a number > 0 or None, got {constrained_tokens_per_s!r}")
        if not (isinstance(poll_s, (int, float)) and 0 < poll_s <= 5):
            raise OptionsError(f"poll_s: expected seconds in (0, 5], got {poll_s!r}")
        self._governor = governor
        self._pace_tps = None if constrained_tokens_per_s is None else float(constrained_tokens_per_s)
        self._poll_s = float(poll_s)

        def detach() -> None:
            if self._governor is governor:
                self._governor = None

        return detach

    def subscribe(self, callback: Callable[[GenerationEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for each governor action on a generation; returns the unsubscribe."""
        return self._listeners.add(callback)

    def watch_events(self, emit: Callable[..., Any], *, name: str | None = None, models: Any = None) -> Callable[[], None]:
        """``EventLog.watch``: each governor action on a generation ("pace", "pause", "resume") as a
        "generation" event with this model's provenance; returns the unsubscribe."""

        def on_event(e: GenerationEvent) -> None:
            emit("generation", e.kind, provenance=self.provenance, state=e.state, token=e.token, t_ms=round(e.t_ms, 3), detail=e.detail)

        return self.subscribe(on_event)

    def telemetry(self) -> dict[str, Any] | None:
        """The generation figures so far (None when loaded with telemetry=False)."""
        return None if self._tm is None else self._tm.snapshot()

    def telemetry_key(self, name: str | None = None) -> tuple[str, str]:
        """``Registry.track``: kind "model", keyed by provenance."""
        return "model", model_key(self.provenance)

    def telemetry_samples(self, label: str | None = None) -> list[Sample]:
        """``Registry.track``: this model's generation series."""
        return [] if self._tm is None else self._tm.samples()

    # -- prompts ----------------------------------------------------------------------------

    def render_chat(self, messages: _Messages, *, add_generation_prompt: bool = True) -> str:
        """The prompt the package's chat template makes of ``messages``."""
        if self.template is None:
            raise TemplateError(f"package {self.package.manifest.name} has no chat template; use generate(prompt) with your own formatting")
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode(self, prompt: str | _Messages) -> list[int]:
        """The token ids a generation would run for ``prompt`` (a string, or chat messages)."""
        if isinstance(prompt, str):
            text = validate_prompt(prompt)
            ids = self.tokenizer.encode(text)
            if self.spec.add_bos and self.spec.bos_token_id is not None and (not ids or ids[0] != self.spec.bos_token_id):
                ids = [self.spec.bos_token_id] + ids
            return ids
        if isinstance(prompt, (bytes, bytearray)):
            raise PromptError("prompt: expected str (or a list of chat messages), got bytes; decode it first")
        if isinstance(prompt, Sequence):
            return self.tokenizer.encode(self.render_chat(prompt))  # type: ignore[arg-type]  # str was handled above
        raise PromptError(f"prompt: expected str or a list of chat messages, got {type(prompt).__name__}")

    # -- generation ---------------------------------------------------------------------

    def generate(self, prompt: str | _Messages, **kw: Any) -> GenerationResult:
        """Generate a completion of ``prompt`` (a string; a list of messages goes through the chat
        template). Keywords: max_new_tokens (256), temperature (0 = greedy), top_k, top_p, min_p,
        repetition_penalty, seed, stop (strings), stop_token_ids, ignore_eos, deadline_s, cancel
        (a threading.Event), truncate (drop the prompt's oldest tokens to fit). See :meth:`stream`."""
        return self.stream(prompt, **kw).until_done()

    def chat(self, messages: _Messages, **kw: Any) -> GenerationResult:
        """``generate`` on ``messages`` rendered with the package's chat template."""
        if isinstance(messages, str):
            raise PromptError("chat: expected a list of messages ({'role': ..., 'content': ...}), got str; use generate(prompt)")
        return self.generate(messages, **kw)

    def stream(
        self,
        prompt: str | _Messages,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | str | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        deadline_s: float | None = None,
        cancel: threading.Event | None = None,
        truncate: bool = False,
    ) -> TextStream:
        """Stream the completion as text deltas; the :class:`TextStream`'s ``result`` holds the
        :class:`~edge_sdk.generation.results.GenerationResult` once it ends.

        Checked before anything runs (typed errors): the prompt (PromptError), the template
        (TemplateError), sampling parameters (SamplingError), ``max_new_tokens`` and the other
        options (OptionsError), and that prompt + ``max_new_tokens`` fit the KV buffer
        (ContextBudgetError naming both; ``truncate=True`` drops the prompt's oldest tokens instead)."""
        options = {k: v for k, v in locals().items() if k not in ("self", "prompt")}  # exactly the keywords above
        req = self._prepare(prompt, **options)
        stream = TextStream(iter(()), req.cancel)
        stream._gen = self._run(stream, req)
        return stream

    def _prepare(
        self,
        prompt: str | _Messages,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | str | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        deadline_s: float | None = None,
        cancel: threading.Event | None = None,
        truncate: bool = False,
    ) -> Request:
        """The checked request of :meth:`stream` (shared with :class:`~edge_sdk.generation.engine.GenerationEngine`)."""
        t0 = time.perf_counter()
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise OptionsError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        if deadline_s is not None and (isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not deadline_s > 0):
            raise OptionsError(f"deadline_s: expected seconds > 0 or None, got {deadline_s!r}")
        if cancel is not None and not (hasattr(cancel, "is_set") and hasattr(cancel, "set")):
            raise OptionsError(f"cancel: expected a threading.Event, got {type(cancel).__name__}")
        stops: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        matcher = StopMatcher(stops)
        for t in stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.spec.vocab_size:
                raise OptionsError(f"stop_token_ids: expected token ids in [0, {self.spec.vocab_size}), got {t!r}")
        params = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed
        )
        ids = self.encode(prompt)
        if not ids:
            raise PromptError("prompt: it encodes to no tokens (and the package adds no BOS token); give some text")
        cap = self.context.max_tokens
        truncated = 0
        if len(ids) + max_new_tokens > cap:
            if not truncate or max_new_tokens >= cap:
                raise ContextBudgetError(
                    f"prompt of {len(ids)} tokens + max_new_tokens {max_new_tokens} = {len(ids) + max_new_tokens} tokens > the KV "
                    f"budget of {cap} tokens ({self.context.reason}); pass truncate=True to drop the prompt's oldest tokens, "
                    f"lower max_new_tokens, or load with a larger context= if the memory budget allows"
                )
            truncated = len(ids) + max_new_tokens - cap
            ids = ids[truncated:]
        ev = cancel if cancel is not None else threading.Event()
        eos = (frozenset() if ignore_eos else self.eos_ids) | frozenset(stop_token_ids)
        return Request(ids, truncated, params, matcher, eos, max_new_tokens, None if deadline_s is None else t0 + deadline_s, ev, t0)

    def _govern(self, seq: GenerationState) -> None:
        """Between tokens: act on the governor's state (the seconds held go to ``seq.held_s``)."""
        gov = self._governor
        if gov is None:
            return
        req = seq.req
        state = getattr(getattr(gov, "state", None), "value", "normal")
        if state == "critical":
            seq.emit("pause", state, "governor CRITICAL: stream paused between tokens")
            seq.mode = "paused"
            ts = time.perf_counter()
            while getattr(gov.state, "value", "normal") == "critical" and req.interrupted() is None:
                time.sleep(self._poll_s)
            held = time.perf_counter() - ts
            seq.held_s += held
            now_state = getattr(gov.state, "value", "normal")
            seq.emit("resume", now_state, f"after {held * 1e3:.0f} ms paused")
            seq.mode = ""
            state = now_state
        if state == "constrained" and self._pace_tps is not None:
            if seq.mode != "paced":
                seq.emit("pace", state, f"governor CONSTRAINED: tokens paced to {self._pace_tps:g}/s")
                seq.mode = "paced"
            wait = seq.t_last + 1.0 / self._pace_tps - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
                seq.held_s += wait
        elif state == "normal" and seq.mode == "paced":
            seq.emit("resume", state, "governor NORMAL: pacing lifted")
            seq.mode = ""

    def _run(self, stream: TextStream, req: Request) -> Iterator[str]:
        if not self._lock.acquire(blocking=False):
            if self._owner == threading.get_ident():
                # The open stream is suspended in this very thread: waiting for it would wait for ever.
                raise GenerationError(
                    f"model {self.package.manifest.name}: a stream of this model is still open in this thread (one sequence per "
                    f"model); iterate it to the end or call its close() first"
                )
            self._lock.acquire()  # another thread's generation: wait for it
        self._owner = threading.get_ident()
        try:
            sess = self._sess
            if sess is None:
                raise SessionClosedError(f"model {self.package.manifest.name} is closed")
            tm = self._tm
            try:
                yield from self._loop(stream, sess, req)
            except GeneratorExit:
                raise
            except BaseException as e:
                if tm is not None:
                    tm.error(e)
                raise
            finally:
                if tm is not None:
                    tm.kv_bytes_in_use = 0
        finally:
            self._owner = None
            self._lock.release()

    def _loop(self, stream: TextStream, sess: OrtDecoderSession, req: Request) -> Iterator[str]:
        seq = GenerationState(req, self.tokenizer, self.spec.vocab_size, self._listeners.emit)
        ids = req.ids
        sess.reset()
        tp = time.perf_counter()
        if self._prefill_one_by_one:
            for t in ids:
                logits = sess.prefill([t])
        else:
            logits = sess.prefill(ids)
        seq.prefill_s = time.perf_counter() - tp
        tm = self._tm
        per_tok = sess.shape.kv_bytes_per_token
        while True:
            text, done = seq.accept(seq.sample(logits))
            if text:
                yield text
            if done:
                break
            if not seq.interrupt() and self._governor is not None:
                self._govern(seq)
                seq.interrupt()
            if seq.done:
                break
            td = time.perf_counter()
            logits = sess.step(seq.out[-1])
            seq.decode_s += time.perf_counter() - td
            if tm is not None:
                tm.kv_bytes_in_use = sess.position * per_tok
        text = seq.tail()
        if text:
            yield text
        result = seq.result(self.provenance)
        if tm is not None:
            tm.record(len(ids), len(seq.out), seq.finish, *seq.ttft_tpot_s())
        stream.result = result


def open_decoder(
    pkg: "ModelPackage",
    variant: "Variant",
    selection: "Selection",
    detection: "BoardMatch",
    session_options: Any,
    *,
    context: int | None = None,
    telemetry: bool = True,
    deterministic: bool = False,
) -> DecoderModel:
    """Open ``variant`` of a text-generation package: the verified tokenizer and chat template, the KV
    plan from the profile's memory budget, the session with its bound buffers."""
    spec = pkg.manifest.generation
    g = variant.generation
    if spec is None or g is None:
        raise GenerationError(f"package {pkg.manifest.name} is not a text-generation package (task {pkg.manifest.task!r})")
    tok = Tokenizer(pkg.read_text_verified(spec.tokenizer, "tokenizer"))
    tok.check_model_vocab(spec.vocab_size)
    template = None
    if spec.chat_template is not None:
        bos = tok.id_to_token(spec.bos_token_id) if spec.bos_token_id is not None else None
        eos = tok.id_to_token(spec.eos_token_ids[0]) if spec.eos_token_ids else None
        template = ChatTemplate(pkg.read_text_verified(spec.chat_template, "chat template"), bos_token=bos, eos_token=eos)
    plan = plan_context(spec, g.kv_bytes_per_token, variant.total_size, detection.memory_budget_mb, context)
    shape = DecoderShape(spec.n_layers, spec.n_kv_heads, spec.head_dim, spec.vocab_size, g.kv_dtype)
    if shape.kv_bytes_per_token != g.kv_bytes_per_token:
        raise GenerationError(
            f"variant {variant.id}: kv_bytes_per_token {g.kv_bytes_per_token} does not match 2 x {spec.n_layers} layers x "
            f"{spec.n_kv_heads} kv heads x {spec.head_dim} x {g.kv_dtype} = {shape.kv_bytes_per_token}"
        )
    # Loaded by path (the verified open file), not from bytes: ONNX Runtime keeps its own copy of a
    # bytes model for the session's life, a second copy of every weight.
    fd, path = pkg.open_verified(variant)
    try:
        session = OrtDecoderSession(path, shape, session_options, plan.max_tokens)
    finally:
        os.close(fd)
    return DecoderModel(pkg, variant, session, tok, template, selection, detection, plan, telemetry=telemetry, deterministic=deterministic)
