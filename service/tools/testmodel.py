"""Tiny translation checkpoints for tests: the real model and tokenizer classes, random weights.

``make_test_model("nllb", dir)`` writes a checkpoint that ``AutoTokenizer.from_pretrained`` and
``AutoModelForSeq2SeqLM.from_pretrained`` load exactly as they load a real NLLB-200, M2M-100 or
Marian (opus-mt) checkpoint: same config ``model_type``, same tokenizer class and files, the
family's language tokens. Only the sizes differ (d_model 32, 2+2 layers, a few hundred pieces)
and the weights are random, so translations are garbage, but never empty: the checkpoint's own
``generation_config.json`` bans special tokens and holds EOS back for a few tokens, which a real
checkpoint would not need. Building one takes about a second.

``source``/``target`` (BCP 47) are the checkpoint's pair: a Marian checkpoint serves only that
pair; NLLB and M2M-100 save them as the tokenizer's default ``src_lang``/``tgt_lang`` (in the
family's codes: ``eng_Latn``, ``__en__``), and serve every language of the table anyway.
Files are written readable by all (0644, directories 0755), as a container's user is not
the one who wrote them.

Command line: ``python -m service.tools.testmodel --family nllb --source en --target de OUTDIR``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _generation_config(*, banned: Sequence[int], start: int, eos: int, pad: int) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(
        decoder_start_token_id=start,
        eos_token_id=eos,
        pad_token_id=pad,
        # Before ForcedBOS in the processor order, so a forced language token still wins.
        bad_words_ids=[[i] for i in sorted(set(banned))],
        min_new_tokens=_MIN_NEW_TOKENS,
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
    from models.local import M2M_CODES, NLLB_CODES

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


def _make_nllb(outdir: Path, source_lang: str, target_lang: str) -> None:
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sentencepiece.bpe.model").write_bytes(_train_spm("bpe", 400))
        # Loading from the .model file runs the library's own slow-to-fast conversion.
        tokenizer = NllbTokenizer.from_pretrained(
            tmp, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES), src_lang=source_lang,
            tgt_lang=target_lang,
        )
        tokenizer.save_pretrained(outdir)
    eos = tokenizer.eos_token_id
    config = M2M100Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        decoder_start_token_id=eos,
        **_TINY,
    )
    config.tokenizer_class = "NllbTokenizer"  # as the real checkpoints' config.json says
    _seed()
    model = M2M100ForConditionalGeneration(config).eval()
    model.generation_config = _generation_config(
        banned=_special_ids(tokenizer, eos), start=eos, eos=eos, pad=tokenizer.pad_token_id
    )
    model.save_pretrained(outdir)


def _make_m2m100(outdir: Path, source_lang: str, target_lang: str) -> None:
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        spm_path = Path(tmp) / "sentencepiece.bpe.model"
        spm_path.write_bytes(_train_spm("bpe", 400))
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor(model_file=str(spm_path))
        # fairseq's dictionary: four specials first, then the pieces; language ids follow.
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for i in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(i), len(vocab))
        vocab_path = Path(tmp) / "vocab.json"
        vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tokenizer = M2M100Tokenizer(vocab_file=str(vocab_path), spm_file=str(spm_path),
                                    src_lang=source_lang, tgt_lang=target_lang)
        tokenizer.save_pretrained(outdir)
    eos = tokenizer.eos_token_id
    # The real vocabulary also ends in the language ids and eight "madeup" words.
    vocab_size = len(vocab) + len(tokenizer.lang_code_to_id) + tokenizer.num_madeup_words
    config = M2M100Config(
        vocab_size=vocab_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=0,
        eos_token_id=eos,
        decoder_start_token_id=eos,
        **_TINY,
    )
    _seed()
    model = M2M100ForConditionalGeneration(config).eval()
    banned = [*_special_ids(tokenizer, eos), *range(len(vocab), vocab_size)]
    model.generation_config = _generation_config(
        banned=banned, start=eos, eos=eos, pad=tokenizer.pad_token_id
    )
    model.save_pretrained(outdir)


def _make_marian(outdir: Path, source_lang: str, target_lang: str) -> None:
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        spm_bytes = _train_spm("unigram", 400)
        for name in ("source.spm", "target.spm"):
            (Path(tmp) / name).write_bytes(spm_bytes)
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor(model_proto=spm_bytes)
        # opus-mt's layout: </s> 0, <unk> 1, the pieces, <pad> last.
        vocab = {"</s>": 0, "<unk>": 1}
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if piece not in ("<s>", "</s>", "<unk>"):
                vocab.setdefault(piece, len(vocab))
        vocab["<pad>"] = len(vocab)
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
        **_TINY,
    )
    _seed()
    model = MarianMTModel(config).eval()
    model.generation_config = _generation_config(
        banned=_special_ids(tokenizer, 0), start=pad, eos=0, pad=pad
    )
    model.save_pretrained(outdir)


def make_test_model(
    family: str, outdir: str | Path, *, source_lang: str = "en", target_lang: str = "de"
) -> Path:
    """Write a tiny random-weight checkpoint of ``family`` (nllb|m2m100|marian) to ``outdir``.

    ``source_lang``/``target_lang`` (BCP 47) name its pair (see the module docstring);
    ValueError for an unknown family or language.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
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
        _make_nllb(out, source, target)
    elif family == "m2m100":
        _make_m2m100(out, source, target)
    else:
        _make_marian(out, source, target)
    _readable(out, created)
    return out


def _readable(out: Path, created: Sequence[Path]) -> None:
    """Files 0644 and directories 0755 at least: save_pretrained writes the weights 0600,
    which the image's user (uid 10001) cannot read from a mounted directory."""
    for directory in created:
        directory.chmod(directory.stat().st_mode | 0o755)
    for root, dirs, files in os.walk(out):
        for name in dirs:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | 0o755)
        for name in files:
            path = Path(root, name)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                path.chmod(mode | 0o644)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m service.tools.testmodel --family nllb OUTDIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m service.tools.testmodel",
        description="Write a tiny random-weight translation checkpoint for tests.",
    )
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--source", "--source-lang", dest="source", default="en",
                        help="the pair's source language (BCP 47)")
    parser.add_argument("--target", "--target-lang", dest="target", default="de",
                        help="the pair's target language (BCP 47)")
    parser.add_argument("outdir")
    args = parser.parse_args(argv)
    try:
        path = make_test_model(
            args.family, args.outdir, source_lang=args.source, target_lang=args.target
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
