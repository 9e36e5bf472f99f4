"""BCP 47 tags on the agent side: a well-formedness check and the sidecar's canonical form.

The sidecar is the authority on targets (it knows the registry and the allowed list);
this module keeps a malformed or unsafe tag from ever being sent, and writes a good one
the way the sidecar does (``ZH-cn`` -> ``zh-CN``, ``tl`` -> ``fil``, ``en-UK`` -> ``en-GB``,
``en-Latn-US`` -> ``en-US``), so that the two compare equal. Standard library only.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["MAX_TAG_LENGTH", "InvalidLocale", "canonicalize", "is_allowed", "language_of"]

MAX_TAG_LENGTH = 64
_SHAPE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*")
_EXAMPLES = "examples: 'zh-CN', 'en', 'pt-BR'"
# Control, format (bidi marks, zero-width), line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _table(text: str) -> dict[str, str]:
    return dict(pair.split("=") for pair in text.split())


# Language codes written another way: withdrawn ISO 639 codes, and the three-letter codes of
# languages that have a two-letter one. A script or region in the value applies unless the
# tag names its own (``sh-Cyrl`` -> ``sr-Cyrl``).
_LANGUAGES = _table("""
    aar=aa abk=ab adp=dz afr=af aka=ak alb=sq amh=am ara=ar arg=an arm=hy asm=as ava=av
    ave=ae aym=ay aze=az bak=ba bam=bm baq=eu bel=be ben=bn bih=bh bis=bi bod=bo bos=bs
    bre=br bul=bg bur=my cat=ca cha=ch che=ce chi=zh chu=cu chv=cv cnr=sr-ME cor=kw
    cos=co cre=cr cym=cy cze=cs ces=cs dan=da deu=de div=dv drh=mn drw=fa-AF dut=nl dzo=dz
    ell=el eng=en epo=eo est=et eus=eu ewe=ee fao=fo fas=fa fij=fj fin=fi fra=fr fre=fr
    fry=fy ful=ff geo=ka ger=de gla=gd gle=ga glg=gl glv=gv gre=el grn=gn guj=gu hat=ht
    hau=ha hbs=sr-Latn heb=he her=hz hin=hi hmo=ho hrv=hr hun=hu hye=hy ibo=ig ice=is
    ido=io iii=ii iku=iu ile=ie in=id ina=ia ind=id ipk=ik isl=is ita=it iw=he jav=jv
    ji=yi jpn=ja jw=jv kal=kl kan=kn kas=ks kat=ka kau=kr kaz=kk khm=km kik=ki kin=rw
    kir=ky kom=kv kon=kg kor=ko kua=kj kur=ku lao=lo lat=la lav=lv lim=li lin=ln lit=lt
    ltz=lb lub=lu lug=lg mac=mk mah=mh mal=ml mao=mi mar=mr may=ms mkd=mk mlg=mg mlt=mt
    mo=ro mol=ro mon=mn mri=mi msa=ms mya=my nau=na nav=nv nbl=nr nde=nd ndo=ng nep=ne
    nld=nl nno=nn nob=nb nor=no nya=ny oci=oc oji=oj ori=or orm=om oss=os pan=pa per=fa
    pli=pi pol=pl por=pt prs=fa-AF pus=ps que=qu roh=rm ron=ro rum=ro run=rn rus=ru
    sag=sg san=sa scc=sr scr=hr sh=sr-Latn sin=si slk=sk slo=sk slv=sl sme=se smo=sm
    sna=sn snd=sd som=so sot=st spa=es sqi=sq srd=sc srp=sr ssw=ss sun=su swa=sw
    swc=sw-CD swe=sv tah=ty tam=ta tat=tt tel=te tgk=tg tgl=fil tha=th tib=bo tir=ti
    tl=fil tnf=fa-AF ton=to tsn=tn tso=ts tuk=tk tur=tr twi=tw uig=ug ukr=uk urd=ur
    uzb=uz ven=ve vie=vi vol=vo wel=cy wln=wa wol=wo xho=xh yid=yi yor=yo zha=za zho=zh
    zul=zu
""")
# Whole legacy tags (grandfathered and redundant ones the registry replaced), lower case.
_WHOLE_TAGS = _table("""
    aa-saaho=ssy art-lojban=jbo cel-gaulish=xtg en-gb-oed=en-GB-oxendict hy-arevmda=hyw
    no-bok=nb no-bokmal=nb no-nyn=nn no-nynorsk=nn sgn-be-fr=sfb sgn-be-nl=vgt
    sgn-br=bzs sgn-ch-de=sgg sgn-co=csn sgn-de=gsg sgn-dk=dsl sgn-es=ssp sgn-fr=fsl
    sgn-gb=bfi sgn-gr=gss sgn-ie=isg sgn-it=ise sgn-jp=jsl sgn-mx=mfs sgn-ni=ncs
    sgn-nl=dse sgn-no=nsi sgn-pt=psr sgn-se=swl sgn-us=ase sgn-za=sfs zh-cmn=zh
    zh-cmn-hans=zh-Hans zh-cmn-hant=zh-Hant zh-gan=gan zh-guoyu=zh zh-hakka=hak
    zh-min=nan-x-zh-min zh-min-nan=nan zh-wuu=wuu zh-xiang=hsn zh-yue=yue
