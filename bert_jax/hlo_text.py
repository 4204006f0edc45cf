"""Reading XLA's HLO text: its computations and instructions, and the bytes of a shape as
laid out in memory (each array grown to whole tiles of its layout).

What the ahead-of-time tools read from a compiled TPU program beside the cost model's totals:
`experiments.aot_embeddings` (each loop body's share of the step) and
`benchmarks.studies.hbm_breakdown` (the step's HBM bytes per kind of op). Text in, numbers out: no
JAX here.
"""

from __future__ import annotations

import dataclasses
import re

# Bytes per element of each HLO element type.
_ELEMENT_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "token": 0,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{([^}]*)\})?")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)")


def _padded(dims: list[int], layout: str) -> list[int]:
    """`dims` grown to whole tiles of the layout's first tile, T(a, b)(c, d): the most minor
    dim to a multiple of b x d, the next to a x c (bf16's (2,1): two rows per 32-bit word)."""
    m = re.match(r"([0-9,]*):T\(([0-9,]+)\)(?:\(([0-9,]+)\))?", layout)
    if not m or not dims:
        return dims
    order = [int(d) for d in m.group(1).split(",") if d]  # minor to major
    tile = [int(t) for t in m.group(2).split(",")]
    sub = [int(t) for t in m.group(3).split(",")] if m.group(3) else [1] * len(tile)
    padded = list(dims)
    for k, (t, u) in enumerate(zip(reversed(tile), reversed(sub), strict=True)):
        if k < len(order):
            d = order[k]
            size = t * u
            padded[d] = -(-padded[d] // size) * size
    return padded


def array_bytes(shape_text: str, tiled: bool = True) -> int:
    """Bytes of every array in an HLO shape (a tuple's elements summed); `tiled`: as laid out
    in memory, each array grown to whole tiles of its layout (a head dim of 64 fills a
    128-wide tile)."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(shape_text):
        if dtype not in _ELEMENT_BYTES:
            continue
        sizes = [int(d) for d in dims.split(",") if d]
        if tiled:
            sizes = _padded(sizes, layout)
        n = 1
        for d in sizes:
            n *= d
        total += n * _ELEMENT_BYTES[dtype]
    return total


def _matching(text: str, start: int) -> int:
    """Index just past the parenthesis group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced parentheses in {text[:80]!r}")


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str  # the result's HLO shape text
    opcode: str
    operands: list[str]
    attrs: str  # everything after the operand list


def parse_instruction(line: str) -> Instruction | None:
    """One `%name = shape opcode(operands), attrs` line of HLO text; None for other lines."""
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = ", line)
    if not m:
        return None
    rest = line[m.end() :]
    if rest.startswith("("):
        end = _matching(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([a-z][\w\-]*)\(", rest)
    if not op:
        return None
    end = _matching(rest, op.end() - 1)
    operands = re.findall(r"%([\w.\-]+)", rest[op.end() : end - 1])
    return Instruction(m.group(1), shape, op.group(1), operands, rest[end:])


def _statements(hlo_text: str) -> list[str]:
    """The program text's lines with each instruction whole: a Pallas kernel's backend
    config holds newlines (its `xprof_metadata`), so a line that opens neither an
    instruction, a computation nor closes one continues the line before it."""
    out = []
    for line in hlo_text.splitlines():
        starts = re.match(r"\s*(?:ROOT )?%|(?:ENTRY )?%|HloModule|\}\s*$|\s*$", line)
        if starts or not out:
            out.append(line)
        else:
            out[-1] += line
    return out


def computations(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
    """The program's computations by name, and the entry computation's name."""
    comps, entry, current = {}, None, None
    for line in _statements(hlo_text):
        header = re.match(r"(ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if header and not line.startswith(" "):
            current = header.group(2)
            comps[current] = []
            if header.group(1):
                entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        if current is not None:
            inst = parse_instruction(line)
            if inst is not None:
                comps[current].append(inst)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry
