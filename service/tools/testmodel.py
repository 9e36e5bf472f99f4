"""Translation checkpoints for tests: the real model and tokenizer classes, random weights.

The local backend is tested, and a deployment smoke-tested, without downloading weights:
``make_test_model("nllb", dir)`` writes a checkpoint that ``from_pretrained`` and
CTranslate2's converter load exactly as a real NLLB-200, M2M-100 or Marian one (same
``model_type``, tokenizer class and files, the family's language tokens), tiny and in about
a second; with ``shape=`` one of a real model's size, for timing and memory runs. Every
config.json says ``"thinktrans_test_checkpoint": true``. Command line: ``--help``.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from models.local.convert import make_readable

FAMILIES = ("nllb", "m2m100", "marian")

# A few lines per script, enough for a vocabulary that covers the table's common languages.
_CORPUS = (
    "Hmm, the user said hello. Let me think about what they want.",
    "First, I need to check the file and then run the tests again.",
    "The function returns a list of numbers; maybe the bug is in the loop.",
    "Hallo, der Benutzer hat Hallo gesagt. Ich muss die Datei prüfen.",
    "Bonjour, l'utilisateur a dit bonjour. Je dois vérifier le fichier.",
    "Hola, el usuario dijo hola. Tengo que revisar el archivo.",
    "Olá, o usuário disse olá. Preciso verificar o arquivo.",
    "Ciao, l'utente ha detto ciao. Devo controllare il file.",
    "Hallo, de gebruiker zei hallo. Ik moet het bestand controleren.",
    "Cześć, użytkownik powiedział cześć. Muszę sprawdzić plik.",
    "Merhaba, kullanıcı merhaba dedi. Dosyayı kontrol etmeliyim.",
    "Xin chào, người dùng đã nói xin chào.",
    "Привет, пользователь сказал привет. Нужно проверить файл.",
    "Привіт, користувач сказав привіт.",
    "Γεια σας, ο χρήστης είπε γεια.",
    "嗯，用户说了你好。让我想想他们想要什么。",
    "首先，我需要检查文件，然后再次运行测试。",
    "嗯，用戶說了你好。讓我想想他們想要什麼。",
    "こんにちは、ユーザーがこんにちはと言いました。ファイルを確認します。",
    "안녕하세요, 사용자가 안녕이라고 말했습니다.",
    "مرحبا، قال المستخدم مرحبا.",
    "שלום, המשתמש אמר שלום.",
    "नमस्ते, उपयोगकर्ता ने नमस्ते कहा।",
    "สวัสดี ผู้ใช้พูดว่าสวัสดี",
    "0123456789 ()[]{}<>=+-*/%&|^~!?.,;:'\"`@#$_\\",
)

_TINY: dict[str, Any] = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 256,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    # Far above the real 0.02: with tiny weights every input decodes to the same garbage,
    # and tests could not tell one segment's output from another's.
    "init_std": 0.5,
    # Saved in config.json: the local backend then knows its output is noise in no
    # particular language and does not hold it to the output-language check.
    "thinktrans_test_checkpoint": True,
}
# Random weights would often stop at once or emit only special tokens, which decode to "".
_MIN_NEW_TOKENS = 4

# m2m100_418M's and nllb-200-distilled-600M's config.json (M2M100Config's defaults, spelled out).
_M2M_LARGE: dict[str, Any] = {
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "max_position_embeddings": 1024,
    "activation_function": "relu",
    "scale_embedding": True,
    "dropout": 0.1,
    "attention_dropout": 0.1,
}

# A real model's shape: its family, its config.json's dimensions, and its vocabulary:
# ``pieces`` counts what the tokenizer is built from (NLLB: the sentencepiece model; M2M-100 and
# Marian: vocab.json), ``vocab_size`` the embedding rows (None: as many as the tokenizer has).
_SHAPES: dict[str, dict[str, Any]] = {
    "marian": {  # Helsinki-NLP/opus-mt-en-de
        "family": "marian",
        "pieces": 58101,
        "vocab_size": None,
        "config": {
            "d_model": 512,
            "encoder_layers": 6,
            "decoder_layers": 6,
            "encoder_attention_heads": 8,
            "decoder_attention_heads": 8,
            "encoder_ffn_dim": 2048,
            "decoder_ffn_dim": 2048,
            "max_position_embeddings": 512,
            "activation_function": "swish",
            "scale_embedding": True,
            "dropout": 0.1,
            "attention_dropout": 0.0,
        },
    },
    "m2m-418m": {  # facebook/m2m100_418M: 128004 + 100 languages + 8 madeup words = 128112
        "family": "m2m100",
        "pieces": 128004,
        "vocab_size": 128112,
        "config": _M2M_LARGE,
    },
    "nllb-600m": {  # facebook/nllb-200-distilled-600M: 4 + 255997 + 202 languages + <mask>
        "family": "nllb",
        "pieces": 256000,
        "vocab_size": 256206,
        "config": _M2M_LARGE,
    },
}
SHAPES: dict[str, str] = {name: spec["family"] for name, spec in _SHAPES.items()}


def shape_config(shape: str) -> dict[str, Any]:
    """The dimensions of a real model's shape (its config.json's), e.g. ``d_model``."""
    return dict(_SHAPES[shape]["config"])

_REAL: dict[str, Any] = {"init_std": 0.02, "thinktrans_test_checkpoint": True}


def _train_spm(model_type: str, vocab_size: int) -> bytes:
    """Train a sentencepiece model on the small corpus, in memory, deterministically."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 4),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        hard_vocab_limit=False,  # the corpus is too small to promise an exact size
        num_threads=1,  # one thread: the same pieces every run
        minloglevel=2,
    )
    return buf.getvalue()