""")
# A language and its extlang, written as one language inside a longer tag (``zh-yue-HK``).
_EXTLANGS = _table("zh-cmn=zh zh-gan=gan zh-wuu=wuu zh-yue=yue")
# Withdrawn two-letter regions.
_REGIONS = _table("""
    AN=CW BU=MM CS=RS CT=KI DD=DE DY=BJ FQ=AQ FX=FR HV=BF JT=UM MI=UM NH=VU NQ=AQ NT=SA
    PC=FM PU=UM PZ=PA QU=EU RH=ZW SU=RU TP=TL UK=GB VD=VN WK=UM YD=YE YU=RS ZR=CD
""")
# The script each language is written in unless a tag says otherwise: naming it says nothing.
_DEFAULT_SCRIPTS = {language: script for script, languages in {
    "Latn": "af ay bs ca ch cs cy da de dsb en eo es et eu fi fj fo fr frr frs fy ga gl gn "
            "gsw gv hr hsb ht hu id is it kl la lb ln lt lv men mg mh ms mt na nb nd nds niu "
            "nl nn no nr nso ny om pl pt qu rm rn ro rw sg sk sl sm so sq ss st sv sw tem tkl "
            "tmh tn to tpi tr ts tvl ve vi xh zu",
    "Cyrl": "ab be bg kk mk ru uk", "Deva": "hi kok mai mr ne", "Arab": "ar fa ps ur",
    "Hebr": "he yi", "Ethi": "am ti", "Beng": "as bn", "Thaa": "dv", "Tibt": "dz",
    "Grek": "el", "Gujr": "gu", "Armn": "hy", "Jpan": "ja", "Geor": "ka", "Khmr": "km",
    "Knda": "kn", "Kore": "ko", "Laoo": "lo", "Mlym": "ml", "Mymr": "my", "Nkoo": "nqo",
    "Orya": "or", "Guru": "pa", "Sinh": "si", "Taml": "ta", "Telu": "te", "Thai": "th",
    "Blis": "zbl",
}.items() for language in languages.split()}
# Codes that stay distinct but name one language when matching allowed locales (as the
# sidecar's backends write ``no`` as Bokmal).
_SAME_LANGUAGE = {"no": "nb"}


class InvalidLocale(ValueError):
    """A value that is not a well-formed BCP 47 tag; the message says what to send, and
    never holds a tag that failed the shape check."""


def _alpha(s: str) -> bool:
    return s.isascii() and s.isalpha()


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _is_variant(s: str) -> bool:
    return 5 <= len(s) <= 8 or (len(s) == 4 and _digits(s[0]))


class _Subtags(NamedTuple):
    language: str
    extlangs: list[str]
    script: str | None
    region: str | None
    variants: list[str]
    tail: list[str]  # extensions and private use, as sent


def canonicalize(tag: object) -> str:
    """The tag as the sidecar writes it (``ZH-cn`` -> ``zh-CN``, ``tl`` -> ``fil``), or raise.

    Well-formed per RFC 5646: language (2-3 letters, up to three 3-letter extlangs),
    then optional script (4 letters), region (2 letters or 3 digits), distinct variants,
    extensions (a singleton and 2-8 character subtags) and private use (``x-...``).
    Raises InvalidLocale otherwise.

    The tables are the sidecar's (langcodes', which the service's tests hold them to):
    withdrawn and synonymous codes, Chinese extlangs and legacy tags, withdrawn regions, a
    script a language is written in anyway. What they leave out the sidecar may still
    rewrite (numeric regions: ``en-840``; withdrawn three-letter codes of languages without
    a two-letter one) or refuse (unregistered subtags: 422). ``zh_CN`` is not a tag.
    """
    if not isinstance(tag, str) or not tag:
        raise InvalidLocale(f"locale must be a non-empty BCP 47 tag; {_EXAMPLES}")
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidLocale(f"locale is {len(tag)} characters long; "
                            f"a BCP 47 tag here is at most {MAX_TAG_LENGTH}")
    if any(unicodedata.category(ch) in _UNSAFE_CATEGORIES for ch in tag):
        raise InvalidLocale("locale contains control or bidi characters; send a plain BCP 47 tag")
    if not _SHAPE.fullmatch(tag):
        hint = " (use '-', not '_')" if "_" in tag else ""
        raise InvalidLocale(f"locale is not a BCP 47 tag{hint}; {_EXAMPLES}")
    # From here on the tag is only ASCII letters, digits and '-': safe to quote.
    whole = _WHOLE_TAGS.get(tag.lower())
    if whole is not None:
        return whole
    bad = InvalidLocale(f"{tag!r} is not a well-formed BCP 47 tag; {_EXAMPLES}")
    parts = _split(tag.lower().split("-"), bad)
    language, script, region = parts.language, parts.script, parts.region
    replacement = _LANGUAGES.get(language)
    if replacement is not None:
        language, *implied = replacement.split("-")
        for subtag in implied:  # what the tag names itself wins
            if len(subtag) == 4:
                script = script or subtag
            else:
                region = region or subtag
    extlangs = []
    for extlang in parts.extlangs:
        merged = _EXTLANGS.get(f"{language}-{extlang}")
        if merged is None:
            extlangs.append(extlang)
        else:
            language = merged
    if script == _DEFAULT_SCRIPTS.get(language):
        script = None
    if region is not None:
        region = _REGIONS.get(region, region)
    return "-".join([language, *sorted(extlangs), *([script] if script else []),
                     *([region] if region else []), *sorted(parts.variants), *parts.tail])


def _split(subtags: list[str], bad: InvalidLocale) -> _Subtags:
    """A lower-case tag's subtags by kind, script and region in their case; raise ``bad``."""
    language = subtags[0]
    # 4 letters are reserved and no 5-8 letter language is registered: neither is usable.
    if len(language) > 3 or language == "und":
        raise bad
    extlangs: list[str] = []
    i = 1
    while i < len(subtags) and i <= 3 and len(subtags[i]) == 3 and _alpha(subtags[i]):
        extlangs.append(subtags[i])
        i += 1
    script = region = None
    if i < len(subtags) and len(subtags[i]) == 4 and _alpha(subtags[i]):
        script = subtags[i].title()
        i += 1
    if i < len(subtags) and ((len(subtags[i]) == 2 and _alpha(subtags[i]))
                             or (len(subtags[i]) == 3 and _digits(subtags[i]))):
        region = subtags[i].upper()
        i += 1
    variants: list[str] = []
    while i < len(subtags) and _is_variant(subtags[i]):
        if subtags[i] in variants:
            raise bad
        variants.append(subtags[i])
        i += 1
    tail: list[str] = []
    singletons: set[str] = set()
    while i < len(subtags):
        singleton = subtags[i]
        if len(singleton) != 1 or singleton in singletons:
            raise bad
        singletons.add(singleton)
        tail.append(singleton)
        i += 1
        start = i
        if singleton == "x":  # private use: everything after it, 1-8 characters each
            tail.extend(subtags[i:])
            i = len(subtags)
        else:
            while i < len(subtags) and len(subtags[i]) >= 2:
                tail.append(subtags[i])
                i += 1
        if i == start:
            raise bad  # a singleton with nothing after it
    return _Subtags(language, extlangs, script, region, variants, tail)


