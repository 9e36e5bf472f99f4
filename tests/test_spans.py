"""Protected spans (models.spans): the finder on a corpus of real sentences in eight
languages (tests/data/spans_corpus.jsonl, its provenance in spans_corpus.md), each kind of
the table, overlaps, glossary terms, extra patterns, placeholders, runs."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from models.spans import (
    INTEGER,
    KINDS,
    Glossary,
    Placeholders,
    Protected,
    Span,
    SpanFinder,
    needs_words,
    rejoin,
)

DATA = Path(__file__).parent / "data"
LANGS = ["zh", "ja", "ko", "de", "fr", "es", "ru", "en"]
FINDER = SpanFinder()
# The corpus lists the spans of the table's patterns; integers, a rule of their own (every
# integer standing alone), are left out of it and tested below.
TABLE = SpanFinder(kinds=[kind for kind in KINDS if kind != INTEGER])


def rows(name: str) -> list[dict[str, object]]:
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


CORPUS = rows("spans_corpus.jsonl")
HELDOUT = rows("spans_heldout.jsonl")


def outs(text: str, finder: SpanFinder = TABLE, glossary: Glossary | None = None) -> list[str]:
    found = finder.find(text, glossary)
    return [s.out for s in found.spans] if found else []


def kinds(text: str, finder: SpanFinder = TABLE) -> list[tuple[str, str]]:
    found = finder.find(text)
    return [(s.kind, s.out) for s in found.spans] if found else []


def score(lines: list[dict[str, object]]) -> dict[str, Counter[str]]:
    """Per language: spans expected and found (tp), found but not expected (fp), expected
    but not found (fn), as multisets of strings."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for row in lines:
        expected, got = Counter(row["spans"]), Counter(outs(str(row["text"])))  # type: ignore[arg-type]
        lang = str(row["lang"])
        out[lang]["tp"] += sum((expected & got).values())
        out[lang]["fp"] += sum((got - expected).values())
        out[lang]["fn"] += sum((expected - got).values())
    return out


def test_the_corpus_is_what_its_provenance_says() -> None:
    counts = Counter(str(row["lang"]) for row in CORPUS)
    assert set(counts) == set(LANGS) and min(counts.values()) >= 15 and len(CORPUS) >= 150
    sources = (DATA / "spans_corpus.md").read_text(encoding="utf-8")
    for row in [*CORPUS, *HELDOUT]:
        assert set(row) == {"lang", "text", "spans", "source"}
        assert f"`{row['source']}`" in sources, row["source"]  # each source is described
        at = 0
        for span in row["spans"]:  # type: ignore[attr-defined]
            at = str(row["text"]).index(span, at) + len(span)  # in the text, in order
    negatives = [row for row in CORPUS if not row["spans"]]
    assert len(negatives) >= 30  # sentences with no span at all, prose that looks like spans


@pytest.mark.parametrize("lang", LANGS)
def test_the_corpus_spans_are_found_exactly(lang: str) -> None:
    """Each expected span of each sentence is found, byte for byte and in order; no
    sentence gets a span it should not have."""
    for row in (r for r in CORPUS if r["lang"] == lang):
        assert outs(str(row["text"])) == row["spans"], row["text"]


def test_held_out_sentences_meet_the_floor() -> None:
    """Sentences the table was not tuned on (spans_heldout.jsonl): precision and recall
    both at least 0.9 (0.98 each when written; the misses are listed in spans_corpus.md)."""
    totals = sum(score(HELDOUT).values(), Counter())
    precision = totals["tp"] / (totals["tp"] + totals["fp"])
    recall = totals["tp"] / (totals["tp"] + totals["fn"])
    assert precision >= 0.9 and recall >= 0.9, (precision, recall)


# --- each kind ---------------------------------------------------------------------------


def test_code() -> None:
    assert kinds("Run `pip install x` and ```a ` b``` now.") == [
        ("code", "`pip install x`"), ("code", "```a ` b```")]
    assert outs("`map()`-Methode und `root`-Rechte") == ["`map()`", "`root`"]
    assert outs("a lone ` backtick") == []


def test_math() -> None:
    assert kinds(r"So $x^2 + 1$ and $$\sum_i a_i$$ and \(a_i\) and \[b\] hold.") == [
        ("math", "$x^2 + 1$"), ("math", r"$$\sum_i a_i$$"), ("math", r"\(a_i\)"),
        ("math", r"\[b\]")]
    assert kinds(r"Take \frac{a}{b} here.") == [("math", r"\frac{a}{b}")]
    assert outs("区间复杂度为$O(1)$。") == ["$O(1)$"]
    # Prices are not math: "$5 and $6", "$5. Then $6", "$160-$240"; "$6$" is.
    assert outs("It costs $5 and $6, or $160-$240 in all, $5. Then $6 more.") == []
    assert outs("It costs $5. Then $6$ is math.") == ["$6$"]


