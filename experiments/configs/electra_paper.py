r"""ELECTRA-Small and ELECTRA-Base as Clark et al. (2020) trained them, on Cloud TPU slices.

`--config.objective=electra` (bert_jax.electra) with the paper's hyperparameters (its
Table 6 and the released code's `configure_pretraining.py`), on the BERT recipe's
Wikipedia + books data (`make tpu-data`'s records, masked anew each time they are read):

  variant  discriminator                          generator  T    batch  steps  lr    slice
  small    L12 / H256 / A4, FFN 1024, E=128       H/4        128  128    1M     5e-4  v3-8
  base     L12 / H768 / A12, FFN 3072 (BERT-Base)  H/3        512  256    766k   2e-4  v3-32

Both: 10k warmup steps then linear decay, BERT's AdamW (weight decay 0.01, eps 1e-6),
dropout 0.1, erf GELU (the released code's; `transformers`' ElectraForMaskedLM has no other),
15% of the tokens masked (our masking rules: 80% [MASK] / 10% random / 10% kept; the
released code replaces 85% by [MASK] and keeps 15%), λ = 50. The paper trained Small on one
V100 for 4 days and Base on 16 TPU v3 chips for about 4 days; v3-8 and v3-32 (16 chips)
are the nearest Cloud TPU slices. Both run data parallel with the weight update sharded over
the cores: for Small the TPU compiler's cost model puts it at 8.8 ms a step against 9.5 with
the update replicated; for Base it is the layout BERT-Base's T=512 phase measured fastest
(docs/tpu_estimates.md, "ELECTRA-Small and ELECTRA-Base").

Fit check and the compiler's time estimate on this CPU (needs the `tpu` extra):

  python -m experiments.aot_compile --config=experiments/configs/electra_paper.py:small
  python -m experiments.aot_compile --config=experiments/configs/electra_paper.py:base

Launch on Cloud TPU (docs/tpu.md walks through data creation and monitoring):

  make tpu-create ACCELERATOR_TYPE=v3-32 TPU_NAME=electra
  make tpu-setup tpu-data BUCKET=gs://my-bucket TPU_NAME=electra
  make tpu-pretrain CONFIG=experiments/configs/electra_paper.py PHASE=base \
      BUCKET=gs://my-bucket TPU_NAME=electra

ELECTRA-Small the same way on `ACCELERATOR_TYPE=v3-8` with `PHASE=small` (its records are
the T=128 ones). The run's workdir is $(BUCKET)/runs/electra_paper_<variant>.
"""

import ml_collections

from experiments.configs import bert_base, cloud_tpu

# variant -> the recipe's differences from BERT-Base's (bert_base.py).
VARIANTS = {
    "small": {
        "topology": "v3:2x2",  # v3-8: 8 cores, 16 sequences each
        "seq": (128, 20),  # (T, P) of the records it reads
        "model": {
            "num_hidden_layers": 12,
            "hidden_size": 256,
            "num_attention_heads": 4,
            "intermediate_size": 1024,
            "embedding_size": 128,
        },  # fmt: skip
        "generator_hidden_fraction": 0.25,
        "global_batch_size": 128,
        "num_train_steps": 1_000_000,
        "learning_rate": 5e-4,
    },
    "base": {
        "topology": "v3:4x4",  # v3-32: 32 cores (16 chips), 8 sequences each
        "seq": (512, 80),
        "model": {},  # BERT-Base's sizes, E = H
        "generator_hidden_fraction": 1 / 3,
        "global_batch_size": 256,
        "num_train_steps": 766_000,
        "learning_rate": 2e-4,
    },
}


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
    """ELECTRA-`variant` ('small' or 'base'; `--config=electra_paper.py:small`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: use one of {sorted(VARIANTS)}")
    recipe = VARIANTS[variant]
    seq_len, predictions = recipe["seq"]
    # BERT-Base's recipe at this variant's sequence length (phase 1's records are T=128,
    # phase 2's T=512), as one run from step 0.
    config = bert_base.get_config("phase1" if seq_len == 128 else "phase2")
    config.stop_at_step = None
    config.start_step = 0
    config.resume_from = ""
    config.objective = "electra"
    for key, value in recipe["model"].items():
        config.model[key] = value
    config.model.hidden_act = "gelu"
    config.electra.generator_hidden_fraction = recipe["generator_hidden_fraction"]
    config.data.dynamic_masking = True  # ELECTRA masks each time a sequence is read
    config.data.max_seq_length = seq_len
    config.data.max_predictions_per_seq = predictions
    config.global_batch_size = recipe["global_batch_size"]
    config.num_train_steps = recipe["num_train_steps"]
    config.optimizer.learning_rate = recipe["learning_rate"]
    config = cloud_tpu.on_cloud_tpu(
        config, config_name="electra_paper", phase=variant, topology=recipe["topology"]
    )
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): data parallel on every core
    config.shard_weight_update = True  # the train state split over the cores
    return config
