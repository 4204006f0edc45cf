"""Every config key's allowed values, stated once, and the one check a run makes at load.

A run trusts its config deep into the loop: a key that divides (`step % checkpoint_every`),
indexes or shapes an array fails there, after minutes of data and compile, as a library's
traceback. Here each key of the pretraining configs, the fine-tuning ones (`finetune_*`,
`distill_*`, `feature_based_*`) and `experiments.demo`'s flags has its range in one table
(`PRETRAIN`, `FINETUNE`, `DEMO`), beside a one-line meaning and what 0 or None means where
it means something; `check` refuses a value outside it, then the rules between keys
(`_pretrain_rules`, ...), each in one line naming the keys and values (a `ConfigError`;
`check_or_exit` turns it into the tool's one-line exit). The model block is checked by
`BertConfig` itself, whose `__post_init__` owns those rules.

A key gets its range with one entry in its table, e.g.
`"data.shuffle_buffer": Int("records per shuffled window", 1),` (`Bound` and its
constructors: `bert_jax.config_ranges`);
tests/test_config_bounds.py fails for any key of a config file that has none.
docs/config_bounds.md is `markdown()` of these tables.

No JAX here: the entry points check before they import it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from bert_jax.config import (
    ATTENTION_IMPLEMENTATIONS,
    FEED_FORWARDS,
    HIDDEN_ACTS,
    NORM_PLACEMENTS,
    OBJECTIVES,
    POSITION_ENCODINGS,
    REMAT_POLICIES,
    BertConfig,
    ConfigError,
)
from bert_jax.config_ranges import (
    SEED_MAX,
    STEP_MAX,
    Bound,
    Enum,
    Flag,
    Float,
    Int,
    ListOf,
    Model,
    Prob,
    Text,
)
from bert_jax.mesh_shape import MESH_AXES, resolve_mesh_shape
from bert_jax.presets import MODERN_PRESETS, PRESETS

# Choices written here because their modules import JAX; tests/test_config_bounds.py checks
# each against its module (train_state.PRNG_IMPLS, optim.SCHEDULES and MU_DTYPES, ...).
PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
PRETRAIN_OPTIMIZERS = ("adamw", "adamw_bias_corrected", "lamb", "stable_adamw")
FINETUNE_OPTIMIZERS = ("adamw", "adamw_bias_corrected")
SCHEDULES = ("linear", "wsd", "constant")
LABEL_TYPES = ("auto", "class", "number")  # data_pipelines.tasks.own_files.LABEL_TYPES
DECAY_SHAPES = ("linear", "1-sqrt")  # optim.DECAY_SHAPES: "wsd"'s anneal
STATE_DTYPES = ("float32", "bfloat16")  # optimizer.mu_dtype, grad_reduce_dtype
# The rule of the batch axis where `sharding_rules` gives none (bert_jax.sharding.DEFAULT_RULES).
DEFAULT_BATCH_AXES = ("data", "fsdp")
SPLASH_TILE = 128  # splash attention's tiles are multiples of this many tokens (splash.LANES)


def _choices(names) -> str:
    return "one of " + ", ".join(names)


_POSITIVE_INT = "an int >= 1"
_PROB = "a float in [0, 1)"
_FINAL_ONLY = "no periodic checkpoint; the final one is still written"
_SHARED = {
    "seed": Int("fixes init, data order, masks and dropout", 0, SEED_MAX),
    "prng_impl": Enum("the PRNG of the dropout masks", PRNG_IMPLS),
    "mesh_shape": Bound("(data, fsdp, tensor) devices; -1 fills the rest", "mesh"),
    "log_every": Int("steps between metric records", 1, STEP_MAX),
}

PRETRAIN: dict[str, Bound] = {
    **_SHARED,
    "objective": Enum("the pretraining objective (Table 5's rows, ELECTRA)", OBJECTIVES),
    "model.preset": Enum("the model's sizes", (*PRESETS, *MODERN_PRESETS)),
    "model.num_hidden_layers": Model("L, transformer layers", _POSITIVE_INT),
    "model.hidden_size": Model("H, the residual width", f"{_POSITIVE_INT}, divisible by A"),
    "model.num_attention_heads": Model("A, attention heads", f"{_POSITIVE_INT} dividing H"),
    "model.intermediate_size": Model("the feed-forward width", _POSITIVE_INT),
    "model.vocab_size": Model("word-embedding rows", _POSITIVE_INT, none="the vocab file's size"),
    "model.hidden_act": Model("the GELU's form", _choices(HIDDEN_ACTS), none=""),
    "model.dtype": Model("matmul inputs' dtype", "one of float32, bfloat16, float16", none=""),
    "model.activation_dtype": Model(
        "dtype of the activations between matmuls", "one of float32, bfloat16, float16", none=""
    ),
    "model.residual_dtype": Model(
        "dtype of the residual stream", "one of float32, bfloat16, float16", none=""
    ),
    "model.scan_layers": Flag("nn.scan over the layers"),
    "model.remat_policy": Model("rematerialisation", _choices(REMAT_POLICIES), none=""),
    "model.attention_implementation": Model(
        "attention", _choices(ATTENTION_IMPLEMENTATIONS), none=""
    ),
    "model.splash_local_block": Model(
        "splash's tile of local layers", "a multiple of 128 dividing T (or >= T)", none=""
    ),
    "model.splash_fused_backward": Model("splash's backward as one kernel", "True or False"),
    "model.hidden_dropout_prob": Model("dropout of the residual branches", _PROB),
    "model.attention_probs_dropout_prob": Model("dropout of attention probabilities", _PROB),
    "model.embedding_size": Model("E, the embedding tables' width", _POSITIVE_INT, none="E = H"),
    "model.position_encoding": Model("positions", _choices(POSITION_ENCODINGS), none=""),
    "model.feed_forward": Model("the feed-forward block", _choices(FEED_FORWARDS), none=""),
    "model.norm_placement": Model("LayerNorm placement", _choices(NORM_PLACEMENTS), none=""),
    "model.linear_bias": Model("biases of the dense layers", "True or False", none=""),
    "model.norm_bias": Model("LayerNorm biases", "True or False", none=""),
    "model.max_position_embeddings": Model("positions the learned table covers", _POSITIVE_INT),
    "model.local_attention_window": Model("W of local layers", "an int >= 0", zero="all global"),
    "model.global_attention_every": Model("with a window, every K-th layer global", _POSITIVE_INT),
    "model.rope_theta": Model("rotary base, global layers", "a number > 0"),
    "model.local_rope_theta": Model("rotary base, local layers", "a number > 0", none="rope_theta"),
    "electra.generator_hidden_fraction": Float("generator H / H", 0, 1, open_low=True),
    "electra.generator_layer_fraction": Float("generator L / L", 0, 1, open_low=True),
    "electra.disc_weight": Float("λ of the discriminator's loss", 0, open_low=True),
    "data_dir": Text("the root every data path is built from"),
    "data.train_files": Text("training record globs, comma-separated"),
    "data.eval_files": Text("held-out record globs ('': no evaluation)"),
    "data.vocab_file": Text("the vocab the records were made with"),
    "data.do_lower_case": Flag("lower-case as the vocab was built"),
    "data.max_seq_length": Int("T of the records", 3),
    "data.max_predictions_per_seq": Int("P of the records: masked positions per row", 1),
    "data.dynamic_masking": Flag("records unmasked, masked per epoch here"),
    "data.masked_lm_prob": Prob("training masking rate (dynamic masking)", open_low=True),
    "data.eval_masked_lm_prob": Prob("held-out masking rate (dynamic masking)", open_low=True),
    "data.whole_word_mask": Flag("mask whole words (dynamic masking)"),
    "data.shuffle_buffer": Int("records per shuffled window (per stream)", 1),
    "data.num_streams": Int("streams the shards are dealt into", 1, none="one per process"),
    "data.pack": Flag("several instances per row"),
    "data.max_instances_per_row": Int("instance slots of a packed row", 1),
    "data.on_change": Enum("a resume on other data", ("refuse", "restart")),
    "data.allow_vocab_change": Flag("train on records made with another vocabulary"),
    "data.allow_eval_in_train": Flag("train_files and eval_files may share a file"),
    "global_batch_size": Int("sequences per step over all devices", 1),
    "num_train_steps": Int("length of the learning-rate schedule", 1, STEP_MAX),
    "stop_at_step": Int("the step this phase ends at", 1, STEP_MAX, none="num_train_steps"),
    "start_step": Int("the step this phase starts at (checked at restore)", 0, STEP_MAX),
    "sharding_rules": Bound("logical axis -> mesh axes", "rules", none="DEFAULT_RULES"),
    "shard_weight_update": Flag("params and moments split over data-parallel devices"),
    "shard_weight_update_spread": Flag("split leaves over two dimensions"),
    "shard_weight_update_explicit_gather": Flag("explicit all-gather of the kernels"),
    "grad_reduce_dtype": Enum("dtype of the kernels' gradient sum", STATE_DTYPES),
    "optimizer.name": Enum("the optimizer", PRETRAIN_OPTIMIZERS),
    "optimizer.learning_rate": Float("the peak", 0, open_low=True),
    "optimizer.warmup_steps": Int(
        "linear warmup updates", 0, STEP_MAX, zero="no warmup, the peak at once"
    ),
    "optimizer.schedule": Enum("after warmup", SCHEDULES),
    "optimizer.decay_power": Float("polynomial decay", 0, zero="no decay, the peak throughout"),
    "optimizer.decay_fraction": Prob("'wsd': the decaying end", open_low=True),
    "optimizer.decay_shape": Enum("'wsd': the decay's shape", DECAY_SHAPES),
    "optimizer.weight_decay": Float("decoupled decay (not LayerNorm, biases)", 0, zero="none"),
    "optimizer.b1": Prob("Adam's first-moment decay", open_high=True),
    "optimizer.b2": Prob("Adam's second-moment decay", open_high=True),
    "optimizer.eps": Float("Adam's denominator term", 0, open_low=True),
    "optimizer.max_grad_norm": Float("global-norm clipping", 0, zero="no clipping"),
    "optimizer.grad_accum_steps": Int("micro-batches per update", 1),
    "optimizer.mu_dtype": Enum("first-moment storage", STATE_DTYPES),
    "profile.start_step": Int("first step traced (>= 1 with a trace)", 0, STEP_MAX),
    "profile.num_steps": Int("steps traced", 0, STEP_MAX, zero="no trace"),
    "profile.all_processes": Flag("every host writes a trace"),
    "jax_cache_dir": Text("JAX's persistent compilation cache ('': none)"),
    "eval_every": Int("steps between evaluations", 0, STEP_MAX, zero="never"),
    "eval_steps": Int("held-out batches per evaluation", 1, STEP_MAX),
    "checkpoint_every": Int("steps between checkpoints", 0, STEP_MAX, zero=_FINAL_ONLY),
    "keep_checkpoints": Int("the newest K checkpoints kept", 1),
    "resume_from": Text("a checkpoints dir with a full state ('': none)"),
    "init_from": Text("params only: a checkpoint, TF checkpoint or HF dir ('': none)"),
    "allow_model_change": Flag("resume a checkpoint of another model"),
    "rollback.enabled": Flag("a spike restores the last checkpoint"),
    "rollback.spike_factor": Float("a spike: loss > factor x running median", 1, open_low=True),
    "rollback.median_window": Int("losses in the running median", 1, STEP_MAX),
    "rollback.skip_batches": Int(
        "batches skipped after the restored position", 0, STEP_MAX, zero="none"
    ),
    "rollback.max_rollbacks": Int("rollbacks within window_steps", 0, zero="a spike stops the run"),
    "rollback.window_steps": Int("steps over which rollbacks count", 1, STEP_MAX),
    "topology": Text("the Cloud TPU slice"),
    "bucket": Text("the gs:// bucket"),
}

FINETUNE: dict[str, Bound] = {
    **_SHARED,
    "max_seq_length": Int("pieces per example, [CLS]/[SEP] included", 4),
    "max_train_examples": Int("training examples used", 1, none="all"),
    "train_batch_size": Int("global training batch", 1),
    "eval_batch_size": Int("global scoring batch", 1),
    "num_epochs": Int("passes over the training split", 1),
    "learning_rate": Float("the peak, after warmup", 0, open_low=True),
    "warmup_proportion": Prob("of all steps, linear from 0", zero="no warmup"),
    "optimizer": Enum("the optimizer", FINETUNE_OPTIMIZERS),
    "weight_decay": Float("decoupled decay (not LayerNorm, biases)", 0, zero="none"),
    "max_grad_norm": Float("global-norm clipping", 0, zero="no clipping"),
    "init_from": Text("the pretrained encoder"),
    "bert_config_file": Text("replaces the config beside init_from"),
    "vocab_file": Text("'': the vocab beside init_from"),
    "do_lower_case": Flag("lower-case the text", none="the encoder's casing"),
    "allow_vocab_change": Flag("a vocab_file other than the encoder's own"),
    "from_scratch": Flag("random weights (the baseline)"),
    "model_overrides.hidden_dropout_prob": Prob("dropout", open_high=True, none="the checkpoint's"),
    "model_overrides.dtype": Enum(
        "matmul inputs' dtype", ("float32", "bfloat16", "float16"), none="the checkpoint's"
    ),
    "model_overrides.attention_implementation": Enum(
        "attention", ATTENTION_IMPLEMENTATIONS, none="the checkpoint's"
    ),
    "encoder_preset": Enum(
        "init_from's architecture (checked; aot_compile builds it)", (*PRESETS, *MODERN_PRESETS)
    ),
    "topology": Text("the Cloud TPU slice aot_compile compiles for"),
    "task": Text("the task's registry name"),
    "data_dir": Text("the task's files ('': the cached copy)"),
    "data_source": Enum("where the data comes from", ("tsv", "tfds", "json")),
    "skip_malformed": Flag("skip unparsable rows"),
    "pooling": Enum(
        "what the classifier (cls, mean) or the embedding reads", ("cls", "mean", "last")
    ),
    "labels": Text("your classes in id order, comma-separated ('': the training file's)"),
    "label_type": Enum("your labels: classes, or numbers to regress on", LABEL_TYPES),
    "chunk_size": Int("pairs embedded at a time (GradCache)", 0, zero="the whole batch"),
    "normalize": Flag("the saved embedding model L2-normalises"),
    "scale": Float("cosine x scale = logits (1 / temperature)", 0, open_low=True),
    "symmetric": Flag("also each positive against every query"),
    "matryoshka_dims": ListOf(
        "Matryoshka: embedding prefixes also trained and scored, comma-separated ('': off)",
        Int("", 1),
    ),
    "corpus_files": Text("raw text the pairs are made from, comma-separated ('': train_file)"),
    "crop_min_ratio": Float("a crop's share of its passage: at least", 0, 1, open_low=True),
    "crop_max_ratio": Float("a crop's share of its passage: at most", 0, 1, open_low=True),
    "token_deletion": Float("each cropped piece dropped with this probability", 0, 0.9),
    "sentence_fraction": Prob("pairs made by sentence -> the rest of its passage"),
    "keep_sentence": Prob("that sentence left in its positive"),
    "passages_per_document": Int("passages of one document in a batch", 1),
    "mlm_weight": Float("+ this x the masked positives' MLM loss", 0, zero="contrastive alone"),
    "query_max_seq_length": Int("query pieces kept", 0, zero="max_seq_length"),
    "checkpoint_every": Int("steps between resumable saves", 0, zero="at the end only"),
    "keep_tail": Int("a long text's last pieces kept", 0, zero="the head only"),
    "eval_every_epochs": Int("scored every N-th epoch and the last", 1),
    "train_file": Text("training data"),
    "dev_file": Text("dev data"),
    "test_file": Text("test data ('': none)"),
    "data_file": Text("the task's data"),
    "tag_column": Int("the tag column (Python's index: -1 the last)"),
    "version": Enum("SQuAD's version", ("v1.1", "v2.0")),
    "predict_file": Text("the scored split"),
    "skip_mismatched": Flag("skip answers whose offsets miss their text"),
    "realign_mismatched": Flag("move them to their text"),
    "doc_stride": Int("pieces between window starts", 1),
    "max_query_length": Int("question pieces kept", 1),
    "n_best_size": Int("candidates per question", 1),
    "max_answer_length": Int("answer pieces at most", 1),
    "null_score_diff_threshold": Float("v2.0: the null-score margin"),
    "teacher": Text("the teacher's checkpoint"),
    "student_preset": Enum("the student's sizes", tuple(PRESETS)),
    "student_init_from": Text("the student's pretraining checkpoint ('': none)"),
    "teacher_layers": Text("teacher layers the student copies ('': none)"),
    "temperature": Float("softens both distributions", 0, open_low=True),
    "alpha": Prob("weight of the teacher's term", zero="labels alone"),
    "teacher_logits": Enum("when the teacher runs", ("step", "precompute")),
    "compare_without_teacher": Flag("also train with alpha = 0"),
    "benchmark": Flag("measure inference speed"),
    "bench_batch_size": Int("sequences per timed batch", 1),
    "bench_repeats": Int("timed passes", 1),
    "train_files": Text("training record globs"),
    "eval_files": Text("held-out record globs ('': no evaluation)"),
    "max_predictions_per_seq": Int("P of the records", 1),
    "cosine_weight": Float("weight of the hidden states' (1 - cos)", 0, zero="no such term"),
    "global_batch_size": Int("sequences per step", 1),
    "num_train_steps": Int("training steps", 1, STEP_MAX),
    "eval_steps": Int("held-out batches scored", 1, STEP_MAX),
    "layers": Text("how hidden states combine (feature_based.check_combination)"),
    "lstm_size": Int("units per direction of each BiLSTM", 1),
    "dropout_rate": Prob("dropout of the BiLSTM tagger", open_high=True),
}

DEMO: dict[str, Bound] = {
    "task": Text("the downstream task (absl checks the choices)"),
    "workdir": Text("where everything is written"),
    "corpus_dir": Text("corpus and vocab ('': beside the workdir)"),
    "corpora": ListOf("embedded corpora, joined", Text("a prepare_corpus name")),
    "seed": Int("every seed of the run", 0, SEED_MAX),
    "recipe": Text("the pretraining arm (absl checks the choices)"),
    "pretrain_steps": Int("pretraining steps", 1, STEP_MAX, none="the task's or recipe's"),
    "pretrain_batch_size": Int("pretraining sequences per step", 1, none="the task's"),
    "pretrain_learning_rate": Float("pretraining peak", 0, open_low=True, none="the recipe's"),
    "pretrain_optimizer": Text("pretraining optimizer (absl checks the choices)"),
    "max_seq_length": Int("pretraining T", 8, none="the task's"),
    "pretrained_dir": Text("fine-tune this model instead", none="pretrain one"),
    "dupe_factor": Int("polarity: masked copies of the corpus", 1),
    "vocab_size": Int("vocabulary size at most", 6),
    "label_budgets": ListOf("labelled sentences per run", Int("", 1), words=("all",)),
    # Paired runs: the report's interval needs two subsets at least.
    "subsets": Int("label subsets per budget (paired runs)", 2, none="the task's"),
    "finetune_learning_rates": ListOf("fine-tuning peaks", Float("", 0, open_low=True)),
    "finetune_optimizer": Text("fine-tuning optimizer (absl checks the choices)"),
    "compare_finetune_optimizers": Flag("also the other optimizer"),
    "finetune_epochs": Int("fine-tuning epochs at least", 1, none="the task's"),
    "min_finetune_steps": Int("steps at least", 0, STEP_MAX, none="the task's", zero="no minimum"),
    "max_finetune_steps": Int("ner: steps at most", 1, STEP_MAX),
    "finetune_batch_size": Int("ner: fine-tuning batch", 1),
    "scratch_cache_dir": Text("shared scratch runs ('': the workdir's)"),
    "dev_sentences": Int("ner: dev sentences choosing the stop", 1),
    "test_sentences": Int("ner: test sentences scored", 1, none="all"),
    "pooling": Text("polarity: what the classifier reads (absl checks the choices)"),
}

TABLES = {"pretrain": PRETRAIN, "finetune": FINETUNE, "demo": DEMO}
# How a tool's user spells a key of each table.
_PREFIX = {"pretrain": "--config.", "finetune": "--config.", "demo": "--"}


# --- the check -------------------------------------------------------------------------------


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a (nested) config as dotted key -> value."""
    out = {}
    for key, value in config.items():
        if hasattr(value, "items"):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def unranged(config: Mapping[str, Any], kind: str) -> list[str]:
    """The keys of `config` that `TABLES[kind]` states no range for."""
    return sorted(set(flatten(config)) - set(TABLES[kind]))


