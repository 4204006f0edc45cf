"""Training telemetry: model FLOPs and MFU, the JSONL + TensorBoard metrics writer, and the
one reader of what it writes (`read_metrics`).

Only process 0 writes; every other process gets a writer that does nothing.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from bert_jax.config import BertConfig

# JAX is imported where it is used: its readers (`read_metrics`, the FLOPs formulas) start
# without it, e.g. `python -m experiments.plot_metrics -h`.

# Dense bf16 peak FLOP/s of one JAX device (a TPU v2/v3 device is one core, later TPUs
# expose one device per chip), from the vendors' published figures.
PEAK_FLOPS_BY_DEVICE_KIND = {
    "TPU v2": 22.5e12,
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5": 459e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
}


def forward_flops_per_sequence(config: BertConfig, seq_len: int, predictions: int) -> float:
    """Matmul FLOPs of one forward pass of encoder + MLM (gathered) + NSP for one sequence."""
    h, v = config.hidden_size, config.vocab_size
    heads = 2 * h * h + 2 * predictions * (h * h + h * v) + 2 * h * 2  # pooler, MLM, NSP
    return _layers_flops(config, seq_len) + heads


def attended_pairs(config: BertConfig, layer: int, seq_len: int) -> int:
    """The (query, key) pairs layer `layer` scores in a row of `seq_len` tokens.

    A global layer: T x T. A local one (`local_attention_window` W, every layer but each
    `global_attention_every`-th): the pairs with |i - j| <= W // 2, the band clipped at
    the row's ends (at most W + 1 keys per query). That is the model-FLOPs convention of
    useful work: the einsum attention still computes all T x T scores and masks the rest,
    which a blocked or fused local attention does not.
    """
    t, window = seq_len, config.local_attention_window
    if config.is_global_layer(layer):
        return t * t
    reach = min(window // 2, t - 1)
    return t * (2 * reach + 1) - reach * (reach + 1)  # the band's T + 2 (T - 1) + ... terms


def _layers_flops(config: BertConfig, seq_len: int) -> int:
    """Matmul FLOPs of the encoder's layers for one sequence: QKV and the output projection,
    the feed-forward (GeGLU: an H x 2F input-and-gate kernel, then F x H), and the attention's
    scores and context over the pairs `attended_pairs` counts."""
    h, f, t = config.hidden_size, config.intermediate_size, seq_len
    ffn = (6 if config.feed_forward == "glu" else 4) * t * h * f
    return sum(
        8 * t * h * h + ffn + 4 * attended_pairs(config, layer, t) * h
        for layer in range(config.num_hidden_layers)
    )


def _encoder_flops(config: BertConfig, seq_len: int) -> int:
    """Matmul FLOPs of the E -> H projection (where E != H) and the layers, one sequence."""
    h, t = config.hidden_size, seq_len
    project = 2 * t * config.embedding_width * h if config.embedding_width != h else 0
    return project + _layers_flops(config, t)


def electra_forward_flops_per_sequence(
    config: BertConfig, generator: BertConfig, seq_len: int, predictions: int
) -> int:
    """Matmul FLOPs of one forward pass of ELECTRA (`bert_jax.electra`) for one sequence.

    The discriminator (`config`): its encoder and the RTD head (H -> H, H -> 1) at every
    position; the generator: its encoder and the MLM head at the `predictions` masked
    positions (Hg -> E, E -> V tied). Each encoder projects E -> its H where they differ.
    """
    t, e, v = seq_len, config.embedding_width, config.vocab_size
    h, g = config.hidden_size, generator.hidden_size
    rtd = 2 * t * h * h + 2 * t * h
    mlm = 2 * predictions * (g * e + e * v)
    return _encoder_flops(config, t) + rtd + _encoder_flops(generator, t) + mlm


def train_flops_per_step(
    config: BertConfig,
    batch: int,
    seq_len: int,
    predictions: int,
    generator: BertConfig | None = None,
):
    """Forward + backward (2x forward) model FLOPs of one training step.

    With `generator` (the "electra" objective), ELECTRA's: the generator's pass as well as
    the discriminator's. Its backward is a full one too: the sample is cut from the graph,
    but the generator's MLM loss trains all of it.
    """
    if generator is not None:
        forward = electra_forward_flops_per_sequence(config, generator, seq_len, predictions)
    else:
        forward = forward_flops_per_sequence(config, seq_len, predictions)
    return 3.0 * batch * forward


def measure_cpu_peak_flops(dtype: str = "float32", size: int = 1024, repeats: int = 5) -> float:
    """The FLOP/s of a large matmul on this host's CPU in `dtype` (f32 accumulation)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    matmul(a, a).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / float(np.median(times))


