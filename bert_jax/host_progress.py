"""A progress count of steps whose results are on the host, not of steps dispatched.

JAX dispatches a jitted step and returns at once: a bar advanced after each call runs ahead
of the device (by as many steps as dispatch can queue), shows an optimistic rate and ETA
and then waits at 100%. `FinishedSteps` holds each step's output (any array it returned)
and advances the count past those that are ready, without waiting; `drain` waits for the
rest at the end.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import jax


class FinishedSteps:
    """Calls `advance(1)` once per queued step, in order, when its output is ready."""

    def __init__(self, advance: Callable[[int], object]):
        self.advance = advance
        self.pending: collections.deque = collections.deque()

    def add(self, output) -> None:
        """Queues a dispatched step's output (a jax.Array or a pytree of them) and counts
        every queued step that has finished since."""
        self.pending.append(jax.tree.leaves(output))
        self.poll()

    def poll(self) -> None:
        while self.pending and all(_ready(leaf) for leaf in self.pending[0]):
            self.pending.popleft()
            self.advance(1)

    def drain(self) -> None:
        """Waits for every queued step, counting each as it finishes."""
        while self.pending:
            jax.block_until_ready(self.pending.popleft())
            self.advance(1)


def _ready(leaf) -> bool:
    is_ready = getattr(leaf, "is_ready", None)  # host values are ready
    return is_ready() if is_ready is not None else True
