"""models/local/slot.py's batch path alone, on a fake engine and a fake word tokenizer:
splitting, the length sort and slices, each segment's own output bound, decoding, order, and
the one place engine errors become the backend's. Loading a slot from a real checkpoint is
covered in tests/test_local.py."""

from __future__ import annotations

import math
from typing import Any

import pytest

from models.errors import BackendError, BackendUnavailable
from models.local import slot as slot_module
from models.local.engines import Loaded
from models.local.slot import Route, Slot, Stats, translate_batch

EOS = 0
FILLER = 1  # what the fake engine generates past the input when told to run on


class WordTokenizer:
    """One id per distinct word; ``>>xx<<`` prefixes are words too."""

    def __init__(self) -> None:
        self.words = ["</s>", "la"]
        self.src_lang: str | None = None

    def _ids(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if word not in self.words:
                self.words.append(word)
            ids.append(self.words.index(word))
        return ids

    def __call__(self, text: str | list[str], **kwargs: Any) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self._ids(text)}
        return {"input_ids": [self._ids(one) for one in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(self.words[i] for i in ids)


class EchoEngine:
    """Generates each row back (then EOS), or runs on with FILLER to ``max_new`` tokens;
    records each call."""

    name = "fake"
    device = "cpu"
    compute_type = "float32"
    threads = 1

    def __init__(self, run_on: bool = False, error: Exception | None = None) -> None:
        self.run_on = run_on
        self.error = error
        self.calls: list[tuple[list[list[int]], int | None, int]] = []

    def generate(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                 forced: int | None, max_new: int) -> list[list[int]]:
        if self.error is not None:
            raise self.error
        self.calls.append((rows, forced, max_new))
        if self.run_on:
            return [row + [FILLER] * max_new for row in rows]
        return [[*row, EOS] for row in rows]


def route(tokenizer: WordTokenizer, *, prefix: str = "", no_space: bool = False,
          drop: frozenset[int] = frozenset()) -> Route:
    slot = Slot("fake", "nllb", tokenizer, Loaded(None, frozenset({EOS})), {"de": "deu_Latn"},
                drop_ids=drop)
    return Route(slot, "eng_Latn", 7, prefix, no_space)


def test_texts_come_back_in_order_with_their_whitespace() -> None:
    tokenizer, engine, stats = WordTokenizer(), EchoEngine(), Stats()
    texts = ["  a b\n", "", "c d e f g h", " \n", "i"]
    out = translate_batch(engine, route(tokenizer), texts, 256, stats)
    assert out == texts
    assert tokenizer.src_lang == "eng_Latn"  # the route's source code, set for the batch
    [(rows, forced, _)] = engine.calls
    assert forced == 7
    # Blank texts skip the model; the rest go longest first.
    assert [len(row) for row in rows] == [6, 2, 1]
    assert (stats.batches, stats.segments, stats.generate_calls) == (1, 5, 1)
    assert route(tokenizer).slot.batches == 0  # counted on the slot that ran it
    assert translate_batch(engine, route(tokenizer), ["", " "], 256, stats) == ["", " "]
    assert len(engine.calls) == 1


def test_a_big_batch_is_cut_into_slices_of_padded_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slot_module, "MAX_BATCH_TOKENS", 24)
    tokenizer, engine, stats = WordTokenizer(), EchoEngine(), Stats()
    texts = [" ".join(f"w{i}" for i in range(n)) for n in (2, 8, 4, 8, 2, 4)]
    assert translate_batch(engine, route(tokenizer), texts, 256, stats) == texts
    # Slices of (longest + 4) x size <= 24 tokens: 2 of 8 (12 each), 3 of 4 (8), then 1.
    assert stats.last_generate_sizes == [2, 3, 1]
    assert [[len(row) for row in rows] for rows, _, _ in engine.calls] == [[8, 8], [4, 4, 2], [2]]


def test_each_segment_is_cut_to_its_own_bound() -> None:
    tokenizer, engine, stats = WordTokenizer(), EchoEngine(run_on=True), Stats()
    texts = ["a", "a b c d e f g h i j"]
    out = translate_batch(engine, route(tokenizer), texts, 256, stats)
    [(rows, _, max_new)] = engine.calls
    caps = {len(row): math.ceil(1.5 * len(row)) + 10 for row in rows}
    assert max_new == max(caps.values())  # the engine's bound: the longest segment's
    assert [len(text.split()) for text in out] == [caps[1], caps[10]]
    assert stats.output_tokens == caps[1] + caps[10]


def test_decoding_stops_at_eos_and_drops_language_tokens() -> None:
    tokenizer, engine = WordTokenizer(), EchoEngine()
    tokenizer("keep drop keep")
    dropped = tokenizer.words.index("drop")
    assert translate_batch(engine, route(tokenizer, drop=frozenset({dropped})),
                           ["keep drop keep"], 256, Stats()) == ["keep keep"]


def test_the_prefix_reaches_the_model_and_long_texts_are_split() -> None:
    tokenizer, engine, stats = WordTokenizer(), EchoEngine(), Stats()
    text = "a b c. d e f. g h"  # 4 tokens at most, the prefix counted
    out = translate_batch(engine, route(tokenizer, prefix=">>de<< "), [text], 4, stats)
    assert stats.split_segments == 1 and stats.last_generate_sizes == [3]
    [(rows, _, _)] = engine.calls
    prefix = tokenizer.words.index(">>de<<")
    assert all(row[0] == prefix for row in rows)
    # The echoed prefix comes back too (the fake does not drop it); the parts are rejoined.
    assert out == [">>de<< a b c. >>de<< d e f. >>de<< g h"]


def test_no_space_targets_rejoin_parts_without_spaces() -> None:
    tokenizer, engine = WordTokenizer(), EchoEngine()
    out = translate_batch(engine, route(tokenizer, no_space=True), ["a b. c d.\ne f."], 2,
                          Stats())
    assert out == ["a b.c d.\ne f."]


class OutOfMemoryError(RuntimeError):
    """Named as torch's is: the name is what the backend tells it by."""


@pytest.mark.parametrize(
    ("error", "kind", "needle"),
    [
        (RuntimeError("shape mismatch\nat layer 3"), BackendError,
         "the local model failed on a batch of 2: shape mismatch"),
        (OutOfMemoryError("CUDA out of memory"), BackendUnavailable,
         "out of memory on cpu for a batch of 2: lower THINKTRANS_MAX_BATCH_SIZE"),
        (BackendUnavailable("gone"), BackendUnavailable, "gone"),
    ],
)
def test_engine_errors_become_the_backends(error: Exception, kind: type[Exception],
                                           needle: str) -> None:
    with pytest.raises(kind) as caught:
        translate_batch(EchoEngine(error=error), route(WordTokenizer()), ["a", "b"], 256,
                        Stats())
    assert str(caught.value).startswith(needle) and "layer 3" not in str(caught.value)
    assert type(caught.value) is kind
