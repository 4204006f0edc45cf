"""Issue 74 (hardening 4): Ctrl-C saves, no tool writes over its own input, a path with
brackets is refused or read literally, nothing is read from outside the directory it
belongs to, and the unclear errors name their key, flag or file.

In-process unit tests, and one tiny in-process pretraining run (the Ctrl-C save).
"""

import json
import logging
import os
import signal

import numpy as np
import pytest
import synthetic_pretraining as synth

from bert_jax import checkpointing, config_bounds, finetune_common, telemetry, train, workdir_lock
from bert_jax.convert import output_dir
from data_pipelines import build_vocab, corpora, input_pipeline, paths, tfrecord_files
from data_pipelines import create_pretraining_data as cpd

# --- signals: pretraining ---------------------------------------------------------------------


def test_first_ctrl_c_asks_for_a_save_and_the_second_aborts_at_once():
    previous = signal.getsignal(signal.SIGINT)
    watcher = checkpointing.PreemptionWatcher(manager=None)
    try:
        assert not watcher.should_stop(1)
        os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: no exception
        assert watcher.should_stop(1) and watcher.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0.1)  # (gives the handler a moment, if it needs one)
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGINT) is previous


def test_sigterm_still_stops_without_an_exception_and_names_itself():
    watcher = checkpointing.PreemptionWatcher(manager=None)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.should_stop(3) and watcher.signal_name == "SIGTERM"
    finally:
        watcher.close()


@pytest.mark.usefixtures("compile_cache")
def test_ctrl_c_during_pretraining_saves_the_step_and_raises(tmp_path, monkeypatch, caplog):
    from bert_jax import train_loop

    data = tmp_path / "data"
    data.mkdir()
    synth.write_records(str(data), "train", 1, 32, seed=0)
    config = synth.tiny_config(str(data))
    config.model.num_hidden_layers = 1
    config.data.eval_files = ""
    config.num_train_steps, config.checkpoint_every, config.log_every = 6, 0, 1
    real_setup = train.setup

    def setup(config, mesh, vocab_size=None):
        run = real_setup(config, mesh, vocab_size)

        def step(state, batch, rng):
            state, metrics = run.train_step(state, batch, rng)
            if int(state.step) == 2:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in step 2
            return state, metrics

        return run._replace(train_step=step)

    monkeypatch.setattr(train, "setup", setup)
    with caplog.at_level(logging.WARNING), pytest.raises(checkpointing.Interrupted) as stopped:
        train_loop.train_and_evaluate(config, str(tmp_path / "run"))
    assert "stopped by SIGINT after step 2" in str(stopped.value)
    manager = checkpointing.make_manager(tmp_path / "run" / "checkpoints", create=False)
    assert list(manager.all_steps()) == [2]  # saved, and readable
    state, _, _ = checkpointing.restore(manager, None, None)
    assert int(state["step"]) == 2
    assert "Ctrl-C (SIGINT) received" in caplog.text


# --- signals: fine-tuning ---------------------------------------------------------------------


def test_finetune_signal_during_training_says_nothing_was_saved(caplog):
    with pytest.raises(SystemExit) as exited, finetune_common.stopping_on_signals("ft"):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.1)
    assert exited.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM during training: nothing of this run was saved" in caplog.text


def test_finetune_signal_during_the_final_save_lets_it_complete(tmp_path, caplog):
    target = tmp_path / "checkpoint"
    with pytest.raises(SystemExit) as exited, finetune_common.stopping_on_signals("ft"):
        with finetune_common.final_save("the checkpoint"):
            with output_dir.writing_dir(str(target)) as tmp:
                os.kill(os.getpid(), signal.SIGINT)  # waits for the save
                with open(os.path.join(tmp, "config.json"), "w") as f:
                    f.write("new")
            (tmp_path / "metrics.json").write_text("{}")
    assert exited.value.code == 128 + signal.SIGINT
    assert (target / "config.json").exists() and (tmp_path / "metrics.json").exists()
    assert "during the final save, which completed first" in caplog.text


