from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app
from tests.conftest import served
from tests.fakes_remote import closed_port_url

runner = CliRunner()


def test_translate_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_BACKEND", "passthrough")
    result = runner.invoke(app, ["translate", "--to", "zh-CN", "--json",
                                 "Let me think. 我们走吧。 x = 1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [s["status"] for s in out["segments"]] == ["translated", "same_language", "skipped"]
    assert "".join(s["original"] for s in out["segments"]) == "Let me think. 我们走吧。 x = 1"


def test_translate_reads_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_BACKEND", "passthrough")
    result = runner.invoke(app, ["translate", "--to", "de", "-"], input="Hello there.\n")
    assert result.exit_code == 0
    assert result.stdout == "Hello there.\n"


def test_bad_locale_is_one_line_and_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_BACKEND", "passthrough")
    result = runner.invoke(app, ["translate", "--to", "zh_CN", "hi"])
    assert result.exit_code == 3
    assert result.stderr.strip().count("\n") == 0
    assert "use '-', not '_'" in result.stderr


def test_bad_settings_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_MAX_BATCH_SIZE", "0")
    result = runner.invoke(app, ["translate", "--to", "de", "hi"])
    assert result.exit_code == 2
    assert "THINKTRANS_MAX_BATCH_SIZE" in result.stderr
    assert "Traceback" not in result.output


def test_bench_format_is_a_choice() -> None:
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--format", "xml"])
    assert result.exit_code == 2, result.output
    # typer draws the message in a box, wrapped to the terminal: read the words only.
    words = " ".join(re.sub(r"[\u2500-\u257f]", " ", result.stderr).split())
    assert "'xml' is not one of 'table', 'json'." in words, result.stderr


def test_bench_unreachable_server_is_one_line() -> None:
    result = runner.invoke(app, ["bench", "--url", closed_port_url(), "--format", "json"])
    assert result.exit_code == 3, result.output
    assert result.stderr.strip().count("\n") == 0
    assert "cannot reach" in result.stderr


def test_detect() -> None:
    result = runner.invoke(app, ["detect", "-"], input="Das ist wirklich sehr gut so.\n这是中文\n")
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["lang"] for line in lines] == ["de", "zh-Hans"]


@pytest.fixture
def server() -> Iterator[str]:
    with served(THINKTRANS_DEFAULT_LOCALE="zh-CN") as srv:
        yield srv.url


def test_serve_over_real_http(server: str) -> None:
    text = "Hmm, the user said hello. 我们来看看。\n```python\nx = 1\n```\n42 + 17 = 59"
    r = httpx.post(f"{server}/v1/translate", json={"texts": [text]}, timeout=10)
    assert r.status_code == 200
    segments = r.json()["results"][0]["segments"]
    assert "".join(s["original"] for s in segments) == text
    assert [s["status"] for s in segments] == ["translated", "same_language", "skipped", "skipped"]
    assert segments[0]["target"] == "zh-CN"
    assert httpx.get(f"{server}/healthz").json() == {"status": "ok"}
    assert "thinktrans_segments_total" in httpx.get(f"{server}/metrics").text
