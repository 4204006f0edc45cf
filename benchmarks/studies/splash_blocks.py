r"""Splash attention's tile sizes by the TPU compiler's estimate, one layer's attention at a time.

Not a timing: each candidate tile is compiled ahead of time for a TPU slice (needs libtpu;
nothing is allocated), forward + backward of `bert_jax.splash.attention` for the config's
rows per chip, and the compiler's `optimal_seconds` (every kernel priced by
`splash.kernel_costs`: a roofline of its FLOPs, bytes and exps), the cost model's bytes and
the einsum path's figures for the same computation (`--einsum`) are printed. A tile that does
not fit the kernel's on-chip memory fails to compile and is reported so. Estimates only: a
real TPU run is the final word on tile sizes.

  python -m benchmarks.studies.splash_blocks --seq_len=1024 --rows=72
  python -m benchmarks.studies.splash_blocks --seq_len=8192 --rows=1 --einsum
(docs/tpu_modernbert.md has the figures of 2026-11-29.)
"""

from __future__ import annotations

import argparse
import os
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", default="v4:2x2x1", help="TPU slice to compile for")
    parser.add_argument("--preset", default="modernbert_base", help="a BertConfig preset")
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8, help="rows (sequences) per chip")
    parser.add_argument("--tiles", default="128,256,512,1024", help="candidate tile sizes")
    parser.add_argument("--einsum", action="store_true", help="also the einsum path")
    return parser.parse_args(argv)


def compile_attention(config, devices, rows: int, seq_len: int, local: bool):
    """The compiled forward + backward of one layer's attention core on `devices`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from bert_jax import attention, layers, sharding

    mesh = sharding.create_mesh((-1, 1, 1), devices=devices)
    batch = rows * len(devices)
    heads, dim = config.num_attention_heads, config.head_dim
    spec = jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor", None)
    qkv = jax.ShapeDtypeStruct(
        (batch, seq_len, heads, dim),
        jnp.dtype(config.dtype),
        sharding=jax.sharding.NamedSharding(mesh, spec),
    )
    rows_spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), None))
    ids = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=rows_spec)

    def loss(q, k, v, segments):
        mask = layers.attention_mask(segments > 0, segments)
        positions = jnp.zeros_like(segments)
        global_inputs, local_inputs = layers.attention_inputs(config, mask, positions, segments)
        inputs = local_inputs if local else global_inputs
        out = attention.attend(config, q, k, v, inputs, True, lambda p: p)
        return out.astype(np.float32).sum()

    with sharding.activation_context(mesh):
        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return step.lower(qkv, qkv, qkv, ids).compile()


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from bert_jax.config import BertConfig
    from experiments.aot_compile import bytes_accessed, optimal_seconds, slice_devices

    devices = slice_devices(args.topology)
    base = BertConfig.from_preset(args.preset, dtype="bfloat16")
    print(
        f"{args.preset}, T = {args.seq_len}, {args.rows} rows per chip, {args.topology}: one "
        f"layer's attention, forward + backward, by the compiler's estimate"
    )
    print("layer   implementation  tile (q x kv)   ms      GB / chip  compile s")
    variants = [("einsum", None)] if args.einsum else []
    variants += [("splash", int(t)) for t in args.tiles.split(",")]
    for kind, local in (("global", False), ("local", True)):
        for implementation, tile in variants:
            if tile is not None and tile > args.seq_len:
                continue
            config = base.replace(attention_implementation=implementation)
            if tile is not None:
                config = config.replace(
                    splash_block_q=tile, splash_block_kv=tile, splash_local_block=tile
                )
            start = time.perf_counter()
            try:
                compiled = compile_attention(config, devices, args.rows, args.seq_len, local)
            except Exception as error:  # noqa: BLE001  (the compiler's errors are not typed)
                print(f"{kind:7} {implementation:15} {tile!s:>4}: does not compile: {error!s:.120}")
                continue
            seconds, traffic = optimal_seconds(compiled), bytes_accessed(compiled)
            ms = f"{seconds * 1e3:7.3f}" if seconds else "   none"
            gb = f"{traffic / 1e9:9.2f}" if traffic else "     none"
            shown = f"{tile} x {tile}" if tile else "-"
            print(
                f"{kind:7} {implementation:15} {shown:13} {ms}  {gb}  "
                f"{time.perf_counter() - start:6.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
