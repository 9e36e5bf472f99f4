"""Protected spans: the parts of a prose segment that a translation keeps byte for byte.

Thinking is full of things no translation may touch: inline code, identifiers, paths,
URLs, e-mail addresses, versions, numbers with units, LaTeX and math, CLI flags, quoted
error messages. ``SpanFinder.find`` finds them in a segment's text once, with one table of
kinds (``KINDS``), an operator's extra patterns, and a glossary's ``keep`` terms (kept as
they are) and ``terms`` (each rendered as the glossary's target term). The answer,
``Protected``, is what every backend is given with the text and what the service checks
every translation against: a segment is ``translated`` only when each span's ``out`` (its
own text, or a term's target) appears in the translation as often as in the original.

Backends keep the spans their own way: ``local`` and ``pool`` mask them with placeholders
(``Placeholders``: ``mask``, ``unmask``) and, when the engine loses one, translate the prose
runs between the spans on their own and rejoin them (``Protected.runs``, ``rejoin``), which
keeps them by construction; DeepL wraps them in tags it ignores; the LLM is told which
items to keep.

Spans never overlap and never cross the text they were found in; finding them changes no
text.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "KINDS",
    "Glossary",
    "Placeholders",
    "Protected",
    "Span",
    "SpanFinder",
    "rejoin",
]

# Characters that end a sentence rather than a URL, a path or a name written before them.
_TAIL = ".,;:!?'\")]}>*_`。，、；：！？）」』】》"

# File extensions a bare file name ("config.yaml") may end in: without a slash, a dotted
# word is a file only with one of these (so "e.g.", "U.S." and "3.5" are not).
_EXTENSIONS = (
    "py pyi pyx ipynb js mjs cjs ts tsx jsx vue svelte json jsonl yaml yml toml ini cfg conf "
    "env lock md rst txt csv tsv xml html htm css scss sass less sql db sqlite rs go c h cc "
    "cpp hpp cxx java kt kts scala rb php pl lua r jl swift m mm cs fs dart ex exs erl hs ml "
    "sh bash zsh fish ps1 bat cmd mk cmake gradle proto graphql tf hcl nix log out pdf png "
    "jpg jpeg gif svg webp ico mp3 mp4 wav zip tar gz tgz bz2 xz zst 7z whl so dll dylib a "
    "o exe bin wasm pt pth ckpt safetensors onnx gguf npy npz pkl parquet arrow h5 model "
    "spm vocab"
).split()

# Units a number may carry ("10 ms", "5GB", "3.5 kg", "100%").
_UNITS = (
    "ns|µs|us|ms|s|sec|secs|min|mins|h|hr|hrs|Hz|kHz|MHz|GHz|B|KB|KiB|MB|MiB|GB|GiB|TB|TiB|"
    "PB|kb|Kb|Mb|Gb|bit|bits|bps|Kbps|Mbps|Gbps|px|pt|em|rem|dpi|fps|rpm|mm|cm|m|km|mg|g|kg|"
    "ml|mL|l|L|V|mV|kV|A|mA|W|kW|MW|kWh|Wh|J|kJ|K|°C|°F|°|x|X|%|‰|tok|tokens|ops|qps|rps|"
    "req/s|tok/s|ms/token|k|M|G|B|T"
)

# The table of kinds, in priority order: where two spans overlap, the one that starts
# first wins, then the longer, then the earlier kind here.
KINDS: dict[str, str] = {
    # ``code``, ```x```, `foo()`: every inline code span, backticks included.
    "code": r"(?<!`)(`+)(?!`)[^\n]+?(?<!`)\1(?!`)",
    # $x^2 + 1$, $$...$$, \( ... \), \[ ... \], and LaTeX commands with their arguments.
    "math": (
        r"\$\$[^$]+?\$\$"
        r"|(?<![\w$\\])\$(?=\S)[^$\n]{1,400}?(?<=\S)\$(?![\w$])"
        r"|\\\((?s:.{1,400}?)\\\)|\\\[(?s:.{1,400}?)\\\]"
        r"|\\[A-Za-z]+\*?(?:\[[^\[\]\n]{0,80}\])?(?:\{(?:[^{}\n]|\{[^{}\n]*\})*\})*"
    ),
    "url": r"\b(?:https?|ftp|file|ssh|git|wss?)://[^\s<>\"'`]+|\bwww\.[^\s<>\"'`]+",
    "email": r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    # A quoted error message: "ModuleNotFoundError: No module named 'x'", 'fatal: ...'.
    "error": (
        r"\"[^\"\n]{0,200}\b(?:\w*(?:Error|Exception|Warning)|[Ee]rror:|[Ff]atal:|"
        r"[Ww]arning:|Traceback)[^\"\n]{0,200}\"|"
        r"(?<!\w)'[^'\n]{0,200}\b(?:\w*(?:Error|Exception)|[Ee]rror:|[Ff]atal:|"
        r"Traceback)[^'\n]{0,200}'(?!\w)"
    ),
    # A path: with a slash (src/app.py, ./run.sh, ~/.config, /etc/hosts, C:\x\y), or a
    # bare file name with a known extension (config.yaml, Dockerfile is a word).
    "path": (
        r"(?<![\w/.~-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]*(?:\.\w+)?"
        r"|(?<!\w)[A-Za-z]:\\(?:[\w .-]+\\)*[\w.-]+"
        r"|(?<![\w/.-])\.?[\w-]*\w\.(?:" + "|".join(_EXTENSIONS) + r")(?![\w-])"
    ),
    # --dry-run, -v, --max-tokens=128 (a lone dash or a dash inside a word is not a flag).
    "flag": r"(?<![\w-])--?[A-Za-z][\w-]*(?:=[^\s,;)]+)?",
    # v1.2.3, 2.13.0, 3.11.7rc1, v2 (a plain decimal "3.5" is a number).
    "version": r"(?<![\w.])v\d+(?:\.\d+)*(?:[-.]?(?:a|b|rc|dev|post)\d*)?(?![\w])"
               r"|(?<![\w.])\d+\.\d+\.\d+(?:[-.]?(?:a|b|rc|dev|post)\d*)?(?![\w])",
    # O(n log n), a[i] == b[j], x^2, i += 1, f(x) -> y: expressions of code or math.
    "expr": (
        r"(?<!\w)[OΘΩo]\([^()\n]{1,40}\)"
        r"|[\w.]+(?:\[[^\[\]\n]{1,20}\]|\([^()\n]{0,20}\))*\s*"
        r"(?:==|!=|<=|>=|:=|\+=|-=|\*=|/=|->|=>|&&|\|\||<<|>>)\s*"
        r"[\w.'\"]+(?:\[[^\[\]\n]{1,20}\]|\([^()\n]{0,20}\))*"
        r"|\b\w+(?:\[[^\[\]\n]{1,20}\])+"
        r"|\b\w+\^\{?\w+\}?(?:\s*[+\-*/]\s*\w+)*"
    ),
    # snake_case, camelCase, PascalCase with an inner capital, dotted.names, calls().
    "identifier": (
        r"(?<![\w.])(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*(?:\([^()\n]{0,40}\))?(?![\w])"
        r"|\b[A-Za-z_]\w*\([^()\n]{0,40}\)"
        r"|\b_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*\b|\b__\w+__\b"
        r"|\b[a-z]+[A-Z][A-Za-z0-9]*\b|\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b"
    ),
    # A number of two or more digits, a decimal, or any number with a unit.
    "number": (
        r"(?<![\w.,])\d+(?:[.,]\d+)*\s?(?:" + _UNITS + r")(?![\w])"
        r"|(?<![\w.,])(?:\d{2,}|\d+[.,]\d+)(?:[.,]\d+)*(?![\w])"
    ),
}

# The identifier pattern matches an English "Hello.World" typo and dotted prose such as
# "e.g" no more than "path" does: dotted identifiers need a lowercase part or a call.
_DOTTED_PROSE = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]?")
# Words a bare call pattern would wrongly take ("see (below)") never reach here: a call
# needs no space before its parenthesis.


@dataclass(frozen=True, slots=True)
class Span:
    """One protected span: ``text[start:end]`` of its segment, its kind, and ``out``, what
    the translation must contain in its place (its own text; a glossary term's target)."""

    start: int
    end: int
    kind: str
    out: str


@dataclass(frozen=True, slots=True)
class Glossary:
    """Terms rendered as given (``terms``: source -> target) and terms kept as they are
    (``keep``), for a request, a stream, or every stream of a target (the glossary file)."""

    terms: tuple[tuple[str, str], ...] = ()
    keep: tuple[str, ...] = ()

    @classmethod
    def of(cls, terms: dict[str, str] | None = None,
           keep: Iterable[str] | None = None) -> Glossary:
        return cls(tuple(sorted((terms or {}).items())), tuple(sorted(set(keep or ()))))

    def __bool__(self) -> bool:
        return bool(self.terms or self.keep)

    def merged(self, over: Glossary | None) -> Glossary:
        """This glossary with ``over``'s entries added; ``over`` wins a shared source term."""
        if not over:
            return self
        terms = dict(self.terms)
        terms.update(over.terms)
        return Glossary.of(terms, (*self.keep, *over.keep))

    @property
    def digest(self) -> str:
        """A short, stable name of the content (the cache key and DeepL's glossary name)."""
        blob = repr((self.terms, self.keep)).encode("utf-8")
        return hashlib.blake2b(blob, digest_size=10).hexdigest()


@dataclass(frozen=True, slots=True)
class Protected:
    """A segment's protected spans, in order, and the glossary they came from (if any)."""

    text: str
    spans: tuple[Span, ...]
    glossary: Glossary | None = None
    _digest: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def digest(self) -> str:
        """What, besides the text, decides a translation of it: the spans and the glossary
        (for the cache key)."""
        if not self._digest:
            blob = repr(([(s.start, s.end, s.kind, s.out) for s in self.spans],
                         self.glossary.digest if self.glossary else None)).encode("utf-8")
            self._digest.append(hashlib.blake2b(blob, digest_size=10).hexdigest())
        return self._digest[0]

    def required(self) -> Counter[str]:
        """Each string a translation must contain, with how often."""
        return Counter(span.out for span in self.spans)

    def missing(self, translated: str) -> list[Span]:
        """The spans whose ``out`` the translation lacks (or has fewer times than the
        original has the span); empty: every span kept."""
        lost: list[Span] = []
        for out, count in self.required().items():
            found = translated.count(out)
            if found < count:
                lost.extend([s for s in self.spans if s.out == out][: count - found])
        return lost

    def kinds(self) -> list[str]:
        return sorted({span.kind for span in self.spans})

    def runs(self) -> list[str | Span]:
        """The text as prose runs (strings, possibly blank) and spans, alternating, in
        order: what a backend that cannot keep a placeholder translates piece by piece."""
        out: list[str | Span] = []
        at = 0
        for span in self.spans:
            out.append(self.text[at:span.start])
            out.append(span)
            at = span.end
        out.append(self.text[at:])
        return out


def rejoin(parts: Sequence[str | Span]) -> str:
    """``Protected.runs`` back into one text, each span replaced by its ``out``: the prose
    runs as given (translated or not)."""
    return "".join(part.out if isinstance(part, Span) else part for part in parts)


def needs_words(run: str) -> bool:
    """Whether a prose run holds anything to translate (a letter), not only spaces and
    punctuation between two spans."""
    return any(ch.isalpha() for ch in run)


@dataclass(frozen=True, slots=True)
class Placeholders:
    """A placeholder form: ``render(i)`` stands for span ``i`` in the masked text, and
    ``pattern`` (a regex with one group, the number) finds it again in the engine's
    output, tolerating the spaces an engine puts inside it."""

    template: str  # e.g. "[{i}]", with {i} the span's number
    pattern: str  # e.g. r"\[\s*(\d+)\s*\]"
    base: int = 0  # the first number (some forms survive better from 1)

    def render(self, i: int) -> str:
        return self.template.format(i=i + self.base)

    def mask(self, protected: Protected) -> str:
        """The text with each span replaced by its placeholder."""
        out, at = [], 0
        for i, span in enumerate(protected.spans):
            out.append(protected.text[at:span.start])
            out.append(self.render(i))
            at = span.end
        out.append(protected.text[at:])
        return "".join(out)

    def unmask(self, translated: str, protected: Protected) -> str | None:
        """The engine's output with each placeholder replaced by its span's ``out``; None
        when a placeholder is missing, repeated or unknown (the caller falls back)."""
        spans = protected.spans
        seen: set[int] = set()
        pieces, at = [], 0
        for match in re.finditer(self.pattern, translated):
            i = int(match.group(1)) - self.base
            if not 0 <= i < len(spans) or i in seen:
                return None
            seen.add(i)
            pieces.append(translated[at:match.start()])
            pieces.append(spans[i].out)
            at = match.end()
        if len(seen) != len(spans):
            return None
        pieces.append(translated[at:])
        return "".join(pieces)


class SpanFinder:
    """Finds a segment's protected spans: the kinds of ``KINDS`` (all, or those named),
    ``patterns`` an operator adds (kind ``pattern``), and a glossary's terms."""

    def __init__(self, patterns: Sequence[str] = (), kinds: Iterable[str] | None = None) -> None:
        chosen = list(KINDS) if kinds is None else list(kinds)
        unknown = [k for k in chosen if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown span kinds {unknown}; choose from {list(KINDS)}")
        self.kinds = chosen
        self._compiled: list[tuple[str, re.Pattern[str]]] = []
        for i, pattern in enumerate(patterns):
            try:
                self._compiled.append(("pattern", re.compile(pattern)))
            except re.error as exc:
                raise ValueError(f"extra span pattern {i} ({pattern!r}) is not a valid "
                                 f"regular expression: {exc}") from exc
        # ASCII word boundaries: Chinese and Japanese write "检查config.yaml" without a
        # space, and a Han character is a word character to Unicode regular expressions.
        self._compiled += [(kind, re.compile(KINDS[kind], re.ASCII)) for kind in chosen]
        self._terms: dict[Glossary, list[tuple[str, re.Pattern[str], str | None]]] = {}

    def find(self, text: str, glossary: Glossary | None = None) -> Protected | None:
        """The spans of ``text`` (a stripped prose segment); None when it has none."""
        found: list[tuple[int, int, int, str, str]] = []  # start, -end, rank, kind, out
        rank = 0
        for kind, pattern in self._glossary_patterns(glossary):
            for match in pattern.finditer(text):
                if match.end() > match.start():
                    found.append((match.start(), -match.end(), rank, "keep" if kind is None
                                  else "term", match.group() if kind is None else kind))
            rank += 1
        for kind, pattern in self._compiled:
            for match in pattern.finditer(text):
                start, end = match.start(), _trim(text, match.start(), match.end(), kind)
                if end > start and _plausible(kind, text[start:end]):
                    found.append((start, -end, rank, kind, text[start:end]))
            rank += 1
        if not found:
            return None
        found.sort()
        spans: list[Span] = []
        at = 0
        for start, neg_end, _, kind, out in found:
            if start >= at:
                spans.append(Span(start, -neg_end, kind, out))
                at = -neg_end
        return Protected(text, tuple(spans), glossary or None)

    def _glossary_patterns(
        self, glossary: Glossary | None,
    ) -> list[tuple[str | None, re.Pattern[str]]]:
        """A pattern per glossary term, longest first; the kind is the target term, or
        None for a kept term. Compiled once per glossary."""
        if not glossary:
            return []
        cached = self._terms.get(glossary)
        if cached is None:
            entries: list[tuple[str, str | None]] = list(glossary.terms)
            entries += [(term, None) for term in glossary.keep]
            entries.sort(key=lambda e: -len(e[0]))
            cached = [(src, _term_pattern(src), tgt) for src, tgt in entries]
            if len(self._terms) > 256:
                self._terms.clear()
            self._terms[glossary] = cached
        return [(tgt, pattern) for _, pattern, tgt in cached]


def _term_pattern(term: str) -> re.Pattern[str]:
    """A glossary term as written, any case, not inside a longer word."""
    left = r"(?<![A-Za-z0-9_])" if _ascii_word(term[:1]) else ""
    right = r"(?![A-Za-z0-9_])" if _ascii_word(term[-1:]) else ""
    return re.compile(left + re.escape(term) + right, re.IGNORECASE)


def _ascii_word(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "_")


def _trim(text: str, start: int, end: int, kind: str) -> int:
    """Where a span really ends: a URL or a path before the punctuation that ends the
    sentence, keeping a closing bracket that has its opening one inside."""
    if kind not in ("url", "path", "email", "identifier", "number", "version", "flag"):
        return end
    while end > start and text[end - 1] in _TAIL:
        ch = text[end - 1]
        pair = {")": "(", "]": "[", "}": "{"}.get(ch)
        if pair is not None and text.count(pair, start, end) >= text.count(ch, start, end):
            break
        end -= 1
    return end


def _plausible(kind: str, span: str) -> bool:
    """Drop matches that are prose after all."""
    if kind == "identifier":
        return not _DOTTED_PROSE.fullmatch(span)
    if kind == "path":
        return "/" in span or "\\" in span or "." in span
    if kind == "flag":
        return len(span) > 2 or span[1:].isalpha()
    return True
