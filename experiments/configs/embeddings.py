r"""Contrastive fine-tuning of an encoder into a sentence-embedding model (issue 73).

  python -m experiments.finetune_embeddings --config=experiments/configs/embeddings.py \
      --config.init_from=<dir> --config.train_file=pairs.tsv --workdir=workdirs/embeddings \
      [--config.dev_file=dev_pairs.tsv --config.global_batch_size=64 --config.chunk_size=16 \
       --config.num_train_steps=500 --config.learning_rate=5e-5 --config.pooling=mean]

`train_file` is a TSV of query<TAB>positive[<TAB>negative...] (`data_pipelines.tasks.pairs`).
The loss is in-batch negatives over the whole global batch (every device's queries against
every positive), cosine similarity times `scale`; with `chunk_size` the batch is embedded
in cached chunks (GradCache), so the batch of negatives is not limited by memory.
The defaults are sentence-transformers' (MultipleNegativesRankingLoss, scale 20, lr 5e-5,
10% warmup, mean pooling, AdamW with bias correction and no weight decay) at the real
all-MiniLM-L6-v2 weights that install with pip.
"""

import ml_collections

from experiments.configs import finetune_base
from experiments.configs.finetune_minilm_polarity import minilm_dir


def get_config() -> ml_collections.ConfigDict:
    config = finetune_base.get_config()
    del config.train_batch_size, config.num_epochs  # steps and a global batch instead
    config.init_from = minilm_dir()  # the real MiniLM weights (pip); any convert input
    config.train_file = ""  # TSV: query, positive[, negatives]
    config.dev_file = ""  # TSV of held-out pairs scored as retrieval ('': none)
    config.global_batch_size = 64  # pairs per step: each query meets all 64 positives
    config.num_train_steps = 200  # optimizer updates
    config.chunk_size = 0  # pairs embedded at a time (GradCache); 0: the whole batch at once
    config.pooling = "mean"  # "mean" | "cls" | "last" (bert_jax.embeddings.POOLINGS)
    config.normalize = True  # the saved model L2-normalises (the loss is cosine either way)
    config.scale = 20.0  # cosine similarity x scale = logits (1 / temperature)
    config.symmetric = False  # also each positive against every query
    config.matryoshka_dims = ""  # e.g. "64,128": also train and score these prefixes ('': off)
    config.query_max_seq_length = 0  # query pieces kept (0: max_seq_length); a question is short
    config.eval_batch_size = 128  # texts per forward pass when scoring dev_file
    config.checkpoint_every = 0  # steps between resumable saves in <workdir>/state (0: none)
    # Contrastive pretraining (embeddings_contrastive_pretraining.py): pairs from raw text.
    config.corpus_files = ""  # one sentence a line, blank lines between documents ('': none)
    config.crop_min_ratio = 0.1  # a crop's share of its passage: at least (Contriever)
    config.crop_max_ratio = 0.5  # ... at most
    config.token_deletion = 0.0  # each cropped piece dropped with this probability
    config.sentence_fraction = 0.5  # pairs made by one sentence -> the rest of its passage
    config.keep_sentence = 0.1  # that sentence left in the positive (ORQA's 10%)
    config.passages_per_document = 1  # k passages of one document in a batch (1: at random)
    config.mlm_weight = 0.0  # > 0: + this x masked-LM loss of the masked positives (coCondenser)
    config.log_every = 10
    # sentence-transformers' trainer (transformers' Trainer): AdamW with bias correction,
    # no weight decay; BERT's AdamW without bias correction stays the fine-tuning default.
    config.optimizer = "adamw_bias_corrected"
    config.weight_decay = 0.0
    return config
