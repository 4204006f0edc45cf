"""Static and dynamic masking behind one call, for tests that check both modes.

Both modes follow `data_pipelines.masking_rules`; they differ in where the random draws come
from: static masking (`numpy_masking`, at record creation) from numpy's PCG64 stream
`masking_rng(*stream)`, dynamic masking (`masking`, in tf.data) from TensorFlow's stateless
Philox seeded by `example_seed(*stream)`.
"""

from __future__ import annotations

import numpy as np

from data_pipelines import masking, numpy_masking

MODES = ("static", "dynamic")


def mask_batch(
    mode: str, stream: tuple[int, ...], input_ids, word_starts, special_ids, lengths, **kwargs
) -> dict[str, np.ndarray]:
    """`mask_batch` of `mode` on a (B, T) batch with `lengths` real tokens per row, as numpy."""
    if mode == "static":
        rng = numpy_masking.masking_rng(*stream)
        return numpy_masking.mask_batch(
            np.asarray(input_ids), word_starts, special_ids, np.asarray(lengths), rng, **kwargs
        )
    assert mode == "dynamic", mode
    seed = masking.example_seed(*stream)
    out = masking.mask_batch(input_ids, word_starts, special_ids, seed, lengths=lengths, **kwargs)
    return {key: value.numpy() for key, value in out.items()}
