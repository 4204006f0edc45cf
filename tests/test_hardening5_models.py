"""Issue 82 (Hardening 5), the model-directory cases: nothing read from outside a model
directory (links out refused, Hugging Face's cache layout read), sizes checked against the
weights before anything is built, flags that would do nothing refused, `convert`'s errors
in one line.

The models are a tiny random BERT (convert_fixtures.TINY: 2 layers, H=16, 50 tokens) saved
here by `convert.save_hf`, with a 50-token vocab.txt of BERT's special tokens.
"""

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest
from convert_fixtures import TINY

from bert_jax import convert
from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert import sentence_transformers
from bert_jax.heads import BertForPreTraining

REPO = Path(__file__).resolve().parents[1]
CONFIG = BertConfig(**TINY)
cli = importlib.import_module("bert_jax.convert.__main__")


def _vocab(path: Path) -> Path:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def params():
    ids = np.zeros((1, 4), np.int32)
    model = BertForPreTraining(CONFIG)
    tree = jax.jit(lambda r: nn.unbox(model.init(r, ids, ids, ids, ids)["params"]))(
        jax.random.key(0)
    )
    return jax.tree.map(np.asarray, tree)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, params):
    root = tmp_path_factory.mktemp("h5models")
    vocab = _vocab(root / "vocab_src.txt")
    return Path(convert.save_hf(root / "hf", CONFIG, params, vocab_file=str(vocab)))


def _word_embeddings(tree) -> np.ndarray:
    return np.asarray(tree.get("bert", tree)["embeddings"]["word_embeddings"]["embedding"])


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- 1. Nothing from outside ----------------------------------------------------------------


def _link_out(model: Path, name: str, content: str, outside: Path) -> Path:
    """`model/name` replaced by a link to a file `outside` holding `content`."""
    outside.write_text(content, encoding="utf-8")
    (model / name).unlink()
    (model / name).symlink_to(outside)
    return outside


@pytest.mark.parametrize(
    "name, content, fmt",
    [
        ("special_tokens_map.json", json.dumps({"mask_token": "[STRANGER]"}), "hf"),
        ("vocab.txt", "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x"]), "orbax"),
        ("tokenizer_config.json", json.dumps({"do_lower_case": False}), "hf"),
        ("config.json", json.dumps({**CONFIG.to_hf_dict(), "hidden_dropout_prob": 0.3}), "hf"),
    ],
)
def test_a_file_linked_out_of_the_model_directory_is_refused_naming_it(
    hf_dir, tmp_path, name, content, fmt
):
    """Before: the outside file was read and copied into the export (special_tokens_map.json
    merged, vocab.txt copied verbatim by --format=orbax). Now: refused, naming both."""
    model = _copy(hf_dir, tmp_path / "model")
    target = _link_out(model, name, content, tmp_path / f"outside_{name}")
    with pytest.raises(convert.ConversionError) as error:
        cli.convert(str(model), str(tmp_path / "out"), fmt)
    message = str(error.value)
    assert str(model / name) in message and str(target) in message, message
    assert "outside the model directory" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_weights_and_tokenizer_files_linked_out_are_refused(hf_dir, tmp_path):
    """Variants: the weights themselves, a tokenizer.json beside vocab.txt (refused, not
    passed over), and a params-only directory whose params/ (or a file in it) links out."""
    model = _copy(hf_dir, tmp_path / "weights")
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(model / "model.safetensors", outside)
    (model / "model.safetensors").symlink_to(outside)
    with pytest.raises(convert.ConversionError, match=r"model.safetensors: a link to .*outside"):
        convert.load_pretrained(model)
    model = _copy(hf_dir, tmp_path / "tok")
    (tmp_path / "tokenizer.json").write_text("{}")
    (model / "tokenizer.json").symlink_to(tmp_path / "tokenizer.json")
    with pytest.raises(convert.ConversionError, match=r"tokenizer.json: a link to .*outside"):
        convert.load_pretrained(model)
    orbax = tmp_path / "orbax"
    cli.convert(str(hf_dir), str(orbax), "orbax")
    shutil.move(orbax / "params", tmp_path / "params_elsewhere")
    (orbax / "params").symlink_to(tmp_path / "params_elsewhere")
    with pytest.raises(convert.ConversionError, match=r"orbax/params: a link to .*outside"):
        convert.load_pretrained(orbax)
    (orbax / "params").unlink()
    shutil.move(tmp_path / "params_elsewhere", orbax / "params")
    inner = next(p for p in (orbax / "params").rglob("*") if p.is_file())
    shutil.move(inner, tmp_path / "inner")
    inner.symlink_to(tmp_path / "inner")
    with pytest.raises(convert.ConversionError, match=f"{inner.name}: a link to .*outside"):
        convert.load_pretrained(orbax)


