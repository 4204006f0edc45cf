r"""Lee et al.'s 50-document similarity set: a zero-shot score of document embeddings.

Lee, Pincombe & Welsh (2005), "An empirical evaluation of models of text document
similarity" (CogSci 2005): 50 short news stories from the Australian Broadcasting
Corporation's news mail service, each of their 1,225 pairs rated for similarity by people.
People agree with each other at a correlation of about 0.6, and LSA reaches about as much
(gensim's own `test_lee.py` checks that its LSI model's Pearson correlation is > 0.6).

The files ship inside the gensim wheel (PyPI `gensim`, `gensim/test/test_data/`, the
folder `gensim.test.utils.datapath` points into), read here as plain text and never
unpickled:

* `lee.cor`: the 50 documents, one a line, Latin-1 (it holds a raw 0xA3 pound sign);
* `similarities0-1.txt`: a 50 x 50 tab-separated matrix, the mean human rating of each
  pair scaled to [0, 1] in its upper triangle (diagonal 1, lower triangle 0). The pairs
  are its upper triangle above the diagonal, in `numpy.triu_indices(50, 1)` order, as
  gensim's test takes them.

The folder is found from gensim's installed location without importing gensim (a slow
import; nothing of it runs here).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import numpy as np
import scipy.stats

from data_pipelines.tasks.formats import TaskDataError

NUM_DOCUMENTS = 50
DOCUMENTS_FILE = "lee.cor"
SIMILARITIES_FILE = "similarities0-1.txt"


@dataclasses.dataclass(frozen=True)
class LeeSet:
    documents: list[str]  # 50 documents, in the files' order
    pairs: np.ndarray  # (1225, 2) int: the document indices (i < j) of each rated pair
    human: np.ndarray  # (1225,) float: the mean human similarity of each pair, in [0, 1]


def gensim_data_dir() -> str:
    """gensim's `test/test_data` folder (what `gensim.test.utils.datapath('')` names)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise TaskDataError("the Lee similarity set ships in gensim: pip install gensim")
    return os.path.join(spec.submodule_search_locations[0], "test", "test_data")


def lee_similarity(data_dir: str | None = None) -> LeeSet:
    """The 50 documents and the human similarity of their 1,225 pairs (module docstring)."""
    data_dir = data_dir or gensim_data_dir()
    docs_path = os.path.join(data_dir, DOCUMENTS_FILE)
    sims_path = os.path.join(data_dir, SIMILARITIES_FILE)
    try:
        with open(docs_path, encoding="latin-1") as f:
            documents = [line.strip() for line in f if line.strip()]
        matrix = np.loadtxt(sims_path, dtype=np.float64)
    except (OSError, ValueError) as e:
        raise TaskDataError(f"the Lee similarity set in {data_dir}: {e}") from None
    if len(documents) != NUM_DOCUMENTS:
        raise TaskDataError(f"{docs_path}: {len(documents)} documents, expected {NUM_DOCUMENTS}")
    if matrix.shape != (NUM_DOCUMENTS, NUM_DOCUMENTS):
        raise TaskDataError(f"{sims_path}: a {matrix.shape} matrix, expected 50 x 50")
    rows, cols = np.triu_indices(NUM_DOCUMENTS, 1)
    return LeeSet(documents, np.stack([rows, cols], axis=1), matrix[rows, cols])


def lee_correlation(embeddings, lee: LeeSet | None = None) -> tuple[float, float]:
    """(Pearson, Spearman) of the embeddings' pairwise cosine similarities vs people's.

    Args:
        embeddings: (50, D), one row per document of `lee.documents`, in its order.
        lee: the set (read from gensim's files when not given).
    """
    lee = lee or lee_similarity()
    x = np.asarray(embeddings, dtype=np.float64)
    if x.shape[0] != len(lee.documents) or x.ndim != 2:
        raise ValueError(f"embeddings of shape {x.shape}: expected ({len(lee.documents)}, D)")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not np.all(norms > 0):
        raise ValueError("an embedding is all zeros: its cosine similarity is undefined")
    x = x / norms
    cosine = (x @ x.T)[lee.pairs[:, 0], lee.pairs[:, 1]]  # (1225,)
    pearson = scipy.stats.pearsonr(cosine, lee.human).statistic
    spearman = scipy.stats.spearmanr(cosine, lee.human).statistic
    return float(pearson), float(spearman)
