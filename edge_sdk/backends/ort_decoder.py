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

import mmap
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import GenerationError, SessionClosedError, SessionError
from .base import SessionOptions
from .ort import _LEVELS, _ort, base_session_options, choose_providers, provider_args, session_info

__all__ = ["MAX_KEEP", "DecoderShape", "KVSlots", "OrtBatchDecoder", "OrtDecoderSession"]

#: The most positions one verification pass returns logits for (a draft of MAX_KEEP - 1 tokens).
MAX_KEEP = 17

_KV_NP = {"float32": np.float32, "float16": np.float16}
_MAP_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) or getattr(mmap, "MAP_SHARED", 1)


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
        # ``logits_to_keep`` (graphs from edge-convert llm >= 0.17, an input with a default of 1):
        # how many last positions get logits; speculative verification needs it.
        # (an input with a default is listed among the overridable initializers, not the inputs)
        self.keeps_logits = "logits_to_keep" in ins or any(i.name == "logits_to_keep" for i in self._sess.get_overridable_initializers())
        if (set(ins) - {"logits_to_keep"}) != want_in or set(outs) != want_out:
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
        if len(lg) != 3 or lg[2] != s.vocab_size or lg[1] not in (1, "keep"):
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


class KVSlots:
    """The KV of ``slots`` sequences of up to ``max_len`` tokens: per layer and tensor one array
    ``[slots, kv_heads, max_len, head_dim]`` in its own anonymous memory map.

    The map is reserved, not resident: Linux backs an anonymous mapping's pages on first write, so
    the resident KV grows with the tokens written, and :meth:`release` gives a finished slot's pages
    back at once (``madvise(MADV_DONTNEED)``: the pages read as zeros afterwards;
    https://man7.org/linux/man-pages/man2/madvise.2.html). One slot's region of a layer tensor is
    contiguous, and so are the first ``n`` slots together: a pass over slots ``[a, a + n)`` binds
    each tensor by address without a copy.
    """

    def __init__(self, shape: DecoderShape, slots: int, max_len: int) -> None:
        if slots < 1 or max_len < 1:
            raise GenerationError(f"KV slots: expected slots >= 1 and max_len >= 1, got {slots} x {max_len}")
        self.shape = shape
        self.slots = int(slots)
        self.max_len = int(max_len)
        dt = np.dtype(_KV_NP[shape.kv_dtype])
        self.dtype = dt
        self.slot_bytes = shape.n_kv_heads * self.max_len * shape.head_dim * dt.itemsize  # one slot, one tensor
        self._maps: list[mmap.mmap] = []
        self.arrays: list[np.ndarray] = []  # layer-major: [l0.key, l0.value, l1.key, ...]
        for _ in range(2 * shape.n_layers):
            # private: a shared anonymous map (Python's default) keeps its pages on MADV_DONTNEED
            m = mmap.mmap(-1, self.slots * self.slot_bytes, flags=_MAP_FLAGS)
            self._maps.append(m)
            self.arrays.append(np.frombuffer(m, dtype=dt).reshape(self.slots, shape.n_kv_heads, self.max_len, shape.head_dim))

    @property
    def reserved_bytes(self) -> int:
        """Address space reserved (all slots at ``max_len``); the resident part is what was written."""
        return self.slots * self.slot_bytes * len(self.arrays)

    def release(self, slot: int) -> None:
        """Give slot ``slot``'s pages back to the OS (its KV reads as zeros afterwards)."""
        page = mmap.PAGESIZE
        start = slot * self.slot_bytes
        lo = -(-start // page) * page  # whole pages inside the slot's region only
        hi = (start + self.slot_bytes) // page * page
        if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            for m in self._maps:
                m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def move(self, src: int, dst: int, n: int) -> None:
        """Copy slot ``src``'s first ``n`` tokens of KV into slot ``dst``."""
        if src != dst and n > 0:
            for a in self.arrays:
                a[dst, :, :n] = a[src, :, :n]

    def snapshot(self, slot: int, n: int) -> np.ndarray:
        """A copy of slot ``slot``'s first ``n`` tokens: ``[2 * layers, kv_heads, n, head_dim]``."""
        out = np.empty((len(self.arrays), self.shape.n_kv_heads, n, self.shape.head_dim), dtype=self.dtype)
        for i, a in enumerate(self.arrays):
            out[i] = a[slot, :, :n]
        return out

    def restore(self, slot: int, snap: np.ndarray, n: int) -> None:
        """Write the first ``n`` tokens of ``snap`` (from :meth:`snapshot`) into slot ``slot``."""
        if n > snap.shape[2] or n > self.max_len:
            raise GenerationError(f"KV restore: {n} tokens asked for, the snapshot holds {snap.shape[2]}, a slot {self.max_len}")
        for i, a in enumerate(self.arrays):
            a[slot, :, :n] = snap[i, :, :n]

    def close(self) -> None:
        """Unmap (idempotent)."""
        self.arrays = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a view is still alive somewhere; the map goes with it
                pass
        self._maps = []


class OrtBatchDecoder:
    """Many sequences through one decoder session: a :class:`KVSlots` of ``slots`` sequences and
    the passes a continuous-batching engine runs between them.

    - :meth:`prefill` runs a prompt chunk of one slot (batch 1, bound to that slot's region);
    - :meth:`decode` runs one token for each of the first ``n`` slots in one pass (batch ``n``): each
      row's ``attention_mask`` has as many ones as that row's tokens, so GroupQueryAttention reads
      and writes each sequence at its own length (``seqlens_k`` per row) and never another's;
    - :meth:`verify` runs ``k + 1`` tokens of one slot and returns the logits of all of them
      (``logits_to_keep``), for speculative decoding.

    The running sequences must occupy slots ``0 .. n-1`` for :meth:`decode` (the engine keeps them
    compact with :meth:`KVSlots.move`). It shares the ``InferenceSession`` (the weights) of an
    :class:`OrtDecoderSession`; ONNX Runtime allows concurrent ``run`` calls on one session, but the
    engine runs one pass at a time. CPU sessions only: on CUDA the KV would live on the device and the
    slot moves and prefix-cache copies would need device copies, which this class does not do.
    """

    def __init__(self, base: OrtDecoderSession, slots: int, max_len: int) -> None:
        if base._sess is None:
            raise SessionClosedError("decoder session is closed")
        if base.device != "cpu":
            raise GenerationError(f"the batch decoder runs on CPU sessions; this one runs on {base.device}")
        self._sess: Any = base._sess
        self.shape = base.shape
        self.info = base.info
        self.keeps_logits = base.keeps_logits
        self.kv = KVSlots(base.shape, slots, max_len)
        self.slots = self.kv.slots
        self.max_len = self.kv.max_len
        self._io = self._sess.io_binding()
        rows = max(self.slots, MAX_KEEP)
        self._ids = np.zeros(rows * self.max_len, dtype=np.int64)
        self._mask = np.zeros(rows * self.max_len, dtype=np.int64)
        self._keep = np.ones(1, dtype=np.int64)
        self._logits = np.zeros(rows * base.shape.vocab_size, dtype=np.float32)
        self._bound: tuple[int, int] | None = None
        self._names = [(f"past_key_values.{i}.{p}", f"present.{i}.{p}") for i in range(base.shape.n_layers) for p in ("key", "value")]
        self.runs = 0

    def _bind_kv(self, start: int, count: int) -> None:
        if self._bound == (start, count):
            return
        s = self.shape
        dims = [count, s.n_kv_heads, self.max_len, s.head_dim]
        off = start * self.kv.slot_bytes
        for (past, present), a in zip(self._names, self.kv.arrays):
            ptr = a.ctypes.data + off
            self._io.bind_input(past, "cpu", 0, a.dtype, dims, ptr)
            self._io.bind_output(present, "cpu", 0, a.dtype, dims, ptr)
        self._bound = (start, count)

    def _run(self, rows: int, seq: int, total: int, keep: int) -> np.ndarray:
        io = self._io
        io.bind_input("input_ids", "cpu", 0, np.int64, [rows, seq], self._ids.ctypes.data)
        io.bind_input("attention_mask", "cpu", 0, np.int64, [rows, total], self._mask.ctypes.data)
        if self.keeps_logits:
            self._keep[0] = keep
            io.bind_input("logits_to_keep", "cpu", 0, np.int64, [1], self._keep.ctypes.data)
        v = self.shape.vocab_size
        io.bind_output("logits", "cpu", 0, np.float32, [rows, keep, v], self._logits.ctypes.data)
        try:
            self._sess.run_with_iobinding(io)
        except Exception as e:
            raise SessionError(f"onnxruntime decoder run failed ({rows} rows x {seq} tokens, {total} total): {e}") from e
        self.runs += 1
        return self._logits[: rows * keep * v].reshape(rows * keep, v)

    def _check(self, slot: int, position: int, n: int) -> None:
        if not 0 <= slot < self.slots:
            raise GenerationError(f"slot {slot}: expected 0 <= slot < {self.slots}")
        if n < 1:
            raise GenerationError("expected at least one token id")
        if position < 0 or position + n > self.max_len:
            raise GenerationError(f"KV slot full: {position} + {n} tokens > {self.max_len} (max_len)")

    def prefill(self, slot: int, ids: Sequence[int] | np.ndarray, position: int) -> np.ndarray:
        """Run ``ids`` in slot ``slot`` after its first ``position`` tokens; the last position's logits ``[vocab]``
        (a view the next pass overwrites)."""
        n = len(ids)
        self._check(slot, position, n)
        self._bind_kv(slot, 1)
        self._ids[:n] = ids
        self._mask[: position + n] = 1
        out: np.ndarray = self._run(1, n, position + n, 1)[0]
        return out

    def verify(self, slot: int, ids: Sequence[int] | np.ndarray, position: int) -> np.ndarray:
        """Run ``ids`` (the last token and a draft) in slot ``slot`` after ``position`` tokens; the logits of
        every one of them ``[len(ids), vocab]`` (a view)."""
        n = len(ids)
        if not self.keeps_logits:
            raise GenerationError(
                "this decoder graph has no logits_to_keep input (converted before edge-sdk 0.17); reconvert it for speculative decoding"
            )
        if n > MAX_KEEP:
            raise GenerationError(f"verify: at most {MAX_KEEP} tokens per pass, got {n}")
        self._check(slot, position, n)
        # The graph declares logits [batch, 1, vocab] (onnxruntime-genai preallocates the declared
        # shape), so a preallocated [1, n, vocab] output is refused: this pass has its own binding
        # with the logits bound first (get_outputs() follows binding order) and left to ONNX Runtime.
        io = self._sess.io_binding()
        io.bind_output("logits", "cpu")
        s = self.shape
        dims = [1, s.n_kv_heads, self.max_len, s.head_dim]
        off = slot * self.kv.slot_bytes
        for (past, present), a in zip(self._names, self.kv.arrays):
            io.bind_input(past, "cpu", 0, a.dtype, dims, a.ctypes.data + off)
            io.bind_output(present, "cpu", 0, a.dtype, dims, a.ctypes.data + off)
        self._ids[:n] = ids
        self._mask[: position + n] = 1
        self._keep[0] = n
        io.bind_input("input_ids", "cpu", 0, np.int64, [1, n], self._ids.ctypes.data)
        io.bind_input("attention_mask", "cpu", 0, np.int64, [1, position + n], self._mask.ctypes.data)
        io.bind_input("logits_to_keep", "cpu", 0, np.int64, [1], self._keep.ctypes.data)
        try:
            self._sess.run_with_iobinding(io)
        except Exception as e:
            raise SessionError(f"onnxruntime decoder verify pass failed ({n} tokens at {position}): {e}") from e
        self.runs += 1
        out: np.ndarray = io.get_outputs()[0].numpy().reshape(n, s.vocab_size)
        return out

    def decode(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One token for each of slots ``0 .. n-1``: ``tokens[i]`` goes in slot ``i`` at position
        ``positions[i]`` (its tokens so far). The logits ``[n, vocab]`` (a view)."""
        n = int(tokens.shape[0])
        if not 1 <= n <= self.slots or positions.shape != (n,):
            raise GenerationError(f"decode: expected 1..{self.slots} tokens and as many positions, got {n} and {positions.shape}")
        lens = positions.astype(np.int64) + 1
        total = int(lens.max())
        if int(positions.min()) < 0 or total > self.max_len:
            raise GenerationError(f"decode: positions must be in [0, {self.max_len}), got {positions.min()}..{positions.max()}")
        self._bind_kv(0, n)
        self._ids[:n] = tokens
        mask = self._mask[: n * total].reshape(n, total)
        np.less(np.arange(total), lens[:, None], out=mask, casting="unsafe")
        return self._run(n, 1, total, 1)

    def close(self) -> None:
        """Release the KV and the binding (the session belongs to the model)."""
        self.kv.close()
        self._io = None
        self._sess = None
