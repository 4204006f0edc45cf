r"""Contrastive pretraining on raw text at pod scale: ModernBERT-base on a TPU v4-128, the first
(weakly supervised) stage of the ModernBERT-embed recipe (issue 81).

What it trains is `embeddings_contrastive_pretraining.py`'s run (pairs made from raw text by
`data_pipelines.crop_pairs`: two crops of a passage, or one sentence against the rest of
it; every other positive of the global batch a negative) at the batch, schedule and
temperature of stage 1 of nomic-embed as ModernBERT-embed ran it (nomic-ai/contrastors,
`configs/train/contrastive_pretrain_modernbert.yaml`; Nussbaum et al. 2024, "Nomic Embed"):

- 16,384 pairs a step, embedded in cached chunks (GradCache); theirs are 64 per device,
  here 16 a chip (`chunk_size` counts pairs over the whole mesh: 16 x 64 chips = 1,024):
  by the compiler the same step time as 64 (0.6% apart) in 8.7 GiB a chip against 23.7,
  room for an extrapolated estimate's temporaries (docs/tpu_embeddings.md);
- lr 2e-4 with 700 warmup steps, AdamW with bias correction, weight decay 0.01, gradient
  clipping at 1, mean pooling, bf16 matmuls; the decay after warmup is this project's
  linear one (theirs is cosine);
- 14,343 steps: nomic's stage-1 budget in pairs, one epoch of its 235M curated pairs at
  16,384 a step (here crops of the corpus: the corpus's size sets how many epochs that is);
- cosine x 50, temperature 0.02 (their fixed `logit_scale`), not Contriever's 0.05 (x 20,
  the CPU config's): the batch, lr and warmup above ran together at 50, and with 16,383
  in-batch negatives, most of them easy, a sharper softmax keeps the hard ones weighing;
  x 20 comes with Contriever's 2,048 a batch, its MoCo queue and lr 5e-5, which this
  schedule is not. The loss is one-way (each query against every passage), as
  contrastors' stage-1 loss is.

The encoder is ModernBERT-base: answerdotai/ModernBERT-base (what ModernBERT-embed started
from), or this project's own pretraining of it (`modernbert_base_tpu.py` on the same
v4-128, its phase-2 workdir copied to each host: `--config.init_from=<that workdir>`).
Texts: queries cut at 64 tokens (a sentence, or a crop of 10-50% of a passage: the longer
crops are cut), passages of up to 256 tokens (ModernBERT-embed's stage 1 used 128 for
both; 256 is the supervised TPU stage's, `embeddings_modernbert_base_tpu.py`). A batch is
padded to the longest text its passages can give, rounded up to 16 (to 128 under splash),
so the compiled 64 / 256 are the worst case. The attention is the preset's einsum: splash
refuses a 64-token query (its tiles are multiples of 128; `config_bounds.splash_widths`);
with `--config.query_max_seq_length=128 --config.model_overrides.attention_implementation=
splash` it compiles at a lower estimate (docs/tpu_embeddings.md), not recorded here. The
crop rules are the CPU config's (10-50% crops, 10% token deletion, 80% of the pairs by
sentence, 16 passages of each document a batch: a document needs 16 passages of 256
tokens, about 4,000, to be drawn at all; `--config.passages_per_document=1` draws every
passage).

Variants (one recipe, the same global batch and loss on either slice):

- `:pod`, the default: v4-128 (`v4:4x4x4`, 64 chips, 16 hosts, the slice
  `modernbert_base_tpu.py` pretrains on): 256 pairs a chip, 16 chunks of 16.
- `:v4_8`: v4-8 (`v4:2x2x1`, 4 chips, one host): 4,096 pairs a chip, 256 chunks of 16, the
  same steps with 16 times the work a chip; for a first run on one host.

Every host reads and tokenizes the whole corpus at start (`corpus_files`: one sentence a
line, a blank line between documents), builds each step's global batch from (seed, step)
and puts only its own rows on its chips (`experiments.finetune_embeddings`; two processes
train as one in tests/test_embeddings_multihost.py), so the corpus must fit in each host's
memory as token ids. The compiled step, its memory and the compiler's estimate:
docs/tpu_embeddings.md, "Contrastive pretraining on raw text".

  # pairs only (--negatives=0: raw text gives no hard negatives), 22 layers from 3 and 6
  python -m experiments.aot_compile --proxy_layers=3,6 --negatives=0 \
      --config=experiments/configs/embeddings_contrastive_pretraining_tpu.py:pod

  gcloud compute tpus tpu-vm create cpt --zone=us-central2-b --accelerator-type=v4-128 \
      --version=tpu-ubuntu2204-base
  make tpu-setup TPU_NAME=cpt ZONE=us-central2-b
  # on every worker, in ~/bert_jax: the encoder and the corpus, the same files on each
  gcloud compute tpus tpu-vm ssh cpt --zone=us-central2-b --worker=all --command='
      cd bert_jax && gcloud storage cp gs://my-bucket/corpus/wiki_books.txt . &&
      huggingface-cli download answerdotai/ModernBERT-base --local-dir ModernBERT-base'
  # the same command on every worker, --distributed: the 16 hosts find each other through
  # jax.distributed.initialize(), as pretraining's do (docs/tpu.md)
  gcloud compute tpus tpu-vm ssh cpt --zone=us-central2-b --worker=all --command='
      cd bert_jax && nohup .venv/bin/python -m experiments.finetune_embeddings --distributed \
      --config=experiments/configs/embeddings_contrastive_pretraining_tpu.py:pod \
      --config.corpus_files=wiki_books.txt --workdir=runs/cpt_modernbert > cpt.log 2>&1 &'

Process 0 writes the log, the metrics and the model (`runs/cpt_modernbert/checkpoint`, the
supervised stage's `--config.init_from`); the resumable saves (`<workdir>/state`, every 500
steps and at SIGTERM) have not been tried on a real slice.
"""

