r"""A CPU-sized ModernBERT (`modernbert_tiny`: L4/H128/A2, GeGLU 192, rotary, pre-LN, no
biases, a 32-token window with every 2nd layer global) on `bert_tiny_cpu.py`'s Shakespeare
records, with `modernbert_base.py`'s objective and masking: masked LM alone, 30% of the
tokens masked in training, held-out metrics at 15%, packed rows.

The records are unmasked single segments (`make pretrain`'s corpus and vocab):

  python -m data_pipelines.create_pretraining_data \
      --input_file=workdirs/shakespeare/corpus.txt \
      --vocab_file=workdirs/shakespeare/vocab.txt --do_lower_case \
      --masking=dynamic --next_sentence=false \
      --output_file=workdirs/shakespeare/single/train.tfrecord --max_seq_length=128
  python -m experiments.pretrain --config=experiments/configs/modernbert_tiny_cpu.py \
      --workdir=workdirs/modernbert_tiny
"""

import ml_collections

from experiments.configs import bert_tiny_cpu


def get_config() -> ml_collections.ConfigDict:
    config = bert_tiny_cpu.get_config()
    config.objective = "mlm"  # ModernBERT trains masked LM alone (no NSP)
    config.model.preset = "modernbert_tiny"  # bert_jax.presets.MODERN_PRESETS
    data = config.data
    data.train_files = "workdirs/shakespeare/single/train*.tfrecord"  # globs, comma-separated
    data.eval_files = "workdirs/shakespeare/single/eval*.tfrecord"  # "" disables evaluation
    data.max_predictions_per_seq = 40  # P: >= 30% of T = 128
    data.dynamic_masking = True  # unmasked records, masked anew each epoch (as ModernBERT)
    data.masked_lm_prob = 0.30  # ModernBERT's and MosaicBERT's training rate (not BERT's 15%)
    data.eval_masked_lm_prob = 0.15  # held-out rate: BERT's, so runs at any rate compare
    data.pack = True  # several instances per row, kept apart: ModernBERT's unpadding
    return config
