r"""Distils a fine-tuned BERT classifier (the teacher) into a smaller student.

  python -m experiments.distill_classification \
      --config=experiments/configs/distill_polarity.py --workdir=workdirs/distill \
      --config.teacher=workdirs/distill/teacher/checkpoint [--config.student_preset=tiny ...]

The teacher is any checkpoint `experiments.finetune_classification` writes
(`<workdir>/checkpoint`, or that workdir). The student is a preset (`student_preset`,
initialised from scratch), a pretraining checkpoint with the teacher's vocabulary
(`student_init_from`), or the teacher's own layers (`teacher_layers`, e.g. "0,2,4": student
layer i is teacher layer teacher_layers[i], embeddings/pooler/classifier copied).
The student minimises alpha * T^2 * KL(teacher/T || student/T) + (1 - alpha) * CE(labels)
(`bert_jax.distill`), with the teacher's logits computed in the same jitted step
(`teacher_logits="step"`) or once before training (`"precompute"`, held in memory and
saved to `teacher_logits_train.npy`).

With `compare_without_teacher` the same student is trained again with alpha = 0 (plain
fine-tuning, same steps and hyper-parameters) as the baseline. Writes to --workdir:
`student/` and `no_teacher/` (metrics.json, train_log.jsonl, predictions, checkpoint/),
`results.json` and `results.md` (teacher vs students: accuracy, parameters, inference
sequences/s on this machine and the speed-up).
"""

from __future__ import annotations

import functools
import os
import time

import ml_collections
import numpy as np
from absl import flags, logging
from ml_collections import config_flags

from bert_jax.config import BertConfig
from data_pipelines import cli
from data_pipelines.tasks.classification_features import encode_sentences
from data_pipelines.tasks.sentence_tasks import load_sentence_task
from data_pipelines.tokenization import load_tokenizer
from experiments import finetune_classification as ftc
from experiments import finetune_main

# JAX, Optax and the models are imported where they are used: `-h` answers without them.


def teacher_dir(path: str) -> str:
    """The checkpoint directory of `path` (a fine-tuning workdir or its `checkpoint/`), as
    every tool finds it (`convert.locations.resolve`: a directory holding a model of its own
    besides a fine-tuned `checkpoint/` is refused, not guessed)."""
    from bert_jax.convert import locations

    if not path:
        raise ValueError("--config.teacher is required: a fine-tuned checkpoint directory")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--config.teacher={path}: no such directory")
    return locations.resolve(path)


