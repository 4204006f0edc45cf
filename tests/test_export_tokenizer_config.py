"""Every HF export names its special tokens, casing and length (tokenizer_config.json,
special_tokens_map.json), so transformers' fill-mask pipeline runs on it whatever the source
held: a WordPiece vocab.txt, and tokenizer.json files of BPE, Unigram and WordPiece saved by
the `tokenizers` library alone, without a config (issue 75)."""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("USE_TF", "0")

import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params

from bert_jax import convert

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = ["the cat sat on the mat", "a dog ran in the park", "the capital of france is paris",
          "paris is a city", "cats and dogs are animals"] * 4  # fmt: skip


def _trained_tokenizer_json(kind: str, directory) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials)
    elif kind == "bpe":
        specials = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=specials)
    else:
        specials = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=100, special_tokens=specials,
                                          unk_token="<unk>")  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainer)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    return path


@pytest.mark.parametrize("kind", ["vocab.txt", "wordpiece", "bpe", "unigram"])
def test_fill_mask_runs_on_the_export(tmp_path, kind):
    if kind == "vocab.txt":  # the file alone, without the config beside it in its package
        vocab, mask = str(tmp_path / "vocab.txt"), "[MASK]"
        shutil.copyfile(minilm_vocab(), vocab)
    else:
        (tmp_path / "tok").mkdir()
        vocab = _trained_tokenizer_json(kind, tmp_path / "tok")
        mask = "[MASK]" if kind == "wordpiece" else "<mask>"
    assert not os.path.exists(os.path.join(os.path.dirname(vocab), "tokenizer_config.json"))
    out = convert.save_hf(tmp_path / "hf", TINY, pretrained_params(), vocab_file=vocab)
    config = json.loads(open(os.path.join(out, "tokenizer_config.json")).read())
    assert config["mask_token"] == mask and config["model_max_length"] == 128
    fill = transformers.pipeline("fill-mask", model=out, tokenizer=out, device="cpu")
    predictions = fill(f"the cat sat on the {mask}")
    assert len(predictions) == 5 and all(mask not in p["sequence"] for p in predictions)


def test_an_explicit_casing_is_written_and_a_copied_config_keeps_its_keys(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "tokenizer_config.json").write_text(json.dumps({"custom": 1}))
    out = convert.save_hf(tmp_path / "hf", TINY, pretrained_params(), vocab_file=minilm_vocab(),
                          tokenizer=[str(source / "tokenizer_config.json")],
                          do_lower_case=False)  # fmt: skip
    config = json.loads(open(os.path.join(out, "tokenizer_config.json")).read())
    assert config["custom"] == 1 and config["do_lower_case"] is False
    assert config["cls_token"] == "[CLS]"
    # not lower-cased: an uncased vocabulary has no "Paris" (lower-cased it would be "paris")
    assert transformers.AutoTokenizer.from_pretrained(out).tokenize("Paris") == ["[UNK]"]
