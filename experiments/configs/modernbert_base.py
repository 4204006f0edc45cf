r"""ModernBERT-base (Warner et al. 2024: L22/H768/A12, GeGLU 1152, rotary, pre-LN, no biases,
128-token local attention with every 3rd layer global) pretrained by masked LM alone.

The paper's first phase: sequences of 1,024 tokens, packed (its unpadding), 30% of the
tokens masked; held-out metrics at BERT's 15% (`data.eval_masked_lm_prob`), so that runs
training at either rate compare. The recipe is `bert_base.py`'s pipeline with the
ModernBERT model and the paper's rate, length, batch and learning rate; its StableAdamW
and trapezoidal schedule are not ours (AdamW with bias correction, linear decay).

Data: unmasked single-segment records (masking in tf.data, at this config's rate):

  python -m data_pipelines.create_pretraining_data --input_file=CORPUS \
      --vocab_file=workdirs/modern/vocab.txt --masking=dynamic --next_sentence=false \
      --output_file=workdirs/modern/seq1024/train.tfrecord --max_seq_length=1024

Launch:

  python -m experiments.pretrain --config=experiments/configs/modernbert_base.py \
      --workdir=workdirs/modernbert_base
"""

import ml_collections
from ml_collections.config_dict import placeholder

from experiments.configs import bert_base

SEQ_LEN = 1_024  # the paper's phase-1 length (context extension to 8,192 follows)
# 1.7T tokens (the paper's phase 1) at 4,608 x 1,024 tokens per step.
NUM_TRAIN_STEPS = 360_000


PAPER_WEIGHT_DECAY = 1e-5  # the fraction of a weight decayed per step at the peak rate


def decay_for(peak_learning_rate: float) -> float:
    """weight_decay for an optimizer that multiplies it by the rate (adamw_bias_corrected),
    giving the paper's PAPER_WEIGHT_DECAY per step at `peak_learning_rate`."""
    return PAPER_WEIGHT_DECAY / peak_learning_rate


def get_config() -> ml_collections.ConfigDict:
    config = bert_base.get_config("phase1")
    config.objective = "mlm"  # ModernBERT trains masked LM alone (no NSP)
    config.model.preset = "modernbert_base"  # bert_jax.presets.MODERN_PRESETS
    config.model.vocab_size = placeholder(int)  # None: the vocab file's (your corpus's vocab)
    config.model.hidden_act = "gelu"  # exact GELU, ModernBERT's

    data = config.data
    data_dir = config.get_ref("data_dir")
    config.data_dir = "workdirs/modern"
    data.train_files = data_dir + f"/seq{SEQ_LEN}/train-*.tfrecord"  # globs, comma-separated
    data.eval_files = data_dir + f"/seq{SEQ_LEN}/eval-*.tfrecord"  # "" disables evaluation
    data.do_lower_case = False  # ModernBERT is cased
    data.max_seq_length = SEQ_LEN  # T of the records
    data.max_predictions_per_seq = 320  # P: >= 30% of T, a multiple of 64
    data.dynamic_masking = True  # unmasked records, masked anew each epoch (as ModernBERT)
    data.masked_lm_prob = 0.30  # ModernBERT's and MosaicBERT's training rate (not BERT's 15%)
    data.eval_masked_lm_prob = 0.15  # held-out rate: BERT's, so runs at any rate compare
    data.pack = True  # several instances per row, kept apart: ModernBERT's unpadding
    data.max_instances_per_row = 8  # instance slots of a packed row

    config.global_batch_size = 4_608  # sequences per step: the paper's (after its ramp)
    config.num_train_steps = NUM_TRAIN_STEPS  # length of the learning-rate schedule
    config.stop_at_step = placeholder(int)  # None: num_train_steps
    config.start_step = 0  # one phase here
    config.resume_from = ""  # a checkpoints dir with a full state

    opt = config.optimizer
    opt.name = "adamw_bias_corrected"  # torch's AdamW (the paper: StableAdamW)
    opt.learning_rate = 8e-4  # the paper's base peak rate
    opt.warmup_steps = 640  # the paper's 3B warmup tokens at 4.7M tokens per step
    # The paper's decay is 1e-5 of a weight per step at the peak rate (decoupled from the
    # rate); this AdamW multiplies weight_decay by the rate, hence 1e-5 / 8e-4 = 0.0125.
    opt.weight_decay = decay_for(opt.learning_rate)
    opt.b2 = 0.98  # the paper's
    return config