def check(
    config: Mapping[str, Any],
    kind: str,
    *,
    devices: int | None = None,
    processes: int | None = None,
) -> None:
    """Refuses `config` (a `kind` config: "pretrain", "finetune", or "demo"'s flag values) at
    its first key outside its range, else at its first broken rule between keys.

    `devices` / `processes` (the run's device and process counts) add the rules that need
    them (the batch over the data-parallel devices and the data streams). A key the table
    lacks is not checked (tests/test_config_bounds.py catches it in the repository's configs).

    Raises:
        ConfigError: one line naming each key, its value and its range.
    """
    table, prefix = TABLES[kind], _PREFIX[kind]
    values = flatten(config)
    for key, value in values.items():
        bound = table.get(key)
        if bound is not None and bound.allows(value) is False:
            zero = f"; 0: {bound.zero}" if bound.zero else ""
            listed = bound.kind == "list" and isinstance(value, list | tuple)
            shown = ",".join(map(str, value)) if listed else repr(value)
            raise ConfigError(
                f"{prefix}{key}={shown} is outside its range: {bound.describe()} "
                f"({bound.meaning}{zero})"
            )
    rules = {"pretrain": _pretrain_rules, "finetune": _finetune_rules, "demo": _demo_rules}
    for problem in rules[kind](values, devices, processes):
        raise ConfigError(problem)


