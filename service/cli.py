"""The command line: serve, translate, detect, compare, bench, convert, make-test-model.

Errors become one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from models.errors import BackendError, BackendUnavailable
from service.exceptions import ConfigError, InputError, ThinktransError
from service.settings import Settings, load_settings

if TYPE_CHECKING:
    from service.tools.compare import BackendRun, CompareConfig

log = logging.getLogger("thinktrans")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # Plain click help: rich markup would take "thinktrans[pool]" for a style tag and drop
    # it, and its tables show flags such as --help as taking a <bool>.
    rich_markup_mode=None,
    help="thinktrans: translate an agent's streamed thinking into the user's language.",
)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML settings file (THINKTRANS_* variables win).")
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"thinktrans {version('thinktrans')}")
        except PackageNotFoundError:
            typer.echo("thinktrans (not installed: running from a source tree)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, metavar="",
        help="Print the installed version and exit.")] = False,
) -> None:
    """thinktrans: translate an agent's streamed thinking into the user's language."""


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"thinktrans: {message}", err=True)
    return typer.Exit(code)


def _exit_code(exc: ThinktransError | BackendError) -> int:
    if isinstance(exc, ConfigError):
        return 2
    if isinstance(exc, InputError):
        return 3
    return 4


def _settings(config: Path | None, **overrides: Any) -> Settings:
    try:
        return load_settings(config, **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        raise _fail(exc.detail, 2) from None


def _read_text(text: str | None) -> str:
    if text is None or text == "-":
        return sys.stdin.read()
    return text


def _default(name: str) -> str:
    """What an option of a setting defaults to, as help shows it: its variable, else the
    setting's default (the option's own default is None: not given, it leaves the setting to
    the variable, the file or the default)."""
    value = Settings.model_fields[name].get_default(call_default_factory=True)
    shown = ",".join(value) if isinstance(value, list) else str(value)
    return f"THINKTRANS_{name.upper()}, else {shown}"


@app.command(epilog="Every setting is a THINKTRANS_* variable (THINKTRANS_PORT) or a key of "
             "the --config file (port: 8088); docs/configuration.md lists them all, with "
             "their defaults. Options win over variables, variables over the file.")
def serve(
    config: ConfigOpt = None,
    host: Annotated[str | None, typer.Option(
        help="Bind address.", show_default=_default("host"))] = None,
    port: Annotated[int | None, typer.Option(
        help="Port.", show_default=_default("port"))] = None,
    backend: Annotated[str | None, typer.Option(
        help="Backend or chain, e.g. deepl,local.",
        show_default=_default("backend"))] = None,
) -> None:
    """Start the HTTP service."""
    import uvicorn

    from service.chain.cache import check_file
    from service.http.app import create_app
    from service.ops.logs import configure
    from service.runtime import build_backends
    from service.text.detect import get_detector
    from service.text.glossary import GlossaryBook

    # JSON from the first line on: the settings may warn (an unknown variable).
    configure("info", log_text=False, transformers=False)
    settings = _settings(config)
    try:
        settings = settings.with_flags(backend=backend, host=host, port=port)
    except ConfigError as exc:
        raise _fail(exc.detail, 2) from None
    # Only the local backend loads transformers; importing it for nothing costs 0.7 s.
    configure(settings.log_level, log_text=settings.log_text,
              transformers="local" in settings.all_backends())
    try:
        # Checked here, not in the app's lifespan (where a failure is a traceback and
        # uvicorn's exit 3), and before a model loads for minutes.
        _check_port(settings.host, settings.port)
        if settings.cache_path is not None and settings.cache_mb > 0:
            check_file(settings.cache_path)
        get_detector(settings.detector, settings.detect_languages)
        GlossaryBook(settings)  # the glossary file reads and is valid
        application = create_app(settings, backends=build_backends(settings), freeze_gc=True)
    except (ThinktransError, BackendError) as exc:
        raise _fail(exc.detail, _exit_code(exc)) from None
    uv_config = uvicorn.Config(application, host=settings.host, port=settings.port,
                            log_level=settings.log_level, log_config=None, access_log=False,
                            timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
                            # An idle keep-alive connection closes 5 s after its last response;
                            # uvicorn has no limit on a request head (see docs/reliability.md).
                            timeout_keep_alive=5)
    server = _DrainingServer(uv_config)
    server.run()


def _check_port(host: str, port: int) -> None:
    """Bind and release ``host:port`` as uvicorn will; ConfigError in one line if it cannot."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve host {host!r} ({exc.strerror}); "
                          "set --host or THINKTRANS_HOST") from None
    for family, kind, proto, _, address in addresses:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            continue  # a family this machine lacks: asyncio skips it too
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio does
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"port {port} on {host} is already in use; stop what listens there "
                        "or choose another port with --port or THINKTRANS_PORT") from None
                raise ConfigError(
                    f"cannot listen on {host}:{port} ({exc.strerror}); check --host/--port "
                    "(THINKTRANS_HOST/THINKTRANS_PORT)") from None


