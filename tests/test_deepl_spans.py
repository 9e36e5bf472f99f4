"""The DeepL backend keeps protected spans and renders glossaries, through the real client.

Against ``MarkupDeepL`` (``tests/fakes_deepl.py``), a DeepL double on 127.0.0.1 that
translates (upper-cases) all but the content of ignored tags, moves or loses elements when
told to, and serves DeepL's v2 glossary API. The glossary life cycle runs against DeepL's
own mock server too (``tests/deepl_mock.py``): its translation ignores the input (a fixed
phrase per target), so there only the spans' survival and its glossaries are checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import string
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("deepl", reason="needs the deepl extra: pip install 'thinktrans[deepl]'")

import deepl

from models.deepl import DeepLTranslator
from models.deepl_spans import escape, unescape, unwrap, wrap
from models.spans import Glossary, Protected, SpanFinder, rejoin
from tests.configs import deepl_config
from tests.deepl_mock import DeepLMock
from tests.fakes_deepl import MarkupDeepL
from tests.fakes_remote import FakeDeepL

Make = Callable[..., DeepLTranslator]
FINDER = SpanFinder()
GLOSSARY = Glossary.of({"proton beam": "Protonenstrahl", "sidecar": "Beiwagen"},
                       keep=["ThinkTrans"])
OTHER_GLOSSARY = Glossary.of({"sidecar": "Seitenwagen"})

# Real reasoning sentences with spans of every kind; the prose of the last two has & and <.
SENTENCES = [
    "First I call `parse_args()` and then read config.yaml from src/app/settings.py.",
    "The docs at https://example.com/a?b=1&c=<2> say to pass --dry-run first.",
    "So the bound is $a < b && c > 0$, and \\frac{a}{b} stays below O(n log n).",
    "Ich prüfe, ob a[i] == b[j] gilt, bevor ich v2.13.0 installiere.",
    "Tom & Jerry said x < y in `main.c`, but <b>bold</b> is no tag & neither is &amp;.",
    "Send it to ops@example.org & wait 250 ms; then <retry> if it fails.",
]


@pytest.fixture
def markup(markup_deepl: MarkupDeepL) -> MarkupDeepL:
    return markup_deepl


@pytest.fixture
def fake(markup: MarkupDeepL) -> MarkupDeepL:
    markup.reset()
    return markup


@pytest.fixture
async def make(fake: MarkupDeepL, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Make]:
    made: list[DeepLTranslator] = []

    def _make(server: FakeDeepL | None = None, **overrides: Any) -> DeepLTranslator:
        config = dataclasses.replace(
            deepl_config(deepl_api_key="k", deepl_server_url=(server or fake).origin),
            max_retries=0, request_timeout_s=5.0, **overrides)
        backend = DeepLTranslator(config)
        monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
        made.append(backend)
        return backend

    yield _make
    for backend in made:
        await backend.aclose()


def find(texts: list[str], glossary: Glossary | None = None) -> list[Protected | None]:
    return [FINDER.find(text, glossary) for text in texts]


def assert_kept(outputs: list[str], protected: list[Protected | None]) -> None:
    for out, spans in zip(outputs, protected, strict=True):
        if spans is not None:
            assert spans.missing(out) == [], out


def tagged(fake: MarkupDeepL) -> list[dict[str, Any]]:
    return [t for t in fake.translations if t["tag_handling"] == "xml"]


# -- wrapping, without a server --------------------------------------------------------------


def test_escape_round_trip() -> None:
    text = "a < b && c > d; &amp; stays as written; \"quoted\" 'too'"
    assert unescape(escape(text)) == text
    assert escape("<x>&") == "&lt;x&gt;&amp;"
    assert unescape("&#60;&#x3C;&quot;&apos; & bare") == "<<\"' & bare"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([*SENTENCES, "", " & ", "<", "proton beam", "Sidecar"]),
                min_size=1, max_size=4),
       st.text(alphabet=string.ascii_letters + " &<>;\"'", max_size=20))
def test_wrap_then_unwrap_is_the_text(parts: list[str], extra: str) -> None:
    text = (extra + " ".join(parts)).strip()
    protected = FINDER.find(text, GLOSSARY)
    if protected is None:
        return
    sent = wrap(protected, glossary_renders_terms=False)
    assert unwrap(sent, protected, glossary_renders_terms=False) == rejoin(protected.runs())
    kept = wrap(protected, glossary_renders_terms=True)
    assert unwrap(kept, protected, glossary_renders_terms=True) == text


def test_unwrap_refuses_a_lost_repeated_or_unknown_element() -> None:
    protected = FINDER.find("Open config.yaml and src/a.py now.")
    assert protected is not None and len(protected.spans) == 2
    sent = wrap(protected, glossary_renders_terms=False)
    assert sent == 'Open <x i="0">config.yaml</x> and <x i="1">src/a.py</x> now.'
    moved = 'Jetzt <x i="1">src/a.py</x> und <x i=\'0\' >anything</x> öffnen.'
    assert unwrap(moved, protected, glossary_renders_terms=False) == (
        "Jetzt src/a.py und config.yaml öffnen.")
    for bad in ('Open <x i="0">config.yaml</x> now.',
                'Open <x i="0">c</x> <x i="0">c</x> <x i="1">s</x>.',
                'Open <x i="0">c</x> <x i="1">s</x> <x i="7">?</x>.',
                'Open <x i="0">c</x> <x i="1">s</x> <x>.'):
        assert unwrap(bad, protected, glossary_renders_terms=False) is None


# -- spans -----------------------------------------------------------------------------------


async def test_spans_come_back_byte_for_byte(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    protected = find(SENTENCES, GLOSSARY)
    assert all(p is not None for p in protected)
    out = await backend.translate(SENTENCES, source="en", target="de", protected=protected)
    assert_kept(out, protected)
    # The prose was translated (upper-cased by the double), its & and < as they were.
    assert out[4] == ("[DE] TOM & JERRY SAID X < Y IN `main.c`, BUT <B>BOLD</B> IS NO TAG "
                      "& NEITHER IS &AMP;.")
    assert "THEN <RETRY> IF" in out[5]
    assert out[2] == ("[DE] SO THE BOUND IS $a < b && c > 0$, AND \\frac{a}{b} STAYS BELOW "
                      "O(n log n).")
    (request,) = tagged(fake)
    assert request["ignore_tags"] == ["x"] and request["non_splitting_tags"] == ["x"]
    assert request["texts"][4] == ('Tom &amp; Jerry said x &lt; y in <x i="0">`main.c`</x>, '
                                   "but &lt;b&gt;bold&lt;/b&gt; is no tag &amp; neither is "
                                   "&amp;amp;.")
    assert backend.info()["span_fallbacks"] == 0


async def test_texts_without_spans_are_sent_as_before(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    texts = ["Plain prose here.", SENTENCES[0], "More plain prose.", SENTENCES[1]]
    protected = find(texts)
    assert protected[0] is None and protected[2] is None
    out = await backend.translate(texts, source=None, target="fr", protected=protected)
    assert out[0] == "[FR] PLAIN PROSE HERE." and out[2] == "[FR] MORE PLAIN PROSE."
    assert_kept(out, protected)
    plain = [t for t in fake.translations if t["tag_handling"] is None]
    assert [t["texts"] for t in plain] == [["Plain prose here.", "More plain prose."]]
    assert len(tagged(fake)) == 1
    # No spans at all: exactly the request of before.
    fake.translations.clear()
    await backend.translate(["Only prose."], source=None, target="fr", protected=None)
    assert fake.translations[0]["tag_handling"] is None


async def test_moved_elements_are_fine(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    fake.markup_mode = "move"
    protected = find(SENTENCES[:4])
    out = await backend.translate(SENTENCES[:4], source="en", target="de", protected=protected)
    assert_kept(out, protected)
    assert out[0].endswith("`parse_args()`")  # the double moved the first element last
    assert backend.info()["span_fallbacks"] == 0


@pytest.mark.parametrize("mode", ["drop", "twice"])
async def test_a_lost_or_repeated_element_falls_back_to_pieces(
    fake: MarkupDeepL, make: Make, mode: str
) -> None:
    backend = make()
    fake.markup_script.extend([mode, "keep"])
    texts = [SENTENCES[0], SENTENCES[1]]
    protected = find(texts)
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    assert_kept(out, protected)
    assert out[1].startswith("[DE] THE DOCS AT https://")  # the second came back whole
    # The first, piece by piece: its prose runs as plain texts, the spans between them.
    assert out[0] == ("[DE] FIRST I CALL `parse_args()` [DE] AND THEN READ config.yaml "
                      "[DE] FROM src/app/settings.py.")
    pieces = fake.translations[-1]
    assert pieces["tag_handling"] is None
    assert pieces["texts"] == ["First I call", "and then read", "from"]
    assert backend.info()["span_fallbacks"] == 1


async def test_a_text_of_spans_alone_is_not_sent(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    texts = ["`make test` && `make lint`.", "Then run src/x.py now."]
    protected = find(texts)
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    assert out[0] == "`make test` && `make lint`."
    assert out[1] == "[DE] THEN RUN src/x.py NOW."
    assert [t["texts"] for t in fake.translations] == [['Then run <x i="0">src/x.py</x> now.']]


async def test_a_text_xml_cannot_hold_goes_in_pieces(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    texts = ["The log shows \x1b[31mfailed\x1b[0m in src/x.py today."]
    protected = find(texts)
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    assert_kept(out, protected)
    assert tagged(fake) == []  # never sent as XML
    assert out[0].startswith("[DE] THE LOG SHOWS \x1b[31MFAILED")
    assert out[0].endswith("src/x.py [DE] TODAY.")


async def test_markup_deepl_refuses_goes_again_in_pieces(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    fake.markup_script.append("reject")
    texts = ["Then run src/x.py now."]
    out = await backend.translate(texts, source="en", target="de", protected=find(texts))
    assert out == ["[DE] THEN RUN src/x.py [DE] NOW."]
    assert [t["tag_handling"] for t in fake.translations] == ["xml", None]
    assert backend.info()["span_fallbacks"] == 1


# -- glossaries ------------------------------------------------------------------------------


async def test_glossary_terms_rendered_as_given(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    texts = ["The proton beam hits the Sidecar of ThinkTrans at 3 GHz."]
    protected = find(texts, GLOSSARY)
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    assert out == ["[DE] THE Protonenstrahl HITS THE Beiwagen OF ThinkTrans AT 3 GHz."]
    (glossary_id,) = fake.created
    stored = fake.glossaries[glossary_id]
    assert (stored.source_lang, stored.target_lang) == ("EN", "DE")
    assert stored.entries == {"proton beam": "Protonenstrahl", "sidecar": "Beiwagen"}
    assert stored.name == f"thinktrans-{Glossary(terms=GLOSSARY.terms).digest}"
    (request,) = tagged(fake)
    assert request["glossary_id"] == glossary_id and request["source_lang"] == "EN"
    # The terms went as prose for the glossary; the kept term and the number in elements.
    assert request["texts"] == ['The proton beam hits the Sidecar of <x i="2">ThinkTrans</x> '
                                'at <x i="3">3 GHz</x>.']


@dataclass
class Server:
    """The glossary API a test runs on: the double, or DeepL's mock (``double`` None), as
    the account ``key`` sees it."""

    double: MarkupDeepL | None
    url: str
    key: str

    def lister(self) -> deepl.DeepLClient:
        return deepl.DeepLClient(self.key, server_url=self.url)

    def ours(self) -> list[str]:
        """The ids of the glossaries the backend made, oldest first."""
        lister = self.lister()
        try:
            found = sorted(lister.list_glossaries(), key=lambda g: g.creation_time)
            return [g.glossary_id for g in found if g.name.startswith("thinktrans-")]
        finally:
            lister.close()

    def lose(self, glossary_id: str) -> None:
        """Delete a glossary behind the backend's back."""
        if self.double is not None:
            del self.double.glossaries[glossary_id]
            return
        lister = self.lister()
        lister.delete_glossary(glossary_id)
        lister.close()

    def check(self, out: list[str], expected: list[str], protected: list[Protected | None]
              ) -> None:
        """The double's translation is ``expected``; the mock's keeps the spans and terms."""
        assert_kept(out, protected)
        if self.double is not None:
            assert out == expected


