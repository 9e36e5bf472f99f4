"""Several local models: a pair goes to the first model that serves it, a request may name a
model, and a model that is not configured is loaded on demand (LRU-bounded).

Tiny real checkpoints (``service.tools.testmodel``), built once for the module and loaded
through the real ``from_pretrained`` path; the hub is off. Tests run on transformers alone
(loading is quickest there), the routing test on both engines.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")
pytest.importorskip("transformers", reason="needs the local extra: pip install 'thinktrans[local]'")

from models.errors import BackendUnavailable, UnsupportedLanguage
from models.local import M2M_CODES, LocalTranslator, catalog
from models.local.checkpoint import directory_fingerprint
from tests.test_local import (  # noqa: F401 - autouse fixtures and the parametrize hook
    TEXTS,
    _offline,
    engine,
    make_backend,
    pytest_generate_tests,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
    pytest.mark.engines("transformers"),
]

LOADING = "on demand; it serves once loaded"


@pytest.fixture(scope="module")
def ckpt(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Marian en-de, M2M-100, Marian en-ja (the session's, tests/checkpoints.py), and a copy
    of the en-de one at another path."""
    paths = {"marian": models["marian"], "m2m": models["m2m100"],
             "marian-ja": models["marian-en-ja"]}
    copy = tmp_path_factory.mktemp("models") / "marian-copy"
    paths["marian-copy"] = Path(shutil.copytree(models["marian"], copy))
    return {name: str(path) for name, path in paths.items()}


def build(*models: str, **overrides: Any) -> LocalTranslator:
    """From ``local_*`` settings through the registry; ``local_model`` is set to something
    else on purpose: ``local_models`` replaces it. Models named on demand may come from the
    temporary directory, where the tests' checkpoints are."""
    overrides.setdefault("local_model_roots", [tempfile.gettempdir()])
    return make_backend("nobody/ignored", local_models=list(models), **overrides)


async def started(*models: str, **overrides: Any) -> LocalTranslator:
    backend = build(*models, **overrides)
    await backend.start()
    assert await backend.wait_ready(timeout_s=120), backend.reason
    return backend


def batches(backend: LocalTranslator) -> dict[str, int]:
    """Batches each loaded model has run, configured and extra (counted by the worker)."""
    slots = [*backend._catalog.slots, *backend._catalog.extras.slots().values()]
    return {slot.model_id: slot.batches for slot in slots}


async def settled(backend: LocalTranslator, model: str, timeout_s: float = 60) -> str | None:
    """Ask ``model_problem`` until the model is no longer loading; its last answer."""
    give_up = time.monotonic() + timeout_s
    while True:
        problem = backend.model_problem(model)
        if problem is None or LOADING not in problem:
            return problem
        assert time.monotonic() < give_up, f"{model!r} still loading after {timeout_s} s"
        await asyncio.sleep(0.05)


# -- routing by pair --------------------------------------------------------------------------


@pytest.mark.engines("transformers", "ctranslate2")
async def test_each_pair_goes_to_the_first_model_that_serves_it(ckpt: dict[str, str]) -> None:
    backend = await started(f"en-de={ckpt['marian']}", ckpt["m2m"])
    alone = await started(ckpt["marian"])
    try:
        assert backend.model_id == ckpt["marian"]
        assert backend.resolve_model(None, "en", "de") == ckpt["marian"]
        assert backend.resolve_model(None, "en", "fr") == ckpt["m2m"]
        assert backend.resolve_model(None, "fr", "de") == ckpt["m2m"]  # Marian is en-de only
        assert backend.resolve_model(None, "en", "tlh") is None
        assert backend.supports("fr", "de") and not backend.supports("en", "tlh")
        assert backend.languages() == sorted(M2M_CODES)

        before = batches(backend)
        out_de = await backend.translate(TEXTS, source="en", target="de")
        after_de = batches(backend)
        assert after_de[ckpt["marian"]] == before[ckpt["marian"]] + 1
        assert after_de[ckpt["m2m"]] == before[ckpt["m2m"]]
        # What the Marian model alone gives: that is the model that ran.
        assert out_de == await alone.translate(TEXTS, source="en", target="de")
        await backend.translate(TEXTS, source="en", target="fr")
        after_fr = batches(backend)
        assert after_fr[ckpt["m2m"]] == after_de[ckpt["m2m"]] + 1
        assert after_fr[ckpt["marian"]] == after_de[ckpt["marian"]]
    finally:
        await backend.aclose()
        await alone.aclose()
    # The order is the preference: M2M first takes en-de too.
    reverse = await started(ckpt["m2m"], f"en-de={ckpt['marian']}")
    try:
        assert reverse.resolve_model(None, "en", "de") == ckpt["m2m"]
        assert reverse.model_id == ckpt["m2m"]
    finally:
        await reverse.aclose()


