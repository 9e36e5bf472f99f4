"""models/local/catalog.py alone: routing a pair among fake slots, and the models loaded on
demand (``OnDemand``) with a fake loader on a real thread, its gates ``threading.Event``s.
The same behaviour through real checkpoints: tests/test_local_models.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from models.errors import BackendUnavailable, UnsupportedLanguage
from models.local import catalog as catalog_module
from models.local.catalog import Catalog, OnDemand
from models.local.checkpoint import LICENCES, NLLB_CODES, LoadError, Spec
from models.local.engines import Loaded
from models.local.slot import Slot
from tests.configs import local_config


class FakeTokenizer:
    """Language token ids: the code's position in a list."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def convert_tokens_to_ids(self, code: str) -> int:
        if code not in self.tokens:
            self.tokens.append(code)
        return self.tokens.index(code)


def nllb(model_id: str = "nllb") -> Slot:
    return Slot(model_id, "nllb", FakeTokenizer(), Loaded(None, frozenset(), workers=3),
                dict(NLLB_CODES))


def marian(model_id: str, source: str = "en", target: str = "de") -> Slot:
    return Slot(model_id, "marian", FakeTokenizer(), Loaded(None, frozenset()),
                {target: ""}, source=source)


ENGINE = SimpleNamespace(name="transformers", compute_type="float32")


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-ondemand")
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


def settle(executor: ThreadPoolExecutor) -> None:
    """Wait until what was queued on the one thread before now has run."""
    executor.submit(lambda: None).result(timeout=30)


def catalog(specs: list[Spec], slots: list[Slot], executor: ThreadPoolExecutor, *,
            in_order: bool = True, **settings: Any) -> Catalog:
    """A catalog of ``specs`` as the local backend builds it from the ``local_*`` settings
    (``settings`` put over them; models on demand under ``/m``)."""
    config = local_config(**{"local_model_roots": ["/m"], **settings})
    built = Catalog(specs, ondemand=executor, max_extra_models=config.max_extra_models,
                    max_input_tokens=config.max_input_tokens, in_order=in_order,
                    model_roots=config.model_roots, hub_models=config.hub_models)
    if slots:
        built.install(slots, ENGINE)  # type: ignore[arg-type]
    return built


# -- routing -----------------------------------------------------------------------------------


def test_a_pair_goes_to_the_first_model_that_serves_it(executor: ThreadPoolExecutor) -> None:
    specs = [Spec("en-de"), Spec("nllb")]
    listed = catalog(specs, [marian("en-de"), nllb()], executor)
    assert listed.route("en", "de").slot.model_id == "en-de"
    assert listed.route(None, "de").slot.model_id == "en-de"  # unknown source: English
    assert listed.route("fr", "de").slot.model_id == "nllb"  # Marian serves its pair only
    assert listed.route("en", "ja").slot.model_id == "nllb"
    # In the order written: NLLB first takes en-de too.
    reverse = catalog(specs[::-1], [nllb(), marian("en-de")], executor)
    assert reverse.route("en", "de").slot.model_id == "nllb"
    # The single-model settings: a Marian checkpoint wins its pair over the main model.
    legacy = catalog(specs[::-1], [nllb(), marian("en-de")], executor, in_order=False)
    assert legacy.route("en", "de").slot.model_id == "en-de"


def test_a_route_carries_the_pairs_codes(executor: ThreadPoolExecutor) -> None:
    listed = catalog([Spec("nllb")], [nllb()], executor)
    route = listed.route("zh-CN", "ja")
    tokenizer = route.slot.tokenizer
    assert route.src_code == "zho_Hans" and route.prefix == ""
    assert route.forced_bos == tokenizer.convert_tokens_to_ids("jpn_Jpan")
    assert route.no_space and not listed.route("en", "de").no_space
    assert listed.route("tlh", "de").src_code == "eng_Latn"  # outside the table: English
    multi = marian("multi")
    multi.codes = {"fr": ">>fra<<", "pt": ">>por<<"}
    assert catalog([Spec("multi")], [multi], executor).route("en", "pt").prefix == ">>por<<"


