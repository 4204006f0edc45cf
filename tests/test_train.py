"""Optimizer faithfulness and sharded training trajectories (8 fake CPU devices)."""

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import synthetic_pretraining as synth
from jax.sharding import PartitionSpec as P

from bert_jax import optim, sharding, train, train_loop
from bert_jax.config import ConfigError
from bert_jax.heads import BertForPreTraining
from bert_jax.train_state import PRNG_IMPLS, run_keys, sharded_state
from experiments.configs import bert_tiny_cpu


def _optimizer_config(**overrides):
    """The experiments' BERT AdamW (bert_tiny_cpu.py) with a short warmup, plus overrides."""
    config = bert_tiny_cpu.get_config().optimizer
    config.update(dict(learning_rate=1e-3, warmup_steps=3) | overrides)
    return config


def _reference_bert_adamw(params, grads_per_step, lr_at, wd=0.01, b1=0.9, b2=0.999, eps=1e-6):
    """The update rule of the original AdamWeightDecayOptimizer, written out in numpy:
    clip by global norm 1.0, m/v without bias correction, decay except LayerNorm/bias."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    for step, grads in enumerate(grads_per_step):
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
        scale = 1.0 / max(norm, 1.0)
        for k in params:
            g = grads[k] * scale
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            update = m[k] / (np.sqrt(v[k]) + eps)
            if not (k.endswith("bias") or k.endswith("scale")):
                update = update + wd * params[k]
            params[k] = params[k] - lr_at(step) * update
    return params


def _params_and_grads(seed: int):
    """A kernel (decayed), a bias and a LayerNorm scale (not decayed), and 6 steps of grads."""
    rng = np.random.default_rng(seed)
    params = {
        "kernel": rng.normal(size=(4, 3)).astype(np.float32),
        "bias": rng.normal(size=(3,)).astype(np.float32),
        "scale": rng.normal(size=(3,)).astype(np.float32),
    }
    grads = [
        {k: rng.normal(size=p.shape).astype(np.float32) * 3 for k, p in params.items()}
        for _ in range(6)
    ]
    return params, grads


def test_bert_adamw_matches_the_original_update_rule():
    params, grads = _params_and_grads(0)
    config = _optimizer_config()
    tx = optim.make_optimizer(config, num_train_steps=10)
    state = tx.init(params)
    ours = {k: jnp.asarray(v) for k, v in params.items()}
    for g in grads:
        updates, state = tx.update(g, state, ours)
        ours = optax.apply_updates(ours, updates)

    def lr_at(step):  # linear warmup over 3 steps, then linear decay to 0 at step 10
        return 1e-3 * step / 3 if step < 3 else 1e-3 * (1 - step / 10)

    expected = _reference_bert_adamw(params, grads, lr_at)
    for k in params:
        np.testing.assert_allclose(np.asarray(ours[k]), expected[k], rtol=1e-5, atol=1e-7)


def test_adamw_bias_corrected_matches_torch_adamw():
    """The variant with Adam's bias correction is torch.optim.AdamW (decay off bias/scale)."""
    torch = pytest.importorskip("torch")
    params, grads = _params_and_grads(1)
    tx = optim.make_optimizer(_optimizer_config(name="adamw_bias_corrected"), 10)
    state, ours = tx.init(params), {k: jnp.asarray(v) for k, v in params.items()}
    for g in grads:
        updates, state = tx.update(g, state, ours)
        ours = optax.apply_updates(ours, updates)

    theirs = {
        k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()
    }
    groups = [{"params": [theirs["kernel"]], "weight_decay": 0.01},
              {"params": [theirs["bias"], theirs["scale"]], "weight_decay": 0.0}]  # fmt: skip
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-6)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: step / 3 if step < 3 else 1 - step / 10
    )
    for g in grads:
        for k, p in theirs.items():
            p.grad = torch.tensor(g[k], dtype=torch.float64)
        torch.nn.utils.clip_grad_norm_(list(theirs.values()), 1.0)
        opt.step()
        schedule.step()
    for k in params:
        np.testing.assert_allclose(
            np.asarray(ours[k]), theirs[k].detach().numpy(), rtol=1e-5, atol=1e-7
        )
    # And it is not the original's rule: without bias correction the steps are larger.
    original = _reference_bert_adamw(
        params, grads, lambda s: 1e-3 * s / 3 if s < 3 else 1e-3 * (1 - s / 10)
    )
    assert not np.allclose(np.asarray(ours["kernel"]), original["kernel"], rtol=1e-4)


