r"""A few train steps on an 8-device mesh, in one process or as one of two processes.

`test_multihost.py` launches it three times at once: once as a plain process owning 8
fake CPU devices (the reference), and twice as processes 0 and 1 of a `jax.distributed`
system (gloo collectives) owning 4 devices each. Every process feeds the rows of the same
global batches that its devices hold, runs the jitted train step on each requested mesh,
and writes its losses to `<output_dir>/losses_<process_index>.json`. The state after
the last mesh's run is then saved with `checkpointing.save`, carrying every process's
data position.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/multihost_driver.py \
      --num_processes=2 --coordinator_address=127.0.0.1:PORT --process_id=0 \
      --batches=batches.npz --model_config=model.json --output_dir=OUT \
      --mesh_shapes=8,1,1 --mesh_shapes=1,2,4
"""

from __future__ import annotations

import json
import os
import sys

import jax
import ml_collections
import numpy as np

STEPS = 5
BATCH_SIZE = 8


def optimizer_config() -> ml_collections.ConfigDict:
    """The BERT AdamW of the experiments, with a short warmup so 5 steps move the params."""
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config().optimizer
    config.update(dict(learning_rate=5e-3, warmup_steps=2))
    return config


def setup(mesh, model_config, seq_len: int, predictions: int):
    """(model, optimizer, schedule, example inputs, abstract state, state shardings) on `mesh`."""
    from bert_jax import optim, train
    from bert_jax.heads import BertForPreTraining
    from bert_jax.train_state import state_shardings

    model = BertForPreTraining(model_config)
    config = optimizer_config()
    tx = optim.make_optimizer(config, 20)
    schedule = optim.learning_rate_schedule(config, 20)
    inputs = train.init_inputs(train.example_batch(BATCH_SIZE, seq_len, predictions))
    abstract, shardings = state_shardings(model, tx, mesh, inputs)
    return model, tx, schedule, inputs, abstract, shardings


def run_trajectory(mesh, batches: list[dict[str, np.ndarray]], model_config):
    """Trains one step per global batch from a seed-0 init; returns (losses, state)."""
    from bert_jax import sharding, train
    from bert_jax.train_state import sharded_state

    seq_len = batches[0]["input_ids"].shape[1]
    predictions = batches[0]["masked_lm_positions"].shape[1]
    model, tx, schedule, inputs, _, _ = setup(mesh, model_config, seq_len, predictions)
    state, shardings = sharded_state(model, tx, mesh, inputs, rng=jax.random.key(0))
    step_fn, _ = train.jit_steps(model, tx, schedule, mesh, shardings)
    rows = sharding.process_rows(mesh, BATCH_SIZE)
    losses = []
    with sharding.activation_context(mesh):
        for batch in batches:
            local = {k: v[rows] for k, v in batch.items()}  # this process's rows only
            state, metrics = step_fn(state, sharding.global_batch(local, mesh), jax.random.key(1))
            losses.append(float(metrics["loss"]))
    return losses, state


def load_batches(path: str) -> list[dict[str, np.ndarray]]:
    """The global batches the test wrote: arrays named `<feature>_<step>` in one .npz."""
    with np.load(path) as data:
        steps = sorted({int(name.rsplit("_", 1)[1]) for name in data.files})
        return [
            {name.rsplit("_", 1)[0]: data[name] for name in data.files if name.endswith(f"_{s}")}
            for s in steps
        ]


def start_processes(flag_values) -> None:
    """`jax.distributed` over gloo when --num_processes > 1 (before the backend starts), as
    the entry points' --coordinator_address starts it (`bert_jax.distributed`)."""
    if flag_values.num_processes > 1:
        from bert_jax import distributed

        distributed.initialize(flag_values.coordinator_address, flag_values.num_processes,
                               flag_values.process_id)  # fmt: skip


def main(argv: list[str]) -> None:
    from absl import flags

    flags.DEFINE_integer("num_processes", 2, "1: a plain single-process run (the reference).")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
    flags.DEFINE_integer("process_id", 0, "This process's index.")
    flags.DEFINE_string("batches", None, ".npz of the global batches (see load_batches).")
    flags.DEFINE_string("model_config", None, "JSON of the BertConfig fields.")
    flags.DEFINE_string("output_dir", None, "Where losses_<index>.json and checkpoints/ go.")
    flags.DEFINE_multi_string("mesh_shapes", ["8,1,1"], "(data, fsdp, tensor), one per run.")
    flags.mark_flags_as_required(["batches", "model_config", "output_dir"])
    flag_values = flags.FLAGS
    flag_values(argv)

    start_processes(flag_values)
    from bert_jax import checkpointing, pretraining_input, sharding
    from bert_jax.config import BertConfig

    with open(flag_values.model_config, encoding="utf-8") as f:
        model_config = BertConfig(**json.load(f))
    batches = load_batches(flag_values.batches)
    index = jax.process_index()
    results = {}
    for shape_text in flag_values.mesh_shapes:
        mesh = sharding.create_mesh(tuple(int(s) for s in shape_text.split(",")))
        losses, state = run_trajectory(mesh, batches, model_config)
        rows = sharding.process_rows(mesh, BATCH_SIZE)
        results[shape_text] = {"losses": losses, "rows": [rows.start, rows.stop]}
    with open(os.path.join(flag_values.output_dir, f"losses_{index}.json"), "w") as f:
        json.dump(results, f)

    manager = checkpointing.make_manager(os.path.join(flag_values.output_dir, "checkpoints"))
    position = {"epoch": 0, "batch_in_epoch": len(batches), "process": index}
    positions = pretraining_input.gather_positions(position)
    checkpointing.save(manager, len(batches), state, positions, {"driver": "multihost"})
    manager.wait_until_finished()
    manager.close()
    if flag_values.num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv)