def peak_flops_per_device(dtype: str = "float32") -> float:
    """The peak of this host's devices: the published figure, or measured on CPU."""
    import jax

    device = jax.local_devices()[0]
    if device.platform == "cpu":
        # Fake CPU devices share the host's cores: the host peak is split among them.
        return measure_cpu_peak_flops(dtype) / jax.local_device_count()
    for kind, flops in PEAK_FLOPS_BY_DEVICE_KIND.items():
        if device.device_kind.startswith(kind):
            return flops
    return float("nan")


class MetricsPathError(OSError):
    """`metrics.jsonl` or `tensorboard/` in a workdir cannot be written; names the path."""


def check_metrics_paths(workdir: str) -> None:
    """Refuses a workdir whose `metrics.jsonl` or `tensorboard/` cannot be written (a
    directory where the file goes, a file where the directory goes, no write permission):
    found at the start of a run, not by the first metrics after the compile.

    Raises:
        MetricsPathError: naming the path and what is wrong with it.
    """
    if "://" in os.fspath(workdir):
        return  # an object store: no local modes to look at
    checks = (
        (os.path.join(workdir, "metrics.jsonl"), os.path.isfile, "a directory or other non-file"),
        (os.path.join(workdir, "tensorboard"), os.path.isdir, "a file, not a directory"),
    )
    for path, right_kind, wrong in checks:
        if not os.path.lexists(path):
            continue
        if not right_kind(path):
            raise MetricsPathError(f"{path} is {wrong}: the run could not write its metrics there")
        if not os.access(path, os.W_OK):
            raise MetricsPathError(f"{path} is not writable: the run could not write its metrics")


class MetricsWriter:
    """Appends scalars to `<workdir>/metrics.jsonl` and TensorBoard events (process 0).

    `last_step`: a resumed run repeats every step after its restored one, so records of
    later steps (what an interrupted run logged after its last checkpoint) are cut from an
    existing metrics.jsonl; the log then reads as one uninterrupted run. -1 cuts them all
    (a run from scratch); None keeps everything.
    """

    def __init__(self, workdir: str, enabled: bool | None = None, last_step: int | None = None):
        import jax

        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._jsonl = None
        self._summary = None
        if self.enabled:
            import tensorflow as tf  # TensorBoard's event writer

            # tf.io.gfile: a TPU run's workdir is a gs:// bucket, where `open` and
            # `os.makedirs` would silently write a local "gs:" directory instead.
            tf.io.gfile.makedirs(workdir)
            self._path = os.path.join(workdir, "metrics.jsonl")
            self._open(last_step)
            self._summary = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))

    def _open(self, last_step: int | None) -> None:
        import tensorflow as tf

        path = self._path
        before = tf.io.gfile.GFile(path).read() if tf.io.gfile.exists(path) else ""
        kept = records_through(before, last_step)
        if "://" in path:
            # Object stores cannot append: rewrite what a previous run logged, then
            # keep writing (each flush uploads the file so far; it stays small).
            if before:
                tf.io.gfile.remove(path)  # not every file system truncates on "w"
            self._jsonl = tf.io.gfile.GFile(path, "w")
            self._jsonl.write(kept)
            self._jsonl.flush()
        else:
            if kept != before:  # a new file renamed over the old: never half a log
                with open(f"{path}.tmp", "w", encoding="utf-8") as f:
                    f.write(kept)
                os.replace(f"{path}.tmp", path)
            self._jsonl = tf.io.gfile.GFile(path, "a")

    def cut(self, last_step: int) -> None:
        """Drops the records of steps after `last_step`: a run that rolls back to it logs
        those steps again (`bert_jax.rollback`)."""
        if self.enabled:
            self._jsonl.close()
            self._open(last_step)

    def write(self, step: int, scalars: dict[str, float], prefix: str = "train") -> None:
        if not self.enabled:
            return
        import tensorflow as tf

        record = {"step": int(step), "split": prefix, **{k: float(v) for k, v in scalars.items()}}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        with self._summary.as_default(step=int(step)):
            for name, value in scalars.items():
                tf.summary.scalar(f"{prefix}/{name}", float(value))
        self._summary.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._summary.close()
            self._jsonl = self._summary = None


