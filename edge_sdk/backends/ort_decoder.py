"""ONNX Runtime seam for decoder-only language models: prefill and decode steps over one
preallocated KV buffer per sequence, with IOBinding.

The graph contract (written by ``edge-convert llm``; docs/generation.md):

- inputs ``input_ids`` int64 ``[1, seq]``, ``attention_mask`` int64 ``[1, past + seq]`` and, per
  layer ``i``, ``past_key_values.{i}.key`` / ``.value`` ``[1, kv_heads, max_len, head_dim]``;
- outputs ``logits`` float32 ``[1, 1, vocab]`` (the last position only) and ``present.{i}.key`` /
  ``.value``, the same shape as the past.

GroupQueryAttention writes the new keys and values into the buffer in place when past and
present are the same memory (ONNX Runtime's ``past_present_share_buffer``; see
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.GroupQueryAttention),
so one buffer per layer and tensor holds the whole sequence, allocated once at ``max_len``
tokens and never copied or grown (onnxruntime-genai's ``past_present_share_buffer`` layout).
IOBinding binds every buffer by address once; a step rebinds only the token ids and the mask
length (https://onnxruntime.ai/docs/api/python/api_summary.html#iobinding). On CUDA the KV
buffers live on the device (``OrtValue.ortvalue_from_shape_and_type``); ids, mask and logits
stay on the host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import GenerationError, SessionError
from .base import SessionOptions
from .ort import _LEVELS, _ort, base_session_options, choose_providers, provider_args, session_info

__all__ = ["DecoderShape", "OrtDecoderSession"]

_KV_NP = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class DecoderShape:
    """What the runtime checks a decoder graph against (from the package's ``[generation]``)."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str = "float32"

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * np.dtype(_KV_NP[self.kv_dtype]).itemsize


class OrtDecoderSession:
    """One sequence's decoder session: a KV buffer of ``max_len`` tokens and the bound I/O.

    ``prefill(ids)`` runs the prompt (or a chunk of it) from the current position; ``step(id)``
    runs one token. Both return the logits of the last position as a float32 view ``[vocab]``
    that the next call overwrites (copy it to keep it). ``reset()`` starts a new sequence in
    the same buffers. Not thread-safe: one sequence, one caller at a time.
    """

    def __init__(self, model: bytes | str, shape: DecoderShape, options: SessionOptions, max_len: int) -> None:
        ort = _ort()
        if max_len < 1:
            raise GenerationError(f"max_len: expected >= 1 token, got {max_len}")
        t0 = time.perf_counter()
        providers, notes = choose_providers(options.providers, tuple(ort.get_available_providers()))
        so = base_session_options(ort, options)
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[options.graph_optimization])
        try:
            self._sess: Any = ort.InferenceSession(model, sess_options=so, providers=provider_args(providers, options))
        except Exception as e:  # onnxruntime raises its own pybind exception types
            raise SessionError(f"onnxruntime could not load the decoder model: {e}") from e
        self.shape = shape
        self.max_len = int(max_len)
        self._check_signature()
        self.info = session_info(ort, self._sess, options, providers, list(notes), "off (decoder)", t0)
        used = self.info.providers_used
        self.device = "cuda" if used and used[0] == "CUDAExecutionProvider" else "cpu"
        kv_np = _KV_NP[shape.kv_dtype]
        kv_shape = (1, shape.n_kv_heads, self.max_len, shape.head_dim)
        self._io = self._sess.io_binding()
        self._kv: list[Any] = []  # keep the buffers (numpy arrays or device OrtValues) alive
        for i in range(shape.n_layers):
            for part in ("key", "value"):
                if self.device == "cpu":
                    buf = np.zeros(kv_shape, dtype=kv_np)
                    ov = ort.OrtValue.ortvalue_from_numpy(buf)
                    self._kv.append(buf)
                else:
                    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(kv_shape), kv_np, "cuda", 0)
                self._kv.append(ov)
                self._io.bind_ortvalue_input(f"past_key_values.{i}.{part}", ov)
                self._io.bind_ortvalue_output(f"present.{i}.{part}", ov)
        self._ids = np.zeros((1, self.max_len), dtype=np.int64)
        self._mask = np.ones((1, self.max_len), dtype=np.int64)
        self._logits = np.zeros((1, 1, shape.vocab_size), dtype=np.float32)
        self._io.bind_output("logits", "cpu", 0, np.float32, list(self._logits.shape), self._logits.ctypes.data)
        self.position = 0  # tokens in the KV buffer
        self.runs = 0

    def _check_signature(self) -> None:
        s = self.shape
        ins = {i.name: i for i in self._sess.get_inputs()}
        outs = {o.name: o for o in self._sess.get_outputs()}
        want_in = {"input_ids", "attention_mask"} | {f"past_key_values.{i}.{p}" for i in range(s.n_layers) for p in ("key", "value")}
        want_out = {"logits"} | {f"present.{i}.{p}" for i in range(s.n_layers) for p in ("key", "value")}
        if set(ins) != want_in or set(outs) != want_out:
            raise GenerationError(
                f"decoder graph does not match the package's [generation] ({s.n_layers} layers): inputs missing "
                f"{sorted(want_in - set(ins))[:4]}, unexpected {sorted(set(ins) - want_in)[:4]}; outputs missing "
                f"{sorted(want_out - set(outs))[:4]}, unexpected {sorted(set(outs) - want_out)[:4]}"
            )
        kv_type = "tensor(float)" if s.kv_dtype == "float32" else "tensor(float16)"
        past = ins["past_key_values.0.key"]
        dims = list(past.shape)
        if past.type != kv_type or len(dims) != 4 or dims[1] != s.n_kv_heads or dims[3] != s.head_dim:
            raise GenerationError(
                f"decoder graph's past_key_values.0.key is {past.type} {dims}; the package says {kv_type} "
                f"[batch, {s.n_kv_heads}, max_len, {s.head_dim}]"
            )
        lg = list(outs["logits"].shape)
        if len(lg) != 3 or lg[2] != s.vocab_size:
            raise GenerationError(f"decoder graph's logits are {lg}; the package says [batch, 1, {s.vocab_size}]")

    @property
    def free(self) -> int:
        """Tokens the KV buffer can still take."""
        return self.max_len - self.position

    def reset(self, position: int = 0) -> None:
        """Start over at ``position`` (0: a new sequence; n: keep the first n tokens' KV, e.g. a shared prompt)."""
        if not 0 <= position <= self.position:
            raise GenerationError(f"reset: position must be in [0, {self.position}], got {position}")
        self.position = position

    def _run(self, n: int) -> np.ndarray:
        total = self.position + n
        if total > self.max_len:
            raise GenerationError(f"KV buffer full: {self.position} + {n} tokens > {self.max_len} (max_len)")
        io = self._io
        io.bind_input("input_ids", "cpu", 0, np.int64, [1, n], self._ids.ctypes.data)
        io.bind_input("attention_mask", "cpu", 0, np.int64, [1, total], self._mask.ctypes.data)
        try:
            self._sess.run_with_iobinding(io)
        except Exception as e:
            raise SessionError(f"onnxruntime decoder run failed at position {self.position} (+{n} tokens): {e}") from e
        self.position = total
        self.runs += 1
        out: np.ndarray = self._logits[0, 0]
        return out

    def prefill(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Run ``ids`` from the current position; the logits of the last one (a view, overwritten by the next call)."""
        n = len(ids)
        if n < 1:
            raise GenerationError("prefill: expected at least one token id")
        if self.position + n > self.max_len:
            raise GenerationError(f"KV buffer full: {self.position} + {n} tokens > {self.max_len} (max_len)")
        self._ids[0, :n] = ids
        return self._run(n)

    def step(self, token_id: int) -> np.ndarray:
        """Run one token; the logits after it (a view, overwritten by the next call)."""
        self._ids[0, 0] = token_id
        return self._run(1)

    def close(self) -> None:
        """Release the session and the KV buffers (idempotent)."""
        self._sess = None
        self._io = None
        self._kv = []
