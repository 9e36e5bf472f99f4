"""Glossaries: a request's or stream's own, checked against the limits, and the file's.

A glossary's terms become protected spans, checked in every answer, so a bad entry is
refused up front with words that name it. The file (``THINKTRANS_GLOSSARY_FILE``, its
shape in docs/API.md) is read once, at start.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from models.spans import Glossary
from service.exceptions import ConfigError, InputError, InvalidLocale
from service.settings import Settings, YamlProblem, parse_yaml
from service.text.limits import check_encodable
from service.text.tags import base_language, canonicalize


class GlossaryProblem(ValueError):
    """What is wrong with a glossary, in words that say what to fix."""


def build(terms: Mapping[str, Any] | None, keep: Any, *, max_terms: int, max_chars: int,
          where: str = "glossary") -> Glossary:
    """A glossary from its two parts, checked: strings, not blank, one line, within the
    limits; a ``GlossaryProblem`` naming the entry otherwise."""
    terms = terms or {}
    keep = keep or []
    if not isinstance(terms, Mapping):
        raise GlossaryProblem(f"{where}.terms must be an object of source term -> target term")
    if not isinstance(keep, list):
        raise GlossaryProblem(f"{where}.keep must be a list of terms")
    count = len(terms) + len(keep)
    if count > max_terms:
        raise GlossaryProblem(f"{where} has {count} entries; at most "
                              f"THINKTRANS_MAX_GLOSSARY_TERMS={max_terms}")
    for source, target in terms.items():
        _check_term(source, f"{where}.terms key {_short(source)}", max_chars)
        _check_term(target, f"{where}.terms[{_short(source)}]", max_chars)
    for i, term in enumerate(keep):
        _check_term(term, f"{where}.keep[{i}]", max_chars)
    return Glossary.of(dict(terms), keep)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_term(term: object, where: str, max_chars: int) -> None:
    if not isinstance(term, str):
        raise GlossaryProblem(f"{where} must be a string")
    if not term.strip():
        raise GlossaryProblem(f"{where} is blank; give a term")
    if term != term.strip() or "\n" in term or "\r" in term:
        raise GlossaryProblem(f"{where} has leading or trailing spaces or a line break; "
                              "give the term alone, on one line")
    if len(term) > max_chars:
        raise GlossaryProblem(f"{where} has {len(term)} characters; at most "
                              f"THINKTRANS_MAX_GLOSSARY_TERM_CHARS={max_chars}")


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def read_text(path: Path, max_bytes: int, where: str) -> str:
    """A regular file's text, at most ``max_bytes`` of UTF-8, or ConfigError in one line
    naming ``where``. Anything else (a FIFO, ``/dev/zero``, a directory) is refused without
    being read: one would block the start, another never end."""
    try:
        found = os.stat(path)
        _check_regular(found.st_mode, where)
        _check_size(found.st_size, max_bytes, where)
        # Not blocking: a FIFO put there since the stat would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            _check_regular(os.fstat(file.fileno()).st_mode, where)
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror or exc}") from None
    _check_size(len(data), max_bytes, where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{where} is not UTF-8 (byte {data[exc.start]:#04x} on line {line}); "
                          "save it as UTF-8") from None


def _check_regular(mode: int, where: str) -> None:
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _NOT_REGULAR if test(mode)), "no regular file")
        raise ConfigError(f"{where} is {what}, not a regular file; name a YAML file")


def _check_size(size: int, max_bytes: int, where: str) -> None:
    if size > max_bytes:
        raise ConfigError(f"{where} holds more than {max_bytes} bytes; split it, or raise "
                          f"THINKTRANS_MAX_GLOSSARY_FILE_BYTES")


class GlossaryBook:
    """The glossary file's glossaries by target key (``*``, a language, a tag), and the
    glossary a stream runs with: the file's for its target, then its own.

    A tag's entries win over its language's, which win over ``*``'s, and a request's win a
    source term both name; the merged glossary too stays within ``max_glossary_terms``."""

    def __init__(self, settings: Settings) -> None:
        self.max_terms = settings.max_glossary_terms
        self.max_chars = settings.max_glossary_term_chars
        self.max_file_bytes = settings.max_glossary_file_bytes
        self.by_key: dict[str, Glossary] = {}
        if settings.glossary_file:
            self.by_key = self._load(Path(settings.glossary_file))
        self._for_target: dict[str | None, Glossary] = {}

    def _load(self, path: Path) -> dict[str, Glossary]:
        where = f"THINKTRANS_GLOSSARY_FILE ({path})"
        text = read_text(path, self.max_file_bytes, where)
        try:
            data = parse_yaml(text, str(path))
        except YamlProblem as exc:
            raise ConfigError(f"{where} {exc}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must map targets ('*', 'zh', 'zh-TW') to glossaries")
        spelled: dict[str, str] = {}
        out: dict[str, Glossary] = {}
        for key, entry in data.items():
            name = str(key)
            if name != "*":
                try:
                    name = canonicalize(name)
                except InvalidLocale as exc:
                    raise ConfigError(f"{where}: {name!r} is not a target: {exc.detail}") from None
            if name in spelled:  # "zh-cn" and "zh-CN": the second would replace the first
                raise ConfigError(f"{where} names target {name!r} twice ({spelled[name]!r} and "
                                  f"{str(key)!r}); keep one")
            spelled[name] = str(key)
            if not isinstance(entry, dict) or set(entry) - {"terms", "keep"}:
                raise ConfigError(f"{where}: {name!r} must be {{terms: {{...}}, keep: [...]}}")
            try:
                out[name] = build(entry.get("terms"), entry.get("keep"), max_terms=self.max_terms,
                                  max_chars=self.max_chars, where=f"{name!r}")
            except GlossaryProblem as exc:
                raise ConfigError(f"{where}: {exc}") from None
        return out

    def shared(self, target: str | None) -> Glossary:
        """The file's glossary for ``target``: ``*``, then its language, then the tag."""
        found = self._for_target.get(target)
        if found is None:
            found = Glossary()
            keys = ["*"] if target is None else ["*", base_language(target), target]
            for key in dict.fromkeys(keys):
                found = found.merged(self.by_key.get(key))
            if len(self._for_target) < 1024:
                self._for_target[target] = found
        return found

    def resolve(self, target: str | None, own: Mapping[str, Any] | None) -> Glossary | None:
        """The glossary a stream or request runs with: the file's for its target, then its
        own (``{"terms", "keep"}``, as the request gave it; 422 when it is bad). None: no
        glossary at all."""
        shared = self.shared(target)
        if own is None:
            return shared or None
        try:
            mine = build(own.get("terms"), own.get("keep"), max_terms=self.max_terms,
                         max_chars=self.max_chars)
            merged = shared.merged(mine)
            count = len(merged.terms) + len(merged.keep)
            if count > self.max_terms:
                raise GlossaryProblem(
                    f"glossary has {count} entries with the server's glossary for this "
                    f"target; at most THINKTRANS_MAX_GLOSSARY_TERMS={self.max_terms}")
            for term in (*mine.keep, *(t for pair in mine.terms for t in pair)):
                check_encodable(term, "glossary")
        except GlossaryProblem as exc:
            raise InputError(str(exc)) from None
        return merged or None