def _pad_spm(model: bytes, count: int) -> bytes:
    """``model`` with ``count`` more pieces, ``▁tt<n>``: NORMAL pieces scored far below every
    trained one, which no input produces (no trained piece spells ``▁tt``), so the text of the
    small model tokenizes exactly as before; they only make the vocabulary a real one's size."""
    from sentencepiece import sentencepiece_model_pb2

    pb2: Any = sentencepiece_model_pb2  # generated code: no ModelProto for mypy to see
    proto = pb2.ModelProto()
    proto.ParseFromString(model)
    # The shortest ▁tt<n> split only into ▁ + tt<n>, ▁t + t<n> and ▁tt + <n>, the longer ones
    # into a shorter ▁tt<n> and digits too: without these trained pieces, BPE never merges one
    # (and unigram, with every trained piece scored higher, never picks one).
    if any(re.fullmatch(r"▁tt|t{1,2}\d+", piece.piece) for piece in proto.pieces):
        raise RuntimeError("the trained sentencepiece model has pieces that reach ▁tt<n>")
    lowest = min(piece.score for piece in proto.pieces)
    normal = pb2.ModelProto.SentencePiece.NORMAL
    for n in range(count):
        piece = proto.pieces.add()
        piece.piece = f"▁tt{n}"
        piece.score = lowest - 1000.0 - n
        piece.type = normal
    proto.trainer_spec.vocab_size = len(proto.pieces)
    return bytes(proto.SerializeToString())


def _spm_for(shape: str | None, model_type: str, size: Callable[[Any], int]) -> bytes:
    """The small trained model; for ``shape``, padded until ``size(processor)`` (the size of what
    the family builds from it) reaches the shape's ``pieces``."""
    import sentencepiece as spm

    model = _train_spm(model_type, 400)
    if shape is None:
        return model
    have = size(spm.SentencePieceProcessor(model_proto=model))
    return _pad_spm(model, _SHAPES[shape]["pieces"] - have)


def _config_kwargs(shape: str | None) -> dict[str, Any]:
    return dict(_TINY) if shape is None else {**_SHAPES[shape]["config"], **_REAL}


def _generation_config(
    *, banned: Sequence[int], start: int, eos: int, pad: int, shape: str | None
) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(
        decoder_start_token_id=start,
        eos_token_id=eos,
        pad_token_id=pad,
        # Before ForcedBOS in the processor order, so a forced language token still wins.
        bad_words_ids=[[i] for i in sorted(set(banned))],
        # A shape's weights are real-sized and scaled, and EOS is one token among 58k-256k.
        min_new_tokens=_MIN_NEW_TOKENS if shape is None else None,
    )


def _special_ids(tokenizer: Any, keep: int) -> list[int]:
    ids = set(tokenizer.all_special_ids)
    return sorted(i for i in ids if i != keep)


def _seed() -> None:
    import torch

    torch.manual_seed(0)


def language_code(family: str, tag: str) -> str:
    """The code of BCP 47 ``tag`` in ``family``: ``eng_Latn`` (NLLB), ``en`` (M2M-100's
    ``__en__`` token), ``en`` (Marian, the tag itself); ValueError naming what is known."""
    from models.languages import canonical, table_key
    from models.local.checkpoint import M2M_CODES, NLLB_CODES

    standard = canonical(tag)
    if standard is None:
        raise ValueError(f"{tag!r} is not a BCP 47 language tag, e.g. en, de, zh-CN")
    if family == "marian":
        return standard
    codes = NLLB_CODES if family == "nllb" else M2M_CODES
    code = codes.get(table_key(standard))
    if code is None:
        raise ValueError(f"{tag!r} is not in the local backend's language table; "
                         f"choose from {', '.join(sorted(codes))}")
    return code