def test_url_and_email() -> None:
    assert outs("See https://x.org/a_(b). Then www.y.com, and t.me/chan or glitch.com.") == [
        "https://x.org/a_(b)", "www.y.com", "t.me/chan", "glitch.com"]
    assert outs("见https://x.org/a的说明。") == ["https://x.org/a"]  # CJK ends a URL
    assert kinds("Mail coordinacion.iic2233@gmail.com).") == [
        ("email", "coordinacion.iic2233@gmail.com")]


def test_error() -> None:
    assert kinds('It threw "ModuleNotFoundError: No module named \'x\'" at once.') == [
        ("error", "\"ModuleNotFoundError: No module named 'x'\"")]
    assert kinds("me dice: AttributeError: 'C' object has no attribute 'v'. Luego") == [
        ("error", "AttributeError: 'C' object has no attribute 'v'")]
    assert kinds("是RuntimeError: sizes=[4]，而b") == [("error", "RuntimeError: sizes=[4]")]


def test_path() -> None:
    assert outs("Edit src/app.py, ./run.sh, ~/.config/x, /etc/hosts and %appdata/x/y.") == [
        "src/app.py", "./run.sh", "~/.config/x", "/etc/hosts", "%appdata/x/y"]
    assert outs("GET /speakersで落ちた, data/*.ps, main.c:120 and a .sh file.") == [
        "/speakers", "data/*.ps", "main.c:120", ".sh"]
    assert outs(r"Installed to C:\Program Files (x86)\Swifty) or 「C:\voicevox」.") == [
        r"C:\Program Files (x86)\Swifty", r"C:\voicevox"]
    assert outs("检查config.yaml和web_demo.py") == ["config.yaml", "web_demo.py"]
    # Prose with slashes and dots: no path.
    assert outs("and/or, Linux/Unix, km/h, 24/7, $2-8/hour, Copy/Paste, e.g. d.h. U.S.") == []


def test_flag() -> None:
    assert kinds("Pass --dry-run, -v and --max-tokens=128.") == [
        ("flag", "--dry-run"), ("flag", "-v"), ("flag", "--max-tokens=128")]
    assert outs("c'est-à-dire, e-mail, Linux-Distributionen, a - b, then -- looks") == []


def test_version() -> None:
    assert kinds("From v1.2.3 to 2.13.0rc1 (0.9.1にて), voicevox-cpu-0.12.0.") == [
        ("version", "v1.2.3"), ("version", "2.13.0rc1"), ("version", "0.9.1"),
        ("version", "voicevox-cpu-0.12.0")]


def test_expr() -> None:
    assert kinds("It is O(n log n), O(n*log(n)) and a[i] == b[j].") == [
        ("expr", "O(n log n)"), ("expr", "O(n*log(n))"), ("expr", "a[i] == b[j]")]
    assert outs('Set CUDA_VISIBLE_DEVICES=1, parse_mode="HTML". Then x = 3, a[i] =2*a[j].') == [
        "CUDA_VISIBLE_DEVICES=1", 'parse_mode="HTML"', "x = 3", "a[i] =2*a[j]"]
    assert outs("Got [1, NaN, NaN] from liste[milieu], and x^2 + 1.") == [
        "[1, NaN, NaN]", "liste[milieu]", "x^2 + 1"]


def test_identifier() -> None:
    assert kinds("Set batch_size, _pipfile, __init__, maxTokens, PyCharm and sys.path.append.") == [
        ("identifier", "batch_size"), ("identifier", "_pipfile"), ("identifier", "__init__"),
        ("identifier", "maxTokens"), ("identifier", "PyCharm"),
        ("identifier", "sys.path.append")]
    assert outs("javascript.0 and Python3.4 call log(n), then .quantize(4).cuda() runs.") == [
        "javascript.0", "Python3.4", "log(n)", ".quantize(4).cuda()"]
    # Markdown emphasis, plurals and dotted prose are not identifiers.
    assert outs("the _recursive_ option, the file(s), e.g. i.e. z.B. U.S. Mr. Smith") == []


def test_number() -> None:
    assert kinds("It took 10 ms, 5.33GB, 20K steps and 3.14 rad (version 3.10).") == [
        ("number", "10 ms"), ("number", "5.33GB"), ("number", "20K"), ("number", "3.14"),
        ("number", "3.10")]
    # Counts, years, dates, times, prices, percentages, multipliers, decades: no number.
    assert outs("In 1991, 3 files cost $2.50 or 5,99 € (80%, 5.7x, 1,000) on 2023-05-10 at "
                "10:30 in the 1990s, 64 bits.") == []


