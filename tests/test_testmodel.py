"""The test checkpoints themselves (``service.tools.testmodel``): CTranslate2 converts each
family's, its vocabulary lines up with the tokenizer's ids, and a real model's shape has the
real vocabulary size. Only the marian shape is built here (seconds); m2m-418m and nllb-600m take
up to a minute and 2.5 GB each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")
pytest.importorskip("transformers", reason="needs the local extra: pip install 'thinktrans[local]'")
pytest.importorskip("sentencepiece",
                    reason="needs the local extra: pip install 'thinktrans[local]'")

from transformers import AutoTokenizer

from service.tools import testmodel
from service.tools.testmodel import make_test_model

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

TEXT = "First, I need to check the file and then run the tests again."
TARGET_TOKEN = {"nllb": "deu_Latn", "m2m100": "__de__", "marian": None}


@pytest.fixture(scope="module")
def tiny(models: dict[str, Path]) -> dict[str, Path]:
    """The session's checkpoints (tests/checkpoints.py), made by make_test_model."""
    return {family: models[family] for family in testmodel.FAMILIES}


def convert_and_translate(model_dir: Path, out: Path, family: str, quantization: str) -> None:
    """Convert ``model_dir`` as the CTranslate2 engine does, then translate one batch."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformers import AutoConfig

    ctranslate2.converters.TransformersConverter(str(model_dir)).convert(
        str(out), quantization=quantization, force=True
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocabulary = json.loads((out / "shared_vocabulary.json").read_text(encoding="utf-8"))
    rows = AutoConfig.from_pretrained(model_dir).vocab_size
    if family == "marian":  # the converter drops the last id, <pad>: the decoder starts from 0
        assert len(vocabulary) == rows - 1 == len(tokenizer) - 1
    else:  # the tokenizer's ids, then "madeup" rows up to the embedding's size
        assert len(vocabulary) == rows
        assert vocabulary[len(tokenizer):] == [
            f"madeupword{i}" for i in range(rows - len(tokenizer))
        ]
    # Token i of CTranslate2 is id i of the tokenizer, so ids and tokens convert both ways.
    count = min(len(tokenizer), len(vocabulary))
    assert vocabulary[:count] == tokenizer.convert_ids_to_tokens(list(range(count)))

    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="int8")
    batch = [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
             for text in (TEXT, "ok")]
    assert batch[0][-1] == "</s>"
    lang = TARGET_TOKEN[family]
    results = translator.translate_batch(
        batch, target_prefix=[[lang]] * len(batch) if lang else None, max_decoding_length=8,
        beam_size=1,
    )
    for result in results:
        hypothesis = result.hypotheses[0]
        assert hypothesis
        if lang:
            assert hypothesis[0] == lang  # the prefix comes back first


@pytest.mark.parametrize("family", testmodel.FAMILIES)
def test_each_tiny_family_converts_and_translates(
    tiny: dict[str, Path], tmp_path: Path, family: str
) -> None:
    convert_and_translate(tiny[family], tmp_path / "ct2", family, "float32")


def test_m2m100_language_tokens_are_extra_special_tokens(tiny: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny["m2m100"])
    assert type(tokenizer).__name__ == "M2M100Tokenizer"
    assert tokenizer.src_lang == "en" and tokenizer.tgt_lang == "de"
    languages = tokenizer.lang_token_to_id
    assert len(languages) == len(tokenizer.lang_code_to_id) == 100
    assert set(tokenizer.extra_special_tokens) == set(languages)
    # Added tokens at the ids the tokenizer computes, so get_vocab() has them as the converter
    # needs (transformers 5's special_tokens_map names only bos/eos/unk/sep/pad).
    vocab = tokenizer.get_vocab()
    assert all(vocab[token] == i for token, i in languages.items())
    assert tokenizer.get_lang_id("de") == tokenizer.convert_tokens_to_ids("__de__")
    assert len(tokenizer) == tokenizer.vocab_size + 100
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(TEXT)["input_ids"])
    assert tokens[0] == "__en__" and tokens[-1] == "</s>"
    tokenizer.src_lang = "fr"
    assert tokenizer("x")["input_ids"][0] == tokenizer.get_lang_id("fr")
    assert tokenizer.tokenize("__de__ x")[0] == "__de__"


def test_padding_the_sentencepiece_model_keeps_its_tokenization() -> None:
    import sentencepiece as spm

    small = testmodel._train_spm("bpe", 400)
    padded = testmodel._pad_spm(small, 1000)
    before = spm.SentencePieceProcessor(model_proto=small)
    after = spm.SentencePieceProcessor(model_proto=padded)
    assert after.get_piece_size() == before.get_piece_size() + 1000
    assert after.id_to_piece(after.get_piece_size() - 1) == "▁tt999"
    for line in (*testmodel._CORPUS, "tt1 tt12 ▁tt3 att42"):
        assert after.encode(line, out_type=str) == before.encode(line, out_type=str)


def test_shape_arguments(tmp_path: Path) -> None:
    assert testmodel.SHAPES == {"marian": "marian", "m2m-418m": "m2m100", "nllb-600m": "nllb"}
    with pytest.raises(ValueError, match="shape must be one of"):
        make_test_model(None, tmp_path / "x", shape="nllb-3b")
    with pytest.raises(ValueError, match="is a nllb checkpoint, not marian"):
        make_test_model("marian", tmp_path / "x", shape="nllb-600m")
    with pytest.raises(ValueError, match="give a family"):
        make_test_model(None, tmp_path / "x")
    with pytest.raises(SystemExit):
        testmodel.main([str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        testmodel.main(["--family", "nllb", "--shape", "marian", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_the_marian_shape_is_opus_mt_sized_and_converts(tmp_path: Path) -> None:
    from transformers import AutoConfig

    out = tmp_path / "marian"
    assert testmodel.main(["--shape", "marian", "--target", "fr", str(out)]) == 0
    try:
        config = AutoConfig.from_pretrained(out)
        assert config.vocab_size == 58101 and config.d_model == 512
        layers = (config.encoder_layers, config.decoder_layers, config.encoder_attention_heads)
        assert layers == (6, 6, 8) and config.encoder_ffn_dim == 2048
        assert config.init_std == 0.02 and config.thinktrans_test_checkpoint
        assert len(AutoTokenizer.from_pretrained(out)) == 58101
        generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
        assert "min_new_tokens" not in generation
        convert_and_translate(out, tmp_path / "ct2", "marian", "int8")
    finally:  # 290 MB
        shutil.rmtree(out, ignore_errors=True)