def test_a_model_directory_that_is_itself_a_link_reads(hf_dir, tmp_path, params):
    (tmp_path / "alias").symlink_to(hf_dir)
    _, loaded, vocab = convert.load_pretrained(tmp_path / "alias")
    np.testing.assert_array_equal(_word_embeddings(loaded), _word_embeddings(params))
    assert vocab is not None


def test_a_link_inside_the_model_directory_is_followed(hf_dir, tmp_path, params):
    model = _copy(hf_dir, tmp_path / "model")
    (model / "files").mkdir()
    shutil.move(model / "vocab.txt", model / "files" / "vocab.txt")
    (model / "vocab.txt").symlink_to(Path("files") / "vocab.txt")
    cli.convert(str(model), str(tmp_path / "out"), "orbax")
    assert (tmp_path / "out" / "vocab.txt").read_text() == (hf_dir / "vocab.txt").read_text()


def _hf_cache(root: Path, model: Path, shards: int) -> Path:
    """`model` laid out as transformers' cache holds it: every file of
    models--test--tiny/snapshots/<rev>/ a relative link to ../../blobs/<hash>; with
    `shards` > 1 its weights split into model-0000i-of-0000n.safetensors + their index."""
    from safetensors.numpy import load_file, save_file

    files = {p.name: p.read_bytes() for p in model.iterdir() if p.name != "model.safetensors"}
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::shards]}
        save_file(part, root / shard, metadata={"format": "pt"})
        files[shard] = (root / shard).read_bytes()
        weight_map.update(dict.fromkeys(part, shard))
    if shards > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        files["model.safetensors.index.json"] = json.dumps(index).encode()
    else:
        files["model.safetensors"] = files.pop("model-00001-of-00001.safetensors")
    cache = root / "hub" / "models--test--tiny"
    snapshot = cache / "snapshots" / "0123abc"
    (cache / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = cache / "blobs" / f"blob{abs(hash(name))}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot


@pytest.mark.parametrize("shards", [1, 2], ids=["single", "sharded"])
def test_a_hugging_face_cache_snapshot_loads_as_transformers_loads_it(
    hf_dir, tmp_path, params, shards
):
    """Before: the sharded snapshot was refused ("weight_map names ... outside the model
    directory"). Now both load, with the weights and vocabulary of the model."""
    snapshot = _hf_cache(tmp_path, hf_dir, shards)
    config, loaded, vocab = convert.load_pretrained(snapshot)
    np.testing.assert_array_equal(_word_embeddings(loaded), _word_embeddings(params))
    assert config.num_hidden_layers == CONFIG.num_hidden_layers
    assert Path(vocab).read_text() == (hf_dir / "vocab.txt").read_text()
    cli.convert(str(snapshot), str(tmp_path / "out"), "orbax")
    assert (tmp_path / "out" / "vocab.txt").read_text() == (hf_dir / "vocab.txt").read_text()


def test_a_cache_snapshot_linking_into_another_model_s_blobs_is_refused(hf_dir, tmp_path):
    snapshot = _hf_cache(tmp_path, hf_dir, 2)
    other = tmp_path / "hub" / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    stranger = other / "special"
    stranger.write_text(json.dumps({"mask_token": "[STRANGER]"}))
    (snapshot / "special_tokens_map.json").unlink()
    (snapshot / "special_tokens_map.json").symlink_to(stranger)
    with pytest.raises(convert.ConversionError, match="special_tokens_map.json: a link to .*"):
        cli.convert(str(snapshot), str(tmp_path / "out"), "hf")


def test_a_sentence_transformers_module_file_linked_out_is_refused(hf_dir, tmp_path):
    model = tmp_path / "st"
    cli.convert(str(hf_dir), str(model), "sentence-transformers", pooling="cls")
    outside = tmp_path / "pooling.json"
    outside.write_text((model / "1_Pooling" / "config.json").read_text())
    (model / "1_Pooling" / "config.json").unlink()
    (model / "1_Pooling" / "config.json").symlink_to(outside)
    with pytest.raises(convert.ConversionError, match=r"1_Pooling/config.json: a link to "):
        sentence_transformers.read_settings(str(model))


# --- 3. Sizes checked before anything is built ----------------------------------------------


@pytest.mark.parametrize(
    "key, value, named",
    [
        ("num_hidden_layers", 1_000_000, "num_hidden_layers=1000000 but the weights"),
        ("num_hidden_layers", 3, "num_hidden_layers=3 but the weights"),
        ("hidden_size", 32, "hidden_size=32 but the weights"),
        ("vocab_size", 60, "vocab_size=60 but the weights"),
        ("vocab_size", 10**12, "vocab_size 1000000000000 is past"),
        ("num_hidden_layers", 2**40, "num_hidden_layers 1099511627776 is past"),
    ],
)
def test_a_config_disagreeing_with_its_weights_is_refused_within_seconds(
    hf_dir, tmp_path, key, value, named
):
    """Before: 1,000,000 layers built a model template for hours; 10**12 rows was an
    OverflowError from jit. Now one line naming config.json and the key, in well under a
    second (the weights' header, not a model, is what is compared)."""
    model = _copy(hf_dir, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, key: value}))
    start = time.perf_counter()
    with pytest.raises((convert.ConversionError, ConfigError)) as error:
        convert.load_pretrained(model, model="encoder")
    assert time.perf_counter() - start < 5
    message = str(error.value)
    assert message.startswith(f"{model / 'config.json'}: ") and named in message, message
    assert "\n" not in message


