"""Offload of text generation: local first, an OpenAI-compatible server (``edge-sdk serve``,
llama.cpp's server, vLLM, Ollama) when the device is hot or full, and a stream already running
locally moves there mid-generation without the caller noticing.

::

    engine = GenerationEngine(edge_sdk.load("smollm2-135m/"))
    remote = OpenAIClient("https://gateway:8000/v1", token=..., privacy=PrivacyPolicy("allowed"))
    router = GenerationRouter(engine, remote, remote_model="smollm2-135m", governor=gov)
    for delta in (s := router.stream(messages, max_new_tokens=256)):
        print(delta, end="")
    s.result.details["parts"]   # [{"where": "local", ...}, {"where": "remote", "why": "governor critical", ...}]

**Where a generation starts** (the first rule that applies; the trigger names are those of
:mod:`edge_sdk.remote.router`):

1. no local model -> remote (``no_local``);
2. forced offload (:meth:`GenerationRouter.set_offload`, the budget governor's ``Offload`` step)
   or the governor is CRITICAL -> remote (``forced``, ``governor_critical``);
3. the local engine is full (its queue refuses: GenerationBusyError) or the prompt does not fit
   its KV budget (ContextBudgetError) -> remote (``queue_full``, ``kv_budget``);
4. the TTFT objective is at risk: the requests ahead of this one times the recent local service
   time, plus the prompt's prefill at the recent local rate, exceed ``ttft_objective_ms`` ->
   remote (``latency_objective``);
5. otherwise local (``local_first``).

**A running local stream moves** between two tokens when the governor turns CRITICAL or offload
is forced (``move_running=True``): the local stream is cancelled, its text so far kept, and the
remote continues from the prompt plus that text with ``POST /v1/completions`` (the chat template
rendered here, so the remote continues exactly where the device stopped rather than answering
anew), for the tokens still allowed. The caller's iterator goes on with the remote deltas. A
remote stream that fails mid-way continues locally the same way (``remote_failed``), so nothing
that was generated is lost and the caller sees one stream. Streams never move back mid-way:
after a cool-down the next call (a turn boundary) starts local again.

**Privacy** applies to prompts (:class:`~edge_sdk.remote.privacy.PrivacyPolicy` of the client,
default "never": nothing leaves the device): a refused offload stays local (the local engine's own
governor then paces or pauses it) and says so. Deadlines, the retry budget and the circuit
breaker are the client's, as for the v2 router.

**Every result says where each part was generated and why**: ``result.details["parts"]`` is a
list of ``{"where": "local" | "remote", "why", "trigger", "chars", "tokens"}`` (``tokens``: the
local count, or the remote's reported usage), ``details["served_by"]`` the last part's place.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from .._listeners import Listeners
from ..errors import ContextBudgetError, GenerationBusyError, OptionsError
from ..generation.decoder import TextStream
from ..generation.results import GenerationResult, GenerationTimings, Usage
from .errors import PrivacyError, RemoteError
from .router import RouterError, RouterEvent

__all__ = ["GenerationRouter", "GenerationRouterOptions"]

_SAMPLING_KEYS = ("temperature", "top_p", "seed", "stop")


@dataclass(frozen=True)
class GenerationRouterOptions:
    """``offload_on_critical``: start remote, and move running streams, while the governor is
    CRITICAL. ``move_running``: let a running local stream move mid-generation (False: only new
    generations go remote). ``ttft_objective_ms``: offload a new generation whose predicted local
    TTFT exceeds it (None: no objective). ``remote_model``: the model name on the server (None: the
    package's name). ``check_every_tokens``: how often a local stream looks at the governor."""

    offload_on_critical: bool = True
    move_running: bool = True
    ttft_objective_ms: float | None = None
    remote_model: str | None = None
    check_every_tokens: int = 1
    ewma_alpha: float = 0.2

    def __post_init__(self) -> None:
        if self.ttft_objective_ms is not None and not (
            isinstance(self.ttft_objective_ms, (int, float)) and math.isfinite(self.ttft_objective_ms) and self.ttft_objective_ms > 0
        ):
            raise OptionsError(f"ttft_objective_ms: expected a number > 0 or None, got {self.ttft_objective_ms!r}")
        if isinstance(self.check_every_tokens, bool) or not isinstance(self.check_every_tokens, int) or self.check_every_tokens < 1:
            raise OptionsError(f"check_every_tokens: expected an int >= 1, got {self.check_every_tokens!r}")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise OptionsError(f"ewma_alpha: expected a number in (0, 1], got {self.ewma_alpha!r}")


class _Cancel:
    """The router stream's cancel: sets the caller's event and stops whichever part runs now."""

    def __init__(self, user: Any) -> None:
        self.user = user
        self.inner: threading.Event | None = None
        self.closer: Callable[[], None] | None = None

    def new(self) -> threading.Event:
        """A fresh event for the next local part (already set if the caller has cancelled)."""
        self.inner = threading.Event()
        if self.user.is_set():
            self.inner.set()
        return self.inner

    def set(self) -> None:
        self.user.set()
        if self.inner is not None:
            self.inner.set()
        if self.closer is not None:
            self.closer()

    def is_set(self) -> bool:
        return bool(self.user.is_set())


@dataclass
class _Part:
    where: str
    trigger: str
    why: str
    text: list[str] = field(default_factory=list)
    tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "trigger": self.trigger, "why": self.why, "chars": len("".join(self.text)), "tokens": self.tokens}