def _make_nllb(outdir: Path, source_lang: str, target_lang: str, shape: str | None) -> None:
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory() as tmp:
        spm_model = _spm_for(shape, "bpe", lambda processor: processor.get_piece_size())
        (Path(tmp) / "sentencepiece.bpe.model").write_bytes(spm_model)
        # Loading from the .model file runs the library's own slow-to-fast conversion (about a
        # second for 256k pieces); the saved tokenizer.json loads without it.
        tokenizer = NllbTokenizer.from_pretrained(
            tmp, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES), src_lang=source_lang,
            tgt_lang=target_lang,
        )
        tokenizer.save_pretrained(outdir)
    eos = tokenizer.eos_token_id
    vocab_size = len(tokenizer) if shape is None else _SHAPES[shape]["vocab_size"]
    config = M2M100Config(
        vocab_size=vocab_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        decoder_start_token_id=eos,
        **_config_kwargs(shape),
    )
    config.tokenizer_class = "NllbTokenizer"  # as the real checkpoints' config.json says
    _seed()
    model = M2M100ForConditionalGeneration(config).eval()
    # A shape's last rows (2 in nllb-200) have no token, as in the real checkpoint.
    banned = [*_special_ids(tokenizer, eos), *range(len(tokenizer), vocab_size)]
    model.generation_config = _generation_config(
        banned=banned, start=eos, eos=eos, pad=tokenizer.pad_token_id, shape=shape
    )
    model.save_pretrained(outdir)


def _fairseq_vocab(processor: Any) -> dict[str, int]:
    """fairseq's dictionary: four specials first, then the pieces (M2M-100's vocab.json)."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(processor.get_piece_size()):
        vocab.setdefault(processor.id_to_piece(i), len(vocab))
    return vocab


def _make_m2m100(outdir: Path, source_lang: str, target_lang: str, shape: str | None) -> None:
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory() as tmp:
        spm_model = _spm_for(shape, "bpe", lambda processor: len(_fairseq_vocab(processor)))
        spm_path = Path(tmp) / "sentencepiece.bpe.model"
        spm_path.write_bytes(spm_model)
        import sentencepiece as spm

        vocab = _fairseq_vocab(spm.SentencePieceProcessor(model_proto=spm_model))
        vocab_path = Path(tmp) / "vocab.json"
        vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        # As the real tokenizer_config.json: the language tokens are special tokens, so they
        # are added tokens at their ids (after vocab.json's), and get_vocab() includes them:
        # CTranslate2's converter takes the vocabulary from there (with transformers 5,
        # special_tokens_map holds only the named tokens: get_vocab() is the only way).
        languages = [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
        tokenizer = M2M100Tokenizer(vocab_file=str(vocab_path), spm_file=str(spm_path),
                                    src_lang=source_lang, tgt_lang=target_lang,
                                    additional_special_tokens=languages)
        misplaced = [token for token, i in tokenizer.lang_token_to_id.items()
                     if tokenizer.convert_tokens_to_ids(token) != i]
        if misplaced:
            raise RuntimeError(f"M2M-100 language tokens at the wrong ids: {misplaced[:3]}")
        tokenizer.save_pretrained(outdir)
    eos = tokenizer.eos_token_id
    # The real vocabulary also ends in the language ids and eight "madeup" words.
    vocab_size = len(vocab) + len(tokenizer.lang_code_to_id) + tokenizer.num_madeup_words
    if shape is not None and vocab_size != _SHAPES[shape]["vocab_size"]:
        raise RuntimeError(f"{shape}: {vocab_size} rows, not {_SHAPES[shape]['vocab_size']}")
    config = M2M100Config(
        vocab_size=vocab_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=0,
        eos_token_id=eos,
        decoder_start_token_id=eos,
        **_config_kwargs(shape),
    )
    _seed()
    model = M2M100ForConditionalGeneration(config).eval()
    banned = [*_special_ids(tokenizer, eos), *range(len(vocab), vocab_size)]
    model.generation_config = _generation_config(
        banned=banned, start=eos, eos=eos, pad=tokenizer.pad_token_id, shape=shape
    )
    model.save_pretrained(outdir)


def _marian_vocab(processor: Any) -> dict[str, int]:
    """opus-mt's layout: </s> 0, <unk> 1, the pieces, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(processor.get_piece_size()):
        piece = processor.id_to_piece(i)
        if piece not in ("<s>", "</s>", "<unk>"):
            vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def _make_marian(outdir: Path, source_lang: str, target_lang: str, shape: str | None) -> None:
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        spm_bytes = _spm_for(shape, "unigram", lambda processor: len(_marian_vocab(processor)))
        for name in ("source.spm", "target.spm"):
            (Path(tmp) / name).write_bytes(spm_bytes)
        import sentencepiece as spm

        vocab = _marian_vocab(spm.SentencePieceProcessor(model_proto=spm_bytes))
        vocab_path = Path(tmp) / "vocab.json"
        vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tokenizer = MarianTokenizer(
            source_spm=str(Path(tmp) / "source.spm"),
            target_spm=str(Path(tmp) / "target.spm"),
            vocab=str(vocab_path),
            source_lang=source_lang,
            target_lang=target_lang,
        )
        tokenizer.save_pretrained(outdir)
    pad = tokenizer.pad_token_id
    config = MarianConfig(
        vocab_size=len(vocab),
        pad_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        decoder_start_token_id=pad,
        **_config_kwargs(shape),
    )
    _seed()
    model = MarianMTModel(config).eval()
    model.generation_config = _generation_config(
        banned=_special_ids(tokenizer, 0), start=pad, eos=0, pad=pad, shape=shape
    )
    model.save_pretrained(outdir)


