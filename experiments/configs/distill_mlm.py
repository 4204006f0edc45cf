r"""DistilBERT-style MLM distillation of the polarity demo's BERT-tiny into one layer.

  python -m experiments.distill_mlm --config=experiments/configs/distill_mlm.py \
      --config.teacher=workdirs/demo_polarity/pretrain --workdir=workdirs/distill_mlm

The student keeps the teacher's width (H=128), so it starts from teacher layer 0 (as
DistilBERT starts from every other layer) and the cosine loss on hidden states applies.
The records are that demo's (`python -m experiments.demo --task=polarity
--workdir=workdirs/demo_polarity`: max_seq_length 64, 10 predictions).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.teacher = "workdirs/demo/pretrain"  # a checkpoint with an MLM head
    config.teacher_layers = "0"  # student layer i = teacher layer i-th entry ("" = preset)
    config.student_preset = "tiny"  # with teacher_layers="": from scratch, teacher's vocab

    config.train_files = "workdirs/demo/records/train-*.tfrecord"  # globs, comma-separated
    config.eval_files = "workdirs/demo/records/eval.tfrecord"  # "" skips the evaluation
    config.max_seq_length = 64  # T of the records
    config.max_predictions_per_seq = 10  # P of the records

    config.temperature = 2.0  # softens both MLM distributions; the KL is scaled by T^2
    config.alpha = 0.5  # soft (teacher) weight; 1 - alpha on the MLM labels
    config.cosine_weight = 1.0  # (1 - cos) of the last hidden states; 0 when widths differ

    config.global_batch_size = 32  # sequences per step over all devices
    config.num_train_steps = 500
    config.learning_rate = 5e-4  # peak, after warmup
    config.warmup_proportion = 0.1  # of all steps, linear from 0
    # "adamw": the original BERT AdamW (no bias correction); "adamw_bias_corrected":
    # Adam's bias correction, steadier for runs of a few hundred steps (Zhang et al. 2021).
    config.optimizer = "adamw"
    config.weight_decay = 0.01  # not on LayerNorm and biases
    config.seed = 0  # data order, dropout (and the init of a preset student)
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg", cheaper on TPU and GPU. The initialisation is threefry in all.
    config.prng_impl = "threefry2x32"
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor)
    config.log_every = 50  # steps between train_log.jsonl records
    config.eval_steps = 20  # held-out batches scored for teacher and student
    return config
