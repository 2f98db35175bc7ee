"""Read decoder-only LLM weights from a GGUF file or a Hugging Face folder into a :class:`DecoderSource`.

Two formats, one result (:mod:`.spec`: canonical names, ``[out, in]`` linear weights, Q/K rows in
Hugging Face's half-split rotary order, float32 on :meth:`DecoderSource.load`):

* **GGUF** (llama.cpp; format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), for the
  ``llama`` and ``qwen2`` architectures. The header (metadata and tensor infos) is parsed here, not
  by ``gguf.GGUFReader``: every count, length, dimension, type and offset is checked against the
  file's size and the format's limits *before* it is used, so a truncated or hostile file raises
  :class:`SourceFormatError` / :class:`UnsupportedModelError` naming the file, the field and what
  was expected, and nothing is read outside the file (tensor bytes are read with ``seek``/``read``
  of a checked range, never through a memory map that a truncation could turn into SIGBUS).
  Tensors are dequantized on demand with ``gguf.quants.dequantize`` (the reference numpy
  implementation maintained with llama.cpp), every ggml type it implements; the others are refused
  up front. llama.cpp's converter permutes the Q and K rows of ``llama`` models for its rotary
  layout (``LlamaModel.permute`` in
  https://github.com/ggml-org/llama.cpp/blob/master/convert_hf_to_gguf.py); :func:`unpermute_qk`
  undoes that. ``qwen2`` is converted without a permutation (llama.cpp runs it with NEOX rope,
  which is Hugging Face's order), so its Q/K are taken as they are.
  ``source_sha256`` is the sha256 of the GGUF file.

* **Hugging Face folder**: ``config.json`` (``model_type`` ``llama`` or ``qwen2``), safetensors
  weights (``model.safetensors``, a single other ``*.safetensors``, or shards listed in
  ``model.safetensors.index.json``), ``tokenizer.json`` and optionally ``tokenizer_config.json``
  (chat template, BOS/EOS text), ``chat_template.jinja`` and ``generation_config.json`` (more EOS
  ids). The safetensors header (format: https://github.com/huggingface/safetensors#format) is
  parsed and checked here too. ``source_sha256`` is the sha256 of the one safetensors file, or for
  shards the sha256 of the ``sha256sum``-style manifest ``"<sha256>  <file name>\\n"`` of every shard
  in file-name order.

Entry point: :func:`read_source` (picks the format from the path).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

import numpy as np

from .spec import ARCHITECTURES, DecoderConfig, DecoderSource, SourceFormatError, UnsupportedModelError, tensor_names
from .tokenizer_gguf import GGUFTokenizer, gguf_tokenizer

__all__ = [
    "GGUFHeader",
    "GGUFTensorInfo",
    "MAX_GGUF_ARRAY",
    "MAX_GGUF_STRING",
    "MAX_CONTEXT_LENGTH",
    "MAX_SAFETENSORS_HEADER",
    "expected_shape",
    "gguf_tensor_name",
    "hf_tensor_name",
    "permute_qk",
    "read_gguf",
    "read_gguf_header",
    "read_hf_folder",
    "read_source",
    "unpermute_qk",
]

PathLike = str | os.PathLike[str]

#: Longest metadata string value accepted (a chat template is a few KiB; a 64 MiB string is hostile).
MAX_GGUF_STRING = 64 << 20
#: Longest metadata key / tensor name (the GGUF spec caps keys at 65535 bytes, ggml names at 64).
_MAX_GGUF_KEY = 65535
_MAX_GGUF_NAME = 255
#: Most entries in one metadata array, except the per-token arrays of the tokenizer.
MAX_GGUF_ARRAY = 1 << 24
_MAX_GGUF_TOKEN_ARRAY = 1 << 26
_TOKEN_ARRAYS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"})
_MAX_ARRAY_DEPTH = 2
_GGML_MAX_DIMS = 4
_GGUF_DEFAULT_ALIGNMENT = 32
_INT64_MAX = (1 << 63) - 1
#: Largest safetensors JSON header accepted.
MAX_SAFETENSORS_HEADER = 100_000_000
_READ_CHUNK = 4 << 20
#: Largest context length accepted: the graph sizes its rotary caches to it (16 Mi positions).
MAX_CONTEXT_LENGTH = 1 << 24

# GGUF value types (gguf.md "gguf_metadata_value_type"): id -> (name, struct format or None).
_GGUF_STRING = 8
_GGUF_ARRAY = 9
_GGUF_BOOL = 7
_GGUF_SCALARS: dict[int, tuple[str, str]] = {
    0: ("UINT8", "B"),
    1: ("INT8", "b"),
    2: ("UINT16", "H"),
    3: ("INT16", "h"),
    4: ("UINT32", "I"),
    5: ("INT32", "i"),
    6: ("FLOAT32", "f"),
    7: ("BOOL", "B"),
    10: ("UINT64", "Q"),
    11: ("INT64", "q"),
    12: ("FLOAT64", "d"),
}
_GGUF_NP = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_GGUF_INTS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_GGUF_FLOATS = frozenset({6, 12})
_GGUF_TYPE_NAMES = {**{k: v[0] for k, v in _GGUF_SCALARS.items()}, 8: "STRING", 9: "ARRAY"}


# --- GGUF header -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor info record: ``dims`` as the file stores them (``ne[0]`` first, the fastest)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int  # relative to the data section
    n_elements: int
    n_bytes: int
    info_offset: int  # where the record starts in the file

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy (row-major) shape: ``dims`` reversed."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFHeader:
    """A checked GGUF header: metadata as plain Python values, their GGUF types, the tensor infos."""

    path: str
    file_size: int
    version: int
    alignment: int
    data_offset: int  # absolute offset of the tensor data section
    fields: dict[str, Any]
    field_types: dict[str, tuple[int, ...]]  # key -> (type,) or (ARRAY, element type, ...)
    tensors: dict[str, GGUFTensorInfo]


class _Cursor:
    """Sequential little-endian reads from a file, each one checked against the file's size."""

    def __init__(self, f: BinaryIO, size: int, source: str) -> None:
        self.f = f
        self.size = size
        self.source = source
        self.pos = 0
        self._buf = b""
        self._buf_start = 0

    def fail(self, what: str, expected: str, found: str) -> SourceFormatError:
        return SourceFormatError(f"{self.source}: {what}: expected {expected}, found {found}")

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(what, f"{n} bytes at offset {self.pos}", f"the file ends at {self.size} bytes (truncated?)")
        start = self.pos - self._buf_start
        if start + n > len(self._buf):
            self.f.seek(self.pos)
            self._buf = self.f.read(max(n, _READ_CHUNK))
            self._buf_start = self.pos
            start = 0
            if len(self._buf) < n:
                raise self.fail(what, f"{n} bytes at offset {self.pos}", f"only {len(self._buf)} could be read (the file changed?)")
        self.pos += n
        return self._buf[start : start + n]

    def unpack(self, fmt: str, what: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size, what))[0]

    def string(self, what: str, limit: int) -> str:
        length = self.unpack("Q", f"{what} (length)")
        if length > limit:
            raise self.fail(what, f"a string of at most {limit:,} bytes", f"a length of {length:,}")
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(what, "UTF-8 text", f"invalid UTF-8 at byte {exc.start}") from None


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int) -> tuple[Any, tuple[int, ...]]:
    what = f"metadata {key!r}"
    if vtype == _GGUF_STRING:
        return cur.string(what, MAX_GGUF_STRING), (vtype,)
    if vtype in _GGUF_SCALARS:
        value = cur.unpack(_GGUF_SCALARS[vtype][1], what)
        if vtype == _GGUF_BOOL:
            if value not in (0, 1):
                raise cur.fail(what, "a bool (0 or 1)", f"byte {value}")
            value = bool(value)
        elif vtype == 6:
            # The shortest decimal that round-trips the float32 (1e-05, not 9.99999974737875e-06).
            value = float(str(np.float32(value)))
        return value, (vtype,)
    if vtype == _GGUF_ARRAY:
        if depth >= _MAX_ARRAY_DEPTH:
            raise cur.fail(what, f"arrays nested at most {_MAX_ARRAY_DEPTH} deep", "a deeper array")
        etype = cur.unpack("I", f"{what} (array element type)")
        count = cur.unpack("Q", f"{what} (array length)")
        limit = _MAX_GGUF_TOKEN_ARRAY if key in _TOKEN_ARRAYS else MAX_GGUF_ARRAY
        if count > limit:
            raise cur.fail(what, f"an array of at most {limit:,} entries", f"{count:,}")
        if etype in _GGUF_SCALARS:
            fmt = _GGUF_SCALARS[etype][1]
            itemsize = struct.calcsize(fmt)
            raw = cur.take(count * itemsize, what)
            arr = np.frombuffer(raw, dtype=_GGUF_NP[etype])
            if etype == _GGUF_BOOL:
                if arr.size and int(arr.max()) > 1:
                    raise cur.fail(what, "bools (0 or 1)", f"byte {int(arr.max())}")
                return [bool(v) for v in arr.tolist()], (vtype, etype)
            return arr.tolist(), (vtype, etype)
        if etype not in (_GGUF_STRING, _GGUF_ARRAY):
            raise cur.fail(what, f"an array element type in {sorted(_GGUF_TYPE_NAMES)}", f"type {etype}")
        min_item = 8 if etype == _GGUF_STRING else 12
        if count * min_item > cur.remaining():
            raise cur.fail(what, f"{count:,} entries of at least {min_item} bytes", f"{cur.remaining():,} bytes left in the file")
        items: list[Any] = []
        sub: tuple[int, ...] = (etype,)
        if etype == _GGUF_STRING:
            for i in range(count):
                items.append(cur.string(f"{what}[{i}]", MAX_GGUF_STRING))
        else:
            for i in range(count):
                item, sub = _read_value(cur, _GGUF_ARRAY, f"{key}[{i}]", depth + 1)
                items.append(item)
        return items, (vtype, *sub)
    raise cur.fail(what, f"a value type in {sorted(_GGUF_TYPE_NAMES)}", f"type {vtype}")