def build_student(config, teacher_config: BertConfig, teacher_params, teacher_vocab, num_outputs):
    """(student module, its BertConfig, params, a one-line description of its init)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from bert_jax import distill
    from bert_jax import finetune_common as common
    from bert_jax.heads import BertForSequenceClassification

    head = BertForSequenceClassification(BertConfig(), num_outputs)
    overrides = {k: v for k, v in config.model_overrides.items() if v is not None}
    if config.teacher_layers:
        layers = [int(i) for i in str(config.teacher_layers).split(",")]
        bert_config, params = distill.layers_from_teacher(teacher_params, teacher_config, layers)
        bert_config = bert_config.replace(**overrides)
        return head.clone(config=bert_config), bert_config, params, f"teacher layers {layers}"
    if config.student_init_from:
        module, bert_config, params, vocab = common.load_model(
            head, config.student_init_from, rng=common.run_keys(config)[0], **overrides
        )
        flag = f"--config.student_init_from={config.student_init_from}"
        distill.check_same_vocab(teacher_vocab, teacher_config, vocab, bert_config, what=flag)
        return module, bert_config, params, f"encoder from {config.student_init_from}"
    bert_config = BertConfig.from_preset(
        config.student_preset, vocab_size=teacher_config.vocab_size,
        max_position_embeddings=teacher_config.max_position_embeddings,
        type_vocab_size=teacher_config.type_vocab_size, **overrides,
    )  # fmt: skip
    module = head.clone(config=bert_config)
    ids = jnp.zeros((1, 2), jnp.int32)
    init = jax.jit(lambda r: nn.unbox(module.init(r, ids, ids, ids)["params"]))
    params = init(common.run_keys(config)[0])
    return module, bert_config, params, f"{config.student_preset} preset from scratch"


def train_student(
    config, workdir: str, *, alpha: float, student_parts, teacher, teacher_params,
    features, task, mesh, teacher_train_logits, vocab_file, metadata,
) -> tuple[dict, dict]:  # fmt: skip
    """Trains one student (alpha = 0: without the teacher).

    Returns:
        (what its metrics.json holds, {split: (N, C) final logits}).
    """
    from bert_jax import distill, sharding
    from bert_jax import finetune_common as common

    start_time = time.time()
    os.makedirs(workdir, exist_ok=True)
    student, bert_config, params, description = student_parts
    train = features["train"]
    steps_per_epoch = common.steps_per_epoch(len(train), config.train_batch_size)
    num_steps = steps_per_epoch * config.num_epochs
    in_step = alpha > 0 and config.teacher_logits == "step"
    train_keys = [*distill.INPUT_KEYS, "labels"]
    if alpha > 0 and not in_step:
        train_keys.append("teacher_logits")
    state, step_fn, predict_fn = student_steps(
        config, student, params, mesh, num_steps, alpha=alpha, train_keys=train_keys,
        teacher=teacher if in_step else None,
        teacher_shardings=teacher_params[1] if in_step else None,
    )  # fmt: skip
    arrays = {"input_ids": train.input_ids, "input_mask": train.input_mask,
              "segment_ids": train.segment_ids, "labels": train.labels}  # fmt: skip
    if "teacher_logits" in train_keys:
        arrays["teacher_logits"] = teacher_train_logits
    results = {"alpha": alpha, "temperature": config.temperature, "student_init": description,
               "student_config": bert_config, "num_train_steps": num_steps,
               "params": distill.param_count(params), "epochs": []}  # fmt: skip
    final_logits = {}
    _, dropout_rng = common.run_keys(config)
    teacher_arg = teacher_params[0] if in_step else None
    with (
        sharding.activation_context(mesh),
        open(os.path.join(workdir, "train_log.jsonl"), "w", encoding="utf-8") as log_file,
    ):
        for epoch in range(1, config.num_epochs + 1):
            state, loss = common.train_epoch(
                step_fn, state, dropout_rng, arrays, epoch=epoch, config=config, mesh=mesh,
                log_file=log_file, step_args=(teacher_arg,),
                desc=f"alpha={alpha} epoch {epoch}/{config.num_epochs}",
            )  # fmt: skip
            result = {"epoch": epoch, "train_loss": loss}
            for split in task.eval_splits:
                logits = ftc.predict(predict_fn, state.params, features[split],
                                     config.eval_batch_size, mesh, f"eval {split}")  # fmt: skip
                result[split], _ = ftc.score(task, features[split].labels, logits)
            logging.info("alpha=%s epoch %d: %s", alpha, epoch, result)
            results["epochs"].append(result)
            common.write_json(os.path.join(workdir, "metrics.json"), results)
        for split in labeled_splits(task, features):
            logits = ftc.predict(predict_fn, state.params, features[split],
                                 config.eval_batch_size, mesh, f"predict {split}")  # fmt: skip
            metrics, predictions = ftc.score(task, features[split].labels, logits)
            final_logits[split] = logits
            results.setdefault("final", {})[split] = metrics
            ftc.write_predictions(os.path.join(workdir, f"predictions_{split}.tsv"), task,
                                  task.splits[split], logits, predictions)  # fmt: skip
    results["wall_time_s"] = time.time() - start_time
    common.save_finetuned(os.path.join(workdir, "checkpoint"), bert_config, state.params,
                          vocab_file=vocab_file, metadata=metadata)  # fmt: skip
    common.write_json(os.path.join(workdir, "metrics.json"), results)
    return results, final_logits


def student_steps(
    config, student, params, mesh, num_steps: int, *, alpha: float, train_keys: list[str],
    teacher=None, teacher_shardings=None,
):  # fmt: skip
    """(sharded state, jitted train step, jitted predict step) of one student.

    The train step is `(state, batch, rng, teacher params) -> (state, metrics)`: with a
    `teacher` its logits are computed in the step (its params sharded by
    `teacher_shardings`), without one the batch brings them (or alpha = 0 needs none).
    """
    import jax
    import jax.numpy as jnp

    from bert_jax import distill, sharding
    from bert_jax import finetune_common as common
    from bert_jax.train_state import make_step, sharded_state

    tx, schedule = common.make_optimizer(
        config.learning_rate, num_steps, warmup_proportion=config.warmup_proportion,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        name=config.optimizer,
    )  # fmt: skip
    sample = [jnp.zeros((1, config.max_seq_length), jnp.int32)] * 3
    state, shardings = sharded_state(student, tx, mesh, sample, params=params)

    batch_sharding = sharding.batch_sharding(mesh)
    loss = functools.partial(
        distill.classification_train_loss, student=student, teacher=teacher,
        temperature=config.temperature, alpha=alpha,
    )  # fmt: skip
    step_fn = jax.jit(
        make_step(loss, tx, schedule),
        in_shardings=(shardings, {k: batch_sharding for k in train_keys},
                      common.replicated(mesh), teacher_shardings),
        out_shardings=(shardings, common.replicated(mesh)),
        donate_argnums=0,
    )  # fmt: skip
    predict_fn = jax.jit(
        functools.partial(ftc.predict_step, model=student),
        in_shardings=(shardings.params, {k: batch_sharding for k in distill.INPUT_KEYS}),
        out_shardings=common.replicated(mesh),
    )
    return state, step_fn, predict_fn


def labeled_splits(task, features) -> list[str]:
    """The eval and test splits that have labels (GLUE test sets have none), in order."""
    splits = (*task.eval_splits, *task.test_splits)
    return [s for s in splits if features[s].labels is not None]


def teacher_logits_of(teacher, params, shardings, features, config, mesh, desc):
    import jax

    from bert_jax import distill, sharding
    from bert_jax import finetune_common as common

    predict_fn = jax.jit(
        functools.partial(ftc.predict_step, model=teacher),
        in_shardings=(shardings, {k: sharding.batch_sharding(mesh) for k in distill.INPUT_KEYS}),
        out_shardings=common.replicated(mesh),
    )
    with sharding.activation_context(mesh):
        return ftc.predict(predict_fn, params, features, config.eval_batch_size, mesh, desc)


def distill_classifier(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs the distillation described by `config`; returns what results.json holds."""
    from bert_jax import distill
    from bert_jax import finetune_common as common
    from experiments import inference_speed

    check_config(config)
    os.makedirs(workdir, exist_ok=True)
    path = teacher_dir(config.teacher)
    teacher, teacher_config, teacher_np, vocab_file, meta = ftc.load_classifier(path)
    task = load_task(config, path, meta)
    tokenizer = load_tokenizer(vocab_file, do_lower_case=meta.get("do_lower_case", True))
    features = {
        split: encode_sentences(
            examples, tokenizer, config.max_seq_length, task.labels, name=f"{task.name} {split}"
        )  # fmt: skip
        for split, examples in task.splits.items()
    }
    student_parts = build_student(config, teacher_config, teacher_np, vocab_file, len(task.labels))
    mesh = training_mesh(config, len(features["train"]))
    teacher_params, teacher_shardings = shard_teacher(teacher, teacher_np, config, mesh)
    del teacher_np

    results = {"task": config.task, "teacher_path": path, "teacher": {
        "params": distill.param_count(teacher_params), "config": teacher_config}}  # fmt: skip
    teacher_eval, train_logits = score_teacher(
        config, workdir, teacher, teacher_params, teacher_shardings, task, features, mesh,
        results["teacher"],
    )  # fmt: skip

    student_meta = {**meta, "task": config.task, "data_dir": config.data_dir,
                    "max_seq_length": config.max_seq_length, "distilled_from": path}  # fmt: skip
    runs = {"student": config.alpha}
    if config.compare_without_teacher:
        runs["no_teacher"] = 0.0
    for name, alpha in runs.items():
        run, logits = train_student(
            config, os.path.join(workdir, name), alpha=alpha, student_parts=student_parts,
            teacher=teacher, teacher_params=(teacher_params, teacher_shardings),
            features=features, task=task, mesh=mesh, teacher_train_logits=train_logits,
            vocab_file=vocab_file, metadata=student_meta,
        )  # fmt: skip
        results[name] = {k: run[k] for k in ("alpha", "params", "final", "epochs", "student_init",
                                              "wall_time_s")}  # fmt: skip
        results[name]["teacher_agreement"] = {
            split: float(np.mean(logits[split].argmax(-1) == teacher_eval[split].argmax(-1)))
            for split in logits
        }

    if config.benchmark:
        student_dir = os.path.join(workdir, "student", "checkpoint")
        results["inference"] = inference_speed.compare(
            path, student_dir, batch_size=config.bench_batch_size,
            seq_length=config.max_seq_length, repeats=config.bench_repeats,
        )  # fmt: skip
    common.write_json(os.path.join(workdir, "results.json"), results)
    splits = labeled_splits(task, features)
    write_report(os.path.join(workdir, "results.md"), results, splits[0], splits[-1])
    return results


