"""What a checkpoint is, before any engine loads it: its family, its languages, how it is named.

The language table, the family told from the config and tokenizer, the model specs parsed
from the settings, a Marian checkpoint's pair, one-line reasons for a checkpoint not found,
the hub probe and a directory's fingerprint: everything the backend decides about a model
without loading its weights, so that those decisions are made once and tested alone.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from models.base import first_line
from models.errors import BackendConfigError
from models.languages import canonical, table_key

log = logging.getLogger(__name__)

# The languages this backend knows, by table key (see models.languages): a loaded checkpoint
# serves those its tokenizer has a token for. NLLB-200: its 202 FLORES-200 codes (the order of
# transformers' NllbTokenizer), each with the BCP 47 tag a user writes for it.
NLLB_CODES: dict[str, str] = {
    "ace-Arab": "ace_Arab", "ace": "ace_Latn", "acm": "acm_Arab", "acq": "acq_Arab",
    "aeb": "aeb_Arab", "af": "afr_Latn", "ajp": "ajp_Arab", "ak": "aka_Latn", "sq": "als_Latn",
    "am": "amh_Ethi", "apc": "apc_Arab", "ar": "arb_Arab", "ars": "ars_Arab", "ary": "ary_Arab",
    "arz": "arz_Arab", "as": "asm_Beng", "ast": "ast_Latn", "awa": "awa_Deva", "ay": "ayr_Latn",
    "azb": "azb_Arab", "az": "azj_Latn", "ba": "bak_Cyrl", "bm": "bam_Latn", "ban": "ban_Latn",
    "be": "bel_Cyrl", "bem": "bem_Latn", "bn": "ben_Beng", "bho": "bho_Deva",
    "bjn-Arab": "bjn_Arab", "bjn": "bjn_Latn", "bo": "bod_Tibt", "bs": "bos_Latn",
    "bug": "bug_Latn", "bg": "bul_Cyrl", "ca": "cat_Latn", "ceb": "ceb_Latn", "cs": "ces_Latn",
    "cjk": "cjk_Latn", "ckb": "ckb_Arab", "crh": "crh_Latn", "cy": "cym_Latn", "da": "dan_Latn",
    "de": "deu_Latn", "din": "dik_Latn", "dyu": "dyu_Latn", "dz": "dzo_Tibt", "el": "ell_Grek",
    "en": "eng_Latn", "eo": "epo_Latn", "et": "est_Latn", "eu": "eus_Latn", "ee": "ewe_Latn",
    "fo": "fao_Latn", "fj": "fij_Latn", "fi": "fin_Latn", "fon": "fon_Latn", "fr": "fra_Latn",
    "fur": "fur_Latn", "fuv": "fuv_Latn", "om": "gaz_Latn", "gd": "gla_Latn", "ga": "gle_Latn",
    "gl": "glg_Latn", "gn": "grn_Latn", "gu": "guj_Gujr", "ht": "hat_Latn", "ha": "hau_Latn",
    "he": "heb_Hebr", "hi": "hin_Deva", "hne": "hne_Deva", "hr": "hrv_Latn", "hu": "hun_Latn",
    "hy": "hye_Armn", "ig": "ibo_Latn", "ilo": "ilo_Latn", "id": "ind_Latn", "is": "isl_Latn",
    "it": "ita_Latn", "jv": "jav_Latn", "ja": "jpn_Jpan", "kab": "kab_Latn", "kac": "kac_Latn",
    "kam": "kam_Latn", "kn": "kan_Knda", "ks": "kas_Arab", "ks-Deva": "kas_Deva",
    "ka": "kat_Geor", "kk": "kaz_Cyrl", "kbp": "kbp_Latn", "kea": "kea_Latn", "mn": "khk_Cyrl",
    "km": "khm_Khmr", "ki": "kik_Latn", "rw": "kin_Latn", "ky": "kir_Cyrl", "kmb": "kmb_Latn",
    "ku": "kmr_Latn", "kr-Arab": "knc_Arab", "kr": "knc_Latn", "kg": "kon_Latn", "ko": "kor_Hang",
    "lo": "lao_Laoo", "lij": "lij_Latn", "li": "lim_Latn", "ln": "lin_Latn", "lt": "lit_Latn",
    "lmo": "lmo_Latn", "ltg": "ltg_Latn", "lb": "ltz_Latn", "lua": "lua_Latn", "lg": "lug_Latn",
    "luo": "luo_Latn", "lus": "lus_Latn", "lv": "lvs_Latn", "mag": "mag_Deva", "mai": "mai_Deva",
    "ml": "mal_Mlym", "mr": "mar_Deva", "min": "min_Latn", "mk": "mkd_Cyrl", "mt": "mlt_Latn",
    "mni": "mni_Beng", "mos": "mos_Latn", "mi": "mri_Latn", "my": "mya_Mymr", "nl": "nld_Latn",
    "nn": "nno_Latn", "nb": "nob_Latn", "ne": "npi_Deva", "nso": "nso_Latn", "nus": "nus_Latn",
    "ny": "nya_Latn", "oc": "oci_Latn", "or": "ory_Orya", "pag": "pag_Latn", "pa": "pan_Guru",
    "pap": "pap_Latn", "ps": "pbt_Arab", "fa": "pes_Arab", "mg": "plt_Latn", "pl": "pol_Latn",
    "pt": "por_Latn", "fa-AF": "prs_Arab", "qu": "quy_Latn", "ro": "ron_Latn", "rn": "run_Latn",
    "ru": "rus_Cyrl", "sg": "sag_Latn", "sa": "san_Deva", "sat": "sat_Beng", "scn": "scn_Latn",
    "shn": "shn_Mymr", "si": "sin_Sinh", "sk": "slk_Latn", "sl": "slv_Latn", "sm": "smo_Latn",
    "sn": "sna_Latn", "sd": "snd_Arab", "so": "som_Latn", "st": "sot_Latn", "es": "spa_Latn",
    "sc": "srd_Latn", "sr": "srp_Cyrl", "ss": "ssw_Latn", "su": "sun_Latn", "sv": "swe_Latn",
    "sw": "swh_Latn", "szl": "szl_Latn", "ta": "tam_Taml", "taq": "taq_Latn",
    "taq-Tfng": "taq_Tfng", "tt": "tat_Cyrl", "te": "tel_Telu", "tg": "tgk_Cyrl",
    "fil": "tgl_Latn", "th": "tha_Thai", "ti": "tir_Ethi", "tpi": "tpi_Latn", "tn": "tsn_Latn",
    "ts": "tso_Latn", "tk": "tuk_Latn", "tum": "tum_Latn", "tr": "tur_Latn", "tw": "twi_Latn",
    "tzm": "tzm_Tfng", "ug": "uig_Arab", "uk": "ukr_Cyrl", "umb": "umb_Latn", "ur": "urd_Arab",
    "uz": "uzn_Latn", "vec": "vec_Latn", "vi": "vie_Latn", "war": "war_Latn", "wo": "wol_Latn",
    "xh": "xho_Latn", "yi": "ydd_Hebr", "yo": "yor_Latn", "yue": "yue_Hant",
    "zh-Hans": "zho_Hans", "zh-Hant": "zho_Hant", "ms": "zsm_Latn", "zu": "zul_Latn",

}  # fmt: skip
# M2M-100: its 100 codes, the tag itself but where the tag is written otherwise; its one
# Chinese serves both scripts.
_M2M = (
    "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu "
    "ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr "
    "ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk "
    "ur uz vi wo xh yi yo zh zu"
)
_M2M_KEYS = {"no": "nb", "ns": "nso", "tl": "fil", "zh": "zh-Hans"}
M2M_CODES: dict[str, str] = {_M2M_KEYS.get(code, code): code for code in _M2M.split()}
M2M_CODES["zh-Hant"] = "zh"

FAMILIES = ("nllb", "m2m100", "marian")
# The licence each family's published weights carry, for the catalog's notes: facts about the
# weights, which bind the operator (a fine-tune may differ: its model card says).
LICENCES = {
    "nllb": "NLLB-200 weights: CC-BY-NC 4.0, non-commercial use only (check the model card); "
            "permissive: M2M-100 (MIT), most OPUS-MT models (CC-BY 4.0)",
    "m2m100": "M2M-100 weights: MIT (check the model card)",
    "marian": "Marian (OPUS-MT) weights: most CC-BY 4.0 (check this model's card)",
}
_FAMILY_NAMES = {"nllb": "NLLB-200", "m2m100": "M2M-100", "marian": "OPUS-MT"}
# Hub ids whose publisher tells the family, for the licence of a model not loaded yet.
_PUBLISHED = (("facebook/nllb", "nllb"), ("facebook/m2m100", "m2m100"),
              ("helsinki-nlp/opus-mt", "marian"))
# What an unknown source is read as: most agent thinking is English, and the encoder copes
# with a wrong source tag far better than with none.
FALLBACK_SOURCE = "en"
_PAIR = re.compile(r"^(?P<src>[A-Za-z]{2,8})-(?P<tgt>[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*)$")
_OPUS_NAME = re.compile(r"opus-mt-(?P<src>[A-Za-z]{2,8})-(?P<tgt>[A-Za-z]{2,8})$")
_FLORES = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")
# A hub id as the hub takes it: ``name`` or ``org/name``, each part at most 96 characters.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


class LoadError(Exception):
    """A checkpoint could not be loaded; the message is the backend's ``reason``."""


