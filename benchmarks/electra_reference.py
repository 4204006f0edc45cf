r"""Reference ELECTRA pretraining with transformers' PyTorch Electra models, on our records.

The independent half of `bert_jax.electra` (replaced-token detection): the same config file
and overrides as `experiments.pretrain`, the same batches, a discriminator and a generator
built, initialised and trained by PyTorch and transformers alone:

  python -m benchmarks.electra_reference \
      --config=experiments/configs/demo_arms.py:electra --output_dir=workdirs/electra_torch \
      --config.data.train_files=... --config.data.eval_files=... --config.data.vocab_file=...

What is the same as `experiments.pretrain` with `config.objective="electra"`: the models
(`transformers.ElectraForPreTraining` as the discriminator, `ElectraForMaskedLM` as the
generator, sized from our `BertConfig` and `bert_jax.electra.experiment_generator` through
`bert_jax.convert.electra.hf_electra_config`, whose logits equal ours: tests/test_electra.py);
the sharing (one embeddings module, the word, position and token-type tables and the
embedding LayerNorm, read by both models; the generator's decoder is the word table); the
corruption (a sample of the generator's softmax at every masked position, no gradient
through it, a sample equal to the original counting as original); the loss (the generator's
MLM cross-entropy Σ w·CE / (Σ w + 1e-5) plus `disc_weight` times the discriminator's sigmoid
cross-entropy averaged over real tokens, Σ mask·BCE / (Σ mask + 1e-6)) and every metric of
`bert_jax.electra.electra_loss`, under the same names; AdamW, clipping and the linear
schedule of `benchmarks.pretrain_reference`; the batches and masks (`pretrain_reference.batches`).
The held-out evaluation reads the same `seed=0` stream, without dropout, with the samples of
one fixed generator seed per evaluation (ours: one fixed key), so evaluations move with the
weights alone.

What differs: the initialisation (transformers' N(0, initializer_range), ours TF1's truncated
normal), the dropout masks and the samples (torch's generator, seeded by `config.seed`).

--output_dir receives the run's metrics.jsonl (our records: `bert_jax.telemetry`), so
`experiments.electra_compare.curves` and `prior_gap` read it as one of our runs, and the
discriminator's encoder as a BERT directory (`transformers.BertModel`'s save_pretrained, the
vocab file), the part fine-tuning restores: ELECTRA's embedding and encoder weights have
BERT's names. As `benchmarks.pretrain_reference`, everything is written beside and renamed
into place only after `bert_jax.convert.load_pretrained` has imported it and our encoder's
states on one batch match torch's.

Only BERT's encoder (learned absolute positions, post-LN, GELU MLP) and the "linear" schedule:
transformers' Electra has no rotary positions, GeGLU or pre-LN.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import ml_collections
import numpy as np
from absl import logging

from benchmarks.pretrain_reference import (
    batches,
    command_line,
    make_optimizer,
    move_into_place,
    to_torch,
    train_and_log,
    update,
    write_tokenizer_files,
)
from bert_jax.config import BertConfig, objective
from data_pipelines import cli

if TYPE_CHECKING:
    import torch
    import transformers

# A sampler: (B, P, V) logits -> (B, P) sampled ids; `torch_sampler` draws from the softmax.
Sampler = Callable[["torch.Tensor"], "torch.Tensor"]


class ElectraPair(NamedTuple):
    """The two transformers models of one run, sharing their embeddings."""

    generator: transformers.ElectraForMaskedLM
    discriminator: transformers.ElectraForPreTraining

    def modules(self) -> torch.nn.ModuleDict:
        """Both as one module: `named_parameters` lists the shared tensors once."""
        import torch

        # The discriminator first: the shared tables are listed under its names.
        return torch.nn.ModuleDict(
            {"discriminator": self.discriminator, "generator": self.generator}
        )


def build_models(discriminator: BertConfig, generator: BertConfig) -> ElectraPair:
    """transformers' two Electra models of our configs, in transformers' own initialisation,
    the generator reading the discriminator's embeddings and decoding with its word table."""
    import transformers

    from bert_jax.convert.electra import hf_electra_config
    from bert_jax.electra import check_generator

    check_generator(discriminator, generator)
    disc = transformers.ElectraForPreTraining(
        transformers.ElectraConfig(**hf_electra_config(discriminator, "ElectraForPreTraining"))
    )
    gen = transformers.ElectraForMaskedLM(
        transformers.ElectraConfig(**hf_electra_config(generator, "ElectraForMaskedLM"))
    )
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    return ElectraPair(gen, disc)


