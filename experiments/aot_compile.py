r"""Ahead-of-time fit check: compiles a config's train and eval steps for a TPU slice.

  python -m experiments.aot_compile --config=experiments/configs/bert_large_paper.py \
      [--topology=v3:8x8] [--mfu=0.4] [--usd_per_chip_hour=2.0]

A contrastive fine-tuning config (`experiments.finetune_embeddings`', with `chunk_size`) is
compiled and reported by `experiments.aot_embeddings` (its step, its cached-chunk loops
counted for every trip, the embeddings' all-gather priced).

With the `libtpu` wheel installed (`pip install -e '.[tpu]'`), `jax.experimental.
topologies` describes a real slice on a CPU-only machine. The config's mesh is laid over
that slice's devices and the real jitted train and eval steps (the ones
`experiments.pretrain` runs, same shardings, same donation) are lowered and compiled by
the TPU compiler on abstract inputs: nothing is allocated. The report gives per-device
memory (XLA's `memory_analysis`) against the chip's HBM, the model FLOPs of one step
(computed analytically: XLA's cost analysis counts a scanned layer body once), the
projected time to train at a stated model-FLOPs utilisation, and the TPU compiler's own
estimate of the step's time (its cost model's `optimal_seconds`), the MFU that implies
and the days to train at it, and the FLOPs the cost model counts against the model's (below
1x, something, e.g. a Pallas kernel without a cost estimate, is priced at zero and the
estimate is too low). The cost model too counts a scanned loop body once, so the
estimate comes from the same step compiled with its layers unrolled (`scan_layers=False`;
the memory fit stays the config's own); on v4 and v5e the -1 s the cost model counts for
each op it cannot cost is taken back out (`UNCOSTED_OPS`).

The compiler's second cost model is reported beside it, for the same unrolled step: the sum
of the per-op `estimated_cycles` it writes into the program, at the chip's clock, Pallas
kernels priced by their cost estimates (`bert_jax.hlo_cycles`); with the MFU, tokens/s,
time and chip-hours of both as a range. Neither is a measurement: the headline is that
range calibrated against published, measured TPU runs compiled here
(`experiments.tpu_calibration`, benchmarks/tpu_records/tpu_calibration.md), the raw estimates
beside it (`experiments.aot_report`). The exit status is 1 when the step does not fit, 2
when it cannot be compiled for another reason.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import config_bounds
from data_pipelines import cli
from experiments.aot_costs import (  # noqa: F401 - importable from here too
    HBM_BYTES_BY_DEVICE_KIND,
    MEGACORE,
    UNCOSTED_OPS,
    _costs,
    bytes_accessed,
    cost_model_flops,
    device_hbm_bytes,
    device_peak_flops,
    is_out_of_memory,
    optimal_seconds,
    per_op_seconds,
    slice_devices,
)
from experiments.aot_report import (  # noqa: F401 - the report's names, importable from here
    HBM_HEADROOM,
    FitReport,
    GiB,
    MemoryUse,
    duration,
    duration_range,
    eval_peak_bytes,
    fits,
    implied_mfu,
    projected_seconds,
)
from experiments.tpu_slice import topology_chips


def steps_to_train(config) -> int:
    """Steps this config's run takes: from `start_step` (phase 2: phase 1's end) to its stop."""
    stop = config.get("stop_at_step") or config.num_train_steps
    return stop - config.get("start_step", 0)


def compile_steps(config, devices, *, evaluate: bool = True):
    """Lowers and compiles the config's train and eval steps for `devices`.

    The steps, state, shardings and dropout key are `train.setup`'s and `run_keys`': what
    `experiments.pretrain` runs.

    Returns (compiled train step, compiled eval step or None, mesh, model config).
    """
    train, evaluation, mesh, run = lower_steps(config, devices, evaluate=evaluate)
    compiled_eval = evaluation.compile() if evaluate else None
    return train.compile(), compiled_eval, mesh, run.model_config


def lower_steps(config, devices, *, evaluate: bool = True):
    """`compile_steps` before compiling: (lowered train step, lowered eval step or None,
    mesh, the `train.setup` they came from: its abstract state, shardings, model config)."""
    import jax

    from bert_jax import checkpointing, pretraining_input, sharding, train, train_state

    mesh = sharding.create_mesh(config.mesh_shape, devices=devices)
    run = train.setup(config, mesh)
    state = checkpointing.abstract_like(run.abstract_state, run.shardings)
    data = config.data
    seq_len, predictions = data.max_seq_length, data.max_predictions_per_seq
    # Packed rows carry the packing inputs.
    instances = pretraining_input.max_instances_per_row(config)
    batch_shapes = jax.eval_shape(
        functools.partial(
            train.example_batch, config.global_batch_size, seq_len, predictions, instances
        )
    )
    batch_sharding = sharding.batch_sharding(mesh, run.rules)
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding), batch_shapes
    )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    _, key = jax.eval_shape(lambda: train_state.run_keys(config.seed, config.prng_impl))
    rng = jax.ShapeDtypeStruct((), key.dtype, sharding=replicated)
    with sharding.activation_context(mesh, run.rules):
        lowered_train = run.train_step.lower(state, batch, rng)
        lowered_eval = run.eval_step.lower(state.params, batch) if evaluate else None
    return lowered_train, lowered_eval, mesh, run


def unrolled(config):
    """`config` with its layers unrolled (`scan_layers=False`), all else the same."""
    config = config.copy_and_resolve_references()
    with config.unlocked():
        config.model.scan_layers = False
    return config


def estimate_step(config, devices, compiled_train) -> tuple[float | None, ...]:
    """The compiler's estimates of one train step (seconds, HBM bytes and FLOPs per device,
    seconds by the per-op estimates): from `compiled_train` when its layers are unrolled,
    else from the step compiled again unrolled (the cost model counts a scanned body once)."""
    if config.model.scan_layers:
        compiled_train, _, _, _ = compile_steps(unrolled(config), devices, evaluate=False)
    return (
        optimal_seconds(compiled_train),
        bytes_accessed(compiled_train),
        cost_model_flops(compiled_train),
        per_op_seconds(compiled_train, devices[0].device_kind),
    )


def layout_of(config, mesh_shape: dict[str, int]) -> str:
    """One line naming how a config lays its step out on the slice."""
    axes = ", ".join(f"{name} {size}" for name, size in mesh_shape.items() if size > 1)
    update = "sharded over data" if config.get("shard_weight_update", False) else "replicated"
    layers = "scanned" if config.model.scan_layers else "unrolled"
    return (
        f"mesh ({axes or 'one device'}), weight update {update}, "
        f"remat {config.model.remat_policy}, layers {layers}"
    )


def check(config, topology: str, estimate: bool = True) -> FitReport:
    """Compiles `config` for the TPU slice `topology` and reports the fit (and, with
    `estimate`, the compiler's step time)."""
    from bert_jax import train
    from experiments import tpu_calibration

    devices = slice_devices(topology)
    kind = devices[0].device_kind
    start = time.perf_counter()
    compiled_train, compiled_eval, mesh, cfg = compile_steps(config, devices)
    step_seconds, traffic, cost_flops, per_op = (
        estimate_step(config, devices, compiled_train) if estimate else (None,) * 4
    )
    seconds = time.perf_counter() - start
    data = config.data
    return FitReport(
        topology=topology,
        device_kind=kind,
        num_devices=len(devices),
        num_chips=topology_chips(topology),
        mesh_shape=dict(mesh.shape),
        hbm_bytes=device_hbm_bytes(kind),
        train=MemoryUse.of(compiled_train),
        evaluate=MemoryUse.of(compiled_eval),
        flops_per_step=train.flops_per_step(config, cfg),
        steps=steps_to_train(config),
        peak_flops_per_device=device_peak_flops(kind),
        compile_seconds=seconds,
        compiler_step_seconds=step_seconds,
        compiler_bytes=traffic,
        compiler_flops=cost_flops,
        per_op_step_seconds=per_op,
        calibration=tpu_calibration.load(),
        layout=layout_of(config, dict(mesh.shape)),
        estimated=estimate,
        tokens_per_step=config.global_batch_size * data.max_seq_length,
        packed=bool(data.get("pack", False)),
    )


def run(
    config,
    topology: str | None,
    mfu: float,
    usd_per_chip_hour: float | None,
    estimate: bool = True,
    padding: float | None = None,
    record: str | None = None,
) -> int:
    """Checks `config`, prints the report; returns the exit status (0 fits, 1 does not,
    2 no slice to check for). With `record` (a JSON file), the report's figures are kept
    there under the config's name (`experiments.tpu_records`; `benchmarks.tpu_records.tpu_figures`
    renders the docs' figures from it)."""
    topology = topology or config.get("topology")
    if not topology:
        print("the config has no `topology` key: pass --topology (e.g. --topology=v3:8x8)")
        return 2
    print(f"compiling for {topology} ...", flush=True)
    try:
        report = check(config, topology, estimate)
    except Exception as e:  # noqa: BLE001  (the compiler's errors are not typed)
        if not is_out_of_memory(e):
            raise
        print(f"DOES NOT FIT on {topology}: the TPU compiler ran out of HBM:\n{e}")
        return 1
    print(report.format(mfu, usd_per_chip_hour, padding))
    if record:
        from experiments import tpu_records

        tpu_records.record_report(record, report, config_name())
        print(f"recorded in {record}")
    if not report.fits:
        needed = max(report.train.total, report.eval_peak)
        usable = report.hbm_bytes * (1 - HBM_HEADROOM)
        print(
            f"DOES NOT FIT on {topology}: needs {needed / GiB:.2f} GiB per device, "
            f"a {report.device_kind} device has {report.hbm_bytes / GiB:.0f} GiB of HBM, "
            f"{usable / GiB:.2f} GiB usable"
        )
        return 1
    return 0


def config_name() -> str:
    """The --config given (file name and :variant) and any --config.key overrides after it."""
    name, overrides = flags.FLAGS["config"].config_filename, []
    for arg in sys.argv[1:]:
        if arg.startswith("--config="):
            name = os.path.basename(arg.split("=", 1)[1])
        elif arg.startswith("--config.") and not arg.startswith("--config.model.scan_layers="):
            # (the estimate is the unrolled step's either way: scanning changes the memory)
            overrides.append(arg[len("--config.") :])
    return " ".join([name, *overrides])


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from experiments import aot_embeddings

    contrastive = aot_embeddings.is_contrastive(flags.FLAGS.config)
    # Every key in its range (as the run checks it), before minutes of compile.
    kind = "finetune" if contrastive else "pretrain"
    config_bounds.check_or_exit(flags.FLAGS.config, kind, "aot_compile")
    try:
        import libtpu  # noqa: F401
    except ImportError:
        logging.error("libtpu is not installed: pip install -e '.[tpu]' (jax[tpu]==0.10.2)")
        return 2
    print(f"config {flags.FLAGS['config'].config_filename}")
    try:
        FLAGS = flags.FLAGS
        if contrastive:  # experiments.finetune_embeddings' step (experiments/aot_embeddings.py)
            layers = tuple(int(n) for n in FLAGS.proxy_layers) if FLAGS.proxy_layers else None
            return aot_embeddings.run(
                FLAGS.config, FLAGS.topology, FLAGS.negatives, FLAGS.estimate, layers,
                FLAGS.record, config_name(),
            )  # fmt: skip
        return run(
            FLAGS.config,
            FLAGS.topology,
            FLAGS.mfu,
            FLAGS.usd_per_chip_hour,
            FLAGS.estimate,
            FLAGS.padding,
            FLAGS.record,
        )
    except Exception:  # noqa: BLE001  (any other failure to lower or compile)
        logging.exception("the step could not be compiled")
        return 2


def _run():
    # Compile-only use of libtpu: no TPU is touched, so JAX's own backend is the CPU, and
    # another process holding the TPU lockfile (a training run, a parallel check) must not
    # stop this one. Both must be set before JAX starts.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    config_flags.DEFINE_config_file(
        "config", None, "Experiment config file (optionally with :variant).", lock_config=True
    )
    flags.DEFINE_string(
        "topology", None, "TPU slice, e.g. v3:8x8, v4:2x2x2, v5e:4x4 (default: config.topology)."
    )
    flags.DEFINE_float("mfu", 0.4, "Model-FLOPs utilisation the time projection assumes.")
    flags.DEFINE_float(
        "usd_per_chip_hour", None, "If given, also project the cost at this price per chip-hour."
    )
    flags.DEFINE_float(
        "padding",
        None,
        "Fraction of the rows' token slots that are padding in your data (bench_packing "
        "measures it, unpacked and packed): the report then gives real tokens/s at the "
        "compiler's estimate.",
    )
    flags.register_validator(
        "padding", lambda p: p is None or 0 <= p < 1, "--padding must be in [0, 1)"
    )
    flags.DEFINE_integer(
        "negatives",
        1,
        "Contrastive configs (experiments.finetune_embeddings'): hard negatives per pair in the "
        "training data (1: triplets of query, positive, negative; 0: pairs).",
        lower_bound=0,
    )
    flags.DEFINE_list(
        "proxy_layers",
        None,
        "Contrastive configs: two layer counts (e.g. 3,6: whole periods of the global layers) "
        "to compile the encoder cut to, the report extrapolated to its own layers (the whole "
        "program's compile can need more host memory than the machine has).",
    )
    flags.register_validator(
        "proxy_layers",
        lambda v: v is None or (len(v) == 2 and all(n.isdigit() and int(n) > 0 for n in v)),
        "--proxy_layers takes two layer counts, e.g. 3,6",
    )
    flags.DEFINE_string(
        "record",
        None,
        "Keep the report's figures in this JSON file under the config's name (e.g. "
        "benchmarks/tpu_records/tpu_figures.json, which the docs' TPU figures are generated from: "
        "python -m benchmarks.tpu_records.tpu_figures --write).",
    )
    flags.DEFINE_bool(
        "estimate",
        True,
        "Also report the compiler's step time (a scanned config's step is compiled a second "
        "time with its layers unrolled).",
    )
    cli.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    _run()
