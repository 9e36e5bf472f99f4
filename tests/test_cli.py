from __future__ import annotations

import importlib.metadata
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app
from service.settings import load_settings
from tests.conftest import Server, served
from tests.fakes_remote import FakeChat, closed_port_url

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
def server_log() -> Iterator[Server]:
    with served(THINKTRANS_DEFAULT_LOCALE="zh-CN") as srv:
        yield srv


@pytest.fixture
def server(server_log: Server) -> str:
    return server_log.url


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


def _logged(server: Server, words: str) -> dict[str, object]:
    """The server's first log line that holds ``words``, waited for (within a hang guard)."""
    give_up = time.monotonic() + HANG_S
    while time.monotonic() < give_up:
        for line in server.log().splitlines():
            if words in line:
                found: dict[str, object] = json.loads(line)
                return found
        time.sleep(0.1)
    raise AssertionError(f"no log line with {words!r}: {server.log()[-2000:]}")


def test_serve_logs_the_viewers_address_once_listening(server_log: Server) -> None:
    line = _logged(server_log, "the viewer is at")
    assert line["url"] == f"{server_log.url}/viewer"
    assert line["msg"] == f"the viewer is at {server_log.url}/viewer"
    assert httpx.get(str(line["url"]), timeout=10).status_code == 200


def test_the_viewers_address_says_when_it_needs_the_token(token_served: Server) -> None:
    line = _logged(token_served, "the viewer is at")
    assert str(line["msg"]).startswith(f"the viewer is at {token_served.url}/viewer; ")
    assert "THINKTRANS_API_TOKEN" in str(line["msg"]) and "#token=" in str(line["msg"])
    assert "s3cret" not in token_served.log()


def test_serve_help_shows_the_defaults_and_where_every_setting_is() -> None:
    text = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).stdout
    flat = " ".join(text.split())
    for option, default in (("--host", "THINKTRANS_HOST, else 127.0.0.1"),
                            ("--port", "THINKTRANS_PORT, else 8088"),
                            ("--backend", "THINKTRANS_BACKEND, else local")):
        assert re.search(rf"{option} <\w+> [^[]*\[default: \({re.escape(default)}\)\]",
                         flat), (option, text)
    assert "docs/configuration.md" in flat and "THINKTRANS_* variable" in flat


# -- failures are one line and a non-zero exit ---------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# Long enough for a hang to fail a test, never what it measures.
HANG_S = 120.0


