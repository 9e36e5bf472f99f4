"""models/local/pieces.py alone: texts cut into parts that fit the model, and joined back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from models.local.pieces import Part, cut_texts, rejoin, split_text


def words(text: str) -> int:
    return len(text.split())


def test_split_text_cuts_at_sentences_then_words_then_characters() -> None:
    text = "One two three. Four five six seven. Eight nine."
    pieces = split_text(text, words, 4)
    assert pieces == ["One two three. ", "Four five six seven. ", "Eight nine."]
    long_sentence = "a b c d e f g h i j"
    pieces = split_text(long_sentence, words, 4)
    assert "".join(pieces) == long_sentence and pieces[0] == "a b c d "
    assert all(words(piece) <= 4 for piece in pieces)
    # Text without spaces: halved until each piece fits.
    cjk = "用户说了你好" * 8
    pieces = split_text(cjk, len, 10)
    assert "".join(pieces) == cjk and all(len(piece) <= 10 for piece in pieces)
    assert split_text("short one", words, 4) == ["short one"]
    # Chinese sentence ends need no space after them.
    assert split_text("你好。用户说了。好的", len, 5) == ["你好。", "用户说了。", "好的"]


@given(st.text(alphabet=st.sampled_from("ab .。\n"), max_size=80), st.integers(1, 6))
def test_split_text_loses_and_reorders_nothing(text: str, max_tokens: int) -> None:
    pieces = split_text(text, len, max_tokens)
    assert "".join(pieces) == text
    # Each piece fits, but a single character, which cannot be cut further, and the
    # whitespace a piece carries after its text.
    assert all(len(piece.rstrip()) <= max_tokens or len(piece.strip()) == 1 for piece in pieces)


def test_cut_texts_keeps_whitespace_and_skips_blank_texts() -> None:
    pieces = cut_texts(["  Hello there.\n", "", " \t", "One two. Three four."], words, 2)
    assert pieces.leads == ["  ", "", " \t", ""]
    assert pieces.trails == ["\n", "", "", ""]  # a blank text's whitespace is its lead
    assert [(p.index, p.text, p.sep, p.n_tokens) for p in pieces.parts] == [
        (0, "Hello there.", "", 2), (3, "One two.", " ", 2), (3, "Three four.", "", 2)]
    assert pieces.split == 1


def translated(texts: list[str], max_tokens: int, no_space: bool = False) -> list[str]:
    """Through cut_texts and rejoin, each part "translated" to its upper case."""
    pieces = cut_texts(texts, words, max_tokens)
    for part in pieces.parts:
        part.out = part.text.upper()
    return rejoin(pieces, no_space)


def test_rejoin_puts_every_text_back_in_order() -> None:
    texts = ["  one two. three\n", "", "\n", "four.  five six.\n\nseven"]
    assert translated(texts, 2) == ["  ONE TWO. THREE\n", "", "\n", "FOUR.  FIVE SIX.\n\nSEVEN"]


def test_rejoin_without_spaces_keeps_newlines() -> None:
    assert translated(["一 二。 三 四。\n五 六。"], 2, no_space=True) == ["一 二。三 四。\n五 六。"]
    pieces = cut_texts(["x"], words, 2)
    pieces.parts = [Part(0, "a", ""), Part(0, "b", "")]  # cut between characters: no sep
    for part in pieces.parts:
        part.out = part.text
    assert rejoin(pieces, no_space=False) == ["a b"] and rejoin(pieces, no_space=True) == ["ab"]
