"""Suite-wide settings: XLA compiles the tests' programs for compile time, not run time.

The suite's programs are tiny (BERT-tiny steps on batches of 8), compiled hundreds of times
and each run for a few steps: most of a test's CPU goes to XLA's CPU backend (LLVM), little
to running what it built. Backend optimisation level 0 without LLVM's expensive passes
made test_train + test_weight_update_sharding 1.33x faster (242 s -> 181 s, same run);
XLA's HLO passes are the same, only LLVM's code generation is cheaper (test_multihost
already ran at level 0).

Set at import, before any test module imports JAX (pytest imports conftest.py first), and
inherited by the `python -m ...` runs the end-to-end tests start with the suite's
environment; a test that sets its own XLA_FLAGS for a subprocess keeps them.
"""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
