"""Checkpoint sources named by relative paths (how users type them on the command line)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from finetune_fixtures import pretrained_params, write_train_state

from bert_jax.convert import readers


@pytest.fixture()
def inside(tmp_path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(cwd)


def test_a_relative_pretraining_workdir_reads_like_an_absolute_one(inside):
    params = pretrained_params()
    write_train_state(inside / "run", params)
    # Orbax reads no metadata from a relative directory; the reader must not pass one on.
    relative = readers.open_source("run")
    absolute = readers.open_source(str(inside / "run"))
    assert relative.config == absolute.config
    assert relative.shapes == absolute.shapes and relative.shapes
    for name in relative.shapes:
        np.testing.assert_array_equal(relative.read(name), absolute.read(name))
    table = next(n for n in relative.shapes if "word_embeddings" in n)
    expected = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(relative.read(table), expected)