def torch_sampler(seed: int) -> Sampler:
    """Samples of the softmax of (B, P, V) logits from a torch generator seeded `seed`."""
    import torch

    stream = torch.Generator().manual_seed(seed)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float(), dim=-1).flatten(0, 1).cpu()  # (B*P, V)
        drawn = torch.multinomial(probs, 1, generator=stream)[:, 0]
        return drawn.view(logits.shape[:-1]).to(logits.device)

    return sample


def _write(ids: torch.Tensor, positions, values, real) -> torch.Tensor:
    """(B, T) `ids` with (B, P) `values` at `positions` where `real`; the rest unchanged."""
    import torch

    return ids.scatter(1, positions, torch.where(real, values, torch.gather(ids, 1, positions)))


def electra_loss(
    models: ElectraPair, batch: dict[str, torch.Tensor], sample: Sampler, disc_weight: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """loss = MLM(generator) + disc_weight · RTD(discriminator) and the metrics of
    `bert_jax.electra.electra_loss`, under its names."""
    import torch
    import torch.nn.functional as F

    ids, mask, types = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    positions, labels = batch["masked_lm_positions"], batch["masked_lm_ids"]
    weights = batch["masked_lm_weights"]
    gen = models.generator
    states = gen.electra(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]
    index = positions[..., None].expand(-1, -1, states.shape[-1])
    # The generator's head is position-wise: at the masked positions only, as ours.
    mlm_logits = gen.generator_lm_head(gen.generator_predictions(torch.gather(states, 1, index)))
    per_token = F.cross_entropy(mlm_logits.transpose(1, 2), labels, reduction="none")  # (B, P)
    denominator = weights.sum() + 1e-5
    mlm_loss = (per_token * weights).sum() / denominator

    sampled = sample(mlm_logits.detach())  # (B, P): no gradient reaches the generator this way
    real = weights > 0
    original = _write(ids, positions, labels, real)
    replaced = _write(original, positions, sampled, real)
    is_replaced = (replaced != original).float()
    disc_logits = models.discriminator(
        input_ids=replaced, attention_mask=mask, token_type_ids=types
    ).logits  # (B, T)
    tokens = mask.float()
    per_token = F.binary_cross_entropy_with_logits(disc_logits, is_replaced, reduction="none")
    disc_loss = (per_token * tokens).sum() / (tokens.sum() + 1e-6)
    loss = mlm_loss + disc_weight * disc_loss

    labels_rtd, preds = is_replaced * tokens, (disc_logits > 0).float() * tokens
    hits = (labels_rtd * preds).sum()
    metrics = {
        "loss": loss,
        "mlm_loss": mlm_loss,
        "mlm_accuracy": ((mlm_logits.argmax(-1) == labels) * weights).sum() / denominator,
        "sampled_mlm_accuracy": ((sampled == labels) * weights).sum() / denominator,
        "disc_loss": disc_loss,
        "disc_accuracy": ((labels_rtd == preds) * tokens).sum() / tokens.sum().clamp(min=1.0),
        "disc_precision": hits / preds.sum().clamp(min=1.0),
        "disc_recall": hits / labels_rtd.sum().clamp(min=1.0),
        "replaced_fraction": labels_rtd.sum() / tokens.sum().clamp(min=1.0),
    }
    return loss, {k: v.detach() for k, v in metrics.items()}


def evaluate(
    models: ElectraPair,
    config: ml_collections.ConfigDict,
    device: torch.device,
    disc_weight: float,
    mask_config=None,
) -> dict[str, float]:
    """Mean held-out metrics over `config.eval_steps` batches: no dropout, the samples of
    one generator seeded `EVAL_SAMPLE_SEED` (the same at every evaluation)."""
    import torch

    from bert_jax.electra import EVAL_SAMPLE_SEED

    modules = models.modules()
    with torch.no_grad():
        modules.eval()
        stream = batches(config, config.data.eval_files, seed=0, mask_config=mask_config)
        sample = torch_sampler(EVAL_SAMPLE_SEED)
        totals = [
            electra_loss(models, to_torch(next(stream), device), sample, disc_weight)[1]
            for _ in range(config.eval_steps)
        ]
        modules.train()
    return {k: float(torch.stack([t[k] for t in totals]).mean()) for k in totals[0]}


def export_encoder(
    models: ElectraPair, config: BertConfig, work_dir: str
) -> transformers.BertModel:
    """The discriminator's embeddings and encoder as a `transformers.BertModel` (no pooler)
    saved in `work_dir`: ELECTRA's names are BERT's under `electra.`."""
    import transformers

    if config.embedding_width != config.hidden_size:
        raise ValueError(
            f"embedding_size {config.embedding_width} != hidden_size {config.hidden_size}: "
            "BERT's format has no embeddings_project; export with bert_jax.convert.electra"
        )
    bert = transformers.BertModel(
        transformers.BertConfig.from_dict(config.to_hf_dict()), add_pooling_layer=False
    )
    bert.load_state_dict(models.discriminator.electra.state_dict(), strict=True)
    bert.save_pretrained(work_dir)
    return bert


def check_import(work_dir: str, bert: transformers.BertModel, batch: dict[str, np.ndarray]):
    """Imports the export with `bert_jax.convert` and compares the encoder's states."""
    import jax
    import torch

    from bert_jax import convert
    from bert_jax.model import BertModel

    cfg, params, _ = convert.load_pretrained(work_dir, model="encoder")
    keys = ("input_ids", "input_mask", "segment_ids")
    with jax.default_matmul_precision("float32"):
        ours = BertModel(cfg).apply({"params": params}, *(batch[k] for k in keys))
    inputs = to_torch(batch, torch.device("cpu"))
    bert.cpu().eval()
    with torch.no_grad():
        theirs = bert(inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"])
    diff = np.max(np.abs(np.asarray(ours.sequence_output) - theirs.last_hidden_state.numpy()))
    logging.info("bert_jax imports %s: max |state difference| %.2e", work_dir, diff)
    if diff > 1e-4:
        raise ValueError(f"{work_dir}: encoder states differ by {diff:.3g} after import")


def run(config: ml_collections.ConfigDict, output_dir: str, overwrite: bool = False) -> dict:
    """Pretrains, evaluates and exports to `output_dir`; returns the last metrics."""
    import torch

    from bert_jax import electra
    from bert_jax.pretraining_input import masking_config
    from bert_jax.telemetry import MetricsWriter
    from bert_jax.train import model_config
    from data_pipelines.tokenization import load_tokenizer

    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir} exists; pass --overwrite")
    if objective(config) != "electra":
        raise ValueError(
            f"--config.objective={objective(config)!r}: this reference is ELECTRA's "
            "(benchmarks.pretrain_reference mirrors 'mlm' and 'mlm_nsp')"
        )
    if config.get("resume_from") or config.get("init_from"):
        raise ValueError("resume_from / init_from: the reference always starts from scratch")
    if config.optimizer.get("grad_accum_steps", 1) != 1:
        raise ValueError("--config.optimizer.grad_accum_steps: the reference takes 1 only")
    data = config.data
    tokenizer = load_tokenizer(data.vocab_file, do_lower_case=data.do_lower_case)
    mask_config = masking_config(config, tokenizer)
    disc_cfg: BertConfig = model_config(config, tokenizer.vocab_size)
    if disc_cfg.non_bert_fields():
        raise ValueError(
            f"the model sets {sorted(disc_cfg.non_bert_fields())}: transformers' Electra "
            "is BERT's encoder only"
        )
    gen_cfg = electra.experiment_generator(config, disc_cfg)
    disc_weight = electra.experiment_settings(config)["disc_weight"]
    torch.manual_seed(config.seed)
    models = build_models(disc_cfg, gen_cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    modules = models.modules().to(device).train()
    optimizer, scheduler = make_optimizer(modules, config.optimizer, config.num_train_steps)
    max_norm = config.optimizer.max_grad_norm or float("inf")
    sample = torch_sampler(config.seed)

    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-", dir=parent)
    logging.info("ELECTRA (transformers) on %s; writing %s", device, work_dir)
    writer = MetricsWriter(work_dir, enabled=True)
    train_data = batches(config, data.train_files, config.seed, mask_config)

    def eval_and_log(step: int) -> dict[str, float]:
        if not data.eval_files:
            return {}
        result = evaluate(models, config, device, disc_weight, mask_config)
        writer.write(step, result, prefix="eval")
        logging.info("eval at step %d: %s", step, result)
        return {f"eval_{k}": v for k, v in result.items()}

    def train_step(step: int) -> tuple[dict[str, torch.Tensor], float]:
        batch = to_torch(next(train_data), device)
        loss, step_metrics = electra_loss(models, batch, sample, disc_weight)
        loss.backward()
        step_metrics["grad_norm"], learning_rate = update(optimizer, scheduler, modules, max_norm)
        return step_metrics, learning_rate

    last = train_and_log(
        config, train_step, eval_and_log, writer, work_dir, "reference electra",
        shown=("loss", "disc_recall"),
    )  # fmt: skip
    writer.close()

    bert = export_encoder(models, disc_cfg, work_dir)
    write_tokenizer_files(work_dir, data, disc_cfg)
    check_batch = next(batches(config, data.eval_files or data.train_files, 0, mask_config))
    check_import(work_dir, bert, check_batch)
    move_into_place(work_dir, output_dir)
    return last


if __name__ == "__main__":
    cli.run(command_line(run, "Directory to write (metrics.jsonl, the encoder)."))
