r"""The embedded default: BERT-tiny (L2/H128/A2) pretrained on Shakespeare, on a CPU.

`make pretrain` builds everything from nothing (vocab -> TFRecords -> training):

  python -m data_pipelines.prepare_corpus --corpus=shakespeare \
      --output_file=workdirs/shakespeare/corpus.txt
  python -m data_pipelines.build_vocab --input_file=workdirs/shakespeare/corpus.txt \
      --output_file=workdirs/shakespeare/vocab.txt --vocab_size=8000 --do_lower_case
  python -m data_pipelines.create_pretraining_data ... (see the Makefile)
  python -m experiments.pretrain --config=experiments/configs/bert_tiny_cpu.py \
      --workdir=workdirs/tiny

The pretraining objective (the paper's Table 5 rows) is `--config.objective`, each on the
records its data creation makes (`data_pipelines.recipe` passes the same flags through):

  mlm_nsp  masked LM + next sentence prediction (BERT, the default): the records above
  mlm      "No NSP": masked LM alone, no NSP head; single-segment records `[CLS] text [SEP]`
           (create_pretraining_data --next_sentence=false)
  ltr      "LTR & No NSP": a left-to-right LM with causal attention (kept at fine-tuning);
           unmasked single-segment records (--next_sentence=false --masking=dynamic) and
           --config.data.dynamic_masking=True --config.data.max_predictions_per_seq=128
  electra  replaced-token detection (Clark et al. 2020, bert_jax.electra): the model is the
           discriminator, a generator (`config.electra`) corrupts the masked positions;
           static or dynamic masking, single segments (--next_sentence=false), unpacked
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # fixes init, data order, dynamic masks and dropout
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg", cheaper on TPU and GPU. The initialisation is threefry in all.
    config.prng_impl = "threefry2x32"
    # "mlm_nsp" (BERT), "mlm" (no NSP) or "ltr" (left-to-right, causal): see the docstring.
    config.objective = "mlm_nsp"

    config.model = ml_collections.ConfigDict()
    config.model.preset = "tiny"  # L2/H128/A2 (bert_jax.presets.PRESETS)
    # Other sizes on the same recipe (None: the preset's), e.g. experiments.ablations' Table 6.
    config.model.num_hidden_layers = placeholder(int)  # L
    config.model.hidden_size = placeholder(int)  # H
    config.model.num_attention_heads = placeholder(int)  # A (H divisible by A)
    config.model.intermediate_size = placeholder(int)  # the feed-forward width (4H in presets)
    config.model.vocab_size = placeholder(int)  # None: the vocab file's size
    config.model.hidden_act = "gelu"  # exact GELU; "gelu_tanh" is the original code's form
    config.model.dtype = "float32"  # compute dtype; "bfloat16" uses bf16 matmul inputs
    config.model.activation_dtype = "float32"  # norms into matmuls, GeGLU, rotary (f32 stats)
    config.model.residual_dtype = "float32"  # the residual stream: embedding norm, x + branch
    config.model.scan_layers = False  # nn.scan over layers (faster compiles when deep)
    config.model.remat_policy = "none"  # rematerialisation (bert_jax.config.REMAT_POLICIES)
    # "einsum" (written out), or jax.nn.dot_product_attention: "xla" / "cudnn"
    # (bert_jax.config.ATTENTION_IMPLEMENTATIONS); the fused two need
    # attention_probs_dropout_prob=0 to train.
    config.model.attention_implementation = "einsum"
    config.model.hidden_dropout_prob = placeholder(float)  # None: the preset's (0.1)
    config.model.attention_probs_dropout_prob = placeholder(float)  # None: the preset's
    # Width E of the embedding tables, projected to H where they differ (ELECTRA-Small's
    # E=128 < H=256); None: E = H.
    config.model.embedding_size = placeholder(int)

    # objective="electra" only (bert_jax.electra): the generator beside the discriminator
    # (the model above) and the weight of the discriminator's loss.
    config.electra = ml_collections.ConfigDict()
    config.electra.generator_hidden_fraction = 0.25  # generator H / H (the paper's Small, Large)
    config.electra.generator_layer_fraction = 1.0  # generator L / L
    config.electra.disc_weight = 50.0  # λ of loss = MLM(generator) + λ RTD(discriminator)

    config.data = ml_collections.ConfigDict()
    config.data.train_files = "workdirs/shakespeare/train*.tfrecord"  # globs, comma-separated
    config.data.eval_files = "workdirs/shakespeare/eval*.tfrecord"  # "" disables evaluation
    config.data.vocab_file = "workdirs/shakespeare/vocab.txt"  # vocab.txt, .model or tokenizer.json
    config.data.do_lower_case = True  # as the vocab was built
    config.data.max_seq_length = 128  # T of the records
    config.data.max_predictions_per_seq = 20  # P of the records
    config.data.dynamic_masking = False  # True: records are unmasked, masked per epoch here
    config.data.masked_lm_prob = 0.15  # dynamic masking only
    config.data.whole_word_mask = False  # dynamic masking only
    config.data.shuffle_buffer = 10_000  # records per shuffled window (per data stream)
    # Streams the shards are dealt into (None: one per process); a multiple of every process
    # count the run may resume on (input_pipeline: the global batches do not depend on it).
    config.data.num_streams = placeholder(int)
    config.data.pack = False  # True: several instances per row, kept apart (data_pipelines.packing)
    config.data.max_instances_per_row = 4  # instance slots of a packed row (NSP predictions)
    # A workdir resumed on other data than its checkpoints' (docs/preemption.md): "refuse"
    # names each change; "restart" reads this data from its beginning at the checkpoint's step.
    config.data.on_change = "refuse"
    # True: train on records whose stats JSON names another vocabulary than vocab_file.
    config.data.allow_vocab_change = False
    # True: train_files and eval_files may match the same file (evaluating on training data).
    config.data.allow_eval_in_train = False

    config.global_batch_size = 64  # sequences per step over all devices
    config.num_train_steps = 2_000  # length of the learning-rate schedule
    config.stop_at_step = placeholder(int)  # end of this phase (None: num_train_steps)
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 fills the rest
    # Logical axis -> mesh axes; None is bert_jax.sharding.DEFAULT_RULES (batch over data and
    # fsdp, the weights' embed over fsdp, heads/mlp/vocab over tensor). A list of pairs in
    # its form changes what each mesh axis splits, e.g. [("batch", "data"), ("mlp", "tensor")].
    config.sharding_rules = None
    # Sharded weight update (Xu et al. 2020): the f32 params and optimizer moments are stored
    # split over the data-parallel devices, gathered for the passes, the gradients summed
    # into the shards, each device updating 1/N of the weights. Same math, less memory
    # and far less per-update HBM traffic per device (docs/tpu_estimates.md).
    config.shard_weight_update = False
    # With it: a leaf no dimension of which divides by all the data-parallel devices is split
    # over two dimensions, or over the mesh axes that divide (else it stays replicated).
    # Less memory, but a slower step on TPU v3 by the compiler (docs/tpu_estimates.md).
    config.shard_weight_update_spread = False
    # With it: the matmul kernels are gathered by an explicit all-gather of shards cast to
    # model.dtype, not by the partitioner from the f32 shards. Same math; faster by the TPU
    # compiler on v3-128 (64-way gathers), slower on v4 and v5e (docs/tpu_estimates.md,
    # "Collectives").
    config.shard_weight_update_explicit_gather = False
    # "bfloat16": the matmul kernels' gradients are summed over the data-parallel devices in
    # bf16 (MLPerf BERT's reduce_gradients_in_bf16; needs model.dtype "bfloat16"): half the
    # bytes of the step's largest collective, rounded sums (docs/tpu_estimates.md has both effects).
    config.grad_reduce_dtype = "float32"

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "adamw"  # the original BERT AdamW ("lamb" for huge batches)
    config.optimizer.learning_rate = 1e-3  # peak; small models take a larger rate
    config.optimizer.warmup_steps = 200  # linear warmup from 0 (0: none)
    # After warmup (bert_jax.optim.SCHEDULES): "linear" decays to 0 from step 0 (BERT's,
    # decay_power 1.0); "wsd" holds the peak, then decays over the last decay_fraction.
    config.optimizer.schedule = "linear"
    config.optimizer.decay_power = 1.0  # polynomial decay to 0 (1.0 = linear)
    config.optimizer.decay_fraction = 0.2  # "wsd" only
    config.optimizer.weight_decay = 0.01  # not applied to LayerNorm and biases
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.max_grad_norm = 1.0  # global-norm clipping (0: none)
    config.optimizer.grad_accum_steps = 1  # micro-batches per update
    # "bfloat16": Adam's / LAMB's first moment stored in bf16 (2 bytes a weight less state,
    # the update still computed in f32); "float32": the params' dtype (docs/tpu_estimates.md).
    config.optimizer.mu_dtype = "float32"

    # A jax.profiler trace of steps [start_step, start_step + num_steps) in
    # <workdir>/plugins/profile for TensorBoard / XProf (docs/profiling.md).
    config.profile = ml_collections.ConfigDict()
    config.profile.start_step = 0  # the first step traced (step 1 compiles: trace from 2 on)
    config.profile.num_steps = 0  # steps traced (0: no trace)
    config.profile.all_processes = False  # True: every host writes its trace, else process 0
    # JAX's persistent compilation cache, a local or gs:// path ("": none unless the
    # JAX_COMPILATION_CACHE_DIR variable names one): a restarted run loads its programs.
    config.jax_cache_dir = ""

    config.log_every = 50  # steps between metric writes
    config.eval_every = 500  # steps between held-out evaluations (0: never)
    config.eval_steps = 10  # held-out batches per evaluation
    # Steps between (async) checkpoints; 0: none periodic, the final one is still written.
    config.checkpoint_every = 500
    config.keep_checkpoints = 3  # the newest K are kept (K >= 1)
    config.resume_from = ""  # a checkpoints dir with a full state (e.g. phase 1)
    config.init_from = ""  # params only: our checkpoints dir, a TF checkpoint or a HF dir
    # True: resume a checkpoint whose model differs from this config's (a warning names the
    # differences); False refuses, naming them (bert_jax.model_changes).
    config.allow_model_change = False

    # Loss-spike rollback (bert_jax.rollback, docs/preemption.md): a non-finite metric or a loss
    # spike restores the last checkpoint and skips the batches after its data position.
    config.rollback = ml_collections.ConfigDict()
    config.rollback.enabled = False  # False: a non-finite loss stops the run, spikes pass
    config.rollback.spike_factor = 2.0  # a spike: loss > factor x the running median
    config.rollback.median_window = 20  # per-step losses in the running median
    config.rollback.skip_batches = 20  # batches skipped after the restored position
    config.rollback.max_rollbacks = 3  # within window_steps; one more stops (0: the first)
    config.rollback.window_steps = 1_000  # steps within which max_rollbacks are counted
    return config
