"""Text around a decoder: the tokenizer, streaming detokenization, stop strings and prompt checks.

* :class:`Tokenizer` wraps a Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library
  (https://huggingface.co/docs/tokenizers/api/tokenizer) — the optional extra ``generate``.
* :class:`IncrementalDetokenizer` turns ids into text deltas as they are generated, never splitting a UTF-8
  character, at a cost per id that does not grow with the output (a small window of recent ids is decoded,
  as in vLLM's incremental detokenization, ``vllm/transformers_utils/detokenizer_utils.py``, and transformers'
  ``TextStreamer``, https://huggingface.co/docs/transformers/main/en/internal/generation_utils#transformers.TextStreamer).
* :class:`StopMatcher` finds stop strings across delta boundaries and holds back text that may begin one.
* :func:`validate_prompt` refuses text a tokenizer should not be given.
"""

from __future__ import annotations

import operator
import os
import re
from typing import TYPE_CHECKING, Iterable, Sequence

from .._deps import require_tokenizers
from ..errors import OptionsError, OptionsTypeError, PromptError, TokenizerError

if TYPE_CHECKING:
    import tokenizers

__all__ = ["Tokenizer", "IncrementalDetokenizer", "StopMatcher", "validate_prompt"]


_REPLACEMENT = "\ufffd"


# --- tokenizer -------------------------------------------------------------------------------------------------


class Tokenizer:
    """A ``tokenizer.json`` (the ``tokenizers`` serialisation Hugging Face models ship), loaded from its text.

    ``vocab_size`` counts every id the tokenizer can produce, added/special tokens included: it is the largest id
    plus one (ids need not be dense), which is what the model's embedding must cover (:meth:`check_model_vocab`).
    """

    def __init__(self, json_text: str) -> None:
        if not isinstance(json_text, str):
            raise TokenizerError(f"tokenizer: expected the tokenizer.json text as str, got {type(json_text).__name__}")
        require_tokenizers("Loading a tokenizer")
        import tokenizers

        try:
            tok = tokenizers.Tokenizer.from_str(json_text)
        except Exception as e:  # the Rust side raises a bare Exception with serde's message
            raise TokenizerError(f"tokenizer.json cannot be loaded by tokenizers {tokenizers.__version__}: {e}") from e
        self._tok: tokenizers.Tokenizer = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        self._vocab_size = (max(vocab.values()) + 1) if vocab else 0
        if self._vocab_size == 0:
            raise TokenizerError("tokenizer.json has an empty vocabulary")
        self._special_ids = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load ``path`` (a ``tokenizer.json``); an unreadable file is a TokenizerError naming it."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"tokenizer file {os.fspath(path)!r} cannot be read: {e}") from e
        return cls(text)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """The number of ids (largest id + 1), added and special tokens included."""
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special (``<|im_start|>``, ``<|endoftext|>``, ...)."""
        return self._special_ids

    def check_model_vocab(self, model_vocab: int) -> None:
        """TokenizerError if the tokenizer can produce an id the model has no embedding row for.

        A model vocabulary larger than the tokenizer's is fine (embeddings are often padded to a multiple of 64).
        """
        if isinstance(model_vocab, bool) or not isinstance(model_vocab, int) or model_vocab < 1:
            raise TokenizerError(f"model vocabulary size: expected an int >= 1, got {model_vocab!r}")
        if self._vocab_size > model_vocab:
            raise TokenizerError(
                f"tokenizer has {self._vocab_size} ids but the model has {model_vocab} embedding rows; "
                "ids >= the model's size cannot be embedded (wrong tokenizer for this model?)"
            )

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special tokens written in the text (``<|im_start|>``) are parsed as themselves,
        as transformers does for a rendered chat prompt; ``add_special_tokens`` adds the post-processor's
        BOS/EOS (off by default: chat templates write them)."""
        if not isinstance(text, str):
            raise PromptError(f"encode: expected str, got {type(text).__name__}")
        try:
            return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        except Exception as e:
            raise TokenizerError(f"tokenizer failed to encode {len(text)} characters: {e}") from e

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; ``skip_special_tokens`` leaves out special tokens. An id outside
        ``[0, vocab_size)`` or a non-int is a TokenizerError (``tokenizers`` would skip it silently)."""
        try:
            seq = [operator.index(i) for i in ids]
        except TypeError as e:
            raise TokenizerError(f"decode: expected int token ids: {e}") from e
        if seq:
            lo, hi = min(seq), max(seq)
            if lo < 0 or hi >= self._vocab_size:
                raise TokenizerError(f"decode: token id {lo if lo < 0 else hi} is outside [0, {self._vocab_size})")
        return self._tok.decode(seq, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of the vocabulary entry ``token`` (in the tokenizer's own spelling, e.g. ``Ġthe``), or None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id``, or None for an id the tokenizer does not have."""
        return self._tok.id_to_token(operator.index(token_id))


