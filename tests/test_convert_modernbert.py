"""transformers' ModernBERT through the converter (issue 42): a tiny ModernBertForMaskedLM with
every weight randomised (norms too), loaded by `load_pretrained`, gives transformers' PyTorch
hidden states and MLM logits on a padded batch whose rows are longer than the local window,
with layers of both kinds; `save_hf` writes it back for transformers with no missing or
unexpected keys. The names and shapes of the HF side are checked on their own too (a round
trip of the state dict), and a bad tensor is refused by name.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert import modernbert
from bert_jax.convert.families import family_of, read_config
from bert_jax.heads import BertForPreTraining
from bert_jax.model import BertModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5  # float32, max |ours - transformers|
# Four layers, global every 2nd (not ModernBERT's 3rd): 0 and 2 global, 1 and 3 local with
# an 8-token window, shorter than the 20-24-token rows; both rotary bases not the defaults.
HF_CONFIG = dict(
    vocab_size=120,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=64,
    local_attention=8,
    global_attn_every_n_layers=2,
    global_rope_theta=5000.0,
    local_rope_theta=300.0,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
    reference_compile=False,
)
LENGTHS = (24, 20, 13)  # a padded batch: rows of 24, 20 and 13 real tokens
T = 24


def _hf_model(seed: int, **overrides):
    """A ModernBertForMaskedLM with every parameter drawn afresh: N(0, 0.1), norm weights
    1 + N(0, 0.2). (At 0.2 everywhere, torch's own float32 logits are 2e-5 from its float64
    ones, and ours as near: rounding that such large random layers amplify, not a formula.)"""
    config = transformers.ModernBertConfig(**{**HF_CONFIG, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            norm = "norm" in name and name.endswith("weight")
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param) if norm else 0.1 * torch.randn_like(param)
            )
    return model


def _batch():
    rng = np.random.default_rng(0)
    mask = (np.arange(T)[None] < np.array(LENGTHS)[:, None]).astype(np.int64)
    ids = rng.integers(3, HF_CONFIG["vocab_size"], (len(LENGTHS), T)) * mask
    return ids, mask


def _hf_outputs(model, ids, mask):
    """(last hidden state, logits); the hidden state is the encoder's output, after its final
    norm (`hidden_states[-1]` is before it)."""
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model(input_ids=ids, attention_mask=mask).logits
    return hidden.numpy(), logits.numpy()


def _ours(config, params, ids, mask):
    """(last hidden state, MLM logits at every position) of our model."""
    module = BertForPreTraining(config, next_sentence=False)
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(T), ids.shape)
    variables = {"params": params}
    hidden = module.apply(variables, ids, mask, None, method=BertForPreTraining.encode)
    logits = module.apply(variables, ids, mask, jnp.zeros_like(ids), positions).mlm_logits
    return np.asarray(hidden.sequence_output), np.asarray(logits)


def _real(x, mask):
    return x[mask.astype(bool)]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    model = _hf_model(seed=0)
    path = tmp_path_factory.mktemp("modernbert") / "hf"
    model.save_pretrained(path, safe_serialization=True)
    _write_tokenizer(path)
    return path, model


def _write_tokenizer(path) -> None:
    """A word-level tokenizer.json with the model's 120 ids and its special tokens (pad 0,
    cls 1, sep 2), as ModernBERT's directory has one instead of a vocab.txt."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    words = [f"w{i}" for i in range(HF_CONFIG["vocab_size"] - len(specials))]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + words)}, "[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def loaded(hf_dir):
    return convert.load_pretrained(hf_dir[0], model="auto")


def test_config_is_modernberts(hf_dir, loaded):
    config, _, vocab_file = loaded
    # ModernBERT's directory has tokenizer.json, no vocab.txt: the tokenizer is that.
    assert vocab_file == str(hf_dir[0] / "tokenizer.json")
    assert family_of(config) is modernbert.MODERNBERT
    expected = dict(
        position_encoding="rotary",
        feed_forward="glu",
        norm_placement="pre",
        linear_bias=False,
        norm_bias=False,
        type_vocab_size=0,
        rope_theta=5000.0,
        local_rope_theta=300.0,
        local_attention_window=8,
        global_attention_every=2,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        intermediate_size=96,
    )
    assert {k: getattr(config, k) for k in expected} == expected