def check_or_exit(config: Mapping[str, Any], kind: str, tool: str, **counts) -> None:
    """`check`, a refusal exiting the tool with its one line (`tool: ...`), no traceback."""
    try:
        check(config, kind, **counts)
    except ConfigError as error:
        raise SystemExit(f"{tool}: {error}") from None


def model_of(values: Mapping[str, Any]) -> BertConfig:
    """The BertConfig a pretraining config's flat `model.*` keys describe (vocab_size left
    to the vocab file: BERT's 30522 here). Raises ConfigError naming the block."""
    model = {k.removeprefix("model."): v for k, v in values.items() if k.startswith("model.")}
    try:
        return BertConfig.from_experiment(model, None, values.get("objective", "mlm_nsp"))
    except (ConfigError, TypeError) as error:
        raise ConfigError(f"--config.model: {error}") from None


def _batch_axes(rules) -> tuple[str, ...]:
    """The mesh axes the `batch` rule of `sharding_rules` splits examples over."""
    axes = dict(rules).get("batch", DEFAULT_BATCH_AXES) if rules else DEFAULT_BATCH_AXES
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _data_parallel(values, devices: int, batch_keys: tuple[str, ...]) -> Iterator[str]:
    """Each of `batch_keys` that does not divide over the data-parallel devices."""
    mesh = values["mesh_shape"]
    try:
        shape = dict(zip(MESH_AXES, resolve_mesh_shape(mesh, devices), strict=True))
    except ValueError as error:
        yield f"--config.mesh_shape={tuple(mesh)} on {devices} devices: {error}"
        return
    axes = _batch_axes(values.get("sharding_rules"))
    ways = math.prod(shape[a] for a in axes)
    for key in batch_keys:
        batch = values[key]
        if batch % ways:
            split = " x ".join(f"{a} {shape[a]}" for a in axes)
            yield (
                f"--config.{key}={batch} does not divide over the {ways} data-parallel devices "
                f"of --config.mesh_shape={tuple(mesh)} on {devices} devices ({split}): use a "
                f"multiple of {ways}"
            )