def key_or_none(tag: str | None) -> str | None:
    """The table key of a tag, or None when it is missing or not a BCP 47 tag."""
    standard = canonical(tag) if tag is not None else None
    return table_key(standard) if standard is not None else None


# -- model specs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A checkpoint to load: a configured one, or one a request named."""

    model_id: str
    pair: tuple[str, str] | None = None  # a Marian pair written before the id: ``en-de=ID``
    marian_only: bool = False  # named in THINKTRANS_LOCAL_MARIAN_MODELS
    setting: str = "THINKTRANS_LOCAL_MODEL"  # where it was named, for failure reasons
    on_demand: bool = False  # named by a request, not configured


def parse_pair_spec(value: str) -> tuple[tuple[str, str] | None, str]:
    """Split ``en-de=ID`` into ``(("en", "de"), "ID")``; a value without a pair gives ``None``."""
    left, sep, right = value.partition("=")
    match = _PAIR.match(left.strip()) if sep and "/" not in left else None
    src, tgt = (key_or_none(match["src"]), key_or_none(match["tgt"])) if match else (None, None)
    if src is None or tgt is None:
        return None, value.strip()
    return (src, tgt), right.strip()


def model_specs(model: str, marian_models: Sequence[str] = (),
                models: Sequence[str] = ()) -> list[Spec]:
    """The configured checkpoints, the main one first: ``models`` when set, else ``model``
    and ``marian_models`` (the ``local_*`` settings); BackendConfigError for a malformed
    entry."""
    if models:
        specs = [Spec(model_id, pair, setting="THINKTRANS_LOCAL_MODELS")
                 for pair, model_id in map(parse_pair_spec, models)]
        if not all(spec.model_id for spec in specs):
            raise BackendConfigError("local_models (THINKTRANS_LOCAL_MODELS) has an empty entry: "
                                     f"{', '.join(models)!r}")
        return specs
    pair, model_id = parse_pair_spec(model)
    if not model_id:
        raise BackendConfigError("local_model (THINKTRANS_LOCAL_MODEL) is empty; name a checkpoint")
    specs = [Spec(model_id, pair)]
    for entry in marian_models:
        extra_pair, extra_id = parse_pair_spec(entry)
        if extra_pair is None or not extra_id:
            raise BackendConfigError(
                "local_marian_models (THINKTRANS_LOCAL_MARIAN_MODELS) entries must read "
                f"'src-tgt=ID_OR_DIR', e.g. 'en-de=Helsinki-NLP/opus-mt-en-de'; got {entry!r}"
            )
        specs.append(Spec(extra_id, extra_pair, marian_only=True))
    return specs


