"""The generation engine: one decode loop for every conversation a device serves, with
iteration-level (continuous) batching, a shared prefix cache and speculative decoding.

::

    model = edge_sdk.load("smollm2-135m/")
    with GenerationEngine(model, EngineOptions(max_streams=4)) as engine:
        streams = [engine.stream(q, max_new_tokens=64) for q in questions]   # from any threads
        for s in streams:
            print(s.until_done().text)

**Scheduling** (after Orca's iteration-level scheduling, Yu et al., OSDI 2022, and vLLM's
continuous batching): requests join and leave the running batch between decode steps. Each
running stream has its own KV slot (:class:`~edge_sdk.backends.ort_decoder.KVSlots`); one pass
decodes one token for every running stream, each row with its own attention-mask length, so
GroupQueryAttention reads and writes each stream's KV at its own position and never another's.
A new request's prompt is prefilled between decode steps, in chunks of ``prefill_chunk`` tokens
while other streams decode (so their time per token grows by at most one chunk's prefill), whole
when nothing else runs. Admission is first come, first served; a request waits in a bounded queue
(``queue_size``; a full queue refuses at once with :class:`~edge_sdk.errors.GenerationBusyError`
and a Retry-After estimate). Cancellation, a deadline, or a consumer that stops reading ends a
stream before the next step and gives its KV pages back to the OS at once.

**KV budget.** One budget, in tokens, for every stream and the prefix cache: the profile's memory
budget minus the weights (:func:`~edge_sdk.generation.decoder.plan_context`), or
``kv_budget_tokens``. Admission reserves ``prompt + max_new_tokens`` (capped at the slot length)
for a stream; a request that does not fit waits until running streams finish (the prefix cache
is evicted first). Slots are reserved address space only: the resident KV is what was written.

**Prefix cache** (:mod:`~edge_sdk.generation.prefix_cache`): after a prompt is prefilled, the KV
of its block-aligned prefix is kept (once per distinct prefix); a later prompt that starts with the
same blocks copies that KV into its own slot and prefills only the rest.

**Speculative decoding** (:mod:`~edge_sdk.generation.speculative`): with ``speculative=
"prompt-lookup"``, while a single stream runs the engine drafts tokens from n-gram matches in the
prompt and the output so far and verifies them in one pass, the draft length adapting to the
measured acceptance rate. With other streams running it decodes them in one batch instead: a batch
turns the CPU's spare compute into throughput the same way verification would.

**Determinism.** int4/int8 variants with int8 activations are not batch-invariant (a row's logits
depend on how many rows the pass has). In deterministic mode such a variant gets one slot,
one-token prefill passes and no speculation, so its output never depends on what else runs.
On batch-invariant variants (fp32, accuracy level 0) a stream's greedy output is the same alone,
batched with others, from the prefix cache, or speculated.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from ..backends.ort_decoder import OrtBatchDecoder
from ..errors import GenerationBusyError, GenerationError, OptionsError, SessionClosedError
from .decoder import TextStream
from .prefix_cache import PrefixCache
from .results import GenerationResult
from .sampling import Sampler
from .sequence import GenerationState, Request
from .speculative import AdaptiveDraftLength, ModelDrafter, PromptLookupDrafter, verify, verify_greedy, warped_rows

if TYPE_CHECKING:  # pragma: no cover
    from .decoder import DecoderModel

__all__ = ["EngineOptions", "GenerationEngine"]

_END = object()
SPECULATIVE_MODES = (None, "prompt-lookup", "draft")


def _int(name: str, v: object, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise OptionsError(f"{name}: expected an int >= {lo}, got {v!r}")


@dataclass(frozen=True)
class EngineOptions:
    """How a :class:`GenerationEngine` schedules.

    max_streams: streams decoded together (KV slots). queue_size: requests waiting beyond the
    running ones before ``stream()`` raises GenerationBusyError. prefill_chunk: prompt tokens per
    prefill pass while other streams decode. prefix_cache / prefix_block: keep prompt-prefix KV, in
    blocks of this many tokens. kv_budget_tokens: the KV budget for all streams and the prefix cache
    (None: the model's plan from the profile's memory budget, else max_streams x the slot length).
    speculative: None, "prompt-lookup", or "draft" (a draft model passed to the engine). max_draft: the longest draft.
    """

    max_streams: int = 4
    queue_size: int = 16
    prefill_chunk: int = 128
    prefix_cache: bool = True
    prefix_block: int = 16  # vLLM's default block size; a chat template's shared header is often under 32 tokens
    kv_budget_tokens: int | None = None
    speculative: str | None = None
    max_draft: int = 8

    def __post_init__(self) -> None:
        _int("max_streams", self.max_streams, 1)
        _int("queue_size", self.queue_size, 0)
        _int("prefill_chunk", self.prefill_chunk, 1)
        _int("prefix_block", self.prefix_block, 1)
        _int("max_draft", self.max_draft, 1)
        if self.kv_budget_tokens is not None:
            _int("kv_budget_tokens", self.kv_budget_tokens, 1)
        if not isinstance(self.prefix_cache, bool):
            raise OptionsError(f"prefix_cache: expected True or False, got {self.prefix_cache!r}")
        if self.speculative not in SPECULATIVE_MODES:
            raise OptionsError(f"speculative: expected one of {SPECULATIVE_MODES}, got {self.speculative!r}")


@dataclass(eq=False)
class _Stream:
    """A request inside the engine (touched only by the engine thread once admitted)."""

    seq: GenerationState
    text: TextStream
    reserve: int  # KV tokens reserved at admission
    q: "queue.SimpleQueue[object]" = field(default_factory=queue.SimpleQueue)
    state: str = "waiting"  # waiting -> prefill -> decode -> done
    slot: int = -1
    pos: int = 0  # tokens in the KV slot (while prefilling: the prompt tokens already in it)
    pending: int = -1  # the last accepted token, not yet run
    cached: int = 0
    queued_s: float = 0.0
    max_batch: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_passes: int = 0
    draft_sampler: Any = None  # a draft model's own sampler (its draws are q's, not the target's)

    @property
    def req(self) -> Request:
        return self.seq.req


class GenerationEngine:
    """Concurrent generation on one :class:`~edge_sdk.generation.decoder.DecoderModel` (see the
    module docs). ``stream``/``generate``/``chat`` take the keywords of ``DecoderModel.stream`` and may
    be called from any thread; the engine's own thread runs the model."""

    def __init__(self, model: "DecoderModel", options: EngineOptions | None = None, *, draft: "DecoderModel | None" = None) -> None:
        opts = options or EngineOptions()
        if not isinstance(opts, EngineOptions):
            raise OptionsError(f"options: expected EngineOptions, got {type(opts).__name__}")
        base = model._sess
        if base is None:
            raise SessionClosedError(f"model {model.package.manifest.name} is closed")
        g = model.variant.generation
        assert g is not None
        self.model = model
        self._strict = model.deterministic and not g.batch_invariant
        if self._strict:  # a row's logits would depend on the batch: one stream, one token per prefill pass
            opts = replace(opts, max_streams=1, speculative=None)
        self.options = opts
        self.slot_tokens = model.context.max_tokens
        self._dec = OrtBatchDecoder(base, opts.max_streams, self.slot_tokens)
        budget = opts.kv_budget_tokens or model.context.budget_tokens or opts.max_streams * self.slot_tokens
        self.kv_budget_tokens = int(min(budget, opts.max_streams * self.slot_tokens))
        self.cache = PrefixCache(opts.prefix_block, self.kv_budget_tokens) if opts.prefix_cache else None
        self._per_token = base.shape.kv_bytes_per_token
        self._cond = threading.Condition()
        self._waiting: list[_Stream] = []
        self._running: list[_Stream] = []  # admission order
        self._slots: list[_Stream | None] = [None] * opts.max_streams
        self._reserved = 0
        self._closed = False
        self._service_s = 1.0  # recent seconds per finished request (Retry-After estimate)
        self.steps = 0
        self.prefill_passes = 0
        self.finished = 0
        self.refused = 0
        self.batch_hist = [0] * (opts.max_streams + 1)
        self._spec: Any = None
        self.draft = draft
        if (opts.speculative == "draft") != (draft is not None) and not self._strict:
            raise OptionsError('draft: a draft model goes with speculative="draft" (and only with it)')
        if opts.speculative is not None:
            if not self._dec.keeps_logits:
                raise GenerationError(
                    f"speculative={opts.speculative!r}: the package's graph has no logits_to_keep input (converted by an older edge-convert llm); reconvert it"
                )
            drafter: Any = PromptLookupDrafter(max_ngram=3, min_ngram=2)
            if draft is not None:
                drafter = ModelDrafter(self._draft_session(draft))
            self._spec = (drafter, AdaptiveDraftLength(k_max=min(opts.max_draft, 16)))
        self._spec_stream: _Stream | None = None
        self._thread = threading.Thread(target=self._loop, name=f"edge-sdk-engine-{model.package.manifest.name}", daemon=True)
        self._thread.start()

    def _draft_session(self, draft: "DecoderModel") -> Any:
        """The draft model's own session, after checking that it shares the target's tokenizer."""
        sess = draft._sess
        if sess is None:
            raise SessionClosedError(f"draft model {draft.package.manifest.name} is closed")
        mine, theirs = self.model.spec, draft.spec
        if mine.tokenizer.sha256 != theirs.tokenizer.sha256 or mine.vocab_size != theirs.vocab_size:
            raise GenerationError(
                f"draft model {draft.package.manifest.name}: its tokenizer ({theirs.tokenizer.sha256[:12]}, {theirs.vocab_size} ids) is not "
                f"the target's ({mine.tokenizer.sha256[:12]}, {mine.vocab_size} ids); a draft must share the tokenizer"
            )
        return sess

    # -- the model's face ------------------------------------------------------------------

    @property
    def package(self) -> Any:
        """The model's package."""
        return self.model.package

    @property
    def spec(self) -> Any:
        """The package's ``[generation]`` table."""
        return self.model.spec

    @property
    def provenance(self) -> Any:
        """The model's provenance (every result carries it)."""
        return self.model.provenance

    @property
    def variant(self) -> Any:
        """The variant the model runs."""
        return self.model.variant

    @property
    def capacity(self) -> int:
        """Generations that may run or wait before ``stream()`` refuses: max_streams + queue_size."""
        return self.options.max_streams + self.options.queue_size

    @property
    def max_context(self) -> int:
        """Tokens one stream's KV slot holds (prompt + generated)."""
        return self.slot_tokens

    def encode(self, prompt: Any) -> list[int]:
        """The token ids a generation would run for ``prompt`` (``DecoderModel.encode``)."""
        return self.model.encode(prompt)

    def render_chat(self, messages: Any, *, add_generation_prompt: bool = True) -> str:
        """The prompt the chat template makes of ``messages`` (``DecoderModel.render_chat``)."""
        return self.model.render_chat(messages, add_generation_prompt=add_generation_prompt)

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        return self._closed

    def __enter__(self) -> "GenerationEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        o = self.options
        return f"GenerationEngine({self.model.package.manifest.name!r} streams={o.max_streams} queue={o.queue_size} kv_budget={self.kv_budget_tokens})"

    # -- requests ----------------------------------------------------------------------------

    def stream(self, prompt: Any, **kw: Any) -> TextStream:
        """Queue a generation; its text deltas as a :class:`TextStream` (``result`` at the end).
        Raises what ``DecoderModel.stream`` raises for bad input, GenerationBusyError when the queue
        is full, SessionClosedError after ``close()``."""
        req = self.model._prepare(prompt, **kw)
        seq = GenerationState(req, self.model.tokenizer, self.model.spec.vocab_size, self.model._listeners.emit)
        ts = TextStream(iter(()), req.cancel)
        s = _Stream(seq, ts, min(len(req.ids) + req.max_new, self.slot_tokens))
        ts._gen = self._consume(s)
        with self._cond:
            if self._closed:
                raise SessionClosedError(f"engine of {self.model.package.manifest.name} is closed")
            if len(self._waiting) >= self.options.queue_size and not self._free_slot_now():
                self.refused += 1
                n = len(self._waiting) + len(self._running)
                retry = max(1, math.ceil(n * self._service_s / self.options.max_streams))
                raise GenerationBusyError(
                    f"generation engine of {self.model.package.manifest.name} is full: {len(self._running)} running, "
                    f"{len(self._waiting)} waiting (queue_size {self.options.queue_size}); retry in about {retry} s",
                    retry,
                )
            self._waiting.append(s)
            self._cond.notify_all()
        return ts

    def _free_slot_now(self) -> bool:
        # a request that can be admitted at once does not count against the queue
        return not self._waiting and len(self._running) < self.options.max_streams

    def generate(self, prompt: Any, **kw: Any) -> GenerationResult:
        """``stream(...).until_done()``."""
        return self.stream(prompt, **kw).until_done()

    def chat(self, messages: Sequence[Mapping[str, Any]], **kw: Any) -> GenerationResult:
        """``generate`` on chat messages."""
        if isinstance(messages, str):
            from ..errors import PromptError

            raise PromptError("chat: expected a list of messages ({'role': ..., 'content': ...}), got str; use generate(prompt)")
        return self.generate(messages, **kw)

    def _consume(self, s: _Stream) -> Iterator[str]:
        try:
            while True:
                item = s.q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, str)
                yield item
        finally:
            if s.state != "done":  # the consumer stopped reading: cancel, the engine frees the slot
                s.req.cancel.set()
                with self._cond:
                    self._cond.notify_all()

    # -- state -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Running, waiting, KV budget and use, steps, batch-size histogram, prefix cache, refusals."""
        with self._cond:
            running = len(self._running)
            waiting = len(self._waiting)
            reserved = self._reserved
        return {
            "running": running,
            "waiting": waiting,
            "max_streams": self.options.max_streams,
            "queue_size": self.options.queue_size,
            "kv_budget_tokens": self.kv_budget_tokens,
            "kv_reserved_tokens": reserved,
            "kv_bytes_per_token": self._per_token,
            "steps": self.steps,
            "prefill_passes": self.prefill_passes,
            "finished": self.finished,
            "refused": self.refused,
            "batch_histogram": list(self.batch_hist),
            "prefix_cache": None if self.cache is None else self.cache.stats(),
            "deterministic_single_stream": self._strict,
        }

    def close(self) -> None:
        """Stop the engine: waiting and running streams end with SessionClosedError (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        self._dec.close()

    # -- the engine thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._running and not self._waiting:
                    self._cond.wait()
                if self._closed:
                    self._fail_all(SessionClosedError(f"engine of {self.model.package.manifest.name} closed"))
                    return
                self._admit()
            try:
                self._iteration()
            except Exception as e:  # a failed pass: every stream in it ends with the error; the engine goes on
                for s in list(self._running):
                    self._drop(s, e)

    def _fail_all(self, e: BaseException) -> None:
        for s in self._waiting:
            s.state = "done"
            s.q.put(e)
        self._waiting.clear()
        for s in list(self._running):
            self._drop(s, e)

    def _admit(self) -> None:
        """Waiting -> running while a slot is free and the KV budget holds the reservation (FIFO)."""
        while self._waiting and len(self._running) < self.options.max_streams:
            s = self._waiting[0]
            if s.req.interrupted() is not None:
                self._waiting.pop(0)
                s.seq.interrupt()
                self._finish(s)
                continue
            cache = self.cache
            need = s.reserve
            if self._reserved + need > self.kv_budget_tokens:
                break  # wait for running streams to finish
            if cache is not None:
                cache.evict_to(self.kv_budget_tokens - self._reserved - need)
            self._waiting.pop(0)
            slot = self._slots.index(None)
            self._slots[slot] = s
            s.slot = slot
            self._reserved += need
            s.queued_s = time.perf_counter() - s.req.t0
            s.state = "prefill"
            if cache is not None:
                entry, n = cache.lookup(s.req.ids)
                if entry is not None:
                    self._dec.kv.restore(slot, entry.kv, n)
                    s.pos = s.cached = n
            self._running.append(s)

    def _iteration(self) -> None:
        for s in list(self._running):
            if s.seq.interrupt():
                self._finish(s)
        if not self._running:
            return
        if self._governed():
            return
        pre = next((s for s in self._running if s.state == "prefill"), None)
        decoding = [s for s in self._running if s.state == "decode"]
        if pre is not None:
            self._prefill(pre, bool(decoding))
            decoding = [s for s in self._running if s.state == "decode"]
        if not decoding:
            return
        if self._spec is not None and len(decoding) == 1 and len(self._running) == 1 and not self._waiting:
            self._speculate(decoding[0])
        else:
            self._decode(decoding)
        self._pace()

    def _governed(self) -> bool:
        """CRITICAL: hold every stream between steps (True: nothing ran this iteration)."""
        gov = self.model._governor
        if gov is None:
            return False
        state = getattr(getattr(gov, "state", None), "value", "normal")
        if state == "critical":
            t0 = time.perf_counter()
            for s in self._running:
                if s.seq.mode != "paused":
                    s.seq.emit("pause", state, "governor CRITICAL: stream paused between tokens")
                    s.seq.mode = "paused"
            time.sleep(self.model._poll_s)
            dt = time.perf_counter() - t0
            for s in self._running:
                s.seq.held_s += dt
            return True
        for s in self._running:
            if s.seq.mode == "paused":
                s.seq.emit("resume", state, "governor no longer CRITICAL")
                s.seq.mode = ""
            if state == "constrained" and self.model._pace_tps is not None and s.seq.mode != "paced":
                s.seq.emit("pace", state, f"governor CONSTRAINED: tokens paced to {self.model._pace_tps:g}/s")
                s.seq.mode = "paced"
            elif state == "normal" and s.seq.mode == "paced":
                s.seq.emit("resume", state, "governor NORMAL: pacing lifted")
                s.seq.mode = ""
        return False

    def _pace(self) -> None:
        gov = self.model._governor
        tps = self.model._pace_tps
        if gov is None or tps is None or getattr(getattr(gov, "state", None), "value", "normal") != "constrained":
            return
        last = max((s.seq.t_last for s in self._running), default=0.0)
        wait = last + 1.0 / tps - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
            for s in self._running:
                s.seq.held_s += wait

    def _prefill(self, s: _Stream, others_decoding: bool) -> None:
        ids = s.req.ids
        rest = len(ids) - s.pos
        n = 1 if self._strict else (min(rest, self.options.prefill_chunk) if others_decoding else rest)
        t0 = time.perf_counter()
        logits = self._dec.prefill(s.slot, ids[s.pos : s.pos + n], s.pos)
        s.seq.prefill_s += time.perf_counter() - t0
        self.prefill_passes += 1
        s.pos += n
        if s.pos < len(ids):
            return
        s.state = "decode"
        self._accept(s, s.seq.sample(logits))
        if s.slot >= 0:  # still running: keep the prompt's KV after the first token went out (not in its TTFT)
            self._remember_prefix(s)

    def _remember_prefix(self, s: _Stream) -> None:
        cache = self.cache
        if cache is None:
            return
        ids = s.req.ids
        n = len(ids) // cache.block * cache.block
        if n <= s.cached or cache.covered(ids[:n]) >= n:
            return
        cache.capacity_tokens = self.kv_budget_tokens - self._reserved
        if n <= cache.capacity_tokens:
            cache.insert(ids[:n], self._dec.kv.snapshot(s.slot, n))

    def _decode(self, decoding: list[_Stream]) -> None:
        rows = max(s.slot for s in decoding) + 1
        tokens = np.zeros(rows, dtype=np.int64)
        positions = np.zeros(rows, dtype=np.int64)
        for i in range(rows):  # a slot that is not decoding gets a dummy row at its next position,
            o = self._slots[i]  # which its own next prefill pass overwrites before anything reads it
            if o is not None:
                positions[i] = o.pos
        for s in decoding:
            tokens[s.slot] = s.pending
        t0 = time.perf_counter()
        logits = self._dec.decode(tokens, positions)
        dt = time.perf_counter() - t0
        self.steps += 1
        self.batch_hist[len(decoding)] += 1
        rows_of = [(s, s.slot) for s in decoding]  # a stream that ends moves another into its slot,
        for s in decoding:  # with every token this pass wrote
            s.pos += 1
            s.seq.decode_s += dt
            s.max_batch = max(s.max_batch, len(decoding))
        for s, row in rows_of:
            self._accept(s, s.seq.sample(logits[row]))
        self._note_kv()

    def _speculate(self, s: _Stream) -> None:
        """One step of the only running stream: a draft verified in one pass (Leviathan et al.,
        :func:`~edge_sdk.generation.speculative.verify`), or a plain step when the draft length
        controller says drafting does not pay (or there is no draft)."""
        drafter, adapt = self._spec
        if self._spec_stream is not s:  # a new stream: the draft model's KV starts over
            self._spec_stream = s
            if isinstance(drafter, ModelDrafter):
                drafter.reset()
        k = min(adapt.choose(), self.slot_tokens - s.pos - 1, s.req.max_new - len(s.seq.out) - 1)
        t0 = time.perf_counter()
        q = None
        seq_tokens = np.asarray(s.req.ids + s.seq.out, dtype=np.int64)
        if k <= 0:
            draft: list[int] = []
        elif isinstance(drafter, ModelDrafter):
            if s.draft_sampler is None:  # its own generator, seeded from the stream's: repeatable, independent of the target's draws
                s.draft_sampler = Sampler(s.req.params, self.model.spec.vocab_size)
                s.draft_sampler.reset((int(s.seq.sampler.seed or 0) * 2654435761 + 1) % 2**63)
            dsampler = s.draft_sampler
            draft, q = drafter.draft(seq_tokens, k, None if s.req.params.greedy else dsampler, s.seq.history())
        else:
            draft = drafter.draft(seq_tokens, k)
        if not draft:
            t0 = time.perf_counter()
            self._decode([s])
            adapt.observe_step(time.perf_counter() - t0)
            adapt.update(0, 0)  # a plain step: the controller counts them to probe again
            return
        tv = time.perf_counter()
        logits = self._dec.verify(s.slot, [s.pending, *draft], s.pos)
        s.seq.decode_s += time.perf_counter() - tv
        params = s.req.params
        if q is not None:
            # a sampled draft model: Leviathan et al.'s rule with its q rows (the output follows the target's
            # distribution; the draws depend on the draft lengths chosen, so a seed does not repeat it exactly)
            p = warped_rows(s.seq.sampler, logits, s.seq.history(), draft)
            toks, n_acc = verify(p, draft, q, s.seq.sampler.rng)
        elif params.greedy and params.repetition_penalty == 1.0:
            toks, n_acc = verify_greedy(logits, draft)
        else:
            toks, n_acc = self._verify_by_sampling(s, logits, draft)
        adapt.observe_cost(len(draft), time.perf_counter() - t0)  # drafting, the pass and the verification: what a draft costs
        adapt.update(len(draft), n_acc)
        self.steps += 1
        self.batch_hist[1] += 1
        s.spec_drafted += len(draft)
        s.spec_accepted += n_acc
        s.spec_passes += 1
        s.pos += 1 + n_acc  # the pending token and the accepted drafts are in the KV; the last token is not yet
        s.max_batch = max(s.max_batch, 1)
        for t in toks:
            if s.state == "done":
                break
            self._accept(s, t)
        self._note_kv()

    @staticmethod
    def _verify_by_sampling(s: _Stream, logits: np.ndarray, draft: list[int]) -> tuple[list[int], int]:
        """Point-mass drafts (prompt lookup, greedy draft models): draw each position's token with the
        stream's own sampler, exactly as plain decoding would, and accept the draft while it matches.
        For a deterministic draft this is Leviathan et al.'s rule (a draft token is accepted with
        probability p(x); on a mismatch the token drawn is distributed as norm(max(0, p - q))), and
        it consumes one draw per token in order: a seeded generation gives the same tokens with or
        without speculation (on a batch-invariant variant)."""
        hist = s.seq.history()
        base = np.asarray(hist, dtype=np.int64) if len(hist) else None
        toks: list[int] = []
        for i in range(len(draft) + 1):
            h: Any = () if base is None else np.concatenate([base, np.asarray(toks, dtype=np.int64)])
            t = s.seq.sampler.sample(logits[i], h)
            toks.append(t)
            if i == len(draft) or t != draft[i]:
                break
        return toks, len(toks) - 1

    def _note_kv(self) -> None:
        tm = self.model._tm
        if tm is not None:
            tm.kv_bytes_in_use = sum(s.pos for s in self._running) * self._per_token

    def _accept(self, s: _Stream, tok: int) -> None:
        text, done = s.seq.accept(tok)
        if text:
            s.q.put(text)
        if done:
            self._finish(s)
        else:
            s.pending = tok

    def _release(self, s: _Stream) -> None:
        """Free ``s``'s slot and reservation; the highest occupied slot moves down into it (slots stay compact)."""
        if s in self._running:
            self._running.remove(s)
        if s.slot < 0:
            return
        with self._cond:
            self._reserved -= s.reserve
        j = s.slot
        s.slot = -1
        top = max((i for i, o in enumerate(self._slots) if o is not None and o is not s), default=-1)
        if top > j:
            o = self._slots[top]
            assert o is not None
            self._dec.kv.move(top, j, o.pos)
            self._slots[j], self._slots[top] = o, None
            o.slot = j
            self._dec.kv.release(top)
        else:
            self._slots[j] = None
            self._dec.kv.release(j)

    def _finish(self, s: _Stream) -> None:
        text = s.seq.tail()
        if text:
            s.q.put(text)
        self._release(s)
        details: dict[str, Any] = {
            "engine": {"queued_ms": round(s.queued_s * 1e3, 3), "max_batch": s.max_batch, "prefix_cached_tokens": s.cached},
        }
        if s.spec_passes:
            details["speculation"] = {
                "mode": self.options.speculative,
                "passes": s.spec_passes,
                "drafted": s.spec_drafted,
                "accepted": s.spec_accepted,
                "acceptance_rate": round(s.spec_accepted / s.spec_drafted, 4) if s.spec_drafted else None,
            }
        s.seq.extra.update(details)
        result = s.seq.result(self.model.provenance)
        tm = self.model._tm
        if tm is not None:
            tm.record(len(s.req.ids), len(s.seq.out), s.seq.finish, *s.seq.ttft_tpot_s())
        self.finished += 1
        self._service_s = 0.8 * self._service_s + 0.2 * (result.timings.total_ms / 1e3)
        s.text.result = result
        s.state = "done"
        s.q.put(_END)
        with self._cond:
            self._cond.notify_all()

    def _drop(self, s: _Stream, e: BaseException) -> None:
        self._release(s)
        s.state = "done"
        tm = self.model._tm
        if tm is not None:
            tm.error(e)
        s.q.put(e)