def test_integer() -> None:
    # Each integer standing alone; not a decimal's part, a grouped number, a decade, a
    # multiplier, nor digits glued to a letter.
    assert outs("In 1991, 3 files cost $2.50 or 5,99 € (80%, 5.7x, 1,000) on 2023-05-10 at "
                "10:30 in the 1990s, 64 bits.", FINDER) == [
        "1991", "3", "80", "2023", "05", "10", "10", "30", "64"]
    assert kinds("It returns 404 on port 8080 (line 42, #7).", FINDER) == [
        ("integer", "404"), ("integer", "8080"), ("integer", "42"), ("integer", "7")]
    assert kinds("utf8, x86_64, 1st, 2nd, 3x, v2, 3D, H2O and 4K", FINDER) == [
        ("identifier", "x86_64"), ("version", "v2"), ("identifier", "H2O"), ("number", "4K")]
    assert outs("检查第3行，然后2 3 轮", FINDER) == ["3", "2", "3"]  # CJK is no ASCII letter
    # A kind of the table holding the integer wins: it starts first or is longer.
    assert kinds("Wait 10 ms at main.c:120 with x = 3.", FINDER) == [
        ("number", "10 ms"), ("path", "main.c:120"), ("expr", "x = 3")]


def test_chosen_kinds_only_and_unknown_kinds() -> None:
    finder = SpanFinder(kinds=["url"])
    assert outs("See https://x.org and `code` and a_b.", finder) == ["https://x.org"]
    with pytest.raises(ValueError, match="unknown span kinds"):
        SpanFinder(kinds=["url", "nope"])
    assert set(KINDS) == {"code", "math", "url", "email", "error", "path", "flag", "version",
                          "expr", "identifier", "number", "integer"}


def test_overlaps_go_to_the_first_then_the_longest_then_the_earlier_kind() -> None:
    # Code wins over what it contains; the URL over its path; the path over its version.
    assert kinds("Run `cd src/app-1.2.3` or https://x.org/src/a.py and app/v1.2.3/x.py.") == [
        ("code", "`cd src/app-1.2.3`"), ("url", "https://x.org/src/a.py"),
        ("path", "app/v1.2.3/x.py")]
    # Same start: the longer wins (an expression over its identifier).
    assert kinds("Then A_i >= k holds.") == [("expr", "A_i >= k")]
    # Same span: the earlier kind (path before identifier).
    assert kinds("see README.md") == [("path", "README.md")]


# --- glossary terms and extra patterns ---------------------------------------------------


def test_glossary_terms_any_case_whole_words_and_cjk_without_boundaries() -> None:
    glossary = Glossary.of({"checkpoint": "检查点", "显存": "VRAM"}, keep=["Hub"])
    found = FINDER.find("A Checkpoint on the hub, no checkpoints, 爆显存了", glossary)
    assert found is not None
    assert [(s.kind, s.out, found.text[s.start:s.end]) for s in found.spans] == [
        ("term", "检查点", "Checkpoint"), ("keep", "hub", "hub"), ("term", "VRAM", "显存")]
    assert found.glossary == glossary
    assert FINDER.find("log in the blog", Glossary.of(keep=["log"])) is not None
    assert outs("blogging and catalog", glossary=Glossary.of(keep=["log"])) == []


def test_glossary_longest_term_first() -> None:
    glossary = Glossary.of({"batch": "lote", "batch size": "tamaño de lote", "size": "talla"})
    assert outs("the batch size and the batch", glossary=glossary) == ["tamaño de lote", "lote"]


def test_a_term_inside_inline_code_stays_code() -> None:
    glossary = Glossary.of({"pip": "PIP"}, keep=["install"])
    assert kinds_with("Run `pip install x` then pip.", glossary) == [
        ("code", "`pip install x`"), ("term", "PIP")]


def test_a_term_wins_over_a_kind_on_the_same_text() -> None:
    assert kinds_with("edit config.yaml now", Glossary.of({"config.yaml": "配置"})) == [
        ("term", "配置")]


def kinds_with(text: str, glossary: Glossary) -> list[tuple[str, str]]:
    found = FINDER.find(text, glossary)
    return [(s.kind, s.out) for s in found.spans] if found else []


