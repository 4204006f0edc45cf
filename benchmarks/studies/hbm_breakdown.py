r"""Where a compiled train step's HBM traffic goes, by op kind: the TPU compiler's own estimate.

Compiles a config's train step for its TPU slice with the layers unrolled (as
`experiments.aot_compile` does for its step-time estimate: the cost model counts a scanned
layer body once), then reads the compiled program's text (`compiled.as_text()`, after every
optimisation: fusion, rematerialisation, memory-space assignment). The cost model's totals
(`cost_analysis()`: "bytes accessed", "flops", `optimal_seconds`) are per program, not per
op, so each top-level op of the entry computation is measured from the program text:

- bytes: the sizes of its operands plus its result (an async copy or slice: what it moves,
  read and written; a tuple element, bitcast or parameter: nothing), counted whatever
  memory space the buffer is assigned to (the compiler's per-program figure does the
  same: the totals below agree with it to a few percent);
- cycles: the `estimated_cycles` the TPU compiler writes into each op's backend config
  (its cost model's time for the op; absent on some ops);
- kind: from the names the ops carry (`metadata op_name`, the jax name stack: layer, module,
  primitive) and the ops inside a fusion (a `convolution` is a matmul), by the first rule
  of `KINDS` that matches.

The step's time is printed by both of the compiler's estimates, `optimal_seconds` and its
per-op cycles summed at the chip's clock (`bert_jax.hlo_cycles`, as `experiments.aot_compile`
reports them). The table gives each kind's GB, share of the program's bytes, estimated cycles'
share, and the program's totals beside the cost model's, so the method's error is on the
page; then each kind's tile padding (GB as laid out against GB unpadded: a head dim of 64
in 128-lane tiles is 2x) and the `--top` ops with their result's shape and layout, the
first place to look for an array that should not be in HBM or not in that layout.
Examples:

  python -m benchmarks.studies.hbm_breakdown \
      --config=experiments/configs/modernbert_base_tpu.py:phase1
  python -m benchmarks.studies.hbm_breakdown \
      --config=experiments/configs/modernbert_base_tpu.py:phase1 \
      --save_hlo=/tmp/phase1.hlo   # keep the program text; --hlo=/tmp/phase1.hlo re-reads it
(docs/tpu_modernbert_recipe.md has the einsum-era tables, docs/tpu_modernbert.md and
docs/tpu_modernbert_changes.md the splash ones.)
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from bert_jax.hlo_cycles import CYCLES as _CYCLES
from bert_jax.hlo_text import (  # noqa: F401 - re-exported: the benchmark's parsing
    _ARRAY,
    _CALLS,
    _ELEMENT_BYTES,
    Instruction,
    _matching,
    _padded,
    _statements,
    array_bytes,
    computations,
    parse_instruction,
)
from data_pipelines import cli

FLAGS = flags.FLAGS

_OP_NAME = re.compile(r'op_name="([^"]*)"')

# Ops that move nothing themselves (views, tuples, the second half of an async pair).
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "partition-id",
    "replica-id", "copy-done", "slice-done", "all-reduce-done", "all-gather-done",
    "collective-permute-done", "async-done", "after-all", "iota",
}  # fmt: skip
_COLLECTIVES = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
)  # fmt: skip
_DATA_MOVEMENT = {
    "copy", "copy-start", "slice-start", "transpose", "dynamic-update-slice",
    "dynamic-slice", "pad", "reshape", "slice", "concatenate", "custom-call",
}  # fmt: skip

# (kind, test on (opcode, names inside, fused opcodes)) in order: the first match wins. The
# names are the jax name stack of each op (the model's module path, then the primitive).
KINDS = (
    "collectives",  # gradient all-reduce / reduce-scatter, weight all-gathers
    "optimizer update",  # the weight update, gradient norms, the step's bookkeeping
    "attention scores/softmax",  # q.k, mask, softmax, p.v (and their gradients)
    "matmuls",  # the weight matmuls (q/k/v/out, GeGLU in/out, MLM head, embeddings)
    "norms, GeGLU, rotary (elementwise)",  # LayerNorm, activations, rotary, residual adds
    "MLM head and loss",  # gathers of masked positions, log-softmax, scatter of the grad
    "copies/transposes",  # layout changes, prefetch slices, async copies
    "other",
)


def classify(opcode: str, names: list[str], fused: set[str]) -> str:
    """The `KINDS` entry of one top-level op."""
    text = " ".join(names)
    if any(opcode.startswith(c) for c in _COLLECTIVES) or fused & set(_COLLECTIVES):
        return "collectives"
    model = [n for n in names if "BertForPreTraining" in n or "jvp(" in n]
    if not model and (
        any(n.startswith("state.") or "opt_state" in n for n in names)
        or (names and opcode not in _DATA_MOVEMENT)
    ):
        return "optimizer update"
    if "attention._attend" in text:
        return "attention scores/softmax"
    if "convolution" in fused or "dot" in fused or opcode in ("convolution", "dot"):
        return "matmuls"
    if opcode in _DATA_MOVEMENT or (fused and fused <= _DATA_MOVEMENT | {"parameter"}):
        return "copies/transposes"
    if "take_along_axis" in text or "/mlm/" in text or "log_softmax" in text:
        return "MLM head and loss"
    if "encoder/" in text or "embeddings/" in text:
        return "norms, GeGLU, rotary (elementwise)"
    return "other"


@dataclasses.dataclass
class OpCost:
    name: str
    opcode: str
    kind: str
    bytes: int  # as laid out: each array grown to whole tiles
    cycles: int
    op_name: str
    unpadded: int = 0  # the same arrays' bytes without tile padding
    shape: str = ""  # the result's HLO shape, with its layout and tiling


def _inside(comps, name: str, seen=None) -> tuple[set[str], list[str]]:
    """Opcodes and op names of a computation and of everything it calls."""
    seen = seen if seen is not None else set()
    if name in seen or name not in comps:
        return set(), []
    seen.add(name)
    opcodes, names = set(), []
    for inst in comps[name]:
        opcodes.add(inst.opcode)
        names += _OP_NAME.findall(inst.attrs)
        for callee in _CALLS.findall(inst.attrs):
            more_ops, more_names = _inside(comps, callee, seen)
            opcodes |= more_ops
            names += more_names
    return opcodes, names


def op_costs(hlo_text: str) -> list[OpCost]:
    """Bytes, estimated cycles and kind of each top-level op of the program's entry."""
    comps, entry = computations(hlo_text)
    shapes = {i.name: i.shape for insts in comps.values() for i in insts}
    costs = []
    for inst in comps[entry]:
        if inst.opcode in _FREE:
            continue
        result = inst.shape
        if inst.opcode in ("copy-start", "slice-start"):
            # A copy's (destination, source, context), a slice's ((operand), slice, context):
            # what moves is element 1's bytes, read from one memory and written to another.
            elements = _ARRAY.findall(result)
            moved = "{}[{}]{{{}}}".format(*elements[1]) if len(elements) > 1 else ""
            nbytes, unpadded = 2 * array_bytes(moved), 2 * array_bytes(moved, tiled=False)
        else:
            arrays = [result] + [shapes.get(o, "") for o in inst.operands]
            nbytes = sum(array_bytes(a) for a in arrays)
            unpadded = sum(array_bytes(a, tiled=False) for a in arrays)
        fused, names = set(), _OP_NAME.findall(inst.attrs)
        for callee in _CALLS.findall(inst.attrs):
            more_ops, more_names = _inside(comps, callee)
            fused |= more_ops
            names += more_names
        cycles = _CYCLES.search(inst.attrs)
        costs.append(
            OpCost(
                name=inst.name,
                opcode=inst.opcode,
                kind=classify(inst.opcode, names, fused),
                bytes=nbytes,
                cycles=int(cycles.group(1)) if cycles else 0,
                op_name=names[0] if names else "",
                unpadded=unpadded,
                shape=result,
            )
        )
    return costs


