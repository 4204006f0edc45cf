r"""BERT-Base (L12/H768/A12) with the paper's pretraining recipe, on any machine.

Devlin et al. 2018, section A.2: global batch 256, Adam(W) lr 1e-4 with 10k warmup steps
and linear decay, weight decay 0.01, dropout 0.1, 1M steps: 90% at sequence length 128
(20 predictions per sequence), then 10% at 512 (80 predictions). Two variants, one per
phase; phase 2 continues phase 1's full train state (params, Adam moments, step 900k)
on the length-512 records, so the learning-rate schedule runs on unbroken.

Data (original-format TFRecords, one set per sequence length):

  python -m data_pipelines.create_pretraining_data --input_file=CORPUS \
      --vocab_file=workdirs/wikibooks/vocab.txt --do_lower_case \
      --output_file=workdirs/wikibooks/seq128/train.tfrecord \
      --max_seq_length=128 --max_predictions_per_seq=20
  (and again with --max_seq_length=512 --max_predictions_per_seq=80 into seq512/)

Launch (phase 2 restores from phase 1's checkpoints; see `resume_from`):

  python -m experiments.pretrain --config=experiments/configs/bert_base.py:phase1 \
      --workdir=workdirs/bert_base_phase1
  python -m experiments.pretrain --config=experiments/configs/bert_base.py:phase2 \
      --workdir=workdirs/bert_base_phase2

Cloud TPU reproductions of this recipe: `bert_base_paper.py` (v3:4x4) and the
BERT-Large files next to it.

The paper's Table 5 ablations are `--config.objective=mlm` ("No NSP": records made with
`--next_sentence=false`) and `--config.objective=ltr` ("LTR & No NSP", causal attention:
unmasked records, `--next_sentence=false --masking=dynamic`, with
`--config.data.dynamic_masking=True --config.data.max_predictions_per_seq=128`); see
`bert_tiny_cpu.py` and `bert_jax.train`. `--config.objective=electra` pretrains the model
as ELECTRA's discriminator beside a generator (`config.electra`; `bert_jax.electra`).
"""

import ml_collections
from ml_collections.config_dict import placeholder

NUM_TRAIN_STEPS = 1_000_000  # both phases share one learning-rate schedule
PHASE1_STEPS = 900_000  # 90% of the steps at length 128
# phase -> (max_seq_length, max_predictions_per_seq) of the records it reads.
PHASES = {"phase1": (128, 20), "phase2": (512, 80)}


def get_config(phase: str = "phase1") -> ml_collections.ConfigDict:
    """The recipe for `phase` ('phase1' or 'phase2'; `--config=bert_base.py:phase2`)."""
    if phase not in PHASES:
        raise ValueError(f"unknown variant {phase!r}: use one of {sorted(PHASES)}")
    seq_len, predictions = PHASES[phase]
    config = ml_collections.ConfigDict()
    config.seed = 0  # fixes init, data order, dynamic masks and dropout
    # The PRNG of the dropout masks (bert_jax.train_state.PRNG_IMPLS): "threefry2x32", or
    # "rbg" / "unsafe_rbg". The initialisation is threefry in all. On a sharded TPU step
    # rbg is slower, not faster: each core draws the whole global batch's masks (BERT-Large
    # phase 1 on v3-128: 21.8 GB of HBM traffic a core against 8.4; docs/tpu_estimates.md).
    config.prng_impl = "threefry2x32"
    # "mlm_nsp": masked LM + next sentence prediction, the paper's (bert_jax.config.OBJECTIVES)
    config.objective = "mlm_nsp"

    config.model = ml_collections.ConfigDict()
    config.model.preset = "base"  # L12/H768/A12 (bert_jax.presets.PRESETS)
    # Other sizes on the same recipe (None: the preset's), as in the tiny config.
    config.model.num_hidden_layers = placeholder(int)  # L
    config.model.hidden_size = placeholder(int)  # H
    config.model.num_attention_heads = placeholder(int)  # A (H divisible by A)
    config.model.intermediate_size = placeholder(int)  # the feed-forward width (4H in presets)
    config.model.vocab_size = 30522  # Google's uncased English WordPiece vocab
    config.model.hidden_act = "gelu_tanh"  # the original code's GELU, as the paper's models
    config.model.dtype = "bfloat16"  # bf16 matmul inputs, f32 accumulation and master weights
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

    # Where the data lives; every data path below is built from it (FieldReference), so
    # `--config.data_dir=...` moves them all, and each stays overridable on its own.
    config.data_dir = "workdirs/wikibooks"
    data_dir = config.get_ref("data_dir")
    config.data = ml_collections.ConfigDict()
    config.data.train_files = data_dir + f"/seq{seq_len}/train-*.tfrecord"  # globs, comma-sep.
    config.data.eval_files = data_dir + f"/seq{seq_len}/eval-*.tfrecord"  # "" disables eval
    config.data.vocab_file = data_dir + "/vocab.txt"  # the vocab the records were made with
    config.data.do_lower_case = True  # uncased model
    config.data.max_seq_length = seq_len  # T of the records
    config.data.max_predictions_per_seq = predictions  # P of the records
    config.data.dynamic_masking = False  # records are masked, as the original's
    config.data.masked_lm_prob = 0.15  # dynamic masking only
    config.data.whole_word_mask = False  # dynamic masking only
    config.data.shuffle_buffer = 10_000  # records per shuffled window (per data stream)
    # Streams the shards are dealt into: the run can move to any slice whose host count
    # divides it (64: 1 to 64 hosts, v3-8 to v3-512), each stream's batch share is 256 / 64.
    config.data.num_streams = 64
    config.data.pack = False  # True: several instances per row, kept apart (data_pipelines.packing)
    config.data.max_instances_per_row = 4  # instance slots of a packed row (NSP predictions)
    # A workdir resumed on other data than its checkpoints' (docs/preemption.md): "refuse"
    # names each change; "restart" reads this data from its beginning at the checkpoint's step.
    config.data.on_change = "refuse"
    # True: train on records whose stats JSON names another vocabulary than vocab_file.
    config.data.allow_vocab_change = False
    # True: train_files and eval_files may match the same file (evaluating on training data).
    config.data.allow_eval_in_train = False

    config.global_batch_size = 256  # sequences per step over all devices (the paper's)
    config.num_train_steps = NUM_TRAIN_STEPS  # length of the learning-rate schedule
    # Phase 1 stops at 900k; phase 2 runs to the end of the schedule.
    config.stop_at_step = PHASE1_STEPS if phase == "phase1" else placeholder(int)
    config.start_step = 0 if phase == "phase1" else PHASE1_STEPS  # checked against the restore
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor): data parallel on every device
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
    config.optimizer.name = "adamw"  # the original BERT AdamW (no bias correction)
    config.optimizer.learning_rate = 1e-4  # peak
    config.optimizer.warmup_steps = 10_000  # linear warmup from 0 (0: none)
    config.optimizer.schedule = "linear"  # bert_jax.optim.SCHEDULES ("wsd": warmup-stable-decay)
    config.optimizer.decay_power = 1.0  # linear decay to 0 at num_train_steps
    config.optimizer.decay_fraction = 0.2  # "wsd": the last fifth of the steps decays
    config.optimizer.weight_decay = 0.01  # not applied to LayerNorm and biases
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.max_grad_norm = 1.0  # global-norm clipping, as the original (0: none)
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

    config.log_every = 100  # steps between metric writes
    config.eval_every = 10_000  # steps between held-out evaluations (0: never)
    config.eval_steps = 100  # held-out batches per evaluation (the original's max_eval_steps)
    # Steps between (async) checkpoints; 0: none periodic, the final one is still written.
    config.checkpoint_every = 5_000
    config.keep_checkpoints = 3  # the newest K are kept (K >= 1)
    # Phase 2 continues phase 1's full state: its checkpoints dir (the workdir above).
    config.resume_from = "" if phase == "phase1" else "workdirs/bert_base_phase1/checkpoints"
    config.init_from = ""  # params only: our checkpoints dir, a TF checkpoint or a HF dir
    # True: resume a checkpoint whose model differs from this config's (a warning names the
    # differences); False refuses, naming them (bert_jax.model_changes).
    config.allow_model_change = False

    # Loss-spike rollback (bert_jax.rollback, docs/preemption.md): a non-finite metric or a loss
    # spike restores the last checkpoint and skips the batches after its data position.
    config.rollback = ml_collections.ConfigDict()
    config.rollback.enabled = False  # False: a non-finite loss stops the run, spikes pass
    config.rollback.spike_factor = 2.0  # a spike: loss > factor x the running median
    config.rollback.median_window = 100  # per-step losses in the running median
    config.rollback.skip_batches = 200  # batches skipped after the restored position
    config.rollback.max_rollbacks = 3  # within window_steps; one more stops (0: the first)
    config.rollback.window_steps = 20_000  # steps within which max_rollbacks are counted
    return config