async def test_a_named_configured_model_serves_alone(ckpt: dict[str, str]) -> None:
    marian, m2m = ckpt["marian"], ckpt["m2m"]
    backend = await started(f"en-de={marian}", m2m)
    try:
        by_default = await backend.translate(TEXTS, source="en", target="de")
        before = batches(backend)
        named_m2m = await backend.translate(TEXTS, source="en", target="de", model=m2m)
        assert batches(backend) == {marian: before[marian], m2m: before[m2m] + 1}
        named_marian = await backend.translate(TEXTS, source="en", target="de", model=marian)
        assert batches(backend) == {marian: before[marian] + 1, m2m: before[m2m] + 1}
        # Each call ran on its own model: the two random-weight models disagree.
        assert named_marian == by_default and named_m2m != by_default
        assert all(named_m2m)
        assert backend.model_problem(m2m) is None
        assert backend.resolve_model(m2m, "en", "de") == m2m

        # A named model that cannot serve the pair is not replaced by one that can.
        needle = re.escape(f"model '{marian}' cannot translate en -> fr")
        with pytest.raises(UnsupportedLanguage, match=needle):
            await backend.translate(["Hello."], source="en", target="fr", model=marian)
        assert backend.resolve_model(marian, "en", "fr") is None
        assert backend.cache_identity(marian, "en", "fr") is None
    finally:
        await backend.aclose()


# -- models loaded on demand ------------------------------------------------------------------


async def test_an_unlisted_model_loads_on_demand_beside_the_batch_worker(
    ckpt: dict[str, str],
) -> None:
    backend = await started(ckpt["marian"])
    extra, second = ckpt["marian-ja"], ckpt["marian-copy"]
    gate = threading.Event()
    try:
        backend._executor.submit(gate.wait, 120)  # the batch worker is busy meanwhile
        problem = backend.model_problem(extra)
        assert problem == f"loading model {extra!r} {LOADING}"
        assert backend.model_problem(extra) == problem  # asked again: still the one load
        assert backend.resolve_model(extra, "en", "ja") == extra
        assert backend.cache_identity(extra, "en", "ja") is None
        with pytest.raises(BackendUnavailable, match=LOADING):
            await backend.translate(["Hello."], source="en", target="ja", model=extra)
        # It loads while the batch worker is still held: a thread of its own.
        assert await settled(backend, extra, timeout_s=30) is None
        gate.set()

        out = await backend.translate(TEXTS, source="en", target="ja", model=extra)
        assert all(out) and batches(backend)[extra] == 1
        assert backend.resolve_model(extra, "en", "ja") == extra
        assert backend.info()["models"] == [ckpt["marian"], extra]
        assert backend.info()["extra_models"] == [extra]
        # An extra serves only when named: the default routing is the configured models'.
        assert not backend.supports("en", "ja") and backend.languages() == ["de"]

        # max_extra_models=1: loading a second drops the first.
        assert await settled(backend, second) is None
        assert backend.info()["extra_models"] == [second]
        assert [entry["model"] for entry in backend.catalog()] == [ckpt["marian"], second]
        assert backend.cache_identity(extra, "en", "ja") is None
        assert backend.resolve_model(second, "en", "de") == second
    finally:
        gate.set()
        await backend.aclose()