def test_a_params_only_directory_with_a_wrong_layer_count_is_refused(hf_dir, tmp_path, params):
    out = tmp_path / "orbax"
    convert.save_params(out, CONFIG, params)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
    with pytest.raises(convert.ConversionError, match="num_hidden_layers=1000000 but the wei"):
        convert.load_pretrained(out)


# --- 7. Flags that do nothing; sentence_bert_config.json's length --------------------------


@pytest.mark.parametrize(
    "flags, named",
    [
        ({"pooling": "cls"}, "--pooling"),
        ({"normalize": True}, "--normalize"),
        ({"pooling": "cls", "normalize": False}, "--pooling, --normalize"),
        ({"max_seq_length": 64}, "--max_seq_length"),
    ],
)
def test_sentence_transformers_flags_with_format_hf_are_refused(hf_dir, tmp_path, flags, named):
    """Before: `--format=hf --pooling=cls --normalize` wrote an export ignoring both."""
    with pytest.raises(convert.ConversionError, match=f"^{named} given with --format=hf"):
        cli.convert(str(hf_dir), str(tmp_path / "out"), "hf", **flags)
    assert not (tmp_path / "out").exists()


def test_scan_layers_with_format_hf_is_refused(hf_dir, tmp_path):
    with pytest.raises(convert.ConversionError, match="^--scan_layers given with --format=hf"):
        cli.convert(str(hf_dir), str(tmp_path / "out"), "hf", scan_layers=True)


