"""A config key's allowed values as data: `Bound`, and the constructors that make each entry
of `bert_jax.config_bounds`' tables one line (`Int`, `Float`, `Prob`, `Enum`, `Flag`, `Text`,
`Model`, `ListOf`). No JAX, no config knowledge: the tables say which key is which.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bert_jax.mesh_shape import MESH_AXES

SEED_MAX = 2**63 - 1  # numpy's and JAX's seeds are 64-bit
# Step counts: the train state's step is an int32 (a larger count overflows it).
STEP_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Bound:
    """What one key may hold. `kind`: "int", "float", "bool", "text", "enum", "mesh",
    "rules", "list" (of `item`s, or of `words`) or "model" (BertConfig checks it; `text`
    says how). `none`/`zero`: what None / 0 means ("": None is refused, 0 means nothing
    special)."""

    meaning: str
    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # low itself refused
    open_high: bool = False
    choices: tuple = ()
    none: str = ""
    zero: str = ""
    text: str = ""
    item: Bound | None = None
    words: tuple[str, ...] = ()

    def allows(self, value: Any) -> bool | None:
        """Whether `value` is in range; None for a "model" key (BertConfig decides)."""
        if value is None:
            return bool(self.none) or self.kind in ("rules", "model")
        if self.kind == "model":
            return None
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "text":
            return isinstance(value, str)
        if self.kind == "enum":
            return value in self.choices
        if self.kind == "mesh":
            return _mesh_ok(value)
        if self.kind == "rules":
            return isinstance(value, list | tuple) and all(len(pair) == 2 for pair in value)
        if self.kind == "list":
            if isinstance(value, str):  # a config key's "64,128" ("" is none)
                value = [v for v in value.split(",") if v.strip()]
            return isinstance(value, list | tuple) and all(self._item_ok(v) for v in value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            return False
        return self.high is None or (
            value < self.high or (not self.open_high and value == self.high)
        )

    def _item_ok(self, value: Any) -> bool:
        if value in self.words:
            return True
        if self.item.kind == "text":
            return isinstance(value, str)
        try:  # a flag's list holds strings
            number = int(value) if self.item.kind == "int" else float(value)
        except (TypeError, ValueError):
            return False
        return bool(self.item.allows(number))

    def describe(self) -> str:
        """The range in words: 'an int >= 1', 'a float in (0, 1]', 'one of (...)'."""
        text = self._describe()
        return f"None or {text}" if self.none else text

    def _describe(self) -> str:
        if self.kind in _WORDS:
            return _WORDS[self.kind]
        if self.kind == "model":
            return self.text
        if self.kind == "enum":
            return f"one of {self.choices}"
        if self.kind == "list":
            words = "".join(f"{w!r} or " for w in self.words)
            return f"a comma-separated list, each {words}{self.item.describe()}"
        kind = "an int" if self.kind == "int" else "a number"
        low, high = self.low, self.high
        if low is None and high is None:
            return f"{kind} (any)"
        if high is None:
            return f"{kind} {'>' if self.open_low else '>='} {_fmt(low)}"
        if low is None:
            return f"{kind} {'<' if self.open_high else '<='} {_fmt(high)}"
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        return f"{kind} in {left}{_fmt(low)}, {_fmt(high)}{right}"


# The ranges of the kinds without bounds, in words.
_WORDS = {
    "bool": "True or False",
    "text": "a string",
    "mesh": f"{len(MESH_AXES)} ints {MESH_AXES}, each >= 1 or one -1 (the rest)",
    "rules": "a list of (logical axis, mesh axes) pairs",
}


def _fmt(number: float) -> str:
    if number == SEED_MAX:
        return "2**63 - 1"
    return "2**31 - 1" if number == STEP_MAX else f"{number:g}"


def _mesh_ok(value: Any) -> bool:
    if not isinstance(value, list | tuple) or len(value) != len(MESH_AXES):
        return False
    ints = all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    return ints and all(s >= 1 or s == -1 for s in value) and list(value).count(-1) <= 1


# --- constructors: one entry, one line -------------------------------------------------------


def Int(meaning, low=None, high=None, *, none="", zero="") -> Bound:  # noqa: N802
    return Bound(meaning, "int", low, high, none=none, zero=zero)


def Float(  # noqa: N802
    meaning, low=None, high=None, *, open_low=False, open_high=False, none="", zero=""
) -> Bound:
    return Bound(meaning, "float", low, high, open_low, open_high, none=none, zero=zero)


def Prob(meaning, *, open_low=False, open_high=False, none="", zero="") -> Bound:  # noqa: N802
    """A float in [0, 1], its ends open as said."""
    return Float(meaning, 0, 1, open_low=open_low, open_high=open_high, none=none, zero=zero)


def Enum(meaning, choices, *, none="") -> Bound:  # noqa: N802
    return Bound(meaning, "enum", choices=tuple(choices), none=none)


def Flag(meaning, *, none="") -> Bound:  # noqa: N802
    return Bound(meaning, "bool", none=none)


def Text(meaning, *, none="") -> Bound:  # noqa: N802
    return Bound(meaning, "text", none=none)


def Model(meaning, text, *, none="the preset's", zero="") -> Bound:  # noqa: N802
    """A `model.*` key: BertConfig checks it (`text` says its rule, for the docs)."""
    return Bound(meaning, "model", none=none, zero=zero, text=text)


def ListOf(meaning, item: Bound, words=()) -> Bound:  # noqa: N802
    return Bound(meaning, "list", item=item, words=tuple(words))
