"""Side-by-side measurements against peers (not part of `make test`).

A regular package on purpose: pysbd installs a stray top-level `benchmarks` package into
site-packages, which would otherwise shadow this directory.
"""
