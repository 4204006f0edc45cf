"""benchmarks.studies.collectives: each pair of micro programs it compiles for TPU slices
computes the same values (on 8 CPU devices), so their estimates compare two ways of one
computation."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from benchmarks.studies import collectives


@pytest.fixture(scope="module")
def programs():
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("data",))
    return collectives.micro_programs(mesh, length=4, d=16, f=64)


def _run(fn, args, seed):
    rng = np.random.default_rng(seed)
    values = [
        jax.device_put(rng.standard_normal(a.shape).astype(a.dtype), a.sharding) for a in args
    ]
    return jax.jit(fn)(*values)


# The gradient sums are f32 sums of the same products in another order; the gathers give the
# same bf16 kernel to a bf16 matmul (its output rounded to bf16: 2**-8 relative).
@pytest.mark.parametrize("what, rtol", [("gradient sum", 1e-5), ("bf16 gather", 2**-8)])
def test_the_explicit_program_computes_what_the_constraint_one_does(programs, what, rtol):
    pairs = [(name, p) for name, p in programs.items() if name.startswith(what)]
    assert len(pairs) == 2
    (_, (by_constraint, args)), (_, (explicit, explicit_args)) = pairs
    assert [a.shape for a in args] == [a.shape for a in explicit_args]
    want, got = _run(by_constraint, args, 0), _run(explicit, explicit_args, 0)
    assert got.shape == want.shape and got.sharding.is_equivalent_to(want.sharding, got.ndim)
    assert np.abs(np.asarray(want, np.float32)).max() > 0
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=rtol)
