"""Generate ``docs/configuration.md`` from the Settings model, so the page cannot drift.

Command line::

    python -m service.tools.configdoc            # print the page
    python -m service.tools.configdoc --write    # rewrite docs/configuration.md
    python -m service.tools.configdoc --check    # exit 1 when docs/configuration.md is stale
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from service.settings import SECTIONS, Settings

DEFAULT_PATH = Path("docs/configuration.md")
REGENERATE = "python -m service.tools.configdoc --write"

_INTRO = f"""\
# Configuration

<!-- Generated from service/settings.py by `{REGENERATE}`; do not edit by hand. -->

Settings come from `THINKTRANS_*` environment variables and an optional YAML file
(`thinktrans serve --config thinktrans.yaml`); a variable wins over the file, and a setting
given in neither keeps its default. In the YAML file the key is the lower-case name without
the prefix (`max_batch_size: 8`). Invalid settings stop the start with one line that names
the setting and the value.

Every list is given the same way: its items separated by commas
(`THINKTRANS_BACKEND=deepl,local`), or a JSON array
(`THINKTRANS_LOCAL_MODEL_ROOTS='["/models", "/srv/models"]'`), in a variable or as a string in
the file, where a YAML list does too. A value that is a JSON array is read as one; any other
is split at commas, so an item that holds a comma (a `span_patterns` regular expression) needs
the JSON array or the YAML list. A mapping is JSON in a variable
(`THINKTRANS_PRICE_PER_MILLION_CHARS='{{"deepl": 25}}'`). Booleans are `true` or `false`,
or `1` or `0`, in any case, in a variable and in the file alike; any other spelling (`yes`,
`on`, `t`) stops the start with a line naming the setting.
Secrets (`THINKTRANS_API_TOKEN`, the API keys) are never logged or shown by the service; pass
them through your orchestrator's secret store rather than a file in the image.
"""

_OUTRO = """\
## Read by the libraries, not by thinktrans

| variable | meaning |
| --- | --- |
| `HF_HOME` | Hugging Face cache, where hub ids are downloaded to (`/models` in the image). |
| `HF_HUB_OFFLINE` | `1`: never reach the Hub; hub ids load from the `HF_HOME` cache only. |
| `CUDA_VISIBLE_DEVICES` | The GPUs torch sees (`THINKTRANS_LOCAL_DEVICE=auto` takes the first). |
"""


def field_groups(settings_cls: type[Settings] = Settings) -> list[tuple[str, list[str]]]:
    """Field names grouped by the settings' sections (``SECTIONS``), in their order; a field
    of no section (one a subclass adds) comes last, under "other"."""
    groups: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for section in SECTIONS:
        own = [name for name in section.__annotations__ if name in settings_cls.model_fields]
        groups.append((str(getattr(section, "title", section.__name__)), own))
        seen.update(own)
    missing = [n for n in settings_cls.model_fields if n not in seen]
    if missing:
        groups.append(("other", missing))
    return groups


def _type_text(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(f"`{a if isinstance(a, str) else json.dumps(a)}`"
                          for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        parts = [a for a in get_args(annotation) if a is not type(None)]
        return " | ".join(_type_text(a) for a in parts)
    if origin is list:
        return "list"
    if origin is dict:
        return "mapping"
    if annotation is SecretStr:
        return "secret"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "integer"
    if annotation is float:
        return "number"
    if annotation is str:
        return "string"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    found: dict[str, Any] = {}
    for meta in info.metadata:
        if isinstance(meta, annotated_types.BaseMetadata):
            for attr in ("ge", "gt", "le", "lt"):
                if getattr(meta, attr, None) is not None:
                    found[attr] = getattr(meta, attr)
    if "ge" in found and "le" in found:
        return f"{_number(found['ge'])} to {_number(found['le'])}"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(f"{signs[attr]} {_number(value)}" for attr, value in found.items())


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number(value)}`"
    if isinstance(value, list):
        return f"`{','.join(map(str, value))}`" if value else "empty"
    if isinstance(value, dict):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def variables(name: str, info: FieldInfo, prefix: str) -> list[str]:
    """The environment variables a field is read from, the first one winning: the upper-case
    choices of its ``validation_alias`` (a lower-case choice is its YAML key), else the
    prefixed name."""
    alias = info.validation_alias
    choices = (alias.choices if isinstance(alias, AliasChoices)
               else [alias] if isinstance(alias, str) else [])
    names = [c for c in choices if isinstance(c, str) and c.isupper()]
    return names or [f"{prefix}{name.upper()}"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(settings_cls: type[Settings] = Settings) -> str:
    """The whole configuration page as Markdown.

    Every field becomes a row: its variable (``THINKTRANS_<NAME>``, or the first upper-case
    name of its ``validation_alias``), YAML key, type and bounds, default and description,
    grouped by the settings' ``SECTIONS``; a field's other variable names (an alias such as
    ``DEEPL_AUTH_KEY``) are listed after them."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    out = [_INTRO]
    other_names: list[tuple[str, str]] = []
    for title, names in field_groups(settings_cls):
        out.append(f"## {title}\n")
        out.append("| variable | YAML key | type | default | meaning |")
        out.append("| --- | --- | --- | --- | --- |")
        for name in names:
            info = settings_cls.model_fields[name]
            kind = _type_text(info.annotation)
            bounds = _bounds(info)
            if bounds:
                kind = f"{kind}, {bounds}"
            meaning = info.description or ""
            variable, *others = variables(name, info, prefix)
            other_names.extend((other, variable) for other in others)
            out.append(f"| `{variable}` | `{name}` | {_cell(kind)} | "
                       f"{_cell(_default_text(info))} | {_cell(meaning)} |")
        out.append("")
    if other_names:
        out.append("## Other names\n")
        out.append("| variable | read as |")
        out.append("| --- | --- |")
        for other, variable in other_names:
            out.append(f"| `{other}` | `{variable}`, when that is not set |")
        out.append("")
    out.append(_OUTRO)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m service.tools.configdoc",
        description="Print docs/configuration.md, generated from service/settings.py.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the page to --path")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 when the page at --path differs from the generated one")
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH,
                        help=f"the page (default: {DEFAULT_PATH})")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        args.path.write_text(page, encoding="utf-8")
        return 0
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else None
        if current != page:
            print(f"{args.path} is out of date with service/settings.py; run: {REGENERATE}",
                  file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