def test_hidden_states_and_logits_equal_transformers(hf_dir, loaded):
    config, params, _ = loaded
    ids, mask = _batch()
    hf_hidden, hf_logits = _hf_outputs(hf_dir[1], ids, mask)
    hidden, logits = _ours(config, params, ids, mask)
    hidden_diff = np.abs(_real(hidden, mask) - _real(hf_hidden, mask)).max()
    logits_diff = np.abs(_real(logits, mask) - _real(hf_logits, mask)).max()
    print(f"max |ours - transformers|: hidden {hidden_diff:.2e}, logits {logits_diff:.2e}")
    assert hidden_diff < TOL and logits_diff < TOL


def test_layer0_attention_norm_is_the_identity(loaded):
    norm = loaded[1]["bert"]["encoder"]["layer_0"]["attention_layer_norm"]
    assert set(norm) == {"scale"}  # no norm biases in ModernBERT
    np.testing.assert_array_equal(norm["scale"], 1.0)


def test_export_loads_in_transformers_with_the_same_logits(hf_dir, loaded, tmp_path):
    config, params, _ = loaded
    out = tmp_path / "export"
    tokenizer = convert.readers.tokenizer_files(hf_dir[0])
    convert.save_hf(out, config, params, tokenizer=tokenizer)
    assert (out / "tokenizer.json").read_text() == (hf_dir[0] / "tokenizer.json").read_text()
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["ModernBertForMaskedLM"]
    model, info = transformers.ModernBertForMaskedLM.from_pretrained(
        out, output_loading_info=True, attn_implementation="eager", reference_compile=False
    )
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    # The tensors themselves: every one transformers holds is the original's.
    original = hf_dir[1].state_dict()
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), original[key].numpy(), err_msg=key)
    ids, mask = _batch()
    np.testing.assert_array_equal(
        _hf_outputs(model.eval(), ids, mask)[1], _hf_outputs(hf_dir[1], ids, mask)[1]
    )


def test_bare_encoder_and_orbax_round_trip(hf_dir, loaded, tmp_path):
    """A ModernBertModel directory (no `model.` prefix, no head) reads as our encoder without
    a pooler, and params-only Orbax keeps the modern config whole."""
    model = hf_dir[1].model
    bare = tmp_path / "bare"
    model.save_pretrained(bare, safe_serialization=True)
    config, params, _ = convert.load_pretrained(bare, model="auto")
    assert set(params) == {"embeddings", "encoder"}
    ids, mask = _batch()
    hidden = BertModel(config, add_pooling_layer=False).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(mask)
    )
    with torch.no_grad():
        expected = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    diff = np.abs(
        _real(np.asarray(hidden.sequence_output), mask) - _real(expected[0].numpy(), mask)
    )
    assert diff.max() < TOL
    state, arch = convert.to_hf_state_dict(config, params)
    assert arch == "ModernBertModel"
    assert set(state) == set(model.state_dict())

    orbax = tmp_path / "orbax"
    convert.save_params(orbax, config, params)
    again, again_params, _ = convert.load_params(orbax)
    assert again == config
    assert read_config(orbax / "config.json") == config


def test_state_dict_round_trip_is_identical(hf_dir, loaded):
    """HF -> our names -> HF gives back every tensor bit for bit (the decoder's tied copy is
    transformers' to make), with biases on in every place transformers has one."""
    config, params, _ = loaded
    state, arch = convert.to_hf_state_dict(config, params)
    original = {k: v.numpy() for k, v in hf_dir[1].state_dict().items()}
    assert arch == "ModernBertForMaskedLM"
    assert set(original) - set(state) == {"decoder.weight"}
    for key, value in state.items():
        np.testing.assert_array_equal(value, original[key], err_msg=key)