def test_extra_patterns() -> None:
    finder = SpanFinder(patterns=[r"JIRA-\d+", r"ticket #\d+"])
    found = finder.find("Fix JIRA-42 and ticket #7 in a.py.")
    assert found is not None
    assert [(s.kind, s.out) for s in found.spans] == [
        ("pattern", "JIRA-42"), ("pattern", "ticket #7"), ("path", "a.py")]
    with pytest.raises(ValueError, match=r"pattern 1 \('\( '\) is not a valid"):
        SpanFinder(patterns=["ok", "( "])
    with pytest.raises(ValueError, match=r"pattern 0 \('x\?'\) matches the empty string"):
        SpanFinder(patterns=["x?"])


# --- placeholders, missing spans, runs -----------------------------------------------------

BRACKETS = Placeholders("[{i}]", r"\[\s*(\d+)\s*\]")
TOKENS = Placeholders("<x{i}>", r"<\s*x\s*(\d+)\s*>", base=1)


def protected(text: str, glossary: Glossary | None = None) -> Protected:
    found = FINDER.find(text, glossary)
    assert found is not None
    return found


def test_mask_and_unmask() -> None:
    p = protected("Run `make` in src/ with --fast.")
    assert BRACKETS.mask(p) == "Run [0] in [1] with [2]."
    assert TOKENS.mask(p) == "Run <x1> in <x2> with <x3>."
    # The engine moves placeholders and puts spaces inside them: still found.
    assert BRACKETS.unmask("用 [ 2 ] 在 [1 ] 运行 [0]。", p) == "用 --fast 在 src/ 运行 `make`。"
    assert TOKENS.unmask("< x 3 > < x2> <x1>", p) == "--fast src/ `make`"


def test_unmask_refuses_missing_repeated_and_unknown_placeholders() -> None:
    p = protected("Run `make` in src/ with --fast.")
    assert BRACKETS.unmask("[0] [1]", p) is None  # one lost
    assert BRACKETS.unmask("[0] [1] [2] [1]", p) is None  # one twice
    assert BRACKETS.unmask("[0] [1] [2] [3]", p) is None  # one that is no span's
    assert TOKENS.unmask("<x0> <x1> <x2>", p) is None  # numbered from 1


def test_unmask_puts_each_terms_target() -> None:
    p = protected("Save the checkpoint.", Glossary.of({"checkpoint": "检查点"}))
    assert BRACKETS.mask(p) == "Save the [0]."
    assert BRACKETS.unmask("保存[0]。", p) == "保存检查点。"


def test_missing_counts_each_span_as_often_as_the_original_has_it() -> None:
    p = protected("`x` then `x` then `y`.")
    assert p.required() == Counter({"`x`": 2, "`y`": 1})
    assert p.missing("`x` `x` `y`") == []
    assert [s.out for s in p.missing("`x` `y` and `y`")] == ["`x`"]  # one of the two
    assert [s.out for s in p.missing("nothing")] == ["`x`", "`x`", "`y`"]
    assert p.kinds() == ["code"]


def test_a_rendering_inside_a_longer_ones_keeps_no_term() -> None:
    # "ключ" is inside "API-ключ", another term's rendering: that occurrence keeps only
    # the longer term, and the lone "key" has not been rendered.
    glossary = Glossary.of({"API key": "API-ключ", "key": "ключ"})
    p = protected("Rotate the API key first, then the key of the cache.", glossary)
    assert [(s.kind, s.out) for s in p.spans] == [("term", "API-ключ"), ("term", "ключ")]
    assert [s.out for s in p.missing("Сначала смените API-ключ, затем API-ключ кэша.")] == [
        "ключ"]
    assert p.missing("Сначала смените API-ключ, затем ключ кэша.") == []
    # Terms kept as they are too; the other kinds count wherever they stand, since the
    # original itself may hold a span's text where it is no span ("`a` b` c`").
    keep = Glossary.of({"key": "ключ"}, ["API-ключ"])
    assert [s.out for s in protected("the API-ключ and the key", keep).missing(
        "API-ключ и API-ключ")] == ["ключ"]


@pytest.mark.parametrize("written", [
    "10000", "10,000", "10.000", "10 000", "10\u00a0000", "10\u202f000", "10'000", "١٠٠٠٠",
    "１００００", "1万",
])
def test_an_integer_is_kept_in_any_digits_and_grouping(written: str) -> None:
    p = protected("Set the limit to 10000 and retry 3 times after a 404.")
    assert [(s.kind, s.out) for s in p.spans] == [
        ("integer", "10000"), ("integer", "3"), ("integer", "404")]
    assert p.missing(f"Setze das Limit auf {written} und versuche es 3-mal nach einem 404.") == []


