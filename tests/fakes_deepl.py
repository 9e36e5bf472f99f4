"""A DeepL double that handles tags and glossaries as DeepL documents them, on 127.0.0.1.

``FakeDeepL`` answers "[<TARGET>] <text>": an echo, which keeps every span whatever a
backend does. ``MarkupDeepL`` changes what a translation would change, so only what a
backend protects survives: it upper-cases prose, and with ``tag_handling=xml`` it keeps the
content of ``ignore_tags`` elements as sent, escapes the rest again, and may move, drop or
repeat an element (``markup_mode``, or one-shot modes queued in ``markup_script``), as a
real translation reorders a sentence, or refuse the text as DeepL's strict XML parser does
(``reject``; always for a control character XML cannot hold). Its glossaries follow DeepL's v2 API
(``/v2/glossaries``, ``/v2/glossary-language-pairs``) and the validation of DeepL's own mock
server: pairs among the glossary languages below, ``glossary_id`` only with
``source_lang``, and the glossary's pair must be the request's. A glossary term in the prose
(any case) comes out as its target, as given (``unglossed``: translated as prose, as DeepL
does where the term's context or grammar argues against it).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes_remote import FakeDeepL, _record

# The languages DeepL's mock server takes glossaries for (any pair of two of them), as its
# config/languages/product-glossary.json lists them (tests/deepl-mock/).
GLOSSARY_LANGUAGES = (
    "AR", "BG", "CS", "DA", "DE", "EL", "EN", "ES", "ET", "FI", "FR", "HE", "HU", "ID", "IT",
    "JA", "KO", "LT", "LV", "NB", "NL", "PL", "PT", "RO", "RU", "SK", "SL", "SV", "TR", "UK",
    "VI", "ZH",
)
MARKUP_MODES = {"keep", "move", "drop", "twice", "unglossed", "reject"}
# What XML 1.0 allows in no form: DeepL's strict parser (tag handling v2) refuses it.
_NOT_XML = re.compile("[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f]")

_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*)((?:\s+[\w.-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*)\s*(/?)>")
_ENTITY = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": '"', "&apos;": "'"}


@dataclass
class StoredGlossary:
    glossary_id: str
    name: str
    source_lang: str
    target_lang: str
    entries: dict[str, str]
    created: float = field(default_factory=time.time)

    def info(self) -> dict[str, Any]:
        return {
            "glossary_id": self.glossary_id,
            "name": self.name,
            "ready": True,
            "source_lang": self.source_lang.lower(),
            "target_lang": self.target_lang.lower(),
            "creation_time": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(self.created)),
            "entry_count": len(self.entries),
        }


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def _unescape(text: str) -> str:
    return re.sub(r"&(?:lt|gt|amp|quot|apos);", lambda m: _ENTITY[m.group()], text)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class MarkupDeepL(FakeDeepL):
    """FakeDeepL with tag handling and glossaries; see the module's docstring.

    ``translations`` records, per translate request, its markup parameters (``tag_handling``,
    ``ignore_tags``, ``glossary_id``, ``source_lang``) and texts; ``created`` and ``deleted``
    the glossary ids in order; ``glossaries`` those that exist. ``create_failure``, when
    set, is the HTTP status the next glossary creations answer.
    """

    def __init__(self) -> None:
        self.markup_mode = "keep"
        self.markup_script: deque[str] = deque()
        self.translations: list[dict[str, Any]] = []
        self.glossaries: dict[str, StoredGlossary] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.create_failure: int | None = None
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.markup_mode = "keep"
        self.markup_script.clear()
        self.translations.clear()
        self.glossaries.clear()
        self.created.clear()
        self.deleted.clear()
        self.create_failure = None

    def _next_markup(self) -> str:
        return self.markup_script.popleft() if self.markup_script else self.markup_mode

    # -- translation ---------------------------------------------------------------------

    def _prose(self, text: str, glossary: StoredGlossary | None, unglossed: bool) -> str:
        """What the fake's translation does to prose: upper-case it, glossary terms as given."""
        if glossary is None or not glossary.entries or unglossed:
            return text.upper()
        terms = sorted(glossary.entries, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE)
        lower = {k.lower(): v for k, v in glossary.entries.items()}
        out, at = [], 0
        for match in pattern.finditer(text):
            out.append(text[at:match.start()].upper())
            out.append(lower[match.group().lower()])
            at = match.end()
        out.append(text[at:].upper())
        return "".join(out)

    def _xml(self, text: str, ignore: set[str], glossary: StoredGlossary | None,
             mode: str) -> str:
        """A text with tag_handling=xml: ignored elements kept as sent, the rest translated."""
        if mode == "reject" or _NOT_XML.search(text):
            raise _BadRequest("Tag handling parsing failed, please check input.")
        pieces: list[tuple[str, str]] = []  # ("text" | "kept" | "tag", raw)
        at = 0
        depth: list[str] = []
        kept_from: int | None = None
        for match in _TAG.finditer(text):
            closing, name, _, empty = match.groups()
            between = text[at:match.start()]
            if "<" in between or ">" in between:
                raise _BadRequest("Tag handling parsing failed, please check input.")
            if kept_from is None:
                pieces.append(("text", between))
            at = match.end()
            if empty:
                if kept_from is None:
                    pieces.append(("tag", match.group()))
                continue
            if not closing:
                depth.append(name)
                if name in ignore and kept_from is None:
                    kept_from = match.start()
                elif kept_from is None:
                    pieces.append(("tag", match.group()))
                continue
            if not depth or depth[-1] != name:
                raise _BadRequest("Tag handling parsing failed, please check input.")
            depth.pop()
            if kept_from is not None and name in ignore and name not in depth:
                pieces.append(("kept", text[kept_from:match.end()]))
                kept_from = None
            elif kept_from is None:
                pieces.append(("tag", match.group()))
        tail = text[at:]
        if depth or "<" in tail or ">" in tail:
            raise _BadRequest("Tag handling parsing failed, please check input.")
        pieces.append(("text", tail))

        kept = [i for i, (kind, _) in enumerate(pieces) if kind == "kept"]
        if kept and mode == "move":
            pieces.append(pieces.pop(kept[0]))
        elif kept and mode == "drop":
            pieces.pop(kept[0])
        elif kept and mode == "twice":
            pieces.insert(kept[0], pieces[kept[0]])
        return "".join(
            _escape(self._prose(_unescape(raw), glossary, mode == "unglossed"))
            if kind == "text" else raw
            for kind, raw in pieces
        )

    def _glossary_for(self, data: dict[str, Any], target: str) -> StoredGlossary | None:
        glossary_id = data.get("glossary_id")
        if glossary_id is None:
            return None
        source = data.get("source_lang")
        if not source:
            raise _BadRequest("Use of a glossary requires the source_lang parameter "
                              "to be specified")
        glossary = self.glossaries.get(str(glossary_id))
        if glossary is None:
            raise _BadRequest("Glossary not found")  # DeepL's mock answers a 400 here
        if glossary.source_lang != str(source).upper() or glossary.target_lang != target:
            raise _BadRequest("Glossary language pair does not match the request")
        return glossary

    async def _translate(self, request: Request) -> Response:
        rec = await _record(request, self.requests)
        data: dict[str, Any] = rec.json if rec.json is not None else {
            k: v if k in {"text", "ignore_tags"} else v[0] for k, v in rec.form.items()
        }
        texts = list(data.get("text") or [])
        self.received.append((data.get("context"), texts))
        self.translations.append({
            "tag_handling": data.get("tag_handling"),
            "ignore_tags": data.get("ignore_tags"),
            "non_splitting_tags": data.get("non_splitting_tags"),
            "glossary_id": data.get("glossary_id"),
            "source_lang": data.get("source_lang"),
            "texts": texts,
        })
        failed = await self._fail(self.next_mode())
        if failed is not None:
            return failed
        target = str(data["target_lang"]).upper()
        tag_handling = data.get("tag_handling")
        ignore = data.get("ignore_tags") or []
        if isinstance(ignore, str):
            ignore = ignore.split(",")
        try:
            if tag_handling not in (None, "xml", "html"):
                raise _BadRequest("Value for 'tag_handling' not supported.")
            glossary = self._glossary_for(data, target.split("-")[0])
            answers = []
            for text in texts:
                mode = self._next_markup()
                if tag_handling == "xml":
                    answers.append(self._xml(text, set(ignore), glossary, mode))
                else:
                    answers.append(self._prose(text, glossary, mode == "unglossed"))
        except _BadRequest as exc:
            return JSONResponse({"message": exc.message}, status_code=exc.status)
        source = data.get("source_lang")
        return JSONResponse({
            "translations": [
                {
                    "detected_source_language": source or "EN",
                    "text": f"[{target}] {answer}",
                    "billed_characters": len(text),
                    "model_type_used": data.get("model_type"),
                }
                for text, answer in zip(texts, answers, strict=True)
            ]
        })

    # -- glossaries (v2) -----------------------------------------------------------------

    async def _glossary_pairs(self, request: Request) -> Response:
        await _record(request, self.requests)
        return JSONResponse({"supported_languages": [
            {"source_lang": s.lower(), "target_lang": t.lower()}
            for s in GLOSSARY_LANGUAGES for t in GLOSSARY_LANGUAGES if s != t
        ]})

    async def _glossaries(self, request: Request) -> Response:
        rec = await _record(request, self.requests)
        if request.method == "GET":
            return JSONResponse({"glossaries": [g.info() for g in self.glossaries.values()]})
        data = rec.json or {}
        if self.create_failure is not None:
            return JSONResponse({"message": "fake failure"}, status_code=self.create_failure)
        source = str(data.get("source_lang", "")).upper()
        target = str(data.get("target_lang", "")).upper()
        if source not in GLOSSARY_LANGUAGES or target not in GLOSSARY_LANGUAGES:
            return JSONResponse({"message": "Value for 'target_lang' not supported."},
                                status_code=400)
        if source == target:
            return JSONResponse({"message": "Unsupported glossary source and target "
                                 "language pair"}, status_code=400)
        if not data.get("name"):
            return JSONResponse({"message": "Missing or invalid argument: name'"},
                                status_code=400)
        if data.get("entries_format") != "tsv":
            return JSONResponse({"message": "Unsupported entry format specified"},
                                status_code=400)
        entries: dict[str, str] = {}
        for line in str(data.get("entries", "")).split("\n"):
            line = line.strip()
            if not line:
                continue
            if "\t" not in line:
                return JSONResponse({"message": "Invalid glossary entries provided"},
                                    status_code=400)
            src, tgt = line.split("\t", 1)
            if src in entries:
                return JSONResponse({"message": "Invalid glossary entries provided"},
                                    status_code=400)
            entries[src] = tgt
        glossary = StoredGlossary(str(uuid.uuid1()), str(data["name"]), source, target, entries)
        self.glossaries[glossary.glossary_id] = glossary
        self.created.append(glossary.glossary_id)
        return JSONResponse(glossary.info(), status_code=201)

    async def _glossary(self, request: Request) -> Response:
        await _record(request, self.requests)
        glossary_id = request.path_params["glossary_id"]
        glossary = self.glossaries.get(glossary_id)
        if glossary is None:
            return Response(status_code=404)
        if request.method == "DELETE":
            del self.glossaries[glossary_id]
            self.deleted.append(glossary_id)
            return Response(status_code=204)
        return JSONResponse(glossary.info())

    async def _glossary_entries(self, request: Request) -> Response:
        await _record(request, self.requests)
        glossary = self.glossaries.get(request.path_params["glossary_id"])
        if glossary is None:
            return Response(status_code=404)
        return PlainTextResponse(
            "\n".join(f"{s}\t{t}" for s, t in glossary.entries.items()),
            media_type="text/tab-separated-values",
        )

    def _app(self) -> Starlette:
        app = super()._app()
        app.router.routes.extend([
            Route("/v2/glossary-language-pairs", self._glossary_pairs, methods=["GET"]),
            Route("/v2/glossaries", self._glossaries, methods=["GET", "POST"]),
            Route("/v2/glossaries/{glossary_id}", self._glossary, methods=["GET", "DELETE"]),
            Route("/v2/glossaries/{glossary_id}/entries", self._glossary_entries,
                  methods=["GET"]),
        ])
        return app