@pytest.fixture(params=["double", "mock"])
def server(request: pytest.FixtureRequest) -> Server:
    if request.param == "double":
        double: MarkupDeepL = request.getfixturevalue("fake")
        return Server(double, double.origin, "k")
    mock: DeepLMock = request.getfixturevalue("deepl_mock")
    return Server(None, mock.url, mock.new_key())


@pytest.fixture
async def make_on(server: Server, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Make]:
    made: list[DeepLTranslator] = []

    def _make(**overrides: Any) -> DeepLTranslator:
        config = dataclasses.replace(
            deepl_config(deepl_api_key=server.key, deepl_server_url=server.url),
            max_retries=0, request_timeout_s=10.0, **overrides)
        backend = DeepLTranslator(config)
        monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
        made.append(backend)
        return backend

    yield _make
    for backend in made:
        await backend.aclose()


async def until(check: Callable[[], bool]) -> None:
    """Wait (a generous bound stops a hang) for a background deletion to land."""
    async with asyncio.timeout(60):
        while not check():
            await asyncio.sleep(0.02)


async def test_every_sentence_keeps_its_spans_and_terms(server: Server, make_on: Make) -> None:
    """The mock's fixed phrase loses every element: each text goes again in pieces, and
    keeps its spans and glossary terms all the same."""
    backend = make_on()
    protected = find(SENTENCES, GLOSSARY)
    out = await backend.translate(SENTENCES, source="en", target="de", protected=protected)
    assert_kept(out, protected)
    fallbacks = backend.info()["span_fallbacks"]
    assert fallbacks == (0 if server.double is not None else len(SENTENCES)), fallbacks


