r"""What a local (sliding-window) layer costs against a global one, from the compiled program.

Not a timing: the compiler's own figures for one layer's forward + backward at batch 1 —
temporary memory (`memory_analysis().temp_size_in_bytes`), FLOPs (`cost_analysis()`) and, for
a TPU target, XLA's `optimal_seconds` estimate — for three computations of the same layer:

- `global`: a global layer (every key);
- `local-full-mask`: a local layer computed the way it was before blocked attention, full
  (T, S) scores with the window ANDed into the mask;
- `local-blocked`: a local layer as the model computes it (`bert_jax.layers.key_blocks`).

`--what=encoder` compiles the first three layers (global, local, local) looped and scanned,
with and without remat, to show what the scanned layer's `nn.cond` keeps for the backward.
The cost model counts a scanned body once, so time estimates are read from looped programs.

Examples:
  python -m benchmarks.studies.local_attention_cost --platform=cpu --preset=modernbert_tiny \
      --seq_len=4096
  python -m benchmarks.studies.local_attention_cost --platform=tpu --topology=v4:2x2x1 \
      --preset=modernbert_base --seq_len=8192 --dtype=bfloat16
  python -m benchmarks.studies.local_attention_cost --platform=tpu --what=encoder --seq_len=8192
(docs/tpu_estimates.md, "Local attention", has the figures of 2026-11-26.)
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from bert_jax import layers
from bert_jax.config import BertConfig
from bert_jax.model import Encoder, TransformerLayer
from experiments.aot_compile import optimal_seconds, slice_devices


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", choices=("cpu", "tpu"), default="cpu")
    parser.add_argument("--topology", default="v4:2x2x1", help="TPU topology to compile for")
    parser.add_argument("--preset", default="modernbert_tiny", help="a BertConfig preset")
    parser.add_argument("--seq_len", type=int, default=4096)
    parser.add_argument("--dtype", default="float32", help="matmul dtype (bfloat16 on a TPU)")
    parser.add_argument("--what", choices=("layer", "encoder"), default="layer")
    return parser.parse_args(argv)


def attention_inputs(cfg: BertConfig, seq_len: int, kind: str):
    """(global, local) `AttentionInputs` of one unpadded row; `kind` "local-full-mask" gives
    the local layers the (T, S) mask with the window ANDed in instead of blocks."""
    input_mask = jnp.ones((1, seq_len), jnp.int32)
    mask = layers.attention_mask(input_mask)
    positions = jnp.arange(seq_len)[None]
    if kind != "local-full-mask":
        return layers.attention_inputs(cfg, mask, positions, layers.segment_ids(input_mask))
    global_inputs, _ = layers.attention_inputs(cfg, mask, positions)
    theta = cfg.local_rope_theta or cfg.rope_theta
    rotary = None
    if cfg.position_encoding == "rotary":
        rotary = layers.rotary_tables(positions, cfg.head_dim, theta)
    window = mask & layers.window_mask(seq_len, cfg.local_attention_window)
    return global_inputs, layers.AttentionInputs(window, global_inputs.bias, rotary)


def report(name: str, fn, args, sharding) -> None:
    if sharding is not None:
        args = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args
        )
    compiled = jax.jit(fn).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    seconds = optimal_seconds(compiled) if sharding is not None else None
    estimate = f"{seconds * 1e3:9.2f} ms" if seconds else "       --"
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    flops = cost.get("flops", 0.0) / 1e9
    print(f"| {name:44s} | {temp:10.1f} MiB | {flops:9.2f} G | {estimate} |", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = BertConfig.from_preset(args.preset, dtype=args.dtype)
    if not cfg.local_attention_window:
        raise SystemExit(f"--preset={args.preset} has no local layers (local_attention_window=0)")
    sharding = None
    if args.platform == "tpu":
        sharding = SingleDeviceSharding(slice_devices(args.topology)[0])
    every = cfg.global_attention_every
    x = jax.ShapeDtypeStruct((1, args.seq_len, cfg.hidden_size), jnp.float32)
    target = f"TPU {args.topology}, one device" if sharding is not None else "this CPU"
    print(f"{args.preset}, T={args.seq_len}, {args.dtype}, compiled for {target}")
    print("| program | temporaries | FLOPs | estimate |\n|---|---|---|---|")
    if args.what == "layer":
        layer = TransformerLayer(cfg, deterministic=True)
        inputs = attention_inputs(cfg, args.seq_len, "local-blocked")
        params = jax.eval_shape(
            lambda: layer.init(jax.random.key(0), jnp.zeros(x.shape), inputs, every)["params"]
        )
        # Layer `every` is global, layer 1 local.
        for name, index in (("global", every), ("local-full-mask", 1), ("local-blocked", 1)):

            def loss(params, x, name=name, index=index):
                inputs = attention_inputs(cfg, args.seq_len, name)
                y, _ = layer.apply({"params": params}, x, inputs, index)
                return jnp.sum(y.astype(jnp.float32) ** 2)

            report(f"one {name} layer", jax.grad(loss, argnums=(0, 1)), (params, x), sharding)
        return
    input_mask = jnp.ones((1, args.seq_len), jnp.int32)
    for scan in (False, True):
        for remat in ("none", "full"):
            three = cfg.replace(num_hidden_layers=3, scan_layers=scan, remat_policy=remat)
            encoder = Encoder(three)
            mask = layers.attention_mask(input_mask)
            params = jax.eval_shape(
                lambda encoder=encoder, mask=mask: encoder.init(
                    jax.random.key(0), jnp.zeros(x.shape), mask, True, False
                )["params"]
            )

            def loss(params, x, encoder=encoder):
                mask = layers.attention_mask(input_mask)
                segments = layers.segment_ids(input_mask)
                y, _ = encoder.apply({"params": params}, x, mask, True, False, None, segments)
                return jnp.sum(y.astype(jnp.float32) ** 2)

            name = f"3 layers G-L-L, scan={scan}, remat={remat}"
            report(name, jax.grad(loss, argnums=(0, 1)), (params, x), sharding)


if __name__ == "__main__":
    main()