# -- the family and its languages --------------------------------------------------------------


def detect_family(config: Any, tokenizer: Any) -> str | None:
    """``nllb``, ``m2m100`` or ``marian`` from a checkpoint's config and tokenizer, else None;
    never from its name, which a directory or a fine-tune may give freely."""
    model_type = getattr(config, "model_type", None)
    if model_type == "marian":
        return "marian"
    if model_type is None and type(tokenizer).__name__.startswith("Marian"):
        return "marian"  # a converted model without thinktrans-ct2.json: the tokenizer tells
    if model_type not in ("m2m_100", "nllb-moe", None):
        return None
    # NLLB checkpoints say model_type m2m_100 too; the tokenizer tells them apart.
    name = type(tokenizer).__name__
    if name.startswith("Nllb"):
        return "nllb"
    if hasattr(tokenizer, "lang_code_to_id") and hasattr(tokenizer, "get_lang_id"):
        return "m2m100"
    if "eng_Latn" in tokenizer.get_vocab():  # a generic fast tokenizer with flores tokens
        return "nllb"
    return None


def language_codes(family: str, spec: Spec, tokenizer: Any
                   ) -> tuple[str | None, dict[str, str], frozenset[int]]:
    """What a checkpoint of ``family`` serves: (Marian's source key or None, codes, the ids
    never decoded). NLLB/M2M codes map a table key to the family's code; Marian's map a
    target key to its text prefix ("" or a ``>>fra<<`` token). LoadError when Marian's pair
    cannot be told."""
    drop = set(tokenizer.all_special_ids)
    source: str | None = None
    if family == "nllb":
        vocab = tokenizer.get_vocab()
        codes = {key: code for key, code in NLLB_CODES.items() if code in vocab}
        drop.update(i for token, i in vocab.items() if _FLORES.match(token))
    elif family == "m2m100":
        known = tokenizer.lang_code_to_id
        codes = {key: code for key, code in M2M_CODES.items() if code in known}
        drop.update(known.values())
    else:
        source, codes = marian_pair(spec, tokenizer)
    return source, codes, frozenset(drop)


