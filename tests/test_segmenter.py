from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.text.segmenter import Piece, is_translatable
from tests.configs import segment, segmenter

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
    "他说：“好。”然后走了。「对。」」",
    # Sentence ends inside inline code and math, stray backticks and dollars, prices.
    "Run `x = 1. Then y = 2` and see. The value $a. B$ is odd. Done. ",
    "A stray ` backtick. Then ``a ` b. C`` here! It costs $5. Then $6. ",
    "运行 `python a.py。然后` 再看。$$a. B$$ 好。",
]
# Stray and nested fences, and closing-line look-alikes, for the fence bound.
FENCES = ["```\n", "````\n", "~~~\n", "```py\n", "``", "`\n", "   ```  \n", "```x", "\n"]
fenced = st.lists(
    st.one_of(st.sampled_from(SAMPLES), st.sampled_from(FENCES), st.text(max_size=20)),
    max_size=14,
).map("".join)
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
    seg = segmenter(max_chars)
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
    seg = segmenter(400)
    pieces: list[Piece] = []
    for chunk in chunked(sizes, text):
        pieces += seg.feed(chunk)
    pieces += seg.flush()
    assert [p.text for p in pieces] == [p.text for p in whole]


@settings(max_examples=500, deadline=None)
@given(text=fenced, sizes=st.lists(st.integers(1, 9), max_size=300),
       max_chars=st.integers(16, 60), max_fence=st.integers(8, 90))
def test_fence_bound_does_not_depend_on_the_chunking(
    text: str, sizes: list[int], max_chars: int, max_fence: int
) -> None:
    """Whether a fence is closed within max_fence_chars, and so whether it is code or a stray
    fence, comes out the same whether the text arrives whole or in deltas."""
    whole = segment(text, max_chars, max_fence_chars=max_fence)
    seg = segmenter(max_chars, max_fence_chars=max_fence)
    pieces: list[Piece] = []
    for chunk in chunked(sizes, text):
        pieces += seg.feed(chunk)
    pieces += seg.flush()
    assert [(p.text, p.kind) for p in pieces] == [(p.text, p.kind) for p in whole]
    assert "".join(p.text for p in pieces) == text
    assert all(p.text for p in pieces)


@settings(max_examples=300, deadline=None)
@given(text=fenced, sizes=st.lists(st.integers(1, 9), max_size=300),
       idle=st.sets(st.integers(0, 40), max_size=6), max_fence=st.integers(8, 90))
def test_idle_flushes_lose_and_repeat_nothing(
    text: str, sizes: list[int], idle: set[int], max_fence: int
) -> None:
    """Idle flushes between deltas (final=False) cut where they come, but every character
    still comes out once, in order."""
    seg = segmenter(16, max_fence_chars=max_fence)
    pieces: list[Piece] = []
    for i, chunk in enumerate(chunked(sizes, text)):
        pieces += seg.feed(chunk)
        if i in idle:
            pieces += seg.flush(final=False)
            assert seg.pending == ""
    pieces += seg.flush()
    assert "".join(p.text for p in pieces) == text
    assert all(p.text for p in pieces)


PROSE = "".join(f"Sentence number {i} is prose. " for i in range(12))


def test_a_stray_fence_is_prose_past_the_fence_bound() -> None:
    text = "Look at this:\n```python\n" + PROSE
    pieces = [(p.text, p.kind) for p in segment(text, 400, max_fence_chars=64)]
    assert pieces[:4] == [
        ("Look at this:\n", "text"), ("```python\n", "code"),
        ("Sentence number 0 is prose. ", "text"), ("Sentence number 1 is prose. ", "text")]
    assert len(pieces) == 2 + 12


def test_a_stray_fence_in_deltas_releases_the_prose_held_behind_it() -> None:
    seg = segmenter(400, max_fence_chars=64)
    out: list[Piece] = []
    for ch in "```\n" + PROSE[:59]:
        out += seg.feed(ch)
    assert out == [] and len(seg.pending) == 63  # held: the fence may still close
    out += seg.feed(PROSE[59])
    assert [p.kind for p in out] == ["code", "text", "text"]
    assert out[0].text == "```\n"


def test_a_fence_closed_within_the_bound_is_one_code_segment() -> None:
    code = "```\n" + "x = 1\n" * 8 + "```\n"
    assert [(p.text, p.kind) for p in segment(code + "Then prose. ", 400, max_fence_chars=60)
            ] == [(code, "code"), ("Then prose. ", "text")]


