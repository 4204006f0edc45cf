r"""Reference pretraining with transformers' PyTorch `BertForPreTraining`, exported for our tools.

The same config file and overrides as `experiments.pretrain`, the same TFRecords, then our
fine-tuning script on the export:

  python -m benchmarks.pretrain_reference --config=experiments/configs/bert_tiny_cpu.py \
      --output_dir=workdirs/tiny_torch_reference [--config.key=value ...]
  python -m experiments.finetune_classification \
      --config=experiments/configs/finetune_tiny_polarity.py \
      --config.init_from=workdirs/tiny_torch_reference --workdir=workdirs/demo/polarity_torch

What is the same as `experiments.pretrain` (`bert_jax.train`): the architecture (our
`BertConfig` from `config.model` and the vocab file, handed to transformers through its HF
JSON: sizes, dropout, positions, segments, initializer_range, exact-erf GELU, tied MLM
decoder); the loss (MLM cross-entropy at `masked_lm_positions` weighted by
`masked_lm_weights`, Σ w·CE / (Σ w + 1e-5), plus mean NSP cross-entropy for
`config.objective="mlm_nsp"` only, as `bert_jax.losses`); AdamW with weight decay off
LayerNorm and biases (`config.optimizer.name="adamw_bias_corrected"` is exactly
`torch.optim.AdamW`); global-norm clipping; the schedule (linear warmup, then polynomial
decay counted from step 0, as the original: a `LambdaLR`, because transformers'
`get_*_schedule_with_warmup` decay from the end of warmup); gradient accumulation; and the
data. The loss is computed here because `BertForPreTraining(labels=...)` averages the MLM
loss over tokens, unweighted. Batches come from our own pipeline
(`data_pipelines.input_pipeline`) with the same files, seed, shuffle buffer and batch size,
and with `config.data.dynamic_masking` the same masking
(`bert_jax.pretraining_input.masking_config`), so a single-process run sees exactly the
batches, in the same order and with the same masks, that a single-process
`experiments.pretrain` run sees (held-out: the same `seed=0` stream, restarted per
evaluation). A multi-host run of ours splits files per host, so its batches differ.

--output_dir receives config.json + model.safetensors (`save_pretrained`), vocab.txt and
tokenizer_config.json, which `bert_jax.convert` and transformers both read, and the run's
metrics.jsonl (same records as ours) and TensorBoard events. It is written beside and
renamed into place only after `bert_jax.convert.load_pretrained` has imported it and our
model's logits on one batch match torch's.

Differences that remain:
- With `config.optimizer.name="adamw"` (the original BERT AdamW, `bert_jax.optim`, no bias
  correction) torch's AdamW still corrects the bias. For a steady gradient the original's
  update is larger by (1-β1^t)/sqrt(1-β2^t): with β 0.9/0.999 that is 3.2 at step 1, 2.3 at
  200, 1.26 at 1000, 1.03 at 3000 (eps aside), so the two agree only after a few thousand
  steps: short runs differ most.
- Init: transformers draws N(0, initializer_range) and zeroes the [PAD] embedding row; ours
  is TF1's truncated normal (cut at 2σ, std 0.88·initializer_range). Different seeds anyway.
- `config.objective="mlm"`: transformers' model keeps its pooler and NSP head, untrained
  (no gradient reaches them), so the export loads as ours does.
- Only the "mlm_nsp" and "mlm" objectives; unpacked batches (`config.data.pack` is ignored).
- Dropout masks come from torch's generator (`torch.manual_seed(config.seed)`), not ours.
- f32 only (`config.model.dtype` bf16 is ignored); no checkpoints or resume.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags
from tqdm import tqdm

from bert_jax.config import BertConfig, objective
from bert_jax.convert.export import write_tokenizer_config
from data_pipelines import cli

# torch, transformers and JAX are imported where they are used: `-h` answers without them.
if TYPE_CHECKING:
    import torch
    import transformers

FLAGS = flags.FLAGS


def pretraining_loss(
    model: transformers.BertForPreTraining,
    batch: dict[str, torch.Tensor],
    next_sentence: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss = MLM + NSP (MLM alone without `next_sentence`), exactly as
    `bert_jax.losses.pretraining_loss`."""
    import torch
    import torch.nn.functional as F

    out = model.bert(
        input_ids=batch["input_ids"],
        attention_mask=batch["input_mask"],
        token_type_ids=batch["segment_ids"],
    )
    sequence, pooled = out.last_hidden_state, out.pooler_output  # (B, T, H), (B, H)
    # BertForPreTraining.forward is `cls(bert(...))` and the MLM head is position-wise, so
    # gathering before the head equals gathering `prediction_logits` at the positions, but
    # spares the (B, T, V) logits, which ours never computes either.
    index = batch["masked_lm_positions"][..., None].expand(-1, -1, sequence.shape[-1])
    mlm_logits, nsp_logits = model.cls(torch.gather(sequence, 1, index), pooled)  # (B, P, V)
    labels = batch["masked_lm_ids"]
    weights = batch["masked_lm_weights"]
    per_token = F.cross_entropy(mlm_logits.transpose(1, 2), labels, reduction="none")  # (B, P)
    denominator = weights.sum() + 1e-5
    mlm_loss = (per_token * weights).sum() / denominator
    mlm_accuracy = ((mlm_logits.argmax(-1) == labels) * weights).sum() / denominator
    if not next_sentence:  # objective "mlm": ours has no NSP head, the MLM term is the loss
        metrics = {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_accuracy": mlm_accuracy}
        return mlm_loss, {k: v.detach() for k, v in metrics.items()}
    nsp_labels = batch["next_sentence_labels"]
    nsp_loss = F.cross_entropy(nsp_logits, nsp_labels)
    nsp_accuracy = (nsp_logits.argmax(-1) == nsp_labels).float().mean()
    loss = mlm_loss + nsp_loss
    metrics = {
        "loss": loss,
        "mlm_loss": mlm_loss,
        "mlm_accuracy": mlm_accuracy,
        "nsp_loss": nsp_loss,
        "nsp_accuracy": nsp_accuracy,
    }
    return loss, {k: v.detach() for k, v in metrics.items()}


def make_optimizer(
    model: torch.nn.Module, config: ml_collections.ConfigDict, num_updates: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW + the original schedule, from the `config.optimizer` block ours reads."""
    import torch

    if config.name not in ("adamw", "adamw_bias_corrected"):
        raise ValueError(
            f"--config.optimizer.name={config.name!r}: only 'adamw' and 'adamw_bias_corrected' "
            "are mirrored (both by torch.optim.AdamW, which corrects the bias)"
        )
    if config.get("schedule", "linear") != "linear":
        raise ValueError(
            f"--config.optimizer.schedule={config.schedule!r}: only 'linear' (the original's "
            "warmup and polynomial decay) is mirrored"
        )
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # tied tensors are listed once
        (no_decay if "LayerNorm" in name or name.endswith("bias") else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay}],
        lr=config.learning_rate,
        betas=(config.b1, config.b2),
        eps=config.eps,
        weight_decay=0.0,
    )
    warmup, power = config.warmup_steps, config.get("decay_power", 1.0)

    def multiplier(step: int) -> float:
        # `bert_jax.optim.warmup_polynomial_decay`: the decay counts from step 0, not from
        # the end of warmup as transformers' get_*_schedule_with_warmup do.
        if step < warmup:
            return step / max(warmup, 1)
        return (1.0 - min(step, num_updates) / num_updates) ** power

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def batches(
    config: ml_collections.ConfigDict, files: str, seed: int, mask_config=None
) -> Iterator[dict]:
    """Our pipeline's numpy batches, as `bert_jax.train` builds them on one process.

    Args:
        config: the pretraining config.
        files: TFRecord globs.
        seed: fixes the file order, shuffling and dynamic masks.
        mask_config: `bert_jax.pretraining_input.masking_config` of the config (None for
            static-masked records).
    """
    from data_pipelines import input_pipeline

    data = config.data
    return input_pipeline.make_pretraining_dataset(
        files,
        global_batch_size=config.global_batch_size,
        max_seq_length=data.max_seq_length,
        max_predictions_per_seq=data.max_predictions_per_seq,
        seed=seed,
        # Given, so that jax is not asked: starting its backend on a GPU machine would
        # preallocate most of the memory torch needs.
        process_index=0,
        process_count=1,
        shuffle_buffer=data.shuffle_buffer,
        dynamic_masking=data.dynamic_masking,
        masking_config=mask_config,
    )


def to_torch(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """int32 ids/masks/labels -> int64 (embedding and gather indices), weights stay f32."""
    import torch

    return {
        k: torch.tensor(v, dtype=torch.float32 if v.dtype.kind == "f" else torch.int64).to(device)
        for k, v in batch.items()
    }


def evaluate(
    model: transformers.BertForPreTraining,
    config: ml_collections.ConfigDict,
    device: torch.device,
    mask_config=None,
) -> dict[str, float]:
    """Mean held-out metrics over `config.eval_steps` batches, without dropout."""
    import torch

    with torch.no_grad():
        model.eval()
        # Ours: seed 0, from the start (so dynamic masks are the same at every evaluation).
        stream = batches(config, config.data.eval_files, seed=0, mask_config=mask_config)
        next_sentence = objective(config) == "mlm_nsp"
        totals = [
            pretraining_loss(model, to_torch(next(stream), device), next_sentence)[1]
            for _ in range(config.eval_steps)
        ]
        model.train()
        return {k: float(torch.stack([t[k] for t in totals]).mean()) for k in totals[0]}


def check_import(
    work_dir: str, model: transformers.BertForPreTraining, batch: dict[str, np.ndarray]
) -> int:
    """Imports the export with `bert_jax.convert`, compares logits; returns the param count."""
    import jax
    import torch

    from bert_jax import convert
    from bert_jax.heads import BertForPreTraining

    cfg, params, _ = convert.load_pretrained(work_dir, model="pretraining")
    ours = BertForPreTraining(cfg)
    keys = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
    with jax.default_matmul_precision("float32"):
        out = ours.apply({"params": params}, *(batch[k] for k in keys))
    inputs = to_torch(batch, torch.device("cpu"))
    model.cpu().eval()
    with torch.no_grad():  # the plain forward: logits at every position, then gathered
        theirs = model(inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
    rows = torch.arange(len(batch["input_ids"]))[:, None]  # (B, 1)
    mlm = theirs.prediction_logits[rows, inputs["masked_lm_positions"]]  # (B, P, V)
    diff = max(
        np.max(np.abs(np.asarray(out.mlm_logits) - mlm.numpy())),
        np.max(np.abs(np.asarray(out.nsp_logits) - theirs.seq_relationship_logits.numpy())),
    )
    logging.info("bert_jax imports %s: max |logit difference| %.2e", work_dir, diff)
    if diff > 1e-3:
        raise ValueError(f"{work_dir}: logits differ by {diff:.3g} after import")
    return sum(int(np.size(x)) for x in jax.tree.leaves(params))


def run(config: ml_collections.ConfigDict, output_dir: str, overwrite: bool = False) -> dict:
    """Pretrains, evaluates and exports to `output_dir`; returns the last metrics."""
    import torch
    import transformers

    from bert_jax.pretraining_input import masking_config
    from bert_jax.telemetry import MetricsWriter
    from bert_jax.train import model_config
    from data_pipelines.tokenization import load_tokenizer

    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir} exists; pass --overwrite")
    if config.get("resume_from") or config.get("init_from"):
        raise ValueError("resume_from / init_from: the reference always starts from scratch")
    if objective(config) not in ("mlm_nsp", "mlm"):
        raise ValueError(
            f"--config.objective={objective(config)!r}: only 'mlm_nsp' and 'mlm' are mirrored "
            "(ELECTRA's: benchmarks.electra_reference)"
        )
    next_sentence = objective(config) == "mlm_nsp"
    data = config.data
    tokenizer = load_tokenizer(data.vocab_file, do_lower_case=data.do_lower_case)
    mask_config = masking_config(config, tokenizer)  # None for static-masked records
    cfg: BertConfig = model_config(config, tokenizer.vocab_size)  # one place, as ours
    if cfg.dtype != "float32":
        logging.warning("config.model.dtype %s: the reference computes in float32", cfg.dtype)
    torch.manual_seed(config.seed)
    model = transformers.BertForPreTraining(transformers.BertConfig.from_dict(cfg.to_hf_dict()))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    accum = config.optimizer.get("grad_accum_steps", 1)
    optimizer, scheduler = make_optimizer(model, config.optimizer, config.num_train_steps // accum)
    max_norm = config.optimizer.max_grad_norm or float("inf")  # inf: measure, do not clip

    # Everything is written beside output_dir and renamed to it once the import check passed;
    # a failed run leaves its metrics there for a look.
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-", dir=parent)
    logging.info("%s on %s; writing %s", model.config.architectures, device, work_dir)
    writer = MetricsWriter(work_dir, enabled=True)
    train_data = batches(config, data.train_files, config.seed, mask_config)

    def eval_and_log(step: int) -> dict[str, float]:
        if not data.eval_files:
            return {}
        result = evaluate(model, config, device, mask_config)
        writer.write(step, result, prefix="eval")
        logging.info("eval at step %d: %s", step, result)
        return {f"eval_{k}": v for k, v in result.items()}

    learning_rate = scheduler.get_last_lr()[0]

    def train_step(step: int) -> tuple[dict[str, torch.Tensor], float]:
        nonlocal learning_rate
        batch = to_torch(next(train_data), device)
        loss, step_metrics = pretraining_loss(model, batch, next_sentence)
        (loss / accum).backward()  # optax.MultiSteps averages the micro-batch gradients
        if step % accum == 0:
            step_metrics["grad_norm"], learning_rate = update(optimizer, scheduler, model, max_norm)
        return step_metrics, learning_rate

    # At step 0 the loss is ~ln(vocab) + ln(2).
    last = train_and_log(
        config, train_step, eval_and_log, writer, work_dir, "reference pretrain",
        shown=("loss", "mlm_accuracy"),
    )  # fmt: skip
    writer.close()

    model.save_pretrained(work_dir)  # config.json + model.safetensors
    write_tokenizer_files(work_dir, data, cfg)
    check_batch = next(batches(config, data.eval_files or data.train_files, 0, mask_config))
    imported = check_import(work_dir, model, check_batch)
    torch_count = sum(p.numel() for p in model.parameters())  # tied tensors counted once
    logging.info("parameters: %d in torch, %d imported by bert_jax", torch_count, imported)
    move_into_place(work_dir, output_dir)
    return last


# --- what the references share: the loop, the export's tokenizer files, the command line ------


def train_and_log(
    config: ml_collections.ConfigDict,
    train_step: Callable[[int], tuple[dict[str, torch.Tensor], float]],
    eval_and_log: Callable[[int], dict[str, float]],
    writer,
    work_dir: str,
    desc: str,
    shown: tuple[str, ...] = ("loss",),
) -> dict[str, float]:
    """Steps 1 .. `stop_at_step` (or `num_train_steps`) of `train_step(step)`, which trains one
    step and returns its metrics (tensors) and the learning rate of the latest update.

    As our loop: metrics averaged over each `log_every` window (a key only some steps have,
    such as grad_norm under gradient accumulation, over those), the latest rate, the speed;
    `eval_and_log(step)` at step 0, every `eval_every` and at the end; the bar shows the
    metrics `shown`. Returns the last logged
    and held-out metrics. Raises FloatingPointError naming the first non-finite step (one
    device sync per window, before anything is saved).
    """
    import torch

    stop = config.get("stop_at_step") or config.num_train_steps
    last = eval_and_log(0)
    pending: list[dict[str, torch.Tensor]] = []
    timer = (time.perf_counter(), 0)
    progress = tqdm(total=stop, desc=desc)
    for step in range(1, stop + 1):
        step_metrics, learning_rate = train_step(step)
        pending.append(step_metrics)
        progress.update(1)
        if step % config.log_every == 0 or step == stop:
            losses = torch.stack([m["loss"] for m in pending]).cpu()
            if not torch.isfinite(losses).all():
                bad = step - len(pending) + 1 + int((~torch.isfinite(losses)).nonzero()[0])
                raise FloatingPointError(f"non-finite loss at step {bad}; see {work_dir}")
            elapsed, steps = time.perf_counter() - timer[0], step - timer[1]
            keys = dict.fromkeys(k for m in pending for k in m)
            averaged = {
                k: float(torch.stack([m[k].cpu() for m in pending if k in m]).mean()) for k in keys
            }
            averaged["learning_rate"] = learning_rate
            averaged["steps_per_second"] = steps / elapsed
            averaged["sequences_per_second"] = steps * config.global_batch_size / elapsed
            writer.write(step, averaged)
            last |= averaged
            progress.set_postfix({k: f"{averaged[k]:.3f}" for k in shown})
            pending, timer = [], (time.perf_counter(), step)
        if (config.eval_every and step % config.eval_every == 0) or step == stop:
            last |= eval_and_log(step)
    progress.close()
    return last


def update(optimizer, scheduler, model: torch.nn.Module, max_norm: float):
    """One update: clips the global norm, steps the optimizer and its schedule, zeroes the
    gradients. Returns the gradient norm before clipping and the update's learning rate."""
    import torch

    learning_rate = scheduler.get_last_lr()[0]
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, learning_rate


def write_tokenizer_files(
    work_dir: str, data: ml_collections.ConfigDict, config: BertConfig
) -> None:
    """vocab.txt, tokenizer_config.json and special_tokens_map.json beside an export, as
    `bert_jax.convert` writes them (so transformers' fill-mask runs on it too)."""
    shutil.copyfile(data.vocab_file, os.path.join(work_dir, "vocab.txt"))
    write_tokenizer_config(work_dir, data.vocab_file, config, data.do_lower_case)


def move_into_place(work_dir: str, output_dir: str) -> None:
    """Renames the checked export to `output_dir`, replacing what is there."""
    if os.path.exists(output_dir):
        shutil.rmtree(output_dir)
    os.rename(work_dir, output_dir)
    logging.info("wrote %s", output_dir)


def command_line(run_fn: Callable[..., dict], output_help: str) -> Callable[[list[str]], None]:
    """A reference's flags (--config and its overrides, --output_dir, --overwrite) and the
    main that calls `run_fn(config, output_dir, overwrite)` with them, for `cli.run`."""

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        final = run_fn(FLAGS.config, FLAGS.output_dir, FLAGS.overwrite)
        logging.info("final metrics: %s", final)

    config_flags.DEFINE_config_file("config", None, "Pretraining config file.", lock_config=True)
    flags.DEFINE_string("output_dir", None, output_help)
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output_dir at the end.")
    flags.mark_flags_as_required(["config", "output_dir"])
    return main


if __name__ == "__main__":
    cli.run(command_line(run, "Hugging Face directory to write (and metrics.jsonl)."))