# --- streaming detokenization ---------------------------------------------------------------------------------


class IncrementalDetokenizer:
    """Text deltas from ids pushed one at a time.

    Each :meth:`push` decodes only ``context`` earlier ids plus the ids not yet emitted (at most
    :attr:`MAX_WINDOW` ids), so its cost does not grow with the output. The earlier ids are decoded as context
    so decoders that depend on a left neighbour (SentencePiece's leading "▁" becomes a space only after a
    word, WordPiece's "##") decode the new id as they would inside the whole sequence.

    No delta ends inside a UTF-8 character: byte-level BPE (GPT-2, Qwen2, SmolLM2) can split one across
    ids, and the decoder then ends its text with U+FFFD; such text is held until a later id completes the
    character. A byte run that can never complete (an invalid sequence, which decodes to U+FFFD in the
    whole text too) is released once the following ids prove it final (at the latest after
    :attr:`MAX_PENDING` ids) or by :meth:`flush`.

    Invariant, for decoders whose text for a longer id list extends the text for a shorter one except for a
    trailing incomplete character (ByteLevel, which decodes with Rust's ``String::from_utf8_lossy``; Metaspace;
    WordPiece): the deltas of all pushes plus :meth:`flush` equal ``tokenizer.decode(ids)`` for the pushed ids
    (when ``prompt_ids`` end on a character boundary, as an encoded prompt does, the same holds with
    ``prompt_ids`` as left context). SentencePiece's ``ByteFallback`` decoder turns a whole run of byte tokens
    into U+FFFDs when any part of it is invalid, which can change text already emitted: for such tokenizers the
    invariant holds for valid UTF-8 output only.
    """

    #: Ids kept left of the unemitted ones as decoding context.
    CONTEXT = 4
    #: Unemitted ids after which a trailing U+FFFD run is examined for a provably final prefix.
    MAX_PENDING = 8
    #: Hard bound on unemitted ids: past it, all but the last 3 are released as they decode now.
    HARD_PENDING = 32
    #: The most ids one :meth:`push` decodes in one call.
    MAX_WINDOW = CONTEXT + HARD_PENDING + 1

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = False) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TokenizerError(f"tokenizer: expected edge_sdk Tokenizer, got {type(tokenizer).__name__}")
        self._tok = tokenizer
        self._skip = bool(skip_special_tokens)
        self._window: list[int] = [operator.index(i) for i in prompt_ids][-self.CONTEXT :] if len(prompt_ids) else []
        self._ctx = len(self._window)  # leading ids of the window whose text is already emitted (or prompt)
        self._emitted = len(self._decode(self._window))  # characters of decode(window) already emitted
        self._count = 0

    @property
    def generated(self) -> int:
        """How many ids were pushed."""
        return self._count

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def _rebase(self, split: int) -> None:
        """Make ``window[:split]`` emitted: keep its last CONTEXT ids as context for ``window[split:]``."""
        ctx = self._window[max(0, split - self.CONTEXT) : split]
        self._window = ctx + self._window[split:]
        self._ctx = len(ctx)
        self._emitted = len(self._decode(ctx))

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (possibly "")."""
        tid = operator.index(token_id)
        if not 0 <= tid < self._tok.vocab_size:
            raise TokenizerError(f"token id {tid} is outside the tokenizer's [0, {self._tok.vocab_size})")
        self._count += 1
        w = self._window
        w.append(tid)
        text = self._decode(w)
        if not text.endswith(_REPLACEMENT):
            delta = text[self._emitted :]
            if len(w) > 2 * self.CONTEXT:
                self._rebase(len(w))
            else:
                self._ctx, self._emitted = len(w), len(text)
            return delta
        pending = len(w) - self._ctx
        if pending <= self.MAX_PENDING:
            return ""
        # A long run ending in U+FFFD: find the last split whose left text is final. The left part is final when
        # decoding splits cleanly there (text == left + right) and the right part decodes to >= 3 characters (so
        # >= 3 bytes follow the left part: any character begun there has been completed or refuted).
        for split in range(len(w) - 1, self._ctx, -1):
            left, right = self._decode(w[:split]), self._decode(w[split:])
            if len(right) >= 3 and len(left) >= self._emitted and left + right == text:
                delta = left[self._emitted :]
                self._rebase(split)
                return delta
        if pending > self.HARD_PENDING:  # no provable split (e.g. many ids that decode to nothing): bound the cost
            split = len(w) - 3
            left = self._decode(w[:split])
            delta = left[self._emitted :]
            self._rebase(split)
            return delta
        return ""

    def flush(self) -> str:
        """The text still held back (a trailing incomplete character decodes to U+FFFD, as in the whole text)."""
        text = self._decode(self._window)
        delta = text[self._emitted :]
        self._rebase(len(self._window))
        return delta


# --- stop strings -----------------------------------------------------------------------------------------------


class StopMatcher:
    """Cuts generated text at the first stop string, across delta boundaries.

    :meth:`feed` returns the text that is safe to show now and whether a stop string was found. Text that
    could be the beginning of a stop string (the longest suffix that is a prefix of one) is held back until
    it is refuted or completed; on a match, only the text before the stop string is returned and the stop
    string itself is not. After a stop, :meth:`feed` returns ``("", True)``.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        if isinstance(stop, str):
            raise OptionsError(f"stop: expected a sequence of strings, got the single str {stop!r}; pass [{stop!r}]")
        try:
            items = list(stop)
        except TypeError as e:
            raise OptionsTypeError(f"stop: expected a sequence of strings, got {type(stop).__name__}") from e
        for i, s in enumerate(items):
            if not isinstance(s, str):
                raise OptionsTypeError(f"stop[{i}]: expected str, got {type(s).__name__} {s!r}")
            if not s:
                raise OptionsError(f"stop[{i}]: an empty stop string would stop at once; remove it")
        self.stop: tuple[str, ...] = tuple(dict.fromkeys(items))
        self._longest = max((len(s) for s in self.stop), default=0)
        self._held = ""
        self._out: list[str] = []
        self.stopped = False
        #: The stop string that matched, once :attr:`stopped`.
        self.matched: str | None = None

    @property
    def text(self) -> str:
        """All text released so far (by :meth:`feed` and :meth:`flush`): the generation's visible output."""
        return "".join(self._out)

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add a text delta; return (text to emit now, stopped)."""
        out, stopped = self._feed(delta)
        if out:
            self._out.append(out)
        return out, stopped

    def _feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stop:
            return delta, False
        buf = self._held + delta
        best = -1
        for s in self.stop:
            i = buf.find(s)
            if i >= 0 and (best < 0 or i < best):
                best, self.matched = i, s
        if best >= 0:
            self.stopped = True
            self._held = ""
            return buf[:best], True
        hold = 0
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stop):
                hold = n
                break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self, delta: str = "") -> str:
        """End of generation: feed the last ``delta`` (a stop string in it still stops) and release everything held.

        Returns the text to emit now; "" after a stop."""
        out, stopped = self._feed(delta)
        if not stopped:
            out, self._held = out + self._held, ""
        if out:
            self._out.append(out)
        return out


# --- prompts ----------------------------------------------------------------------------------------------------

# C0 controls except \t \n \r, DEL, and C1 controls: Unicode general category Cc minus tab/newline/return.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_prompt(text: object, *, max_chars: int | None = None, what: str = "prompt") -> str:
    """``text`` if it is fit to tokenize, else PromptError naming the problem (``what`` names the text in the message).

    * It must be ``str``: bytes are refused ("decode bytes first"), because the encoding is the caller's to know.
    * No lone surrogates (text that cannot be encoded as UTF-8, e.g. from ``surrogateescape`` decoding).
    * No control characters other than tab, newline and carriage return (C0, DEL, C1): they are not text and
      tokenizers map them unpredictably.
    * At most ``max_chars`` characters when given. The empty string is allowed (the caller decides).
    """
    if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 0):
        raise OptionsError(f"max_chars: expected None or an int >= 0, got {max_chars!r}")
    if isinstance(text, (bytes, bytearray, memoryview)):
        raise PromptError(f"{what}: expected str, got {type(text).__name__}; decode bytes first (e.g. data.decode('utf-8'))")
    if not isinstance(text, str):
        raise PromptError(f"{what}: expected str, got {type(text).__name__}")
    m = _SURROGATE.search(text)
    if m:
        raise PromptError(f"{what}: lone surrogate U+{ord(m.group()):04X} at index {m.start()} is not valid Unicode text")
    m = _CONTROL.search(text)
    if m:
        raise PromptError(
            f"{what}: control character U+{ord(m.group()):04X} at index {m.start()}; only tab, newline and carriage return are allowed"
        )
    if max_chars is not None and len(text) > max_chars:
        raise PromptError(f"{what}: {len(text)} characters, more than the limit of {max_chars}")
    return text