def run_cli(*args: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m service.cli ARGS` in its own process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], env={**os.environ, **env}, cwd=ROOT,
        capture_output=True, text=True, timeout=timeout_s,
    )


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("env", "words"),
    [({"THINKTRANS_BACKEND": "nope"}, ["unknown backend 'nope'", "passthrough"]),
     ({"THINKTRANS_BACKEND": "passthrough", "THINKTRANS_API_TOKEN": ""},
      ["THINKTRANS_API_TOKEN", "set but empty"]),
     ({"THINKTRANS_BACKEND": "passthrough", "THINKTRANS_DETECTOR": "nope"},
      ["unknown detector 'nope'"]),
     ({"THINKTRANS_BACKEND": "passthrough", "THINKTRANS_ALLOWED_HOSTS": "http://thinktrans:8088"},
      ["THINKTRANS_ALLOWED_HOSTS", "'http://thinktrans:8088' is not a host name"])],
)
def test_serve_refuses_bad_config_in_one_line(env: dict[str, str], words: list[str]) -> None:
    port = str(closed_port_url().rsplit(":", 1)[1])
    result = run_cli("serve", "--port", port, **env)
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    for word in words:
        assert word in line


def test_serve_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--port", str(port), THINKTRANS_BACKEND="passthrough")
    assert result.returncode != 0
    line = one_line(result.stderr)
    assert f"port {port}" in line and "in use" in line
    assert "--port" in line and "THINKTRANS_PORT" in line


def test_translate_with_a_backend_not_ready_fails_at_once(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("THINKTRANS_BACKEND", "llm")  # no endpoint configured
    result = runner.invoke(app, ["translate", "--to", "zh-CN", "Let me check the total."])
    assert result.exit_code == 4, result.output
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert "backend 'llm' is not ready" in line and "THINKTRANS_LLM_BASE_URL" in line


def test_translate_without_a_loadable_model_fails_at_once(tmp_path: Path) -> None:
    """The default local backend with no model here: no wait through retries (the command
    would wait up to 600 s for a retry to succeed: the process's timeout would end it), no
    original printed as if it were the translation, exit 4."""
    pytest.importorskip("transformers")
    result = run_cli("translate", "--to", "zh-CN", "Let me check the total time again.",
                     timeout_s=HANG_S, THINKTRANS_LOCAL_MODEL=str(tmp_path / "no-model-here"),
                     HF_HUB_OFFLINE="1")
    assert result.returncode == 4, result.stderr
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert "backend 'local' is not ready" in line and "no-model-here" in line
    assert "retrying" not in line


def test_translate_with_a_hub_model_and_no_hub_fails_without_the_hubs_retries(tmp_path: Path
                                                                              ) -> None:
    """A hub id, an empty cache and a hub that refuses connections: the hub client's own
    retries took half a minute to give up; a quick probe loads from the cache only. (The
    process's timeout only stops a hang: the probe itself is tested in
    tests/test_local_checkpoint.py.)"""
    pytest.importorskip("transformers")
    env = {name: value for name, value in os.environ.items() if not name.startswith("HF_")}
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "translate", "--to", "de", "Check it again."],
        env={**env, "HF_HOME": str(tmp_path), "HF_ENDPOINT": closed_port_url(),
             "THINKTRANS_LOCAL_MODEL": "thinktrans-tests/no-such-model"},
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
    )
    assert result.returncode == 4, result.stderr
    assert "hub is unreachable" in result.stderr and "no-such-model" in result.stderr


class BrokenHub:
    """A hub on 127.0.0.1 that cannot serve: it closes each connection at once, or answers
    every request 503 (a proxy whose upstream is down); it counts the connections."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            self.connections += 1
            with conn:
                if self.answer is not None:
                    conn.settimeout(HANG_S)
                    request = b""
                    while b"\r\n\r\n" not in request:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        request += chunk
                    conn.sendall(self.answer)


@pytest.mark.parametrize("answer", [
    None,
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
], ids=["closes", "answers-503"])
def test_translate_with_a_hub_that_cannot_serve_asks_it_once(tmp_path: Path,
                                                             answer: bytes | None) -> None:
    """The default model, an empty cache and a hub that cannot serve it: one request, then
    the reason in one line and exit 4. The hub client retried a 503 six times, over half a
    minute, and asked four times of a hub that closed the connection."""
    pytest.importorskip("huggingface_hub")
    hub = BrokenHub(answer)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HF_", "THINKTRANS_"))}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "service.cli", "translate", "--to", "de", "Check it again."],
            env={**env, "HF_HOME": str(tmp_path), "HF_ENDPOINT": hub.url},
            cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
        )
    finally:
        hub.sock.close()
    assert result.returncode == 4, result.stderr
    assert hub.connections == 1  # the probe: no request of the hub client's, no retry
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert "backend 'local' is not ready" in line
    assert f"{load_settings().local_model!r} not found locally" in line
    assert f"the hub {hub.url} cannot serve it now" in line
    assert "THINKTRANS_LOCAL_MODEL" in line and "HF_HUB_OFFLINE=1" in line


@pytest.mark.parametrize("as_json", [False, True])
def test_translate_with_error_segments_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, chat_server: FakeChat, as_json: bool
) -> None:
    chat_server.reset()
    chat_server.mode = "malformed"  # the endpoint is up; its answers are not translations
    monkeypatch.setenv("THINKTRANS_BACKEND", "llm")
    monkeypatch.setenv("THINKTRANS_LLM_BASE_URL", f"{chat_server.origin}/v1")
    monkeypatch.setenv("THINKTRANS_LLM_MODEL", "fake-model")
    text = "Let me check the total time again."
    args = ["translate", "--to", "zh-CN", *(["--json"] if as_json else []), text]
    result = runner.invoke(app, args)
    assert result.exit_code == 4, result.output
    if as_json:
        assert json.loads(result.stdout)["segments"][0]["status"] == "error"
    else:
        assert result.stdout == text + "\n"  # the original, in its place
    line = one_line(result.stderr)
    assert "1 segment(s) left untranslated" in line and "llm" in line


# -- bench -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_served() -> Iterator[Server]:
    with served(THINKTRANS_API_TOKEN="s3cret", THINKTRANS_DEFAULT_LOCALE="zh-CN") as srv:
        yield srv


@pytest.fixture(scope="module")
def token_server(token_served: Server) -> str:
    return token_served.url


@pytest.mark.parametrize(("token", "words"), [(None, "needs a token (401)"),
                                              ("wrong", "refused the token (401)")])
def test_bench_stops_at_a_refused_token(token_server: str, token: str | None, words: str
                                        ) -> None:
    pytest.importorskip("aiohttp")
    args = ["bench", "--url", token_server, "--duration", "30", "--streams", "4"]
    result = runner.invoke(app, [*args, *(["--token", token] if token else [])])
    assert result.exit_code == 3, result.output
    line = one_line(result.stderr)
    assert words in line and "--token" in line and "THINKTRANS_API_TOKEN" in line
    # No stream was tried: the token was checked first.
    metrics = httpx.get(f"{token_server}/metrics", timeout=5).text
    assert 'method="POST",route="/v1/streams"' not in metrics, metrics


def test_bench_with_the_token_runs(token_server: str) -> None:
    pytest.importorskip("aiohttp")
    result = runner.invoke(app, ["bench", "--url", token_server, "--duration", "0.3",
                                 "--streams", "2", "--token", "s3cret", "--format", "json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["concurrent_streams"] == 2 and summary["streams_run"] >= 2
    assert summary["failed_requests"] == 0 and summary["violations"] == 0


def test_bench_table_says_what_it_counts(token_server: str) -> None:
    """--streams N is streams at once, not in all; failed requests are not segments whose
    status is error: the labels say which is which."""
    pytest.importorskip("aiohttp")
    result = runner.invoke(app, ["bench", "--url", token_server, "--duration", "0.3",
                                 "--streams", "2", "--token", "s3cret"])
    assert result.exit_code == 0, result.output
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1)
                for line in result.stdout.splitlines())
    assert rows["concurrent streams"] == "2", result.stdout
    assert int(rows["streams run"]) >= 2
    assert rows["failed requests"] == "0"
    assert "segment statuses" in rows
    assert "streams" not in rows and "errors" not in rows and "statuses" not in rows


@pytest.mark.parametrize(
    ("module", "extra", "args"),
    [("aiohttp", "bench", ["bench", "--url", "http://127.0.0.1:9"]),
     ("matplotlib", "compare", ["compare", "--to", "de", "--backend", "passthrough",
                                "--plot", "plot.png"])],
)
def test_missing_extra_is_one_line(tmp_path: Path, module: str, extra: str, args: list[str]
                                   ) -> None:
    # The extra's package made unimportable, as where it is not installed.
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv[0] = 'thinktrans'; "
            f"sys.path.insert(0, {str(ROOT)!r}); from service.cli import main; main()")
    result = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env={**os.environ, "THINKTRANS_BACKEND": "passthrough"},
    )
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert f"'{module}'" in line and f"thinktrans[{extra}]" in line


# -- logs ------------------------------------------------------------------------------------


def json_lines(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    return out


def test_json_logs_take_in_warnings_and_hub_logs() -> None:
    pytest.importorskip("huggingface_hub")
    code = (
        "import logging, warnings\n"
        "from service.ops.logs import configure\n"
        "configure('info', log_text=False, transformers=False)\n"
        "warnings.warn('a library is unhappy')\n"
        "logging.getLogger('huggingface_hub.file_download').warning('hub says hi')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    records = json_lines(result.stderr)
    assert [(r["logger"], r["level"]) for r in records] == [
        ("py.warnings", "warning"), ("huggingface_hub.file_download", "warning")]


@pytest.fixture(scope="module")
def tiny_nllb(models: dict[str, Path]) -> Path:
    """The session's NLLB checkpoint (tests/checkpoints.py)."""
    return models["nllb"]


def test_serve_logs_are_json_lines_with_a_model(tiny_nllb: Path) -> None:
    """Loading a checkpoint draws transformers' progress bar unless the logs take it over;
    an unknown variable is warned about, in JSON too."""
    env = {"THINKTRANS_BACKEND": "local", "THINKTRANS_LOCAL_MODEL": str(tiny_nllb),
           "HF_HUB_OFFLINE": "1", "THINKTRANS_MAX_QUEU_SIZE": "8"}
    with served(**env) as srv:
        r = httpx.post(f"{srv.url}/v1/translate", timeout=30,
                       json={"target": "de", "texts": ["Let me check the total time."]})
        assert r.status_code == 200
        srv.terminate(60)
        records = json_lines(srv.log())
    messages = [str(r["msg"]) for r in records]
    assert any(m.startswith("local: ready") for m in messages), messages
    assert ("unknown setting THINKTRANS_MAX_QUEU_SIZE ignored; "
            "did you mean THINKTRANS_MAX_QUEUE_SIZE?") in messages


def _translate_on_a_terminal(env: dict[str, str]) -> tuple[int, str]:
    """`thinktrans translate` with its stderr on a pseudo-terminal: exit code, what it drew."""
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "translate", "--to", "de", "Hello there."],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    drawn = bytearray()

    def read() -> None:  # the pty's buffer is small: read as it comes
        while True:
            try:
                got = os.read(master, 65536)
            except OSError:
                return
            if not got:
                return
            drawn.extend(got)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
        os.close(master)
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.decode("utf-8", "replace"))


def test_first_local_translate_shows_its_wait_on_a_terminal_only(tiny_nllb: Path,
                                                                 tmp_path: Path) -> None:
    """The one-time conversion takes a while: on a terminal the command says what it waits
    for; piped, it prints nothing but the failures it reports."""
    pytest.importorskip("ctranslate2")
    env = {**os.environ, "THINKTRANS_BACKEND": "local", "THINKTRANS_LOCAL_MODEL": str(tiny_nllb),
           "THINKTRANS_LOCAL_CT2_CACHE": str(tmp_path / "ct2"), "HF_HUB_OFFLINE": "1"}
    code, drawn = _translate_on_a_terminal(env)
    assert code == 0, drawn
    assert "local: converting" in drawn and "backends ready after" in drawn, drawn[-2000:]
    assert "Loading weights" not in drawn
    piped = subprocess.run(
        [sys.executable, "-m", "service.cli", "translate", "--to", "de", "Hello there."],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""


def test_convert_and_make_test_model_draw_no_progress_bars(tmp_path: Path) -> None:
    """transformers' "Writing model shards" and "Loading weights" bars are off in commands."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    pytest.importorskip("ctranslate2")
    env = {key: value for key, value in os.environ.items()
           if key != "HF_HUB_DISABLE_PROGRESS_BARS"}
    commands = [["make-test-model", str(tmp_path / "m")],
                ["convert", str(tmp_path / "m"), str(tmp_path / "c")]]
    for command in commands:
        done = subprocess.run([sys.executable, "-m", "service.cli", *command], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "it/s" not in done.stderr and "%|" not in done.stderr, (command, done.stderr)


# -- help, version, make-test-model ------------------------------------------------------------


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"thinktrans {importlib.metadata.version('thinktrans')}"


def test_help_shows_flags_as_flags() -> None:
    result = runner.invoke(app, ["translate", "--help"], env={"COLUMNS": "120"})
    [line] = [line for line in result.stdout.splitlines() if "--json" in line]
    assert "<bool>" not in line, line
    result = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "160"})
    [line] = [line for line in result.stdout.splitlines() if "--post-interval-ms" in line]
    assert "Milliseconds between" in line, line


def _commands() -> list[str]:
    import typer.main

    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", [None, *_commands()])
def test_every_help_shows_the_extras_it_names_and_no_value_for_flags(command: str | None) -> None:
    """Square brackets are text, not markup: 'thinktrans[pool]' stays whole; --help and
    --force take no value and the help says none."""
    import typer.main

    args = [command, "--help"] if command else ["--help"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    root = typer.main.get_command(app)
    cmd = root.commands[command] if command else root  # type: ignore[attr-defined]
    for extra in re.findall(r"thinktrans\[[a-z0-9,]+\]", cmd.help or ""):
        assert extra in text, (extra, text)
    assert "<bool>" not in text, text
    [line] = [line for line in text.splitlines() if line.strip().startswith("--help")]
    assert line.split()[:2] == ["--help", "Show"], line


def test_pool_and_convert_help_name_their_extras() -> None:
    for command, extras in (("pool", ["'thinktrans[pool]'"]),
                            ("convert", ["'thinktrans[ct2]'", "'thinktrans[local,ct2]'"])):
        text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
        for extra in extras:
            assert extra in text, (command, text)


@pytest.mark.parametrize(
    ("family", "keys", "source", "target"),
    [("nllb", ("src_lang", "tgt_lang"), "fra_Latn", "jpn_Jpan"),
     ("m2m100", ("src_lang", "tgt_lang"), "fr", "ja"),
     ("marian", ("source_lang", "target_lang"), "fr", "ja")],
)
def test_make_test_model_pair_and_modes(
    tmp_path: Path, family: str, keys: tuple[str, str], source: str, target: str
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    out = tmp_path / "new" / family
    old = os.umask(0o077)  # a strict umask: the files must be readable anyway
    try:
        result = runner.invoke(app, ["make-test-model", str(out), "--family", family,
                                     "--source", "fr", "--target", "ja"])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (saved[keys[0]], saved[keys[1]]) == (source, target)
    for path in [tmp_path / "new", *out.rglob("*"), out]:
        mode = stat.S_IMODE(path.stat().st_mode)
        want = 0o755 if path.is_dir() else 0o644
        assert mode & want == want, f"{path}: {oct(mode)}"


def test_make_test_model_unknown_language_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["make-test-model", str(tmp_path / "m"), "--target", "tlh"])
    assert result.exit_code == 3, result.output
    line = one_line(result.stderr)
    assert line.startswith("thinktrans: --target:") and "'tlh'" in line