def make_test_model(
    family: str | None,
    outdir: str | Path,
    *,
    source_lang: str = "en",
    target_lang: str = "de",
    shape: str | None = None,
) -> Path:
    """Write a random-weight checkpoint of ``family`` (nllb|m2m100|marian) to ``outdir``: a
    tiny one, or with ``shape`` (marian|m2m-418m|nllb-600m) one of that real model's size.

    A shape implies its family: ``family`` may be None then, or must be that family.
    ``source_lang``/``target_lang`` (BCP 47) name its pair: a Marian checkpoint serves only
    that pair; NLLB and M2M-100 save them as the tokenizer's default ``src_lang``/``tgt_lang``
    (``eng_Latn``, ``__en__``) and serve every language of the table anyway. ValueError for
    an unknown family or shape, a family the shape is not, or an unknown language.

    A tiny checkpoint's translations are garbage but never empty (its generation config
    bans special tokens and holds EOS back a few tokens). A shape has the real dimensions,
    weights at the real ``init_std`` and a tokenizer of the full vocabulary (the small
    trained one padded with unreachable pieces, so ids line up as in the real checkpoint);
    text still splits into 2-3 times the real tokens, so compare timings per token. A shape
    takes about 5 s and 290 MB on disk (marian), 20 s and 1.9 GB (m2m-418m), 35 s and
    2.4 GB (nllb-600m), on two cores.
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if shape is not None:
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
        if family is not None and family != SHAPES[shape]:
            raise ValueError(f"shape {shape!r} is a {SHAPES[shape]} checkpoint, not {family}")
        family = SHAPES[shape]
    if family is None:
        raise ValueError(f"give a family ({', '.join(FAMILIES)}) or a shape "
                         f"({', '.join(SHAPES)})")
    source = language_code(family, source_lang)
    target = language_code(family, target_lang)
    try:
        import sentencepiece  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"make-test-model needs {exc.name!r}: pip install 'thinktrans[local]'", name=exc.name
        ) from exc
    out = Path(outdir)
    created = [d for d in (out, *out.parents) if not d.exists()]
    out.mkdir(parents=True, exist_ok=True)
    if family == "nllb":
        _make_nllb(out, source, target, shape)
    elif family == "m2m100":
        _make_m2m100(out, source, target, shape)
    else:
        _make_marian(out, source, target, shape)
    make_readable(out, created)  # 0644/0755: a container's user is not the one who wrote it
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m service.tools.testmodel --family nllb OUTDIR`` or ``--shape nllb-600m``."""
    parser = argparse.ArgumentParser(
        prog="python -m service.tools.testmodel",
        description="Write a random-weight translation checkpoint for tests: a tiny one of "
        "--family, or one of a real model's size (--shape).",
    )
    parser.add_argument("--family", choices=FAMILIES,
                        help="the tiny checkpoint's family (required without --shape)")
    parser.add_argument("--shape", choices=tuple(SHAPES),
                        help="a real model's size: marian (opus-mt-en-de), m2m-418m "
                        "(m2m100_418M), nllb-600m (nllb-200-distilled-600M); implies its family")
    parser.add_argument("--source", "--source-lang", dest="source", default="en",
                        help="the pair's source language (BCP 47)")
    parser.add_argument("--target", "--target-lang", dest="target", default="de",
                        help="the pair's target language (BCP 47)")
    parser.add_argument("outdir")
    args = parser.parse_args(argv)
    if args.family is None and args.shape is None:
        parser.error("give --family or --shape")
    try:
        path = make_test_model(
            args.family, args.outdir, source_lang=args.source, target_lang=args.target,
            shape=args.shape,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