def published_family(model_id: str) -> str | None:
    """The family a hub id's publisher tells (``facebook/nllb-200-...``: nllb), or None: for
    notes and hints about a model not loaded, never for serving one."""
    named = model_id.lower()
    return next((family for prefix, family in _PUBLISHED if named.startswith(prefix)), None)


def licence(family: str | None, model_id: str) -> str | None:
    """What the weights of a ``family`` checkpoint are licensed under; for a model not loaded
    (``family`` None), its publisher tells it (``published_family``). None when not known."""
    family = family or published_family(model_id)
    return LICENCES.get(family) if family is not None else None


def lang_token_id(family: str, tokenizer: Any, code: str) -> int:
    """The id of the language token of ``code`` (NLLB's flores token, M2M-100's ``__de__``)."""
    if family == "m2m100":
        return int(tokenizer.get_lang_id(code))
    return int(tokenizer.convert_tokens_to_ids(code))


def marian_pair(spec: Spec, tokenizer: Any) -> tuple[str, dict[str, str]]:
    """The (source key, {target key: prefix}) of a Marian checkpoint. Its pair is, first that
    applies: the spec's ``src-tgt=`` prefix, the tokenizer's saved ``source_lang`` and
    ``target_lang``, an ``opus-mt-src-tgt`` name; multi-target checkpoints (``>>fra<<``
    tokens) serve every target in the table they have a token for."""
    pair = spec.pair
    if pair is None:
        saved = tokenizer.init_kwargs
        pair = _pair_from(saved.get("source_lang"), saved.get("target_lang"))
    if pair is None:
        match = _OPUS_NAME.search(spec.model_id.rstrip("/"))
        pair = _pair_from(match["src"], match["tgt"]) if match else None
    multi = getattr(tokenizer, "supported_language_codes", None) or []
    if multi:  # ">>fra<<" tokens: one checkpoint, several targets
        targets: dict[str, str] = {}
        for token in multi:
            key = key_or_none(token[2:-2].replace("_", "-"))
            if key in NLLB_CODES or key in M2M_CODES:  # a language of this backend's tables
                targets.setdefault(key, token)
        if pair is not None and pair[1] in targets:
            targets = {pair[1]: targets[pair[1]]}
        source = pair[0] if pair is not None else FALLBACK_SOURCE
        return source, targets
    if pair is None:
        raise LoadError(
            f"cannot tell the language pair of Marian checkpoint {spec.model_id!r}: write it as "
            f"'en-de={spec.model_id}' in THINKTRANS_LOCAL_MODEL or THINKTRANS_LOCAL_MARIAN_MODELS"
        )
    return pair[0], {pair[1]: ""}


