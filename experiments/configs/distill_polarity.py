r"""Distils all-MiniLM-L6-v2 fine-tuned on sentence polarity into a BERT-tiny: `make distill`.

  # the teacher: any checkpoint experiments.finetune_classification writes
  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_minilm_polarity.py --config.num_epochs=1 \
      --workdir=workdirs/distill/teacher
  python -m experiments.distill_classification --config=experiments/configs/distill_polarity.py \
      --config.teacher=workdirs/distill/teacher --workdir=workdirs/distill/tiny

The student uses the teacher's uncased 30,522-piece vocabulary. `compare_without_teacher`
trains the same student again with alpha = 0 (plain fine-tuning, identical steps and
hyper-parameters): the baseline distillation has to beat. Soft labels carry the teacher's
confidence on every example, which a small student from scratch cannot learn from 8.5k
hard labels alone; so the students train longer than the teacher, at a larger rate.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from experiments.configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
    # The training recipe without init_from: the student comes from the teacher, a checkpoint
    # with its vocabulary or a preset (below).
    config = finetune_base.recipe()
    config.teacher = ""  # a fine-tuned checkpoint (<finetune workdir>/checkpoint or the workdir)
    config.task = "polarity"  # data_pipelines.tasks.sentence_tasks name; labels must match
    config.data_dir = ""  # "" = the cached vaderSentiment sdist (fetched with pip if missing)

    # The student: teacher_layers > student_init_from > student_preset (from scratch).
    config.student_preset = "tiny"  # bert_jax.presets.PRESETS name (tiny L2/H128, mini L4/H256)
    config.student_init_from = ""  # a pretraining checkpoint with the teacher's vocabulary
    config.teacher_layers = ""  # e.g. "0,2,4": the teacher's width with these of its layers
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the preset's

    config.temperature = 2.0  # softens both distributions; the KL is scaled by T^2
    config.alpha = 0.9  # weight of the soft (teacher) term; 1 - alpha on the hard labels
    config.teacher_logits = "precompute"  # "step": in the jitted step; "precompute": once
    config.compare_without_teacher = True  # also train the student with alpha = 0

    config.max_seq_length = 64  # the teacher's (finetune_minilm_polarity.py)
    config.num_epochs = 4  # soft labels from scratch take longer than the teacher (above)
    config.learning_rate = 2e-4  # a small student from scratch takes a larger rate (above)
    config.log_every = 20  # a small set, few steps per epoch: log more often

    config.benchmark = True  # measure inference sequences/s of teacher and student
    config.bench_batch_size = 64  # sequences per inference batch
    config.bench_repeats = 5  # timed passes each (the best is reported)
    return config
