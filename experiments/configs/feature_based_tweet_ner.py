r"""Feature-based NER (BERT paper, Table 7): frozen all-MiniLM-L6-v2 features of English
tweets -> a fresh two-layer BiLSTM -> tags.

  python -m experiments.feature_based_tagging \
      --config=experiments/configs/feature_based_tweet_ner.py --config.layers=last \
      --workdir=workdirs/features_tweet_ner_last

The task is fine-tuning's (experiments/configs/finetune_minilm_tweet_ner.py: 1,594 train /
400 dev / 400 test tweets, 10 entity types, BIO). The paper's BiLSTM has 768 units per
direction over BERT-Base's 768-wide states; this one has 256 over MiniLM's 384 (2.9M tagger
params), cheap enough for a CPU. Nothing of the encoder is trained, so the BiLSTM takes
Adam's usual 1e-3 (fine-tuning's 1e-4 adjusts a pretrained model; this one starts from
random). The cached features are float32 over the 73,773 word pieces of the three splits:
108 MiB for one layer, 432 MiB for `concat_last_4`, 756 MiB for `scalar_mix` (all 7).
"""

import ml_collections

from experiments.configs import finetune_base
from experiments.configs.finetune_minilm_polarity import minilm_dir


def get_config() -> ml_collections.ConfigDict:
    # Fine-tuning's task and encoder; from_scratch=True: a random frozen encoder (what the
    # BiLSTM does alone); eval_batch_size is also the encoder's batch for the features.
    config = finetune_base.tagging("tweet_ner")  # do_lower_case: MiniLM is uncased
    config.init_from = minilm_dir()  # the real weights, installed with pip
    config.model_overrides = ml_collections.ConfigDict()  # none: the encoder runs without dropout

    # Which hidden states the BiLSTM reads (bert_jax.feature_based.COMBINATIONS): embeddings,
    # last, second_to_last, sum_last_4, concat_last_4, sum_all, scalar_mix.
    config.layers = "last"
    config.lstm_size = 256  # units per direction of each of the two BiLSTM layers
    config.dropout_rate = 0.2  # on each BiLSTM's input and on the tag layer's

    config.num_epochs = 20  # as fine-tuning's, on the same task
    config.learning_rate = 1e-3  # peak, after warmup: a BiLSTM trained from scratch
    config.weight_decay = 0.0  # none: the scalar mix's logits would be pulled to uniform
    config.log_every = 10  # a small set, few steps per epoch: log more often
    return config
