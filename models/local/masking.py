"""Protected spans through a seq2seq engine: placeholders, and the prose runs when one is lost.

A text with protected spans goes to the engine masked, each span replaced by its family's
placeholder (``FORMS``) and restored after. When a placeholder comes back lost, repeated or
unknown, the text's prose runs between its spans are translated on their own and rejoined
with the spans, which keeps every span by construction. Engines cannot be trusted to copy
a placeholder (random weights lose them all), so the fallback is what the guarantee rests on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from models.local.pieces import Keep
from models.spans import Placeholders, Protected, Span, needs_words, rejoin

__all__ = ["FALLBACK", "FORMS", "MASKED", "STRATEGIES", "SpanBatch", "form_for"]

# How a text's spans were kept: its placeholders came back, or its runs were translated.
MASKED = "masked"
FALLBACK = "fallback"
# ``mask``: placeholders, the runs when one is lost; ``runs``: the runs for every text.
STRATEGIES = ("mask", "runs")

# The form that survives each family best, from what is reported of it (docs/local-backend.md
# has the table): NLLB copies numbers in context (fairseq #4854) and square brackets are
# every script's punctuation, while tags and digit strings are dropped or mangled
# (CTranslate2 #1798, eole #189), ``<mask>``-like tokens are special and rare brackets
# ``<unk>`` (no byte fallback); M2M-100 shares that tokenizer design, and ``__0__`` would
# read like its language tokens. OPUS-MT learned brace placeholders from OPUS's software
# localisation corpora, and the Moses normaliser leaves braces alone (OPUS-CAT #83).
# The patterns read any script's digits and full-width brackets, as a target may write them.
_BRACKETS = r"[\[［【]\s*(\d+)\s*[\]］】]"
_BRACES = r"[{｛]\s*(\d+)\s*[}｝]"
FORMS: dict[str, Placeholders] = {
    "nllb": Placeholders("[{i}]", _BRACKETS, base=1),
    "m2m100": Placeholders("[{i}]", _BRACKETS, base=1),
    "marian": Placeholders("{{{i}}}", _BRACES, base=0),
}


def form_for(family: str) -> Placeholders:
    """The placeholder form that survives ``family``'s models best (see the table above)."""
    return FORMS.get(family, FORMS["nllb"])


@dataclass
class _Runs:
    """A text that goes as its prose runs: the runs and spans, and where each run that is
    translated sits in its engine call's list."""

    parts: list[str | Span]
    sent: dict[int, int] = field(default_factory=dict)  # part index -> index in the call


class SpanBatch:
    """One batch's texts with their spans, through the engine in at most two calls.

    ``first`` (with ``first_keep``, the stretches the splitter must not cut) goes to the
    engine first; ``settle`` takes its outputs and answers what goes second (the runs of the
    texts whose placeholders were lost; often nothing); ``finish`` takes those outputs and
    answers the batch's translations. ``outcomes`` says, per text, how its spans were kept
    (``MASKED``, ``FALLBACK``, or None: it had none).
    """

    def __init__(self, texts: Sequence[str], protected: Sequence[Protected | None],
                 form: Placeholders | None) -> None:
        self.form = form  # None: the runs for every text
        self.outcomes: list[str | None] = [None] * len(texts)
        self.first: list[str] = []
        self.first_keep: list[Keep] = []
        self._plain: dict[int, int] = {}  # text index -> index in the first call
        self._masked: dict[int, tuple[int, Protected]] = {}
        self._runs_first: dict[int, _Runs] = {}
        self._runs_second: dict[int, _Runs] = {}
        self._first_out: list[str] = []
        self._results: list[str | None] = [None] * len(texts)
        for i, text in enumerate(texts):
            spans = protected[i] if i < len(protected) else None
            if spans is None or not spans.spans or spans.text != text:
                # No spans, or not this text's (the service never sends such): as it is.
                self._plain[i] = self._send_first(text)
            elif form is not None and self._maskable(spans, form):
                self._masked[i] = (self._send_first(form.mask(spans), _stretches(spans, form)),
                                   spans)
            else:
                self._runs_first[i] = self._runs(spans, self._send_first)
                self.outcomes[i] = FALLBACK

    def plain_in_first(self, values: Sequence[str | None]) -> list[str | None]:
        """``values`` (one per text) as the first call's list takes them: a text without
        spans, sent as it is, keeps its own; a masked text, or one sent as its runs, None."""
        out: list[str | None] = [None] * len(self.first)
        for i, k in self._plain.items():
            out[k] = values[i] if i < len(values) else None
        return out

    def _send_first(self, text: str, keep: Keep = ()) -> int:
        self.first.append(text)
        self.first_keep.append(keep)
        return len(self.first) - 1

    @staticmethod
    def _maskable(protected: Protected, form: Placeholders) -> bool:
        """Whether masking can tell its placeholders apart: no prose run already holds
        something the form's pattern reads, and some run holds words to translate."""
        runs = [part for part in protected.runs() if isinstance(part, str)]
        return (not any(re.search(form.pattern, run) for run in runs)
                and protected.has_words())

    @staticmethod
    def _runs(protected: Protected, send: Callable[[str], int]) -> _Runs:
        """The text as runs and spans; each run with a letter in it sent with ``send``."""
        runs = _Runs(protected.runs())
        for k, part in enumerate(runs.parts):
            if isinstance(part, str) and needs_words(part):
                runs.sent[k] = send(part)
        return runs

    def settle(self, first_out: Sequence[str]) -> list[str]:
        """The first call's outputs in; the texts the second call takes out (the runs of the
        texts whose placeholders came back lost, repeated or unknown)."""
        self._first_out = list(first_out)
        second: list[str] = []

        def send(text: str) -> int:
            second.append(text)
            return len(second) - 1

        assert self.form is not None or not self._masked
        for i, (k, protected) in self._masked.items():
            restored = self.form.unmask(first_out[k], protected) if self.form else None
            if restored is not None and not protected.missing(restored):
                self._results[i] = restored
                self.outcomes[i] = MASKED
            else:
                self._runs_second[i] = self._runs(protected, send)
                self.outcomes[i] = FALLBACK
        return second

    def finish(self, second_out: Sequence[str]) -> list[str]:
        """The second call's outputs in (empty when it took nothing); the translations out."""
        for i, k in self._plain.items():
            self._results[i] = self._first_out[k]
        for runs_of, outputs in ((self._runs_first, self._first_out),
                                 (self._runs_second, list(second_out))):
            for i, runs in runs_of.items():
                parts = list(runs.parts)
                for part_index, k in runs.sent.items():
                    parts[part_index] = outputs[k]
                self._results[i] = rejoin(parts)
        results = [text for text in self._results if text is not None]
        assert len(results) == len(self._results), "every text of the batch answered"
        return results

    def count(self, outcome: str) -> int:
        return sum(kept == outcome for kept in self.outcomes)


def _stretches(protected: Protected, form: Placeholders) -> list[tuple[int, int]]:
    """Where each placeholder sits in ``form.mask(protected)``: no cut may fall inside."""
    out, shift = [], 0
    for i, span in enumerate(protected.spans):
        start = span.start + shift
        length = len(form.render(i))
        out.append((start, start + length))
        shift += length - (span.end - span.start)
    return out