def test_a_fence_closed_past_the_bound_is_prose_and_its_close_opens_the_next() -> None:
    code = "```\n" + "x = 1\n" * 12 + "```\n"
    pieces = segment(code + "Then prose.", 400, max_fence_chars=60)
    assert pieces[0] == Piece("```\n", "code")
    assert pieces[1] == Piece("x = 1\n", "text")
    assert pieces[-1] == Piece("```\nThen prose.", "code")  # a fence again, flushed at the end


def test_the_opening_line_of_a_stray_fence_without_a_newline() -> None:
    text = "```" + "x" * 100
    assert segment(text, 400, max_fence_chars=32)[0] == Piece("```", "code")


def test_an_idle_flush_before_the_newline_of_the_closing_line_keeps_the_close() -> None:
    seg = segmenter(400, max_fence_chars=200)
    out = seg.feed("```py\nx = 1\n``")
    out += seg.flush(final=False)  # the agent pauses mid-way through the closing fence
    out += seg.feed("`\nNow prose. More")
    out += seg.flush()
    assert [(p.text, p.kind) for p in out] == [
        ("```py\nx = 1\n``", "code"), ("`\n", "code"), ("Now prose. ", "text"),
        ("More", "text")]


def test_an_idle_flush_after_the_closing_line_ends_the_fence() -> None:
    seg = segmenter(400)
    out = seg.feed("```py\nx = 1\n```\n") + seg.flush(final=False)
    out += seg.feed("Now prose. More") + seg.flush()
    assert [p.kind for p in out] == ["code", "text", "text"]


def test_an_idle_flush_inside_a_stray_fence_still_ends_it_at_the_bound() -> None:
    seg = segmenter(400, max_fence_chars=64)
    out = seg.feed("```\nSo. ") + seg.flush(final=False)
    assert [p.kind for p in out] == ["code"]
    out = seg.feed(PROSE)
    assert out and all(p.kind == "text" for p in out)
    assert "".join(p.text for p in [*out, *seg.flush()]) == PROSE


def test_a_fence_marker_at_the_end_of_a_delta_waits_for_its_length() -> None:
    """"```" then "`": a "````" fence, which "```" does not close."""
    text = "````\ncode\n```\nstill code\n````\nProse. "
    seg = segmenter(400)
    pieces = [*seg.feed("```"), *seg.feed(text[3:]), *seg.flush()]
    assert [p.text for p in pieces] == [p.text for p in segment(text)]
    assert pieces[0] == Piece("````\ncode\n```\nstill code\n````\n", "code")


