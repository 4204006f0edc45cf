"""ELECTRA: parity with transformers' PyTorch Electra models, sampling, gradients, training.

The reference is `transformers.ElectraForPreTraining` (the discriminator) and
`ElectraForMaskedLM` (the generator), in eval mode, loading our weights through
`bert_jax.convert.electra` with `strict=True` (no missing or unexpected key). Their losses
are computed by transformers (`labels=`), not re-derived here.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import convert
from bert_jax.config import BertConfig, ConfigError
from bert_jax.convert.electra import (
    hf_electra_config,
    save_hf_electra,
    to_hf_electra_state_dicts,
)
from bert_jax.electra import (
    DISC_WEIGHT,
    ElectraForPreTraining,
    check_generator,
    electra_loss,
    generator_config,
    rtd_loss,
)
from bert_jax.heads import BertForSequenceClassification
from bert_jax.model import BertModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-5  # float32, max |ours - transformers| of logits and losses
B, T, P = 3, 12, 4
MASK_ID = 4

DISC = BertConfig(
    vocab_size=101,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=24,
)
# (discriminator, generator): ELECTRA-Small's shape (E < H, both projected), ELECTRA-Base's
# (E = H for the discriminator, the generator projected), and a generator as wide as E.
PAIRS = {
    "small": (DISC, generator_config(DISC)),  # generator H = 8, one head
    "base": (
        DISC.replace(embedding_size=None),
        generator_config(DISC.replace(embedding_size=None), hidden_fraction=0.5),
    ),
    "gen_h_eq_e": (DISC, DISC.replace(hidden_size=16, num_attention_heads=1, intermediate_size=48)),
}


def _batch(seed=0):
    """A masked batch as our pipeline gives it: [MASK] / random / kept at the predictions."""
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 9, 5])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    original = rng.integers(5, DISC.vocab_size, (B, T)).astype(np.int32) * mask
    types = ((np.arange(T)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
    positions = np.zeros((B, P), np.int32)
    weights = np.zeros((B, P), np.float32)
    for b, n in enumerate([4, 3, 2]):  # row 2 has two padding predictions
        positions[b, :n] = np.sort(rng.choice(np.arange(1, lengths[b] - 1), n, replace=False))
        weights[b, :n] = 1.0
    ids = original.copy()
    for b, j in zip(*np.nonzero(weights), strict=True):
        if j in (1, 2):  # [MASK]; the first prediction stays as it is, the fourth is random
            ids[b, positions[b, j]] = MASK_ID
        elif j == 3:
            ids[b, positions[b, j]] = rng.integers(5, DISC.vocab_size)
    masked_ids = np.take_along_axis(original, positions, 1) * (weights > 0)
    return {
        "input_ids": jnp.asarray(ids),
        "input_mask": jnp.asarray(mask),
        "segment_ids": jnp.asarray(types),
        "masked_lm_positions": jnp.asarray(positions),
        "masked_lm_ids": jnp.asarray(masked_ids.astype(np.int32)),
        "masked_lm_weights": jnp.asarray(weights),
        "original": original,
    }


def _args(batch):
    return (
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        batch["masked_lm_positions"],
        batch["masked_lm_ids"],
        batch["masked_lm_weights"],
    )


def _params(model, batch, seed=0):
    """Our init, every tensor then perturbed: biases and LayerNorms away from 0 and 1."""
    variables = model.init(jax.random.key(seed), *_args(batch), jax.random.key(1))
    params = nn.meta.unbox(variables)["params"]
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    noisy = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree_util.tree_unflatten(tree, noisy)


def _run(model, params, batch, key=2):
    key = jax.random.key(key) if isinstance(key, int) else key
    return model.apply({"params": params}, *_args(batch), key)


def _hf(config, architecture, state):
    cls = getattr(transformers, architecture)
    model = cls(transformers.ElectraConfig(**hf_electra_config(config, architecture))).eval()
    model.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)
    return model


@pytest.mark.parametrize("pair", list(PAIRS))
def test_logits_and_losses_match_transformers(pair):
    disc, gen = PAIRS[pair]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)
    out = _run(model, params, batch)
    loss, metrics = electra_loss(out, batch)
    disc_state, gen_state = to_hf_electra_state_dicts(disc, gen, params)
    for config, state in ((disc, disc_state), (gen, gen_state)):
        projected = config.embedding_width != config.hidden_size
        assert ("electra.embeddings_project.weight" in state) == projected
    mask = torch.tensor(np.asarray(batch["input_mask"]), dtype=torch.long)
    types = torch.tensor(np.asarray(batch["segment_ids"]), dtype=torch.long)
    positions = np.asarray(batch["masked_lm_positions"])
    weights = np.asarray(batch["masked_lm_weights"])

    # The generator reads the masked input; MLM labels at the real predictions only.
    generator = _hf(gen, "ElectraForMaskedLM", gen_state)
    labels = np.full((B, T), -100)
    for b, j in zip(*np.nonzero(weights), strict=True):
        labels[b, positions[b, j]] = batch["masked_lm_ids"][b, j]
    with torch.no_grad():
        ref = generator(
            input_ids=torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long),
            attention_mask=mask,
            token_type_ids=types,
            labels=torch.tensor(labels),
        )
    ref_logits = np.take_along_axis(ref.logits.numpy(), positions[..., None], axis=1)
    gen_diff = np.abs(np.asarray(out.mlm_logits) - ref_logits).max()
    assert gen_diff < TOL, gen_diff
    # Ours divides by Σ weights + 1e-5 (the original BERT's MLM loss), theirs by the count.
    n = weights.sum()
    expected_mlm = ref.loss.item() * n / (n + 1e-5)
    assert abs(float(metrics["mlm_loss"]) - expected_mlm) < TOL

    # The discriminator reads our corrupted sequence; labels are our "replaced" flags.
    discriminator = _hf(disc, "ElectraForPreTraining", disc_state)
    with torch.no_grad():
        ref = discriminator(
            input_ids=torch.tensor(np.asarray(out.replaced_ids), dtype=torch.long),
            attention_mask=mask,
            token_type_ids=types,
            labels=torch.tensor(np.asarray(out.is_replaced), dtype=torch.long),
        )
    disc_diff = np.abs(np.asarray(out.disc_logits) - ref.logits.numpy()).max()
    assert disc_diff < TOL, disc_diff
    n = float(np.asarray(batch["input_mask"]).sum())
    expected_disc = ref.loss.item() * n / (n + 1e-6)  # ours: Σ / (Σ mask + 1e-6), the paper's
    assert abs(float(metrics["disc_loss"]) - expected_disc) < TOL
    expected = expected_mlm + DISC_WEIGHT * expected_disc
    assert abs(float(loss) - expected) < DISC_WEIGHT * TOL
    # Some samples differ from the original: the discriminator's labels are not all zero.
    assert 0 < int(np.asarray(out.is_replaced).sum()) <= int(weights.sum())


def test_discriminator_is_a_bert_encoder():
    """Fine-tuning restores `bert` as a BertModel: the same tree, the same states."""
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)
    assert set(params) == {"bert", "generator", "rtd"}
    encoder = BertModel(disc, add_pooling_layer=False)
    ids, mask, types = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    template = nn.meta.unbox(encoder.init(jax.random.key(0), ids, mask, types))["params"]
    shapes = jax.tree_util.tree_map(jnp.shape, params["bert"])
    assert shapes == jax.tree_util.tree_map(jnp.shape, template)
    assert set(params["generator"]) == {"embeddings_project", "encoder", "mlm"}
    # Nothing of the embeddings is the generator's own: they are `bert`'s, shared.
    assert "embeddings" not in params["generator"]


def test_export_loads_in_transformers_with_no_missing_weights(tmp_path):
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)
    out = _run(model, params, batch)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"[unused{i}]\n" for i in range(disc.vocab_size)))
    save_hf_electra(tmp_path / "hf", disc, gen, params, vocab_file=str(vocab))
    inputs = {
        "attention_mask": torch.tensor(np.asarray(batch["input_mask"]), dtype=torch.long),
        "token_type_ids": torch.tensor(np.asarray(batch["segment_ids"]), dtype=torch.long),
    }
    expected = [
        (
            transformers.ElectraForPreTraining,
            tmp_path / "hf",
            out.replaced_ids,
            out.disc_logits,
        ),
        (
            transformers.ElectraForMaskedLM,
            tmp_path / "hf" / "generator",
            batch["input_ids"],
            out.mlm_logits,
        ),
    ]
    for cls, directory, ids, ours in expected:
        theirs, info = cls.from_pretrained(directory, output_loading_info=True)
        assert not any(info.values()), info  # no missing, unexpected or mismatched key
        assert (directory / "vocab.txt").exists()
        with torch.no_grad():
            logits = theirs.eval()(torch.tensor(np.asarray(ids), dtype=torch.long), **inputs)
        logits = logits.logits.numpy()
        if logits.ndim == 3:  # the generator's, at every position: compare the masked ones
            positions = np.asarray(batch["masked_lm_positions"])
            logits = np.take_along_axis(logits, positions[..., None], axis=1)
        assert np.abs(logits - np.asarray(ours)).max() < TOL


def test_the_discriminator_restores_for_fine_tuning(tmp_path, caplog):
    """`bert` of an ELECTRA-Small model (E < H, projected) imports into a BERT head model."""
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)
    convert.save_params(tmp_path / "params", disc, {"bert": params["bert"]})
    classifier = BertForSequenceClassification(disc, num_labels=3)
    config, restored, _ = convert.load_pretrained(tmp_path / "params", model=classifier)
    assert config == disc
    for path, value in convert.names.flatten(params["bert"]):
        np.testing.assert_array_equal(convert.names.get_path(restored["bert"], path), value)
    assert set(restored) == {"bert", "classifier"} and "pooler" in restored["bert"]
    assert "initialising head 'bert/pooler' from scratch" in caplog.text
    ids, mask, types = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    assert classifier.apply({"params": restored}, ids, mask, types).shape == (B, 3)


def test_embedding_size_in_the_config_files():
    with pytest.raises(ConfigError, match="embedding_size must be a positive integer"):
        DISC.replace(embedding_size=0)
    assert BertConfig.from_dict(DISC.to_hf_dict()) == DISC
    assert "embedding_size" not in BertConfig().to_hf_dict()
    with pytest.raises(ConfigError, match="no embedding projection"):
        DISC.to_google_dict()
    params = nn.meta.unbox(BertModel(DISC).init(jax.random.key(0), jnp.zeros((1, 2), int)))
    with pytest.raises(convert.ConversionError, match="bert_jax.convert.electra"):
        convert.to_hf_state_dict(DISC, params["params"])


def test_sampling_replaces_only_masked_positions_and_a_reproduced_token_is_original():
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)
    original = batch["original"]
    positions = np.asarray(batch["masked_lm_positions"])
    real = np.asarray(batch["masked_lm_weights"]) > 0
    predicted = np.zeros((B, T), bool)
    for b, j in zip(*np.nonzero(real), strict=True):
        predicted[b, positions[b, j]] = True

    out = _run(model, params, batch, key=3)
    replaced = np.asarray(out.replaced_ids)
    np.testing.assert_array_equal(replaced[~predicted], original[~predicted])
    sampled = np.asarray(out.sampled_ids)
    np.testing.assert_array_equal(replaced[predicted], sampled[real])
    np.testing.assert_array_equal(np.asarray(out.is_replaced), replaced != original)
    assert not np.asarray(out.is_replaced)[~predicted].any()
    # Another key, other samples (the key is what the samples come from).
    assert not np.array_equal(np.asarray(_run(model, params, batch, key=4).sampled_ids), sampled)

    # A generator certain of one token: where it is the original, the token is original.
    token = int(original[0, positions[0, 0]])
    certain = jax.tree_util.tree_map(lambda x: x, params)  # new dicts, the same arrays
    bias = certain["generator"]["mlm"]["output_bias"]
    certain["generator"]["mlm"]["output_bias"] = bias.at[token].set(1e4)
    out = _run(model, certain, batch)
    np.testing.assert_array_equal(np.asarray(out.sampled_ids)[real], token)
    flags = np.asarray(out.is_replaced)
    np.testing.assert_array_equal(flags[predicted], original[predicted] != token)
    assert not flags[0, positions[0, 0]] and flags.any()


def test_the_discriminator_loss_does_not_reach_the_generator():
    """No gradient through the samples: the RTD term's gradient on the generator's own
    parameters is exactly zero, while the MLM term's is not; the shared embeddings get both."""
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)

    def terms(params):
        out = _run(model, params, batch)
        _, metrics = electra_loss(out, batch)
        return metrics["mlm_loss"], metrics["disc_loss"]

    # Jitted: eagerly, each primitive of the backward pass compiled on its own (~50 ms each
    # on this CPU) took three times as long.
    rtd_grad = jax.jit(jax.grad(lambda p: terms(p)[1]))(params)
    mlm_grad = jax.jit(jax.grad(lambda p: terms(p)[0]))(params)
    for leaf in jax.tree_util.tree_leaves(rtd_grad["generator"]):
        assert not np.asarray(leaf).any()
    assert all(np.abs(x).max() > 0 for x in jax.tree_util.tree_leaves(mlm_grad["generator"]))
    word = ("bert", "embeddings", "word_embeddings", "embedding")
    for grad in (rtd_grad, mlm_grad):
        table = grad
        for key in word:
            table = table[key]
        assert np.abs(np.asarray(table)).max() > 0
    # The MLM term reaches neither the discriminator's encoder nor its head.
    for leaf in jax.tree_util.tree_leaves((mlm_grad["bert"]["encoder"], mlm_grad["rtd"])):
        assert not np.asarray(leaf).any()