async def test_the_least_recently_used_extra_is_dropped(ckpt: dict[str, str]) -> None:
    backend = await started(ckpt["marian"], local_max_extra_models=2)
    first, second, third = ckpt["marian-ja"], ckpt["marian-copy"], ckpt["m2m"]
    try:
        assert await settled(backend, first) is None
        assert await settled(backend, second) is None
        await backend.translate(["Hello."], source="en", target="ja", model=first)  # used last
        assert await settled(backend, third) is None
        assert backend.info()["extra_models"] == [first, third]
        assert backend.info()["models"] == [ckpt["marian"], first, third]
    finally:
        await backend.aclose()


async def test_a_failed_on_demand_load_is_remembered(
    ckpt: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = await started(ckpt["marian"])
    missing = str(tmp_path / "no-such-model")
    try:
        assert backend.model_problem(missing) == f"loading model {missing!r} {LOADING}"
        reason = await settled(backend, missing)
        assert reason == f"model {missing!r} cannot be loaded here"
        with pytest.raises(BackendUnavailable, match="cannot be loaded here"):
            await backend.translate(["Hello."], source="en", target="de", model=missing)
        # Within EXTRA_RETRY_S it is not tried again, even once the directory is there.
        shutil.copytree(ckpt["marian-ja"], missing)
        await asyncio.sleep(0.2)
        assert backend.model_problem(missing) == reason
        assert backend.info()["extra_models"] == []
        # After it, the next ask tries again.
        monkeypatch.setattr(catalog, "EXTRA_RETRY_S", 0.0)
        assert backend.model_problem(missing) == f"loading model {missing!r} {LOADING}"
        assert await settled(backend, missing) is None
        assert all(await backend.translate(TEXTS, source="en", target="ja", model=missing))
    finally:
        await backend.aclose()


async def test_on_demand_loading_can_be_turned_off(ckpt: dict[str, str]) -> None:
    backend = await started(ckpt["marian"], local_max_extra_models=0)
    extra = ckpt["marian-ja"]
    try:
        reason = backend.model_problem(extra)
        assert reason is not None and extra in reason
        assert "THINKTRANS_LOCAL_MODELS" in reason
        assert "THINKTRANS_LOCAL_MAX_EXTRA_MODELS=0" in reason
        with pytest.raises(BackendUnavailable, match="THINKTRANS_LOCAL_MAX_EXTRA_MODELS=0"):
            await backend.translate(["Hello."], source="en", target="ja", model=extra)
        assert backend.model_problem(ckpt["marian"]) is None  # configured: always fine
        assert backend.model_problem(None) is None
        await asyncio.sleep(0.2)
        assert backend.info()["extra_models"] == []
    finally:
        await backend.aclose()


async def test_close_stops_the_on_demand_loader(ckpt: dict[str, str]) -> None:
    backend = await started(ckpt["marian"])
    gate = threading.Event()
    backend._ondemand.submit(gate.wait, 30)  # the load below queues behind this
    assert backend.model_problem(ckpt["marian-ja"]) is not None
    await backend.aclose()
    gate.set()
    await asyncio.sleep(0.2)
    assert backend.info()["extra_models"] == []
    assert backend.model_problem(ckpt["marian-ja"]) is not None
    with pytest.raises(RuntimeError):  # shut down: nothing more runs there
        backend._ondemand.submit(time.sleep, 0)


# -- the catalog and the cache identity -------------------------------------------------------


async def test_catalog_lists_models_in_order_with_the_default(ckpt: dict[str, str]) -> None:
    marian, m2m = ckpt["marian"], ckpt["m2m"]
    backend = build(f"en-de={marian}", m2m)
    try:
        entries = backend.catalog()
        assert [(e["model"], e["languages"], e["default"]) for e in entries] == [
            (marian, None, False), (m2m, None, True)]
        assert all(str(e["notes"]).startswith("not loaded: ") for e in entries)
        await backend.start()
        assert await backend.wait_ready(timeout_s=120), backend.reason
        m2m_targets = sorted(M2M_CODES)
        noise = "test checkpoint: random weights, its output is noise"
        assert backend.catalog() == [
            {"model": marian, "languages": ["de"], "default": False,
             "notes": f"marian en-de, transformers float32; {noise}"},
            {"model": m2m, "languages": m2m_targets, "default": True,
             "notes": f"m2m100, {len(m2m_targets)} targets, transformers float32; {noise}"},
        ]
        assert await settled(backend, ckpt["marian-ja"]) is None
        extra = backend.catalog()[-1]
        assert extra["model"] == ckpt["marian-ja"] and extra["default"] is False
        assert extra["notes"] == f"marian en-ja, transformers float32, loaded on demand; {noise}"
    finally:
        await backend.aclose()
    # All Marian: the first is the default. The single-model settings: the main model.
    all_marian = build(marian, ckpt["marian-ja"])
    assert [e["default"] for e in all_marian.catalog()] == [True, False]
    legacy = make_backend(m2m, local_marian_models=[f"en-de={marian}"])
    assert [(e["model"], e["default"]) for e in legacy.catalog()] == [(m2m, True), (marian, False)]
    await all_marian.aclose()
    await legacy.aclose()


async def test_cache_identity_names_the_model_and_what_decides_the_output(
    ckpt: dict[str, str],
) -> None:
    marian, m2m = ckpt["marian"], ckpt["m2m"]
    backend = build(f"en-de={marian}", m2m)
    try:
        assert backend.cache_identity(None, "en", "de") is None  # not loaded
        await backend.start()
        assert await backend.wait_ready(timeout_s=120), backend.reason
        de = backend.cache_identity(None, "en", "de")
        version = directory_fingerprint(Path(marian))
        assert de == (f"local|{marian}|v={version}|transformers|float32|beams=1|ngram=6"
                      "|maxin=256|device=cpu")
        assert backend.cache_identity(None, "en", "de") == de  # stable
        assert backend.cache_identity(marian, "en", "de") == de  # the same model: shared
        fr = backend.cache_identity(None, "en", "fr")
        assert fr is not None and fr.startswith(f"local|{m2m}|") and fr != de
        assert backend.cache_identity(m2m, "en", "de") == fr  # the model, not the pair
        assert backend.cache_identity(None, "en", "tlh") is None  # nothing serves it
        assert backend.cache_identity(ckpt["marian-ja"], "en", "ja") is None  # not loaded
    finally:
        await backend.aclose()


async def test_two_streams_on_one_server_each_get_their_own_model(ckpt: dict[str, str]
                                                                    ) -> None:
    """Through the service: two streams naming different configured models, at once; each
    segment is translated by, and names, its stream's model; /v1/models lists both."""
    from tests.conftest import app_with, check_stream, deltas, post_chunks, read_until, segments

    text = "Let me add the legs of the hike together. Then I check the total. "
    models = [f"en-de={ckpt['marian']}", ckpt["m2m"]]
    async with app_with(backend="local", local_models=",".join(models), local_engine="transformers",
                        default_locale="de", deadline_ms=60_000) as app:
        assert await app.runtime.wait_ready(timeout_s=120)
        listed = (await app.client.get("/v1/models")).json()["models"]
        assert [(m["model"], m["default"]) for m in listed] == [
            (ckpt["marian"], False), (ckpt["m2m"], True)]

        async def stream(sid: str, model: str) -> list[dict[str, Any]]:
            r = await app.client.post("/v1/streams", json={"stream_id": sid, "model": model})
            assert r.status_code == 201 and r.json()["model"] == model
            await post_chunks(app.client, sid, deltas(text))
            await app.client.post(f"/v1/streams/{sid}/close")
            events = await read_until(app.client, sid, timeout_s=60)
            check_stream(events, text)
            return segments(events)

        by_marian, by_m2m = await asyncio.gather(stream("a", ckpt["marian"]),
                                                 stream("b", ckpt["m2m"]))
        assert {s["model"] for s in by_marian} == {ckpt["marian"]}
        assert {s["model"] for s in by_m2m} == {ckpt["m2m"]}
        assert [s["text"] for s in by_marian] != [s["text"] for s in by_m2m]
        # Not named: the pair's first model, en-de's Marian one.
        r = await app.client.post("/v1/translate", json={"target": "de", "texts": [text]})
        assert {s["model"] for s in r.json()["results"][0]["segments"]} == {ckpt["marian"]}


async def test_a_model_named_on_demand_serves_a_pair_the_configured_ones_lack(
        ckpt: dict[str, str]) -> None:
    """Through the dispatcher: en-de is configured, a stream names an en-ja model. Its first
    segments go down the chain while it loads; once loaded it serves en -> ja alone."""
    from tests.conftest import app_with

    async with app_with(backend="local", local_models=f"en-de={ckpt['marian']}",
                        local_engine="transformers", deadline_ms=60_000,
                        local_model_roots=[str(Path(ckpt["marian-ja"]).parent)]) as app:
        assert await app.runtime.wait_ready(timeout_s=120)
        body = {"target": "ja", "model": ckpt["marian-ja"], "texts": [TEXTS[0]]}
        r = await app.client.post("/v1/translate", json=body)
        [first] = r.json()["results"][0]["segments"]
        assert first["status"] == "error" and LOADING in first["error"]
        give_up = time.monotonic() + 60
        while True:
            r = await app.client.post("/v1/translate", json=body)
            [seg] = r.json()["results"][0]["segments"]
            if seg["status"] == "translated" or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.2)
        assert (seg["status"], seg["model"]) == ("translated", ckpt["marian-ja"]), seg
        listed = [m["model"] for m in (await app.client.get("/v1/models")).json()["models"]]
        assert listed == [ckpt["marian"], ckpt["marian-ja"]]


