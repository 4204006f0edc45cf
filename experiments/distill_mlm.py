r"""Masked-LM distillation (DistilBERT-style): a pretrained teacher's MLM distribution
trains a smaller student at the masked positions of pretraining records.

  python -m experiments.distill_mlm --config=experiments/configs/distill_mlm.py \
      --config.teacher=workdirs/demo/pretrain --workdir=workdirs/distill_mlm

The teacher is any checkpoint with an MLM head that `bert_jax.convert.load_pretrained`
reads (a pretraining workdir of this project, a Google TF or HF BertForPreTraining
checkpoint). The student takes the teacher's layers `teacher_layers` (DistilBERT: every
other layer, same width) or is a preset from scratch with the teacher's vocabulary. Its loss
is alpha * T^2 * KL(teacher || student) + (1 - alpha) * MLM cross-entropy over the masked
positions, plus `cosine_weight` * (1 - cos) between the last hidden states when the widths
match (`bert_jax.distill.mlm_train_loss`). NSP is not trained, as in DistilBERT.

Writes to --workdir: `train_log.jsonl`, `metrics.json` (held-out MLM loss/accuracy of the
teacher and the student, parameter counts) and `student/`, a params-only checkpoint
(`config.json`, `vocab.txt`) that fine-tuning takes as `init_from`.
"""

from __future__ import annotations

import functools
import json
import os
import time

import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags
from tqdm import tqdm

from bert_jax import config_bounds
from bert_jax.config import BertConfig
from data_pipelines import cli, records

# JAX, TensorFlow and the models are imported where they are used: `-h` answers without them.

# The batch features the student and teacher see: NSP is not trained, so not its labels.
BATCH_KEYS = tuple(k for k in records.BATCH if k != "next_sentence_labels")


def load_teacher(path: str) -> tuple[BertConfig, dict, str | None]:
    """(config, params, vocab file) of a teacher that has a trained MLM head."""
    from bert_jax import convert
    from bert_jax.convert.names import HEAD_SPECS

    if not path:
        raise ValueError("--config.teacher is required: a checkpoint with an MLM head")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--config.teacher={path}: no such file or directory")
    source = convert.open_source(path)
    if not all(source.has(spec) for spec in HEAD_SPECS["mlm"]):
        raise ValueError(f"--config.teacher={path} has no MLM head to distil from")
    config, params, vocab_file = convert.load_pretrained(path, model="pretraining")
    return config.replace(scan_layers=False), params, vocab_file


