r"""ModernBERT-base into a sentence-embedding model on TPU v4, at ModernBERT's own recipe.

The recipe is the retrieval fine-tuning ModernBERT's authors ran (AnswerDotAI/bert24,
examples/train_st.py: sentence-transformers' CachedMultipleNegativesRankingLoss): 1.25M
MS MARCO triplets (query, positive, one mined hard negative; the `triplet-hard` subset of
sentence-transformers/msmarco-co-condenser-margin-mse-sym-mnrl-mean-v1), one epoch, 512
triplets a batch embedded in cached mini-batches of 16, lr 8e-5 with 5% warmup and linear
decay, AdamW with bias correction and no weight decay (transformers' Trainer defaults),
gradient clipping at 1, mean pooling, cosine x 20, bf16 matmuls. Their batch of 512 sat on
one GPU; the loss here is the same whatever the mesh (every query against every positive
and negative of the global batch: `bert_jax.embeddings`).

Variants (`:recipe`, the default, and `:pod`):

- `:recipe`, 512 triplets on a v4-8 (`v4:2x2x1`, 4 chips, one host): 128 per chip in
  chunks of 16 per chip (`chunk_size` counts pairs over the whole mesh: 64), 2,441 steps;
  a v4-32 would hold 32 triplets a chip, two chunks.
- `:pod`, 16,384 triplets (32x the recipe's negatives per query) on a v4-128
  (`v4:4x4x4`, 64 chips, 16 hosts, the pretraining slice of `modernbert_base_tpu.py`): 256
  per chip, 16 chunks of 16 per chip, the same 1.25M triplets in 76 steps at the recipe's
  lr (not re-tuned). Every host reads the pairs and puts only its own rows of each global
  batch on its chips (`experiments.finetune_embeddings`; two local processes train as one
  in tests/test_embeddings_multihost.py).

Both are data parallel with the f32 state replicated (149M params: 1.8 GB a chip with the
two Adam moments) and splash attention. Texts are cut at 256 tokens (the recipe's
sentence-transformers limit was ModernBERT's 8,192; MS MARCO's passages are short, and the
few longer than 256 tokens are cut here); each batch is padded only to its longest text,
rounded up to 16, so the compiled 256 is the worst case. The compiled step, its
memory, the compiler's time estimate and where the bytes and the embeddings' all-gather go:
docs/tpu_embeddings.md, "Contrastive fine-tuning".

  python -m experiments.aot_compile --proxy_layers=3,6 \
      --config=experiments/configs/embeddings_modernbert_base_tpu.py:recipe   # or :pod

  # the triplets as a TSV of query, positive, negative (tabs and newlines in texts removed)
  gcloud compute tpus tpu-vm create embed --zone=us-central2-b --accelerator-type=v4-8 \
      --version=tpu-ubuntu2204-base
  make tpu-setup TPU_NAME=embed ZONE=us-central2-b
  make tpu-ssh TPU_NAME=embed ZONE=us-central2-b
  # on the worker, in ~/bert_jax:
  huggingface-cli download answerdotai/ModernBERT-base --local-dir ModernBERT-base
  .venv/bin/python -m experiments.finetune_embeddings \
      --config=experiments/configs/embeddings_modernbert_base_tpu.py:recipe \
      --config.train_file=msmarco_triplets.tsv --workdir=runs/embeddings_modernbert_base

  # :pod on a v4-128: ModernBERT-base and the triplets on every worker, then the same
  # command on every worker with --distributed (the 16 hosts find each other through
  # jax.distributed.initialize(), as docs/tpu.md's pretraining); process 0 writes the
  # log, the metrics and the model
  gcloud compute tpus tpu-vm ssh embed --zone=us-central2-b --worker=all \
      --command="cd ~/bert_jax && .venv/bin/python -m experiments.finetune_embeddings \
      --distributed --config=experiments/configs/embeddings_modernbert_base_tpu.py:pod \
      --config.train_file=msmarco_triplets.tsv --workdir=runs/embeddings_pod"
"""

import ml_collections

from experiments.configs import embeddings

PAIRS = 1_250_000  # the recipe's training triplets: one epoch
CHUNK_PER_CHIP = 16  # the recipe's cached mini-batch, here per chip
# variant: (slice, its chips, triplets per step)
VARIANTS = {"recipe": ("v4:2x2x1", 4, 512), "pod": ("v4:4x4x4", 64, 16_384)}


def get_config(variant: str = "recipe") -> ml_collections.ConfigDict:
    """The recipe's 512 triplets a step on a v4-8, or 16,384 on a v4-128 (`pod`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    topology, chips, batch = VARIANTS[variant]
    config = embeddings.get_config()
    config.topology = topology  # the Cloud TPU slice experiments.aot_compile compiles for
    config.init_from = "ModernBERT-base"  # answerdotai/ModernBERT-base, downloaded (HF dir)
    config.encoder_preset = "modernbert_base"  # init_from's architecture, checked at load
    config.do_lower_case = False  # ModernBERT's BPE is cased (its tokenizer.json)
    config.model_overrides.dtype = "bfloat16"  # bf16 matmuls, f32 weights (the recipe's bf16)
    config.model_overrides.attention_implementation = "splash"  # Pallas' flash kernels, TPU
    config.max_seq_length = 256  # tokens per text at most (batches padded to their longest)
    config.global_batch_size = batch  # triplets a step: each query meets every candidate
    config.chunk_size = CHUNK_PER_CHIP * chips  # cached chunks of 16 triplets per chip
    config.num_train_steps = PAIRS // batch  # one epoch of the recipe's triplets
    config.learning_rate = 8e-5  # the recipe's (ModernBERT-base's)
    config.warmup_proportion = 0.05  # the recipe's warmup_ratio
    config.optimizer = "adamw_bias_corrected"  # torch's AdamW (transformers' Trainer)
    config.weight_decay = 0.0  # the Trainer's default
    config.pooling = "mean"  # sentence-transformers' default module for a plain encoder
    config.normalize = False  # the recipe's model has no Normalize module (the loss is cosine)
    config.scale = 20.0  # the loss's default scale
    config.log_every = 50
    return config
