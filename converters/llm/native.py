"""Import a GGUF file's own quantized blocks exactly, instead of re-rounding them onto a new grid.

Re-quantizing 4-bit weights that are already 4-bit compounds the rounding error (SmolLM2-135M's
Q4_1 file: RTN onto a fresh int4 grid costs ~29 % perplexity, measured by ``edge-convert llm``);
taking the blocks as they are costs nothing. ggml's block formats
(https://github.com/ggml-org/ggml/blob/master/src/ggml-common.h, ``block_q4_0``, ``block_q4_1``,
``block_q8_0``; 32 weights per block; dequantization in ggml-quants.c ``dequantize_row_q4_*``):

- ``Q4_0``: fp16 ``d``, 16 bytes of nibbles; ``w = d * (q - 8)``; low nibbles are weights 0-15,
  high nibbles 16-31. MatMulNBits' symmetric form (implied zero point 8): exact.
- ``Q8_0``: fp16 ``d``, 32 int8; ``w = d * q``. MatMulNBits 8-bit with the implied zero point
  128 and ``q + 128`` stored: exact.
- ``Q4_1``: fp16 ``d``, fp16 ``m``, 16 bytes of nibbles; ``w = d * q + m``. MatMulNBits takes an
  integer zero point only at full speed (a float one runs a kernel 17-67x slower), so
  ``z = round(-m / d)`` and the rest, ``m + d * z`` (at most ``d / 2``), is a per-block offset
  the graph adds as ``blocksum(x) @ offset.T`` (:attr:`.quant.QuantizedWeight.offsets`): exact.

Other types (K-quants, Q5_*) are not imported: :func:`native_weight` returns None and the caller
re-quantizes the float weights.
"""

from __future__ import annotations

import numpy as np

from .quant import QuantizedWeight
from .spec import DecoderSource, LLMConvertError

__all__ = ["NATIVE_BITS", "native_overrides", "native_weight"]

#: ggml types imported exactly, and the bits MatMulNBits stores them in.
NATIVE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
_BLOCK = 32
_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [..., 16] -> levels uint8 [..., 32] in ggml's order (low nibbles first, then high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def native_weight(src: DecoderSource, name: str) -> QuantizedWeight | None:
    """Canonical tensor ``name`` as its GGUF blocks, exactly, or None when the source has no raw
    blocks or stores it in a type not imported (see the module docs)."""
    if src.load_raw is None:
        return None
    qtype = src.native_quant.get(name if name != "lm_head" or not src.config.tie_embeddings else "embed")
    raw_name = "embed" if name == "lm_head" and src.config.tie_embeddings else name
    if qtype not in NATIVE_BITS:
        return None
    got, raw = src.load_raw(raw_name)
    if got != qtype or raw.ndim != 2 or raw.shape[1] % _BYTES[qtype]:
        raise LLMConvertError(f"native import of {name!r}: expected {qtype} rows of {_BYTES[qtype]}-byte blocks, found {got} {list(raw.shape)}")
    n = raw.shape[0]
    nb = raw.shape[1] // _BYTES[qtype]
    blocks = raw.reshape(n, nb, _BYTES[qtype])
    d = blocks[..., 0:2].copy().view("<f2")[..., 0].astype(np.float32)
    offsets = None
    zp = None
    if qtype == "Q8_0":
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        bits = 8
    elif qtype == "Q4_0":
        q = _nibbles(blocks[..., 2:])
        bits = 4
    else:  # Q4_1
        m = blocks[..., 2:4].copy().view("<f2")[..., 0].astype(np.float32)
        q = _nibbles(blocks[..., 4:])
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(d != 0, np.rint(-m / np.where(d != 0, d, 1.0)), 0.0)
        z = np.clip(z, 0, 15)
        zp = z.astype(np.uint8)
        offsets = (m + d * z).astype(np.float32)
        bits = 4
    if not (np.isfinite(d).all() and (offsets is None or np.isfinite(offsets).all())):
        raise LLMConvertError(f"native import of {name!r}: non-finite block scales in the {qtype} data")
    return QuantizedWeight(
        bits=bits, block_size=_BLOCK, q=np.ascontiguousarray(q), scales=np.ascontiguousarray(d), zero_points=zp,
        method=f"native-{qtype.lower()}", K=nb * _BLOCK, N=n, offsets=offsets,
    )  # fmt: skip


def native_overrides(src: DecoderSource) -> dict[str, int]:
    """Bits per canonical linear name (and ``lm_head``) for an int4 plan that imports the file's blocks:
    8 for tensors stored as Q8_0, 4 for Q4_0/Q4_1 (empty when the source has none of these)."""
    cfg = src.config
    names = [f"layers.{i}.{p}" for i in range(cfg.n_layers) for p in ("q", "k", "v", "o", "gate", "up", "down")] + ["lm_head"]
    out: dict[str, int] = {}
    for name in names:
        key = "embed" if name == "lm_head" and src.config.tie_embeddings else name
        bits = NATIVE_BITS.get(src.native_quant.get(key, ""))
        if bits is not None and src.load_raw is not None:
            out[name] = bits
    return out
