from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.segmenter import Piece, Segmenter, is_translatable, segment

SAMPLES = [
    "Hmm, the user said hello. Let me think about it! Is 3.14 right? ",
    "首先，确定整个 hiking旅程所用的总时间。然后计算速度！好吗？",
    "まず、問題を整理しましょう。次に計算します。",
    "Steps:\n1. Open main.py.\n2. Run it, e.g. with v1.2.3.\n\n",
    "Here is code:\n```python\nx = 1. \n\ny = 2\n```\n\nAfter the code. ",
    "Das ist gut. Wir prüfen das noch einmal! ",
    "42 + 17 = 59\n",
    "See https://example.com/a.b?c=d. Then `foo()` runs. ",
    "Wait... really? \"Yes.\" OK.\n- item one\n- item two\n",
    "\n\n   \t",
    "~~~\ncode ~~~ not closed here\n~~~\nx",
]
texts = st.lists(
    st.one_of(st.sampled_from(SAMPLES), st.text(max_size=40)), max_size=8
).map("".join)


def chunked(draw_sizes: list[int], text: str) -> list[str]:
    out, pos = [], 0
    for size in draw_sizes:
        if pos >= len(text):
            break
        out.append(text[pos : pos + size])
        pos += size
    out.append(text[pos:])
    return out


@settings(max_examples=300, deadline=None)
@given(text=texts, sizes=st.lists(st.integers(1, 12), max_size=200),
       max_chars=st.integers(16, 120))
def test_any_chunking_joins_back_exactly(text: str, sizes: list[int], max_chars: int) -> None:
    seg = Segmenter(max_chars)
    pieces: list[Piece] = []
    for chunk in chunked(sizes, text):
        pieces += seg.feed(chunk)
    pieces += seg.flush()
    assert "".join(p.text for p in pieces) == text
    assert all(p.text for p in pieces)
    assert seg.pending == ""


@settings(max_examples=500, deadline=None)
@given(text=texts, sizes=st.lists(st.integers(1, 8), max_size=300))
def test_chunking_does_not_change_the_cut(text: str, sizes: list[int]) -> None:
    """A sentence that arrives in 30 deltas is the same segment as one sent whole."""
    whole = segment(text, 400)
    seg = Segmenter(400)
    pieces: list[Piece] = []
    for chunk in chunked(sizes, text):
        pieces += seg.feed(chunk)
    pieces += seg.flush()
    assert [p.text for p in pieces] == [p.text for p in whole]


def texts_of(text: str, max_chars: int = 400) -> list[str]:
    return [p.text for p in segment(text, max_chars)]


def test_sentences_keep_their_whitespace() -> None:
    assert texts_of("Hmm, the user said hello. Let me think! Right? Yes") == [
        "Hmm, the user said hello. ", "Let me think! ", "Right? ", "Yes"]


def test_cjk_sentences_need_no_space() -> None:
    assert texts_of("首先，确定总时间。然后计算速度！好吗？OK") == [
        "首先，确定总时间。", "然后计算速度！", "好吗？", "OK"]


def test_not_boundaries() -> None:
    text = "Pi is 3.14 here. Version v1.2.3 of main.py is fine, e.g. this one. Mr. Smith agrees."
    assert texts_of(text) == [
        "Pi is 3.14 here. ", "Version v1.2.3 of main.py is fine, e.g. this one. ",
        "Mr. Smith agrees."]


def test_lines_and_list_items() -> None:
    assert texts_of("Steps:\n1. First step.\n2. Second\n\nNew paragraph.") == [
        "Steps:\n", "1. First step.\n", "2. Second\n\n", "New paragraph."]


def test_code_fence_is_one_segment() -> None:
    pieces = segment("Code:\n```python\nx = 1.  \n\ny = 2\n```\n\nDone. ")
    assert [(p.text, p.kind) for p in pieces] == [
        ("Code:\n", "text"), ("```python\nx = 1.  \n\ny = 2\n```\n\n", "code"),
        ("Done. ", "text")]


def test_code_fence_across_deltas_is_one_segment() -> None:
    text = "Look:\n```\nfor i in range(3):\n    print(i)\n```\nThat prints. "
    seg = Segmenter(400)
    pieces: list[Piece] = []
    for ch in text:
        pieces += seg.feed(ch)
    pieces += seg.flush()
    assert [p.kind for p in pieces] == ["text", "code", "text"]
    assert pieces[1].text == "```\nfor i in range(3):\n    print(i)\n```\n"


def test_unclosed_fence_flushes_as_code() -> None:
    assert [(p.text, p.kind) for p in segment("```\nx = 1\n")] == [("```\nx = 1\n", "code")]


def test_size_bound_cuts_at_whitespace() -> None:
    text = "word " * 30
    pieces = texts_of(text, 40)
    assert "".join(pieces) == text
    assert all(len(p) <= 40 for p in pieces)
    assert all(p.endswith(" ") for p in pieces)


def test_blank_is_its_own_kind() -> None:
    seg = Segmenter(400)
    assert seg.feed("Hello. ") == []
    assert [p.kind for p in seg.flush()] == ["text"]
    seg.feed("\n\n")
    assert [(p.text, p.kind) for p in seg.flush()] == [("\n\n", "blank")]


def test_translatable() -> None:
    for text in ["Hmm.", "Let x = 3.", "OK", "Call `foo()` to get it.", "好", "これ"]:
        assert is_translatable(text), text
    for text in ["42 + 17 = 59", "x = foo(y)", "https://example.com/a", "`foo()`.", "...",
                 "total_time = a + b", "$$x^2 + y^2$$", "3.14159", "---", ""]:
        assert not is_translatable(text), text


def test_max_chars_is_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="max_chars must be >= 16, got 3"):
        Segmenter(3)


def test_leading_whitespace_split_across_deltas_stays_with_its_sentence() -> None:
    text = "\n\n   \tHmm, the user said hello. Let me think. "
    seg = Segmenter(400)
    pieces = [*seg.feed(text[:1]), *seg.feed(text[1:9]), *seg.feed(text[9:]), *seg.flush()]
    assert [p.text for p in pieces] == ["\n\n   \tHmm, the user said hello. ", "Let me think. "]
