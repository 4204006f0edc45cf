"""Issue 82 (Hardening 5), the model-location leftovers outside `convert`: `embed` reads a
model location through the one resolver `convert` uses (`convert.locations.resolve`), so a
directory holding its own model and a fine-tuned `checkpoint/` is refused by both alike;
the files read beside a vocabulary or a tokenizer.json (tokenizer_config.json,
special_tokens_map.json) and the casing records every tool reads (encoder_vocab,
create_pretraining_data's) follow the model-directory link rule (`data_pipelines.paths.
check_inside`: inside the directory, or a Hugging Face cache snapshot's blobs/);
`embed --max_seq_length=0` is refused, not taken for "unset"; distillation's teacher is
found by the same resolver.

The model is a tiny random BERT (convert_fixtures.TINY) saved by `convert.save_hf` with a
50-token vocab.txt.
"""

import importlib
import json
import os
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest
from convert_fixtures import TINY

from bert_jax import convert, embeddings
from bert_jax.config import BertConfig
from bert_jax.convert import locations
from bert_jax.convert.names import ConversionError
from bert_jax.heads import BertForPreTraining
from data_pipelines import paths
from data_pipelines.tokenization import VocabError
from experiments import distill_classification, embed

CONFIG = BertConfig(**TINY)
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]
convert_cli = importlib.import_module("bert_jax.convert.__main__")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("h5locations")
    ids = np.zeros((1, 4), np.int32)
    model = BertForPreTraining(CONFIG)
    params = jax.jit(lambda r: nn.unbox(model.init(r, ids, ids, ids, ids)["params"]))(
        jax.random.key(0)
    )
    vocab = root / "vocab_src.txt"
    vocab.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return Path(convert.save_hf(root / "hf", CONFIG, jax.tree.map(np.asarray, params),
                                vocab_file=str(vocab)))  # fmt: skip


def _two_models(hf_dir: Path, where: Path) -> Path:
    """A model directory with a fine-tuned embedding model of its own in `checkpoint/` (an
    HF directory here, with the finetuned.json that marks a fine-tuning run's save)."""
    shutil.copytree(hf_dir, where)
    shutil.copytree(hf_dir, where / "checkpoint")
    meta = {"embedding": {"pooling": "cls", "normalize": True, "max_seq_length": 8}}
    (where / "checkpoint" / "finetuned.json").write_text(json.dumps(meta), encoding="utf-8")
    return where


# --- embed reads a location as convert does -------------------------------------------------


def test_embed_refuses_a_directory_of_two_models_as_convert_does(hf_dir, tmp_path):
    # Before: embed read the fine-tune in checkpoint/ (cls pooling, normalised) without a
    # word, where convert refused the directory as two models.
    both = _two_models(hf_dir, tmp_path / "both")
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 w2\nw3\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    with pytest.raises(ValueError, match="holds two models") as by_embed:
        embed.run(str(both), str(texts), str(out))
    assert not out.exists()
    with pytest.raises(ConversionError) as by_convert:
        convert_cli.convert(str(both), str(tmp_path / "export"), "hf")
    assert str(by_embed.value) == str(by_convert.value)
    assert "\n" not in str(by_embed.value) and str(both / "checkpoint") in str(by_embed.value)
    with pytest.raises(ConversionError, match="holds two models"):
        embeddings.load_embedding_model(str(both), pooling="mean", normalize=False)


def test_a_fine_tuning_workdir_and_its_checkpoint_still_give_the_fine_tune(tmp_path):
    workdir = tmp_path / "run"
    (workdir / "checkpoint").mkdir(parents=True)
    meta = {"embedding": {"pooling": "cls", "normalize": True, "max_seq_length": 8}}
    (workdir / "checkpoint" / "finetuned.json").write_text(json.dumps(meta), encoding="utf-8")
    want = ({"pooling": "cls", "normalize": True, "max_seq_length": 8},
            str(workdir / "checkpoint" / "finetuned.json"))  # fmt: skip
    assert embeddings.directory_settings(str(workdir)) == want
    assert embeddings.directory_settings(str(workdir / "checkpoint")) == want


def test_a_finetuned_json_linked_out_of_the_checkpoint_is_refused(tmp_path):
    workdir = tmp_path / "run"
    (workdir / "checkpoint").mkdir(parents=True)
    stranger = tmp_path / "stranger.json"
    stranger.write_text(json.dumps({"embedding": {"pooling": "last"}}), encoding="utf-8")
    # The workdir's checkpoint/ is found by its params (a params-only Orbax save).
    (workdir / "checkpoint" / "params").mkdir()
    (workdir / "checkpoint" / "params" / "_CHECKPOINT_METADATA").write_text("{}")
    (workdir / "checkpoint" / "finetuned.json").symlink_to(stranger)
    with pytest.raises(ConversionError, match="outside the model directory") as error:
        embeddings.directory_settings(str(workdir))
    assert str(stranger) in str(error.value)


# --- casing beside the vocabulary: the link rule ----------------------------------------------