@pytest.mark.parametrize("length", [0, 2, 10_000])
def test_a_bad_max_seq_length_flag_is_refused(hf_dir, tmp_path, length):
    """`--max_seq_length=0` was taken as unset (the model's 24 positions written)."""
    with pytest.raises(convert.ConversionError, match=f"--max_seq_length={length} must be in"):
        cli.convert(
            str(hf_dir), str(tmp_path / "o"), "sentence-transformers", max_seq_length=length
        )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("length", [0, 16.7, "128", True, -5])
def test_a_bad_max_seq_length_in_sentence_bert_config_is_refused_by_name(hf_dir, tmp_path, length):
    """Before: 0 became 128 and 16.7 became 16 without a word; a string was a TypeError."""
    model = tmp_path / "st"
    cli.convert(str(hf_dir), str(model), "sentence-transformers")
    settings = model / "sentence_bert_config.json"
    settings.write_text(json.dumps({"max_seq_length": length, "do_lower_case": False}))
    pattern = f"^{settings}: max_seq_length {length!r} is not a whole number"
    with pytest.raises(convert.ConversionError, match=pattern.replace(".", r"\.")):
        sentence_transformers.read_settings(str(model))
    with pytest.raises(convert.ConversionError, match="max_seq_length"):
        cli.convert(str(model), str(tmp_path / "again"), "sentence-transformers")


# --- 9. One line; non-JSON tokenizer files; glob characters ---------------------------------


@pytest.mark.parametrize("name", ["special_tokens_map.json", "tokenizer_config.json"])
def test_a_non_json_tokenizer_config_file_is_named(hf_dir, tmp_path, name):
    """Before: a JSONDecodeError traceback from the export's writer."""
    model = _copy(hf_dir, tmp_path / "model")
    (model / name).write_text("{mask_token: [MASK]")
    with pytest.raises(convert.ConversionError) as error:
        cli.convert(str(model), str(tmp_path / "out"), "hf")
    assert str(error.value).startswith(f"{model / name}: not valid JSON")
    (model / name).write_text('["[MASK]"]')
    with pytest.raises(convert.ConversionError, match="expected a JSON object, found list"):
        cli.convert(str(model), str(tmp_path / "out"), "orbax")
    assert not (tmp_path / "out").exists()


def test_convert_s_errors_are_one_line_without_a_traceback(hf_dir, tmp_path):
    """Before: every ConversionError of `python -m bert_jax.convert` was a ~20-line
    traceback. Now one line `convert: ...` (as `embed` prints it), exit status 1."""
    model = _copy(hf_dir, tmp_path / "model")
    (model / "special_tokens_map.json").write_text("not json")
    runs = [
        ([f"--input={hf_dir}", "--pooling=cls", "--normalize"], "convert: --pooling, --normaliz"),
        ([f"--input={model}"], f"convert: {model / 'special_tokens_map.json'}: not valid JSON"),
    ]
    for args, start in runs:
        result = subprocess.run(
            [sys.executable, "-m", "bert_jax.convert", *args, f"--output={tmp_path / 'out'}"],
            capture_output=True, text=True, cwd=REPO, timeout=120,
            env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"),
        )  # fmt: skip
        assert result.returncode == 1, result.stderr[-2000:]
        assert "Traceback" not in result.stderr, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1].startswith(start), result.stderr[-500:]
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["st[1]", "st*", "st?"])
def test_a_sentence_transformers_export_under_glob_characters_reads_back(
    hf_dir, tmp_path, params, name
):
    """Before: written, then "not a Hugging Face directory" when read back (glob.glob took
    the brackets as a pattern). Now every reader of this project reads it."""
    from bert_jax import embeddings

    out = tmp_path / "runs" / name / "export"
    cli.convert(str(hf_dir), str(out), "sentence-transformers", pooling="cls", normalize=True)
    assert convert.detect_format(out) == "hf"
    _, loaded, _ = convert.load_pretrained(out)
    np.testing.assert_array_equal(_word_embeddings(loaded), _word_embeddings(params))
    model = embeddings.load_embedding_model(str(out))
    assert (model.module.pooling, model.module.normalize) == ("cls", True)
    cli.convert(str(out), str(tmp_path / "again"), "orbax")
