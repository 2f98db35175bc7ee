"""Block-wise int4/int8 weight quantization for ONNX Runtime's ``MatMulNBits`` and ``GatherBlockQuantized``.

A linear weight ``w`` is ``[N, K]`` (Hugging Face layout: out features x in features). It is cut
into blocks of ``block_size`` consecutive input features (the K axis) per output row; each block
gets one float32 scale and (asymmetric methods) one unsigned integer zero point, and its values
become unsigned levels ``q`` in ``[0, 2^bits - 1]``::

    w[n, k] ~= (q[n, b, j] - zero_point[n, b]) * scale[n, b]      b = k // block_size, j = k % block_size

which is exactly the dequantization ``MatMulNBits`` performs (ONNX Runtime's contrib operator
documentation, https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#commicrosoftmatmulnbits).
Symmetric weights carry no zero point; the operator then uses ``2^(bits-1)``.

Methods:

- ``"rtn"``: round-to-nearest, asymmetric, with the block's range widened to include 0 and
  ``round half away from zero``, as ONNX Runtime's own quantizer (MLAS ``range2scalezp`` in
  ``onnxruntime/core/mlas/lib/q4_dq.cpp``) does, so its levels agree with
  ``onnxruntime.quantization.matmul_nbits_quantizer``.
- ``"rtn_sym"``: round-to-nearest, symmetric: the block's signed extreme maps to level 0
  (``scale = -extreme / 2^(bits-1)``), as MLAS ``range2scale`` does.
- ``"hqq"``: half-quadratic quantization (Badri & Shaji 2023, https://mobiusml.github.io/hqq_blog/):
  the zero point is fitted by a proximal solver of ``||w - dequant(quant(w))||_p`` (p = 0.7) with
  shrinkage, as ``HQQWeightOnlyQuantizer.optimize_weights`` in ONNX Runtime, in numpy; then,
  because ``MatMulNBits`` is only fast with integer zero points, the zero point is rounded and the
  scale refitted by least squares for that zero point. Each block keeps whichever of its HQQ and
  its min/max solution has the lower squared error, so HQQ never loses to min/max rounding on a
  block.
- ``"gptq"``: GPTQ (Frantar et al. 2022, https://arxiv.org/abs/2210.17323): columns are quantized
  in order and each column's rounding error is spread over the columns not yet quantized through
  the Cholesky factor of the damped inverse Hessian ``H = X^T X`` of the layer's input, with lazy
  block updates; scales and zero points are fitted per quantization block (group) from the
  updated weights, asymmetric min/max as ``"rtn"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import LLMConvertError, UnsupportedModelError

__all__ = [
    "METHODS",
    "QuantizedWeight",
    "concat_cols",
    "concat_rows",
    "dequantize",
    "pack_gather_block_quantized",
    "pack_matmulnbits",
    "quantize",
]

#: The quantization methods :func:`quantize` accepts.
METHODS = ("rtn", "rtn_sym", "hqq", "gptq")
_BITS = (4, 8)


@dataclass(frozen=True)
class QuantizedWeight:
    """One block-quantized ``[N, K]`` weight, unpacked (one level per byte).

    ``q`` is ``uint8 [N, n_blocks, block_size]`` (K padded up to ``n_blocks * block_size``; padded
    positions hold the block's zero point, so they dequantize to 0), ``scales`` is
    ``float32 [N, n_blocks]``, ``zero_points`` is ``uint8 [N, n_blocks]`` or ``None`` (symmetric:
    the implied zero point is ``2^(bits-1)``).
    """

    bits: int
    block_size: int
    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    method: str
    K: int
    N: int
    #: ``float32 [N, n_blocks]`` or None: a per-block offset added after dequantizing (``w = (q - zp) *
    #: scale + offset``), for weights imported exactly from a format whose zero point is a float (GGUF
    #: Q4_1: ``w = d * q + m``). The graph adds it as ``blocksum(x) @ offset.T`` next to MatMulNBits.
    offsets: np.ndarray | None = None

    @property
    def n_blocks(self) -> int:
        """Blocks per row (``ceil(K / block_size)``)."""
        return int(self.q.shape[1])

    @property
    def symmetric(self) -> bool:
        """True when no zero points are stored (the implied one is ``2^(bits-1)``)."""
        return self.zero_points is None

    def effective_zero_points(self) -> np.ndarray:
        """``uint8 [N, n_blocks]``: the stored zero points, or the implied ``2^(bits-1)``."""
        if self.zero_points is not None:
            return self.zero_points
        return np.full(self.scales.shape, 1 << (self.bits - 1), dtype=np.uint8)

    def packed_nbytes(self) -> int:
        """Bytes of the ``MatMulNBits`` initializers (B, scales, packed zero points)."""
        b, s, z = pack_matmulnbits(self)
        return int(b.nbytes + s.nbytes + (z.nbytes if z is not None else 0))


def _check_args(w: np.ndarray, bits: int, block_size: int, method: str) -> None:
    if w.ndim != 2:
        raise LLMConvertError(f"quantize expects a 2-D weight [N, K], found shape {w.shape}")
    if bits not in _BITS:
        raise UnsupportedModelError(f"quantize: bits must be one of {_BITS}, found {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise UnsupportedModelError(f"quantize: block_size must be a power of two >= 16 (MatMulNBits' rule), found {block_size}")
    if method not in METHODS:
        raise UnsupportedModelError(f"quantize: method must be one of {METHODS}, found {method!r}")
    if not np.all(np.isfinite(w)):
        raise LLMConvertError(f"quantize: the weight holds {int(np.sum(~np.isfinite(w)))} non-finite values")


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C ``roundf`` (half away from zero), as MLAS rounds; numpy's ``round`` is half to even."""
    return np.asarray(np.sign(x) * np.floor(np.abs(x) + 0.5))


def _blocks(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``w [N, K]`` -> (values ``[N, nb, bs]`` zero-padded, validity mask ``[1, nb, bs]``)."""
    n, k = w.shape
    nb = -(-k // block_size)
    pad = nb * block_size - k
    wp = np.pad(w, ((0, 0), (0, pad))) if pad else w
    mask = np.ones(nb * block_size, dtype=bool)
    if pad:
        mask[k:] = False
    return wp.reshape(n, nb, block_size), mask.reshape(1, nb, block_size)


def _minmax_params(wb: np.ndarray, mask: np.ndarray, bits: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """MLAS's per-block scale and zero point (float32) for blocks ``[..., bs]``."""
    maxq = float((1 << bits) - 1)
    big = np.float32(np.finfo(np.float32).max)
    mn = np.where(mask, wb, big).min(axis=-1)
    mx = np.where(mask, wb, -big).max(axis=-1)
    if symmetric:
        extreme = np.where(np.abs(mx) > np.abs(mn), mx, mn)
        scale = (-extreme / np.float32(1 << (bits - 1))).astype(np.float32)
        zp = np.full(scale.shape, 1 << (bits - 1), dtype=np.float32)
        return scale, zp
    mn = np.minimum(mn, 0.0).astype(np.float32)
    mx = np.maximum(mx, 0.0).astype(np.float32)
    scale = ((mx - mn) / np.float32(maxq)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zp_f = np.where(scale != 0, -mn / np.where(scale != 0, scale, 1), mn)
    zp = np.clip(_round_half_away(zp_f), 0, maxq).astype(np.float32)
    return scale, zp


def _levels(wb: np.ndarray, scale: np.ndarray, zp: np.ndarray, bits: int) -> np.ndarray:
    """Round ``wb [..., bs]`` onto the grid: ``clamp(round(w / scale + zp))`` (reciprocal as MLAS)."""
    maxq = float((1 << bits) - 1)
    with np.errstate(divide="ignore"):
        recip = np.where(scale != 0, np.float32(1.0) / np.where(scale != 0, scale, 1), 0).astype(np.float32)
    return np.asarray(np.clip(_round_half_away(wb * recip[..., None] + zp[..., None]), 0, maxq))


def _finish(
    q: np.ndarray, scale: np.ndarray, zp: np.ndarray, mask: np.ndarray, bits: int, block_size: int, method: str, k: int, symmetric: bool
) -> QuantizedWeight:
    q = np.where(mask, q, zp[..., None])  # padded positions dequantize to exactly 0
    return QuantizedWeight(
        bits=bits,
        block_size=block_size,
        q=q.astype(np.uint8),
        scales=np.ascontiguousarray(scale, dtype=np.float32),
        zero_points=None if symmetric else zp.astype(np.uint8),
        method=method,
        K=k,
        N=int(q.shape[0]),
    )


def _rtn(w: np.ndarray, bits: int, block_size: int, symmetric: bool, method: str) -> QuantizedWeight:
    wb, mask = _blocks(w, block_size)
    scale, zp = _minmax_params(wb, mask, bits, symmetric)
    q = _levels(wb, scale, zp, bits)
    return _finish(q, scale, zp, mask, bits, block_size, method, w.shape[1], symmetric)


def _block_sq_error(wb: np.ndarray, mask: np.ndarray, q: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    r = (q - zp[..., None]) * scale[..., None]
    return np.asarray(np.sum(np.where(mask, (wb - r) ** 2, 0.0), axis=-1))


def _hqq(w: np.ndarray, bits: int, block_size: int, iters: int = 20) -> QuantizedWeight:
    """HQQ on each block, in the inverse-scale form of the HQQ reference (``w_q = round(w * s + z)``)."""
    wb, mask = _blocks(w, block_size)
    wb = wb.astype(np.float32)
    maxq = float((1 << bits) - 1)
    lp, beta, kappa = 0.7, 10.0, 1.01
    big = np.float32(np.finfo(np.float32).max)
    mn = np.where(mask, wb, big).min(axis=-1)
    mx = np.where(mask, wb, -big).max(axis=-1)
    rng_ = mx - mn
    rng_ = np.where(rng_ == 0, maxq, rng_)
    s = np.minimum(maxq / rng_, 2e4).astype(np.float32)  # inverse scale
    z = np.round(-mn * s).astype(np.float32)
    cnt = np.maximum(mask.sum(axis=-1), 1)
    best_err = np.inf

    def shrink(x: np.ndarray, b: float) -> np.ndarray:
        return np.asarray(np.sign(x) * np.maximum(np.abs(x) - (1.0 / b) * np.power(np.abs(x) + 1e-8, lp - 1), 0.0))

    for _ in range(iters):
        wq = np.clip(np.round(wb * s[..., None] + z[..., None]), 0, maxq)
        wr = (wq - z[..., None]) / s[..., None]
        we = shrink(wb - wr, beta)
        z_new = np.sum(np.where(mask, wq - (wb - we) * s[..., None], 0.0), axis=-1) / cnt
        beta *= kappa
        err = float(np.mean(np.abs(np.where(mask, wb - wr, 0.0))))
        if err < best_err:
            best_err = err
            z = z_new.astype(np.float32)
        else:
            break
    # Integer zero point (fast MatMulNBits path), then the least-squares scale for that zero point.
    zi = np.clip(np.round(z), 0, maxq).astype(np.float32)
    scale = (1.0 / s).astype(np.float32)
    for _ in range(2):
        q = _levels(wb, scale, zi, bits)
        d = np.where(mask, q - zi[..., None], 0.0)
        den = np.sum(d * d, axis=-1)
        num = np.sum(d * wb, axis=-1)
        scale = np.where(den > 0, num / np.where(den > 0, den, 1), scale).astype(np.float32)
    q_h = _levels(wb, scale, zi, bits)
    # Guard: per block, keep the HQQ solution only where it beats min/max rounding.
    s_r, z_r = _minmax_params(wb, mask, bits, symmetric=False)
    q_r = _levels(wb, s_r, z_r, bits)
    better = _block_sq_error(wb, mask, q_h, scale, zi) < _block_sq_error(wb, mask, q_r, s_r, z_r)
    q = np.where(better[..., None], q_h, q_r)
    scale = np.where(better, scale, s_r)
    zi = np.where(better, zi, z_r)
    return _finish(q, scale, zi, mask, bits, block_size, "hqq", w.shape[1], symmetric=False)


def _cholesky(a: np.ndarray, bs: int = 128) -> np.ndarray:
    """Lower Cholesky factor, blocked so the work is matrix products (numpy's own ``cholesky``
    took 2.2 s for a 1536 x 1536 matrix here, this about 0.1 s). Raises ``LinAlgError`` if ``a``
    is not positive definite."""
    a = a.copy()
    n = a.shape[0]
    low = np.zeros_like(a)
    for j in range(0, n, bs):
        e = min(j + bs, n)
        ljj = np.linalg.cholesky(a[j:e, j:e])
        low[j:e, j:e] = ljj
        if e < n:
            lij = a[e:, j:e] @ np.linalg.inv(ljj).T  # solves lij @ ljj^T = a[e:, j:e]
            low[e:, j:e] = lij
            a[e:, e:] -= lij @ lij.T
    return low


def _inv_lower(low: np.ndarray, bs: int = 128) -> np.ndarray:
    """Inverse of a lower-triangular matrix by block forward substitution."""
    n = low.shape[0]
    inv = np.zeros_like(low)
    for i in range(0, n, bs):
        e = min(i + bs, n)
        dinv = np.linalg.inv(low[i:e, i:e])
        inv[i:e, i:e] = dinv
        if i:
            inv[i:e, :i] = -dinv @ (low[i:e, :i] @ inv[:i, :i])
    return inv


def _inv_upper_cholesky(h: np.ndarray) -> np.ndarray:
    """Upper-triangular ``U`` with ``U^T U = h^-1`` (what GPTQ's ``cholesky(cholesky_inverse(
    cholesky(H)), upper=True)`` computes), from one Cholesky: with ``J`` the reversal permutation
    and ``J h J = L L^T``, ``U = J L^-1 J``."""
    low = _cholesky(h[::-1, ::-1])
    return np.ascontiguousarray(_inv_lower(low)[::-1, ::-1])


def _gptq(w: np.ndarray, bits: int, block_size: int, hessian: np.ndarray, damp: float = 0.01) -> QuantizedWeight:
    """GPTQ (Frantar et al. 2022, Algorithm 1) with group-wise min/max parameters per ``block_size``."""
    n, k = w.shape
    if hessian.shape != (k, k):
        raise LLMConvertError(f"gptq: the Hessian must be [K, K] = [{k}, {k}], found {hessian.shape}")
    if not np.all(np.isfinite(hessian)):
        raise LLMConvertError("gptq: the Hessian holds non-finite values")
    maxq = float((1 << bits) - 1)
    W = w.astype(np.float64).copy()
    H = hessian.astype(np.float64).copy()
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    mean_diag = float(np.mean(np.diag(H)))
    hinv = None
    for attempt in range(6):
        Hd = H + (damp * (10.0**attempt)) * mean_diag * np.eye(k)
        try:
            hinv = _inv_upper_cholesky(Hd)
            break
        except np.linalg.LinAlgError:
            continue
    if hinv is None:
        raise LLMConvertError("gptq: the damped Hessian is not positive definite even with 1000x the damping")

    nb = -(-k // block_size)
    scales = np.zeros((n, nb), dtype=np.float32)
    zps = np.zeros((n, nb), dtype=np.float32)
    Q = np.zeros((n, k), dtype=np.float64)
    lazy = block_size * max(1, 128 // block_size)  # lazy-update block, a whole number of groups
    for i1 in range(0, k, lazy):
        i2 = min(i1 + lazy, k)
        W1 = W[:, i1:i2].copy()
        Err1 = np.zeros_like(W1)
        Hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % block_size == 0:
                g = col // block_size
                ge = min(i + block_size, i2 - i1)
                grp = W1[:, i:ge].astype(np.float32)
                gmask = np.ones((1, grp.shape[1]), dtype=bool)
                s_g, z_g = _minmax_params(grp, gmask, bits, symmetric=False)
                scales[:, g], zps[:, g] = s_g, z_g
            g = col // block_size
            s_c, z_c = scales[:, g].astype(np.float64), zps[:, g].astype(np.float64)
            wcol = W1[:, i]
            with np.errstate(divide="ignore", invalid="ignore"):
                qc = np.clip(_round_half_away(np.where(s_c != 0, wcol / np.where(s_c != 0, s_c, 1), 0) + z_c), 0, maxq)
            Q[:, col] = qc
            deq = (qc - z_c) * s_c
            err = (wcol - deq) / Hinv1[i, i]
            W1[:, i:] -= np.outer(err, Hinv1[i, i:])
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ hinv[i1:i2, i2:]
    wb, mask = _blocks(Q, block_size)
    return _finish(wb, scales, zps, mask, bits, block_size, "gptq", k, symmetric=False)


def quantize(w: np.ndarray, bits: int, block_size: int = 32, method: str = "rtn", hessian: np.ndarray | None = None) -> QuantizedWeight:
    """Quantize ``w [N, K]`` block-wise along K (see the module docstring for the methods).

    K need not be a multiple of ``block_size``: the last block is padded (its padded levels hold the
    zero point, and ``MatMulNBits`` ignores inputs past K). ``hessian`` (``[K, K]``, ``X^T X`` of the
    layer's input over calibration tokens) is required by ``"gptq"`` and refused by the others.
    """
    w = np.asarray(w)
    _check_args(w, bits, block_size, method)
    w = w.astype(np.float32, copy=False)
    if method == "gptq":
        if hessian is None:
            raise LLMConvertError("quantize: method 'gptq' needs the layer input's Hessian (X^T X), found none")
        return _gptq(w, bits, block_size, np.asarray(hessian))
    if hessian is not None:
        raise LLMConvertError(f"quantize: method {method!r} takes no Hessian (only 'gptq' does)")
    # Rows are independent for these methods: work in chunks of about 2^21 values to bound the
    # temporaries (a 49152 x 576 LM head would otherwise hold several 113 MB float32 copies).
    rows = max(1, (1 << 21) // max(1, w.shape[1]))
    parts = []
    for r0 in range(0, w.shape[0], rows):
        wc = w[r0 : r0 + rows]
        if method == "hqq":
            parts.append(_hqq(wc, bits, block_size))
        else:
            parts.append(_rtn(wc, bits, block_size, symmetric=(method == "rtn_sym"), method=method))
    return parts[0] if len(parts) == 1 else concat_rows(parts)


def dequantize(qw: QuantizedWeight) -> np.ndarray:
    """``[N, K]`` float32: ``(q - zero_point) * scale``, computed in float32 as MatMulNBits does."""
    zp = qw.effective_zero_points().astype(np.float32)
    w = (qw.q.astype(np.float32) - zp[..., None]) * qw.scales[..., None]
    if qw.offsets is not None:
        w = w + qw.offsets[..., None].astype(np.float32)
    return np.ascontiguousarray(w.reshape(qw.N, -1)[:, : qw.K])


def concat_cols(a: QuantizedWeight, b: QuantizedWeight) -> QuantizedWeight:
    """``[a, b]`` along K (``a.K`` a multiple of the block size, so ``b`` starts a new block): one weight
    over ``a.K + b.K`` inputs. Same bits, block size and N needed; neither may carry offsets."""
    if (a.bits, a.block_size, a.N) != (b.bits, b.block_size, b.N) or a.K % a.block_size or a.offsets is not None or b.offsets is not None:
        raise LLMConvertError(
            f"concat_cols: need equal (bits, block_size, N), a.K a multiple of the block and no offsets; got "
            f"{(a.bits, a.block_size, a.N, a.K)} and {(b.bits, b.block_size, b.N, b.K)}"
        )
    sym = a.symmetric and b.symmetric
    return QuantizedWeight(
        bits=a.bits,
        block_size=a.block_size,
        q=np.concatenate([a.q, b.q], axis=1),
        scales=np.concatenate([a.scales, b.scales], axis=1),
        zero_points=None if sym else np.concatenate([a.effective_zero_points(), b.effective_zero_points()], axis=1),
        method=a.method,
        K=a.K + b.K,
        N=a.N,
    )


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack quantized weights along N (fused q/k/v or gate/up): same bits, block size and K needed.

    If only some parts are symmetric, their implied zero points are written out.
    """
    if not parts:
        raise LLMConvertError("concat_rows: nothing to concatenate")
    p0 = parts[0]
    for p in parts[1:]:
        if (p.bits, p.block_size, p.K) != (p0.bits, p0.block_size, p0.K):
            raise LLMConvertError(
                f"concat_rows: parts differ in (bits, block_size, K): {(p0.bits, p0.block_size, p0.K)} vs {(p.bits, p.block_size, p.K)}"
            )
    sym = all(p.symmetric for p in parts)
    methods = sorted({p.method for p in parts})
    offsets = None
    if any(p.offsets is not None for p in parts):
        offsets = np.concatenate([p.offsets if p.offsets is not None else np.zeros(p.scales.shape, np.float32) for p in parts], axis=0)
    return QuantizedWeight(
        offsets=offsets,
        bits=p0.bits,
        block_size=p0.block_size,
        q=np.concatenate([p.q for p in parts], axis=0),
        scales=np.concatenate([p.scales for p in parts], axis=0),
        zero_points=None if sym else np.concatenate([p.effective_zero_points() for p in parts], axis=0),
        method="+".join(methods),
        K=p0.K,
        N=sum(p.N for p in parts),
    )


def _pack_last(levels: np.ndarray, bits: int, pad: int = 0) -> np.ndarray:
    """Pack unsigned levels along the last axis, low-order bits first (``bits`` 4 or 8); an odd
    count is padded with ``pad``."""
    if bits == 8:
        return np.ascontiguousarray(levels, dtype=np.uint8)
    lv = levels.astype(np.uint8)
    if lv.shape[-1] % 2:
        lv = np.concatenate([lv, np.full(lv.shape[:-1] + (1,), pad, np.uint8)], axis=-1)
    return np.ascontiguousarray((lv[..., 0::2] & 0x0F) | ((lv[..., 1::2] & 0x0F) << 4), dtype=np.uint8)


def pack_matmulnbits(qw: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The ``MatMulNBits`` initializers: ``B uint8 [N, n_blocks, block_size * bits / 8]``, ``scales
    float32 [N * n_blocks]``, ``zero_points uint8 [N, ceil(n_blocks * bits / 8)]`` (packed like B,
    each row padded to whole bytes) or ``None`` (symmetric; the operator then uses ``2^(bits-1)``).

    Layout per ONNX Runtime's ContribOperators.md (MatMulNBits) and its quantizer
    (``onnxruntime/quantization/matmul_nbits_quantizer.py``, MLAS ``BlockwiseQuantizer``).
    """
    b = _pack_last(qw.q, qw.bits)
    scales = np.ascontiguousarray(qw.scales.reshape(-1), dtype=np.float32)
    # a row's unused last nibble holds 2^(bits-1), as ONNX Runtime's quantizer writes it
    zp = None if qw.zero_points is None else _pack_last(qw.zero_points, qw.bits, pad=1 << (qw.bits - 1))
    return b, scales, zp


def pack_gather_block_quantized(qw: QuantizedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The ``GatherBlockQuantized`` initializers for an embedding table quantized as ``qw`` (rows = tokens).

    Returns ``(data, scales, zero_points)``: ``data`` is the very array :func:`pack_matmulnbits`
    gives as ``B`` (``uint8 [vocab, n_blocks, blob]``), so a tied LM head and the embedding can
    share one initializer; the operator is then used with ``bits``, ``block_size``,
    ``gather_axis=0`` and ``quantize_axis=2``: each block is one row of the last axis (packed low
    bits first, as uint8 ``data`` requires). ``scales`` is ``float32 [vocab, n_blocks, 1]`` and
    ``zero_points`` ``uint8 [vocab, n_blocks, 1]`` (one level per byte, low bits), or ``None``
    (symmetric: uint8 data's default zero point is ``2^(bits-1)``). The gathered rows come out as
    ``[..., n_blocks, block_size]`` and need a reshape (and, if K was padded, a slice) to
    ``[..., K]``. ``GatherBlockQuantized`` wants scales of the same rank as ``data``, which
    ``MatMulNBits`` refuses (it takes ``[N * n_blocks]`` or ``[N, n_blocks]``), so the scales and
    zero points cannot be shared (measured on ONNX Runtime 1.32); they are small
    (``vocab * n_blocks * 5`` bytes).
    """
    b = _pack_last(qw.q, qw.bits)
    scales = np.ascontiguousarray(qw.scales[..., None], dtype=np.float32)
    zp = None if qw.zero_points is None else np.ascontiguousarray(qw.zero_points[..., None], dtype=np.uint8)
    return b, scales, zp