class _DrainingServer:
    """uvicorn's server, with open streams flushed as soon as a shutdown signal comes.

    uvicorn waits for open connections before the app's lifespan ends; SSE readers stay
    connected until their stream ends, so the streams must be closed first, not last.
    """

    def __init__(self, config: Any) -> None:
        import uvicorn

        self.server = uvicorn.Server(config)
        self.app = config.app
        inner = self.server.handle_exit

        def handle_exit(sig: int, frame: Any) -> None:
            runtime = getattr(self.app.state, "runtime", None)
            if runtime is not None and not runtime.streams.draining:
                grace = runtime.settings.shutdown_grace_s
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(
                    lambda: loop.create_task(runtime.streams.drain(grace)))
            inner(sig, frame)

        self.server.handle_exit = handle_exit  # type: ignore[method-assign]
        self._wrap_start_stop()

    def _wrap_start_stop(self) -> None:
        """Record the address really bound once listening (the HEALTHCHECK reads it)."""
        from service.tools import healthcheck as health

        startup, shutdown = self.server.startup, self.server.shutdown

        async def on_startup(sockets: Any = None) -> None:
            await startup(sockets=sockets)
            bound = [s.getsockname() for srv in self.server.servers for s in srv.sockets]
            if self.server.started and bound:
                try:
                    health.write_state(bound[0][0], bound[0][1])
                except OSError as exc:  # a read-only home: the check falls back to the port
                    log.warning(
                        "cannot record the listening address for `thinktrans health`: %s",
                        exc.strerror or exc)
                _say_viewer(bound[0][0], bound[0][1], self.app.state.settings)

        async def on_shutdown(sockets: Any = None) -> None:
            health.clear_state()
            await shutdown(sockets=sockets)

        self.server.startup = on_startup  # type: ignore[method-assign]
        self.server.shutdown = on_shutdown  # type: ignore[method-assign]

    def run(self) -> None:
        self.server.run()