def _pretrain_rules(values, devices, processes) -> Iterator[str]:
    cfg = model_of(values)
    seq, predictions = values["data.max_seq_length"], values["data.max_predictions_per_seq"]
    if predictions > seq:
        yield (
            f"--config.data.max_predictions_per_seq={predictions} > --config.data.max_seq_length"
            f"={seq}: a row of T tokens has at most T masked positions"
        )
    if cfg.position_encoding == "learned" and seq > cfg.max_position_embeddings:
        yield (
            f"--config.data.max_seq_length={seq} > the {cfg.max_position_embeddings} positions "
            f"of --config.model.preset={values['model.preset']!r} (model.max_position_embeddings)"
        )
    if cfg.local_attention_window > seq:
        yield (
            f"--config.model.local_attention_window={cfg.local_attention_window} (preset "
            f"{values['model.preset']!r}) > --config.data.max_seq_length={seq}: every local "
            "layer would attend the whole row; set model.local_attention_window=0"
        )
    steps, accum = values["num_train_steps"], values.get("optimizer.grad_accum_steps", 1)
    warmup, updates = values["optimizer.warmup_steps"], steps // accum
    if warmup > updates:
        per = f" / --config.optimizer.grad_accum_steps={accum}" if accum > 1 else ""
        yield (
            f"--config.optimizer.warmup_steps={warmup} > the {updates} updates of "
            f"--config.num_train_steps={steps}{per}: the peak would never be reached"
        )
    stop, start = values.get("stop_at_step"), values.get("start_step") or 0
    if stop is not None and stop > steps:
        yield f"--config.stop_at_step={stop} > --config.num_train_steps={steps}"
    if start >= (stop or steps):
        yield (
            f"--config.start_step={start} >= the step this phase stops at "
            f"({'--config.stop_at_step' if stop else '--config.num_train_steps'}={stop or steps})"
        )
    if values.get("profile.num_steps") and values["profile.start_step"] < 1:
        yield (
            f"--config.profile.start_step={values['profile.start_step']} with "
            f"--config.profile.num_steps={values['profile.num_steps']}: the first step is 1 "
            "(it also compiles: trace from 2 on)"
        )
    if values.get("rollback.enabled") and not values["checkpoint_every"]:
        yield (
            "--config.rollback.enabled=True with --config.checkpoint_every=0: a rollback "
            "restores the last periodic checkpoint; set checkpoint_every >= 1"
        )
    reduce = values.get("grad_reduce_dtype", "float32")
    if reduce != "float32" and values["model.dtype"] != reduce:
        yield (
            f"--config.grad_reduce_dtype={reduce!r} needs --config.model.dtype={reduce!r} "
            f"(got {values['model.dtype']!r}): the kernels are read in it"
        )
    batch, streams = values["global_batch_size"], values.get("data.num_streams")
    if streams and batch % streams:
        yield (
            f"--config.global_batch_size={batch} does not divide over "
            f"--config.data.num_streams={streams} data streams: use a multiple of {streams}"
        )
    elif not streams and processes and batch % processes:
        yield (
            f"--config.global_batch_size={batch} does not divide over the {processes} "
            "processes' data streams (--config.data.num_streams: one per process by default)"
        )
    if devices is not None:
        yield from _data_parallel(values, devices, ("global_batch_size",))