def test_rtd_loss_is_the_mean_over_real_tokens():
    logits = jnp.array([[2.0, -1.0, 0.5, 9.0], [0.0, 3.0, -2.0, -9.0]])
    labels = jnp.array([[1, 0, 0, 1], [1, 1, 0, 0]], bool)
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    # -log σ(x) for a replaced token, -log(1 - σ(x)) for an original one, at the 5 real tokens.
    per_token = [np.log1p(np.exp(-2.0)), np.log1p(np.exp(-1.0)), np.log1p(np.exp(0.5))]
    per_token += [np.log(2.0), np.log1p(np.exp(-3.0))]
    np.testing.assert_allclose(rtd_loss(logits, labels, mask), sum(per_token) / 5, rtol=1e-6)


def test_metrics_count_replaced_precision_and_recall():
    from bert_jax.electra import ElectraOutput

    logits = jnp.array([[2.0, -1.0, 0.5, 9.0, 3.0]])
    labels = jnp.array([[1, 1, 0, 0, 1]], bool)
    batch = {
        "input_mask": jnp.array([[1, 1, 1, 1, 0]]),
        "masked_lm_ids": jnp.array([[3, 4]]),
        "masked_lm_weights": jnp.array([[1.0, 1.0]]),
    }
    mlm_logits = jax.nn.one_hot(jnp.array([[3, 5]]), 8) * 5.0
    out = ElectraOutput(mlm_logits, jnp.array([[3, 3]]), None, labels, logits)
    _, m = electra_loss(out, batch)
    # Real tokens 0..3: predicted replaced {0, 2, 3}, replaced {0, 1}; position 4 is padding.
    assert float(m["disc_precision"]) == pytest.approx(1 / 3)
    assert float(m["disc_recall"]) == pytest.approx(1 / 2)
    assert float(m["disc_accuracy"]) == pytest.approx(1 / 4)
    assert float(m["replaced_fraction"]) == pytest.approx(2 / 4)
    assert float(m["mlm_accuracy"]) == pytest.approx(1 / 2, abs=1e-5)
    assert float(m["sampled_mlm_accuracy"]) == pytest.approx(1 / 2, abs=1e-5)