def append_record(workdir: str, name: str, record: dict) -> None:
    """Appends `record` as a JSON line to `<workdir>/<name>` (process 0 only), for the rare
    events a run logs beside its metrics (an object store, which cannot append, gets the file
    written again)."""
    import jax

    if jax.process_index() != 0:
        return
    import tensorflow as tf

    path, line = os.path.join(workdir, name), json.dumps(record) + "\n"
    if "://" not in path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
        return
    before = tf.io.gfile.GFile(path).read() if tf.io.gfile.exists(path) else ""
    if before:
        tf.io.gfile.remove(path)  # not every file system truncates on "w"
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(records_through(before, None) + line)


def records_through(text: str, last_step: int | None) -> str:
    """The complete lines of a metrics.jsonl `text` (a killed writer may leave half a line),
    only those of steps up to `last_step` unless it is None."""
    lines = _complete_lines(text)
    if last_step is not None:
        lines = [line for line in lines if _step_of(line) <= last_step]
    return "".join(f"{line}\n" for line in lines)


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("-inf")  # not a record of ours: kept


def _complete_lines(text: str) -> list[str]:
    """The lines of `text` that end in a newline: what follows the last one is a write that a
    killed writer never finished."""
    return text.split("\n")[:-1]


# --- reading metrics.jsonl ------------------------------------------------------------------

# The splits a metrics.jsonl holds: `MetricsWriter.write`'s prefix in the pretraining loop.
SPLITS = ("train", "eval")


class MetricsFileError(ValueError):
    """A metrics.jsonl that is missing, empty or malformed (the message names the file and,
    for a malformed record, its line)."""


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics.jsonl (`MetricsWriter`), sorted by (step, split).

    Each record is `{"step": int, "split": one of SPLITS, <scalar name>: float, ...}`. For each
    (split, step) the last record wins: a resumed run logs the steps after its checkpoint
    again, and the last record is the one the finished run descends from. Blank lines are
    skipped, and so is text after the last newline: that is a record a killed writer was
    midway through (the writer drops it too when the run resumes, `records_through`), not
    corruption. Every complete line must be a record.

    Raises:
        MetricsFileError: the file is missing or holds no record, or a complete line is not a
            JSON object with an integer `step`, a `split` in SPLITS and numeric scalars (the
            message names the file and the line).
    """
    if not os.path.isfile(path):
        raise MetricsFileError(f"{path}: no such file (is its directory a pretraining workdir?)")
    with open(path, encoding="utf-8") as f:
        lines = _complete_lines(f.read())
    last: dict[tuple[str, int], dict] = {}
    for number, line in enumerate(lines, start=1):
        if line.strip():
            record = _parse_record(line, f"{path} line {number}")
            last[record["split"], record["step"]] = record
    if not last:
        raise MetricsFileError(f"{path}: no records")
    return sorted(last.values(), key=lambda r: (r["step"], r["split"]))


def _parse_record(line: str, where: str) -> dict:
    """One line of a metrics.jsonl as a record, checked; `where` names it in errors."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise MetricsFileError(
            f"{where}: not valid JSON ({e.msg}): {line.strip()[:80]!r}"
        ) from None
    if not isinstance(record, dict):
        raise MetricsFileError(f"{where}: expected a JSON object, got {line.strip()[:80]!r}")
    step, split = record.pop("step", None), record.pop("split", None)
    if not isinstance(step, int) or isinstance(step, bool):
        raise MetricsFileError(f"{where}: 'step' must be an integer, got {step!r}")
    if split not in SPLITS:
        raise MetricsFileError(f"{where}: 'split' must be one of {SPLITS}, got {split!r}")
    for name, value in record.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise MetricsFileError(f"{where}: {name!r} is not a number: {value!r}")
    return {"step": step, "split": split, **{k: float(v) for k, v in record.items()}}