# -- one model, one name ----------------------------------------------------------------------


async def test_other_spellings_of_a_path_are_one_model(ckpt: dict[str, str], tmp_path: Path
                                                       ) -> None:
    """The configured checkpoint named as `/m/./`, `//m`, `/m/` or through a symlink is the
    configured model: no load on demand. An extra named two ways loads once."""
    marian, extra = ckpt["marian"], ckpt["marian-ja"]
    link = tmp_path / "link"
    link.symlink_to(marian)
    backend = await started(marian, local_model_roots=[str(Path(extra).parent)])
    try:
        for spelling in (f"{marian}/./", marian.replace("/", "//"), f"{marian}/", str(link),
                         f"{Path(marian).parent}/../{Path(marian).parent.name}/marian-en-de"):
            assert backend.model_problem(spelling) is None, spelling
            assert backend.resolve_model(spelling, "en", "de") == marian
            assert backend.cache_identity(spelling, "en", "de") == backend.cache_identity(
                None, "en", "de")
            await backend.translate(["Hello."], source="en", target="de", model=spelling)
        await asyncio.sleep(0.2)
        assert backend.info()["extra_models"] == []
        assert await settled(backend, f"{extra}/") is None
        assert backend.model_problem(extra.replace("/", "//")) is None  # loaded: the same one
        assert backend.info()["extra_models"] == [extra]
        assert batches(backend)[extra] == 0
    finally:
        await backend.aclose()