def language_of(tag: str) -> str:
    """The language subtag of a canonical tag: ``zh-Hant-TW`` -> ``zh``."""
    return tag.split("-", 1)[0]


def _is_bare(tag: str) -> bool:
    """Whether a canonical tag names neither a script nor a region (``zh``, ``de-1996``)."""
    for subtag in tag.split("-")[1:]:
        if len(subtag) == 1:
            break  # extensions and private use say nothing about script or region
        if (len(subtag) == 4 and _alpha(subtag)) or (
                len(subtag) in (2, 3) and (subtag.isupper() or _digits(subtag))):
            return False
    return True


def is_allowed(tag: str, allowed: Iterable[str]) -> bool:
    """Whether canonical ``tag`` is admitted by ``allowed`` (empty: everything is).

    An entry admits itself; an entry without script or region admits every variant of its
    language (``zh`` admits ``zh-CN`` and ``zh-Hant-TW``; ``zh-CN`` admits only itself).
    Entries are canonicalised first (``tl`` is ``fil``), and codes that name one language
    match each other (``nb`` admits ``no``); a malformed entry admits nothing.
    """
    entries = [allowed] if isinstance(allowed, str) else list(allowed)
    if not entries:
        return True
    for raw in entries:
        try:
            entry = canonicalize(raw)
        except InvalidLocale:
            continue
        if entry == tag or _keyed(entry) == _keyed(tag):
            return True
        if _is_bare(entry) and _language_key(entry) == _language_key(tag):
            return True
    return False


def _language_key(tag: str) -> str:
    language = language_of(tag)
    return _SAME_LANGUAGE.get(language, language)


def _keyed(tag: str) -> str:
    """A canonical tag with its language written as its key: ``no-NO`` -> ``nb-NO``."""
    _, _, rest = tag.partition("-")
    return f"{_language_key(tag)}-{rest}" if rest else _language_key(tag)