class GenerationRouter:
    """Routes generations between ``local`` (a :class:`~edge_sdk.generation.engine.GenerationEngine`
    or a DecoderModel; None: none here) and ``remote`` (an
    :class:`~edge_sdk.remote.openai_client.OpenAIClient`; None: local only). See the module docs."""

    def __init__(self, local: Any, remote: Any = None, options: GenerationRouterOptions | None = None, *, governor: Any = None) -> None:
        if local is None and remote is None:
            raise OptionsError("GenerationRouter: expected a local engine or model, a remote client, or both")
        self.local = local
        self.remote = remote
        self.options = options or GenerationRouterOptions()
        self.governor = governor
        self._forced = False
        self._lock = threading.Lock()
        self._service_s: float | None = None
        self._prefill_tps: float | None = None
        self._by_trigger: dict[tuple[str, str], int] = {}
        self._moves: dict[str, int] = {}
        self._listeners: Listeners[RouterEvent] = Listeners("generation-router")

    # -- control and state -------------------------------------------------------------------

    def set_offload(self, on: bool) -> str:
        """Send new generations, and move running ones, to the remote while ``on`` (the governor's
        ``Offload(enable=router.set_offload)`` step)."""
        if self.remote is None:
            from ..budget.actions import ActionUnavailable

            raise ActionUnavailable("the generation router has no remote server")
        self._forced = bool(on)
        return f"generation offload {'on' if on else 'off'}"

    def subscribe(self, callback: Callable[[RouterEvent], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for each offload, move and fallback; returns the unsubscribe."""
        return self._listeners.add(callback)

    @property
    def requests_by_trigger(self) -> Mapping[tuple[str, str], int]:
        """Generations started, by ``(where, trigger)``."""
        with self._lock:
            return dict(self._by_trigger)

    @property
    def moves(self) -> Mapping[str, int]:
        """Running streams moved, by direction ("to_remote", "to_local")."""
        with self._lock:
            return dict(self._moves)

    @property
    def _model_name(self) -> str:
        if self.options.remote_model:
            return self.options.remote_model
        if self.local is not None:
            return str(self.local.package.manifest.name)
        raise OptionsError("GenerationRouter: remote_model is needed when there is no local model to name it")

    def _hot(self) -> str | None:
        if self._forced:
            return "forced"
        gov = self.governor
        if self.options.offload_on_critical and gov is not None and getattr(getattr(gov, "state", None), "value", "normal") == "critical":
            return "governor_critical"
        return None

    def _refused(self) -> str | None:
        """Why the privacy policy keeps prompts here (None: they may go to the remote)."""
        try:
            self.remote.privacy_for(self._model_name).check_endpoint(self._model_name, self.remote.region)
        except PrivacyError as e:
            return f"the privacy policy keeps prompts on the device ({e})"
        return None

    def _count(self, where: str, trigger: str) -> None:
        with self._lock:
            self._by_trigger[(where, trigger)] = self._by_trigger.get((where, trigger), 0) + 1

    def _event(self, kind: str, trigger: str, where: str, reason: str, error: BaseException | None = None) -> None:
        self._listeners.emit(RouterEvent(kind, trigger, where, reason, error=None if error is None else type(error).__name__))

    # -- requests ------------------------------------------------------------------------------

    def generate(self, prompt: Any, **kw: Any) -> GenerationResult:
        """``stream(...).until_done()``."""
        return self.stream(prompt, **kw).until_done()

    def chat(self, messages: Sequence[Mapping[str, Any]], **kw: Any) -> GenerationResult:
        """``generate`` on chat messages."""
        return self.generate(messages, **kw)

    def stream(self, prompt: Any, **kw: Any) -> TextStream:
        """One generation wherever it should run (module docs): a :class:`TextStream` of text
        deltas whose ``result.details["parts"]`` says where each part came from. Keywords: those
        of ``DecoderModel.stream``; only ``max_new_tokens``, ``temperature``, ``top_p``, ``seed``
        and ``stop`` reach a remote server."""
        user = kw.pop("cancel", None) or threading.Event()
        if not (hasattr(user, "is_set") and hasattr(user, "set")):
            raise OptionsError(f"cancel: expected a threading.Event, got {type(user).__name__}")
        link = _Cancel(user)
        ts = TextStream(iter(()), link)  # type: ignore[arg-type]  # duck-typed like an Event
        ts._gen = self._run(ts, prompt, dict(kw), link)
        return ts

    def _predicted_ttft_ms(self, prompt_tokens: int) -> float | None:
        st = self.local.stats() if hasattr(self.local, "stats") else None
        if st is None or self._service_s is None or self._prefill_tps is None:
            return None
        ahead = st["waiting"] + max(0, st["running"] - st["max_streams"] + 1)
        return float((ahead * self._service_s / max(1, st["max_streams"]) + prompt_tokens / self._prefill_tps) * 1e3)

    def _choose(self, prompt: Any, kw: Mapping[str, Any]) -> tuple[str, str, str]:
        if self.local is None:
            return "remote", "no_local", "no local model"
        hot = self._hot()
        if hot is not None and self.remote is not None:
            refused = self._refused()
            if refused is not None:
                return "local", "privacy", f"{'offload forced' if hot == 'forced' else 'governor CRITICAL'}, not offloaded: {refused}"
            return "remote", hot, "offload forced" if hot == "forced" else "governor CRITICAL"
        obj = self.options.ttft_objective_ms
        if obj is not None and self.remote is not None:
            pred = self._predicted_ttft_ms(len(self.local.encode(prompt)))
            if pred is not None and pred > obj:
                return "remote", "latency_objective", f"predicted local TTFT {pred:.0f} ms > objective {obj:g} ms"
        return "local", "local_first", "local first"

    def _run(self, ts: TextStream, prompt: Any, kw: dict[str, Any], link: "_Cancel") -> Iterator[str]:
        t0 = time.perf_counter()
        max_new = int(kw.get("max_new_tokens", 256))
        parts: list[_Part] = []
        where, trigger, why = self._choose(prompt, kw)
        local_result: GenerationResult | None = None
        remote_usage_prompt: int | None = None
        t_first: float | None = None
        remote_failed: str | None = None
        finish = "length"
        while True:
            done_tokens = sum(p.tokens or 0 for p in parts)
            text_so_far = "".join("".join(p.text) for p in parts)
            left = max_new - done_tokens
            if left <= 0 or link.is_set():
                break
            if where == "local":
                part = _Part("local", trigger, why)
                parts.append(part)
                try:
                    inner = self.local.stream(
                        self._continue_prompt(prompt, text_so_far), **{**kw, "max_new_tokens": left, "cancel": link.new()}
                    )
                except (GenerationBusyError, ContextBudgetError) as e:
                    parts.pop()
                    if self.remote is None or remote_failed is not None:
                        raise
                    where, trigger = "remote", "queue_full" if isinstance(e, GenerationBusyError) else "kv_budget"
                    why = str(e).split(";")[0]
                    continue
                self._count("local", trigger)
                moved = None
                n = 0
                for delta in inner:
                    if t_first is None:
                        t_first = time.perf_counter()
                    part.text.append(delta)
                    yield delta
                    n += 1
                    if link.is_set():  # the caller's own event, set directly
                        inner.cancel()
                    if (
                        moved is None
                        and self.remote is not None
                        and self.options.move_running
                        and remote_failed is None
                        and n % self.options.check_every_tokens == 0
                    ):
                        hot = self._hot()
                        if hot is not None:
                            refused = self._refused()
                            if refused is None:
                                moved = hot
                                inner.cancel()
                            else:  # stays here (the engine's own governor paces or pauses it), and says why
                                remote_failed = f"not moved: {refused}"
                                part.why += f"; {remote_failed}"
                                self._event("fallback", "privacy", "local", remote_failed)
                r = inner.until_done()
                local_result = r
                tail = r.text[len("".join(part.text)) :]
                if tail:
                    part.text.append(tail)
                    yield tail
                part.tokens = r.usage.completion_tokens
                self._learn(r)
                if moved is not None and r.finish_reason == "cancelled" and not link.is_set():
                    with self._lock:
                        self._moves["to_remote"] = self._moves.get("to_remote", 0) + 1
                    where, trigger = "remote", moved
                    why = f"moved at token {done_tokens + part.tokens}: " + ("offload forced" if moved == "forced" else "governor CRITICAL")
                    self._event("offload", moved, "remote", why)
                    continue
                finish = r.finish_reason
                break
            # remote
            part = _Part("remote", trigger, why)
            parts.append(part)
            try:
                rs = self._remote_stream(prompt, text_so_far, kw, left)
                link.closer = rs.close
            except RemoteError as e:
                parts.pop()
                if self.local is None:
                    raise RouterError(f"remote failed ({e}); no local model") from e
                where, trigger, why = "local", "remote_failed", f"remote failed ({type(e).__name__}: {e}); served locally"
                remote_failed = why
                self._event("fallback", "remote_failed", "local", why, e)
                continue
            self._count("remote", trigger)
            try:
                for delta in rs:
                    if t_first is None:
                        t_first = time.perf_counter()
                    part.text.append(delta)
                    yield delta
                res = rs.result
            except RemoteError as e:  # mid-stream: what arrived is kept, the rest is generated locally
                partial = getattr(e, "partial", None)
                part.tokens = getattr(partial, "completion_tokens", None) or len(part.text)
                if self.local is None:
                    raise RouterError(f"remote stream failed after {len(part.text)} deltas ({e}); no local model") from e
                with self._lock:
                    self._moves["to_local"] = self._moves.get("to_local", 0) + 1
                where, trigger = "local", "remote_failed"
                why = f"remote stream failed after {len(part.text)} deltas ({type(e).__name__}); continued locally"
                remote_failed = why
                self._event("fallback", "remote_failed", "local", why, e)
                continue
            part.tokens = res.completion_tokens if res.completion_tokens is not None else res.deltas
            remote_usage_prompt = res.prompt_tokens
            finish = "cancelled" if res.cancelled else (res.finish_reason or "stop")
            break
        if link.is_set():
            finish = "cancelled"
        ts.result = self._result(prompt, parts, finish, t0, t_first, local_result, remote_usage_prompt)

    def _rendered(self, prompt: Any, text_so_far: str) -> str:
        """The prompt as text (the chat template rendered here) plus the text generated so far: what
        either side continues, so a moved stream goes on exactly where the other stopped."""
        return (prompt if isinstance(prompt, str) else self.local.render_chat(prompt)) + text_so_far

    def _continue_prompt(self, prompt: Any, text_so_far: str) -> Any:
        """The local prompt that continues ``text_so_far`` (the prompt itself when nothing was generated)."""
        return self._rendered(prompt, text_so_far) if text_so_far else prompt

    def _remote_stream(self, prompt: Any, text_so_far: str, kw: Mapping[str, Any], left: int) -> Any:
        extra = {k: kw[k] for k in _SAMPLING_KEYS if kw.get(k) is not None}
        if "temperature" not in extra:
            extra["temperature"] = 0.0  # the SDK's default is greedy; an OpenAI server's is 1
        model = self._model_name
        if self.local is None and not isinstance(prompt, str):  # no template here (and nothing generated yet): the server renders it
            return self.remote.chat_stream(model, list(prompt), max_tokens=left, **extra)
        return self.remote.complete_stream(model, self._rendered(prompt, text_so_far), max_tokens=left, **extra)

    def _learn(self, r: GenerationResult) -> None:
        a = self.options.ewma_alpha
        total_s = r.timings.total_ms / 1e3
        self._service_s = total_s if self._service_s is None else (1 - a) * self._service_s + a * total_s
        if r.timings.prefill_ms > 0 and r.usage.prompt_tokens:
            tps = r.usage.prompt_tokens / (r.timings.prefill_ms / 1e3)
            self._prefill_tps = tps if self._prefill_tps is None else (1 - a) * self._prefill_tps + a * tps

    def _result(
        self,
        prompt: Any,
        parts: list[_Part],
        finish: str,
        t0: float,
        t_first: float | None,
        local: GenerationResult | None,
        remote_prompt_tokens: int | None,
    ) -> GenerationResult:
        end = time.perf_counter()
        text = "".join("".join(p.text) for p in parts)
        n = sum(p.tokens or 0 for p in parts)
        prompt_tokens = len(self.local.encode(prompt)) if self.local is not None else (remote_prompt_tokens or 0)
        ttft = ((t_first or end) - t0) * 1e3
        timings = GenerationTimings(
            ttft_ms=ttft,
            tpot_ms=((end - (t_first or end)) * 1e3 / (n - 1)) if n > 1 else None,
            total_ms=(end - t0) * 1e3,
            prefill_ms=local.timings.prefill_ms if local is not None else 0.0,
            decode_ms=local.timings.decode_ms if local is not None else 0.0,
            paused_ms=local.timings.paused_ms if local is not None else 0.0,
        )
        if local is not None:
            prov = local.provenance
        else:
            from ..telemetry.core import Provenance

            prov = Provenance(
                model=self._model_name,
                version="",
                sha256="",
                variant="remote",
                backend="openai",
                runtime="remote",
                runtime_version="",
                profile="",
            )
        local_ids = tuple(local.token_ids) if local is not None and len(parts) == 1 and parts[0].where == "local" else ()
        return GenerationResult(
            text=text,
            token_ids=local_ids,
            finish_reason=finish,
            usage=Usage(prompt_tokens, n),
            timings=timings,
            provenance=prov,
            stop=local.stop if local is not None and parts and parts[-1].where == "local" else None,
            seed=local.seed if local is not None else None,
            events=local.events if local is not None else (),
            details={"parts": [p.to_dict() for p in parts], "served_by": parts[-1].where if parts else None},
        )
