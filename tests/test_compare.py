"""`thinktrans compare`: the command end to end, in-process, on real backends and doubles."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.ops.metrics import percentile
from service.tools.compare import bleu_tokenizer
from tests.fakes_remote import FakeChat, FakeDeepL, closed_port_url

runner = CliRunner()

TEXTS = [
    "Let me think about what the user wants.",
    "First, I need to check the file. Then I run the tests again.",
    "Das ist schon auf Deutsch.",
    "x = 1",
]


def compare(*args: str) -> Any:
    return runner.invoke(app, ["compare", *args])


def compare_json(*args: str) -> dict[str, Any]:
    result = compare(*args, "--format", "json")
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def by_backend(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["backend"]: b for b in report["backends"]}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def nllb_checkpoint(models: dict[str, Path]) -> Path:
    """The session's tiny random-weight NLLB checkpoint (tests/checkpoints.py)."""
    return models["nllb"]


def one_line_failure(result: Any, code: int, needle: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert needle in result.stderr, result.stderr


# -- passthrough ------------------------------------------------------------------------------


def test_table_on_passthrough(corpus: Path) -> None:
    result = compare("--to", "de", "--backend", "passthrough", "--corpus", str(corpus))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("thinktrans compare: 4 texts")
    assert "latency per text request" in out
    for row in ("segments", "latency p50 (ms/text)", "latency p95 (ms/text)", "segments/s",
                "est. cost (USD)"):
        assert row in out
    # No references: no score rows.
    assert "chrF" not in out
    assert result.stderr == ""


def test_json_shape_and_counts(corpus: Path) -> None:
    report = compare_json("--to", "de", "--backend", "passthrough", "--corpus", str(corpus),
                          "--concurrency", "2")
    assert report["target"] == "de" and report["texts"] == 4 and report["concurrency"] == 2
    assert report["references"] == 0
    assert report["deadline_ms"] == 600_000  # compare's own, not the service's 3000
    (b,) = report["backends"]
    assert b["backend"] == "passthrough"
    assert b["texts"] == 4
    assert b["characters"] == sum(len(t) for t in TEXTS)
    # English sentences are translated, the German one is kept, code is skipped.
    assert b["statuses"] == {"translated": 3, "same_language": 1, "skipped": 1}
    assert b["segments"] == 5 and b["errors"] == 0
    assert set(b["latency_ms"]) == {"p50", "p95", "p99", "mean"}
    assert 0 < b["latency_ms"]["p50"] <= b["latency_ms"]["p95"] <= b["latency_ms"]["p99"]
    assert b["segments_per_s"] > 0 and b["characters_per_s"] > 0
    assert b["billed_characters"] == 0 and b["cost_usd"] is None
    assert b["chrf"] is None and b["bleu"] is None


def test_span_survival_and_glossary_terms_per_backend(tmp_path: Path) -> None:
    corpus = tmp_path / "spans.txt"
    corpus.write_text("Open a pull request for config.yaml now.\nHello there, my friend.\n",
                      encoding="utf-8")
    glossary = tmp_path / "glossary.yaml"
    glossary.write_text("terms: {pull request: 拉取请求}\nkeep: [now]\n", encoding="utf-8")
    report = compare_json("--to", "zh-CN", "--backend", "passthrough", "--corpus", str(corpus),
                          "--glossary", str(glossary))
    (b,) = report["backends"]
    assert (b["span_segments"], b["spans_intact"]) == (1, 1.0)
    assert (b["glossary_terms"], b["glossary_applied"]) == (1, 1.0)
    table = compare("--to", "zh-CN", "--backend", "passthrough", "--corpus", str(corpus),
                    "--glossary", str(glossary)).stdout
    assert "spans intact (%)" in table and "applied (%)" in table


def test_span_survival_counts_what_lost_a_span_or_a_term() -> None:
    from service.schemas import SegmentResult
    from service.tools.compare import CompareConfig, span_survival

    def seg(original: str, text: str, status: str = "translated") -> SegmentResult:
        return SegmentResult(index=0, original=original, text=text, source_lang="en",
                             target="zh-CN", status=status, backend="x", queued_ms=0,
                             latency_ms=0)

    config = CompareConfig(target="zh-CN", labels=["x"], items=[], refs=[],
                           glossary={"terms": {"merge": "合并"}, "keep": []})
    figures = span_survival([
        seg("Read config.yaml first. ", "先读 config.yaml。"),
        seg("Merge main.py now. ", "现在 main.py 合并。"),
        seg("Merge main.py now. ", "现在合并。"),  # lost main.py (the service: an error)
        seg("Merge it now. ", "Merge it now. ", status="error"),
        seg("No spans here. ", "这里没有。"),
    ], config)
    assert figures == {"span_segments": 4, "spans_intact": 0.5, "glossary_terms": 3,
                       "glossary_applied": round(2 / 3, 4)}


def test_a_bad_glossary_file_fails_before_anything_runs(tmp_path: Path) -> None:
    bad = tmp_path / "glossary.yaml"
    bad.write_text("terms: {a: ''}\n", encoding="utf-8")
    result = compare("--to", "de", "--backend", "passthrough", "--glossary", str(bad))
    assert result.exit_code == 3, result.output  # bad input, as a missing corpus
    assert "blank" in result.stderr


def test_builtin_corpus_by_default() -> None:
    report = compare_json("--to", "de", "--backend", "passthrough")
    assert report["corpus"] == "built-in sample"
    assert report["texts"] == 12


def test_markdown(corpus: Path) -> None:
    result = compare("--to", "fr", "--backend", "passthrough", "--corpus", str(corpus),
                     "--format", "markdown")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("4 texts (")
    assert lines[2] == "|  | passthrough |"
    assert lines[3] == "| --- | ---: |"
    table = [line for line in lines[2:]]
    assert all(line.startswith("| ") and line.endswith(" |") for line in table)
    assert any(line.startswith("| latency p95 (ms/text) | ") for line in table)


def test_plot_writes_png(corpus: Path, tmp_path: Path) -> None:
    png = tmp_path / "out.png"
    result = compare("--to", "de", "--backend", "passthrough", "--corpus", str(corpus),
                     "--plot", str(png))
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}" in result.stderr