async def test_a_glossary_is_created_once_and_reused(server: Server, make_on: Make) -> None:
    backend = make_on()
    first = ["A proton beam, said `f()`.", "The sidecar and the proton beam."]
    second = ["Another sidecar near src/x.py."]
    await asyncio.gather(  # two batches at once: one creation, awaited by both
        backend.translate(first, source="en", target="de", protected=find(first, GLOSSARY)),
        backend.translate(first, source="en", target="de", protected=find(first, GLOSSARY)),
    )
    protected = find(second, GLOSSARY)
    out = await backend.translate(second, source="en", target="de", protected=protected)
    server.check(out, ["[DE] ANOTHER Beiwagen NEAR src/x.py."], protected)
    (glossary_id,) = server.ours()
    if server.double is not None:
        fake = server.double
        assert [t["glossary_id"] for t in tagged(fake)] == [glossary_id] * 3
        posts = [r for r in fake.requests if r.path == "/v2/glossaries" and r.method == "POST"]
        assert len(posts) == 1 and fake.deleted == []
    # Another pair of the same terms is another glossary.
    await backend.translate(second, source="en", target="fr", protected=find(second, GLOSSARY))
    assert len(server.ours()) == 2
    assert backend.info()["glossaries"] == {"kept": 2, "created": 2, "deleted": 0}
    await backend.aclose()
    assert server.ours() == []  # deleted at close


