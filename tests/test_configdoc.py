from __future__ import annotations

from pathlib import Path

import pytest

from service.settings import SECTIONS, Settings
from service.tools import configdoc

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_committed_page_is_current() -> None:
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert current == configdoc.render(), (
        f"docs/configuration.md is out of date with service/settings.py; "
        f"regenerate it: {configdoc.REGENERATE}"
    )


def test_every_setting_has_a_row_with_its_variable_key_and_description() -> None:
    page = configdoc.render()
    for name, info in Settings.model_fields.items():
        assert info.description, f"Settings.{name} needs a description: it is the documentation"
        rows = [line for line in page.splitlines()
                if line.startswith(f"| `THINKTRANS_{name.upper()}` | `{name}` |")]
        assert len(rows) == 1, name
        assert rows[0].endswith(f"| {info.description.replace('|', chr(92) + '|')} |")


def test_groups_follow_the_sections_in_field_order() -> None:
    groups = configdoc.field_groups()
    titles = [title for title, _ in groups]
    assert titles == [section.title for section in SECTIONS]  # no field left to "other"
    assert "serving" in titles and "deepl backend" in titles
    flat = [name for _, names in groups for name in names]
    assert sorted(flat) == sorted(Settings.model_fields) and len(flat) == len(set(flat))
    local = dict(groups)["local backend"]
    assert local[:2] == ["local_model", "local_marian_models"]  # as written in the section
    by_name = {name: title for title, names in groups for name in names}
    assert by_name["port"] == "serving"
    assert by_name["deepl_api_key"] == "deepl backend"


def test_defaults_types_and_bounds_are_shown() -> None:
    page = configdoc.render()
    assert "| `THINKTRANS_PORT` | `port` | integer, 1 to 65535 | `8088` |" in page
    assert "| `THINKTRANS_BACKEND` | `backend` | list | `local` |" in page
    assert "| `THINKTRANS_API_TOKEN` | `api_token` | secret | unset |" in page
    assert "| `THINKTRANS_LOG_TEXT` | `log_text` | boolean | `false` |" in page
    assert "`debug` \\| `info` \\| `warning` \\| `error`" in page
    assert "`DEEPL_AUTH_KEY`" in page


def test_alias_variables_are_named_as_the_environment_reads_them() -> None:
    page = configdoc.render()
    info = Settings.model_fields["deepl_api_key"]
    assert configdoc.variables("deepl_api_key", info, "THINKTRANS_") == [
        "THINKTRANS_DEEPL_API_KEY", "DEEPL_AUTH_KEY"]
    assert "| `THINKTRANS_DEEPL_API_KEY` | `deepl_api_key` | secret | unset |" in page
    assert "| `DEEPL_AUTH_KEY` | `THINKTRANS_DEEPL_API_KEY`, when that is not set |" in page
    # The lower-case choice is the YAML key, not a variable of its own.
    assert "`DEEPL_API_KEY`" not in page


def test_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "configuration.md"
    assert configdoc.main(["--check", "--path", str(page)]) == 1
    assert configdoc.REGENERATE in capsys.readouterr().err
    assert configdoc.main(["--write", "--path", str(page)]) == 0
    assert configdoc.main(["--check", "--path", str(page)]) == 0
    page.write_text(page.read_text(encoding="utf-8") + "edited by hand\n", encoding="utf-8")
    assert configdoc.main(["--check", "--path", str(page)]) == 1