def _pair_from(source: object, target: object) -> tuple[str, str] | None:
    if not isinstance(source, str) or not isinstance(target, str):
        return None
    src, tgt = key_or_none(source), key_or_none(target)
    if src is None or tgt is None:
        return None
    return src, tgt


# -- where a checkpoint is ---------------------------------------------------------------------


def looks_local(model_id: str) -> bool:
    """Whether ``model_id`` names a directory (a path, or a name that exists as one), not a
    hub id: transformers loads an existing directory first too."""
    return model_id.startswith(("/", "./", "../", "~")) or Path(model_id).expanduser().exists()


@functools.lru_cache(maxsize=512)
def canonical_name(name: str) -> str:
    """One spelling per model, before anything else looks at a name: a directory resolved
    (``/m/./``, ``//m``, ``/m/``, ``/x/../m`` and a symlink to it are all ``/m``), a Marian
    pair prefix kept (``en-de=/m``); a hub id as written, less blanks and a trailing ``/``.
    Remembered for the last 512 names (it is asked for every segment)."""
    pair, model_id = parse_pair_spec(name)
    if looks_local(model_id):
        model_id = os.path.realpath(os.path.expanduser(model_id))
    else:
        model_id = model_id.rstrip("/")
    return f"{pair[0]}-{pair[1]}={model_id}" if pair is not None else model_id


def on_demand_refusal(name: str, roots: Sequence[Path], hub: bool) -> str | None:
    """Why a canonical name a request gave may not be loaded on demand here (for the log,
    never for the client), or None: a directory must lie under one of ``roots`` (resolved),
    a hub id must be one, and hub ids must be allowed (``hub``)."""
    _, model_id = parse_pair_spec(name)
    if looks_local(model_id):
        path = Path(model_id)
        if any(path == root or root in path.parents for root in roots):
            return None
        where = ", ".join(map(str, roots)) or "none set"
        return (f"{model_id!r} is not under a directory of THINKTRANS_LOCAL_MODEL_ROOTS "
                f"({where})")
    if not hub:
        return f"{model_id!r} is a hub id, and THINKTRANS_LOCAL_HUB_MODELS is off"
    if not _HUB_ID.match(model_id) or "--" in model_id or ".." in model_id:
        return f"{model_id!r} is neither a directory nor a hub id"
    return None


# The statuses the hub client retries for half a minute, with backoff, before it gives up
# (429 aside: a hub that rate-limits is up); a hub, or the proxy before it, that answers one
# of them cannot serve a download now.
_RETRIED_STATUSES = frozenset({408, 500, 502, 503, 504})


def hub_unreachable(model_id: str, timeout_s: float = 3.0) -> bool:
    """Whether ``model_id`` names a hub repository while the hub cannot serve it: one HEAD of
    its ``config.json``, through the hub client's own session (its proxies, its CA), finds
    no answer within ``timeout_s`` (the name does not resolve, the connection is refused or
    closed) or a status the hub client would retry. One request, never retried."""
    if looks_local(model_id):
        return False  # a local directory
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False  # already offline: the hub client does not try the network
    why = _hub_answer(model_id, timeout_s)
    if why is not None:
        log.warning("local: the model hub %s %s; loading %r from the local cache only",
                    constants.ENDPOINT, why, model_id)
        return True
    return False


