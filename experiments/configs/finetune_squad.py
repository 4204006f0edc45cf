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

from experiments.configs import finetune_base


def get_config(version: str = "v1.1") -> ml_collections.ConfigDict:
    if version not in ("v1.1", "v2.0"):
        raise ValueError(f"version must be v1.1 or v2.0, got {version!r}")
    config = finetune_base.get_config()
    config.version = version  # v2.0 adds unanswerable questions and the null threshold
    config.data_source = "json"  # "json" (official files) or "tfds"
    config.train_file = ""  # train-v1.1.json / train-v2.0.json (tfds: "train")
    config.predict_file = ""  # dev-v1.1.json / dev-v2.0.json (tfds: "validation")
    config.skip_mismatched = False  # skip (logged) answers whose offsets miss their text
    config.realign_mismatched = False  # move them (logged) to their text's nearest occurrence

    config.max_seq_length = 384  # pieces per window incl. the question: paragraphs are long
    config.doc_stride = 128  # pieces between window starts
    config.max_query_length = 64  # longer questions are cut (counted)
    config.n_best_size = 20  # candidate starts / ends / answers per question
    config.max_answer_length = 30  # pieces
    config.null_score_diff_threshold = 0.0  # v2.0: answer "" above this null-score margin
    config.num_epochs = 2  # the original README's SQuAD recipe (lr 3e-5, 2 epochs)
    config.learning_rate = 3e-5  # peak, after warmup: the original README's SQuAD rate
    return config