def test_weight_decay_skips_layer_norm_and_biases():
    inputs = train.init_inputs(train.example_batch(2, synth.SEQ_LEN, synth.PREDICTIONS))
    params = BertForPreTraining(synth.TINY).init(jax.random.key(0), *inputs)["params"]
    mask = jax.tree_util.tree_flatten_with_path(optim.decay_mask(nn.unbox(params)))[0]
    decayed = {jax.tree_util.keystr(path) for path, on in mask if on}
    skipped = {jax.tree_util.keystr(path) for path, on in mask if not on}
    assert any("word_embeddings" in p for p in decayed)
    assert any("intermediate']['kernel" in p for p in decayed)
    assert all(p.endswith(("['bias']", "['scale']", "['output_bias']")) for p in skipped)
    assert any("layer_norm']['scale" in p for p in skipped)
    assert not any(p.endswith("['bias']") for p in decayed)


def test_schedule_is_the_originals():
    schedule = optim.warmup_polynomial_decay(1e-4, warmup_steps=10, total_steps=100)
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(5)), 5e-5, rtol=1e-6)
    # After warmup the decay is counted from step 0, as in google-research/bert.
    np.testing.assert_allclose(float(schedule(10)), 1e-4 * 0.9, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(100)), 0.0, atol=1e-12)


def test_gradient_accumulation_equals_the_large_batch_update():
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    grads = [{"w": jnp.full((2, 3), float(i + 1))} for i in range(4)]
    big = optim.make_optimizer(_optimizer_config(max_grad_norm=0.0), 8)
    small = optim.make_optimizer(_optimizer_config(max_grad_norm=0.0, grad_accum_steps=2), 8)
    p_big, s_big = params, big.init(params)
    for pair in (grads[:2], grads[2:]):
        mean = jax.tree.map(lambda a, b: (a + b) / 2, *pair)
        u, s_big = big.update(mean, s_big, p_big)
        p_big = optax.apply_updates(p_big, u)
    p_small, s_small = params, small.init(params)
    for g in grads:
        u, s_small = small.update(g, s_small, p_small)
        p_small = optax.apply_updates(p_small, u)
    np.testing.assert_allclose(p_small["w"], p_big["w"], rtol=1e-6)


def test_lamb_trust_ratio_scales_per_layer():
    tx = optim.make_optimizer(_optimizer_config(name="lamb", max_grad_norm=0.0), 10)
    params = {"a": {"kernel": jnp.ones((3, 3)) * 10.0}, "b": {"kernel": jnp.ones((3, 3)) * 0.1}}
    grads = jax.tree.map(jnp.ones_like, params)
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
    ratio = jnp.linalg.norm(updates["a"]["kernel"]) / jnp.linalg.norm(updates["b"]["kernel"])
    assert float(ratio) == pytest.approx(100.0, rel=1e-3)  # ∝ the layer's own weight norm


# --- sharded trajectories -----------------------------------------------------------------

STEPS = 5


def _trajectory(
    mesh_shape, devices=None, rules=sharding.DEFAULT_RULES, predictions=synth.PREDICTIONS
):
    mesh = sharding.create_mesh(mesh_shape, devices)
    model = BertForPreTraining(synth.TINY)
    config = _optimizer_config(learning_rate=5e-3)
    tx = optim.make_optimizer(config, 20)
    schedule = optim.learning_rate_schedule(config, 20)
    inputs = train.init_inputs(train.example_batch(8, synth.SEQ_LEN, predictions))
    state, shardings = sharded_state(model, tx, mesh, inputs, rng=jax.random.key(0), rules=rules)
    step_fn, _ = train.jit_steps(model, tx, schedule, mesh, shardings, rules=rules)
    losses = []
    with sharding.activation_context(mesh, rules):
        for step in range(STEPS):
            batch = synth.random_batch(8, seed=step, predictions=predictions)
            global_batch = sharding.global_batch(batch, mesh, rules)
            state, metrics = step_fn(state, global_batch, jax.random.key(1))
            losses.append(float(metrics["loss"]))
    kernel = state.params["bert"]["encoder"]["layer_1"]["intermediate"]["kernel"]
    return np.array(losses), np.asarray(kernel), kernel.sharding


