"""models/local/checkpoint.py alone: specs, the family, the languages, reasons, the hub probe
and fingerprints. The family and codes are read from the test checkpoints' real tokenizers
(``service.tools.testmodel``, loaded with ``AutoTokenizer.from_pretrained``); no hub."""

from __future__ import annotations

import http.server
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from models.errors import BackendConfigError
from models.languages import table_key, table_keys
from models.local import checkpoint
from models.local.checkpoint import (
    FALLBACK_SOURCE,
    M2M_CODES,
    NLLB_CODES,
    LoadError,
    Spec,
    cache_only,
    detect_family,
    directory_fingerprint,
    hub_unreachable,
    lang_token_id,
    language_codes,
    licence,
    marian_pair,
    model_specs,
    not_found_reason,
    parse_pair_spec,
    version,
)
from service.text.tags import canonicalize

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


# -- the language table and model specs ------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "nllb", "m2m"),
    [("zh-CN", "zho_Hans", "zh"), ("zh-Hant-TW", "zho_Hant", "zh"), ("zh-TW", "zho_Hant", "zh"),
     ("zh", "zho_Hans", "zh"), ("ja-JP", "jpn_Jpan", "ja"), ("en", "eng_Latn", "en"),
     ("pt-BR", "por_Latn", "pt"), ("de", "deu_Latn", "de"), ("ko", "kor_Hang", "ko"),
     ("no", "nob_Latn", "no"), ("yo", "yor_Latn", "yo"), ("am", "amh_Ethi", "am"),
     ("ms-MY", "zsm_Latn", "ms"), ("nso", "nso_Latn", "ns"), ("tl", "tgl_Latn", "tl"),
     ("sr-Cyrl", "srp_Cyrl", "sr"), ("ks-Deva", "kas_Deva", None), ("ace", "ace_Latn", None),
     ("ace-Arab", "ace_Arab", None), ("yue-HK", "yue_Hant", None), ("te", "tel_Telu", None),
     ("br", None, "br"), ("fy", None, "fy")],
)
def test_backend_codes(tag: str, nllb: str | None, m2m: str | None) -> None:
    key = table_key(canonicalize(tag))
    assert (NLLB_CODES.get(key), M2M_CODES.get(key)) == (nllb, m2m)


def test_every_nllb_and_m2m100_code_has_a_tag() -> None:
    """The tables hold every language code of the models' own tokenizers (transformers'
    lists): each under the canonical BCP 47 tag that reaches it, which the code's own
    ``lang-Script`` reaches too (``yor-Latn`` is ``yo``, ``kas-Deva`` is ``ks-Deva``)."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES as M2M
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as NLLB

    assert sorted(NLLB_CODES.values()) == sorted(NLLB) and len(NLLB_CODES) == 202
    assert set(M2M_CODES.values()) == set(M2M["m2m100"]) and len(M2M_CODES) == 101
    for key in {*NLLB_CODES, *M2M_CODES}:
        assert canonicalize(key) == key and table_keys(key)[0] == key, key
    for key, flores in NLLB_CODES.items():
        language, script = flores.split("_")
        assert key in table_keys(canonicalize(f"{language}-{script}")), (flores, key)


def test_pair_specs() -> None:
    assert parse_pair_spec("en-de=/models/x") == (("en", "de"), "/models/x")
    assert parse_pair_spec("en-zh-TW=hub/id") == (("en", "zh-Hant"), "hub/id")
    assert parse_pair_spec("no-en=d") == (("nb", "en"), "d")
    assert parse_pair_spec("/models/en-de=x") == (None, "/models/en-de=x")
    assert parse_pair_spec("Helsinki-NLP/opus-mt-en-de") == (None, "Helsinki-NLP/opus-mt-en-de")


def test_model_specs_from_the_single_model_settings() -> None:
    specs = model_specs("facebook/nllb", ["en-de=/m/opus", "en-zh-TW=hub/zh"])
    assert specs == [
        Spec("facebook/nllb"),
        Spec("/m/opus", ("en", "de"), marian_only=True),
        Spec("hub/zh", ("en", "zh-Hant"), marian_only=True),
    ]
    assert model_specs("en-de=/m/opus") == [Spec("/m/opus", ("en", "de"))]


def test_model_specs_list_replaces_the_single_model_settings() -> None:
    specs = model_specs("ignored", ["en-de=/ignored"], ["en-de=/m/opus", "facebook/m2m"])
    assert specs == [Spec("/m/opus", ("en", "de"), setting="THINKTRANS_LOCAL_MODELS"),
                     Spec("facebook/m2m", setting="THINKTRANS_LOCAL_MODELS")]


@pytest.mark.parametrize(
    ("model", "marian", "models", "needle"),
    [
        ("", (), (), "local_model (THINKTRANS_LOCAL_MODEL) is empty"),
        ("x", ("Helsinki-NLP/opus-mt-en-de",), (), "'src-tgt=ID_OR_DIR'"),
        ("x", ("en-de=",), (), "'src-tgt=ID_OR_DIR'"),
        ("x", (), ("a", "en-de="), "local_models (THINKTRANS_LOCAL_MODELS) has an empty entry"),
    ],
)
def test_malformed_model_specs_are_config_errors(
    model: str, marian: tuple[str, ...], models: tuple[str, ...], needle: str
) -> None:
    with pytest.raises(BackendConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        model_specs(model, marian, models)


# -- the family ---------------------------------------------------------------------------------


class NllbTokenizerFast:
    """Named as transformers' class is: the name is what tells NLLB apart."""

    def get_vocab(self) -> dict[str, int]:
        return {}