def _finetune_rules(values, devices, processes) -> Iterator[str]:
    del processes  # fine-tuning reads its data on every process
    seq = values.get("max_seq_length")
    tail = values.get("keep_tail")
    if seq is not None and tail is not None and tail >= seq - 2:
        yield (
            f"--config.keep_tail={tail} >= --config.max_seq_length={seq} - 2: the tail would "
            "leave no room for the head"
        )
    query = values.get("max_query_length")
    if seq is not None and query is not None and query + 3 >= seq:
        yield (
            f"--config.max_query_length={query} + 3 >= --config.max_seq_length={seq}: no "
            "room is left for the paragraph ([CLS] and two [SEP]s take 3)"
        )
    if values.get("pooling") == "last" and "chunk_size" not in values:
        yield "--config.pooling='last' is an embedding pooling; a classifier reads cls or mean"
    if "chunk_size" in values:  # contrastive fine-tuning (experiments.finetune_embeddings)
        batch, chunk = values.get("global_batch_size"), values["chunk_size"]
        if batch is not None and batch < 2:
            yield (f"--config.global_batch_size={batch}: a batch of one pair has no in-batch "
                   "negatives; 2 at least")  # fmt: skip
        if batch and chunk and batch % chunk:
            yield f"--config.chunk_size={chunk} does not divide --config.global_batch_size={batch}"
        low, high = values.get("crop_min_ratio"), values.get("crop_max_ratio")
        if low is not None and high is not None and low > high:
            yield f"--config.crop_min_ratio={low} > --config.crop_max_ratio={high}"
        queries = values.get("query_max_seq_length")
        if queries and seq is not None and queries > seq:
            yield f"--config.query_max_seq_length={queries} > --config.max_seq_length={seq}"
        yield from splash_widths(values, values.get("model_overrides.attention_implementation"))
        dims = values.get("matryoshka_dims")
        with contextlib.suppress(ValueError, TypeError):  # not ints: its range says so
            if dims and len(set(int_list(dims))) != len(int_list(dims)):
                yield f"--config.matryoshka_dims={dims!r} names a size twice"
        if values.get("train_file") and values.get("corpus_files"):
            yield ("--config.train_file and --config.corpus_files both set: pairs come from a "
                   "pairs file or are made from raw text, not both")  # fmt: skip
    predictions = values.get("max_predictions_per_seq")
    if seq is not None and predictions is not None and predictions > seq:
        yield (f"--config.max_predictions_per_seq={predictions} > --config.max_seq_length={seq}")
    if devices is not None:
        batch_keys = ("train_batch_size", "eval_batch_size", "global_batch_size")
        yield from _data_parallel(values, devices, tuple(k for k in batch_keys if k in values))