def check_config(config: ml_collections.ConfigDict) -> None:
    """Refuses an alpha, temperature or teacher_logits setting out of its range."""
    if not 0.0 <= config.alpha <= 1.0:
        raise ValueError(f"--config.alpha={config.alpha} must be in [0, 1]")
    if config.temperature <= 0:
        raise ValueError(f"--config.temperature={config.temperature} must be positive")
    if config.teacher_logits not in ("step", "precompute"):
        raise ValueError(
            f"--config.teacher_logits={config.teacher_logits!r}: 'step' or 'precompute'"
        )


def load_task(config: ml_collections.ConfigDict, teacher_path: str, meta: dict):
    """The config's task, checked against the teacher's labels (`meta`, from
    `load_classifier`), its training split cut to `max_train_examples`."""
    if meta.get("labels") is None:
        raise ValueError(f"{teacher_path}: a regression teacher ({meta.get('task')}); "
                         "distillation here needs class logits")  # fmt: skip
    task = load_sentence_task(config.task, config.data_dir or None)
    if list(task.labels or ()) != list(meta["labels"]):
        raise ValueError(f"{teacher_path} was fine-tuned on labels {meta['labels']}, task "
                         f"{config.task} has {task.labels} (--config.task)")  # fmt: skip
    if config.max_train_examples:
        task.splits["train"] = task.splits["train"][: config.max_train_examples]
    return task


