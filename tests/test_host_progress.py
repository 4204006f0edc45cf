"""Progress counts steps whose outputs are ready on the host (`bert_jax.host_progress`),
so a fine-tuning bar's rate and ETA are the device's, not dispatch's."""

import jax
import jax.numpy as jnp

from bert_jax.host_progress import FinishedSteps


class Pending:
    """An output whose readiness the test decides (as a jax.Array's `is_ready`)."""

    def __init__(self):
        self.ready = False

    def is_ready(self) -> bool:
        return self.ready

    def block_until_ready(self):
        self.ready = True
        return self


def test_counts_only_finished_steps_in_order():
    counted = []
    finished = FinishedSteps(counted.append)
    first, second = Pending(), Pending()
    finished.add({"loss": first})
    finished.add({"loss": second, "accuracy": jnp.ones(())})
    assert counted == []  # both dispatched, neither done
    second.ready = True
    finished.poll()
    assert counted == []  # the second waits for the first: steps finish in order
    first.ready = True
    finished.poll()
    assert counted == [1, 1]


def test_drain_waits_for_the_rest():
    counted = []
    finished = FinishedSteps(counted.append)
    outputs = [Pending() for _ in range(3)]
    for output in outputs:
        finished.add(output)
    finished.drain()
    assert len(counted) == 3 and all(o.ready for o in outputs)


def test_a_real_step_is_counted_once_its_result_is_on_the_host():
    counted = []
    finished = FinishedSteps(counted.append)
    step = jax.jit(lambda x: x @ x)
    x = jnp.ones((64, 64))
    for _ in range(4):
        x = step(x)
        finished.add(x)
    finished.drain()
    assert sum(counted) == 4 and not finished.pending