class M2M100Tokenizer:
    def __init__(self) -> None:
        self.lang_code_to_id: dict[str, int] = {}

    def get_lang_id(self, code: str) -> int:
        return 0


class PreTrainedTokenizerFast:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


class MarianTokenizer:
    pass


@pytest.mark.parametrize(
    ("model_type", "tokenizer", "family"),
    [
        ("marian", PreTrainedTokenizerFast({}), "marian"),
        (None, MarianTokenizer(), "marian"),  # a converted model without thinktrans-ct2.json
        ("m2m_100", NllbTokenizerFast(), "nllb"),
        ("nllb-moe", NllbTokenizerFast(), "nllb"),
        ("m2m_100", M2M100Tokenizer(), "m2m100"),
        ("m2m_100", PreTrainedTokenizerFast({"eng_Latn": 5}), "nllb"),  # flores tokens
        ("m2m_100", PreTrainedTokenizerFast({"hello": 5}), None),
        ("t5", NllbTokenizerFast(), None),  # the config decides, whatever the tokenizer
    ],
)
def test_detect_family(model_type: str | None, tokenizer: Any, family: str | None) -> None:
    config = SimpleNamespace(model_type=model_type) if model_type else SimpleNamespace()
    assert detect_family(config, tokenizer) == family


# -- languages ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(models: dict[str, Path]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {family: AutoTokenizer.from_pretrained(models[family])
            for family in ("nllb", "m2m100", "marian")}


def test_language_codes_of_each_family(tokenizers: dict[str, Any]) -> None:
    source, codes, drop = language_codes("nllb", Spec("n"), tokenizers["nllb"])
    assert source is None and codes == NLLB_CODES
    nllb = tokenizers["nllb"]
    assert nllb.convert_tokens_to_ids("deu_Latn") in drop and nllb.eos_token_id in drop
    assert lang_token_id("nllb", nllb, "deu_Latn") == nllb.convert_tokens_to_ids("deu_Latn")

    m2m = tokenizers["m2m100"]
    source, codes, drop = language_codes("m2m100", Spec("m"), m2m)
    assert source is None and codes == {k: v for k, v in M2M_CODES.items() if k != "te"}
    assert m2m.get_lang_id("de") in drop
    assert lang_token_id("m2m100", m2m, "de") == m2m.get_lang_id("de")

    source, codes, drop = language_codes("marian", Spec("x"), tokenizers["marian"])
    assert (source, codes) == ("en", {"de": ""})  # the tokenizer's saved source/target_lang


def test_marian_pair_order_of_precedence() -> None:
    saved = SimpleNamespace(init_kwargs={"source_lang": "en", "target_lang": "de"})
    bare = SimpleNamespace(init_kwargs={})
    assert marian_pair(Spec("/m/opus-mt-fr-it", ("en", "ja")), saved) == ("en", {"ja": ""})
    assert marian_pair(Spec("/m/opus-mt-fr-it"), saved) == ("en", {"de": ""})
    assert marian_pair(Spec("/m/opus-mt-fr-it/"), bare) == ("fr", {"it": ""})
    with pytest.raises(LoadError, match="'en-de=/m/nameless'"):
        marian_pair(Spec("/m/nameless"), bare)


def test_a_multi_target_marian_serves_each_target_token() -> None:
    multi = SimpleNamespace(init_kwargs={},
                            supported_language_codes=[">>fra<<", ">>por<<", ">>xx<<", ">>fr<<"])
    assert marian_pair(Spec("/m/opus-mt-en-ROMANCE"), multi) == (
        FALLBACK_SOURCE, {"fr": ">>fra<<", "pt": ">>por<<"})
    # A pair naming one of its targets narrows it to that one.
    assert marian_pair(Spec("/m/x", ("en", "pt")), multi) == ("en", {"pt": ">>por<<"})


# -- reasons, the hub probe, fingerprints -------------------------------------------------------