def _hub_answer(model_id: str, timeout_s: float) -> str | None:
    """None when the hub answers a HEAD of ``model_id``'s config.json with a status it would
    not retry, else why not. A thread bounds the wait: a name lookup has no timeout of its
    own, and a resolver that does not answer holds it for 5 s per try."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    url = f"{constants.ENDPOINT.rstrip('/')}/{quote(model_id)}/resolve/main/config.json"
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            response = get_session().head(url, timeout=timeout_s, follow_redirects=False)
        except Exception as exc:  # refused, reset, closed, timed out, not resolved, bad TLS
            outcome.append(f"is unreachable ({first_line(exc) or type(exc).__name__})")
            return
        status = response.status_code
        outcome.append(f"answers {status}" if status in _RETRIED_STATUSES else None)

    probe = threading.Thread(target=ask, name="thinktrans-hub-probe", daemon=True)
    probe.start()
    probe.join(timeout_s + 1.0)
    return outcome[0] if outcome else f"did not answer within {timeout_s:g} s"


def cache_only(spec: Spec) -> bool:
    """Whether ``spec``'s checkpoint loads from the local cache only: a hub id while
    HF_HUB_OFFLINE is set or the hub cannot serve it (probed once). Asked before any engine
    is imported, so that when the cache has no copy either the LoadError comes at once."""
    if looks_local(spec.model_id):
        return False
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        return False  # the engine's import names the extra to install
    offline = bool(constants.HF_HUB_OFFLINE)
    unreachable = not offline and hub_unreachable(spec.model_id)
    if not (offline or unreachable):
        return False
    try:
        cached = isinstance(try_to_load_from_cache(spec.model_id, "config.json"), str)
    except ValueError:  # not a valid hub id: nothing of it can be cached
        cached = False
    if not cached:
        why = ("HF_HUB_OFFLINE is set" if offline
               else f"the hub {constants.ENDPOINT} cannot serve it now")
        raise LoadError(not_found_reason(
            spec.model_id, OSError(f"{why}, and {constants.HF_HUB_CACHE} has no copy"),
            spec.setting))
    return True


def not_found_reason(model_id: str, exc: BaseException,
                     setting: str = "THINKTRANS_LOCAL_MODEL") -> str:
    """Why ``model_id`` could not be loaded, and what to set (``setting``: where it was
    named) to fix it."""
    looks_local = model_id.startswith(("/", "./", "../", "~")) or Path(model_id).exists()
    path = Path(model_id).expanduser()
    unreadable = sorted(p.name for p in path.iterdir()
                        if p.is_file() and not os.access(p, os.R_OK)) if path.is_dir() else []
    if unreadable:
        # save_pretrained writes model.safetensors as 0600; a non-root container cannot read it
        return (
            f"cannot read {', '.join(unreadable)} in {model_id!r} as uid {os.getuid()}: make "
            f"the checkpoint readable (chmod -R a+rX {model_id})"
        )
    if looks_local and not path.exists():
        return (
            f"model directory {model_id!r} does not exist: set {setting} to a "
            "checkpoint directory or a hub id (HF_HUB_OFFLINE=1 keeps hub ids to the local cache)"
        )
    if path.is_dir():
        return (
            f"{model_id!r} is not a loadable checkpoint directory ({first_line(exc)}): set "
            f"{setting} to a directory written by save_pretrained, or to a hub id "
            "(HF_HUB_OFFLINE=1 keeps hub ids to the local cache)"
        )
    reason = (
        f"model {model_id!r} not found locally and the hub is unreachable or does not have it "
        f"({first_line(exc)}): set {setting} to a local directory or pre-seed HF_HOME "
        "with it; HF_HUB_OFFLINE=1 skips the network"
    )
    if setting.startswith("THINKTRANS_LOCAL_MODEL"):  # configured: the operator's first run
        # A test model of the family that serves every target this one would: NLLB-200's
        # 202 languages (M2M-100's 100 for an M2M-100 id); Marian's would serve en-de alone.
        family = "m2m100" if published_family(model_id) == "m2m100" else "nllb"
        reason += (
            ". To start now without it: THINKTRANS_BACKEND=passthrough (the originals, "
            f"untranslated), or `thinktrans make-test-model --family {family} DIR` and "
            f"{setting}=DIR (a tiny random-weight model of every {_FAMILY_NAMES[family]} "
            "language: noise, to try the service)"
        )
    return reason


# -- versions ----------------------------------------------------------------------------------


def directory_fingerprint(path: Path) -> str:
    """A checkpoint directory's version: its path and its files' names, sizes and times, so
    that one replaced in place never shares a cached translation or a conversion with the
    one before."""
    digest = hashlib.sha256(str(path.resolve()).encode())
    for entry in sorted(path.iterdir()):
        if entry.is_file():
            stat = entry.stat()
            digest.update(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def version(model_id: str) -> str:
    """A checkpoint directory's fingerprint; "" for a hub id (its revision is not known
    without asking the hub)."""
    path = Path(model_id).expanduser()
    return directory_fingerprint(path) if path.is_dir() else ""