def table(costs: list[OpCost], program_bytes: float | None) -> str:
    """The markdown table by kind: GB, % of bytes, ops, % of estimated cycles."""
    by_bytes, by_cycles, count = collections.Counter(), collections.Counter(), collections.Counter()
    for c in costs:
        by_bytes[c.kind] += c.bytes
        by_cycles[c.kind] += c.cycles
        count[c.kind] += 1
    total, cycles = sum(by_bytes.values()), sum(by_cycles.values()) or 1
    lines = [
        "| op kind | GB / chip / step | % of bytes | ops | % of estimated cycles |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in sorted(KINDS, key=lambda k: -by_bytes[k]):
        if count[kind]:
            lines.append(
                f"| {kind} | {by_bytes[kind] / 1e9:,.1f} | {100 * by_bytes[kind] / total:.1f}% "
                f"| {count[kind]:,} | {100 * by_cycles[kind] / cycles:.1f}% |"
            )
    lines.append(f"| total (sum of the ops) | {total / 1e9:,.1f} | 100% | {len(costs):,} | 100% |")
    if program_bytes:
        lines.append(
            f'\ncost model\'s "bytes accessed" for the program: {program_bytes / 1e9:,.1f} GB '
            f"(the ops' sum is {100 * total / program_bytes:.1f}% of it)"
        )
    return "\n".join(lines)


def largest(costs: list[OpCost], n: int) -> str:
    """The `n` ops that move the most bytes: GB as laid out, the padding's share of them
    (bytes as laid out over bytes unpadded), kind, opcode, the result's shape with its
    layout, and the jax name."""
    rows = sorted(costs, key=lambda c: -c.bytes)[:n]
    lines = [f"{'GB':>8}  {'padded':>6}  {'cycles':>10}  kind / opcode / result / jax name"]
    for c in rows:
        padding = c.bytes / c.unpadded if c.unpadded else 1.0
        lines.append(
            f"{c.bytes / 1e9:8.2f}  {padding:5.2f}x  {c.cycles:>10,}  {c.kind} / {c.opcode} / "
            f"{c.shape[:100]} / {c.op_name[-110:]}"
        )
    return "\n".join(lines)


def padding_table(costs: list[OpCost]) -> str:
    """Tile padding by op kind: GB as laid out against GB unpadded."""
    laid, bare = collections.Counter(), collections.Counter()
    for c in costs:
        laid[c.kind] += c.bytes
        bare[c.kind] += c.unpadded
    lines = [
        "| op kind | GB as laid out | GB unpadded | padding |",
        "| --- | --- | --- | --- |",
    ]
    for kind in sorted(laid, key=lambda k: -laid[k]):
        ratio = laid[kind] / bare[kind] if bare[kind] else 1.0
        lines.append(
            f"| {kind} | {laid[kind] / 1e9:,.1f} | {bare[kind] / 1e9:,.1f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def estimates_line(totals: dict) -> str:
    """The program's totals by the cost model, and its step time by both of the compiler's
    estimates: `optimal_seconds` and the per-op cycles summed (`bert_jax.hlo_cycles`), the
    same two `experiments.aot_compile` reports."""
    seconds, flops = totals.get("optimal_seconds"), totals.get("flops") or 0
    per_op = totals.get("per_op_seconds")
    step = f"{seconds * 1e3:,.1f} ms per step (optimal_seconds)" if seconds else "no step time"
    if per_op:
        ratio = f", {per_op / seconds:.2f}x" if seconds else ""
        step += f"; per-op estimates {per_op * 1e3:,.1f} ms ({totals.get('device_kind')}{ratio})"
    return (
        f"cost model: {(totals.get('bytes accessed') or 0) / 1e9:,.1f} GB accessed, "
        f"{flops / 1e12:,.1f} TFLOP (XLA-counted), estimate {step}"
    )


def compile_program(config, topology: str | None):
    """(HLO text, cost-model totals) of `config`'s train step, layers unrolled."""
    from experiments import aot_compile

    topology = topology or config.get("topology")
    if not topology:
        raise app.UsageError("the config has no `topology`: pass --topology")
    devices = aot_compile.slice_devices(topology)
    start = time.perf_counter()
    compiled, _, _, _ = aot_compile.compile_steps(
        aot_compile.unrolled(config), devices, evaluate=False
    )
    print(f"compiled for {topology} in {time.perf_counter() - start:.0f} s", flush=True)
    costs = aot_compile._costs(compiled)
    kind = devices[0].device_kind
    totals = {
        "bytes accessed": costs.get("bytes accessed"),
        "flops": costs.get("flops"),
        "optimal_seconds": aot_compile.optimal_seconds(compiled),
        "per_op_seconds": aot_compile.per_op_seconds(compiled, kind),
        "device_kind": kind,
    }
    return compiled.as_text(), totals


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.hlo:
        with open(FLAGS.hlo) as f:
            text = f.read()
        totals = {}
        if os.path.exists(FLAGS.hlo + ".json"):  # the totals --save_hlo wrote beside it
            with open(FLAGS.hlo + ".json") as f:
                totals = json.load(f)
    elif FLAGS.config is None:
        raise app.UsageError("give --config (to compile) or --hlo (a saved program text)")
    else:
        print(f"config {FLAGS['config'].config_filename}", flush=True)
        text, totals = compile_program(FLAGS.config, FLAGS.topology)
        if FLAGS.save_hlo:
            with open(FLAGS.save_hlo, "w") as f:
                f.write(text)
            with open(FLAGS.save_hlo + ".json", "w") as f:
                json.dump(totals, f)
    costs = op_costs(text)
    if totals:
        print(estimates_line(totals))
    print(table(costs, totals.get("bytes accessed")))
    print("\ntile padding by kind:")
    print(padding_table(costs))
    if FLAGS.top:
        print(f"\nthe {FLAGS.top} ops moving the most bytes:")
        print(largest(costs, FLAGS.top))
    return 0


if __name__ == "__main__":
    # Compile-only use of libtpu, as experiments.aot_compile's: JAX's own backend is the CPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    config_flags.DEFINE_config_file("config", None, "A TPU config (with `topology`), :variant.")
    flags.DEFINE_string("topology", None, "TPU slice (default: the config's `topology`).")
    flags.DEFINE_string("hlo", None, "Read this saved program text instead of compiling.")
    flags.DEFINE_string("save_hlo", None, "Write the compiled program's text (and totals) here.")
    flags.DEFINE_integer("top", 15, "List the N ops that move the most bytes (0: none).")
    cli.run(lambda argv: sys.exit(main(argv)))
