"""A numpy forward pass of a Llama/Qwen2 decoder: the float reference the ONNX graphs are checked against.

It follows Hugging Face's ``modeling_llama.py`` / ``modeling_qwen2.py`` conventions, written out
independently of the graph builder:

- RMSNorm ``x * rsqrt(mean(x^2) + eps) * w`` in float32 (``LlamaRMSNorm``);
- rotary embedding with ``inv_freq = 1 / theta^(arange(0, hd, 2) / hd)`` applied in the half-split
  layout (``rotate_half``), with ``rope_scaling`` types ``"linear"`` and ``"llama3"`` as
  ``transformers/modeling_rope_utils.py`` computes them
  (https://github.com/huggingface/transformers/blob/main/src/transformers/modeling_rope_utils.py);
- grouped-query attention by repeating each KV head ``n_heads / n_kv_heads`` times (``repeat_kv``),
  causal softmax attention with scale ``1 / sqrt(head_dim)``;
- SwiGLU MLP ``down(silu(gate(x)) * up(x))``; tied or separate LM head; Qwen2's q/k/v biases.

Batch size 1. Work is per layer and weights are read once per layer (cached unless
``cache_weights=False``), so a 135M-parameter, 30-layer model runs in float32 within a few
hundred MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .spec import DecoderConfig, DecoderSource, LLMConvertError, UnsupportedModelError

__all__ = ["KVCache", "ReferenceDecoder", "rope_cos_sin", "rope_inv_freq"]


def rope_inv_freq(cfg: DecoderConfig) -> np.ndarray:
    """float64 ``[head_dim / 2]`` rotary inverse frequencies, after ``cfg.rope_scaling``.

    ``None`` / ``"default"``: ``1 / theta^(2i / hd)``. ``"linear"``: divided by ``factor``.
    ``"llama3"``: Llama 3.1's wavelength-banded scaling (``_compute_llama3_parameters`` in
    Hugging Face's ``modeling_rope_utils.py``). Other types raise :class:`UnsupportedModelError`.
    """
    hd = cfg.head_dim
    if hd % 2:
        raise UnsupportedModelError(f"rotary embedding needs an even head_dim, found {hd}")
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rs["factor"])
    if kind == "llama3":
        factor = float(rs["factor"])
        low = float(rs["low_freq_factor"])
        high = float(rs["high_freq_factor"])
        old_ctx = float(rs["original_max_position_embeddings"])
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2.0 * math.pi / inv
        inv_l = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1.0 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, inv_l)
    raise UnsupportedModelError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


def rope_cos_sin(cfg: DecoderConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``cos, sin [len(positions), head_dim / 2]`` of ``position * inv_freq``."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * rope_inv_freq(cfg)[None, :]
    return np.cos(ang), np.sin(ang)


@dataclass
class KVCache:
    """Per-layer keys (after rotary) and values, ``[n_kv_heads, length, head_dim]`` each."""

    keys: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens held."""
        return int(self.keys[0].shape[1]) if self.keys else 0


#: ``hook(group, layer, x)``: group is "attn" (q/k/v input), "o", "ffn" (gate/up input) or "down".
Hook = Callable[[str, int, np.ndarray], None]

_GROUP_OF = {"q": "attn", "k": "attn", "v": "attn", "o": "o", "gate": "ffn", "up": "ffn", "down": "down"}


