"""The types every part of the LLM converter shares.

A :class:`DecoderSource` is a model read from GGUF or safetensors, normalised to one naming
and layout (Hugging Face's: linear weights ``[out_features, in_features]``, Q/K rows in the
half-split rotary order that Hugging Face's ``rotate_half`` and ONNX Runtime's
GroupQueryAttention with ``rotary_interleaved=0`` use), so that the graph builder and the
quantizers never know where the weights came from.

Tensor names (``i`` is the layer index)::

    embed                    [vocab, d_model]
    layers.{i}.attn_norm     [d_model]
    layers.{i}.q             [n_heads * head_dim, d_model]      (+ layers.{i}.q_bias [n_heads * head_dim])
    layers.{i}.k             [n_kv_heads * head_dim, d_model]   (+ layers.{i}.k_bias)
    layers.{i}.v             [n_kv_heads * head_dim, d_model]   (+ layers.{i}.v_bias)
    layers.{i}.o             [d_model, n_heads * head_dim]
    layers.{i}.ffn_norm      [d_model]
    layers.{i}.gate          [ffn_dim, d_model]
    layers.{i}.up            [ffn_dim, d_model]
    layers.{i}.down          [d_model, ffn_dim]
    norm                     [d_model]
    lm_head                  [vocab, d_model]   (absent when tie_embeddings)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ConverterError

__all__ = [
    "ARCHITECTURES",
    "DecoderConfig",
    "DecoderSource",
    "LLMConvertError",
    "SourceFormatError",
    "UnsupportedModelError",
    "tensor_names",
]

#: Architectures the converter builds (Llama family). Qwen2 differs by q/k/v biases.
ARCHITECTURES = ("llama", "qwen2")


class LLMConvertError(ConverterError, ValueError):
    """Base of the LLM converter's errors."""


class SourceFormatError(LLMConvertError):
    """A GGUF or safetensors file is malformed, truncated or hostile (sizes that overflow,
    offsets outside the file); the message names the file, the field and what was expected."""


class UnsupportedModelError(LLMConvertError):
    """The model uses an architecture, tensor type, quantization type or setting the converter
    does not build; the message names it and what is supported."""


@dataclass(frozen=True)
class DecoderConfig:
    """The architecture facts the graph needs (from ``config.json`` or GGUF metadata)."""

    architecture: str  # one of ARCHITECTURES
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    #: None, or {"type": "linear", "factor": f} or {"type": "llama3", "factor", "low_freq_factor",
    #: "high_freq_factor", "original_max_position_embeddings"} (Hugging Face's rope_scaling).
    rope_scaling: Mapping[str, Any] | None = None
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 4) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * kv_dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        d = dict(self.__dict__)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["rope_scaling"] = dict(self.rope_scaling) if self.rope_scaling else None
        return d


def tensor_names(cfg: DecoderConfig) -> list[str]:
    """Every tensor name a complete :class:`DecoderSource` for ``cfg`` holds."""
    names = ["embed", "norm"]
    if not cfg.tie_embeddings:
        names.append("lm_head")
    for i in range(cfg.n_layers):
        names += [f"layers.{i}.{n}" for n in ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down")]
        if cfg.attention_bias:
            names += [f"layers.{i}.{n}_bias" for n in ("q", "k", "v")]
    return names


@dataclass
class DecoderSource:
    """A decoder model ready to be built: config, float32 weights by canonical name, tokenizer.

    ``load(name)`` returns a float32 array (dequantized if the file stores it quantized); it may
    read lazily. ``native_quant`` maps a canonical name to the file's own quantization type
    (e.g. ``"Q4_1"``) for tensors stored quantized, for reports.
    """

    config: DecoderConfig
    load: Callable[[str], np.ndarray]
    tokenizer_json: str  # a Hugging Face ``tokenizers`` JSON document
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    source_path: str = ""
    source_kind: str = ""  # "gguf" | "safetensors"
    source_sha256: str = ""
    native_quant: dict[str, str] = field(default_factory=dict)
    name: str = ""  # the model's own name, when the file says
    #: Whether the caller should prepend ``bos_token`` to an encoded prompt: the file asks for it
    #: (GGUF ``tokenizer.ggml.add_bos_token``) and ``tokenizer_json`` does not do it itself.
    #: Chat templates that already start with the BOS text make this moot; the runtime decides.
    add_bos: bool = False
    #: GGUF sources: ``load_raw(name) -> (ggml type name, uint8 [rows, row_bytes])``, the tensor's own
    #: blocks with rows in canonical (un-permuted) order, for importing quantized weights exactly.
    load_raw: Callable[[str], tuple[str, np.ndarray]] | None = None

    def tensor(self, name: str) -> np.ndarray:
        """Canonical tensor ``name`` as float32 (checked against the config's shape)."""
        return self.load(name)