def test_biases_on_equal_transformers(tmp_path):
    model = _hf_model(
        seed=1, attention_bias=True, mlp_bias=True, classifier_bias=True, norm_bias=True
    )
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    config, params, _ = convert.load_pretrained(tmp_path / "hf", model="auto")
    assert config.linear_bias and config.norm_bias
    ids, mask = _batch()
    hf_hidden, hf_logits = _hf_outputs(model, ids, mask)
    hidden, logits = _ours(config, params, ids, mask)
    hidden_diff = np.abs(_real(hidden, mask) - _real(hf_hidden, mask)).max()
    logits_diff = np.abs(_real(logits, mask) - _real(hf_logits, mask)).max()
    print(
        f"biases on: max |ours - transformers|: hidden {hidden_diff:.2e}, logits {logits_diff:.2e}"
    )
    assert hidden_diff < TOL and logits_diff < TOL
    state, _ = convert.to_hf_state_dict(config, params)
    for key, value in model.state_dict().items():
        if key != "decoder.weight":
            np.testing.assert_array_equal(state[key], value.numpy(), err_msg=key)


@pytest.mark.parametrize(
    "key, change, message",
    [
        (
            "model.layers.1.attn.Wqkv.weight",
            "cut",
            r"shape \(191, 64\) but the model config expects \(192, 64\)",
        ),
        ("model.layers.2.attn_norm.weight", "drop", "missing tensor"),
    ],
)
def test_a_bad_or_missing_tensor_is_named(hf_dir, tmp_path, key, change, message):
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "bad"
    shutil.copytree(hf_dir[0], path)
    state = load_file(path / "model.safetensors")
    if change == "cut":
        state[key] = state[key][:-1]
    else:
        del state[key]
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        convert.ConversionError,
        match=f"'{re.escape(key)}'.*{message}|{message}.*'{re.escape(key)}'",
    ):
        convert.load_pretrained(path)


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(attention_bias=True), "classifier_bias"),
        (dict(classifier_activation="gelu_new"), "classifier_activation"),
        (dict(embedding_dropout=0.1), "embedding_dropout"),
        (dict(model_type="roberta"), "model_type"),
    ],
)
def test_configs_we_cannot_express_are_refused_by_key(hf_dir, tmp_path, change, key):
    data = json.loads((hf_dir[0] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, **change}))
    with pytest.raises(ConfigError, match=key):
        read_config(tmp_path / "config.json")


def test_an_architecture_modernbert_lacks_is_refused_on_export(loaded, tmp_path):
    config, params, _ = loaded
    alibi = config.replace(position_encoding="alibi")
    with pytest.raises(ConfigError, match="position_encoding='alibi'"):
        convert.save_hf(tmp_path / "alibi", alibi, params)
    assert not (tmp_path / "alibi").exists()
    assert BertConfig().non_bert_fields() == []  # BERT stays BERT's family


def test_cli_writes_params_only_orbax_with_the_tokenizer(hf_dir, loaded, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
    out = tmp_path / "orbax"
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.convert", f"--input={hf_dir[0]}", f"--output={out}"]
        + ["--format=orbax"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "No vocab.txt" not in result.stderr  # the tokenizer came along instead
    assert (out / "tokenizer.json").read_text() == (hf_dir[0] / "tokenizer.json").read_text()
    config, params, _ = convert.load_params(out)
    assert config == loaded[0]
    state, _ = convert.to_hf_state_dict(config, params)
    for key, value in convert.to_hf_state_dict(*loaded[:2])[0].items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)


def test_how_a_model_is_computed_is_not_written_into_its_config(tmp_path):
    """A run on TPU (splash tiles, bf16 activations, remat) exports the network, not its
    computation: a reader on a CPU gets the defaults of every computation key."""
    from bert_jax.convert.families import ours_config_dict

    computed = BertConfig.from_preset(
        "modernbert_tiny",
        activation_dtype="bfloat16",
        attention_implementation="splash",
        attention_probs_dropout_prob=0.0,
        splash_block_q=256,
        splash_block_kv=256,
        splash_local_block=128,
        splash_fused_backward=True,
        remat_policy="full",
    )
    data = ours_config_dict(computed)
    for key in (
        "activation_dtype",
        "attention_implementation",
        "splash_block_q",
        "splash_block_kv",
        "splash_local_block",
        "splash_fused_backward",
        "remat_policy",
        "dtype",
    ):
        assert key not in data, key
    (tmp_path / "config.json").write_text(json.dumps(data))
    read = read_config(tmp_path / "config.json")
    default = BertConfig.from_preset("modernbert_tiny", attention_probs_dropout_prob=0.0)
    assert read == default