# -- where names may come from ----------------------------------------------------------------


async def test_a_client_hears_one_reason_whatever_is_at_the_path(
    ckpt: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A missing path, a directory that is no checkpoint, a file, a config that is not JSON,
    a checkpoint outside the roots: the client hears the same reason; the log says why."""
    root = tmp_path / "root"
    (root / "empty").mkdir(parents=True)
    (root / "file").write_text("not a model")
    (root / "badjson").mkdir()
    (root / "badjson" / "config.json").write_text("{not json")
    outside = shutil.copytree(ckpt["marian-ja"], tmp_path / "outside")
    names = [str(root / "missing"), str(root / "empty"), str(root / "file"),
             str(root / "badjson"), str(outside), str(root / ".." / "outside"), "/etc"]
    backend = await started(ckpt["marian"], local_model_roots=[str(root)])
    try:
        with caplog.at_level("ERROR", logger="models.local.catalog"):
            for name in names:
                assert await settled(backend, name) == f"model {name!r} cannot be loaded here"
        assert backend.info()["extra_models"] == []
        logged = caplog.text
        assert "does not exist" in logged and "not a loadable checkpoint" in logged
        assert "not under a directory of THINKTRANS_LOCAL_MODEL_ROOTS" in logged
        # A checkpoint under the root loads.
        inside = shutil.copytree(ckpt["marian-ja"], root / "good")
        assert await settled(backend, str(inside)) is None
    finally:
        await backend.aclose()


async def test_no_directory_loads_on_demand_by_default_and_hub_ids_can_be_turned_off(
    ckpt: dict[str, str], caplog: pytest.LogCaptureFixture,
) -> None:
    backend = await started(ckpt["marian"], local_model_roots=[], local_hub_models=False)
    try:
        with caplog.at_level("ERROR", logger="models.local.catalog"):
            for name in (ckpt["marian-ja"], "Helsinki-NLP/opus-mt-en-ja", "../x/y"):
                assert await settled(backend, name) == f"model {name!r} cannot be loaded here"
        assert "none set" in caplog.text and "THINKTRANS_LOCAL_HUB_MODELS is off" in caplog.text
        assert backend.info()["extra_models"] == []
        assert backend.model_problem(f"{ckpt['marian']}/") is None  # configured: any spelling
    finally:
        await backend.aclose()
    assert make_backend(ckpt["marian"]).config.model_roots == ()  # the default: none


# -- a model an open stream uses stays --------------------------------------------------------


async def test_two_clients_alternating_models_are_both_served(ckpt: dict[str, str]) -> None:
    """One extra model at once (the default). Stream A names one model, client B another:
    B's model does not evict A's while A is open; B gets the chain's next backend and the
    reason; once A is over, B's model loads."""
    from tests.conftest import app_with, poll, post_chunks

    mine, theirs = ckpt["marian-ja"], ckpt["marian-copy"]
    async with app_with(backend="local,passthrough", local_models=f"en-de={ckpt['marian']}",
                        local_engine="transformers", deadline_ms=60_000, flush_idle_ms=20,
                        local_model_roots=[tempfile.gettempdir()]) as app:
        assert await app.runtime.wait_ready(timeout_s=120)
        local = app.runtime.backends["local"]
        r = await app.client.post("/v1/streams", json={"stream_id": "a", "model": mine,
                                                       "target": "ja"})
        assert r.status_code == 201
        seen: list[dict[str, Any]] = []
        seq = 0

        async def a_says(text: str) -> dict[str, Any]:
            nonlocal seq
            await post_chunks(app.client, "a", [(seq, text)])
            seq += 1
            give_up = time.monotonic() + 30
            while len([e for e in seen if e["type"] == "segment"]) < seq:
                assert time.monotonic() < give_up, seen
                after = seen[-1]["id"] if seen else -1
                seen.extend(await poll(app.client, "a", after, wait_ms=500))
            return [e["data"] for e in seen if e["type"] == "segment"][-1]

        async def b_says(text: str) -> dict[str, Any]:
            body = {"target": "de", "model": theirs, "texts": [text]}
            r = await app.client.post("/v1/translate", json=body)
            [segment] = r.json()["results"][0]["segments"]
            return dict(segment)

        give_up = time.monotonic() + 60
        while (await a_says("I check the total. "))["backend"] != "local":
            assert time.monotonic() < give_up, "A's model did not load"
            await asyncio.sleep(0.1)
        for turn in range(4):
            a = await a_says(f"Then I add the legs, turn {turn}. ")
            assert (a["status"], a["backend"], a["model"]) == ("translated", "local", mine), a
            b = await b_says(f"The user asked for the total, turn {turn}.")
            assert b["backend"] == "passthrough" and b["status"] != "error", b
            await asyncio.sleep(0.2)  # time enough for a load that would evict A's model
        problem = local.model_problem(theirs)
        assert problem is not None and "in use by open streams" in problem, problem
        assert local.info()["extra_models"] == [mine]

        # A is over: B's model loads in its place.
        await app.client.post("/v1/streams/a/close")
        give_up = time.monotonic() + 60
        while (b := await b_says("The user asked again."))["backend"] != "local":
            assert time.monotonic() < give_up, b
            await asyncio.sleep(0.1)
        assert (b["status"], b["model"]) == ("translated", theirs)
        assert local.info()["extra_models"] == [theirs]