def test_a_pair_nothing_serves_says_what_is_served(executor: ThreadPoolExecutor) -> None:
    listed = catalog([Spec("a"), Spec("b")], [marian("a"), marian("b", target="ja")], executor)
    with pytest.raises(UnsupportedLanguage,
                       match=r"the local backend cannot translate fr -> de: it serves 2 "
                             r"targets \(de, ja\); Marian pairs en-de, en-ja"):
        listed.route("fr", "de")
    with pytest.raises(UnsupportedLanguage, match="not a valid BCP 47 target"):
        listed.route("en", "not a tag")


def test_a_named_model_serves_alone(executor: ThreadPoolExecutor) -> None:
    listed = catalog([Spec("en-de"), Spec("nllb")], [marian("en-de"), nllb()], executor)
    assert listed.route("en", "de", "nllb").slot.model_id == "nllb"
    with pytest.raises(UnsupportedLanguage, match="model 'en-de' cannot translate en -> fr"):
        listed.route("en", "fr", "en-de")  # not replaced by one that can
    with pytest.raises(BackendUnavailable, match="model 'gone' is not loaded"):
        listed.route("en", "de", "gone")
    assert listed.serving("en-de", "en", "fr") is None
    assert listed.serving("gone", "en", "de") is None
    assert listed.serving(None, "en", "fr") is listed.slots[1]


def test_before_install_nothing_serves(executor: ThreadPoolExecutor) -> None:
    listed = catalog([Spec("a", ("en", "de")), Spec("b")], [], executor)
    assert listed.serving(None, "en", "de") is None and listed.languages() == []
    entries = listed.entries("loading model 'a'")
    assert [(e["model"], e["languages"], e["default"], e["notes"]) for e in entries] == [
        ("a", None, False, "not loaded: loading model 'a'"),  # a pair: only Marian has one
        ("b", None, True, "not loaded: loading model 'a'"),
    ]
    assert listed.info() == {"models": ["a", "b"], "extra_models": [], "family": None,
                             "marian_pairs": [], "workers": None}


def test_entries_and_info_once_installed(executor: ThreadPoolExecutor) -> None:
    listed = catalog([Spec("a"), Spec("n")], [marian("a"), nllb("n")], executor)
    entries = listed.entries("unused")
    assert [(e["model"], e["default"], e["notes"]) for e in entries] == [
        ("a", False, f"marian en-de, transformers float32; {LICENCES['marian']}"),
        ("n", True, f"nllb, {len(NLLB_CODES)} targets, transformers float32; {LICENCES['nllb']}"),
    ]
    assert listed.languages() == sorted(NLLB_CODES)
    assert listed.info() == {"models": ["a", "n"], "extra_models": [], "family": "marian",
                             "marian_pairs": ["en-de=a"], "workers": 1}
    all_marian = catalog([Spec("a"), Spec("b")], [marian("a"), marian("b")], executor)
    assert [e["default"] for e in all_marian.entries("")] == [True, False]


def test_the_nllb_entries_state_the_weights_licence(executor: ThreadPoolExecutor) -> None:
    """Where an operator picks a model: NLLB-200's weights are non-commercial, said in its
    catalog entry, loaded or not yet, with the permissive choices named."""
    nllb_id = "facebook/nllb-200-distilled-600M"
    listed = catalog([Spec(nllb_id)], [], executor)
    [waiting] = listed.entries("loading model")
    assert str(waiting["notes"]).startswith("not loaded: loading model")
    listed.install([nllb(nllb_id)], ENGINE)  # type: ignore[arg-type]
    [loaded] = listed.entries("")
    for notes in (str(waiting["notes"]), str(loaded["notes"])):
        assert "CC-BY-NC 4.0, non-commercial use only" in notes, notes
        assert "M2M-100 (MIT)" in notes and "OPUS-MT models (CC-BY 4.0)" in notes, notes
    # A test checkpoint's weights are its own: random.
    test = nllb("/m/test")
    test.test_checkpoint = True
    [entry] = catalog([Spec("/m/test")], [test], executor).entries("")
    assert str(entry["notes"]).endswith("; test checkpoint: random weights, its output is noise")