def _vocab_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "vocab"
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return directory


def test_a_tokenizer_config_linked_out_of_the_vocabulary_s_directory_is_refused(tmp_path):
    # Before: the stranger's do_lower_case (False) was taken as the vocabulary's casing.
    directory = _vocab_dir(tmp_path)
    stranger = tmp_path / "stranger_config.json"
    stranger.write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    (directory / "tokenizer_config.json").symlink_to(stranger)
    with pytest.raises(ConversionError) as error:
        embeddings._do_lower_case(str(directory / "vocab.txt"))
    message = str(error.value)
    assert str(directory / "tokenizer_config.json") in message and str(stranger) in message
    assert "\n" not in message


def test_a_tokenizer_config_linked_inside_or_into_a_cache_s_blobs_is_read(tmp_path):
    directory = _vocab_dir(tmp_path)
    (directory / "configs").mkdir()
    (directory / "configs" / "tok.json").write_text(json.dumps({"do_lower_case": False}))
    (directory / "tokenizer_config.json").symlink_to(directory / "configs" / "tok.json")
    assert embeddings._do_lower_case(str(directory / "vocab.txt")) is False
    # Hugging Face's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
    model = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = model / "snapshots" / "abc123", model / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (blobs / "h1").write_text("\n".join(WORDS) + "\n")
    (blobs / "h2").write_text(json.dumps({"do_lower_case": False}))
    (snapshot / "vocab.txt").symlink_to("../../blobs/h1")
    (snapshot / "tokenizer_config.json").symlink_to("../../blobs/h2")
    assert embeddings._do_lower_case(str(snapshot / "vocab.txt")) is False
    # ... but not into another cached model's blobs
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    (other / "h3").write_text(json.dumps({"do_lower_case": True}))
    (snapshot / "tokenizer_config.json").unlink()
    (snapshot / "tokenizer_config.json").symlink_to(other / "h3")
    with pytest.raises(ConversionError, match="outside the model directory"):
        embeddings._do_lower_case(str(snapshot / "vocab.txt"))


def test_embed_with_a_vocab_file_whose_config_links_out_is_refused(hf_dir, tmp_path):
    directory = _vocab_dir(tmp_path)
    stranger = tmp_path / "stranger_config.json"
    stranger.write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    (directory / "tokenizer_config.json").symlink_to(stranger)
    with pytest.raises(ConversionError, match="outside the model directory"):
        embeddings.load_embedding_model(str(hf_dir), vocab_file=str(directory / "vocab.txt"))


