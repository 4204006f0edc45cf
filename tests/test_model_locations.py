"""Issue 83 item 2: one model location everywhere.

Every tool that takes a model (`bert_jax.convert`, fine-tuning's `init_from`, pretraining's
`init_from`, `experiments.extract_features`, `experiments.embed`) reads every location alike:
a Hugging Face directory, a sentence-transformers directory (Transformer at its root or in a
subfolder), a pretraining workdir or its `checkpoints/`, a fine-tuning workdir or its
`checkpoint/`, a params-only Orbax directory. One tiny random BERT (finetune_fixtures.TINY)
is written to each, and each tool must read back its word embeddings.
"""

import importlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from finetune_fixtures import TINY, minilm_vocab, pretrained_params, write_train_state

from bert_jax import convert, embeddings
from bert_jax import finetune_common as common
from bert_jax.config import BertConfig
from bert_jax.convert import sentence_transformers
from bert_jax.heads import BertForPreTraining, BertForSequenceClassification

cli = importlib.import_module("bert_jax.convert.__main__")
LOCATIONS = (
    "hf", "sentence_transformers", "sentence_transformers_subfolder", "pretraining_workdir",
    "pretraining_checkpoints", "finetuning_workdir", "finetuning_checkpoint", "orbax",
)  # fmt: skip


@pytest.fixture(scope="module")
def params():
    return pretrained_params()


@pytest.fixture(scope="module")
def locations(tmp_path_factory, params) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("locations")
    vocab = minilm_vocab()
    hf = Path(convert.save_hf(root / "hf", TINY, params, vocab_file=vocab, do_lower_case=True))
    st_files = sentence_transformers.module_files("cls", True, TINY.hidden_size, 64)
    st = convert.save_hf(root / "st", TINY, params, vocab_file=vocab, extra_json=st_files)
    # A Transformer module in a subfolder, as sentence-transformers' older exports hold it.
    sub = root / "st_sub"
    sub.mkdir()
    shutil.copytree(hf, sub / "0_Transformer")
    modules = [dict(st_files["modules.json"][i]) for i in (0, 1)]
    modules[0]["path"] = "0_Transformer"
    (sub / "modules.json").write_text(json.dumps(modules))
    (sub / "1_Pooling").mkdir()
    (sub / "1_Pooling" / "config.json").write_text(json.dumps(st_files["1_Pooling/config.json"]))
    pretraining = write_train_state(root / "pretrain", params)
    finetuning = root / "finetune"
    common.save_finetuned(
        str(finetuning / "checkpoint"), TINY, params, vocab_file=vocab,
        metadata={"task": "embeddings", "init_from": str(hf),
                  "embedding": {"pooling": "mean", "normalize": False, "max_seq_length": 32}},
    )  # fmt: skip
    orbax = Path(convert.save_params(root / "orbax", TINY, params, vocab_file=vocab))
    paths = {
        "hf": hf,
        "sentence_transformers": Path(st),
        "sentence_transformers_subfolder": sub,
        "pretraining_workdir": pretraining,
        "pretraining_checkpoints": pretraining / "checkpoints",
        "finetuning_workdir": finetuning,
        "finetuning_checkpoint": finetuning / "checkpoint",
        "orbax": orbax,
    }
    assert set(paths) == set(LOCATIONS)
    return paths


def _embeddings_of(tree) -> np.ndarray:
    tree = tree.get("bert", tree)
    return np.asarray(tree["embeddings"]["word_embeddings"]["embedding"])


def _convert(path: Path, tmp_path: Path) -> np.ndarray:
    out = tmp_path / "export"
    cli.convert(str(path), str(out), "hf")
    return _embeddings_of(convert.load_pretrained(out)[1])


def _finetune(path: Path, tmp_path: Path) -> np.ndarray:
    head = BertForSequenceClassification(BertConfig(), 2)
    _, _, loaded, vocab = common.load_model(head, str(path))
    assert vocab is not None
    return _embeddings_of(loaded)


def _pretrain(path: Path, tmp_path: Path) -> np.ndarray:
    from bert_jax import train_loop

    model = BertForPreTraining(TINY)
    ids = np.zeros((1, 4), np.int32)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = jax.eval_shape(lambda r: model.init(r, ids, ids, ids, ids), jax.random.key(0))
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        jax.tree.map(lambda x: x, __import__("flax").linen.unbox(shapes["params"])),
    )
    loaded = train_loop._load_init_params(str(path), model, abstract, jax.random.key(1))
    return _embeddings_of(jax.tree.map(np.asarray, loaded))


def _extract_features(path: Path, tmp_path: Path) -> np.ndarray:
    from experiments import extract_features

    text = tmp_path / "input.txt"
    text.write_text("hello world\n", encoding="utf-8")
    out = tmp_path / "features.jsonl"
    assert extract_features.run(str(text), str(out), str(path), layers="-1", max_seq_length=8)
    return np.asarray(json.loads(out.read_text())["features"][0]["layers"][0]["values"])


def _embed(path: Path, tmp_path: Path) -> np.ndarray:
    return _embeddings_of(embeddings.load_embedding_model(str(path)).params)


TOOLS = {
    "convert": _convert,
    "finetune_init_from": _finetune,
    "pretrain_init_from": _pretrain,
    "extract_features": _extract_features,
    "embed": _embed,
}


@pytest.fixture(scope="module")
def hf_features(locations, tmp_path_factory) -> np.ndarray:
    """extract_features' output for the Hugging Face directory: what every location gives."""
    return _extract_features(locations["hf"], tmp_path_factory.mktemp("hf_features"))


@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_reads_every_model_location(tool, location, locations, params, tmp_path,
                                               request):  # fmt: skip
    """Before: convert, fine-tuning's and pretraining's init_from and extract_features
    refused a fine-tuning workdir ("not a Hugging Face directory") that `embed` read, and a
    sentence-transformers directory with its Transformer in a subfolder. Now every tool
    reads every location, each giving the same weights (extract_features: the features)."""
    found = TOOLS[tool](locations[location], tmp_path)
    if tool == "extract_features":
        expected = request.getfixturevalue("hf_features")
    else:
        expected = _embeddings_of(params)
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-6, err_msg=f"{tool} {location}")


def test_a_directory_holding_two_models_is_refused_by_name(locations, tmp_path):
    """A Hugging Face directory that also holds a fine-tuned `checkpoint/` (a fine-tune
    whose workdir was its init directory) is two models: which one a tool reads is not
    for it to guess (`embed` read the fine-tune, `convert` the original)."""
    both = tmp_path / "both"
    shutil.copytree(locations["hf"], both)
    shutil.copytree(locations["finetuning_checkpoint"], both / "checkpoint")
    with pytest.raises(convert.ConversionError, match=r"both: holds two models, its own and"):
        convert.load_pretrained(both)