async def test_evicted_glossaries_are_deleted_and_all_at_close(
    server: Server, make_on: Make
) -> None:
    backend = make_on(max_glossaries=1)
    text = ["The sidecar is ready."]
    await backend.translate(text, source="en", target="de", protected=find(text, GLOSSARY))
    (first,) = server.ours()
    protected = find(text, OTHER_GLOSSARY)
    out = await backend.translate(text, source="en", target="de", protected=protected)
    server.check(out, ["[DE] THE Seitenwagen IS READY."], protected)
    await until(lambda: first not in server.ours())
    (second,) = server.ours()
    if server.double is not None:
        assert server.double.deleted == [first]
    await backend.aclose()
    assert server.ours() == []
    if server.double is not None:
        assert server.double.deleted == [first, second]


async def test_a_glossary_evicted_while_in_use_is_deleted_after(
    fake: MarkupDeepL, make: Make
) -> None:
    backend = make(max_glossaries=1)
    texts = ["The sidecar is ready.", "The sidecar is late."]
    protected = [FINDER.find(texts[0], GLOSSARY), FINDER.find(texts[1], OTHER_GLOSSARY)]
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    assert out == ["[DE] THE Beiwagen IS READY.", "[DE] THE Seitenwagen IS LATE."]
    assert len(fake.created) == 2
    assert {t["glossary_id"] for t in tagged(fake)} == set(fake.created)
    for _ in range(50):
        if fake.deleted:
            break
        await asyncio.sleep(0.02)
    assert len(fake.deleted) == 1 and len(fake.glossaries) == 1


async def test_a_glossary_deepl_lost_is_forgotten_and_made_again(
    server: Server, make_on: Make
) -> None:
    """A glossary deleted behind the backend's back: DeepL refuses its id (the mock: 400),
    the batch goes again with the terms put in, and the next batch makes a new glossary."""
    backend = make_on()
    texts = ["The sidecar is ready."]
    await backend.translate(texts, source="en", target="de", protected=find(texts, GLOSSARY))
    (lost,) = server.ours()
    server.lose(lost)
    protected = find(texts, GLOSSARY)
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    server.check(out, ["[DE] THE Beiwagen IS READY."], protected)
    if server.double is not None:
        assert [t["glossary_id"] for t in tagged(server.double)] == [lost, lost, None]
    assert server.ours() == []
    await backend.translate(texts, source="en", target="de", protected=find(texts, GLOSSARY))
    (made,) = server.ours()
    assert made != lost
    if server.double is not None:
        assert tagged(server.double)[-1]["glossary_id"] == made
    await backend.aclose()
    assert server.ours() == []
    if server.double is not None:
        assert server.double.deleted == [made]  # the lost one is not deleted again


