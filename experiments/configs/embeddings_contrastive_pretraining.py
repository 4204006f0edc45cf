r"""Contrastive pretraining on raw text: an encoder learns to embed before any labelled pair
(issue 81; docs/embeddings.md "Contrastive pretraining").

  python -m experiments.finetune_embeddings \
      --config=experiments/configs/embeddings_contrastive_pretraining.py \
      --config.corpus_files=corpus.txt --config.vocab_file=vocab.txt --workdir=workdirs/cpt \
      [--config.init_from=<an MLM pretraining workdir> | --config.from_scratch=True \
       --config.bert_config_file=<config.json>]

The pairs come from `corpus_files` (the pretraining's own format: one sentence a line, a
blank line between documents) by `data_pipelines.crop_pairs`: two independent crops of a
passage (Contriever's rule: each 10-50% of it) or one sentence against the rest of its
passage (the inverse cloze task, the corpus's structure), `sentence_fraction` of them the
latter. Negatives are every other positive of the global batch, gathered across the mesh,
in cached chunks of `chunk_size`; mean pooling, temperature 0.05 (scale 20 here: the
one the supervised stage uses, so the two stages' logits are alike). The run resumes: a
save every `checkpoint_every` steps, and on SIGTERM / Ctrl-C after the step in flight.

The result is an embedding model (`<workdir>/checkpoint`, with its pooling) that
`experiments.embed` reads, `bert_jax.convert --format=sentence-transformers` exports, and
the supervised stage (configs/embeddings.py) takes as `--config.init_from`.
"""

import ml_collections

from experiments.configs import embeddings


def get_config() -> ml_collections.ConfigDict:
    config = embeddings.get_config()
    config.init_from = ""  # an MLM pretraining workdir, or '' with from_scratch
    config.corpus_files = ""  # required: raw text, comma-separated files
    config.global_batch_size = 64  # pairs a step; every other positive is a negative
    config.num_train_steps = 1000
    config.learning_rate = 1e-3  # a small encoder from MLM or random weights
    config.warmup_proportion = 0.1
    config.max_seq_length = 128  # passage pieces (and crops' source length)
    config.query_max_seq_length = 64  # a sentence or a crop as a query
    config.checkpoint_every = 200
    config.crop_min_ratio = 0.1
    config.crop_max_ratio = 0.5
    config.token_deletion = 0.1  # Contriever's optional deletion
    # Most pairs sentence -> passage: SQuAD-like queries (one sentence's words in a paragraph);
    # with 16 passages a document, 36.2 nDCG@10 at 1,000 steps against 34.2 for 0.5 and 8
    # (docs/retrieval_results.md, "Pilots").
    config.sentence_fraction = 0.8
    # The sentence stays in its passage: a query whose words the positive holds, as a SQuAD
    # question's are its paragraph's (ORQA's 0.1 gave 25.7 nDCG@10 against 30.5 in the pilot).
    config.keep_sentence = 1.0
    # 16 passages of each of 4 documents: 15 negatives of a query are on its own topic.
    config.passages_per_document = 16
    return config