import ml_collections

from experiments.configs import embeddings_contrastive_pretraining

PAIRS = 235_000_000  # nomic-embed's stage-1 pairs (one epoch): the budget in pairs seen
BATCH = 16_384  # pairs a step (contrastors' batch_size)
CHUNK_PER_DEVICE = 16  # the cached chunk a chip (contrastors' 64: the same step, 2.7x memory)
WARMUP_STEPS = 700  # contrastors' warmup_steps
QUERY_LENGTH, PASSAGE_LENGTH = 64, 256
# variant: (slice, its chips)
VARIANTS = {"pod": ("v4:4x4x4", 64), "v4_8": ("v4:2x2x1", 4)}


def get_config(variant: str = "pod") -> ml_collections.ConfigDict:
    """Stage 1 of ModernBERT-embed on raw text: 16,384 pairs a step on a v4-128 (`pod`) or
    on a v4-8 (`v4_8`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    topology, chips = VARIANTS[variant]
    config = embeddings_contrastive_pretraining.get_config()  # corpus_files, the crop rules
    config.topology = topology  # the Cloud TPU slice experiments.aot_compile compiles for
    config.init_from = "ModernBERT-base"  # answerdotai/ModernBERT-base (HF dir) or our run's
    config.encoder_preset = "modernbert_base"  # init_from's architecture, checked at load
    config.do_lower_case = False  # ModernBERT's BPE is cased
    config.model_overrides.dtype = "bfloat16"  # bf16 matmuls, f32 weights
    # The preset's einsum attention, not splash: splash's tiles are multiples of 128 tokens,
    # and a query of 64 is not (refused under splash by config_bounds.splash_widths).
    config.model_overrides.attention_implementation = "einsum"
    config.max_seq_length = PASSAGE_LENGTH  # passages (and the crops' source) at most
    config.query_max_seq_length = QUERY_LENGTH  # a sentence or a crop as a query
    config.global_batch_size = BATCH
    config.chunk_size = CHUNK_PER_DEVICE * chips  # cached chunks of 16 pairs per chip
    config.num_train_steps = PAIRS // BATCH  # 14,343
    config.learning_rate = 2e-4  # contrastors' stage-1 lr
    config.warmup_proportion = WARMUP_STEPS / config.num_train_steps  # 700 steps
    config.optimizer = "adamw_bias_corrected"  # torch's AdamW, as contrastors trains
    config.weight_decay = 0.01  # contrastors' stage 1
    config.max_grad_norm = 1.0
    config.pooling = "mean"
    config.normalize = True  # the saved model L2-normalises (the loss is cosine either way)
    config.scale = 50.0  # contrastors' logit_scale: temperature 0.02 (the docstring: why)
    config.symmetric = False  # queries against passages only, as contrastors' loss
    config.eval_batch_size = 256  # texts per forward pass scoring a dev_file, if given
    config.checkpoint_every = 500  # resumable saves (a spot slice can be taken back)
    config.log_every = 50
    return config