def test_generator_config_follows_the_released_code():
    base = BertConfig.from_preset("base")
    gen = generator_config(base, hidden_fraction=1 / 3)
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (256, 4, 1024)
    assert gen.num_hidden_layers == 12 and gen.embedding_width == 768
    small = BertConfig.from_preset("mini", embedding_size=128)  # ELECTRA-Small: 256 / 128
    gen = generator_config(small)
    assert (gen.hidden_size, gen.num_attention_heads, gen.embedding_width) == (64, 1, 128)
    with pytest.raises(ConfigError, match="vocab_size"):
        check_generator(small, gen.replace(vocab_size=7))


def test_a_few_adamw_steps_lower_the_loss():
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = _params(model, batch)
    optimizer = optax.adamw(3e-3, weight_decay=0.01)
    state = optimizer.init(params)
    args = _args(batch)

    @jax.jit
    def step(params, state, key):
        def loss_fn(p):
            return electra_loss(model.apply({"params": p}, *args, key), batch)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(p := params)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, metrics

    history = []
    for i in range(12):
        params, state, metrics = step(params, state, jax.random.key(i))
        history.append({k: float(v) for k, v in metrics.items()})
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(params))
    first, last = history[0], history[-1]
    assert last["loss"] < 0.7 * first["loss"], (first, last)
    assert last["mlm_loss"] < first["mlm_loss"], (first, last)
    assert last["disc_accuracy"] > first["disc_accuracy"], (first, last)