class ReferenceDecoder:
    """Numpy decoder forward pass (batch 1).

    ``weights`` overrides tensors by canonical name (e.g. dequantized weights, to get the exact
    float model an int4 graph computes). A ``"lm_head"`` entry is used as the head even when the
    model ties embeddings (the head may be quantized while the embedding is not).
    """

    def __init__(
        self,
        src: DecoderSource,
        dtype: type[np.floating] | np.dtype = np.float32,
        weights: Mapping[str, np.ndarray] | None = None,
        *,
        cache_weights: bool = True,
    ) -> None:
        self.src = src
        self.cfg = src.config
        self.dtype = np.dtype(dtype)
        self._override = dict(weights or {})
        self._cache: dict[str, np.ndarray] | None = {} if cache_weights else None
        c = self.cfg
        if c.n_heads % c.n_kv_heads:
            raise UnsupportedModelError(f"n_heads ({c.n_heads}) must be a multiple of n_kv_heads ({c.n_kv_heads})")

    # -- weights -------------------------------------------------------------------------------
    def _w(self, name: str) -> np.ndarray:
        if self._cache is not None and name in self._cache:
            return self._cache[name]
        if name == "lm_head" and "lm_head" not in self._override and self.cfg.tie_embeddings:
            return self._w("embed")
        arr = self._override[name] if name in self._override else self.src.tensor(name)
        arr = np.asarray(arr, dtype=self.dtype)
        if self._cache is not None:
            self._cache[name] = arr
        return arr

    # -- pieces --------------------------------------------------------------------------------
    def _rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        xf = x.astype(np.float32) if self.dtype == np.float16 else x
        var = np.mean(xf * xf, axis=-1, keepdims=True)
        out: np.ndarray = (w * (xf / np.sqrt(var + self.cfg.rms_eps)).astype(self.dtype)).astype(self.dtype)
        return out

    def _rotate(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x ``[heads, seq, hd]``; HF: ``x * cos + rotate_half(x) * sin`` with cos/sin duplicated."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(self.dtype)

    def _linear(self, x: np.ndarray, name: str, bias: str | None = None) -> np.ndarray:
        y = x @ self._w(name).T
        if bias is not None:
            y = y + self._w(bias)
        out: np.ndarray = y.astype(self.dtype)
        return out

    # -- forward -------------------------------------------------------------------------------
    def _forward(
        self, ids: Sequence[int] | np.ndarray, past: KVCache | None, hook: Hook | None = None, stop_after: int | None = None
    ) -> tuple[np.ndarray | None, KVCache]:
        c = self.cfg
        ids_a = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids_a.size == 0:
            raise LLMConvertError("ReferenceDecoder.forward: no token ids given")
        if ids_a.min() < 0 or ids_a.max() >= c.vocab_size:
            raise LLMConvertError(f"token ids must lie in [0, {c.vocab_size}), found range [{ids_a.min()}, {ids_a.max()}]")
        past_len = past.length if past is not None else 0
        seq = ids_a.size
        if past_len + seq > c.context_length:
            raise LLMConvertError(f"past ({past_len}) + new ({seq}) tokens exceed the context length {c.context_length}")
        pos = np.arange(past_len, past_len + seq)
        cos64, sin64 = rope_cos_sin(c, pos)
        cos, sin = cos64.astype(self.dtype), sin64.astype(self.dtype)
        nh, nkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
        rep = nh // nkv
        scale = 1.0 / math.sqrt(hd)
        # causal mask over [seq, past_len + seq]: query at absolute position p sees keys <= p
        allowed = np.arange(past_len + seq)[None, :] <= pos[:, None]

        x = self._w("embed")[ids_a].astype(self.dtype)
        new = KVCache()
        n_layers = c.n_layers if stop_after is None else min(c.n_layers, stop_after + 1)
        for i in range(n_layers):
            p = f"layers.{i}."
            h = self._rmsnorm(x, self._w(p + "attn_norm"))
            if hook:
                hook("attn", i, h)
            bq = (p + "q_bias", p + "k_bias", p + "v_bias") if c.attention_bias else (None, None, None)
            q = self._linear(h, p + "q", bq[0]).reshape(seq, nh, hd).transpose(1, 0, 2)
            k = self._linear(h, p + "k", bq[1]).reshape(seq, nkv, hd).transpose(1, 0, 2)
            v = self._linear(h, p + "v", bq[2]).reshape(seq, nkv, hd).transpose(1, 0, 2)
            q = self._rotate(q, cos, sin)
            k = self._rotate(k, cos, sin)
            if past is not None and past_len:
                k = np.concatenate([past.keys[i], k], axis=1)
                v = np.concatenate([past.values[i], v], axis=1)
            new.keys.append(k)
            new.values.append(v)
            kr = np.repeat(k, rep, axis=0)  # query head j uses kv head j // rep (HF repeat_kv)
            vr = np.repeat(v, rep, axis=0)
            s = (q @ kr.transpose(0, 2, 1)).astype(np.float32 if self.dtype == np.float16 else self.dtype) * scale
            s = np.where(allowed[None], s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            e = np.exp(s)
            a = (e / e.sum(axis=-1, keepdims=True)).astype(self.dtype)
            att = (a @ vr).transpose(1, 0, 2).reshape(seq, nh * hd)
            if hook:
                hook("o", i, att)
            x = (x + self._linear(att, p + "o")).astype(self.dtype)
            h = self._rmsnorm(x, self._w(p + "ffn_norm"))
            if hook:
                hook("ffn", i, h)
            g = self._linear(h, p + "gate")
            u = self._linear(h, p + "up")
            act = (g / (1.0 + np.exp(-g)) * u).astype(self.dtype)
            if hook:
                hook("down", i, act)
            x = (x + self._linear(act, p + "down")).astype(self.dtype)
        if stop_after is not None and n_layers < c.n_layers:
            return None, new
        h = self._rmsnorm(x, self._w("norm"))
        logits = (h @ self._w("lm_head").T).astype(np.float32)
        return logits, new

    def forward(self, ids: Sequence[int] | np.ndarray, past: KVCache | None = None) -> tuple[np.ndarray, KVCache]:
        """Logits ``float32 [seq, vocab]`` for every new position, and the cache extended by ``ids``
        (a new :class:`KVCache`; ``past`` is not modified)."""
        logits, cache = self._forward(ids, past)
        assert logits is not None
        return logits, cache

    def greedy(self, prompt_ids: Sequence[int], max_new: int, eos_ids: Iterable[int] = ()) -> list[int]:
        """The ``max_new`` tokens greedy decoding appends to ``prompt_ids`` (stops after an ``eos_ids``
        token, which is included)."""
        stop = set(eos_ids)
        logits, cache = self.forward(prompt_ids)
        out: list[int] = []
        for _ in range(max_new):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            if tok in stop or len(out) == max_new:
                break
            logits, cache = self.forward([tok], cache)
        return out

    # -- calibration ---------------------------------------------------------------------------
    def collect_linear_inputs(self, ids: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The input ``X [seq, K]`` of every linear projection for one sequence, by canonical name
        (q/k/v share one array, gate/up share one)."""
        groups: dict[tuple[str, int], np.ndarray] = {}

        def hook(group: str, layer: int, x: np.ndarray) -> None:
            groups[(group, layer)] = x.astype(np.float32)

        self._forward(ids, None, hook)
        return {f"layers.{i}.{n}": groups[(g, i)] for i in range(self.cfg.n_layers) for n, g in _GROUP_OF.items() if (g, i) in groups}

    def collect_hessians(
        self, sequences: Iterable[Sequence[int] | np.ndarray], layers: Iterable[int] | None = None
    ) -> dict[str, np.ndarray]:
        """GPTQ's Hessians ``H = X^T X / n_tokens`` (float32 ``[K, K]``) of every projection's input over
        calibration ``sequences``, by canonical name; projections sharing an input share one array.

        ``layers`` limits the work and the memory (about ``3 d^2 + ffn^2`` floats per layer) to some
        layers; the forward pass stops after the last one asked for.
        """
        want = set(range(self.cfg.n_layers)) if layers is None else set(layers)
        if not want:
            return {}
        acc: dict[tuple[str, int], np.ndarray] = {}
        n_tok = 0

        def hook(group: str, layer: int, x: np.ndarray) -> None:
            if layer not in want:
                return
            xd = x.astype(np.float64)
            key = (group, layer)
            if key in acc:
                acc[key] += xd.T @ xd
            else:
                acc[key] = xd.T @ xd

        for seq in sequences:
            arr = np.asarray(seq, dtype=np.int64).reshape(-1)
            self._forward(arr, None, hook, stop_after=max(want))
            n_tok += arr.size
        if n_tok == 0:
            raise LLMConvertError("collect_hessians: no calibration tokens given")
        shared = {key: (h / n_tok).astype(np.float32) for key, h in acc.items()}
        return {f"layers.{i}.{n}": shared[(g, i)] for i in sorted(want) for n, g in _GROUP_OF.items() if (g, i) in shared}