def test_embed_refuses_a_model_whose_tokenizer_config_links_out(hf_dir, tmp_path):
    # Before: the casing embed read text with was the stranger's (do_lower_case False), by
    # encoder_vocab.saved_casing, before the model was even loaded.
    model = tmp_path / "model"
    shutil.copytree(hf_dir, model)
    stranger = tmp_path / "stranger_config.json"
    stranger.write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    (model / "tokenizer_config.json").unlink()
    (model / "tokenizer_config.json").symlink_to(stranger)
    texts = tmp_path / "texts.txt"
    texts.write_text("W1 w2\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    with pytest.raises(ValueError) as error:
        embed.run(str(model), str(texts), str(out))
    message = str(error.value)
    assert str(model / "tokenizer_config.json") in message and str(stranger) in message
    assert "\n" not in message and not out.exists()


def test_casing_records_linked_out_are_refused_by_every_reader(tmp_path):
    from bert_jax import encoder_vocab
    from data_pipelines import pretraining_flags

    directory = _vocab_dir(tmp_path)
    stranger = tmp_path / "stranger_config.json"
    stranger.write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    (directory / "tokenizer_config.json").symlink_to(stranger)
    vocab = str(directory / "vocab.txt")
    # create_pretraining_data's casing (--do_lower_case not given)
    with pytest.raises(paths.LinkOutsideError, match="outside the model directory"):
        pretraining_flags.resolve_do_lower_case(vocab, True, given=False)
    assert pretraining_flags.resolve_do_lower_case(vocab, True, given=True) is True
    # a fine-tuned checkpoint's finetuned.json (its do_lower_case) linked out
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (tmp_path / "meta.json").write_text(json.dumps({"do_lower_case": False}))
    (run / "checkpoint" / "finetuned.json").symlink_to(tmp_path / "meta.json")
    with pytest.raises(ConversionError, match="outside the model directory"):
        encoder_vocab.saved_casing(str(run))
    (run / "checkpoint" / "finetuned.json").unlink()
    shutil.copyfile(tmp_path / "meta.json", run / "checkpoint" / "finetuned.json")
    assert encoder_vocab.saved_casing(str(run)) == (
        False, str(run / "checkpoint" / "finetuned.json"))  # fmt: skip


# --- embed --max_seq_length=0 -----------------------------------------------------------------


@pytest.mark.parametrize("length", [0, 1, 2, -5])
def test_embed_refuses_a_max_seq_length_below_3_before_reading_the_model(length, tmp_path):
    # Before: 0 was taken for "unset" (the model's positions); 1 and 2 were refused only
    # once the model was read.
    texts = tmp_path / "texts.txt"
    texts.write_text("w1\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    missing = str(tmp_path / "no_model_here")  # never read: the length is refused first
    with pytest.raises(ValueError, match=rf"^max_seq_length={length} must be at least 3") as e:
        embed.run(missing, str(texts), str(out), max_seq_length=length)
    assert "\n" not in str(e.value) and not out.exists()


def test_embed_takes_a_max_seq_length_of_3(hf_dir, tmp_path):
    model = embeddings.load_embedding_model(str(hf_dir), max_seq_length=3)
    assert model.max_seq_length == 3


# --- tokenizer.json: its config files follow the link rule --------------------------------------


def _tokenizer_json(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {word: i for i, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_a_tokenizer_json_s_config_linked_out_is_refused_naming_both(name, tmp_path):
    # Before: the stranger's mask_token (w1) was taken as this tokenizer's [MASK].
    from data_pipelines.hf_tokenizer import HFTokenizer

    path = _tokenizer_json(tmp_path / "tok")
    assert HFTokenizer(str(path)).mask_id == 4
    stranger = tmp_path / "stranger.json"
    stranger.write_text(json.dumps({"mask_token": "w1"}), encoding="utf-8")
    (path.parent / name).symlink_to(stranger)
    with pytest.raises(VocabError) as error:
        HFTokenizer(str(path))
    message = str(error.value)
    assert str(path.parent / name) in message and str(stranger) in message
    assert "\n" not in message


def test_a_tokenizer_json_s_config_in_a_cache_snapshot_or_linked_inside_is_read(tmp_path):
    from data_pipelines.hf_tokenizer import HFTokenizer

    model = tmp_path / "models--org--tok"
    snapshot, blobs = model / "snapshots" / "rev", model / "blobs"
    source = _tokenizer_json(tmp_path / "src")
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    shutil.copyfile(source, blobs / "h1")
    (blobs / "h2").write_text(json.dumps({"mask_token": "w1"}))
    (snapshot / "tokenizer.json").symlink_to("../../blobs/h1")
    (snapshot / "special_tokens_map.json").symlink_to("../../blobs/h2")
    assert HFTokenizer(str(snapshot / "tokenizer.json")).mask_id == WORDS.index("w1")
    inside = _tokenizer_json(tmp_path / "inside")
    (inside.parent / "real.json").write_text(json.dumps({"mask_token": "w2"}))
    (inside.parent / "tokenizer_config.json").symlink_to("real.json")
    assert HFTokenizer(str(inside)).mask_id == WORDS.index("w2")


def test_the_rule_is_one_function_each_package_raising_its_own_error(tmp_path):
    directory = tmp_path / "m"
    directory.mkdir()
    (tmp_path / "out.json").write_text("{}")
    (directory / "a.json").symlink_to(tmp_path / "out.json")
    for check, error in (
        (paths.check_inside, paths.LinkOutsideError),
        (locations.check_inside, ConversionError),
    ):
        with pytest.raises(error, match="a link to"):
            check(str(directory), str(directory / "a.json"))
    with pytest.raises(ConversionError):
        locations.model_file(str(directory), "a.json")
    assert locations.model_file(str(directory), "absent.json") is None


# --- distillation's teacher ---------------------------------------------------------------------


def test_the_teacher_is_found_by_the_one_resolver(tmp_path):
    # Before: a directory with a model of its own and a fine-tuned checkpoint/ gave the
    # checkpoint without a word (its own copy of the workdir rule).
    workdir = tmp_path / "teacher"
    (workdir / "checkpoint").mkdir(parents=True)
    (workdir / "checkpoint" / "finetuned.json").write_text("{}")
    assert distill_classification.teacher_dir(str(workdir)) == str(workdir / "checkpoint")
    checkpoint = str(workdir / "checkpoint")
    assert distill_classification.teacher_dir(checkpoint) == checkpoint
    (workdir / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConversionError, match="holds two models") as error:
        distill_classification.teacher_dir(str(workdir))
    assert os.fspath(workdir / "checkpoint") in str(error.value)
    with pytest.raises(FileNotFoundError, match="--config.teacher"):
        distill_classification.teacher_dir(str(tmp_path / "missing"))


def test_a_teacher_s_finetuned_json_linked_out_is_refused(tmp_path):
    # Before: the stranger's metadata (labels, casing, task) was taken as the teacher's.
    from bert_jax import finetune_common

    checkpoint = tmp_path / "teacher" / "checkpoint"
    checkpoint.mkdir(parents=True)
    stranger = tmp_path / "stranger.json"
    stranger.write_text(json.dumps({"labels": ["x", "y"], "do_lower_case": False}))
    (checkpoint / "finetuned.json").symlink_to(stranger)
    with pytest.raises(ConversionError, match="outside the model directory") as error:
        finetune_common.load_finetuned(str(checkpoint))
    assert str(stranger) in str(error.value)