def test_finetune_second_signal_during_the_final_save_undoes_it(tmp_path, caplog):
    target = tmp_path / "checkpoint"
    target.mkdir()
    (target / "config.json").write_text("old")
    with pytest.raises(SystemExit) as exited, finetune_common.stopping_on_signals("ft"):
        with finetune_common.final_save("the checkpoint"):
            with output_dir.writing_dir(str(target), overwrite=True) as tmp:
                with open(os.path.join(tmp, "config.json"), "w") as f:
                    f.write("new")
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)  # the second: at once
                signal.sigtimedwait([], 0.1)
            (tmp_path / "metrics.json").write_text("{}")
    assert exited.value.code == 128 + signal.SIGTERM
    assert (target / "config.json").read_text() == "old"
    assert not (tmp_path / "metrics.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]  # no temporary left
    assert "during the final save, which was undone" in caplog.text


def test_save_finetuned_writes_one_temporary_and_a_rerun_removes_nested_ones(tmp_path, monkeypatch):
    from bert_jax.config import BertConfig
    from bert_jax.convert import readers

    workdir = tmp_path / "w"
    workdir.mkdir()
    # What a killed save of the old code left: a temporary nested in its own temporary's name.
    (workdir / "..checkpoint.tmp-999999999-abc.tmp-999999999-def").mkdir()
    seen = []

    def killed(directory, *args, **kwargs):
        seen.extend(os.listdir(workdir))
        raise KeyboardInterrupt

    monkeypatch.setattr(readers, "write_params", killed)
    with pytest.raises(KeyboardInterrupt):
        finetune_common.save_finetuned(
            str(workdir / "checkpoint"), BertConfig(), {}, vocab_file=None, metadata={}
        )
    assert len(seen) == 1 and seen[0].startswith(".checkpoint.tmp-")  # the nested one gone
    assert os.listdir(workdir) == []


# --- outputs that are inputs --------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("one line of text.\nanother line.\n\nsecond document here.\n")
    return path


def _spellings(tmp_path, corpus):
    link = tmp_path / "link.txt"
    link.symlink_to(corpus)
    hard = tmp_path / "hard.txt"
    os.link(corpus, hard)
    (tmp_path / "sub").mkdir()
    return [
        str(corpus),
        str(link),
        str(hard),
        f"{tmp_path}/sub/../corpus.txt",
        f"{tmp_path}/./corpus.txt",
    ]


def test_check_not_an_input_sees_every_spelling_of_the_same_file(tmp_path, corpus):
    for output in _spellings(tmp_path, corpus):
        with pytest.raises(paths.OutputIsInputError, match="corpus.txt"):
            paths.check_not_an_input(output, [str(corpus)])
    with pytest.raises(paths.OutputIsInputError, match="holds"):  # a directory above it
        paths.check_not_an_input(str(tmp_path), [str(corpus)])
    with pytest.raises(paths.OutputIsInputError, match="is inside"):
        paths.check_not_an_input(str(tmp_path / "sub" / "x"), [str(tmp_path / "sub")])
    paths.check_not_an_input(str(tmp_path / "out.txt"), [str(corpus), None])  # fine


def test_create_pretraining_data_refuses_its_input_as_output_before_reading(tmp_path, corpus):
    before = corpus.read_bytes()
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    for output, inputs in [
        (str(tmp_path / "link.txt"), str(corpus)),  # a symlink to the input
        (str(corpus), f"{tmp_path}/*.txt"),  # a glob that matches it
        (str(vocab), str(corpus)),  # the vocabulary
    ]:
        if not os.path.lexists(tmp_path / "link.txt"):
            (tmp_path / "link.txt").symlink_to(corpus)
        options = cpd.Options(input_file=inputs, output_file=output, vocab_file=str(vocab))
        with pytest.raises(paths.OutputIsInputError):
            cpd.create_pretraining_data(options)
    assert corpus.read_bytes() == before


def test_build_vocab_refuses_its_input_as_output(tmp_path, corpus):
    before = corpus.read_bytes()
    for output in _spellings(tmp_path, corpus):
        with pytest.raises(paths.OutputIsInputError):
            build_vocab.build_vocab(str(corpus), output, vocab_size=30, do_lower_case=True)
    assert corpus.read_bytes() == before


def test_extract_features_refuses_its_input_before_loading_the_checkpoint(tmp_path, corpus):
    from experiments import extract_features

    for output in _spellings(tmp_path, corpus):
        with pytest.raises(paths.OutputIsInputError):
            extract_features.run(str(corpus), output, str(tmp_path / "no_such_checkpoint"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(paths.OutputIsInputError, match="config.json"):
        extract_features.check_output_is_not_input(
            str(model / "config.json"), str(corpus), str(model)
        )
    extract_features.check_output_is_not_input(str(model / "f.jsonl"), str(corpus), str(model))


def test_a_directory_as_input_file_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="is a directory"):
        corpora.expand_input_patterns(str(tmp_path))


# --- paths with glob characters -----------------------------------------------------------------


def test_workdir_with_brackets_is_refused_naming_them(tmp_path):
    workdir = tmp_path / "w[2]"
    with pytest.raises(workdir_lock.WorkdirError, match=r"'\[' '\]'"):
        workdir_lock.acquire(str(workdir))
    assert not workdir.exists()
    with pytest.raises(SystemExit, match="pretrain: --workdir=.*w\\[2\\]"):
        with workdir_lock.hold_or_exit(str(tmp_path / "w[2]"), "pretrain"):
            pass
    with pytest.raises(checkpointing.CheckpointError, match="glob"):
        checkpointing.make_manager(str(tmp_path / "ft*" / "checkpoints"))


def test_a_file_as_workdir_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="pretrain: cannot write to --workdir=.*file"):
        with workdir_lock.hold_or_exit(str(tmp_path / "file"), "pretrain"):
            pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_workdir_is_one_line(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(SystemExit, match="pretrain: cannot write to --workdir"):
            with workdir_lock.hold_or_exit(str(tmp_path / "new"), "pretrain"):
                pass
        with pytest.raises(SystemExit, match="cannot write to --workdir"):
            with workdir_lock.hold_or_exit(str(tmp_path), "pretrain"):
                pass
    finally:
        tmp_path.chmod(0o700)


def test_records_in_a_directory_with_brackets_are_read_literally(tmp_path):
    directory = tmp_path / "records[1]"
    directory.mkdir()
    synth.write_records(str(directory), "train", 2, 8, seed=0)
    files = sorted(str(p) for p in directory.glob("train-*"))
    assert input_pipeline.list_files(str(directory / "train-*")) == files
    assert input_pipeline.list_files(files[1]) == [files[1]]


# --- stats JSONs --------------------------------------------------------------------------------


def _shard_set(directory, vocab):
    names = [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    for name in names:
        (directory / name).write_bytes(b"")
    stats = {"output_files": [str(directory / n) for n in names], "vocab": vocab}
    (directory / (names[0] + tfrecord_files.STATS_SUFFIX)).write_text(json.dumps(stats))
    return [str(directory / n) for n in names]


def test_every_shard_finds_its_stats_not_only_shard_0(tmp_path):
    files = _shard_set(tmp_path, {"file": "v.txt", "sha256": "ab"})
    stats, unnamed = tfrecord_files.stats_of(files[1:])  # a glob that skips shard 0
    assert unnamed == [] and [s["vocab"]["sha256"] for s in stats.values()] == ["ab"]
    (tmp_path / "other.tfrecord").write_bytes(b"")
    _, unnamed = tfrecord_files.stats_of([str(tmp_path / "other.tfrecord")])
    assert unnamed == [str(tmp_path / "other.tfrecord")]


def test_a_truncated_stats_json_names_the_file_line_and_column(tmp_path):
    files = _shard_set(tmp_path, None)
    stats_path = files[0] + tfrecord_files.STATS_SUFFIX
    with open(stats_path, "r+") as f:
        f.truncate(20)
    with pytest.raises(ValueError, match=rf"{stats_path}: not a readable stats JSON .*line 1"):
        tfrecord_files.stats_of(files[2:])


# --- bounds and metrics paths -------------------------------------------------------------------


@pytest.mark.parametrize("key", ["num_train_steps", "checkpoint_every", "log_every"])
def test_step_counts_past_int32_are_refused_naming_the_key(key):
    from experiments.configs import bert_tiny_cpu

    config = bert_tiny_cpu.get_config()
    config[key] = 3_000_000_000
    with pytest.raises(SystemExit, match=rf"--config.{key}=3000000000 .*2\*\*31 - 1"):
        config_bounds.check_or_exit(config, "pretrain", "pretrain")


def test_metrics_paths_that_cannot_be_written_are_named(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(telemetry.MetricsPathError, match="metrics.jsonl is a directory"):
        telemetry.check_metrics_paths(str(tmp_path))
    (tmp_path / "metrics.jsonl").rmdir()
    (tmp_path / "tensorboard").write_text("")
    with pytest.raises(telemetry.MetricsPathError, match="tensorboard is a file"):
        telemetry.check_metrics_paths(str(tmp_path))
    (tmp_path / "tensorboard").unlink()
    telemetry.check_metrics_paths(str(tmp_path))
    np.testing.assert_equal(os.listdir(tmp_path), [])


# --- convert: nothing from outside, weights that are weights --------------------------------


@pytest.mark.parametrize(
    "name", ["../other/model.safetensors", "/etc/model.safetensors", "sub/../../x.safetensors"]
)
def test_an_index_naming_a_file_outside_the_model_directory_is_refused(tmp_path, name):
    from bert_jax.convert import ConversionError, readers

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    index = {"weight_map": {"embeddings.word_embeddings.weight": name}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConversionError, match=f"names {name!r}, outside the model directory"):
        readers.open_source(str(model))


def test_a_symlink_out_of_the_model_directory_is_refused(tmp_path):
    from bert_jax.convert import ConversionError, readers

    (tmp_path / "other.safetensors").write_bytes(b"")
    model = tmp_path / "model"
    model.mkdir()
    (model / "w.safetensors").symlink_to(tmp_path / "other.safetensors")
    index = {"weight_map": {"a": "w.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConversionError, match="outside the model directory"):
        readers.open_source(str(model))


def test_int_and_non_finite_weights_are_refused_naming_the_tensor():
    from bert_jax.convert import ConversionError, readers

    with pytest.raises(ConversionError, match="tensor 'w' is int32, not floating point"):
        readers._check_weights(np.ones(3, np.int32), "tensor 'w'", allow_non_finite=True)
    bad = np.array([1.0, np.nan, np.inf], np.float32)
    with pytest.raises(ConversionError, match="tensor 'e' holds 2 non-finite value"):
        readers._check_weights(bad, "tensor 'e'", allow_non_finite=False)
    readers._check_weights(bad, "tensor 'e'", allow_non_finite=True)  # allowed when asked
    import ml_dtypes

    readers._check_weights(np.ones(2, ml_dtypes.bfloat16), "b", allow_non_finite=False)


def test_an_export_with_nan_weights_is_refused_and_writes_nothing(tmp_path):
    from bert_jax.config import BertConfig
    from bert_jax.convert import ConversionError, readers

    params = {"bert": {"embeddings": {"word_embeddings": {"embedding": np.full((2, 2), np.nan)}}}}
    with pytest.raises(ConversionError, match="bert/embeddings/word_embeddings/embedding"):
        readers.save_params(str(tmp_path / "out"), BertConfig(), params)
    assert os.listdir(tmp_path) == []


# --- fingerprints -----------------------------------------------------------------------------


def test_train_and_eval_patterns_matching_the_same_file_are_refused(tmp_path):
    from bert_jax import pretraining_input
    from bert_jax.config import ConfigError

    synth.write_records(str(tmp_path), "train", 1, 8, seed=0)
    synth.write_records(str(tmp_path), "eval", 1, 8, seed=1)
    config = synth.tiny_config(str(tmp_path))
    config.data.train_files = f"{tmp_path}/*.tfrecord"  # the eval records too
    with pytest.raises(ConfigError, match=r"both match .*eval-00000.tfrecord.*allow_eval_in"):
        pretraining_input.check_eval_apart(config)
    config.data.allow_eval_in_train = True
    pretraining_input.check_eval_apart(config)
    config.data.allow_eval_in_train = False
    config.data.train_files = f"{tmp_path}/train-*"
    pretraining_input.check_eval_apart(config)


def _vocab(path, extra=()):
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *extra]) + "\n")
    return str(path)


def test_convert_copies_only_the_vocab_the_checkpoint_was_trained_with(tmp_path, caplog):
    from bert_jax.convert import readers
    from data_pipelines import vocab_fingerprint

    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    outside = _vocab(tmp_path / "vocab.txt", ["a"])
    saved = vocab_fingerprint.fingerprint(outside)
    checkpoints = str(workdir / "checkpoints")

    def found(vocab_file, fingerprint=None, rows=6, model=None):
        experiment = {"data": {"vocab_file": vocab_file}, "model": model or {}}
        if fingerprint:
            experiment["vocab_fingerprint"] = fingerprint
        return readers._saved_vocab(checkpoints, experiment, rows)

    assert found(outside, saved) == outside  # outside, but the very file it was trained with
    assert found(outside) is None  # outside, nothing to check it by
    assert "outside the workdir" in caplog.text
    inside = _vocab(workdir / "vocab.txt", ["a"])
    assert found(inside) == inside
    assert found(inside, rows=9) is None  # 6 tokens, 9 rows: another model's
    assert found(inside, rows=9, model={"vocab_size": 9}) == inside  # padded rows
    _vocab(tmp_path / "vocab.txt", ["b"])  # the file changed since the checkpoint
    assert found(outside, saved) is None
    assert "not the vocabulary this checkpoint was trained with" in caplog.text


def test_init_from_refuses_a_checkpoint_of_another_vocabulary(tmp_path):
    import jax.numpy as jnp

    from bert_jax import train_loop
    from data_pipelines import vocab_fingerprint

    trained = _vocab(tmp_path / "trained.txt", ["a"])
    manager = checkpointing.make_manager(str(tmp_path / "ckpt"), async_save=False)
    config_json = {"vocab_fingerprint": vocab_fingerprint.fingerprint(trained)}
    checkpointing.save(manager, 1, {"params": {"w": jnp.ones(2)}}, [{}], config_json)
    checkpointing.finish_saves(manager)
    config = synth.tiny_config(str(tmp_path))
    config.data.vocab_file = _vocab(tmp_path / "other.txt", ["b"])
    with pytest.raises(vocab_fingerprint.VocabMismatchError, match="trained.txt.*other.txt"):
        train_loop._check_init_vocab(str(tmp_path / "ckpt"), config)
    config.data.vocab_file = trained
    train_loop._check_init_vocab(str(tmp_path / "ckpt"), config)


# --- unclear errors made one line ---------------------------------------------------------------


def test_finetune_max_seq_length_past_the_positions_names_the_flag():
    from bert_jax.config import BertConfig, ConfigError

    config = BertConfig(max_position_embeddings=64)
    with pytest.raises(ConfigError, match="--config.max_seq_length=128 is past the 64 positions"):
        finetune_common.check_seq_length(128, config, "enc")
    finetune_common.check_seq_length(64, config, "enc")
    finetune_common.check_seq_length(128, BertConfig(position_encoding="rotary"), "enc")


def test_a_truncated_tokenizer_json_says_where_its_json_breaks(tmp_path):
    from data_pipelines import tokenization

    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "WordPiece", "vocab": {"[PAD]": 0, "[UN')
    with pytest.raises(tokenization.VocabError, match=r"tokenizer.json: not valid JSON .*line 1"):
        tokenization.load_tokenizer(str(path))


def test_a_mesh_that_cannot_split_a_weight_names_it_before_compiling():
    import jax

    from bert_jax import sharding
    from bert_jax.config import ConfigError

    config = synth.tiny_config("/nonexistent")
    config.model.num_hidden_layers = 1
    mesh = sharding.create_mesh((1, 1, 3), devices=jax.devices()[:3])
    with pytest.raises(ConfigError, match=r"mesh_shape=\(1, 1, 3\) cannot split \S+ \(shape"):
        train.setup(config, mesh, 64)


def test_demo_subsets_below_two_are_refused_at_start():
    with pytest.raises(SystemExit, match="--subsets=1 is outside its range: None or an int >= 2"):
        config_bounds.check_or_exit({"subsets": 1}, "demo", "demo")
    config_bounds.check_or_exit({"subsets": 2}, "demo", "demo")


def test_a_hf_export_with_nan_weights_is_refused_naming_the_tensor(tmp_path):
    import flax
    import jax

    from bert_jax.config import BertConfig
    from bert_jax.convert import ConversionError, export
    from bert_jax.model import BertModel

    config = BertConfig.from_preset("tiny", num_hidden_layers=1, vocab_size=32)
    ids = np.zeros((1, 4), np.int32)
    params = BertModel(config).init(jax.random.key(0), ids, ids, ids)["params"]
    params = jax.tree.map(np.array, flax.linen.unbox(params))  # writable copies
    params["embeddings"]["word_embeddings"]["embedding"][3, 1] = np.nan
    with pytest.raises(ConversionError, match="embeddings.word_embeddings.weight' holds 1 non"):
        export.save_hf(str(tmp_path / "hf"), config, params)
    assert not (tmp_path / "hf").exists()


def test_two_runs_sharing_a_corpus_directory_take_turns(tmp_path):
    import fcntl
    import threading

    from data_pipelines import recipe

    for name in ("corpus.txt", "train.txt", "eval.txt", "vocab.txt"):
        (tmp_path / name).write_text("x\n")  # all there: the second run reuses them
    fd = os.open(tmp_path / ".recipe.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the first run, still writing
    done = threading.Event()
    waiter = threading.Thread(
        target=lambda: (recipe.prepare_corpus(["shakespeare"], str(tmp_path), 100), done.set())
    )
    waiter.start()
    assert not done.wait(0.5)  # waits for the first
    os.close(fd)
    assert done.wait(10)
    waiter.join()


def test_convert_of_a_workdir_without_its_own_vocabulary_exits_naming_the_flag(
    tmp_path, monkeypatch
):
    """A workdir whose saved vocabulary is no longer the one it was trained with (the file
    at the saved path changed since): the export is refused naming --vocab_file, not written
    without a vocab nor with the changed one; with --vocab_file (and --allow_non_finite, a
    flag convert takes) it goes through."""
    import shutil
    import subprocess
    import sys

    import finetune_fixtures

    vocab = tmp_path / "vocab.txt"
    shutil.copyfile(finetune_fixtures.minilm_vocab(), vocab)
    monkeypatch.setattr(finetune_fixtures, "minilm_vocab", lambda: str(vocab))
    workdir = finetune_fixtures.write_train_state(
        tmp_path / "run", finetune_fixtures.pretrained_params()
    )
    with open(vocab, "a", encoding="utf-8") as f:
        f.write("extra\n")  # another vocabulary now sits at the saved path

    def convert(*extra):
        return subprocess.run(
            [sys.executable, "-m", "bert_jax.convert", f"--input={workdir}", *extra],
            capture_output=True, text=True,
        )  # fmt: skip

    out = tmp_path / "hf"
    refused = convert(f"--output={out}")
    assert refused.returncode == 1 and not out.exists()
    message = "no vocabulary that is the model's; give the one it was trained with as --vocab_file"
    assert message in refused.stderr
    done = convert(f"--output={out}", f"--vocab_file={vocab}.orig", "--allow_non_finite")
    assert done.returncode != 0  # a vocab file that is not there: named, nothing written
    shutil.copyfile(vocab, f"{vocab}.orig")
    lines = open(vocab, encoding="utf-8").read().splitlines()[:-1]
    open(f"{vocab}.orig", "w", encoding="utf-8").write("\n".join(lines) + "\n")
    done = convert(f"--output={out}", f"--vocab_file={vocab}.orig", "--allow_non_finite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines() == lines