def test_an_integer_lost_or_changed_is_missing() -> None:
    p = protected("Set the limit to 10000 and retry 3 times after a 404.")
    assert [s.out for s in p.missing("Setze das Limit auf 1000, 30-mal nach 404.")] == [
        "10000", "3"]
    assert [s.out for s in p.missing("Setze das Limit auf 10.000 und versuche es nach einem "
                                     "Fehler erneut.")] == ["3", "404"]
    # Leading zeros aside.
    assert protected("Due 2023-05-10.").missing("Fällig am 10.5.2023.") == []


def test_the_original_keeps_its_own_spans() -> None:
    # "12 100" reads as 12100 in a translation too, and as the two integers it is.
    for text in [str(row["text"]) for row in [*CORPUS, *HELDOUT]] + [
            "I ran 12 100 times, 2 3 rounds, then 10 000."]:
        found = FINDER.find(text)
        assert found is None or found.missing(text) == [], text


def test_rejoin_never_glues_a_digit_to_an_integer() -> None:
    p = protected("Step 1 of 3.")
    assert [s.out for s in p.spans] == ["1", "3"]
    # Runs translated into digits where they touch the integers, as random weights do.
    translated = {"Step ": "Schritt77", " of ": "5von "}
    runs = [translated.get(r, r) if isinstance(r, str) else r for r in p.runs()]
    assert rejoin(runs) == "Schritt77 1 5von 3."
    assert p.missing(rejoin(runs)) == []


def test_runs_and_rejoin() -> None:
    p = protected("Save the checkpoint to a.py now.", Glossary.of({"checkpoint": "检查点"}))
    runs = p.runs()
    assert [r if isinstance(r, str) else r.out for r in runs] == [
        "Save the ", "检查点", " to ", "a.py", " now."]
    assert rejoin(runs) == "Save the 检查点 to a.py now."
    assert rejoin(["保存", runs[1], "到", runs[3], "。"]) == "保存检查点到a.py。"
    assert [needs_words(r) for r in runs if isinstance(r, str)] == [True, True, True]
    assert not needs_words(" -> ") and not needs_words("")
    q = protected("`a``b`")
    assert q.runs()[0] == "" and q.runs()[-1] == ""  # runs alternate, blank at the ends


def test_digest_names_the_spans_and_the_glossary() -> None:
    a, b = protected("Use a.py"), protected("Use a.py", Glossary.of(keep=["Use"]))
    assert a.digest != b.digest and a.digest == protected("Use a.py").digest


# --- properties ------------------------------------------------------------------------------

SAMPLES = [str(row["text"]) for row in CORPUS]
texts = st.lists(st.one_of(st.sampled_from(SAMPLES), st.text(max_size=30),
                           st.sampled_from(["`", "$", "/", "_", ".", "-", "=", "[", "(", "`x`",
                                            "$a$", " ", "\n", "好", "a.py"])),
                 max_size=6).map("".join)
glossaries = st.builds(
    Glossary.of,
    st.dictionaries(st.sampled_from(["the", "a.py", "显存", "Error", "x", "de"]),
                    st.sampled_from(["T", "检查点", "X"]), max_size=3),
    st.lists(st.sampled_from(["size", "log", "好", "API"]), max_size=2))


@settings(max_examples=300, deadline=None)
@given(text=texts, glossary=st.one_of(st.none(), glossaries))
def test_spans_never_overlap_lie_in_the_text_and_mask_back(
    text: str, glossary: Glossary | None,
) -> None:
    found = FINDER.find(text, glossary)
    if found is None:
        return
    assert found.text == text
    at = 0
    for span in found.spans:
        assert at <= span.start < span.end <= len(text)
        if span.kind != "term":
            assert text[span.start:span.end] == span.out
        at = span.end
    for form in (BRACKETS, TOKENS):
        assume(not re.search(form.pattern, text))
        masked = form.mask(found)
        assert form.unmask(masked, found) == rejoin(found.runs())
    if all(s.kind != "term" for s in found.spans):
        assert rejoin(found.runs()) == text
        assert found.missing(text) == []


def test_spans_are_frozen_values() -> None:
    span = Span(0, 1, "code", "x")
    with pytest.raises(AttributeError):
        span.out = "y"  # type: ignore[misc]


def test_an_end_tag_is_no_path() -> None:
    found = SpanFinder().find("So <b>bold</b> stays, and /etc/hosts is a path.")
    assert found is not None and [s.out for s in found.spans] == ["/etc/hosts"]


def test_has_words_tells_a_text_of_spans_alone() -> None:
    finder = SpanFinder()
    alone, prose = finder.find("`a()` -> src/b.py"), finder.find("Call `a()` now.")
    assert alone is not None and not alone.has_words()
    assert prose is not None and prose.has_words()