def splash_widths(values, attention: str | None) -> Iterator[str]:
    """Under splash attention, a text length key (the widest a contrastive batch is padded
    to) that is not a multiple of the kernel's 128-token tiles."""
    for key in ("max_seq_length", "query_max_seq_length"):
        if attention == "splash" and (values.get(key) or 0) % SPLASH_TILE:
            yield (f"--config.{key}={values[key]} under attention_implementation='splash': "
                   f"a multiple of {SPLASH_TILE} (splash's tiles)")  # fmt: skip


def int_list(value) -> tuple[int, ...]:
    """A list key's ints: a comma-separated string ("64,128"; "" is none) or a list/tuple."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    return tuple(int(v) for v in value)


def _demo_rules(values, devices, processes) -> Iterator[str]:
    del devices, processes  # the demo's stages check their own
    low, high = values.get("min_finetune_steps"), values.get("max_finetune_steps")
    if values.get("task") == "ner" and low is not None and high is not None and low > high:
        yield f"--min_finetune_steps={low} > --max_finetune_steps={high}"


# --- the documentation -------------------------------------------------------------------------

_TITLES = {
    "pretrain": "Pretraining configs (`experiments.pretrain`, `aot_compile`, `tpu_slice`)",
    "finetune": "Fine-tuning configs (`finetune_*`, `distill_*`, `feature_based_*`)",
    "demo": "`experiments.demo`'s flags",
}


def markdown() -> str:
    """docs/config_bounds.md: every key's range, and what 0 or None means where it means
    something, from the tables above."""
    lines = [
        "# Config bounds",
        "",
        "Generated from `bert_jax/config_bounds.py` (tests/test_config_bounds.py checks that "
        "this file matches it). Every run checks its config against these ranges at load, "
        "before data, mesh or compile, and refuses a value outside in one line naming the "
        "key, the value and the range; then the rules between keys (T and P, warmup and "
        "steps, the batch over the data-parallel devices and the data streams, ...). The "
        "`model.*` keys are checked by `bert_jax.config.BertConfig`.",
    ]
    for kind, table in TABLES.items():
        lines += ["", f"## {_TITLES[kind]}", "", "| key | range | 0 / None | meaning |"]
        lines.append("|---|---|---|---|")
        for key, bound in table.items():
            special = "; ".join(
                f"{what}: {text}" for what, text in (("0", bound.zero), ("None", bound.none))
                if text
            )  # fmt: skip
            lines.append(
                f"| `{_PREFIX[kind]}{key}` | {bound.describe()} | {special} | {bound.meaning} |"
            )
    return "\n".join(lines) + "\n"
