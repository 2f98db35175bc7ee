"""A Hugging Face ``tokenizer.json`` built from a GGUF file's tokenizer metadata.

llama.cpp's GGUF files carry the tokenizer as metadata (``tokenizer.ggml.*``, documented in
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md#tokenizer): the token strings, the
BPE merges, a token type per token, the special token ids and a *pre-tokenizer name*
(``tokenizer.ggml.pre``) that llama.cpp maps to a fixed list of split regexes
(``llm_tokenizer_bpe`` in https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp).
This module rebuilds the same tokenizer as a Hugging Face ``tokenizers`` JSON document
(format: https://huggingface.co/docs/tokenizers/api/tokenizer), so that the runtime needs one
tokenizer implementation whatever the source file was.

Only ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE, what llama.cpp calls ``LLAMA_VOCAB_TYPE_BPE``)
is built: the token strings are already in GPT-2's byte-to-unicode alphabet (``Ġ`` for a space),
so the vocabulary and merges are copied as they are, the pre-tokenizer is a sequence of
``Split(regex, "Isolated")`` steps (llama.cpp applies its regexes one after the other, each one
splitting the previous pieces, keeping the text between matches as pieces too) followed by a
``ByteLevel`` step that only maps bytes (``use_regex: false``), and the decoder is ``ByteLevel``.
Tokens of type CONTROL (3) become special added tokens and USER_DEFINED (4) non-special added
tokens: both are matched whole before pre-tokenization (``"<|im_start|>"`` encodes as one id),
and ``decode(..., skip_special_tokens=True)`` drops only the CONTROL ones, as llama.cpp does.

BOS is *not* added by the post-processor: ``tokenizer.ggml.add_bos_token`` is reported as
:attr:`GGUFTokenizer.add_bos` for the caller to apply, because chat templates (SmolLM2's
among them) often start with the BOS text themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from .spec import SourceFormatError, UnsupportedModelError

__all__ = [
    "GGUFTokenizer",
    "PRE_TOKENIZERS",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_USER_DEFINED",
    "gguf_tokenizer",
    "tokenizer_json_from_gguf",
]

#: llama.cpp's token types (``llama_token_type`` / gguf-py ``TokenType``).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6
_TOKEN_TYPES = range(0, 7)  # 0 is "undefined" in llama.cpp and treated as normal

# The split regexes, copied from llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe), by the
# pre-tokenizer type its loader picks for a ``tokenizer.ggml.pre`` value.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

#: ``tokenizer.ggml.pre`` value -> the regexes llama.cpp splits with, in order.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    # LLAMA_VOCAB_PRE_TYPE_LLAMA3
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "falcon3": (_LLAMA3,),
    "pixtral": (_LLAMA3,),
    # LLAMA_VOCAB_PRE_TYPE_QWEN2 / STABLELM2
    "qwen2": (_QWEN2,),
    "stablelm2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
    "megrez": (_QWEN2,),
    # LLAMA_VOCAB_PRE_TYPE_SMOLLM and the types sharing its regexes (digits split one by one)
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2),
    "codeshell": (r"\p{N}", _GPT2),
    "exaone": (r"\p{N}", _GPT2),
    "minerva-7b": (r"\p{N}", _GPT2),
    # LLAMA_VOCAB_PRE_TYPE_GPT2 ("gpt-2" is what llama.cpp's converter writes; "gpt2" accepted too)
    "gpt-2": (_GPT2,),
    "gpt2": (_GPT2,),
    "phi-2": (_GPT2,),
    "mpt": (_GPT2,),
    "olmo": (_GPT2,),
    # LLAMA_VOCAB_PRE_TYPE_DEFAULT: an empty or missing value, or "default". (llama.cpp also falls
    # back to it, with a warning, for a name it does not know; here an unknown name is refused.)
    "default": _DEFAULT,
}

#: Pre-tokenizer names for which llama.cpp sets ``ignore_merges`` (a piece that is a whole token is
#: taken as it is, before any merge: Llama 3's ``"ignore_merges": true``) and adds BOS by default.
_LLAMA3_NAMES = frozenset(name for name, regexes in PRE_TOKENIZERS.items() if regexes == (_LLAMA3,))


@dataclass(frozen=True)
class GGUFTokenizer:
    """What a GGUF file says about its tokenizer, with the ``tokenizer.json`` built from it."""

    tokenizer_json: str
    tokens: tuple[str, ...]  # tokenizer.ggml.tokens, by id
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    pad_token_id: int | None
    add_bos: bool  # tokenizer.ggml.add_bos_token: the caller prepends BOS (not the post-processor)
    add_eos: bool
    chat_template: str | None
    pre: str

    @property
    def n_tokens(self) -> int:
        """The vocabulary size (tokens in the GGUF list)."""
        return len(self.tokens)

    def token(self, token_id: int | None) -> str | None:
        """The text of token ``token_id`` (None for None)."""
        return None if token_id is None else self.tokens[token_id]


def _err(source: str, key: str, expected: str, found: object) -> SourceFormatError:
    return SourceFormatError(f"{source}: metadata {key!r}: expected {expected}, found {found}")


def _describe(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


def _opt_id(fields: Mapping[str, Any], key: str, n_tokens: int, source: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(source, key, "an integer token id", _describe(value))
    if not 0 <= value < n_tokens:
        # llama.cpp writes -1 / 0xFFFFFFFF-style values for "none" in some files; only a real id is used.
        if value in (-1, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
            return None
        raise _err(source, key, f"a token id in [0, {n_tokens})", value)
    return value


def _opt_bool(fields: Mapping[str, Any], key: str, default: bool, source: str) -> bool:
    value = fields.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _err(source, key, "a bool", _describe(value))
    return value


def _str_list(fields: Mapping[str, Any], key: str, source: str, *, required: bool) -> list[str] | None:
    value = fields.get(key)
    if value is None:
        if required:
            raise SourceFormatError(f"{source}: metadata {key!r} is missing; a gpt2 (BPE) tokenizer needs it")
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _err(source, key, "an array of strings", _describe(value))
    return list(value)


def gguf_tokenizer(fields: Mapping[str, Any], *, source: str = "<gguf metadata>") -> GGUFTokenizer:
    """Build the tokenizer described by GGUF metadata ``fields``.

    ``fields`` maps metadata keys to plain Python values (str, int, float, bool, lists of
    them), as :func:`converters.llm.sources.read_gguf_header` returns them. ``source`` names
    the file in error messages.

    Raises :class:`UnsupportedModelError` for a tokenizer model other than ``"gpt2"`` or an
    unknown ``tokenizer.ggml.pre``; :class:`SourceFormatError` for missing or ill-typed keys,
    a merge naming a token that is not in the vocabulary, duplicate token strings, or a
    document the ``tokenizers`` library refuses.
    """
    model = fields.get("tokenizer.ggml.model")
    if model is None:
        raise SourceFormatError(f"{source}: metadata 'tokenizer.ggml.model' is missing; expected 'gpt2' (byte-level BPE)")
    if not isinstance(model, str):
        raise _err(source, "tokenizer.ggml.model", "a string", _describe(model))
    if model != "gpt2":
        raise UnsupportedModelError(
            f"{source}: tokenizer model {model!r} (tokenizer.ggml.model) is not supported; supported: 'gpt2' "
            "(byte-level BPE). SentencePiece ('llama'), WordPiece ('bert'), 't5' and 'rwkv' vocabularies are not built"
        )
    pre_value = fields.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre_value, str):
        raise _err(source, "tokenizer.ggml.pre", "a string", _describe(pre_value))
    pre = pre_value or "default"
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{source}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    tokens = _str_list(fields, "tokenizer.ggml.tokens", source, required=True)
    assert tokens is not None
    if not tokens:
        raise _err(source, "tokenizer.ggml.tokens", "at least one token", "an empty array")
    merges_raw = _str_list(fields, "tokenizer.ggml.merges", source, required=True)
    assert merges_raw is not None
    types_value = fields.get("tokenizer.ggml.token_type")
    if types_value is None:
        types = [TOKEN_TYPE_NORMAL] * len(tokens)
    else:
        if not isinstance(types_value, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in types_value):
            raise _err(source, "tokenizer.ggml.token_type", "an array of integers", _describe(types_value))
        types = list(types_value)
        if len(types) != len(tokens):
            raise _err(source, "tokenizer.ggml.token_type", f"{len(tokens)} entries (one per token)", f"{len(types)}")
        bad = next((i for i, t in enumerate(types) if t not in _TOKEN_TYPES), None)
        if bad is not None:
            raise _err(source, "tokenizer.ggml.token_type", "values 0..6", f"{types[bad]} for token {bad}")

    vocab: dict[str, int] = {}
    for i, text in enumerate(tokens):
        if not text:  # llama.cpp's loader names an empty token this way (llama_vocab::impl::load)
            text = tokens[i] = f"[EMPTY_{i}]"
        prev = vocab.setdefault(text, i)
        if prev != i:
            raise _err(source, "tokenizer.ggml.tokens", "unique token strings", f"{text!r} at ids {prev} and {i}")

    merges: list[list[str]] = []
    for n, merge in enumerate(merges_raw):
        # llama.cpp splits at the first space after the first character (llama_vocab::load).
        cut = merge.find(" ", 1)
        if cut < 0:
            raise _err(source, "tokenizer.ggml.merges", "'left right' pairs", f"{merge!r} at index {n}")
        left, right = merge[:cut], merge[cut + 1 :]
        for part in (left, right, left + right):
            if part not in vocab:
                raise _err(
                    source,
                    "tokenizer.ggml.merges",
                    "merges of tokens in the vocabulary",
                    f"{merge!r} at index {n} ({part!r} is not a token)",
                )
        merges.append([left, right])

    added = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": t == TOKEN_TYPE_CONTROL,
        }
        for i, t in enumerate(types)
        if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    regexes = PRE_TOKENIZERS[pre]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                *({"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False} for rx in regexes),
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,  # BOS is the caller's (GGUFTokenizer.add_bos), see the module docstring
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in _LLAMA3_NAMES,
            "vocab": vocab,
            "merges": merges,
        },
    }
    text = json.dumps(doc, ensure_ascii=False)
    _check_loads(text, source)

    n = len(tokens)
    template = fields.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise _err(source, "tokenizer.chat_template", "a string", _describe(template))
    return GGUFTokenizer(
        tokenizer_json=text,
        tokens=tuple(tokens),
        bos_token_id=_opt_id(fields, "tokenizer.ggml.bos_token_id", n, source),
        eos_token_id=_opt_id(fields, "tokenizer.ggml.eos_token_id", n, source),
        eot_token_id=_opt_id(fields, "tokenizer.ggml.eot_token_id", n, source),
        pad_token_id=_opt_id(fields, "tokenizer.ggml.padding_token_id", n, source),
        add_bos=_opt_bool(fields, "tokenizer.ggml.add_bos_token", pre in _LLAMA3_NAMES, source),
        add_eos=_opt_bool(fields, "tokenizer.ggml.add_eos_token", False, source),
        chat_template=template or None,
        pre=pre,
    )


def _check_loads(text: str, source: str) -> None:
    """The ``tokenizers`` library must accept the document (its errors become SourceFormatError)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - tokenizers is a converter dependency
        return
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # the library raises plain Exception subclasses from Rust
        raise SourceFormatError(f"{source}: the tokenizer built from the GGUF metadata does not load in `tokenizers`: {exc}") from exc


def tokenizer_json_from_gguf(fields: Mapping[str, Any], *, source: str = "<gguf metadata>") -> str:
    """The Hugging Face ``tokenizer.json`` text for GGUF metadata ``fields`` (see :func:`gguf_tokenizer`)."""
    return gguf_tokenizer(fields, source=source).tokenizer_json
