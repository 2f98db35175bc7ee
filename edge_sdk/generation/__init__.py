"""Text generation on the device: decoder-only language models from ``task = "text-generation"``
packages (``edge-convert llm``), run by a prefill/decode loop over one preallocated KV buffer,
streamed as text, under the device's memory budget and governor (docs/generation.md).

``edge_sdk.load(pkg)`` returns a :class:`DecoderModel` for such a package. The modules:
:mod:`.decoder` (the model and its single-sequence loop), :mod:`.engine` (concurrent streams:
continuous batching, the prefix cache of :mod:`.prefix_cache`, speculative decoding of
:mod:`.speculative`), :mod:`.sequence` (one generation's bookkeeping, shared by both loops), :mod:`.sampling`, :mod:`.text` (tokenizer, UTF-8-safe
incremental detokenizer, stop strings, prompt checks), :mod:`.template` (chat templates in a
Jinja2 sandbox), :mod:`.results`, :mod:`.telemetry`; the ONNX Runtime seam is
:mod:`edge_sdk.backends.ort_decoder`. The names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # for type checkers and readers: the same names, imported eagerly
    from .decoder import DEFAULT_MAX_CONTEXT, ContextPlan, DecoderModel, TextStream, open_decoder, plan_context
    from .engine import EngineOptions, GenerationEngine
    from .prefix_cache import PrefixCache
    from .results import FINISH_REASONS, GenerationEvent, GenerationResult, GenerationTimings, Usage
    from .sampling import Sampler, SamplingParams
    from .telemetry import GenerationTelemetry
    from .template import CHATML, ChatTemplate
    from .text import IncrementalDetokenizer, StopMatcher, Tokenizer, validate_prompt

_LAZY = {
    "CHATML": "template",
    "ChatTemplate": "template",
    "ContextPlan": "decoder",
    "DEFAULT_MAX_CONTEXT": "decoder",
    "DecoderModel": "decoder",
    "EngineOptions": "engine",
    "GenerationEngine": "engine",
    "PrefixCache": "prefix_cache",
    "FINISH_REASONS": "results",
    "GenerationEvent": "results",
    "GenerationResult": "results",
    "GenerationTelemetry": "telemetry",
    "GenerationTimings": "results",
    "IncrementalDetokenizer": "text",
    "Sampler": "sampling",
    "SamplingParams": "sampling",
    "StopMatcher": "text",
    "TextStream": "decoder",
    "Tokenizer": "text",
    "Usage": "results",
    "open_decoder": "decoder",
    "plan_context": "decoder",
    "validate_prompt": "text",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