def build_student(config, teacher_config: BertConfig, teacher_params) -> tuple:
    """(BertConfig, params, description) of the student."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from bert_jax import distill
    from bert_jax import finetune_common as common
    from bert_jax.heads import BertForPreTraining

    if config.teacher_layers:
        layers = [int(i) for i in str(config.teacher_layers).split(",")]
        student_config, params = distill.layers_from_teacher(teacher_params, teacher_config, layers)
        return student_config, params, f"teacher layers {layers}"
    student_config = BertConfig.from_preset(
        config.student_preset, vocab_size=teacher_config.vocab_size,
        max_position_embeddings=teacher_config.max_position_embeddings,
    )  # fmt: skip
    model = BertForPreTraining(student_config)
    ids = jnp.zeros((1, 2), jnp.int32)
    params = jax.jit(lambda r: nn.unbox(model.init(r, ids, ids, ids, ids)["params"]))(
        common.run_keys(config)[0]
    )
    return student_config, params, f"{config.student_preset} preset from scratch"


def evaluate(model, params, config, mesh, shardings) -> dict[str, float]:
    """Held-out MLM loss and accuracy over `eval_steps` batches of `eval_files`."""
    import jax

    from bert_jax import sharding, train
    from bert_jax.losses import weighted_cross_entropy
    from data_pipelines import input_pipeline

    data = input_pipeline.make_pretraining_dataset(
        config.eval_files, global_batch_size=config.global_batch_size,
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq, seed=0,
    )  # fmt: skip

    def step(params, batch):
        out = model.apply({"params": params}, *train.init_inputs(batch))
        return weighted_cross_entropy(
            out.mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"]
        )

    batch_sharding = sharding.batch_sharding(mesh)
    step = jax.jit(step, in_shardings=(shardings, {k: batch_sharding for k in BATCH_KEYS}))
    losses, accuracies = [], []
    for _, batch in zip(range(config.eval_steps), data, strict=False):
        batch = sharding.global_batch({k: batch[k] for k in BATCH_KEYS}, mesh)
        loss, accuracy = step(params, batch)
        losses.append(float(loss))
        accuracies.append(float(accuracy))
    return {"mlm_loss": float(np.mean(losses)), "mlm_accuracy": float(np.mean(accuracies))}


def distill_mlm(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs the MLM distillation described by `config`; returns what metrics.json holds."""
    import jax
    import optax

    from bert_jax import convert, distill, sharding, train
    from bert_jax import finetune_common as common
    from bert_jax.heads import BertForPreTraining
    from bert_jax.train_state import make_step, sharded_state
    from data_pipelines import input_pipeline

    start_time = time.time()
    if not 0.0 <= config.alpha <= 1.0:
        raise ValueError(f"--config.alpha={config.alpha} must be in [0, 1]")
    os.makedirs(workdir, exist_ok=True)
    teacher_config, teacher_np, vocab_file = load_teacher(config.teacher)
    student_config, params, description = build_student(config, teacher_config, teacher_np)
    if config.cosine_weight and student_config.hidden_size != teacher_config.hidden_size:
        raise ValueError(
            f"--config.cosine_weight={config.cosine_weight} needs equal widths: student "
            f"H={student_config.hidden_size}, teacher H={teacher_config.hidden_size}"
        )
    teacher, student = BertForPreTraining(teacher_config), BertForPreTraining(student_config)

    mesh = sharding.create_mesh(config.mesh_shape)
    common.check_batch_size(config.global_batch_size, mesh, "global_batch_size")
    t, p = config.max_seq_length, config.max_predictions_per_seq
    sample = train.init_inputs(train.example_batch(1, t, p))
    # Sharded as a trained model of its size would be; it is never updated.
    frozen, frozen_shardings = sharded_state(
        teacher, optax.identity(), mesh, sample, params=teacher_np
    )
    teacher_params, teacher_shardings = frozen.params, frozen_shardings.params
    tx, schedule = common.make_optimizer(
        config.learning_rate, config.num_train_steps,
        warmup_proportion=config.warmup_proportion, weight_decay=config.weight_decay,
        name=config.optimizer,
    )  # fmt: skip
    state, shardings = sharded_state(student, tx, mesh, sample, params=params)
    batch_sharding = sharding.batch_sharding(mesh)
    loss = functools.partial(
        distill.mlm_train_loss, student=student, teacher=teacher,
        temperature=config.temperature, alpha=config.alpha, cosine_weight=config.cosine_weight,
    )  # fmt: skip
    step_fn = jax.jit(
        make_step(loss, tx, schedule),
        in_shardings=(shardings, {k: batch_sharding for k in BATCH_KEYS},
                      common.replicated(mesh), teacher_shardings),
        out_shardings=(shardings, common.replicated(mesh)),
        donate_argnums=0,
    )  # fmt: skip
    data = input_pipeline.make_pretraining_dataset(
        config.train_files, global_batch_size=config.global_batch_size, max_seq_length=t,
        max_predictions_per_seq=p, seed=config.seed,
    )  # fmt: skip
    results = {"teacher": config.teacher, "student_init": description,
               "teacher_params": distill.param_count(teacher_params),
               "student_params": distill.param_count(params),
               "student_config": student_config}  # fmt: skip
    del params, teacher_np, frozen
    _, dropout_rng = common.run_keys(config)
    pending = []
    with (
        sharding.activation_context(mesh),
        open(os.path.join(workdir, "train_log.jsonl"), "w", encoding="utf-8") as log_file,
    ):
        progress = tqdm(zip(range(config.num_train_steps), data, strict=False),
                        total=config.num_train_steps, desc="distil MLM")  # fmt: skip
        for _, batch in progress:
            batch = sharding.global_batch({k: batch[k] for k in BATCH_KEYS}, mesh)
            state, metrics = step_fn(state, batch, dropout_rng, teacher_params)
            pending.append(metrics)
            step = int(state.step)
            if step % config.log_every == 0 or step == config.num_train_steps:
                window = common.fetch_finite(pending, step - len(pending) + 1)
                pending = []
                record = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
                log_file.write(json.dumps({"step": step, **record}) + "\n")
                log_file.flush()
                progress.set_postfix(loss=f"{record['loss']:.3f}")
        if config.eval_files:
            results["eval_teacher"] = evaluate(teacher, teacher_params, config, mesh,
                                               teacher_shardings)  # fmt: skip
            results["eval_student"] = evaluate(student, state.params, config, mesh,
                                               shardings.params)  # fmt: skip
    convert.save_params(os.path.join(workdir, "student"), student_config, state.params,
                        vocab_file=vocab_file, overwrite=True)  # fmt: skip
    results["wall_time_s"] = time.time() - start_time
    common.write_json(os.path.join(workdir, "metrics.json"), results)
    logging.info("final: %s", results)
    return results


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    # Every key in its range, the batches over the devices: one line, before any data is read.
    config_bounds.check_or_exit(
        flags.FLAGS.config, "finetune", "distill_mlm", devices=jax.device_count()
    )
    distill_mlm(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "MLM distillation config.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where the student and metrics.json go.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