def _say_viewer(host: str, port: int, settings: Settings) -> None:
    """Log the viewer's address once the server listens: on this machine's loopback when it
    listens on every address, an IP address either way (the Host check passes it)."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}/viewer"
    token = ("; it needs the token (THINKTRANS_API_TOKEN): type it into the page, or open "
             "/viewer#token=<token>" if settings.api_token is not None else "")
    log.info("the viewer is at %s%s", url, token, extra={"url": url})


async def _translate(settings: Settings, text: str, target: str, source: str | None) -> Any:
    from service.runtime import Runtime

    async with Runtime(settings) as runtime:
        # The backends load or check in the background; a one-shot command waits for that,
        # and stops at once when it failed: a service would wait for a retry, a command not.
        with _startup_progress():
            ready = await runtime.wait_ready(timeout_s=600.0)
        if not ready:
            reasons = [f"backend {name!r} is not ready: {_reason(runtime.backends[name])}"
                       for name in settings.backend]
            raise BackendUnavailable("; ".join(reasons))
        [result] = await runtime.translate([text], target=target, source=source)
        return result


@contextlib.contextmanager
def _startup_progress() -> Iterator[None]:
    """On a terminal, a status line on stderr while the backends start: what they are doing
    (a model's load, its one-time CTranslate2 conversion: the backends' info lines) and
    for how long. Elsewhere (a pipe, a file, a log collector) nothing."""
    if not sys.stderr.isatty():
        yield
        return
    import time

    from rich.console import Console
    from rich.text import Text

    started = time.monotonic()

    class _Line:  # rendered at each refresh: the seconds count on
        doing = "starting the backends"

        def __rich__(self) -> Text:
            return Text(f"thinktrans: {time.monotonic() - started:3.0f} s  {self.doing}",
                        no_wrap=True, overflow="ellipsis")

    line = _Line()
    status = Console(stderr=True).status(line)

    class _ToStatus(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line.doing = record.getMessage().splitlines()[0] if record.getMessage() else ""

    logger = logging.getLogger("models")
    handler, level = _ToStatus(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with status:
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    elapsed = time.monotonic() - started
    if elapsed >= 2:
        typer.echo(f"thinktrans: backends ready after {elapsed:.0f} s", err=True)


def _reason(translator: Any) -> str:
    """Why a backend is not ready (the retry schedule is apart, in ``retrying``: a command
    stops rather than retries)."""
    return str(translator.reason or "no reason given")


@app.command()
def translate(
    to: Annotated[str, typer.Option("--to", help="Target locale, e.g. zh-CN.")],
    text: Annotated[str | None, typer.Argument(help="Text, or - for standard input.")] = None,
    backend: Annotated[str | None, typer.Option(
        help="Backend or chain.", show_default=_default("backend"))] = None,
    source: Annotated[str | None, typer.Option(help="Source locale (default: detect).")] = None,
    # metavar "": a flag takes no value, and the help should not suggest one.
    as_json: Annotated[bool, typer.Option(
        "--json", metavar="", help="Print segment results as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Translate text in-process (no server needed).

    Exits 4, with the reason on stderr, when a backend is not ready or a segment that
    needed translating was not translated (the original is printed in its place).
    """
    try:
        settings = _settings(config).with_flags(backend=backend)
    except ConfigError as exc:
        raise _fail(exc.detail, 2) from None
    from service.ops.logs import quiet

    # The command reports a failed load itself, in one line; the log would say it twice.
    quiet(transformers="local" in settings.all_backends())
    body = _read_text(text)
    try:
        result = asyncio.run(_translate(settings, body, to, source))
    except (ThinktransError, BackendError) as exc:
        raise _fail(exc.detail, _exit_code(exc)) from None
    if as_json:
        typer.echo(result.model_dump_json(exclude_defaults=True, indent=2))
    else:
        typer.echo(result.text, nl=not result.text.endswith("\n"))
    failed = [s for s in result.segments if s.status in ("error", "deadline")]
    if failed:
        first = failed[0]
        reason = first.error or (
            f"not translated within the deadline ({settings.deadline_ms:g} ms); "
            "raise THINKTRANS_DEADLINE_MS" if first.status == "deadline" else first.status)
        raise _fail(f"{len(failed)} segment(s) left untranslated: {reason}", 4)


