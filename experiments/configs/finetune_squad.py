r"""SQuAD v1.1 or v2.0 with the original README's recipe (lr 3e-5, 2 epochs, seq 384).

  python -m experiments.finetune_squad --config=experiments/configs/finetune_squad.py:v1.1 \
      --config.train_file=squad/train-v1.1.json --config.predict_file=squad/dev-v1.1.json \
      --config.init_from=uncased_L-12_H-768_A-12 --workdir=workdirs/squad11

  python -m experiments.finetune_squad --config=experiments/configs/finetune_squad.py:v2.0 \
      --config.train_file=squad/train-v2.0.json --config.predict_file=squad/dev-v2.0.json \
      --config.init_from=... --config.null_score_diff_threshold=-1.0 --workdir=workdirs/squad20

With `--config.data_source=tfds`, train_file / predict_file are TFDS split names
("train", "validation") of a prepared `squad/<version>`. For v2.0, metrics.json reports
`best_f1_thresh`: rerun prediction with that threshold, as the original README suggests.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config(version: str = "v1.1") -> ml_collections.ConfigDict:
    if version not in ("v1.1", "v2.0"):
        raise ValueError(f"version must be v1.1 or v2.0, got {version!r}")
    config = ml_collections.ConfigDict()
    config.version = version  # v2.0 adds unanswerable questions and the null threshold
    config.data_source = "json"  # "json" (official files) or "tfds"
    config.train_file = ""  # train-v1.1.json / train-v2.0.json (tfds: "train")
    config.predict_file = ""  # dev-v1.1.json / dev-v2.0.json (tfds: "validation")
    config.skip_mismatched = False  # skip (logged) answers whose offsets miss their text
    config.realign_mismatched = False  # move them (logged) to their text's nearest occurrence

    config.init_from = ""  # HF dir, TF checkpoint, Orbax params or pretraining workdir
    config.bert_config_file = ""  # replaces the config found beside init_from
    config.vocab_file = ""  # "" = the vocab.txt beside init_from
    config.do_lower_case = True  # False for cased checkpoints
    config.from_scratch = False  # True: random weights in the same architecture (baseline)
    config.model_overrides = ml_collections.ConfigDict()
    config.model_overrides.hidden_dropout_prob = placeholder(float)  # None: the checkpoint's

    config.max_seq_length = 384  # pieces per window incl. the question
    config.doc_stride = 128  # pieces between window starts
    config.max_query_length = 64  # longer questions are cut (counted)
    config.n_best_size = 20  # candidate starts / ends / answers per question
    config.max_answer_length = 30  # pieces
    config.null_score_diff_threshold = 0.0  # v2.0: answer "" above this null-score margin
    config.max_train_examples = placeholder(int)  # None: all
    config.train_batch_size = 32  # global
    config.eval_batch_size = 64  # global
    config.num_epochs = 2
    config.learning_rate = 3e-5  # peak, after warmup
    config.warmup_proportion = 0.1  # of all train steps, linear from 0
    # "adamw": the original BERT AdamW (no bias correction); "adamw_bias_corrected":
    # Adam's bias correction, steadier for runs of a few hundred steps (Zhang et al. 2021).
    config.optimizer = "adamw"
    config.weight_decay = 0.01  # not on LayerNorm and biases
    config.max_grad_norm = 1.0  # global-norm clipping
    config.seed = 0  # head init, data order, dropout
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg", cheaper on TPU and GPU. The initialisation is threefry in all.
    config.prng_impl = "threefry2x32"
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): data parallel over all devices
    config.log_every = 50  # steps between train_log.jsonl records
    return config