# P = 10 predictions: on fsdp x tensor with P >= 8, XLA once partitioned the MLM head's
# backward with the batch shards of the logits' gradient swapped between devices (same
# loss, wrong gradients: `heads.MaskedLMHead`); the records' P = 5 does not reach that plan.
MESH_PREDICTIONS = 10


@functools.cache
def _single_device():
    return _trajectory((1, 1, 1), jax.devices()[:1], predictions=MESH_PREDICTIONS)


@pytest.mark.parametrize(
    "mesh_shape",
    [
        # Extended tier (~12 s each); make test still checks what each of them checks.
        # dp: test_the_rule_table_in_the_config_switches_dp_fsdp_tp[dp] runs the all-data-
        # parallel step on 8 devices against this same single-device run (and the (8,1,1)
        # mesh trains in test_weight_update_sharding). dp_tp: dp_fsdp_tp below splits data
        # and tensor too, with fsdp. tp: dp_fsdp_tp's tensor axis splits the same kernels.
        pytest.param((8, 1, 1), id="dp", marks=pytest.mark.extended),
        pytest.param((1, 8, 1), id="fsdp"),
        pytest.param((1, 1, 8), id="tp", marks=pytest.mark.extended),
        pytest.param((2, 1, 4), id="dp_tp", marks=pytest.mark.extended),
        pytest.param((2, 2, 2), id="dp_fsdp_tp"),
    ],
)
def test_five_steps_on_a_mesh_equal_the_single_device_run(mesh_shape):
    losses_ref, kernel_ref, _ = _single_device()
    losses, kernel, kernel_sharding = _trajectory(mesh_shape, predictions=MESH_PREDICTIONS)
    assert losses[-1] < losses[0]  # it trains
    np.testing.assert_allclose(losses, losses_ref, rtol=2e-5)
    np.testing.assert_allclose(kernel, kernel_ref, rtol=1e-4, atol=1e-6)
    if mesh_shape[1] > 1 or mesh_shape[2] > 1:  # the state really is split
        assert kernel_sharding.shard_shape(kernel.shape) != kernel.shape


# One (2, 2, 2) mesh, three ways to use it, switched by `config.sharding_rules` alone:
# (rule table, intermediate kernel (embed, mlp) spec, batch spec). Unlisted logical axes
# stay whole.
RULE_TABLES = {
    "dp": (
        [("batch", ["data", "fsdp", "tensor"])],
        P(None, None),
        P(("data", "fsdp", "tensor")),
    ),
    "fsdp": (
        [("batch", ["data", "fsdp", "tensor"]), ("embed", ["fsdp", "tensor"])],
        P(("fsdp", "tensor"), None),
        P(("data", "fsdp", "tensor")),
    ),
    "tp": (
        [("batch", "data"), ("heads", "tensor"), ("mlp", "tensor"), ("vocab", "tensor")],
        P(None, "tensor"),
        P("data"),
    ),
}


@pytest.mark.parametrize("name", RULE_TABLES)
def test_the_rule_table_in_the_config_switches_dp_fsdp_tp(name):
    table, kernel_spec, batch_spec = RULE_TABLES[name]
    config = bert_tiny_cpu.get_config()
    config.sharding_rules = table
    mesh = sharding.create_mesh((2, 2, 2))
    run = train.setup(config, mesh, vocab_size=synth.TINY.vocab_size)
    kernel = run.shardings.params["bert"]["encoder"]["layer_1"]["intermediate"]["kernel"]
    assert kernel.spec == kernel_spec
    assert sharding.batch_sharding(mesh, run.rules).spec == batch_spec
    # The same five steps as on one device, with the table placing state and batch.
    losses_ref, kernel_ref, _ = _single_device()
    losses, kernel, kernel_sharding = _trajectory(
        (2, 2, 2), rules=run.rules, predictions=MESH_PREDICTIONS
    )
    np.testing.assert_allclose(losses, losses_ref, rtol=2e-5)
    np.testing.assert_allclose(kernel, kernel_ref, rtol=1e-4, atol=1e-6)
    assert kernel_sharding.spec == kernel_spec