@app.command()
def detect(
    text: Annotated[str | None, typer.Argument(help="Text, or - for standard input.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Detect the language of a text (one result per line of input)."""
    from service.text.detect import get_detector

    settings = _settings(config)
    try:
        detector = get_detector(settings.detector, settings.detect_languages)
    except (ThinktransError, BackendError) as exc:
        raise _fail(exc.detail, _exit_code(exc)) from None
    for line in _read_text(text).splitlines() or [""]:
        det = detector.detect(line)
        typer.echo(json.dumps({"lang": det.lang, "confidence": det.confidence,
                               "reliable": det.reliable}))


class CompareFormat(StrEnum):
    """How `thinktrans compare` prints its report."""

    table = "table"
    json = "json"
    markdown = "markdown"


class BenchFormat(StrEnum):
    """How `thinktrans bench` prints its summary."""

    table = "table"
    json = "json"


@app.command()
def compare(
    to: Annotated[str, typer.Option("--to", help="Target locale, e.g. de or zh-CN.")],
    backend: Annotated[list[str], typer.Option(
        "--backend", help="A backend or chain to compare (repeat: --backend A --backend B).")],
    corpus: Annotated[Path | None, typer.Option(
        help="Text, .jsonl (text, ref) or .tsv (text<TAB>ref); default: the built-in sample.")
    ] = None,
    refs: Annotated[Path | None, typer.Option(
        help="References, one per line, aligned with the corpus (overrides the corpus's).")
    ] = None,
    fmt: Annotated[CompareFormat, typer.Option("--format", help="How to print the report.")
    ] = CompareFormat.table,
    plot: Annotated[Path | None, typer.Option(
        help="Write a PNG: latency distributions and throughput per backend.")] = None,
    concurrency: Annotated[int, typer.Option(help="Texts in flight at once per backend.")] = 4,
    deadline_ms: Annotated[float | None, typer.Option(
        "--deadline-ms", help="Per-request deadline (default 600000: CPU models are slow).")
    ] = None,
    price: Annotated[list[str] | None, typer.Option(
        "--price", help="BACKEND=USD per million characters, e.g. deepl=25 (repeatable).")
    ] = None,
    glossary: Annotated[Path | None, typer.Option(
        help="A YAML file of one glossary, {terms: {source: target}, keep: [term]}, sent "
             "with every text.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run one corpus through several backends in-process; latency, throughput, cost,
    chrF/BLEU, and how many segments kept their protected spans and glossary terms."""
    from service.tools import compare as cmp
    from service.tools import report as rep

    settings = _settings(config)
    cmp.quiet_logs(transformers=any("local" in label for label in backend))
    try:
        cfg = cmp.make_config(settings, target=to, labels=backend, corpus=corpus, refs=refs,
                              concurrency=concurrency, deadline_ms=deadline_ms,
                              prices=price or [], glossary=glossary)
        if plot is not None:
            rep.check_plot(plot)
        runs = _measure(settings, cfg)
        report = cmp.build_report(runs, cfg)
        if plot is not None:
            rep.write_plot(report, runs, plot)
    except (ThinktransError, BackendError) as exc:
        raise _fail(exc.detail, _exit_code(exc)) from None
    if fmt is CompareFormat.json:
        typer.echo(json.dumps(report, ensure_ascii=False, indent=2))
    elif fmt is CompareFormat.markdown:
        typer.echo(rep.format_markdown(report))
    else:
        typer.echo(rep.format_table(report))
    for b in report["backends"]:
        if b["errors"]:
            typer.echo(f"thinktrans: {b['backend']}: {b['errors']} segment(s) untranslated: "
                       f"{b['error_samples'][0]}", err=True)
    if plot is not None:
        typer.echo(f"thinktrans: plot written to {plot}", err=True)


def _measure(settings: Settings, cfg: CompareConfig) -> list[BackendRun]:
    """compare's runs, with a progress bar on a terminal."""
    from service.tools.compare import run_compare
    from service.tools.report import RichProgress

    if not sys.stderr.isatty():
        return asyncio.run(run_compare(settings, cfg))
    with RichProgress() as bar:
        return asyncio.run(run_compare(settings, cfg, bar))


@app.command()
def bench(
    url: Annotated[str, typer.Option(help="Base URL of a running server.")],
    streams: Annotated[int, typer.Option(
        help="Streams under way at once; each starts the next as it ends, so more run in all "
        "(the summary's 'streams run').")] = 20,
    duration: Annotated[float, typer.Option(help="Seconds to start new streams for.")] = 5.0,
    rate: Annotated[float, typer.Option(help="Deltas per second per stream.")] = 50.0,
    post_interval_ms: Annotated[float, typer.Option(
        help="Milliseconds between a stream's POSTs; the deltas due are sent together.")
    ] = 100.0,
    corpus: Annotated[Path | None, typer.Option(help="Text, .jsonl or .tsv corpus.")] = None,
    to: Annotated[str | None, typer.Option("--to", help="Stream target locale.")] = "zh-CN",
    token: Annotated[str | None, typer.Option(envvar="THINKTRANS_API_TOKEN",
                                              help="Bearer token.")] = None,
    fmt: Annotated[BenchFormat, typer.Option("--format", help="How to print the summary.")
    ] = BenchFormat.table,
) -> None:
    """Load-test a running server with concurrent streams; checks every stream's originals."""
    try:
        from service.tools.bench import BenchConfig, run_bench
    except ModuleNotFoundError as exc:
        raise _fail(f"bench needs {exc.name!r}: pip install 'thinktrans[bench]'", 2) from None
    from service.tools.corpus import load_corpus
    from service.tools.report import format_bench_table

    try:
        texts = [item.text for item in load_corpus(corpus)]
        cfg = BenchConfig(url=url.rstrip("/"), streams=streams, duration_s=duration, rate=rate,
                          post_interval_ms=post_interval_ms, target=to, token=token,
                          texts=texts)
        report = asyncio.run(run_bench(cfg))
    except (ThinktransError, BackendError) as exc:
        raise _fail(exc.detail, _exit_code(exc)) from None
    summary = report.summary()
    typer.echo(json.dumps(summary, indent=2) if fmt is BenchFormat.json
               else format_bench_table(summary))
    for line in (report.violations + report.errors)[:10]:
        typer.echo(f"thinktrans: {line}", err=True)
    if report.violations:
        raise typer.Exit(1)


class Quantization(StrEnum):
    int8 = "int8"
    int8_float32 = "int8_float32"
    int8_float16 = "int8_float16"
    int8_bfloat16 = "int8_bfloat16"
    int16 = "int16"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


@app.command()
def convert(
    src: Annotated[str, typer.Argument(help="HF checkpoint: a directory or a hub id.")],
    out: Annotated[Path, typer.Argument(help="Directory to write the CTranslate2 model to.")],
    quantization: Annotated[Quantization, typer.Option(
        help="Weight type: int8 for CPU, int8_float16 or float16 for CUDA.")] = Quantization.int8,
    force: Annotated[bool, typer.Option(help="Overwrite a non-empty OUT.")] = False,
) -> None:
    """Convert an NLLB-200, M2M-100 or Marian checkpoint for the CTranslate2 engine.

    OUT holds the model, the tokenizer files and the generation config; point
    THINKTRANS_LOCAL_MODEL at it. Serving it needs only 'thinktrans[ct2]' (no torch);
    converting needs 'thinktrans[local,ct2]'.
    """
    from service.ops.logs import no_progress_bars

    no_progress_bars()  # before transformers is imported: "Loading weights" is not output
    from models.local.convert import ConversionError
    from models.local.convert import convert as run_convert

    try:
        path = run_convert(src, out, quantization=quantization.value, force=force)
    except ConversionError as exc:
        raise _fail(str(exc), 3) from None
    except OSError as exc:
        raise _fail(f"cannot write {str(out)!r}: {exc.strerror or exc}", 3) from None
    typer.echo(str(path))


@app.command()
def pool(
    config: ConfigOpt = None,
    address: Annotated[str | None, typer.Option(
        help="Join this Ray cluster (e.g. ray://head:10001 or auto); unset: start one here."
    )] = None,
    host: Annotated[str, typer.Option(help="Address the pool's HTTP route binds to.")] = (
        "127.0.0.1"),
    port: Annotated[int, typer.Option(help="Port of the pool's HTTP route.")] = 8000,
) -> None:
    """Serve the local engine as a shared pool on Ray Serve, for sidecars whose backend is
    `pool` (THINKTRANS_POOL_URL). The model comes from the THINKTRANS_LOCAL_* settings; runs
    until SIGTERM. Needs 'thinktrans[pool]'."""
    from service.ops.logs import configure

    configure("info", log_text=False, transformers=False)
    settings = _settings(config)
    configure(settings.log_level, log_text=False, transformers=True)
    if address is None:
        try:
            _check_port(host, port)
        except ConfigError as exc:
            raise _fail(exc.detail, 2) from None
    try:
        from pool.deployment import run
    except ModuleNotFoundError as exc:
        raise _fail(f"{exc}", 2) from None
    try:
        run(settings, address=address, host=host, port=port)
    except ConfigError as exc:
        raise _fail(exc.detail, 2) from None
    except Exception as exc:  # Ray or Serve could not start it (a model that did not load)
        from models.base import first_line

        raise _fail(f"the pool did not start: {first_line(exc)}", 4) from None


@app.command()
def health(
    url: Annotated[str | None, typer.Option(
        help="Base URL to check (default: where the last `thinktrans serve` of this user "
        "listens, else THINKTRANS_PORT).")] = None,
    wait: Annotated[float, typer.Option(
        min=0, metavar="S", help="Ask again until it answers 200, S seconds at most: for a "
        "server just started in the background.")] = 0,
    ready: Annotated[bool, typer.Option(
        "--ready", metavar="", help="Ask /readyz (the backends can serve) instead of "
        "/healthz (the server answers).")] = False,
) -> None:
    """Check a running server's /healthz: exit 0 when it answers 200, 1 when not.

    The image's HEALTHCHECK runs the same check (python3 -m service.tools.healthcheck).
    """
    from service.tools import healthcheck as check

    healthy, line = check.wait(url, wait, "/readyz" if ready else "/healthz")
    typer.echo(line, err=not healthy)
    raise typer.Exit(0 if healthy else 1)


@app.command("make-test-model")
def make_test_model(
    outdir: Annotated[Path, typer.Argument(help="Directory to write the checkpoint to.")],
    family: Annotated[str | None, typer.Option(
        help="nllb, m2m100 or marian (default: nllb, or the shape's).")] = None,
    shape: Annotated[str | None, typer.Option(
        help="A real model's size instead of a tiny one: marian, m2m-418m or nllb-600m "
        "(random weights, a tokenizer of the full vocabulary; for measuring speed).")] = None,
    source: Annotated[str, typer.Option(
        "--source", help="Source language of the pair (BCP 47); Marian serves only its pair.")
    ] = "en",
    target: Annotated[str, typer.Option(
        "--target", help="Target language of the pair (BCP 47).")] = "de",
) -> None:
    """Write a random-weight checkpoint of a real model family (for tests, smoke runs, speed).

    Tiny by default; --shape gives a real model's size. Its files are readable by all
    (0644/0755), so a container's user can load it.
    """
    from service.ops.logs import no_progress_bars

    no_progress_bars()  # "Writing model shards" is not output
    try:
        from service.tools.testmodel import FAMILIES, SHAPES, language_code
        from service.tools.testmodel import make_test_model as build
    except ModuleNotFoundError as exc:
        raise _fail(f"make-test-model needs {exc.name!r}: pip install 'thinktrans[local]'",
                    2) from None
    if shape is not None and shape not in SHAPES:
        raise _fail(f"unknown shape {shape!r}; choose {', '.join(SHAPES)}", 3)
    family = family or (SHAPES[shape] if shape else "nllb")
    if family not in FAMILIES:
        raise _fail(f"unknown family {family!r}; choose nllb, m2m100 or marian", 3)
    for option, tag in (("--source", source), ("--target", target)):
        try:
            language_code(family, tag)
        except ValueError as exc:
            raise _fail(f"{option}: {exc}", 3) from None
    try:
        path = build(family, outdir, source_lang=source, target_lang=target, shape=shape)
    except ValueError as exc:  # a shape of another family
        raise _fail(str(exc), 3) from None
    except ModuleNotFoundError as exc:
        raise _fail(str(exc), 2) from None
    except OSError as exc:
        raise _fail(f"cannot write {str(outdir)!r}: {exc.strerror or exc}", 3) from None
    typer.echo(str(path))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
