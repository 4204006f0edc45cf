"""One row of `benchmarks.accelerator_bench`, in a process of its own: build, compile, time.

`python -m benchmarks.accelerator_rows SPEC_JSON RESULT_JSON` runs the row `SPEC_JSON` describes
(our pretraining step, the torch peer's, or a probe of the device) and writes what it measured,
or why it could not ("oom", "error", "skipped"), to RESULT_JSON. The orchestrator turns times
into rates; a row only reports times, counts and memory.

A process per row, because `peak_bytes_in_use` never goes down within a process (the figure is
then the row's own), a row that runs out of device memory leaves the next a clean device, and
a row that outlives the time budget can be killed. Framework imports sit inside the runner that
needs them: the peer's process loads torch's CUDA libraries alone, ours jax's alone.

Nothing here imports tensorflow or ml_collections (an accelerator machine's Python has neither):
the step is built from `BertConfig`, the heads, the losses, the project's optimizer and
`train_state.make_step`, as `bert_jax.train` builds it.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np

from data_pipelines import packing, records

CLS, SEP, MASK = 101, 102, 103  # BERT's uncased vocab ids of the special tokens
FIRST_WORD_ID = 1000  # word ids are drawn from [FIRST_WORD_ID, vocab_size)
MIN_LENGTH = 8  # the shortest synthetic instance
# `bert_jax.train`'s MODEL_INPUTS and PACKING_INPUTS: that module reads ml_collections configs
# and cannot be imported here.
MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
PACKING_INPUTS = ("position_ids", "instance_ids", "cls_positions")
PROFILE_STEPS = 3  # steps traced after the timed ones, where a row is profiled
PROFILE_LINES, PROFILE_OPS = 4, 15  # busiest timelines kept, busiest ops of each


# --- synthetic batches ---------------------------------------------------------------------


def synthetic_instances(
    count: int,
    seq_len: int,
    predictions: int,
    vocab_size: int,
    full_fraction: float,
    seed: int,
    masked_fraction: float = 0.15,
    pairs: bool = True,
) -> dict[str, np.ndarray]:
    """`count` masked pretraining instances (`records.BATCH` layout, one per row).

    A `full_fraction` of them fill the row (long documents); the others are uniform on
    [MIN_LENGTH, T] tokens (documents' tails, the short-sequence targets), which is padding
    for an unpacked row and room for a packed one. Each is `[CLS] A [SEP] B [SEP]` of random
    word ids (`pairs`; else one segment, `[CLS] A [SEP]`, all segment ids 0, NSP labels 0, as a
    model without token types or NSP reads) with `masked_fraction` of its tokens masked (at
    most `predictions`).
    """
    rng = np.random.default_rng(seed)
    short = rng.integers(min(MIN_LENGTH, seq_len), seq_len + 1, size=count)
    lengths = np.where(rng.random(count) < full_fraction, seq_len, short)
    spec = records.batch_spec(count, seq_len, predictions)
    out = {name: np.zeros(shape, dtype) for name, (shape, dtype) in spec.items()}
    for i, length in enumerate(lengths):
        ids = rng.integers(FIRST_WORD_ID, vocab_size, size=length)
        # A is ids[1:split], its [SEP] at split; one segment: A runs to the end.
        split = int(rng.integers(2, length - 1)) if pairs else length - 1
        ids[0], ids[split], ids[length - 1] = CLS, SEP, SEP
        words = np.setdiff1d(np.arange(1, length - 1), [split])
        count_masked = min(predictions, len(words), max(1, round(masked_fraction * length)))
        where = np.sort(rng.choice(words, size=count_masked, replace=False))
        out["masked_lm_positions"][i, :count_masked] = where
        out["masked_lm_ids"][i, :count_masked] = ids[where]
        out["masked_lm_weights"][i, :count_masked] = 1.0
        ids[where] = MASK
        out["input_ids"][i, :length] = ids
        out["input_mask"][i, :length] = 1
        if pairs:
            out["segment_ids"][i, split + 1 : length] = 1
            out["next_sentence_labels"][i] = rng.integers(0, 2)
    return out


def make_batch(spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """The row's batch: `batch` instances, one per row, or as many as first fit packs into
    `batch` rows (`data_pipelines.packing`, at most `max_instances_per_row` each)."""
    rows, slots = spec["batch"], spec["max_instances_per_row"]
    # One more instance than the rows can hold: a packed batch always ends full.
    count = rows * slots + 1 if spec["packed"] else rows
    instances = synthetic_instances(
        count,
        spec["seq_len"],
        spec["predictions"],
        spec["config"]["vocab_size"],
        spec["full_fraction"],
        spec["seed"],
        spec["masked_fraction"],
        pairs=spec["objective"] == "mlm_nsp",  # sentence pairs where NSP trains
    )
    if not spec["packed"]:
        return instances
    sizes = dict(
        num_rows=rows,
        max_seq_length=spec["seq_len"],
        max_predictions_per_seq=spec["predictions"],
        max_instances_per_row=slots,
    )
    tokens, predictions = packing.instance_sizes(instances)
    layout, _ = packing.first_fit(tokens, predictions, **sizes)
    return packing.pack_rows(instances, layout, **sizes)


def batch_counts(batch: dict[str, np.ndarray]) -> dict[str, int]:
    """Instances and real (non-padding) tokens of a batch, packed or not."""
    if "instance_weights" in batch:
        instances = int((batch["instance_weights"] > 0).sum())
    else:
        instances = len(batch["input_ids"])
    return dict(instances=instances, real_tokens=int((batch["input_mask"] > 0).sum()))


def failure(exc: BaseException) -> dict[str, Any]:
    """The result of a row that raised: "oom" when the device ran out of memory."""
    text = f"{type(exc).__name__}: {exc}"
    oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
    return {"status": "oom" if oom else "error", "error": text[:2000]}


# --- the runners ---------------------------------------------------------------------------


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """The platform, device kind and versions this machine's jax sees."""
    import jax

    device = jax.devices()[0]
    return dict(
        status="ok",
        platform=device.platform,
        device_kind=device.device_kind,
        device_count=jax.device_count(),
        jax=jax.__version__,
        python=sys.version.split()[0],
    )


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Our pretraining step (the row's objective: MLM + NSP, or MLM alone; clipped BERT AdamW)
    on one device, timed."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    from bert_jax import optim, train_state
    from bert_jax.config import BertConfig
    from bert_jax.heads import BertForPreTraining
    from bert_jax.losses import pretraining_loss

    start = time.perf_counter()
    config = BertConfig(**spec["config"])
    # `bert_jax.train.pretraining_model`: the NSP head for "mlm_nsp" only.
    model = BertForPreTraining(config, next_sentence=spec["objective"] == "mlm_nsp")
    host_batch = make_batch(spec)
    batch = {k: jnp.asarray(v) for k, v in host_batch.items()}

    def apply(params, batch, **kwargs):
        packed = {k: batch[k] for k in PACKING_INPUTS if k in batch}
        return model.apply(
            {"params": params}, *(batch[k] for k in MODEL_INPUTS), **packed, **kwargs
        )

    def loss_fn(params, batch, dropout_rng):  # `bert_jax.train.train_loss`
        outputs = apply(params, batch, deterministic=False, rngs={"dropout": dropout_rng})
        return pretraining_loss(outputs, batch)

    # The recipe's optimizer (experiments/configs/bert_base.py): the original AdamW after
    # global-norm clipping at 1.0, lr 1e-4 with 10k warmup steps over 1M. ModernBERT rows too:
    # the optimizer's cost is one pass over the params whatever its hyper-parameters.
    schedule = optim.warmup_polynomial_decay(1e-4, 10_000, 1_000_000)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optim.bert_adamw(schedule, 0.01))
    step = jax.jit(train_state.make_step(loss_fn, tx, schedule), donate_argnums=0)
    init_rng, dropout_rng = train_state.run_keys(spec["seed"], spec["prng_impl"])
    example = {k: v[:1] for k, v in batch.items()}  # the params do not depend on the batch

    def init(rng):
        variables = model.init(
            rng,
            *(example[k] for k in MODEL_INPUTS),
            **{k: example[k] for k in PACKING_INPUTS if k in example},
        )
        params = nn.unbox(variables["params"])
        return train_state.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

    state = jax.block_until_ready(jax.jit(init)(init_rng))
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = step.lower(state, batch, dropout_rng).compile()
    compile_s = time.perf_counter() - start

    def run_step(state):
        state, metrics = compiled(state, batch, dropout_rng)
        return jax.block_until_ready((state, metrics))

    state, metrics = run_step(state)  # the first step: warm-up, and the loss of fresh weights
    first_loss = float(metrics["loss"])
    for _ in range(spec["warmup"] - 1):
        state, metrics = run_step(state)
    times = []
    for _ in range(spec["steps"]):
        begin = time.perf_counter()
        state, metrics = run_step(state)
        times.append(time.perf_counter() - begin)
    last_loss = float(metrics["loss"])
    profile = None
    if spec.get("profile_path"):
        profile = profile_steps(run_step, state, spec["profile_path"])
    if not (np.isfinite(first_loss) and np.isfinite(last_loss)):
        return dict(status="error", error=f"non-finite loss: first {first_loss}, last {last_loss}")
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return dict(
        status="ok",
        times=times,
        build_s=build_s,
        compile_s=compile_s,
        first_loss=first_loss,
        last_loss=last_loss,
        peak_bytes=stats.get("peak_bytes_in_use"),
        compiled_bytes=_compiled_bytes(compiled),
        profile=profile,
        device_kind=device.device_kind,
        versions={"jax": jax.__version__},
        **batch_counts(host_batch),
    )


def profile_steps(run_step, state, trace_path: str) -> dict[str, Any]:
    """Traces `PROFILE_STEPS` more steps with jax's profiler; the trace (Perfetto's JSON)
    is copied to `trace_path` and summarised (`summarise_trace`)."""
    import jax

    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            for _ in range(PROFILE_STEPS):
                state, _ = run_step(state)
        pattern = os.path.join(log_dir, "plugins", "profile", "*", "perfetto_trace.json.gz")
        (trace,) = glob.glob(pattern)
        shutil.copyfile(trace, trace_path)
    return summarise_trace(trace_path, PROFILE_STEPS)


def summarise_trace(path: str, steps: int) -> dict[str, Any]:
    """Where a profiled step's time went: the busiest timelines of the device (of the host,
    where no device has one: a CPU run), each with its total and its busiest ops, in
    milliseconds per step. A timeline is a trace thread: a GPU stream, or XLA's op line."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {}  # ("process", pid) or ("thread", pid, tid) -> its name
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            key = (
                ("process", e["pid"])
                if e["name"] == "process_name"
                else ("thread", e["pid"], e["tid"])
            )
            names[key] = e["args"]["name"]
    processes = {key[1]: name for key, name in names.items() if key[0] == "process"}
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
    wanted = devices or set(processes)
    busy: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in wanted:
            thread = names.get(("thread", e["pid"], e.get("tid")), str(e.get("tid")))
            busy[f"{processes[e['pid']]} {thread}"][e["name"][:160]] += float(e.get("dur", 0))
    lines = sorted(busy.items(), key=lambda item: -sum(item[1].values()))[:PROFILE_LINES]
    return {
        "steps": steps,
        "lines": [
            {
                "line": line,
                "ms_per_step": sum(ops.values()) / steps / 1e3,
                "ops": [[name, us / steps / 1e3] for name, us in ops.most_common(PROFILE_OPS)],
            }
            for line, ops in lines
        ],
    }


def _compiled_bytes(compiled) -> dict[str, int] | None:
    """The step's buffers as the compiler assigned them (arguments, outputs, temporaries)."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # not every backend answers
        return None
    if analysis is None:
        return None
    names = ("argument", "output", "alias", "temp", "generated_code")
    return {n: int(getattr(analysis, f"{n}_size_in_bytes", 0)) for n in names}


def run_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """transformers' PyTorch BertForPreTraining (ModernBertForMaskedLM for a ModernBERT row),
    bf16 autocast, fused torch AdamW, timed.

    `benchmarks.peers.TorchRunner` (the peer of `bench_model`): on the GPU when torch sees
    one; the MLM loss through -100 labels, as transformers computes it (BERT: logits at every
    position; ModernBERT: at the labelled ones). Unpacked rows only: transformers has no
    packed attention.
    """
    try:
        import torch
        import transformers  # noqa: F401 (TorchRunner imports it; a missing one skips here)
    except ImportError as e:
        return dict(status="skipped", error=f"no torch/transformers here ({e})")
    from benchmarks import peers

    start = time.perf_counter()
    host_batch = make_batch(spec)
    dims = spec["config"]
    model = dict(
        family=spec["family"],
        vocab_size=dims["vocab_size"],
        hidden_size=dims["hidden_size"],
        num_layers=dims["num_hidden_layers"],
        num_heads=dims["num_attention_heads"],
        intermediate_size=dims["intermediate_size"],
        max_position_embeddings=dims["max_position_embeddings"],
        local_attention_window=dims["local_attention_window"],
        global_attention_every=dims["global_attention_every"],
    )
    case = dict(name="train", mode="train", dtype="bfloat16")
    runner = peers.TorchRunner(dict(model=model, lr=1e-4, cases=[case]), host_batch)
    build_s = time.perf_counter() - start  # includes the first step
    runner.run("train", spec["warmup"] - 1)
    times = runner.run("train", spec["steps"])
    cuda = runner.device.type == "cuda"
    return dict(
        status="ok",
        times=times,
        build_s=build_s,
        compile_s=None,  # eager: nothing is compiled ahead
        first_loss=runner.first_loss["train"],
        peak_bytes=torch.cuda.max_memory_allocated() if cuda else None,
        device_kind=runner.versions["device"],
        versions=runner.versions,
        **batch_counts(host_batch),
    )


RUNNERS = {"probe": probe, "ours": run_ours, "torch": run_torch}


def main(argv: list[str]) -> int:
    """Runs the row of argv[1] (JSON) and writes its result to argv[2]."""
    spec, result_path = json.loads(argv[1]), argv[2]
    try:
        result = RUNNERS[spec["peer"]](spec)
    except Exception as e:  # the row's failure is its result; the next row runs on
        result = failure(e)
        traceback.print_exc()  # into the row's log
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


USAGE = (
    "usage: python -m benchmarks.accelerator_rows SPEC_JSON RESULT_JSON  (accelerator_bench "
    "starts it)"
)


def check_argv(argv: list[str]) -> None:
    """`--help`/`-h`: the usage and this docstring, exit 0; anything but a JSON object and a
    result path: the usage and what is wrong in one line, exit 2 (not a traceback)."""
    if argv[1:] in (["--help"], ["-h"]):
        print(f"{USAGE}\n\n{__doc__}")
        sys.exit(0)
    error = None
    if len(argv) != 3:
        error = f"expected two arguments, SPEC_JSON and RESULT_JSON; got {len(argv) - 1}"
    else:
        try:
            if not isinstance(json.loads(argv[1]), dict):
                error = "SPEC_JSON is not a JSON object"
        except json.JSONDecodeError as e:
            error = f"SPEC_JSON is not JSON ({e})"
    if error:
        sys.stderr.write(f"{USAGE}\naccelerator_rows: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    check_argv(sys.argv)
    sys.exit(main(sys.argv))
