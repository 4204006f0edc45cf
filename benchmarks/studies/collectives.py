r"""How the TPU compiler lowers the sharded weight update's two collectives, by its estimate.

The sharded update (`config.shard_weight_update`) gathers the weights for the passes and sums
the gradients into the shards. Written as sharding constraints (`train_state.gather_params`,
`make_step`), the partitioner chooses the collectives; written out with `jax.shard_map`
(`all_gather`, `psum_scatter`), the program says which. Both are compiled here for TPU slices
on this CPU (needs libtpu; nothing is allocated):

`--what=micro`: one BERT-Large feed-forward kernel (1024 x 4096, f32, split over every core
along its 4096 columns), 2 sequences of 128 per core: (a) its gradient `x^T dy` summed into
the shards, by constraint and by `psum_scatter`; (b) the kernel gathered in bf16 for `x @ W`,
by constraint on the bf16 cast and by `all_gather` of the cast shards. Per topology: the
compiler's time (`optimal_seconds`) and the collectives of the compiled program.

`--what=step`: a config's train step (unrolled; `--layers` cuts the encoder for a faster
compile) with the weights gathered as stored, f32, by the constraint, and with
`config.shard_weight_update_explicit_gather` (matmul kernels cast to the compute dtype on
their shards and all-gathered explicitly, `train_state.gather_params`).

  python -m benchmarks.studies.collectives --what=micro
  python -m benchmarks.studies.collectives --what=step \
      --config=experiments/configs/bert_large_paper.py:phase1 --layers=4
(docs/tpu_estimates.md, "Collectives: explicit all-gather and reduce-scatter", has the figures.)
"""

from __future__ import annotations

import time

from absl import app, flags
from ml_collections import config_flags

from benchmarks.studies.bf16_options import collective_bytes, step_figures
from data_pipelines import cli

FLAGS = flags.FLAGS

TOPOLOGIES = ("v3:8x8", "v3:4x4", "v4:2x2x4", "v5e:4x4")


def _collectives(moved: dict) -> str:
    return ", ".join(f"{k} {t} {b / 1e6:.1f}" for (k, t), b in sorted(moved.items())) or "none"


def micro_programs(mesh, length: int = 128, d: int = 1024, f: int = 4096):
    """{name: (function, abstract args)} of the four micro programs on the 1-axis `mesh`:
    a `d` x `f` kernel split along `f`, 2 sequences of `length` per device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    cores = mesh.devices.size
    batch = 2 * cores
    rows = NamedSharding(mesh, P("data"))
    split = NamedSharding(mesh, P(None, "data"))
    x = jax.ShapeDtypeStruct((batch, length, d), jnp.bfloat16, sharding=rows)
    dy = jax.ShapeDtypeStruct((batch, length, f), jnp.bfloat16, sharding=rows)
    w = jax.ShapeDtypeStruct((d, f), jnp.float32, sharding=split)

    def local_grad(x, dy):
        return jnp.einsum("btd,btf->df", x, dy, preferred_element_type=jnp.float32)

    def sum_by_constraint(x, dy):
        return jax.lax.with_sharding_constraint(local_grad(x, dy), split)

    def sum_by_psum_scatter(x, dy):
        def body(x, dy):
            return jax.lax.psum_scatter(local_grad(x, dy), "data", scatter_dimension=1, tiled=True)

        return jax.shard_map(
            body, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P(None, "data")
        )(x, dy)

    def gather_by_constraint(w, x):
        whole = jax.lax.with_sharding_constraint(w.astype(jnp.bfloat16), NamedSharding(mesh, P()))
        return jnp.einsum("btd,df->btf", x, whole)

    def gather_by_all_gather(w, x):
        def body(w, x):
            whole = jax.lax.all_gather(w.astype(jnp.bfloat16), "data", axis=1, tiled=True)
            return jnp.einsum("btd,df->btf", x, whole)

        return jax.shard_map(
            body, mesh=mesh, in_specs=(P(None, "data"), P("data")), out_specs=P("data")
        )(w, x)

    return {
        "gradient sum, constraint": (sum_by_constraint, (x, dy)),
        "gradient sum, psum_scatter": (sum_by_psum_scatter, (x, dy)),
        "bf16 gather, constraint": (gather_by_constraint, (w, x)),
        "bf16 gather, all_gather": (gather_by_all_gather, (w, x)),
    }


def micro() -> None:
    import jax
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh

    from experiments import aot_compile

    print("| topology | program | ms | collectives per core (MB of results) |")
    print("| --- | --- | ---: | --- |")
    for topology in TOPOLOGIES:
        devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
        mesh = Mesh(np.asarray(devices).reshape(-1), ("data",))
        for name, (fn, args) in micro_programs(mesh).items():
            compiled = jax.jit(fn).lower(*args).compile()
            ms = aot_compile.optimal_seconds(compiled) * 1e3
            moved = _collectives(collective_bytes(compiled.as_text()))
            print(f"| {topology} | {name} | {ms:.3f} | {moved} |", flush=True)


def step(config, layers: int | None) -> None:
    from experiments import aot_compile

    config = aot_compile.unrolled(config)
    if layers:
        with config.unlocked():
            config.model.num_hidden_layers = layers
    devices = aot_compile.slice_devices(config.topology)
    print("| weights gathered | ms / step | MFU | peak GiB / core | collectives per core (MB) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, explicit in (("f32, by constraint", False), ("bf16, all_gather", True)):
        with config.unlocked():
            config.shard_weight_update_explicit_gather = explicit
        start = time.time()
        ms, mfu, memory, moved = step_figures(config, devices)
        print(f"| {name} | {ms:.2f} | {mfu:.1%} | {memory:.2f} | {_collectives(moved)} | "
              f"({time.time() - start:.0f} s to compile)", flush=True)  # fmt: skip


def define_flags() -> None:
    flags.DEFINE_enum("what", "micro", ["micro", "step"], "The micro programs, or a config's step.")
    config_flags.DEFINE_config_file("config", None, "--what=step: the experiment config.")
    flags.DEFINE_integer("layers", None, "--what=step: encoder layers (default: the config's).")


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.what == "micro":
        micro()
    else:
        if FLAGS.config is None:
            raise app.UsageError("--what=step needs --config")
        step(FLAGS.config, FLAGS.layers)
    return 0


if __name__ == "__main__":
    define_flags()
    cli.run(main)