def test_scanned_layers_compute_the_same():
    """`scan_layers` stacks both encoders' layers; the outputs are the looped model's."""
    disc, gen = PAIRS["small"]
    batch = _batch()
    looped = ElectraForPreTraining(disc, gen)
    params = _params(looped, batch)
    scanned = ElectraForPreTraining(disc.replace(scan_layers=True), gen.replace(scan_layers=True))
    stacked = jax.tree_util.tree_map(lambda x: x, params)
    for model, config in (("bert", disc), ("generator", gen)):
        encoder = stacked[model]["encoder"]
        stacked[model]["encoder"] = convert.stack_layers(encoder, config.num_hidden_layers)
    template = nn.meta.unbox(scanned.init(jax.random.key(0), *_args(batch), jax.random.key(1)))
    shapes = jax.tree_util.tree_map(jnp.shape, template["params"])
    assert jax.tree_util.tree_map(jnp.shape, stacked) == shapes
    ours, theirs = _run(looped, params, batch), _run(scanned, stacked, batch)
    np.testing.assert_array_equal(ours.replaced_ids, theirs.replaced_ids)
    np.testing.assert_allclose(ours.mlm_logits, theirs.mlm_logits, atol=1e-6)
    np.testing.assert_allclose(ours.disc_logits, theirs.disc_logits, atol=1e-6)