def test_model_problem(executor: ThreadPoolExecutor) -> None:
    listed = catalog([Spec("a")], [marian("a")], executor)
    assert listed.model_problem(None, None) is None and listed.model_problem("a", None) is None
    assert listed.model_problem("x", "loading model 'a'") == (
        "model 'x' loads on demand once the backend is ready (loading model 'a')")
    off = catalog([Spec("a")], [marian("a")], executor, local_max_extra_models=0)
    problem = off.model_problem("x", None)
    assert problem is not None and "THINKTRANS_LOCAL_MAX_EXTRA_MODELS=0" in problem


# -- models loaded on demand -------------------------------------------------------------------


class Loader:
    """A fake ``load``: each name a Marian slot, or the error it was told to raise; a gate
    holds every load until it is set."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.errors: dict[str, Exception] = {}
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, name: str) -> Slot:
        self.calls.append(name)
        assert self.gate.wait(30)
        if name in self.errors:
            raise self.errors[name]
        return marian(name)


LOADING = "on demand; it serves once loaded"


def loaded_extras(extras: OnDemand) -> list[str]:
    return list(extras.slots())


def ask(extras: OnDemand, executor: ThreadPoolExecutor, name: str) -> str | None:
    """Ask for ``name`` and wait for its load; the answer after it."""
    assert extras.problem(name) == f"loading model {name!r} {LOADING}"
    settle(executor)
    return extras.problem(name)


def test_a_model_loads_once_and_is_kept(executor: ThreadPoolExecutor) -> None:
    load = Loader()
    extras = OnDemand(load, executor, max_models=1)
    load.gate.clear()
    assert extras.problem("a") == f"loading model 'a' {LOADING}"
    assert extras.problem("a") == f"loading model 'a' {LOADING}"  # asked again: one load
    assert extras.get("a") is None
    load.gate.set()
    settle(executor)
    assert extras.problem("a") is None and load.calls == ["a"]
    slot = extras.get("a")
    assert slot is not None and slot.model_id == "a"


def test_the_least_recently_used_is_dropped_once_the_new_one_is_in(
        executor: ThreadPoolExecutor) -> None:
    load = Loader()
    extras = OnDemand(load, executor, max_models=2)
    assert ask(extras, executor, "a") is None and ask(extras, executor, "b") is None
    extras.touch("a")  # used last
    load.gate.clear()
    assert extras.problem("c") is not None
    assert loaded_extras(extras) == ["b", "a"]  # still both while "c" loads
    load.gate.set()
    settle(executor)
    assert loaded_extras(extras) == ["a", "c"]


def test_a_failed_load_is_remembered_then_tried_again(
        executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    load = Loader()
    load.errors = {"bad": LoadError("model 'bad' does not exist"),
                   "odd": ValueError("odd weights\ntraceback")}
    extras = OnDemand(load, executor, max_models=1)
    # The client hears one reason, whatever went wrong; the log has the detail.
    assert ask(extras, executor, "bad") == "model 'bad' cannot be loaded here"
    assert ask(extras, executor, "odd") == "model 'odd' cannot be loaded here"
    assert extras.problem("bad") is not None and load.calls == ["bad", "odd"]
    del load.errors["bad"]
    monkeypatch.setattr(catalog_module, "EXTRA_RETRY_S", 0.0)
    assert ask(extras, executor, "bad") is None and load.calls == ["bad", "odd", "bad"]


def test_failures_remembered_are_bounded(executor: ThreadPoolExecutor,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_module, "MAX_FAILURES_REMEMBERED", 2)
    load = Loader()
    load.errors = {name: LoadError(f"no {name}") for name in "abc"}
    extras = OnDemand(load, executor, max_models=1)
    for name in "abc":
        assert ask(extras, executor, name) == f"model {name!r} cannot be loaded here"
    assert extras.problem("c") == "model 'c' cannot be loaded here"  # remembered
    assert extras.problem("a") == f"loading model 'a' {LOADING}"  # the oldest, forgotten


def test_loads_queued_at_once_are_bounded(executor: ThreadPoolExecutor) -> None:
    load = Loader()
    load.gate.clear()
    extras = OnDemand(load, executor, max_models=3)
    assert extras.problem("a") is not None and extras.problem("b") is not None
    assert extras.problem("c") == (
        "2 models are loading on demand already; model 'c' is not loaded (try again later)")
    load.gate.set()
    settle(executor)
    assert load.calls == ["a", "b"]
    assert ask(extras, executor, "c") is None


def test_a_load_finishing_after_close_is_dropped(executor: ThreadPoolExecutor) -> None:
    load = Loader()
    load.gate.clear()
    extras = OnDemand(load, executor, max_models=1)
    assert extras.problem("a") is not None
    extras.close()
    load.gate.set()
    settle(executor)
    assert loaded_extras(extras) == []
    executor.shutdown()
    assert extras.problem("b") == "the local backend is closed"


def test_a_catalog_loads_named_models_on_its_engine(executor: ThreadPoolExecutor,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[object, Spec, bool]] = []

    def fake_load_slot(engine: object, spec: Spec, offline: bool) -> Slot:
        seen.append((engine, spec, offline))
        return marian(spec.model_id, target=spec.pair[1] if spec.pair else "de")

    warm: list[tuple[object, ...]] = []
    monkeypatch.setattr(catalog_module, "load_slot", fake_load_slot)
    monkeypatch.setattr(catalog_module, "warm_up", lambda *args: warm.append(args))
    listed = catalog([Spec("a")], [marian("a")], executor)
    assert listed.model_problem("en-ja=/m/x", None) == f"loading model 'en-ja=/m/x' {LOADING}"
    settle(executor)
    assert seen == [(ENGINE, Spec("/m/x", ("en", "ja"), setting="the request's `model`",
                                  on_demand=True), False)]  # a directory: never cache-only
    assert len(warm) == 1
    assert listed.knows("en-ja=/m/x") and not listed.is_configured("en-ja=/m/x")
    assert listed.route("en", "ja", "en-ja=/m/x").slot.model_id == "/m/x"
    # An extra serves only when named.
    with pytest.raises(UnsupportedLanguage):
        listed.route("en", "ja")
    assert listed.entries("")[-1]["notes"] == (
        f"marian en-ja, transformers float32, loaded on demand; {LICENCES['marian']}")


def test_a_model_an_open_stream_uses_is_never_dropped(executor: ThreadPoolExecutor) -> None:
    load = Loader()
    extras = OnDemand(load, executor, max_models=1)
    release_a = extras.pin("a")
    assert ask(extras, executor, "a") is None
    release_b = extras.pin("b")
    problem = extras.problem("b")
    assert problem is not None and "in use by open streams" in problem
    settle(executor)
    assert loaded_extras(extras) == ["a"] and load.calls == ["a"]  # not loaded, not evicted
    release_a()
    release_a()  # idempotent: a second stream on "a" would keep its pin
    assert ask(extras, executor, "b") is None
    assert loaded_extras(extras) == ["b"]
    release_b()


def test_a_model_pinned_while_another_loads_stays(executor: ThreadPoolExecutor) -> None:
    load = Loader()
    extras = OnDemand(load, executor, max_models=1)
    assert ask(extras, executor, "a") is None
    load.gate.clear()
    assert extras.problem("b") == f"loading model 'b' {LOADING}"  # "a" is free: b may load
    release = extras.pin("a")  # ... but a stream names "a" before b is in
    load.gate.set()
    settle(executor)
    assert loaded_extras(extras) == ["a"]  # b is not kept: the bound holds, a stays
    release()