def test_not_found_reasons_say_what_to_set(tmp_path: Path) -> None:
    error = OSError("no config.json\nsecond line")
    missing = not_found_reason(str(tmp_path / "gone"), error)
    assert "does not exist" in missing and "THINKTRANS_LOCAL_MODEL" in missing
    empty = not_found_reason(str(tmp_path), error, "THINKTRANS_LOCAL_MODELS")
    assert "not a loadable checkpoint directory (no config.json)" in empty
    assert "THINKTRANS_LOCAL_MODELS" in empty and "second line" not in empty
    hub = not_found_reason("nobody/none", error)
    assert "'nobody/none' not found locally" in hub and "HF_HUB_OFFLINE=1" in hub


def test_the_no_model_hint_proposes_a_family_that_serves_what_the_model_would() -> None:
    """Without the default model, the hint's test model has its family's languages (NLLB-200's
    202), not a Marian pair's one target; an M2M-100 id gets an M2M-100 one."""
    error = OSError("offline")
    default = not_found_reason("facebook/nllb-200-distilled-600M", error)
    assert "`thinktrans make-test-model --family nllb DIR`" in default, default
    assert "marian" not in default
    m2m = not_found_reason("facebook/m2m100_418M", error, "THINKTRANS_LOCAL_MODELS")
    assert "--family m2m100 DIR` and THINKTRANS_LOCAL_MODELS=DIR" in m2m, m2m


def test_the_weights_licence_by_family_and_publisher() -> None:
    nllb = licence("nllb", "/models/any")
    assert nllb is not None and "CC-BY-NC 4.0" in nllb and "non-commercial" in nllb
    assert "M2M-100 (MIT)" in nllb and "CC-BY 4.0" in nllb
    assert licence(None, "facebook/nllb-200-distilled-600M") == nllb
    assert "MIT" in str(licence(None, "facebook/m2m100_418M"))
    assert "CC-BY 4.0" in str(licence(None, "Helsinki-NLP/opus-mt-en-de"))
    assert licence(None, "/models/mine") is None and licence(None, "someone/nllb") is None


@pytest.mark.skipif(os.getuid() == 0, reason="root reads every file")
def test_an_unreadable_checkpoint_file_is_named(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    weights.chmod(0o000)
    assert "cannot read model.safetensors" in not_found_reason(str(tmp_path), OSError("x"))


def test_the_hub_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    assert not hub_unreachable(str(tmp_path))  # a directory: no probe
    # A port nothing listens on: the connection is refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert hub_unreachable("org/model", timeout_s=5)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert not hub_unreachable("org/model")  # offline already: the client never tries


@contextmanager
def hub_answering(status: int | None) -> Iterator[tuple[str, list[str]]]:
    """A hub on 127.0.0.1 that answers every request ``status`` (None: closes the connection
    without a word); its URL and the requests it saw."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            seen.append(f"{self.command} {self.path}")
            if status is None:
                self.close_connection = True
                return
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "unreachable"), [
    (200, False), (404, False), (401, False),  # a hub that answers (a gated model: 401)
    (503, True), (502, True), (None, True),  # a proxy whose hub is down; a closed connection
])
def test_the_hub_probe_asks_once_and_reads_the_answer(
        monkeypatch: pytest.MonkeyPatch, status: int | None, unreachable: bool) -> None:
    from huggingface_hub import constants

    with hub_answering(status) as (url, seen):
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        assert hub_unreachable("org/model", timeout_s=30) is unreachable
    assert seen == ["HEAD /org/model/resolve/main/config.json"]  # one request, no retry


def test_an_uncached_hub_id_without_its_hub_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert cache_only(Spec(str(tmp_path))) is False  # a directory: no probe, no cache
    with hub_answering(503) as (url, _):
        monkeypatch.setattr(constants, "ENDPOINT", url)
        with pytest.raises(LoadError, match=f"the hub {url} cannot serve it now, and "):
            cache_only(Spec("org/model"))
        # In the cache: loaded from there, without the hub.
        snapshot = tmp_path / "models--org--model" / "snapshots" / "abc"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
        (tmp_path / "models--org--model" / "refs").mkdir()
        (tmp_path / "models--org--model" / "refs" / "main").write_text("abc")
        assert cache_only(Spec("org/model")) is True
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(LoadError, match="HF_HUB_OFFLINE is set"):
        cache_only(Spec("org/other"))


def test_a_directory_fingerprint_follows_its_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    first = directory_fingerprint(tmp_path)
    assert first == directory_fingerprint(tmp_path) == version(str(tmp_path))
    (tmp_path / "config.json").write_text('{"d_model": 32}')  # another size
    second = directory_fingerprint(tmp_path)
    assert second != first
    stat = (tmp_path / "config.json").stat()
    os.utime(tmp_path / "config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert directory_fingerprint(tmp_path) != second  # replaced in place: a new time
    assert version("org/model") == ""  # a hub id: not known without the hub
    assert checkpoint.version(str(tmp_path / "gone")) == ""