def test_a_rule_naming_no_mesh_axis_is_refused():
    config = ml_collections.ConfigDict({"sharding_rules": [("embed", ["fsdp", "model"])]})
    with pytest.raises(ValueError, match="'embed' -> .*'model'.* names no mesh axis"):
        sharding.rules_of(config)
    assert sharding.rules_of(ml_collections.ConfigDict({"sharding_rules": None})) == (
        sharding.DEFAULT_RULES
    )


# --- the dropout PRNG (config.prng_impl) ----------------------------------------------------


def test_run_keys_share_the_init_and_switch_the_dropout_implementation():
    inits = {impl: run_keys(7, impl)[0] for impl in PRNG_IMPLS}
    for impl, key in inits.items():
        # The initialisation is threefry's under every implementation: the same weights.
        assert jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0)), impl
        np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(inits["rbg"]))
        dropout = run_keys(7, impl)[1]
        assert str(jax.random.key_impl(dropout)) == str(
            jax.random.key_impl(jax.random.key(0, impl=impl))
        )
    # The default's dropout key is the seed's second split key, as before the switch existed.
    np.testing.assert_array_equal(
        jax.random.key_data(run_keys(7)[1]),
        jax.random.key_data(jax.random.split(jax.random.key(7))[1]),
    )
    with pytest.raises(ValueError, match=r"config.prng_impl must be one of .*got 'philox'"):
        run_keys(7, "philox")


def test_prng_impls_draw_different_dropout_masks():
    """The switch is real: the same step's forward pass under dropout differs per impl, and
    repeats exactly under each."""
    # One layer and the synthetic ids' range of the vocab: the compiles stay small.
    model = BertForPreTraining(synth.TINY.replace(num_hidden_layers=1, vocab_size=3072))
    batch = synth.random_batch(4, seed=0)
    inputs = [jnp.asarray(x) for x in train.init_inputs(batch)]
    params = jax.jit(lambda r: nn.unbox(model.init(r, *inputs)["params"]))(run_keys(0)[0])

    @jax.jit
    def forward(params, rng):
        rngs = {"dropout": jax.random.fold_in(rng, 3)}  # step 3, as make_step folds it
        return model.apply({"params": params}, *inputs, deterministic=False, rngs=rngs)

    outputs = {}
    for impl in PRNG_IMPLS:
        outputs[impl] = np.asarray(forward(params, run_keys(0, impl)[1]).mlm_logits)
        again = np.asarray(forward(params, run_keys(0, impl)[1]).mlm_logits)
        np.testing.assert_array_equal(outputs[impl], again)
    for i, a in enumerate(PRNG_IMPLS):
        for b in PRNG_IMPLS[i + 1 :]:
            assert not np.allclose(outputs[a], outputs[b]), (a, b)


# --- pretraining objectives (config.objective) ------------------------------------------------


def _objective_config(objective: str, **data) -> ml_collections.ConfigDict:
    config = bert_tiny_cpu.get_config()
    config.objective = objective
    config.model.num_hidden_layers = 1
    config.model.vocab_size = 3072  # synthetic ids are < 3000
    config.data.max_seq_length = synth.SEQ_LEN
    config.data.update(data)
    config.optimizer.update(warmup_steps=1, learning_rate=5e-3)
    return config


def _objective_run(objective: str, **data):
    """train.setup of bert_tiny_cpu.py with `objective` (1 layer, the synthetic ids' vocab) on
    one device, a fresh state and a fast-warming optimizer."""
    config = _objective_config(objective, **data)
    mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
    run = train.setup(config, mesh, vocab_size=config.model.vocab_size)
    state, _ = sharded_state(run.model, run.tx, mesh, run.inputs, rng=jax.random.key(0))
    return run, state, mesh