def _ggml_types() -> tuple[type[Any], dict[Any, tuple[int, int]]]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGMLQuantizationType, GGML_QUANT_SIZES


def read_gguf_header(path: PathLike) -> GGUFHeader:
    """Parse and check a GGUF file's header without reading any tensor data.

    Checked: magic ``GGUF``, version 2 or 3 (little-endian), tensor and metadata counts that the file
    can hold, string and array lengths against the file's end and :data:`MAX_GGUF_STRING` /
    :data:`MAX_GGUF_ARRAY`, UTF-8 keys and strings, no duplicate keys or tensor names, 1..4 dims of
    at least 1 each whose product fits int64, known ggml types whose block divides ``ne[0]``,
    ``general.alignment`` (UINT32, power of two), offsets aligned, every tensor inside the file and
    no two overlapping. Raises :class:`SourceFormatError` (or :class:`UnsupportedModelError` for a
    big-endian or version-1 file, or a ggml type number the ``gguf`` package does not know).
    """
    p = Path(path)
    source = str(p)
    GGMLQuantizationType, quant_sizes = _ggml_types()
    try:
        f = open(p, "rb")
    except OSError as exc:
        raise SourceFormatError(f"{source}: cannot open the GGUF file: {exc}") from exc
    with f:
        size = os.fstat(f.fileno()).st_size
        cur = _Cursor(f, size, source)
        magic = cur.take(4, "magic")
        if magic != b"GGUF":
            raise cur.fail("magic", "b'GGUF' (a GGUF file)", repr(magic))
        version = cur.unpack("I", "version")
        if version not in (2, 3):
            if version == 1:
                raise UnsupportedModelError(f"{source}: GGUF version 1 (32-bit counts) is not supported; supported: 2, 3")
            if version & 0xFFFF == 0 and (version >> 24) in (2, 3):
                raise UnsupportedModelError(f"{source}: a big-endian GGUF file is not supported; convert it little-endian")
            raise cur.fail("version", "GGUF version 2 or 3", str(version))
        tensor_count = cur.unpack("Q", "tensor_count")
        kv_count = cur.unpack("Q", "metadata_kv_count")
        # A tensor info is at least 8 (name length) + 1 + 4 + 8 + 4 + 8 bytes, a key/value at least
        # 8 + 1 + 4 + 1: counts the rest of the file cannot hold are refused before any loop.
        if tensor_count * 33 > cur.remaining():
            raise cur.fail("tensor_count", f"at most {cur.remaining() // 33:,} tensors in a file of {size:,} bytes", f"{tensor_count:,}")
        if kv_count * 14 > cur.remaining():
            raise cur.fail("metadata_kv_count", f"at most {cur.remaining() // 14:,} entries in a file of {size:,} bytes", f"{kv_count:,}")

        fields: dict[str, Any] = {}
        field_types: dict[str, tuple[int, ...]] = {}
        for n in range(kv_count):
            key = cur.string(f"metadata key #{n}", _MAX_GGUF_KEY)
            if not key:
                raise cur.fail(f"metadata key #{n}", "a non-empty key", "an empty string")
            if key in fields:
                raise cur.fail(f"metadata key #{n}", "unique keys", f"{key!r} a second time")
            vtype = cur.unpack("I", f"metadata {key!r} (value type)")
            value, types = _read_value(cur, vtype, key, 0)
            fields[key] = value
            field_types[key] = types

        alignment = _GGUF_DEFAULT_ALIGNMENT
        if "general.alignment" in fields:
            if field_types["general.alignment"] != (4,):
                raise cur.fail("metadata 'general.alignment'", "a UINT32", _type_name(field_types["general.alignment"]))
            alignment = fields["general.alignment"]
            if alignment <= 0 or alignment & (alignment - 1):
                raise cur.fail("metadata 'general.alignment'", "a power of two", str(alignment))

        infos: list[GGUFTensorInfo] = []
        names: set[str] = set()
        for n in range(tensor_count):
            start = cur.pos
            name = cur.string(f"tensor info #{n} name", _MAX_GGUF_NAME)
            what = f"tensor {name!r}"
            if name in names:
                raise cur.fail(f"tensor info #{n} name", "unique tensor names", f"{name!r} a second time")
            names.add(name)
            n_dims = cur.unpack("I", f"{what} n_dims")
            if not 1 <= n_dims <= _GGML_MAX_DIMS:
                raise cur.fail(f"{what} n_dims", f"1..{_GGML_MAX_DIMS}", str(n_dims))
            dims = tuple(cur.unpack("Q", f"{what} dims[{d}]") for d in range(n_dims))
            if any(d < 1 for d in dims):
                raise cur.fail(f"{what} dims", "every dimension >= 1", str(list(dims)))
            n_elements = math.prod(dims)
            if n_elements > _INT64_MAX:
                raise cur.fail(f"{what} dims", "a product that fits int64", f"{list(dims)} ({n_elements:,} elements)")
            raw_type = cur.unpack("I", f"{what} type")
            try:
                qtype = GGMLQuantizationType(raw_type)
                block, type_size = quant_sizes[qtype]
            except (ValueError, KeyError):
                raise UnsupportedModelError(
                    f"{source}: tensor {name!r} has ggml type {raw_type}, which is not a ggml type the gguf package knows"
                ) from None
            if dims[0] % block:
                raise cur.fail(f"{what} dims[0]", f"a multiple of the {qtype.name} block size {block}", str(dims[0]))
            offset = cur.unpack("Q", f"{what} offset")
            if offset % alignment:
                raise cur.fail(f"{what} offset", f"a multiple of the alignment {alignment}", str(offset))
            infos.append(GGUFTensorInfo(name, dims, raw_type, qtype.name, offset, n_elements, n_elements // block * type_size, start))

        data_offset = cur.pos + (-cur.pos % alignment)
        for t in infos:
            end = data_offset + t.offset + t.n_bytes
            if end > size:
                raise SourceFormatError(
                    f"{source}: tensor {t.name!r} data [{data_offset + t.offset:,}, {end:,}) ({t.type_name} {list(t.dims)}): "
                    f"expected inside the file, found the file ends at {size:,} bytes"
                )
        ordered = sorted(infos, key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.n_bytes > b.offset:
                raise SourceFormatError(
                    f"{source}: tensor {b.name!r} data (offset {b.offset:,}): expected no overlap, found it overlaps "
                    f"tensor {a.name!r} [{a.offset:,}, {a.offset + a.n_bytes:,})"
                )
    return GGUFHeader(source, size, version, alignment, data_offset, fields, field_types, {t.name: t for t in infos})


def _type_name(types: tuple[int, ...]) -> str:
    return (
        "[" + " of ".join(_GGUF_TYPE_NAMES.get(t, str(t)) for t in types) + "]"
        if len(types) > 1
        else _GGUF_TYPE_NAMES.get(types[0], str(types[0]))
    )


# --- Q/K permutation ---------------------------------------------------------------------------------


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (Hugging Face order -> GGUF order) of Q or K rows.

    ``n_head`` is the number of query heads for Q and of KV heads for K; ``w`` is a weight
    ``[rows, in]`` or a bias ``[rows]``.
    """
    return np.ascontiguousarray(w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute_qk` (GGUF order -> Hugging Face half-split rotary order)."""
    return np.ascontiguousarray(w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


# --- shapes ------------------------------------------------------------------------------------------


def expected_shape(cfg: DecoderConfig, name: str) -> tuple[int, ...]:
    """The canonical shape of tensor ``name`` for ``cfg`` (see :mod:`.spec`). KeyError for an unknown name."""
    d, q, kv, ffn = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_dim
    if name in ("embed", "lm_head"):
        return (cfg.vocab_size, d)
    if name == "norm":
        return (d,)
    m = re.fullmatch(r"layers\.(\d+)\.(\w+)", name)
    if m is None or int(m.group(1)) >= cfg.n_layers:
        raise KeyError(name)
    shapes = {
        "attn_norm": (d,),
        "ffn_norm": (d,),
        "q": (q, d),
        "k": (kv, d),
        "v": (kv, d),
        "o": (d, q),
        "gate": (ffn, d),
        "up": (ffn, d),
        "down": (d, ffn),
        "q_bias": (q,),
        "k_bias": (kv,),
        "v_bias": (kv,),
    }
    return shapes[m.group(2)]


#: Per-layer canonical part -> (llama.cpp's GGUF tensor name, Hugging Face's), below ``blk.N.`` / ``model.layers.N.``.
_LAYER_NAMES = {
    "attn_norm": ("attn_norm.weight", "input_layernorm.weight"),
    "q": ("attn_q.weight", "self_attn.q_proj.weight"),
    "k": ("attn_k.weight", "self_attn.k_proj.weight"),
    "v": ("attn_v.weight", "self_attn.v_proj.weight"),
    "o": ("attn_output.weight", "self_attn.o_proj.weight"),
    "q_bias": ("attn_q.bias", "self_attn.q_proj.bias"),
    "k_bias": ("attn_k.bias", "self_attn.k_proj.bias"),
    "v_bias": ("attn_v.bias", "self_attn.v_proj.bias"),
    "ffn_norm": ("ffn_norm.weight", "post_attention_layernorm.weight"),
    "gate": ("ffn_gate.weight", "mlp.gate_proj.weight"),
    "up": ("ffn_up.weight", "mlp.up_proj.weight"),
    "down": ("ffn_down.weight", "mlp.down_proj.weight"),
}
_TOP_NAMES = {
    "embed": ("token_embd.weight", "model.embed_tokens.weight"),
    "norm": ("output_norm.weight", "model.norm.weight"),
    "lm_head": ("output.weight", "lm_head.weight"),
}


def _name(canonical: str, which: int, layer_prefix: str) -> str:
    if canonical in _TOP_NAMES:
        return _TOP_NAMES[canonical][which]
    _, i, part = canonical.split(".")
    return f"{layer_prefix}{i}.{_LAYER_NAMES[part][which]}"


def gguf_tensor_name(canonical: str) -> str:
    """llama.cpp's GGUF tensor name for a canonical one (``layers.0.q`` -> ``blk.0.attn_q.weight``)."""
    return _name(canonical, 0, "blk.")


def hf_tensor_name(canonical: str) -> str:
    """Hugging Face's tensor name for a canonical one (``layers.0.q`` -> ``model.layers.0.self_attn.q_proj.weight``)."""
    return _name(canonical, 1, "model.layers.")


# --- GGUF model --------------------------------------------------------------------------------------


class _Meta:
    """Typed access to GGUF metadata with errors naming the file and the key."""

    def __init__(self, header: GGUFHeader) -> None:
        self.h = header

    def _fail(self, key: str, expected: str, found: str) -> SourceFormatError:
        return SourceFormatError(f"{self.h.path}: metadata {key!r}: expected {expected}, found {found}")

    def has(self, key: str) -> bool:
        return key in self.h.fields

    def get_int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        if key not in self.h.fields:
            if default is None:
                raise SourceFormatError(f"{self.h.path}: metadata {key!r} is missing; a decoder GGUF must have it")
            return default
        types = self.h.field_types[key]
        if types[0] == _GGUF_ARRAY:
            raise UnsupportedModelError(
                f"{self.h.path}: metadata {key!r} is a per-layer array; only one value for every layer is supported"
            )
        if types[0] not in _GGUF_INTS:
            raise self._fail(key, "an integer", _type_name(types))
        value = int(self.h.fields[key])
        if value < minimum:
            raise self._fail(key, f"an integer >= {minimum}", str(value))
        return value

    def get_float(self, key: str, default: float | None = None) -> float:
        if key not in self.h.fields:
            if default is None:
                raise SourceFormatError(f"{self.h.path}: metadata {key!r} is missing; a decoder GGUF must have it")
            return default
        types = self.h.field_types[key]
        if types[0] not in _GGUF_FLOATS:
            raise self._fail(key, "a FLOAT32 or FLOAT64", _type_name(types))
        value = float(self.h.fields[key])
        if not (math.isfinite(value) and value > 0):
            raise self._fail(key, "a finite number > 0", str(value))
        return value

    def get_str(self, key: str, default: str | None = None) -> str:
        if key not in self.h.fields:
            if default is None:
                raise SourceFormatError(f"{self.h.path}: metadata {key!r} is missing; a decoder GGUF must have it")
            return default
        types = self.h.field_types[key]
        if types != (_GGUF_STRING,):
            raise self._fail(key, "a STRING", _type_name(types))
        return str(self.h.fields[key])


_SUPPORTED_GGML: dict[int, bool] = {}


def _dequantizable(ggml_type: int) -> bool:
    """Whether ggml type ``ggml_type`` can be read: F32, F16, BF16, or a type ``gguf.quants.dequantize``
    implements (probed once, on one zero block)."""
    if ggml_type not in _SUPPORTED_GGML:
        import gguf.quants
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        qtype = GGMLQuantizationType(ggml_type)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
            ok = True
        else:
            block, type_size = GGML_QUANT_SIZES[qtype]
            try:
                out = gguf.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
                ok = out.shape == (1, block)
            except (NotImplementedError, ValueError, TypeError, IndexError):
                ok = False
        _SUPPORTED_GGML[ggml_type] = ok
    return _SUPPORTED_GGML[ggml_type]


def _dequantize(raw: bytes, info: GGUFTensorInfo, source: str) -> np.ndarray:
    import gguf.quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType(info.ggml_type)
    shape = info.shape
    buf = np.frombuffer(raw, dtype=np.uint8)
    try:
        if qtype == GGMLQuantizationType.F32:
            out = buf.view("<f4").reshape(shape).astype(np.float32)
        elif qtype == GGMLQuantizationType.F16:
            out = buf.view("<f2").reshape(shape).astype(np.float32)
        elif qtype == GGMLQuantizationType.BF16:
            out = (buf.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        else:
            block, type_size = GGML_QUANT_SIZES[qtype]
            rows = info.n_elements // info.dims[0]
            out = gguf.quants.dequantize(buf.reshape(rows, info.dims[0] // block * type_size), qtype)
            out = np.asarray(out, dtype=np.float32).reshape(shape)
    except (ValueError, TypeError, IndexError, ArithmeticError) as exc:
        raise SourceFormatError(f"{source}: tensor {info.name!r} ({info.type_name} {list(info.dims)}) does not dequantize: {exc}") from exc
    return np.ascontiguousarray(out)


_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
_GGUF_KNOWN_LAYER_PARTS = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "attn_q.bias",
        "attn_k.bias",
        "attn_v.bias",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    }
)


def _gguf_config(h: GGUFHeader, tok_eos: tuple[int, ...], tok: GGUFTokenizer) -> DecoderConfig:
    meta = _Meta(h)
    arch = meta.get_str("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{h.path}: architecture {arch!r} (general.architecture) is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    n_layers = meta.get_int(f"{arch}.block_count")
    d_model = meta.get_int(f"{arch}.embedding_length")
    n_heads = meta.get_int(f"{arch}.attention.head_count")
    n_kv = meta.get_int(f"{arch}.attention.head_count_kv", n_heads)
    if n_heads % n_kv:
        raise SourceFormatError(
            f"{h.path}: metadata '{arch}.attention.head_count_kv': expected a divisor of head_count {n_heads}, found {n_kv}"
        )
    if meta.has(f"{arch}.attention.key_length"):
        head_dim = meta.get_int(f"{arch}.attention.key_length")
        value_dim = meta.get_int(f"{arch}.attention.value_length", head_dim)
        if value_dim != head_dim:
            raise UnsupportedModelError(
                f"{h.path}: key_length {head_dim} != value_length {value_dim}; only equal K/V head sizes are supported"
            )
    else:
        if d_model % n_heads:
            raise SourceFormatError(
                f"{h.path}: metadata '{arch}.embedding_length': expected a multiple of head_count {n_heads}, found {d_model}"
            )
        head_dim = d_model // n_heads
    if head_dim % 2:
        raise SourceFormatError(f"{h.path}: head size: expected an even number (rotary halves), found {head_dim}")
    rope_dims = meta.get_int(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelError(
            f"{h.path}: partial rotary ({arch}.rope.dimension_count {rope_dims} of head size {head_dim}) is not supported"
        )
    scaling: dict[str, Any] | None = None
    kind = meta.get_str(f"{arch}.rope.scaling.type", "")
    factor_key = f"{arch}.rope.scaling.factor" if meta.has(f"{arch}.rope.scaling.factor") else f"{arch}.rope.scale_linear"
    if kind not in ("", "none", "linear"):
        raise UnsupportedModelError(f"{h.path}: rope scaling {kind!r} ({arch}.rope.scaling.type) is not supported; supported: none, linear")
    if kind != "none" and meta.has(factor_key):
        factor = meta.get_float(factor_key)
        if factor != 1.0:
            scaling = {"type": "linear", "factor": factor}
    elif kind == "linear":
        raise SourceFormatError(f"{h.path}: metadata '{arch}.rope.scaling.factor' is missing; linear rope scaling needs it")
    if "rope_freqs.weight" in h.tensors:
        raise UnsupportedModelError(
            f"{h.path}: tensor 'rope_freqs.weight' (per-frequency rope factors, llama.cpp's form of Llama 3 rope scaling) is not supported"
        )

    embed = h.tensors.get("token_embd.weight")
    if embed is None:
        raise SourceFormatError(f"{h.path}: tensor 'token_embd.weight' is missing; a decoder GGUF must have it")
    if len(embed.dims) != 2 or embed.dims[0] != d_model:
        raise SourceFormatError(f"{h.path}: tensor 'token_embd.weight' dims: expected [{d_model}, vocab], found {list(embed.dims)}")
    vocab = embed.dims[1]
    if meta.has(f"{arch}.vocab_size") and meta.get_int(f"{arch}.vocab_size") != vocab:
        raise SourceFormatError(
            f"{h.path}: metadata '{arch}.vocab_size': expected the token_embd rows {vocab}, found {meta.get_int(f'{arch}.vocab_size')}"
        )
    if tok.n_tokens > vocab:
        raise SourceFormatError(f"{h.path}: tokenizer.ggml.tokens: expected at most {vocab} tokens (token_embd rows), found {tok.n_tokens}")
    prefix = "blk.0."
    bias_names = [f"{prefix}attn_{x}.bias" for x in "qkv"]
    has_bias = [n in h.tensors for n in bias_names]
    if arch == "qwen2":
        if not all(has_bias):
            missing = [n for n, b in zip(bias_names, has_bias) if not b]
            raise SourceFormatError(f"{h.path}: tensor {missing[0]!r} is missing; qwen2 has q/k/v biases")
        bias = True
    else:
        if any(has_bias) and not all(has_bias):
            raise SourceFormatError(
                f"{h.path}: q/k/v biases: expected all three or none, found only {[n for n, b in zip(bias_names, has_bias) if b]}"
            )
        bias = all(has_bias)
    return DecoderConfig(
        architecture=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn_dim=meta.get_int(f"{arch}.feed_forward_length"),
        vocab_size=vocab,
        context_length=_context(meta.get_int(f"{arch}.context_length"), f"{h.path}: metadata '{arch}.context_length'"),
        rms_eps=meta.get_float(f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=meta.get_float(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=scaling,
        tie_embeddings="output.weight" not in h.tensors,
        attention_bias=bias,
        bos_token_id=tok.bos_token_id,
        eos_token_ids=tok_eos,
        pad_token_id=tok.pad_token_id,
    )


def read_gguf(path: PathLike) -> DecoderSource:
    """Read a ``llama`` or ``qwen2`` GGUF file (header and tokenizer now, tensors on ``load``).

    Every tensor the config implies must be present with the config's shape and a ggml type
    ``gguf.quants.dequantize`` implements; no other tensor may be present. ``load(name)`` reads and
    dequantizes one tensor to float32, undoing llama.cpp's Q/K permutation for ``llama``, and refuses
    non-finite values. ``native_quant`` maps each canonical name not stored as F32 to its ggml type
    name. ``eos_token_ids`` are ``tokenizer.ggml.eos_token_id`` then ``eot_token_id`` when different.
    Raises :class:`SourceFormatError` / :class:`UnsupportedModelError` (see :func:`read_gguf_header`).
    """
    h = read_gguf_header(path)
    source = h.path
    tok = gguf_tokenizer(h.fields, source=source)
    eos = tuple(dict.fromkeys(i for i in (tok.eos_token_id, tok.eot_token_id) if i is not None))
    cfg = _gguf_config(h, eos, tok)

    wanted = {gguf_tensor_name(n): n for n in tensor_names(cfg)}
    unknown = sorted(n for n in h.tensors if n not in wanted)
    if unknown:
        raise UnsupportedModelError(
            f"{source}: tensors the {cfg.architecture} converter does not know: {unknown[:8]}{' ...' if len(unknown) > 8 else ''} "
            f"({len(unknown)}); expected only {cfg.n_layers} blocks of attn/ffn tensors, token_embd, output_norm and output"
        )
    index: dict[str, GGUFTensorInfo] = {}
    native: dict[str, str] = {}
    for gname, canonical in wanted.items():
        info = h.tensors.get(gname)
        if info is None:
            raise SourceFormatError(
                f"{source}: tensor {gname!r} is missing; a {cfg.architecture} model with {cfg.n_layers} layers must have it"
            )
        want = expected_shape(cfg, canonical)
        if info.shape != want:
            raise SourceFormatError(
                f"{source}: tensor {gname!r} shape: expected {list(want)} (dims {list(reversed(want))}) from the config, found {list(info.shape)}"
            )
        if not _dequantizable(info.ggml_type):
            raise UnsupportedModelError(
                f"{source}: tensor {gname!r} has ggml type {info.type_name}, which gguf.quants.dequantize does not implement; "
                f"supported: {', '.join(_supported_type_names())}"
            )
        index[canonical] = info
        if info.type_name != "F32":
            native[canonical] = info.type_name

    permute_heads: dict[str, int] = {}
    if cfg.architecture == "llama":
        for i in range(cfg.n_layers):
            permute_heads[f"layers.{i}.q"] = permute_heads[f"layers.{i}.q_bias"] = cfg.n_heads
            permute_heads[f"layers.{i}.k"] = permute_heads[f"layers.{i}.k_bias"] = cfg.n_kv_heads
    data_offset = h.data_offset
    size = h.file_size

    def read_raw(name: str) -> tuple[GGUFTensorInfo, bytes]:
        info = index.get(name)
        if info is None:
            raise KeyError(f"{source}: no tensor {name!r} in this model; known: {', '.join(sorted(index))}")
        start = data_offset + info.offset
        try:
            with open(source, "rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    raise SourceFormatError(
                        f"{source}: file size: expected {size:,} bytes (as when its header was read), found {os.fstat(f.fileno()).st_size:,}"
                    )
                f.seek(start)
                raw = f.read(info.n_bytes)
        except OSError as exc:
            raise SourceFormatError(f"{source}: cannot read tensor {info.name!r}: {exc}") from exc
        if len(raw) != info.n_bytes:
            raise SourceFormatError(
                f"{source}: tensor {info.name!r}: expected {info.n_bytes:,} bytes at offset {start:,}, read {len(raw):,}"
            )
        return info, raw

    def load_raw(name: str) -> tuple[str, np.ndarray]:
        info, raw = read_raw(name)
        rows = info.n_elements // info.dims[0]
        out = np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)
        if name in permute_heads:
            out = unpermute_qk(out, permute_heads[name])
        return info.type_name, np.ascontiguousarray(out)

    def load(name: str) -> np.ndarray:
        info, raw = read_raw(name)
        out = _dequantize(raw, info, source)
        if name in permute_heads:
            out = unpermute_qk(out, permute_heads[name])
        want = expected_shape(cfg, name)
        if out.shape != want:  # cannot happen after the header check; kept as the contract's guard
            raise SourceFormatError(f"{source}: tensor {info.name!r}: expected shape {list(want)}, found {list(out.shape)}")
        if not np.isfinite(out).all():
            raise SourceFormatError(f"{source}: tensor {info.name!r}: expected finite values, found NaN or infinity")
        return out

    name = h.fields.get("general.name")
    return DecoderSource(
        config=cfg,
        load=load,
        tokenizer_json=tok.tokenizer_json,
        chat_template=tok.chat_template,
        bos_token=tok.token(tok.bos_token_id),
        eos_token=tok.token(tok.eos_token_id),
        source_path=source,
        source_kind="gguf",
        source_sha256=_sha256_file(Path(source)),
        native_quant=native,
        name=name if isinstance(name, str) else "",
        add_bos=tok.add_bos,
        load_raw=load_raw,
    )


def _context(n: int, what: str) -> int:
    if n > MAX_CONTEXT_LENGTH:
        raise UnsupportedModelError(f"{what}: a context of {n:,} positions is more than the {MAX_CONTEXT_LENGTH:,} supported")
    return n


def _supported_type_names() -> list[str]:
    from gguf.constants import GGML_QUANT_SIZES

    return [t.name for t in GGML_QUANT_SIZES if _dequantizable(int(t))]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise SourceFormatError(f"{path}: cannot read to hash: {exc}") from exc
    return h.hexdigest()


# --- safetensors -------------------------------------------------------------------------------------

_ST_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_ST_FLOAT = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


@dataclass(frozen=True)
class _STTensor:
    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute in the file
    n_bytes: int


def _no_duplicates(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise SourceFormatError(f"{source}: JSON: expected unique keys, found {k!r} twice")
            out[k] = v
        return out

    return hook


def _read_safetensors_header(path: Path) -> dict[str, _STTensor]:
    """Parse and check one safetensors file's header (https://github.com/huggingface/safetensors#format)."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise SourceFormatError(f"{source}: header length: expected 8 bytes, found a file of {size} bytes")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_SAFETENSORS_HEADER:
                raise SourceFormatError(f"{source}: header length: expected at most {MAX_SAFETENSORS_HEADER:,} bytes, found {n:,}")
            if n > size - 8:
                raise SourceFormatError(f"{source}: header length: expected at most {size - 8:,} (the file's size less 8), found {n:,}")
            raw = f.read(n)
    except OSError as exc:
        raise SourceFormatError(f"{source}: cannot read: {exc}") from exc
    if len(raw) != n:
        raise SourceFormatError(f"{source}: header: expected {n:,} bytes, read {len(raw):,}")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates(source))
    except UnicodeDecodeError as exc:
        raise SourceFormatError(f"{source}: header: expected UTF-8 JSON, found invalid UTF-8 at byte {exc.start}") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SourceFormatError(f"{source}: header: expected JSON, found {exc}") from None
    if not isinstance(header, dict):
        raise SourceFormatError(f"{source}: header: expected a JSON object, found {type(header).__name__}")
    data_start = 8 + n
    data_len = size - data_start
    tensors: dict[str, _STTensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise SourceFormatError(f"{source}: '__metadata__': expected an object of strings")
            continue
        what = f"{source}: tensor {name!r}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise SourceFormatError(f"{what}: expected an object with dtype, shape and data_offsets, found {str(entry)[:120]}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _ST_ITEMSIZE:
            raise SourceFormatError(f"{what}: dtype: expected one of {', '.join(_ST_ITEMSIZE)}, found {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _INT64_MAX for d in shape):
            raise SourceFormatError(f"{what}: shape: expected a list of non-negative integers, found {shape!r}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
            raise SourceFormatError(f"{what}: data_offsets: expected [begin, end] integers, found {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise SourceFormatError(f"{what}: data_offsets: expected 0 <= begin <= end <= {data_len:,} (the data section), found {offsets}")
        n_bytes = math.prod(shape) * _ST_ITEMSIZE[dtype]
        if end - begin != n_bytes:
            raise SourceFormatError(f"{what}: data_offsets: expected {n_bytes:,} bytes for {dtype} {shape}, found {end - begin:,}")
        tensors[name] = _STTensor(path, name, dtype, tuple(shape), data_start + begin, n_bytes)
    ordered = sorted((t for t in tensors.values() if t.n_bytes), key=lambda t: t.start)
    for a, b in zip(ordered, ordered[1:]):
        if a.start + a.n_bytes > b.start:
            raise SourceFormatError(f"{source}: tensor {b.name!r} data_offsets: expected no overlap, found it overlaps {a.name!r}")
    return tensors


def _read_st_tensor(t: _STTensor) -> np.ndarray:
    source = str(t.file)
    try:
        with open(t.file, "rb") as f:
            f.seek(t.start)
            raw = f.read(t.n_bytes)
    except OSError as exc:
        raise SourceFormatError(f"{source}: cannot read tensor {t.name!r}: {exc}") from exc
    if len(raw) != t.n_bytes:
        raise SourceFormatError(f"{source}: tensor {t.name!r}: expected {t.n_bytes:,} bytes, read {len(raw):,} (the file changed?)")
    arr = np.frombuffer(raw, dtype=_ST_FLOAT[t.dtype])
    if t.dtype == "BF16":
        out = (arr.astype(np.uint32) << 16).view(np.float32)
    else:
        out = arr.astype(np.float32)
    return out.reshape(t.shape)


# --- Hugging Face config -----------------------------------------------------------------------------


def _load_json(path: Path, what: str) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceFormatError(f"{path}: cannot read {what}: {exc}") from exc
    if len(raw) > MAX_SAFETENSORS_HEADER:
        raise SourceFormatError(f"{path}: {what}: expected at most {MAX_SAFETENSORS_HEADER:,} bytes, found {len(raw):,}")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates(str(path)))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SourceFormatError(f"{path}: {what}: expected UTF-8 JSON, found {exc}") from None


class _Config:
    """Typed access to ``config.json`` with errors naming the file and the key."""

    def __init__(self, path: Path, doc: Mapping[str, Any]) -> None:
        self.path = path
        self.doc = doc

    def _fail(self, key: str, expected: str, value: object) -> SourceFormatError:
        return SourceFormatError(f"{self.path}: {key!r}: expected {expected}, found {value!r}")

    def get_int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.doc.get(key)
        if value is None:
            if default is None:
                raise SourceFormatError(f"{self.path}: {key!r} is missing; expected an integer")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer", value)
        if value < minimum:
            raise self._fail(key, f"an integer >= {minimum}", value)
        return value

    def get_float(self, key: str, default: float | None = None, doc: Mapping[str, Any] | None = None) -> float:
        value = (self.doc if doc is None else doc).get(key)
        if value is None:
            if default is None:
                raise SourceFormatError(f"{self.path}: {key!r} is missing; expected a number")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number", value)
        if not (math.isfinite(value) and value > 0):
            raise self._fail(key, "a finite number > 0", value)
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.doc.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def ids(self, key: str) -> tuple[int, ...]:
        value = self.doc.get(key)
        if value is None:
            return ()
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
            raise self._fail(key, "a token id or a list of token ids", value)
        return tuple(items)


def _rope_scaling(cfg: _Config, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise cfg._fail("rope_scaling", "an object or null", value)
    kind = value.get("rope_type", value.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": cfg.get_float("factor", doc=value)}
    if kind == "llama3":
        orig = value.get("original_max_position_embeddings")
        if isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
            raise cfg._fail("rope_scaling.original_max_position_embeddings", "an integer >= 1", orig)
        return {
            "type": "llama3",
            "factor": cfg.get_float("factor", doc=value),
            "low_freq_factor": cfg.get_float("low_freq_factor", doc=value),
            "high_freq_factor": cfg.get_float("high_freq_factor", doc=value),
            "original_max_position_embeddings": orig,
        }
    raise UnsupportedModelError(f"{cfg.path}: rope scaling {kind!r} is not supported; supported: linear, llama3 (or none)")


def _hf_config(path: Path, doc: Any) -> DecoderConfig:
    if not isinstance(doc, dict):
        raise SourceFormatError(f"{path}: expected a JSON object, found {type(doc).__name__}")
    cfg = _Config(path, doc)
    arch = doc.get("model_type")
    if not isinstance(arch, str):
        raise cfg._fail("model_type", "a string", arch)
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(f"{path}: model_type {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    act = doc.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"{path}: hidden_act {act!r} is not supported; supported: 'silu' (SwiGLU)")
    if cfg.get_bool("mlp_bias", False):
        raise UnsupportedModelError(f"{path}: mlp_bias true is not supported (the MLP projections have no bias)")
    if arch == "qwen2" and cfg.get_bool("use_sliding_window", False):
        raise UnsupportedModelError(f"{path}: use_sliding_window true is not supported (full attention only)")
    d_model = cfg.get_int("hidden_size")
    n_heads = cfg.get_int("num_attention_heads")
    n_kv = cfg.get_int("num_key_value_heads", n_heads)
    if n_heads % n_kv:
        raise cfg._fail("num_key_value_heads", f"a divisor of num_attention_heads {n_heads}", n_kv)
    if doc.get("head_dim") is not None:
        head_dim = cfg.get_int("head_dim")
    else:
        if d_model % n_heads:
            raise cfg._fail("hidden_size", f"a multiple of num_attention_heads {n_heads} (no head_dim given)", d_model)
        head_dim = d_model // n_heads
    if head_dim % 2:
        raise cfg._fail("head_dim", "an even number (rotary halves)", head_dim)
    rope_params = doc.get("rope_parameters")  # transformers 5 moves rope_theta / rope_type here
    if rope_params is not None and not isinstance(rope_params, dict):
        raise cfg._fail("rope_parameters", "an object", rope_params)
    theta = (
        cfg.get_float("rope_theta", None, doc=rope_params)
        if rope_params and "rope_theta" in rope_params
        else cfg.get_float("rope_theta", 10000.0)
    )
    scaling = _rope_scaling(cfg, doc.get("rope_scaling") if doc.get("rope_scaling") is not None else rope_params)
    if doc.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise UnsupportedModelError(f"{path}: partial_rotary_factor {doc['partial_rotary_factor']!r} is not supported (full rotary only)")
    bos = cfg.ids("bos_token_id")
    if len(bos) > 1:
        raise cfg._fail("bos_token_id", "one token id", doc["bos_token_id"])
    pad = cfg.ids("pad_token_id")
    return DecoderConfig(
        architecture=arch,
        n_layers=cfg.get_int("num_hidden_layers"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn_dim=cfg.get_int("intermediate_size"),
        vocab_size=cfg.get_int("vocab_size"),
        context_length=_context(cfg.get_int("max_position_embeddings"), f"{path}: 'max_position_embeddings'"),
        rms_eps=cfg.get_float("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=cfg.get_bool("tie_word_embeddings", False),
        attention_bias=True if arch == "qwen2" else cfg.get_bool("attention_bias", False),
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=cfg.ids("eos_token_id"),
        pad_token_id=pad[0] if pad else None,
    )


def _token_text(value: Any, path: Path, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise SourceFormatError(f"{path}: {key!r}: expected a string or an AddedToken object with 'content', found {str(value)[:80]}")


def _chat_template(folder: Path, tok_cfg: Mapping[str, Any], tok_cfg_path: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SourceFormatError(f"{jinja}: expected a UTF-8 Jinja template: {exc}") from None
    value = tok_cfg.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default" and isinstance(item.get("template"), str):
                return str(item["template"])
    raise SourceFormatError(
        f"{tok_cfg_path}: 'chat_template': expected a string or a list with a 'default' template, found {str(value)[:80]}"
    )


_HF_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def _shard_files(folder: Path) -> list[Path]:
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        index = _load_json(index_path, "the shard index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise SourceFormatError(f"{index_path}: 'weight_map': expected an object of tensor name -> file name")
        files: list[Path] = []
        for fname in dict.fromkeys(weight_map.values()):
            if not fname or "/" in fname or "\\" in fname or fname in (".", "..") or not fname.endswith(".safetensors"):
                raise SourceFormatError(
                    f"{index_path}: 'weight_map': expected plain *.safetensors file names in this folder, found {fname!r}"
                )
            if not (folder / fname).is_file():
                raise SourceFormatError(f"{index_path}: shard {fname!r} is missing from {folder}")
            files.append(folder / fname)
        return sorted(files, key=lambda p: p.name)
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if len(found) == 1:
        return found
    raise SourceFormatError(
        f"{folder}: expected model.safetensors, one *.safetensors file or model.safetensors.index.json, found "
        f"{[p.name for p in found] or 'no safetensors file'}"
    )


def read_hf_folder(path: PathLike) -> DecoderSource:
    """Read a Hugging Face ``llama`` / ``qwen2`` folder (config, safetensors, tokenizer).

    ``config.json`` keys: ``hidden_size``, ``num_attention_heads``, ``num_hidden_layers``,
    ``intermediate_size``, ``vocab_size``, ``max_position_embeddings`` are required; others take
    transformers' class defaults when absent (``num_key_value_heads`` = heads, ``head_dim`` =
    hidden/heads, ``rope_theta`` 10000, ``rms_norm_eps`` 1e-6, ``tie_word_embeddings`` false,
    ``attention_bias`` false for llama and always true for qwen2, ``hidden_act`` silu). The
    embedding must have ``vocab_size`` rows and the tokenizer (with added tokens) no more ids than
    that. Tensors F32, F16 or BF16 (widened exactly). ``add_bos`` is False: whatever
    ``tokenizer.json``'s own post-processor adds is kept as it is. Raises
    :class:`SourceFormatError` / :class:`UnsupportedModelError`.
    """
    folder = Path(path)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise SourceFormatError(f"{folder}: config.json is missing; expected a Hugging Face model folder")
    cfg = _hf_config(cfg_path, _load_json(cfg_path, "config.json"))
    tok_path = folder / "tokenizer.json"
    if not tok_path.is_file():
        raise SourceFormatError(f"{folder}: tokenizer.json is missing; expected a Hugging Face `tokenizers` file")
    try:
        tokenizer_json = tok_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceFormatError(f"{tok_path}: expected UTF-8 JSON: {exc}") from None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises plain Exception from Rust
        raise SourceFormatError(f"{tok_path}: does not load in `tokenizers`: {exc}") from exc
    n_ids = tokenizer.get_vocab_size(with_added_tokens=True)
    if n_ids > cfg.vocab_size:
        raise SourceFormatError(
            f"{tok_path}: the tokenizer has {n_ids} ids (with added tokens), more than the {cfg.vocab_size} embedding rows"
        )

    tok_cfg_path = folder / "tokenizer_config.json"
    tok_cfg: dict[str, Any] = {}
    if tok_cfg_path.is_file():
        loaded = _load_json(tok_cfg_path, "tokenizer_config.json")
        if not isinstance(loaded, dict):
            raise SourceFormatError(f"{tok_cfg_path}: expected a JSON object")
        tok_cfg = loaded
    bos_text = _token_text(tok_cfg.get("bos_token"), tok_cfg_path, "bos_token")
    eos_text = _token_text(tok_cfg.get("eos_token"), tok_cfg_path, "eos_token")
    eos_ids = list(cfg.eos_token_ids)
    gen_path = folder / "generation_config.json"
    if gen_path.is_file():
        gen = _load_json(gen_path, "generation_config.json")
        if isinstance(gen, dict):
            eos_ids += [i for i in _Config(gen_path, gen).ids("eos_token_id") if i not in eos_ids]
    bos_id = cfg.bos_token_id
    if bos_id is None and bos_text is not None:
        bos_id = tokenizer.token_to_id(bos_text)
    eos_from_text = tokenizer.token_to_id(eos_text) if eos_text is not None else None
    if not eos_ids and eos_from_text is not None:
        eos_ids.append(eos_from_text)
    for key, ids in (("bos_token_id", [bos_id] if bos_id is not None else []), ("eos_token_id", eos_ids)):
        for i in ids:
            if i >= cfg.vocab_size:
                raise SourceFormatError(f"{cfg_path}: {key!r}: expected an id < vocab_size {cfg.vocab_size}, found {i}")
    if bos_text is None and bos_id is not None:
        bos_text = tokenizer.id_to_token(bos_id)
    if eos_text is None and eos_ids:
        eos_text = tokenizer.id_to_token(eos_ids[0])
    cfg = DecoderConfig(**{**cfg.__dict__, "bos_token_id": bos_id, "eos_token_ids": tuple(eos_ids)})

    files = _shard_files(folder)
    st: dict[str, _STTensor] = {}
    for file in files:
        for name, t in _read_safetensors_header(file).items():
            if name in st:
                raise SourceFormatError(f"{file}: tensor {name!r}: expected once across the shards, also found in {st[name].file.name}")
            st[name] = t
    wanted = {hf_tensor_name(n): n for n in tensor_names(cfg)}
    allowed = set(wanted) | ({"lm_head.weight"} if cfg.tie_embeddings else set())
    unknown = sorted(n for n in st if n not in allowed and not _HF_IGNORED.fullmatch(n))
    if unknown:
        raise UnsupportedModelError(
            f"{folder}: tensors the {cfg.architecture} converter does not know: {unknown[:8]}{' ...' if len(unknown) > 8 else ''} ({len(unknown)})"
        )
    index: dict[str, _STTensor] = {}
    native: dict[str, str] = {}
    for hf, canonical in wanted.items():
        found = st.get(hf)
        if found is None:
            hint = " (tie_word_embeddings is false)" if canonical == "lm_head" else ""
            raise SourceFormatError(
                f"{folder}: tensor {hf!r} is missing{hint}; a {cfg.architecture} model with {cfg.n_layers} layers must have it"
            )
        t = found
        want = expected_shape(cfg, canonical)
        if t.shape != want:
            raise SourceFormatError(f"{t.file}: tensor {hf!r} shape: expected {list(want)} from config.json, found {list(t.shape)}")
        if t.dtype not in _ST_FLOAT:
            raise UnsupportedModelError(f"{t.file}: tensor {hf!r} dtype {t.dtype} is not supported; supported: F32, F16, BF16")
        index[canonical] = t
        if t.dtype != "F32":
            native[canonical] = t.dtype

    def load(name: str) -> np.ndarray:
        t = index.get(name)
        if t is None:
            raise KeyError(f"{folder}: no tensor {name!r} in this model; known: {', '.join(sorted(index))}")
        out = _read_st_tensor(t)
        if not np.isfinite(out).all():
            raise SourceFormatError(f"{t.file}: tensor {t.name!r}: expected finite values, found NaN or infinity")
        return out

    if len(files) == 1:
        digest = _sha256_file(files[0])
    else:
        manifest = "".join(f"{_sha256_file(p)}  {p.name}\n" for p in files)
        digest = hashlib.sha256(manifest.encode()).hexdigest()
    own_name = tok_cfg.get("name_or_path")
    return DecoderSource(
        config=cfg,
        load=load,
        tokenizer_json=tokenizer_json,
        chat_template=_chat_template(folder, tok_cfg, tok_cfg_path),
        bos_token=bos_text,
        eos_token=eos_text,
        source_path=str(folder),
        source_kind="safetensors",
        source_sha256=digest,
        native_quant=native,
        name=own_name if isinstance(own_name, str) and own_name else folder.name,
        add_bos=False,
    )


# --- entry point -------------------------------------------------------------------------------------


def read_source(path: PathLike) -> DecoderSource:
    """A :class:`DecoderSource` from a ``.gguf`` file or a Hugging Face folder.

    A file whose first bytes are ``GGUF`` (or whose name ends in ``.gguf``) goes to
    :func:`read_gguf`; a folder with ``config.json`` to :func:`read_hf_folder`. Anything else
    raises :class:`SourceFormatError` naming what was expected.
    """
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").is_file():
            return read_hf_folder(p)
        raise SourceFormatError(
            f"{p}: expected a .gguf file or a Hugging Face folder (config.json, *.safetensors, tokenizer.json); the folder has no config.json"
        )
    if p.is_file():
        try:
            with open(p, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise SourceFormatError(f"{p}: cannot read: {exc}") from exc
        if magic == b"GGUF" or p.suffix.lower() == ".gguf":
            return read_gguf(p)
        raise SourceFormatError(
            f"{p}: expected a .gguf file (magic b'GGUF') or a Hugging Face folder (config.json, *.safetensors, tokenizer.json), found a file starting {magic!r}"
        )
    raise SourceFormatError(f"{p}: does not exist; expected a .gguf file or a Hugging Face model folder")