def test_plot_legend_leaves_the_title_whole(corpus: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure as saved: the legend overlaps neither the title nor the plots, and the
    title stays inside the figure, also with a long corpus path in it."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    long_dir = tmp_path / ("a-rather-long-directory-name-for-the-corpus-" * 2)
    long_dir.mkdir()
    long_corpus = long_dir / f"thinking-sample-with-a-long-name{corpus.suffix}"
    shutil.copy(corpus, long_corpus)
    saved: list[Any] = []
    original = Figure.savefig

    def savefig(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.canvas.draw()  # lay it out as the file will have it
        renderer = self.canvas.get_renderer()
        saved.append({
            "figure": self.bbox,
            "title": self._suptitle.get_window_extent(renderer),
            "legend": self.legends[0].get_window_extent(renderer),
            "axes": [ax.get_tightbbox(renderer) for ax in self.axes],
        })
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    png = tmp_path / "out.png"
    for path in (corpus, long_corpus):
        result = compare("--to", "de", "--backend", "passthrough", "--corpus", str(path),
                         "--plot", str(png))
        assert result.exit_code == 0, result.output
    for box in saved:
        assert not box["legend"].overlaps(box["title"]), box
        assert not any(box["legend"].overlaps(ax) for ax in box["axes"]), box
        fig, title = box["figure"], box["title"]
        assert fig.x0 <= title.x0 and title.x1 <= fig.x1, box
    assert len(saved) == 2


# -- references -------------------------------------------------------------------------------


def test_refs_equal_to_source_score_100_for_passthrough(corpus: Path, tmp_path: Path) -> None:
    refs = tmp_path / "refs.txt"
    refs.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    report = compare_json("--to", "de", "--backend", "passthrough", "--corpus", str(corpus),
                          "--refs", str(refs))
    b = report["backends"][0]
    assert report["references"] == 4
    assert b["chrf"] == 100.0 and b["bleu"] == 100.0 and b["bleu_tokenize"] == "13a"


def test_refs_from_jsonl_and_tsv(tmp_path: Path) -> None:
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(
        json.dumps({"text": "Let me check the file.", "ref": "Let me check the file."}) + "\n"
        + json.dumps({"text": "Then I run the tests.", "ref": "Dann führe ich die Tests aus."})
        + "\n" + json.dumps({"text": "No reference here."}) + "\n",
        encoding="utf-8",
    )
    report = compare_json("--to", "de", "--backend", "passthrough", "--corpus", str(jsonl))
    assert report["references"] == 2  # the third text has none and is not scored
    assert 0 < report["backends"][0]["chrf"] < 100

    tsv = tmp_path / "c.tsv"
    tsv.write_text("Let me check the file.\tLet me check the file.\n", encoding="utf-8")
    report = compare_json("--to", "de", "--backend", "passthrough", "--corpus", str(tsv))
    assert report["backends"][0]["chrf"] == 100.0


def test_refs_table_rows_and_cjk_tokenizer(tmp_path: Path) -> None:
    tsv = tmp_path / "c.tsv"
    tsv.write_text("Let me check the file.\t让我检查一下文件。\n", encoding="utf-8")
    result = compare("--to", "zh-CN", "--backend", "passthrough", "--corpus", str(tsv))
    assert result.exit_code == 0, result.output
    assert "chrF" in result.stdout and "BLEU (zh)" in result.stdout


def test_bleu_tokenizer_choice() -> None:
    assert bleu_tokenizer("de") == "13a"
    assert bleu_tokenizer("zh-Hant-TW") == "zh"
    # Without MeCab or a cached Flores-200 model: characters, never a download.
    assert bleu_tokenizer("ja") in {"ja-mecab", "flores200", "char"}
    assert bleu_tokenizer("th") in {"flores200", "char"}


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (
        50.0, 95.0, 99.0)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([5.0], 99) == 5.0


# -- the local backend -----------------------------------------------------------------------


def test_local_checkpoint_against_passthrough(
    nllb_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINKTRANS_LOCAL_MODEL", str(nllb_checkpoint))
    # A service setting that would make a CPU model miss every deadline; compare ignores it.
    monkeypatch.setenv("THINKTRANS_DEADLINE_MS", "1")
    small = tmp_path / "small.txt"
    small.write_text("Hello, the user said hello.\nLet me check the file.\n", encoding="utf-8")
    png = tmp_path / "both.png"
    report = compare_json("--to", "de", "--backend", "passthrough", "--backend", "local",
                          "--corpus", str(small), "--plot", str(png), "--price", "local=2")
    b = by_backend(report)
    assert list(b) == ["passthrough", "local"]
    local = b["local"]
    assert local["segments"] == 2
    # Random weights: garbage that the output-language check may refuse, but every segment
    # was answered by the model (translated or refused), none ran out of time.
    assert local["statuses"].get("deadline", 0) == 0
    assert local["statuses"].get("translated", 0) + local["statuses"].get("error", 0) == 2
    assert local["latency_ms"]["p50"] > b["passthrough"]["latency_ms"]["p50"]
    assert local["ready_s"] > 0
    # Unbilled, but priced: cost from the characters it translated.
    translated_chars = local["characters_per_s"] * local["wall_s"]
    assert local["cost_usd"] == pytest.approx(translated_chars * 2 / 1e6, rel=0.05, abs=1e-6)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- billed backends and cost -----------------------------------------------------------------


def test_deepl_cost_from_billed_characters(
    deepl_server: FakeDeepL, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deepl_server.reset()
    monkeypatch.setenv("THINKTRANS_DEEPL_API_KEY", "fake:fx")
    monkeypatch.setenv("THINKTRANS_DEEPL_SERVER_URL", deepl_server.origin)
    # The double answers "[DE] <English text>": not German, so the check would refuse it.
    monkeypatch.setenv("THINKTRANS_CHECK_OUTPUT_LANGUAGE", "false")
    report = compare_json("--to", "de", "--backend", "deepl", "--backend", "passthrough",
                          "--corpus", str(corpus))
    b = by_backend(report)
    deepl = b["deepl"]
    sent = [t for r in deepl_server.translate_requests for t in r.json["text"]]
    assert deepl["statuses"]["translated"] == len(sent) == 3
    assert deepl["billed_characters"] == sum(len(t) for t in sent)
    # settings.price_per_million_chars: deepl 25 by default.
    assert deepl["price_per_million_chars"] == {"deepl": 25.0}
    assert deepl["cost_usd"] == pytest.approx(deepl["billed_characters"] * 25 / 1e6)
    assert b["passthrough"]["billed_characters"] == 0

    deepl_server.reset()
    report = compare_json("--to", "de", "--backend", "deepl", "--corpus", str(corpus),
                          "--price", "deepl=20")
    deepl = report["backends"][0]
    assert deepl["cost_usd"] == pytest.approx(deepl["billed_characters"] * 20 / 1e6)


@pytest.fixture
def llm_env(chat_server: FakeChat, monkeypatch: pytest.MonkeyPatch) -> FakeChat:
    """The chat double, reset, as the llm backend's endpoint."""
    chat_server.reset()
    monkeypatch.setenv("THINKTRANS_LLM_BASE_URL", f"{chat_server.origin}/v1")
    monkeypatch.setenv("THINKTRANS_LLM_MODEL", "fake-model")
    monkeypatch.setenv("THINKTRANS_CHECK_OUTPUT_LANGUAGE", "false")
    return chat_server


def test_llm_chain_cost(llm_env: FakeChat, corpus: Path) -> None:
    chat_server = llm_env
    report = compare_json("--to", "de", "--backend", "llm,passthrough", "--corpus", str(corpus),
                          "--price", "llm=10")
    (b,) = report["backends"]
    assert b["backend"] == "llm,passthrough"
    assert b["statuses"]["translated"] == 3 and chat_server.chat_requests
    assert b["billed_characters"] > 0
    assert b["cost_usd"] == pytest.approx(b["billed_characters"] * 10 / 1e6)


def test_llm_prompt_styles_side_by_side(llm_env: FakeChat, corpus: Path) -> None:
    chat_server = llm_env
    report = compare_json("--to", "de", "--backend", "llm:json", "--backend", "llm:plain",
                          "--corpus", str(corpus))
    rows = by_backend(report)
    assert list(rows) == ["llm:json", "llm:plain"]
    assert all(row["statuses"]["translated"] == 3 for row in rows.values())
    bodies = [rec.json for rec in chat_server.chat_requests]
    json_style = [b for b in bodies if b["messages"][0]["role"] == "system"]
    plain = [b for b in bodies if len(b["messages"]) == 1]
    assert json_style and len(json_style) + len(plain) == len(bodies)
    # The plain style: one segment a request, in the generic template, nothing else.
    assert len(plain) == 3  # one request a translated text
    assert all(b["messages"][0]["content"].startswith("Translate the following text into German")
               for b in plain)


def test_a_variant_its_backend_lacks() -> None:
    one_line_failure(compare("--to", "de", "--backend", "llm:fast"), 3,
                     "backend 'llm' has no variant 'fast' (choose from llm:json, llm:plain)")
    one_line_failure(compare("--to", "de", "--backend", "passthrough:plain"), 3,
                     "has no variant 'plain' (choose from none)")


# -- bad input: one line, non-zero exit --------------------------------------------------------


def test_unknown_backend() -> None:
    one_line_failure(compare("--to", "de", "--backend", "passthrough", "--backend", "nope"),
                     3, "unknown backend 'nope'; choose from deepl, llm, local, passthrough")


def test_backend_named_twice() -> None:
    one_line_failure(compare("--to", "de", "--backend", "passthrough", "--backend",
                             "passthrough"), 3, "named twice")


def test_missing_corpus(tmp_path: Path) -> None:
    one_line_failure(compare("--to", "de", "--backend", "passthrough", "--corpus",
                             str(tmp_path / "nope.txt")), 3, "does not exist")


def test_corpus_line_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    one_line_failure(compare("--to", "de", "--backend", "passthrough", "--corpus", str(bad)),
                     3, "line 2 is not valid JSON")


def test_refs_count_mismatch(corpus: Path, tmp_path: Path) -> None:
    refs = tmp_path / "refs.txt"
    refs.write_text("one\ntwo\n", encoding="utf-8")
    one_line_failure(compare("--to", "de", "--backend", "passthrough", "--corpus", str(corpus),
                             "--refs", str(refs)), 3, "has 2 lines, the corpus 4 texts")


def test_unreachable_deepl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_DEEPL_API_KEY", "fake:fx")
    monkeypatch.setenv("THINKTRANS_DEEPL_SERVER_URL", closed_port_url())
    one_line_failure(compare("--to", "de", "--backend", "passthrough", "--backend", "deepl"),
                     4, "backend 'deepl' is not ready: cannot reach DeepL")


def test_deepl_without_key() -> None:
    one_line_failure(compare("--to", "de", "--backend", "deepl"), 4,
                     "set THINKTRANS_DEEPL_API_KEY")


def test_unreachable_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_LLM_BASE_URL", f"{closed_port_url()}/v1")
    monkeypatch.setenv("THINKTRANS_LLM_MODEL", "m")
    one_line_failure(compare("--to", "de", "--backend", "llm"), 4,
                     "backend 'llm' is not ready: cannot reach")


def test_missing_local_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_LOCAL_MODEL", str(tmp_path / "no-such-model"))
    one_line_failure(compare("--to", "de", "--backend", "local"), 4,
                     "backend 'local' is not ready: model directory")


def test_broken_local_checkpoint_fails_at_once(
    nllb_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A load that fails with "loading model ... failed": waiting must end, not poll on.
    broken = tmp_path / "broken"
    shutil.copytree(nllb_checkpoint, broken)
    (broken / "model.safetensors").write_bytes(b"\0" * 100)
    monkeypatch.setenv("THINKTRANS_LOCAL_MODEL", str(broken))
    one_line_failure(compare("--to", "de", "--backend", "local"), 4,
                     f"backend 'local' is not ready: loading model {str(broken)!r} failed")


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--price", "deepl"], 3, "--price 'deepl': write BACKEND=USD_PER_MILLION_CHARS"),
        (["--price", "deepl=-1"], 3, "--price 'deepl=-1'"),
        (["--concurrency", "0"], 3, "--concurrency must be >= 1, got 0"),
        (["--deadline-ms", "0"], 3, "--deadline-ms must be > 0, got 0"),
        (["--plot", "/no/such/dir/x.png"], 3, "its directory does not exist"),
    ],
)
def test_bad_options(args: list[str], code: int, needle: str) -> None:
    one_line_failure(compare("--to", "de", "--backend", "passthrough", *args), code, needle)


def test_unknown_format_is_a_usage_error_listing_the_choices() -> None:
    result = compare("--to", "de", "--backend", "passthrough", "--format", "xml")
    assert result.exit_code == 2, result.output
    # typer draws the message in a box, wrapped to the terminal: read the words only.
    words = " ".join(re.sub(r"[\u2500-\u257f]", " ", result.stderr).split())
    assert "'xml' is not one of 'table', 'json', 'markdown'." in words, result.stderr


def test_bad_locale() -> None:
    one_line_failure(compare("--to", "de_DE", "--backend", "passthrough"), 3, "use '-'")