def test_sharded_on_a_mesh_equals_one_device():
    """Every new parameter has logical names the rule table maps (params born sharded over
    fsdp and tensor); the sharded forward pass is the single-device one."""
    from bert_jax import sharding

    disc = PAIRS["small"][0].replace(vocab_size=104)  # divisible by the tensor axis
    gen = generator_config(disc, hidden_fraction=0.5)  # 16 wide: 2 heads of 8 dims
    gen = gen.replace(num_attention_heads=2)
    model = ElectraForPreTraining(disc, gen)
    rows = [_batch(seed) for seed in range(3)]
    batch = {k: jnp.concatenate([r[k] for r in rows])[:8] for k in rows[0] if k != "original"}
    args = _args(batch)
    mesh = sharding.create_mesh((2, 2, 2))

    def init(key):
        return model.init(key, *args, jax.random.key(1))

    abstract = jax.eval_shape(init, jax.random.key(0))
    names = nn.get_partition_spec(abstract)["params"]
    assert names["bert"]["embeddings_project"]["kernel"] == jax.sharding.PartitionSpec(
        "embed", "mlp"
    )
    with sharding.activation_context(mesh):
        variables = jax.jit(init, out_shardings=sharding.shardings_of(abstract, mesh))(
            jax.random.key(0)
        )
        kernel = nn.meta.unbox(variables)["params"]["generator"]["encoder"]["layer_0"]
        kernel = kernel["intermediate"]["kernel"]  # (embed, mlp) -> (fsdp, tensor)
        assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
        params = nn.meta.unbox(variables)["params"]
        sharded = jax.jit(lambda p: _run(model, p, batch))(params)
    single = _run(model, jax.device_get(params), batch)
    np.testing.assert_array_equal(sharded.replaced_ids, single.replaced_ids)
    np.testing.assert_allclose(sharded.disc_logits, single.disc_logits, atol=1e-5)
    np.testing.assert_allclose(sharded.mlm_logits, single.mlm_logits, atol=1e-5)


def test_samples_follow_the_generators_softmax():
    """Temperature 1: over many keys, each masked position's samples have the frequencies
    softmax(mlm_logits) gives (not the argmax, not another temperature)."""
    disc, gen = PAIRS["small"]
    model = ElectraForPreTraining(disc, gen)
    batch = _batch()
    params = jax.tree_util.tree_map(lambda x: x, _params(model, batch))
    # Three likely tokens (about 0.45, 0.27, 0.17 of the mass) and a tail of 98 others.
    bias = params["generator"]["mlm"]["output_bias"]
    params["generator"]["mlm"]["output_bias"] = bias.at[jnp.array([7, 8, 9])].add(
        jnp.array([6.0, 5.5, 5.0])
    )
    n = 4000
    keys = jax.random.split(jax.random.key(5), n)
    sampled = jax.jit(jax.vmap(lambda k: _run(model, params, batch, k).sampled_ids))(keys)
    probs = np.asarray(jax.nn.softmax(_run(model, params, batch).mlm_logits, axis=-1))
    real = np.asarray(batch["masked_lm_weights"]) > 0
    sampled = np.asarray(sampled)  # (n, B, P)
    for b, j in zip(*np.nonzero(real), strict=True):
        for token in (7, 8, 9, 20):
            p = probs[b, j, token]
            freq = np.mean(sampled[:, b, j] == token)
            assert abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-3, (b, j, token, freq, p)
    assert 0.3 < probs[real][:, 7].min() and probs[real][:, 7].max() < 0.6