def test_fence_and_size_bounds_stay_linear() -> None:
    """Stray fences answered by other fences, long lines and texts without a boundary are
    each looked at once: a quadratic rescan takes seconds here, not milliseconds."""
    import time

    texts = [
        "````a\n" * 3000 + "```\n" * 5000,  # stray fences over many shorter closing lines
        "".join("`" * k + "a\n" for k in range(200, 3, -1)) * 20,  # ever shorter stray fences
        "```\n" + "x" * 100_000,  # one long line inside a stray fence
        "word " * 60_000,  # no sentence end: cut at the size bound
    ]

    def seconds(text: str) -> float:
        started = time.perf_counter()
        assert "".join(p.text for p in segment(text)) == text
        seg = segmenter(400)
        fed = [p for i in range(0, len(text), 5) for p in seg.feed(text[i:i + 5])]
        assert "".join(p.text for p in [*fed, *seg.flush()]) == text
        return time.perf_counter() - started

    # Against plain prose as long, cut on this machine as it is loaded now: quadratic work
    # on these texts takes minutes, linear work a small multiple of the prose's time.
    for text in texts:
        prose = ("Let me check the parser once more. " * (len(text) // 35 + 1))[:len(text)]
        assert seconds(text) < max(3.0, 20 * seconds(prose)), text[:20]


def test_false_ends_after_a_long_word_cost_what_prose_does() -> None:
    """Whether a period ends a sentence ("e.g. X", "No. 5") is read from the word before it:
    a long word before many of them is not read again at each. CPU time of both texts here,
    now, so a loaded machine slows them alike; reading from the start of the held text cost
    14-36 times the prose's."""
    import time

    size = 100_000

    def cpu_s(text: str, chunk: int | None) -> float:
        """The least CPU time of three cuts of ``text``, whole or in ``chunk``-sized deltas."""
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            seg = segmenter(400)
            step = chunk or len(text)
            pieces = [p for i in range(0, len(text), step) for p in seg.feed(text[i:i + step])]
            pieces += seg.flush()
            best = min(best, time.process_time() - started)
            assert "".join(p.text for p in pieces) == text
        return best

    prose = ("Let me check the parser once more. " * (size // 35 + 1))[:size]
    for false_end in (" e.g. X", " No. 5", " Mr. X"):
        # Each segment: a 200-letter word, then false ends up to the size bound.
        unit = "x" * 200 + false_end * (220 // len(false_end))
        text = (unit * (size // len(unit) + 1))[:size]
        for chunk in (None, 5):
            assert cpu_s(text, chunk) < 5 * cpu_s(prose, chunk), (false_end, chunk)
    # They are still false ends: the word's segment goes on through them.
    word = "x" * 200 + " e.g. X" * 20 + ". Next one. "
    assert [p.text for p in segment(word)] == [word[:-len("Next one. ")], "Next one. "]
    # A list number is one only as long as a word looked back at; a longer run of digits
    # at the start of a line ends its sentence.
    assert [p.text for p in segment("12. Step\n" + "1" * 40 + ". Done")] == [
        "12. Step\n", "1" * 40 + ". ", "Done"]


def test_max_fence_chars_is_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="max_fence_chars must be >= 8, got 4"):
        segmenter(400, max_fence_chars=4)


def test_cjk_terminators_across_deltas_stay_together() -> None:
    seg = segmenter(400)
    pieces = [*seg.feed("好。"), *seg.feed("。"), *seg.feed("然后"), *seg.flush()]
    assert [p.text for p in pieces] == ["好。。", "然后"] == texts_of("好。。然后")


def test_cjk_closer_at_the_end_of_a_delta_stays_with_its_sentence() -> None:
    seg = segmenter(400)
    pieces = [*seg.feed("好。」"), *seg.feed("然后"), *seg.flush()]
    assert [p.text for p in pieces] == ["好。」", "然后"] == texts_of("好。」然后")


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
    seg = segmenter(400)
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
    seg = segmenter(400)
    assert seg.feed("Hello. ") == []
    assert [p.kind for p in seg.flush()] == ["text"]
    seg.feed("\n\n")
    assert [(p.text, p.kind) for p in seg.flush()] == [("\n\n", "blank")]


def span_cuts(pieces: list[Piece]) -> list[int]:
    """The offsets of the cuts between pieces that fall inside an inline code span or
    inline math of the joined text (the spans models.spans protects)."""
    from models.spans import SpanFinder

    text = "".join(p.text for p in pieces)
    cuts, at = [], 0
    for p in pieces[:-1]:
        at += len(p.text)
        cuts.append(at)
    finder = SpanFinder(kinds=["code", "math"])
    inside = []
    for line_start, line in _lines(text):
        found = finder.find(line)
        for span in found.spans if found else ():
            start, end = line_start + span.start, line_start + span.end
            inside += [c for c in cuts if start < c < end]
    return inside


def _lines(text: str) -> list[tuple[int, str]]:
    """Lines as the segmenter and the finder see them: ended by "\n" alone (not by the
    other ends ``str.splitlines`` knows, such as "\x1e" or "\u2028")."""
    out, at = [], 0
    for line in text.split("\n"):
        line += "\n" if at + len(line) < len(text) else ""
        out.append((at, line))
        at += len(line)
    return out


@settings(max_examples=300, deadline=None)
@given(text=texts, sizes=st.lists(st.integers(1, 8), max_size=300))
# A control character is whitespace to str.isspace, not to the finder's ASCII patterns; and
# "\x1e" ends a line for str.splitlines, not for the segmenter or the finder.
@example(text="$Hmm, the user said hello. Let me think about it! Is 3.14 right? \x1f$", sizes=[])
@example(text="A stray ` backtick. Then $6. \x1eRun `x = 1. Then y = 2` and see. Done. ",
         sizes=[])
def test_no_cut_inside_inline_code_or_math(text: str, sizes: list[int]) -> None:
    """A protected span never splits a sentence: whole or in deltas, no cut falls inside
    inline code or math."""
    seg = segmenter(400)
    pieces: list[Piece] = []
    for chunk in chunked(sizes, text):
        pieces += seg.feed(chunk)
    pieces += seg.flush()
    assert span_cuts(pieces) == []
    assert span_cuts(segment(text, 400)) == []


def test_sentence_ends_inside_code_and_math_are_not_boundaries() -> None:
    assert texts_of("Run `a. B` now. Then stop.") == ["Run `a. B` now. ", "Then stop."]
    assert texts_of("Run `x = 1. Then y = 2` and see. Done.") == [
        "Run `x = 1. Then y = 2` and see. ", "Done."]
    assert texts_of("The value $a. B$ is odd. Next.") == ["The value $a. B$ is odd. ", "Next."]
    assert texts_of("He wrote $$a. B$$ there. Next.") == ["He wrote $$a. B$$ there. ", "Next."]
    assert texts_of("Two ``a ` b. C`` here. Next.") == ["Two ``a ` b. C`` here. ", "Next."]
    assert texts_of("运行 `python a.py。然后` 再看。好的。") == [
        "运行 `python a.py。然后` 再看。", "好的。"]


def test_what_is_not_a_span_still_ends_sentences() -> None:
    # A stray backtick or dollar, prices, URLs, paths, versions, "e.g. `x`", "p. ex. `x`".
    assert texts_of("A stray ` backtick. Then more. Done.") == [
        "A stray ` backtick. ", "Then more. ", "Done."]
    assert texts_of("It costs $5. Then $10 more. US$5. Fine.") == [
        "It costs $5. ", "Then $10 more. ", "US$5. ", "Fine."]
    assert texts_of("See https://x.org/a. Then go. Edit src/app.py. Upgrade to v1.2. Ok.") == [
        "See https://x.org/a. ", "Then go. ", "Edit src/app.py. ", "Upgrade to v1.2. ", "Ok."]
    assert texts_of("Use e.g. `x` here. Sur windows, p. ex. `cd src` — étrange. Suite.") == [
        "Use e.g. `x` here. ", "Sur windows, p. ex. `cd src` — étrange. ", "Suite."]


def test_a_sentence_end_after_an_unclosed_backtick_waits_for_its_line() -> None:
    seg = segmenter(400)
    assert seg.feed("Run `a. B") == []  # the backtick may close later on the line
    assert seg.feed("` now. Then") == [Piece("Run `a. B` now. ", "text")]
    seg = segmenter(400)
    assert seg.feed("A stray ` backtick. Then more") == []
    assert [p.text for p in seg.feed(".\nNext")] == ["A stray ` backtick. ", "Then more.\n"]
    seg = segmenter(400)
    assert seg.feed("A stray ` here. Then more. ") == []
    assert [p.text for p in seg.flush()] == ["A stray ` here. ", "Then more. "]
    seg = segmenter(400)
    assert seg.feed("Math $a. B$") == []  # "$x" after it would make it no closing dollar
    assert seg.feed(" ok. Next") == [Piece("Math $a. B$ ok. ", "text")]


def test_a_sentence_end_waiting_for_its_line_is_cut_at_the_size_bound() -> None:
    text = "A ` stray. " + "word " * 20
    seg = segmenter(40)
    out = seg.feed(text)
    assert out and all(len(p.text) <= 40 for p in out)
    assert "".join(p.text for p in [*out, *seg.flush()]) == text


def test_translatable() -> None:
    for text in ["Hmm.", "Let x = 3.", "OK", "Call `foo()` to get it.", "好", "これ"]:
        assert is_translatable(text), text
    for text in ["42 + 17 = 59", "x = foo(y)", "https://example.com/a", "`foo()`.", "...",
                 "total_time = a + b", "$$x^2 + y^2$$", "3.14159", "---", ""]:
        assert not is_translatable(text), text


def test_max_chars_is_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="max_chars must be >= 16, got 3"):
        segmenter(3)


def test_leading_whitespace_split_across_deltas_stays_with_its_sentence() -> None:
    text = "\n\n   \tHmm, the user said hello. Let me think. "
    seg = segmenter(400)
    pieces = [*seg.feed(text[:1]), *seg.feed(text[1:9]), *seg.feed(text[9:]), *seg.flush()]
    assert [p.text for p in pieces] == ["\n\n   \tHmm, the user said hello. ", "Let me think. "]