async def test_unknown_source_substitutes_the_terms(fake: MarkupDeepL, make: Make) -> None:
    backend = make()
    texts = ["The proton beam and the sidecar."]
    protected = find(texts, GLOSSARY)
    out = await backend.translate(texts, source=None, target="de", protected=protected)
    assert out == ["[DE] THE Protonenstrahl AND THE Beiwagen."]
    assert fake.created == []
    (request,) = tagged(fake)
    assert request["glossary_id"] is None
    assert request["texts"] == ['The <x i="0">Protonenstrahl</x> and the '
                                '<x i="1">Beiwagen</x>.']


async def test_an_unsupported_pair_substitutes_and_is_not_asked_again(
    server: Server, make_on: Make
) -> None:
    """Swahili, a target DeepL lists (so the backend takes it once started) and no glossary
    language: the terms are put in the text, and no glossary is asked for again."""
    backend = make_on()
    await backend.start()
    await backend.wait_ready()
    assert backend.supports("en", "sw")
    texts = ["The sidecar again."]
    for _ in range(2):
        protected = find(texts, GLOSSARY)
        out = await backend.translate(texts, source="en", target="sw", protected=protected)
        server.check(out, ["[SW] THE Beiwagen AGAIN."], protected)
    assert server.ours() == []
    if server.double is not None:
        posts = [r for r in server.double.requests
                 if r.path == "/v2/glossaries" and r.method == "POST"]
        assert len(posts) == 1 and server.double.created == []


async def test_a_failed_creation_is_tried_again_by_the_next_batch(
    fake: MarkupDeepL, make: Make
) -> None:
    backend = make()
    texts = ["The sidecar again."]
    fake.create_failure = 500
    out = await backend.translate(texts, source="en", target="de",
                                  protected=find(texts, GLOSSARY))
    assert out == ["[DE] THE Beiwagen AGAIN."] and fake.created == []
    fake.create_failure = None
    await backend.translate(texts, source="en", target="de", protected=find(texts, GLOSSARY))
    assert len(fake.created) == 1
    assert tagged(fake)[-1]["glossary_id"] == fake.created[0]


async def test_a_term_the_glossary_did_not_render_is_substituted(
    fake: MarkupDeepL, make: Make
) -> None:
    backend = make()
    fake.markup_script.append("unglossed")
    texts = ["The proton beam is on."]
    out = await backend.translate(texts, source="en", target="de",
                                  protected=find(texts, GLOSSARY))
    assert out == ["[DE] THE Protonenstrahl IS ON."]
    first, again = tagged(fake)
    assert first["glossary_id"] == fake.created[0] and again["glossary_id"] is None
    assert again["texts"] == ['The <x i="0">Protonenstrahl</x> is on.']


async def test_no_glossaries_when_turned_off(fake: MarkupDeepL, make: Make) -> None:
    backend = make(max_glossaries=0)
    texts = ["The sidecar is here."]
    out = await backend.translate(texts, source="en", target="de",
                                  protected=find(texts, GLOSSARY))
    assert out == ["[DE] THE Beiwagen IS HERE."]
    assert not [r for r in fake.requests if r.path.startswith("/v2/glossar")]
    assert backend.info()["glossaries"] is None


# -- the echo double the other tests use -----------------------------------------------------


async def test_the_echo_double_keeps_spans_and_substitutes(
    deepl_server: FakeDeepL, make: Make
) -> None:
    """FakeDeepL echoes the XML and has no glossary API (404): spans kept, terms put in."""
    deepl_server.reset()
    backend = make(deepl_server)
    texts = [SENTENCES[4], "The proton beam, `x`."]
    protected = find(texts, GLOSSARY)
    out = await backend.translate(texts, source="en", target="de", protected=protected)
    assert out[0] == f"[DE] {SENTENCES[4]}"
    assert out[1] == "[DE] The Protonenstrahl, `x`."