def _steps(run, state, mesh, batch, count=4) -> list[float]:
    losses = []
    for _ in range(count):
        state, metrics = run.train_step(state, sharding.global_batch(batch, mesh), run_keys(0)[1])
        losses.append(float(metrics["loss"]))
    return losses


def test_the_mlm_objective_has_no_nsp_and_its_loss_is_the_mlm_loss():
    from bert_jax.losses import weighted_cross_entropy

    run, state, mesh = _objective_run("mlm", max_predictions_per_seq=synth.PREDICTIONS)
    assert not run.model.next_sentence and not run.model_config.causal
    params = state.params
    assert set(params) == {"bert", "mlm"} and "pooler" not in params["bert"]
    batch = synth.random_batch(8, seed=0)
    metrics = run.eval_step(params, sharding.global_batch(batch, mesh))
    assert set(metrics) == {"loss", "mlm_loss", "mlm_accuracy"}
    logits = run.model.apply({"params": params}, *train.init_inputs(batch)).mlm_logits  # (B, P, V)
    assert logits.shape == (8, synth.PREDICTIONS, 3072)
    expected, _ = weighted_cross_entropy(logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
    np.testing.assert_allclose(float(metrics["loss"]), float(expected), rtol=1e-6)
    losses = _steps(run, state, mesh, batch)
    assert losses[-1] < losses[0], losses


def _save_params_checkpoint(state, directory: str, objective: str) -> str:
    from bert_jax import checkpointing

    manager = checkpointing.make_manager(directory, async_save=False)
    config = _objective_config(objective)
    positions = [{"epoch": 0, "batch_in_epoch": 0, "process_index": 0}]
    assert checkpointing.save(manager, 1, state, positions, checkpointing.config_to_json(config))
    manager.close()
    return directory


def test_init_from_another_objectives_checkpoint_keeps_what_both_share(tmp_path, caplog):
    """A "mlm" checkpoint (no pooler, no NSP head) starts a "mlm_nsp" run: the shared params
    are the checkpoint's, the two heads fresh and logged; the other way round, the NSP head
    is left behind. (Restoring the checkpoint's tree as-is failed as 'unreadable'.)"""
    import logging

    mlm_run, mlm_state, _ = _objective_run("mlm")
    mlm_dir = _save_params_checkpoint(mlm_state, str(tmp_path / "mlm"), "mlm")
    nsp_run, nsp_state, _ = _objective_run("mlm_nsp")
    abstract = jax.eval_shape(lambda: nsp_state.params)
    with caplog.at_level(logging.INFO):
        params = train_loop._load_init_params(mlm_dir, nsp_run.model, abstract, jax.random.key(5))
    assert jax.tree.structure(params) == jax.tree.structure(nsp_state.params)
    for name in ("embeddings", "encoder"):
        jax.tree.map(
            np.testing.assert_array_equal, params["bert"][name], mlm_state.params["bert"][name]
        )
    jax.tree.map(np.testing.assert_array_equal, params["mlm"], mlm_state.params["mlm"])
    assert "has no 'nsp' weights" in caplog.text and "'bert/pooler'" in caplog.text

    nsp_dir = _save_params_checkpoint(nsp_state, str(tmp_path / "nsp"), "mlm_nsp")
    abstract = jax.eval_shape(lambda: mlm_state.params)
    params = train_loop._load_init_params(nsp_dir, mlm_run.model, abstract, jax.random.key(5))
    expected = {"bert": {k: v for k, v in nsp_state.params["bert"].items() if k != "pooler"},
                "mlm": nsp_state.params["mlm"]}  # fmt: skip
    jax.tree.map(np.testing.assert_array_equal, params, expected)


def _ltr_batch(batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """Synthetic single-segment instances, unmasked, with the input pipeline's next-token
    targets (P = T)."""
    import tensorflow as tf

    from data_pipelines.input_streams import next_token_targets

    batch = synth.random_batch(batch_size, seed)
    ids = batch["input_ids"].copy()  # put the masked tokens back
    rows = np.arange(batch_size)[:, None]
    ids[rows, batch["masked_lm_positions"]] = batch["masked_lm_ids"]
    unmasked = {
        "input_ids": ids,
        "input_mask": batch["input_mask"],
        "segment_ids": np.zeros_like(ids),
        "next_sentence_labels": np.zeros((batch_size, 1), np.int32),
    }
    features = next_token_targets({k: tf.constant(v) for k, v in unmasked.items()}, synth.SEQ_LEN)
    out = {k: v.numpy() for k, v in features.items()}
    out["next_sentence_labels"] = out["next_sentence_labels"][:, 0]
    return out


def test_the_ltr_loss_is_the_mean_next_token_cross_entropy():
    run, state, mesh = _objective_run(
        "ltr", dynamic_masking=True, max_predictions_per_seq=synth.SEQ_LEN
    )
    assert run.model_config.causal and not run.model.next_sentence
    assert set(state.params) == {"bert", "mlm"}
    batch = _ltr_batch(8, seed=1)
    metrics = run.eval_step(state.params, sharding.global_batch(batch, mesh))
    assert set(metrics) == {"loss", "mlm_loss", "mlm_accuracy"}
    # The logits of every position, and the mean next-token cross-entropy written out in
    # float64 numpy over every real position that has a real next token.
    every = np.broadcast_to(np.arange(synth.SEQ_LEN), batch["input_ids"].shape)
    inputs = [batch[k] for k in ("input_ids", "input_mask", "segment_ids")]
    logits = np.asarray(run.model.apply({"params": state.params}, *inputs, every).mlm_logits)
    logits = logits.astype(np.float64)  # (B, T, V)
    losses = []
    for row, n in enumerate(batch["input_mask"].sum(1)):
        ids = batch["input_ids"][row]
        for t in range(n - 1):
            log_z = np.log(np.exp(logits[row, t] - logits[row, t].max()).sum())
            losses.append(log_z + logits[row, t].max() - logits[row, t, ids[t + 1]])
    assert len(losses) == int(batch["input_mask"].sum()) - 8
    np.testing.assert_allclose(float(metrics["loss"]), np.mean(losses), rtol=1e-5)
    losses = _steps(run, state, mesh, batch)
    assert losses[-1] < losses[0], losses


def test_objective_combinations_that_cannot_work_name_their_keys():
    config = bert_tiny_cpu.get_config()
    config.objective = "nsp"
    with pytest.raises(ConfigError, match=r"config.objective must be one of .*got 'nsp'"):
        train.check_objective(config)
    config.objective = "ltr"
    with pytest.raises(ConfigError, match="set config.data.dynamic_masking=True"):
        train.check_objective(config)  # static (masked) records
    config.data.dynamic_masking = True
    with pytest.raises(ConfigError, match="max_predictions_per_seq must equal .* got 20"):
        train.check_objective(config)
    config.data.max_predictions_per_seq = config.data.max_seq_length
    train.check_objective(config)
    assert train.model_config(config).causal
    config.objective = "mlm_nsp"  # the default, and what a config without the key gets
    del config["objective"]
    assert train.objective(config) == "mlm_nsp" and not train.model_config(config).causal


def test_nsp_on_single_segment_records_is_refused_by_their_stats_json(tmp_path, caplog):
    config = bert_tiny_cpu.get_config()
    config.data.train_files = str(tmp_path / "train-*.tfrecord")
    (tmp_path / "train-0.tfrecord").write_bytes(b"")
    (tmp_path / "train-1.tfrecord").write_bytes(b"")
    train.check_records_kind(config)  # no stats JSON: nothing to go by
    stats = tmp_path / "train-0.tfrecord.stats.json"
    stats.write_text(json.dumps({"instances": 3}))  # older stats: sentence pairs
    train.check_records_kind(config)
    stats.write_text(json.dumps({"next_sentence": False}))
    with pytest.raises(
        ConfigError, match="train-0.tfrecord holds single segments .*objective='mlm'"
    ):
        train.check_records_kind(config)
    config.objective = "mlm"
    train.check_records_kind(config)
    stats.write_text(json.dumps({"next_sentence": True}))
    with caplog.at_level("WARNING"):
        train.check_records_kind(config)
    assert "config.objective='mlm' on sentence-pair records" in caplog.text
