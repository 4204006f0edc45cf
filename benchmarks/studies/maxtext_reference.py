r"""MaxText's own training step, compiled ahead of time for a TPU slice, priced like ours.

An independent yardstick for `experiments.aot_compile`'s estimates (issue 66): MaxText's
train step (its model, optimizer, sharding and remat policies, built by its own
`train_compile` functions) for a config given as MaxText `key=value` overrides, compiled
for a TPU topology on this CPU with the same jax / libtpu, then read with the same TPU cost
models our estimates come from. Of bert_jax only the program-text reader `hlo_cycles` is
imported; MaxText is not vendored.

Set up (outside the repo; MaxText needs Python >= 3.12):

  git --git-dir=<maxtext mirror> archive HEAD | tar -x -C /work/wt/maxtext_src
  /root/.pyenv/versions/3.12.1/bin/python -m venv /work/wt/maxtext_venv
  printf 'jax==0.10.2\njaxlib==0.10.2\nlibtpu==0.0.42.1\nflax==0.12.8\n' > constraints.txt
  /work/wt/maxtext_venv/bin/pip install -c constraints.txt jax jaxlib libtpu flax \
      optax==0.2.8 orbax-checkpoint absl-py chex omegaconf pydantic ml-collections \
      jaxtyping tensorboardx aqtp qwix pathwaysutils jinja2 tokamax grain huggingface_hub \
      transformers drjax pillow tiktoken sentencepiece sympy ml-goodput-measurement

  (the packages `from maxtext.trainers.pre_train import train_compile` imports; the
  constraints keep jax at our pins, which tokamax and pathwaysutils would otherwise lift).

Run (one config per call; each result is printed and appended as a JSON line to --record):

  /work/wt/maxtext_venv/bin/python benchmarks/studies/maxtext_reference.py \
      --maxtext_dir=/work/wt/maxtext_src --topology=v4-128 --record=/tmp/maxtext.jsonl \
      --label="ModernBERT-base shape, full" -- base_emb_dim=768 base_num_decoder_layers=22 ...

What it reads from the compiled step, per device (one v4 chip):
- the compiler's second estimate, its per-op `estimated_cycles` summed (loop bodies times
  their trips) at the chip's clock, Pallas kernels by their cost estimates: read with this
  repository's `bert_jax/hlo_cycles.py` (text in, numbers out; nothing else of bert_jax),
  as `experiments.aot_compile` reads ours (`per_op_seconds`, `per_op_mfu`);
- the cost model's FLOPs, bytes accessed and `optimal_seconds`; libtpu 0.0.42.1 counts
  -1 s for each `custom_call_target="ConcatBitcast"` op (a bitcast joining a sliced
  prefetch, which it cannot cost), so each one found in the compiled text adds 1 s back,
  as `experiments.aot_compile.optimal_seconds` does;
- `memory_analysis()`: arguments, outputs, aliased, temporaries, generated code; the peak is
  arguments + outputs - aliased + temporaries + generated code;
- MaxText's own model FLOPs (`maxtext_utils.calculate_tflops_training_per_device`: 6 x
  parameters touched per token plus causal attention, i.e. half of T^2, as MaxText reports),
  and from them MFU = model FLOPs / (seconds x peak) and R = cost-model FLOPs / model FLOPs
  (R < 1: something is priced at zero or once: a Pallas kernel without a cost estimate,
  such as jax's splash, which MaxText uses unless `use_tokamax_splash=True`; or a loop
  body, such as the logits under `num_vocab_tiling` > 1).

The cost model prices a scanned layer stack's body once, so compile with scan_layers=False.
For a model too big to compile unrolled in full, `--layers=2,4 --extrapolate_to=N` compiles
it at 2 and at 4 layers and extends FLOPs, bytes, seconds and model FLOPs linearly per layer
to N (memory too, as a guide only: a compile at N is the word on fitting), and prints the
per-layer slope: one layer's ms, GB, MFU and R, free of the embedding and the logits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Peak dense bf16 FLOP/s of one JAX device, by the vendor's figures (v4: one megacore chip).
PEAK_FLOPS = {"v4": 275e12, "v5p": 459e12, "v5e": 197e12, "v6e": 918e12}

# The JAX device kind of each generation (for the per-op estimates' clock).
DEVICE_KIND = {"v4": "TPU v4", "v5p": "TPU v5", "v5e": "TPU v5 lite"}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Ops libtpu 0.0.42.1's cost model cannot price and counts at -1 s each (see docstring).
# (v5p's SparseCore-offloaded gathers: PrepareAsyncCallStart / Done, -1 s each too.)
UNCOSTED_OPS = (
    'custom_call_target="ConcatBitcast"',
    'custom_call_target="PrepareAsyncCallStart"',
    'custom_call_target="PrepareAsyncCallDone"',
)

GIB = 1024**3


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Everything after `--` is passed to MaxText as key=value config overrides.",
    )
    parser.add_argument("--maxtext_dir", required=True, help="a MaxText source tree (has src/)")
    parser.add_argument("--topology", default="v4-128", help="MaxText compile_topology")
    parser.add_argument("--label", default="", help="a name for this row in the record")
    parser.add_argument("--record", default="", help="append each result as a JSON line here")
    parser.add_argument(
        "--layers", default="", help="comma-separated layer counts to compile and extrapolate"
    )
    parser.add_argument(
        "--extrapolate_to", type=int, default=0, help="layer count --layers extrapolates to"
    )
    parser.add_argument(
        "--save_hlo", default="", help="write each compiled program's text to PREFIX<layers>.hlo"
    )
    parser.add_argument("overrides", nargs="*", help="MaxText key=value overrides")
    args = parser.parse_args(argv)
    if bool(args.layers) != bool(args.extrapolate_to):
        parser.error("--layers and --extrapolate_to go together")
    if not os.path.isdir(os.path.join(args.maxtext_dir, "src", "maxtext")):
        parser.error(f"--maxtext_dir={args.maxtext_dir}: no src/maxtext in it")
    for item in args.overrides:
        if "=" not in item:
            parser.error(f"override {item!r} is not key=value")
    return args


def peak_flops(topology: str) -> float:
    generation = topology.split("-")[0]
    if generation not in PEAK_FLOPS:
        raise SystemExit(f"--topology={topology}: no peak FLOP/s known for {generation!r}")
    return PEAK_FLOPS[generation]


def compile_step(maxtext_dir: str, overrides: list[str]):
    """MaxText's train step for `overrides`, lowered and compiled for the topology in them,
    the way MaxText's train_compile.main does it (without saving). Returns (config, compiled)."""
    import jax
    from flax.linen import partitioning as nn_partitioning
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    # As train_compile.main: the RNG MaxText trains with.
    jax.config.update("jax_default_prng_impl", "unsafe_rbg")
    base_yml = os.path.join(maxtext_dir, "src", "maxtext", "configs", "base.yml")
    config = pyconfig.initialize(["maxtext_reference", base_yml, *overrides])
    train_compile.validate_config(config)
    mesh = train_compile.get_topology_mesh(config)
    args, kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_shardings
    )
    input_shardings = sharding.build_zero1_input_state_mesh_shardings(
        config, state_shardings, params_shardings
    )
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data_sharding, input_shardings, model, config, params_shardings
    )
    compiled = train_compile.jit_and_compile(
        func,
        args,
        kwargs,
        mesh,
        in_shard,
        out_shard,
        static,
        donate,
        config,
        nn_partitioning.axis_rules(config.logical_axis_rules),
    )
    return config, compiled