def training_mesh(config: ml_collections.ConfigDict, num_train: int):
    """The config's mesh, refusing batch sizes it cannot split or `num_train` can't fill."""
    from bert_jax import finetune_common as common
    from bert_jax import sharding

    mesh = sharding.create_mesh(config.mesh_shape)
    common.check_batch_size(config.train_batch_size, mesh, "train_batch_size")
    common.check_batch_size(config.eval_batch_size, mesh, "eval_batch_size")
    if common.steps_per_epoch(num_train, config.train_batch_size) == 0:
        raise ValueError(f"{num_train} training examples < train_batch_size")
    return mesh


def shard_teacher(teacher, params, config: ml_collections.ConfigDict, mesh):
    """(teacher params, their shardings): placed as a fine-tuned model of its size would be;
    they are never updated."""
    import jax.numpy as jnp
    import optax

    from bert_jax.train_state import sharded_state

    sample = [jnp.zeros((1, config.max_seq_length), jnp.int32)] * 3
    frozen, frozen_shardings = sharded_state(teacher, optax.identity(), mesh, sample, params=params)
    return frozen.params, frozen_shardings.params


def score_teacher(
    config, workdir, teacher, params, shardings, task, features, mesh, scores: dict
) -> tuple[dict, np.ndarray | None]:
    """The teacher's logits of every labeled split, scored into `scores`, and, with
    `teacher_logits="precompute"`, of the train split (saved as teacher_logits_train.npy).

    Returns:
        ({split: (N, C) logits}, (N, C) train logits or None).
    """
    teacher_eval = {}
    for split in labeled_splits(task, features):
        logits = teacher_logits_of(teacher, params, shardings, features[split], config, mesh,
                                   f"teacher {split}")  # fmt: skip
        teacher_eval[split] = logits
        scores[split], _ = ftc.score(task, features[split].labels, logits)
    logging.info("teacher: %s", scores)
    train_logits = None
    if config.teacher_logits == "precompute":
        train_logits = teacher_logits_of(
            teacher, params, shardings, features["train"], config, mesh, "teacher train"
        )
        np.save(os.path.join(workdir, "teacher_logits_train.npy"), train_logits)
    return teacher_eval, train_logits


def write_report(path: str, results: dict, dev: str, split: str) -> None:
    """The teacher / distilled / no-teacher table as Markdown (`dev`, `split`: columns)."""
    speed = results.get("inference", {})
    rows = [("teacher", results["teacher"], results["teacher"]["params"], "teacher")]
    for name in ("student", "no_teacher"):
        if name in results:
            rows.append((name, results[name]["final"], results[name]["params"], "student"))
    lines = [
        f"| model | {dev} accuracy | {split} accuracy | parameters | inference seq/s | speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, scores, count, kind in rows:
        rate = speed.get(f"{kind}_seq_per_s")
        up = rate / speed["teacher_seq_per_s"] if rate else None
        label = {"teacher": "teacher", "no_teacher": "no teacher (alpha=0)",
                 "student": f"distilled (alpha={results['student']['alpha']})"}[name]  # fmt: skip
        lines.append(
            f"| {label} | {scores[dev]['accuracy']:.1%} | {scores[split]['accuracy']:.1%} | "
            f"{count / 1e6:.2f}M | {f'{rate:.0f}' if rate else '-'} | "
            f"{f'{up:.1f}x' if up else '-'} |"
        )
    notes = [
        f"\nStudent init: {results['student']['student_init']}. Teacher: {results['teacher_path']}."
    ]
    if "no_teacher" in results:
        gain = (results["student"]["final"][split]["accuracy"]
                - results["no_teacher"]["final"][split]["accuracy"])  # fmt: skip
        notes.append(f"Distillation vs no teacher on {split}: {gain * 100:+.1f} points.")
    gap = results["teacher"][split]["accuracy"] - results["student"]["final"][split]["accuracy"]
    notes.append(f"Gap to the teacher on {split}: {gap * 100:.1f} points.")
    if speed:
        notes.append(speed.get("note", ""))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n" + "\n".join(notes) + "\n")
    os.replace(tmp, path)


main = finetune_main.make_main(distill_classifier, "distill_classification", saves_model=True)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Distillation config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Where students, results.json and results.md go.")
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
