r"""The ahead-of-time check of a contrastive fine-tuning config (`experiments.aot_compile`
hands it any config with `chunk_size`: `experiments.finetune_embeddings`' configs).

  python -m experiments.aot_compile \
      --config=experiments/configs/embeddings_modernbert_base_tpu.py:recipe \
      --proxy_layers=3,6 [--negatives=1]

The step compiled is `bert_jax.embeddings_train.make_train_step`'s, the one the run trains
(same optimizer, shardings, donation), on the abstract state and a batch of
`global_batch_size` pairs with `--negatives` hard negatives each at `max_seq_length`; the
encoder is `encoder_preset` with the config's `model_overrides` (what `init_from` is checked
to be at load). The report: per-device memory (XLA's memory analysis) against the chip's
HBM, the model FLOPs (`embeddings_train.flops_per_step`), the TPU compiler's estimate of the
step and the MFU it implies, and where the step's time and bytes go.

**The chunk loops.** The cached chunks (GradCache) are `lax.map` loops, one per kind of text
in the forward pass and one each in the backward pass, and the TPU cost model counts a
loop's body once, as it counts a scanned layer once. The estimate here adds each body back
for its other trips: the cost model writes its estimate of every op into the program
(`estimated_cycles`), so each body's share of the cycles it counted is known, and
`optimal_seconds` is scaled by (cycles with every body times its trips) / (cycles counted).
On a toy loop of four (R, 1024) x (1024, 1024) layers under `jax.checkpoint` on a v4-8
that scaled estimate came within 5% (8 trips) and 11% (32 trips) of the same computation
unrolled, the loop the dearer: per-trip slicing that unrolled code does not have.

**Proxies** (`--proxy_layers=3,6`). The whole program holds the encoder six times (a loop
each for queries, positives and negatives, forward and backward): ModernBERT-base's 22
layers' compile was killed at 14.9 GB on a shared 23 GB machine (3 layers: 4 GB and about 4
minutes on 2 cores). With two layer counts the step is compiled with the encoder cut
to each and every figure of the report (memory, estimate, cycles, bytes) continued on the
line through the two, to the encoder's own layers; the model FLOPs are the whole
encoder's. Whole periods of global and local layers (ModernBERT: 3) keep the two proxies'
mix of layers the real one's. On a tiny ModernBERT (v4-8) continued from 2 and 4 layers
to 8, against 8 compiled: the step 5.7% under, each part's bytes within 1%, the
temporaries 34% under (memory-space assignment is not linear in layers): the memory of an
extrapolation is a guide, its time and bytes close.

**The breakdown** prices each top-level op of the program (loop bodies x their trips): its
HBM bytes (operands + result, as laid out: `bert_jax.hlo_text.array_bytes`), its
share of the estimated cycles (as milliseconds of the scaled estimate), and for a
collective the bytes each device receives over ICI (an all-gather or reduce-scatter of an
array of S bytes over n devices: S (n - 1) / n; an all-reduce twice that; a
collective-permute S). Collectives whose arrays are all weight-shaped (scalars aside) are
the gradient all-reduce; the others gather the embeddings (the queries' candidates:
positives and hard negatives of the global batch, and the ids that mask repeated
positives) and bring their gradient back to each device. The program's collectives carry
no cycle estimate, so their time is the cost model's for each compiled alone on the same
devices (`price_collectives`: the (C, H) all-gather and the reduce-scatter of its gradient;
the all-reduce of every weight's gradient).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import time

from bert_jax.hlo_cycles import CYCLES as _CYCLES
from bert_jax.hlo_cycles import FREE as _FREE
from bert_jax.hlo_cycles import loop_trips as _trips
from experiments import aot_costs, aot_report
from experiments.aot_report import HBM_HEADROOM, GiB, MemoryUse
from experiments.tpu_slice import accelerator_type, topology_chips

_OP_NAME = re.compile(r'op_name="([^"]*)"')
_DIMS = re.compile(r"\b[a-z][a-z0-9]*\[([0-9,]*)\]")
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

PARTS = (
    "encoder: first forward (chunk loops)",
    "encoder: forward again and backward (chunk loops)",
    "all-gather of the embeddings (and its backward)",
    "gradient all-reduce",
    "loss, its gradient and the rest outside the loops",
    "optimizer update, norms",
)


def is_contrastive(config) -> bool:
    """Whether `config` is a contrastive fine-tuning config (`finetune_embeddings`')."""
    return "chunk_size" in config


@dataclasses.dataclass
class Part:
    """One row of the breakdown: an op kind's estimated cycles and bytes per device."""

    cycles: float = 0.0
    hbm_bytes: float = 0.0
    ici_bytes: float = 0.0
    ops: int = 0


@dataclasses.dataclass
class Program:
    """What the compiled program's text says about its loops and where its cost goes."""

    loops: list[tuple[str, int]]  # (first forward | backward, trips) of each while loop
    counted_cycles: float  # every op once: what the cost model's estimate sums
    parts: dict[str, Part]  # every op times its loop's trips

    @property
    def cycles(self) -> float:
        return sum(p.cycles for p in self.parts.values())


def _group_size(attrs: str, devices: int) -> int:
    """Devices in each group of a collective (`replica_groups`), else all of them."""
    iota = re.search(r"replica_groups=\[\d+,(\d+)\]<=", attrs)
    if iota:
        return int(iota.group(1))
    listed = re.search(r"replica_groups=\{\{([0-9,]+)\}", attrs)
    return len(listed.group(1).split(",")) if listed else devices


def program_costs(hlo_text: str, weight_shapes: set[tuple[int, ...]], devices: int) -> Program:
    """The loops, cycles and `PARTS` of a compiled contrastive step's program text."""
    from bert_jax.hlo_text import array_bytes, computations

    comps, entry = computations(hlo_text)
    shapes = {i.name: i.shape for insts in comps.values() for i in insts}
    parts = {name: Part() for name in PARTS}
    loops, counted = [], 0.0

    def walk(computation: str, weight: int, loop: str | None) -> None:
        nonlocal counted
        for inst in comps[computation]:
            if inst.opcode == "while":
                body = re.search(r"body=%([\w.\-]+)", inst.attrs).group(1)
                trips = _trips(hlo_text, re.search(r"condition=%([\w.\-]+)", inst.attrs).group(1))
                name = _OP_NAME.search(inst.attrs)
                kind = "backward" if name and "transpose(" in name.group(1) else "first forward"
                loops.append((kind, trips))
                walk(body, weight * trips, kind)
                continue
            if inst.opcode in _FREE:
                continue
            cycles = _CYCLES.search(inst.attrs)
            cycles = int(cycles.group(1)) if cycles else 0
            counted += cycles
            arrays = [inst.shape] + [shapes.get(o, "") for o in inst.operands]
            part = parts[_part(inst, arrays, weight_shapes, loop)]
            part.cycles += weight * cycles
            part.hbm_bytes += weight * sum(array_bytes(a) for a in arrays)
            part.ops += 1
            if inst.opcode.startswith(_COLLECTIVES):
                largest = max(array_bytes(a) for a in arrays)
                if inst.opcode.startswith("collective-permute"):  # one buffer to one peer
                    part.ici_bytes += weight * largest
                    continue
                n = _group_size(inst.attrs, devices)
                factor = 2 if inst.opcode.startswith("all-reduce") else 1
                part.ici_bytes += weight * factor * largest * (n - 1) / n

    walk(entry, 1, None)
    return Program(loops, counted, parts)


def _part(inst, arrays: list[str], weight_shapes, loop: str | None) -> str:
    if inst.opcode.startswith(_COLLECTIVES):
        dims = [tuple(int(d) for d in m.split(",") if d) for a in arrays for m in _DIMS.findall(a)]
        dims = [d for d in dims if d]  # scalars (the loss's sums) ride along with either
        if dims and all(d in weight_shapes for d in dims):
            return "gradient all-reduce"
        return "all-gather of the embeddings (and its backward)"
    if loop == "first forward":
        return PARTS[0]
    if loop == "backward":
        return PARTS[1]
    name = _OP_NAME.search(inst.attrs)
    return PARTS[4] if name and "jvp(" in name.group(1) else PARTS[5]


def price_collectives(mesh, candidates: tuple[int, int], weight_shapes: list) -> dict[str, float]:
    """The cost model's seconds for the step's two collectives, each compiled alone on the
    same devices (their ops in the step's program carry no cycle estimate of their own):
    the all-gather of the (C, H) f32 candidates and the reduce-scatter of their gradient
    (each device's partial sums of all of them, summed into its own rows), and the
    gradient all-reduce (every weight's f32 gradient summed over the data axes)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from bert_jax import embeddings, sharding

    data = sharding.batch_sharding(mesh)
    axes = data.spec[0]
    n = math.prod(mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,)))

    def seconds(fn, *shapes):
        args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=data) for s in shapes]
        return aot_costs.optimal_seconds(jax.jit(fn).lower(*args).compile()) or 0.0

    def sharded(fn, out):
        spec = PartitionSpec(axes)
        return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=out, check_vma=False)

    c, h = candidates
    scatter = sharded(lambda g: jax.lax.psum_scatter(g, axes, tiled=True), PartitionSpec(axes))
    # One f32 vector of every weight's elements: the bytes the combined all-reduce moves.
    elements = sum(math.prod(shape) for shape in weight_shapes)
    reduce = sharded(lambda g: jax.lax.psum(g, axes), PartitionSpec())
    return {
        "gather": seconds(lambda x: embeddings.gather_candidates(x, mesh), (c, h))
        + seconds(scatter, (n * c, h)),
        "gradients": seconds(reduce, (n * elements,)),
    }


@dataclasses.dataclass
class ContrastiveReport:
    """What the check found for one contrastive config on one slice."""

    topology: str
    device_kind: str
    num_devices: int
    num_chips: int
    mesh_shape: dict[str, int]
    hbm_bytes: int
    train: MemoryUse
    flops: dict[str, float]  # embeddings_train.flops_per_step
    steps: int
    peak_flops_per_device: float
    compile_seconds: float
    layout: str
    texts: int  # sequences a step: pairs x (2 + negatives)
    raw_seconds: float | None  # the compiler's estimate, each loop body counted once
    step_seconds: float | None  # the same, every loop body counted for each of its trips
    program: Program | None
    collective_seconds: dict[str, float] | None = None  # `price_collectives`
    layers: int = 0  # the encoder's layers compiled (or extrapolated to)
    proxies: tuple[ContrastiveReport, ...] = ()  # the compiles an extrapolation came from
    # The step by the compiler's per-op estimates (`bert_jax.hlo_cycles`: loop bodies times
    # their trips, kernels by their cost estimates), s; None: no clock known for the chip.
    per_op_seconds: float | None = None
    token_slots: int = 0  # `token_slots`: every text's compiled length, summed

    @property
    def fits(self) -> bool:
        return aot_report.fits(self.train.total, self.hbm_bytes)

    def mfu(self, which: str) -> float:
        return aot_report.implied_mfu(
            self.flops[which], self.step_seconds, self.peak_flops_per_device, self.num_devices
        )

    def format(self) -> str:
        def gib(n):
            return f"{n / GiB:7.2f} GiB"

        t = self.train
        lines = [
            f"slice {self.topology} ({accelerator_type(self.topology)}): {self.num_devices} x "
            f"{self.device_kind} ({self.num_chips} chips), mesh {self.mesh_shape}, compiled in "
            f"{self.compile_seconds:.0f} s",
            f"layout: {self.layout}",
            f"per-device memory     train step   (HBM {gib(self.hbm_bytes)})",
            f"  arguments        {gib(t.arguments)}",
            f"  outputs          {gib(t.outputs)}",
            f"  aliased (donated){gib(t.aliased)}",
            f"  temporaries      {gib(t.temporaries)}",
            f"  generated code   {gib(t.generated_code)}",
            f"  total            {gib(t.total)}",
            f"  fits: {'yes' if self.fits else 'NO'} ({100 * t.total / self.hbm_bytes:.0f}% of "
            f"HBM; at most {100 * (1 - HBM_HEADROOM):.1f}% is usable)",
            f"model FLOPs per step  {self.flops['model']:.4g} (3 forward passes of every text: 6 x "
            f"matmul params x tokens + attention); {self.flops['with_recompute']:.4g} with the "
            "cached chunks' second forward (4 passes)",
        ]
        if self.step_seconds is None:
            lines.append("compiler's estimate: none (the cost model gave no optimal_seconds)")
            return "\n".join(lines)
        kinds = collections.Counter(kind for kind, _ in self.program.loops)
        trips = sorted({n for _, n in self.program.loops})
        lines.append(
            f"chunk loops: {kinds['first forward']} in the forward pass, {kinds['backward']} in "
            f"the backward, {'/'.join(map(str, trips))} trips each (the cost model counts a "
            "body once)"
        )
        seconds, days = self.step_seconds, self.step_seconds * self.steps / 86400
        lines += [
            f"compiler's estimate: {seconds * 1e3:.1f} ms/step (the loops' bodies counted once: "
            f"{self.raw_seconds * 1e3:.1f} ms) = MFU {self.mfu('model'):.1%} (model FLOPs), "
            f"{self.mfu('with_recompute'):.1%} with the cached forward",
            f"  {self.steps:,} steps = {aot_report.duration(days)} "
            f"({days * 24 * self.num_chips:,.0f} chip-hours); {self.texts / seconds:,.0f} texts/s",
            _per_op_line(self),
            _calibrated_line(self),
            "where the step goes, per device (loop bodies x their trips): ms of the estimate "
            "by each part's share of the ops' estimated cycles; a collective's ops carry none, "
            "so its ms is the compiler's price of it compiled alone (`price_collectives`)",
            "| part | ms | HBM GB | ICI MB received | ops |",
            "| --- | --- | --- | --- | --- |",
        ]
        total = self.program.cycles or 1
        alone = self.collective_seconds or {}
        priced = {PARTS[2]: alone.get("gather"), PARTS[3]: alone.get("gradients")}
        for name, part in self.program.parts.items():
            if not part.ops:
                continue
            ms = priced.get(name)
            ms = (
                f"{ms * 1e3:.3g} (alone)"
                if ms is not None
                else f"{seconds * 1e3 * part.cycles / total:.1f}"
            )
            ici = f"{part.ici_bytes / 1e6:,.1f}" if part.ici_bytes else ""
            lines.append(f"| {name} | {ms} | {part.hbm_bytes / 1e9:.2f} | {ici} | {part.ops:,} |")
        return "\n".join(lines)


def _per_op_line(report: ContrastiveReport) -> str:
    """The step by the per-op estimates, beside `optimal_seconds`' (scaled) figure."""
    per_op = report.per_op_seconds
    if not per_op:
        return "per-op estimate: none (no clock known for this chip)"
    days = per_op * report.steps / 86400
    mfu = aot_report.implied_mfu(
        report.flops["model"], per_op, report.peak_flops_per_device, report.num_devices
    )
    return (
        f"per-op estimate (estimated_cycles at the chip's clock, loops x trips, kernels by "
        f"their cost estimates): {per_op * 1e3:.1f} ms/step ({per_op / report.step_seconds:.2f}x"
        f") = MFU {mfu:.1%}, {aot_report.duration(days)} "
        f"({days * 24 * report.num_chips:,.0f} chip-hours)"
    )


def _calibrated_line(report: ContrastiveReport) -> str:
    """Both estimates over the measured runs' ratios (`experiments.tpu_calibration`)."""
    from experiments import tpu_calibration

    calibration = tpu_calibration.load()
    estimates = {"optimal_seconds": report.step_seconds, "per_op": report.per_op_seconds}
    found = calibration.step_range(estimates) if calibration else None
    if found is None:
        return "calibrated estimate: none (no calibration record)"
    days = [seconds * report.steps / 86400 for seconds in found]
    return (
        f"CALIBRATED ESTIMATE (headline): {found[0] * 1e3:.1f}-{found[1] * 1e3:.1f} ms/step, "
        f"{report.steps:,} steps = {aot_report.duration_range(*days)} "
        f"({days[0] * 24 * report.num_chips:,.0f}-{days[1] * 24 * report.num_chips:,.0f} "
        f"chip-hours); calibrated by {calibration.describe()}"
    )


def proxy_line(proxy: ContrastiveReport) -> str:
    """One line of a compile an extrapolation reads: its layers, memory, estimates."""
    seconds = proxy.step_seconds
    estimate = "no estimate" if seconds is None else f"{seconds * 1e3:.1f} ms/step"
    return (
        f"proxy of {proxy.layers} layers: {proxy.train.total / GiB:.2f} GiB, {estimate} "
        f"(bodies once: {(proxy.raw_seconds or 0) * 1e3:.1f} ms), compiled in "
        f"{proxy.compile_seconds:.0f} s"
    )


def lower_step(config, devices, negatives: int, layers: int | None = None):
    """(lowered step, mesh, encoder config, weight shapes) of `config`'s contrastive step:
    `embeddings_train.make_train_step` on the abstract state, traced under the mesh; the
    encoder cut to its first `layers` layers where given."""
    import jax

    from bert_jax import embeddings, embeddings_train, sharding

    mesh = sharding.create_mesh(config.mesh_shape, devices=devices)
    cfg = embeddings_train.encoder_config(config)
    if layers:
        cfg = cfg.replace(num_hidden_layers=layers)
    module = embeddings.BertForEmbedding(cfg, config.pooling, config.normalize)
    built = embeddings_train.make_train_step(config, module, mesh, negatives=negatives)
    with sharding.activation_context(mesh):
        lowered = built.step.lower(built.state, built.batch, built.rng)
    weights = [tuple(x.shape) for x in jax.tree.leaves(built.state.params)]
    return lowered, mesh, cfg, weights


def token_slots(config, negatives: int) -> int:
    """Token slots of a step's texts at their compiled lengths: queries at
    `query_max_seq_length` where set, positives and hard negatives at `max_seq_length`."""
    t = config.max_seq_length
    return config.global_batch_size * ((config.get("query_max_seq_length", 0) or t)
                                       + (1 + negatives) * t)  # fmt: skip


def layout_of(config, mesh_shape: dict[str, int], cfg, negatives: int, devices: int) -> str:
    axes = ", ".join(f"{name} {size}" for name, size in mesh_shape.items() if size > 1)
    pairs, chunk = config.global_batch_size, config.chunk_size or config.global_batch_size
    texts = pairs * (2 + negatives)
    queries = config.get("query_max_seq_length", 0)
    queries = f", queries of {queries}" if queries else ""
    return (
        f"mesh ({axes or 'one device'}), weights replicated; {pairs:,} pairs + {negatives} hard "
        f"negative(s) each ({texts:,} texts of {config.max_seq_length} tokens{queries}), "
        f"cached chunks of {chunk:,} pairs ({chunk / devices:g} per device), "
        f"{cfg.attention_implementation} attention, {cfg.dtype} matmuls, remat {cfg.remat_policy}"
    )


def check(
    config, topology: str, negatives: int, estimate: bool = True, layers: int | None = None
) -> ContrastiveReport:
    """Compiles `config`'s contrastive step for the TPU slice `topology` (its encoder cut to
    `layers` layers where given) and reports it."""
    from bert_jax import embeddings_train

    devices = aot_costs.slice_devices(topology)
    kind = devices[0].device_kind
    start = time.perf_counter()
    lowered, mesh, cfg, weights = lower_step(config, devices, negatives, layers)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    raw = aot_costs.optimal_seconds(compiled) if estimate else None
    program = program_costs(compiled.as_text(), set(weights), len(devices)) if raw else None
    step = raw * program.cycles / program.counted_cycles if program else raw
    pairs = config.global_batch_size
    candidates = (pairs * (1 + negatives), cfg.hidden_size)
    alone = price_collectives(mesh, candidates, weights) if raw else None
    per_op = aot_costs.per_op_seconds(compiled, kind) if raw else None
    return ContrastiveReport(
        topology=topology,
        device_kind=kind,
        num_devices=len(devices),
        num_chips=topology_chips(topology),
        mesh_shape=dict(mesh.shape),
        hbm_bytes=aot_costs.device_hbm_bytes(kind),
        train=MemoryUse.of(compiled),
        flops=embeddings_train.flops_per_step(
            cfg, pairs, negatives, config.max_seq_length, config.get("query_max_seq_length", 0)
        ),
        steps=config.num_train_steps,
        peak_flops_per_device=aot_costs.device_peak_flops(kind),
        compile_seconds=seconds,
        layout=layout_of(config, dict(mesh.shape), cfg, negatives, len(devices)),
        texts=pairs * (2 + negatives),
        token_slots=token_slots(config, negatives),
        raw_seconds=raw,
        step_seconds=step,
        program=program,
        collective_seconds=alone,
        layers=cfg.num_hidden_layers,
        per_op_seconds=per_op,
    )


def extrapolate(
    a: ContrastiveReport, b: ContrastiveReport, cfg, flops: dict[str, float]
) -> ContrastiveReport:
    """The report of `cfg`'s encoder (its model FLOPs `flops`) from the compiles of two
    shorter ones (`a.layers` < `b.layers`): memory, time, cycles and bytes each continued on
    the line through them."""

    def line(x, y):
        return x + (y - x) * (cfg.num_hidden_layers - a.layers) / (b.layers - a.layers)

    fields = [f.name for f in dataclasses.fields(MemoryUse)]
    train = MemoryUse(*(round(line(getattr(a.train, f), getattr(b.train, f))) for f in fields))
    parts = {
        name: Part(
            *(line(getattr(a.program.parts[name], f), getattr(b.program.parts[name], f))
              for f in ("cycles", "hbm_bytes", "ici_bytes")),
            ops=round(line(a.program.parts[name].ops, b.program.parts[name].ops)),
        )
        for name in PARTS
    }  # fmt: skip
    program = Program(b.program.loops, line(a.program.counted_cycles, b.program.counted_cycles),
                      parts)  # fmt: skip
    alone = {k: line(a.collective_seconds[k], v) for k, v in b.collective_seconds.items()}
    return dataclasses.replace(
        b,
        train=train,
        flops=flops,
        compile_seconds=a.compile_seconds + b.compile_seconds,
        layout=f"{b.layout}; {cfg.num_hidden_layers} layers extrapolated from {a.layers} and "
        f"{b.layers}",
        raw_seconds=line(a.raw_seconds, b.raw_seconds),
        step_seconds=line(a.step_seconds, b.step_seconds),
        program=program,
        collective_seconds=alone,
        layers=cfg.num_hidden_layers,
        proxies=(a, b),
        per_op_seconds=(
            line(a.per_op_seconds, b.per_op_seconds)
            if a.per_op_seconds and b.per_op_seconds
            else None
        ),
    )


def run(
    config,
    topology: str | None,
    negatives: int,
    estimate: bool = True,
    proxy_layers: tuple[int, int] | None = None,
    record: str | None = None,
    name: str = "",
) -> int:
    """Checks the contrastive `config`, prints the report; returns the exit status (0 fits,
    1 does not, 2 no slice to check for). With `proxy_layers` (two layer counts), the step
    is compiled with the encoder cut to each and the report extrapolated to its layers. With
    `record` (a JSON file), the report's figures are kept there as `name@topology`
    (`experiments.tpu_records.record_contrastive`), as a pretraining config's are."""
    from bert_jax import embeddings_train

    topology = topology or config.get("topology")
    if not topology:
        print("the config has no `topology` key: pass --topology (e.g. --topology=v4:2x2x1)")
        return 2
    if proxy_layers and not estimate:
        print("--proxy_layers extrapolates the estimate: drop --noestimate")
        return 2
    print(f"compiling the contrastive step for {topology} ...", flush=True)
    try:
        if proxy_layers:
            proxies = []
            for layers in sorted(proxy_layers):
                proxies.append(check(config, topology, negatives, estimate, layers))
                print(proxy_line(proxies[-1]), flush=True)
            cfg = embeddings_train.encoder_config(config)
            flops = embeddings_train.flops_per_step(
                cfg,
                config.global_batch_size,
                negatives,
                config.max_seq_length,
                config.get("query_max_seq_length", 0),
            )
            report = extrapolate(*proxies, cfg, flops)
        else:
            report = check(config, topology, negatives, estimate)
    except Exception as e:  # noqa: BLE001  (the compiler's errors are not typed)
        if not aot_costs.is_out_of_memory(e):
            raise
        print(f"DOES NOT FIT on {topology}: the TPU compiler ran out of HBM:\n{e}")
        return 1
    print(report.format())
    if record:
        from experiments import tpu_records

        tpu_records.record_contrastive(record, report, name)
        print(f"recorded in {record}")
    if not report.fits:
        print(f"DOES NOT FIT on {topology}: needs {report.train.total / GiB:.2f} GiB per device")
        return 1
    return 0