def model_flops(config) -> float:
    """MaxText's model FLOPs of one train step on one device."""
    from maxtext.utils import maxtext_utils

    total_tflops, _, _ = maxtext_utils.calculate_tflops_training_per_device(config, log=False)
    return total_tflops * 1e12


def per_op_seconds(text: str, generation: str) -> float | None:
    """The compiled program's time by its per-op estimates (`bert_jax.hlo_cycles`)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from bert_jax import hlo_cycles

    kind = DEVICE_KIND.get(generation)
    return hlo_cycles.per_op_seconds(text, kind, PEAK_FLOPS[generation]) if kind else None


def read_compiled(compiled, generation: str = "v4") -> dict:
    """The cost model's and the memory analysis's figures for one device."""
    costs = compiled.cost_analysis()
    if isinstance(costs, list | tuple):  # one dict per program in older jax releases
        costs = costs[0] if costs else {}
    costs = costs or {}
    text = compiled.as_text()
    uncosted = sum(text.count(op) for op in UNCOSTED_OPS)
    raw = costs.get("optimal_seconds")
    stats = compiled.memory_analysis()
    peak = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
        + stats.generated_code_size_in_bytes
    )
    return {
        "cost_flops": float(costs.get("flops", 0.0)),
        "bytes_accessed": float(costs.get("bytes accessed", 0.0)),
        "raw_optimal_seconds": None if raw is None else float(raw),
        "uncosted_ops": uncosted,
        "seconds": None if raw is None else float(raw) + uncosted,
        "per_op_seconds": per_op_seconds(text, generation),
        "argument_bytes": stats.argument_size_in_bytes,
        "temp_bytes": stats.temp_size_in_bytes,
        "peak_bytes": peak,
        # occurrences of "splash" in the compiled text (names of its kernels and their ops):
        # 0 says no splash kernel is in the program
        "splash_mentions": text.count("splash"),
    }


def derived(row: dict, peak: float) -> dict:
    """MFU and R from a row's seconds and FLOPs."""
    seconds, flops = row["seconds"], row["model_flops"]
    row["mfu"] = flops / (seconds * peak) if seconds and seconds > 0 else None
    row["R"] = row["cost_flops"] / flops if flops else None
    per_op = row.get("per_op_seconds")
    row["per_op_mfu"] = flops / (per_op * peak) if per_op and per_op > 0 else None
    return row


def measure(args: argparse.Namespace, overrides: list[str]) -> dict:
    start = time.time()
    config, compiled = compile_step(args.maxtext_dir, overrides)
    row = read_compiled(compiled, args.topology.split("-")[0])
    if args.save_hlo:
        with open(f"{args.save_hlo}{config.num_decoder_layers}.hlo", "w") as f:
            f.write(compiled.as_text())
    row["model_flops"] = model_flops(config)
    row["layers"] = config.num_decoder_layers
    row["rows_per_chip"] = config.per_device_batch_size
    row["seq_len"] = config.max_target_length
    row["compile_s"] = round(time.time() - start, 1)
    return row


def extrapolate(low: dict, high: dict, layers: int, peak: float) -> dict:
    """Cost-model figures (and, as a guide only, memory) at `layers`, extended linearly per
    layer from two compiles; with the per-layer figures, and the MFU of one layer alone."""
    span = high["layers"] - low["layers"]
    row = {"layers": layers, "extrapolated_from": [low["layers"], high["layers"]]}
    keys = ("cost_flops", "bytes_accessed", "seconds", "temp_bytes", "peak_bytes", "model_flops")
    if low.get("per_op_seconds") and high.get("per_op_seconds"):
        keys += ("per_op_seconds",)
    for key in keys:
        per_layer = (high[key] - low[key]) / span
        row[key] = high[key] + per_layer * (layers - high["layers"])
        row[key + "_per_layer"] = per_layer
    row["layer_mfu"] = row["model_flops_per_layer"] / (row["seconds_per_layer"] * peak)
    row["layer_R"] = row["cost_flops_per_layer"] / row["model_flops_per_layer"]
    return row


def show(row: dict) -> str:
    def fmt(value, scale=1.0, digits=1):
        return "n/a" if value is None else f"{value / scale:,.{digits}f}"

    mfu = None if row.get("mfu") is None else 100 * row["mfu"]
    return (
        f"{row.get('label', '')}: {row['layers']} layers, "
        f"{fmt(row.get('rows_per_chip'), digits=0)} rows/chip, "
        f"memory/chip {fmt(row.get('peak_bytes'), GIB, 2)} GiB "
        f"(temp {fmt(row.get('temp_bytes'), GIB, 2)}, "
        f"args {fmt(row.get('argument_bytes'), GIB, 2)}), "
        f"{fmt(row['seconds'], 1e-3)} ms/step, MFU {fmt(mfu)}%, "
        f"per-op estimates {fmt(row.get('per_op_seconds'), 1e-3)} ms/step, MFU "
        f"{fmt(None if row.get('per_op_mfu') is None else 100 * row['per_op_mfu'])}%, "
        f"HBM {fmt(row['bytes_accessed'], 1e9)} GB/step, R {fmt(row.get('R'), digits=2)}, "
        f"model {fmt(row['model_flops'], 1e12, 2)} TFLOP, "
        f"cost model {fmt(row['cost_flops'], 1e12, 2)}"
        + (
            f"; per layer {fmt(row['seconds_per_layer'], 1e-3, 2)} ms, "
            f"{fmt(row['bytes_accessed_per_layer'], 1e9)} GB, MFU {fmt(100 * row['layer_mfu'])}%, "
            f"R {fmt(row['layer_R'], digits=2)}"
            if "layer_mfu" in row
            else ""
        )
    )


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    peak = peak_flops(args.topology)
    # Compile-only use of libtpu: another process holding its lockfile (a parallel compile)
    # must not stop this one. Set before JAX starts, as train_compile.main's SPMD RNG flag.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ["LIBTPU_INIT_ARGS"] = (
        os.environ.get("LIBTPU_INIT_ARGS", "") + " --xla_tpu_spmd_rng_bit_generator_unsafe=true"
    )
    sys.path.insert(0, os.path.join(args.maxtext_dir, "src"))
    common = [f"compile_topology={args.topology}", "compile_topology_num_slices=1"]
    common += ["dataset_type=synthetic", "enable_checkpointing=False", "run_name=maxtext_ref"]
    overrides = common + args.overrides
    rows = []
    if args.layers:
        counts = [int(n) for n in args.layers.split(",")]
        if len(counts) != 2 or counts[0] >= counts[1]:
            raise SystemExit(f"--layers={args.layers}: give two increasing layer counts")
        parts = []
        for count in counts:
            part = measure(args, [*overrides, f"base_num_decoder_layers={count}"])
            part["label"] = f"{args.label} [{count} layers]"
            rows.append(derived(part, peak))
            parts.append(part)
            print(show(part), flush=True)
        # MaxText's model FLOPs are linear in the layer count (each layer the same), so they
        # extrapolate exactly.
        row = extrapolate(parts[0], parts[1], args.extrapolate_to, peak)
        row["label"] = f"{args.label} [extrapolated]"
        row["rows_per_chip"] = parts[1]["rows_per_chip"]
        rows.append(derived(row, peak))
    else:
        row = measure(args, overrides)
        row["label"] = args.label
        rows.append(derived(row, peak))
    for row in rows[-1:] if args.layers else rows:
        print(show(row), flush=True)
    if args.record:
        with open(args.record, "a") as f:
            for row in rows:
                row.update(topology=args.topology, overrides=args.overrides)
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
