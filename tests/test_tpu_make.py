"""The Cloud TPU make targets (tpu.mk): the exact gcloud commands, and the spot loop.

`DRY_RUN=1` prints each command as the shell would receive it; the tests split those
lines with shlex and check the arguments. The spot loop runs for real against a fake
`gcloud` that plays a scripted queued-resource life (waiting, active, preempted, ...).
"""

import fnmatch
import importlib.util
import json
import os
import shlex
import subprocess
import sys

import pytest

from data_pipelines import tfrecord_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARS = dict(PROJECT="my-proj", ZONE="us-central2-b", TPU_NAME="bert-x", BUCKET="gs://bkt")


def make(*targets: str, env=None, **variables) -> subprocess.CompletedProcess:
    assignments = [f"{k}={v}" for k, v in (VARS | variables).items()]
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *targets, *assignments],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def dry(target: str, **variables) -> list[list[str]]:
    """The commands `target` would run, each split into its argv."""
    result = make(target, DRY_RUN="1", **variables)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]


def load_config(name: str, phase: str, bucket: str = "gs://bkt"):
    path = os.path.join(REPO, "experiments", "configs", name)
    spec = importlib.util.spec_from_file_location(name[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(phase)
    config.bucket = bucket
    return config


FLAGS = "--zone=us-central2-b --project=my-proj"


def argv(command: str) -> list[str]:
    return shlex.split(command)


def test_create_and_delete():
    [create] = dry("tpu-create", ACCELERATOR_TYPE="v4-32", RUNTIME_VERSION="tpu-ubuntu2204-base")
    assert create == argv(
        f"gcloud compute tpus tpu-vm create bert-x {FLAGS} --accelerator-type=v4-32 "
        "--version=tpu-ubuntu2204-base"
    )
    [delete] = dry("tpu-delete")
    assert delete == argv(f"gcloud compute tpus tpu-vm delete bert-x {FLAGS} --quiet")


def test_queued_resource_commands():
    [create] = dry(
        "tpu-qr-create", ACCELERATOR_TYPE="v5litepod-16", RUNTIME_VERSION="v2-alpha-tpuv5-lite"
    )
    assert create == argv(
        f"gcloud compute tpus queued-resources create bert-x-qr {FLAGS} --node-id=bert-x "
        "--accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite --spot"
    )
    [status] = dry("tpu-qr-status")
    assert status == argv(
        f"gcloud compute tpus queued-resources describe bert-x-qr {FLAGS} "
        "--format='value(state.state)'"
    )
    [delete] = dry("tpu-qr-delete")
    assert delete == argv(
        f"gcloud compute tpus queued-resources delete bert-x-qr {FLAGS} --force --quiet"
    )


def test_the_slice_comes_from_the_config_unless_given():
    paper = "experiments/configs/bert_large_paper.py"  # topology v3:8x8
    [create] = dry("tpu-create", CONFIG=paper)
    assert create == argv(
        f"gcloud compute tpus tpu-vm create bert-x {FLAGS} --accelerator-type=v3-128 "
        "--version=tpu-ubuntu2204-base"
    )
    [create] = dry("tpu-qr-create", CONFIG="experiments/configs/bert_large_v5e.py")
    assert "--accelerator-type=v5litepod-16" in create
    [create] = dry("tpu-create", CONFIG=paper, ACCELERATOR_TYPE="v3-256")  # fits: given wins
    assert "--accelerator-type=v3-256" in create


REFUSALS = [
    # 512 cores for a global batch of 256.
    (
        dict(
            CONFIG="experiments/configs/bert_large_paper.py",
            PHASE="phase2",
            ACCELERATOR_TYPE="v3-512",
        ),
        "refused: experiments/configs/bert_large_paper.py:phase2 does not fit v3-512 (512 "
        "devices on 64 hosts): mesh_shape (-1, 8, 1) -> data 64 x fsdp 8 x tensor 1: "
        "global_batch_size 256 does not divide over data x fsdp",
    ),
    # An 8-way FSDP axis on 4 devices.
    (
        dict(
            CONFIG="experiments/configs/bert_large_lamb.py", PHASE="phase2", ACCELERATOR_TYPE="v4-8"
        ),
        "refused: experiments/configs/bert_large_lamb.py:phase2 does not fit v4-8 (4 devices "
        "on 1 host): mesh_shape (-1, 8, 1): 4 devices do not divide by 8",
    ),
    # No topology and no ACCELERATOR_TYPE.
    (
        dict(CONFIG="experiments/configs/bert_base.py"),
        "refused: experiments/configs/bert_base.py:phase1 has no topology: give the slice "
        "(ACCELERATOR_TYPE=...)",
    ),
]


@pytest.mark.parametrize("variables, refusal", REFUSALS)
def test_a_slice_the_config_does_not_fit_is_refused(variables, refusal):
    result = make("tpu-create", DRY_RUN="1", **variables)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.splitlines()[0] == refusal, result.stderr


def test_a_refused_slice_runs_nothing(tmp_path):
    log = _fake_gcloud(tmp_path, states=["ACTIVE"], runs=[0])
    variables, refusal = REFUSALS[0]
    runs = [(t, "1") for t in ("tpu-qr-create", "tpu-pretrain", "tpu-spot-pretrain")]
    runs += [("tpu-create", ""), ("tpu-spot-pretrain", "")]  # for real: still nothing runs
    for target, dry_run in runs:
        result = make(target, env=_env(tmp_path), DRY_RUN=dry_run, **variables)
        assert result.returncode != 0 and result.stdout == "", (target, result.stdout)
        assert result.stderr.splitlines()[0] == refusal, (target, result.stderr)
    assert not os.path.exists(log)


def _ssh(command: list[str], worker: str) -> str:
    """Checks an ssh command's flags; returns the remote command."""
    assert command[:9] == argv(f"gcloud compute tpus tpu-vm ssh bert-x {FLAGS} --worker={worker}")
    assert command[9].startswith("--command=") and len(command) == 10
    return command[9][len("--command=") :]


def test_setup_ships_the_committed_tree_to_every_worker():
    archive, scp, ssh = dry("tpu-setup", TPU_TARBALL="/tmp/t.tar.gz")
    assert archive == argv("git archive --format=tar.gz --output=/tmp/t.tar.gz HEAD")
    assert scp == argv(
        "gcloud compute tpus tpu-vm scp /tmp/t.tar.gz bert-x:~/bert_jax.tar.gz "
        f"{FLAGS} --worker=all"
    )
    remote = _ssh(ssh, "all")
    assert "python3.11 -m venv .venv" in remote
    assert ".venv/bin/pip install -q -e '.[tpu,data]'" in remote


@pytest.mark.parametrize("phase", ["phase1", "phase2"])
def test_pretrain_runs_the_config_on_every_worker(phase):
    config = "experiments/configs/bert_large_paper.py"
    [ssh] = dry("tpu-pretrain", CONFIG=config, PHASE=phase, ARGS="--config.log_every=10")
    remote = shlex.split(_ssh(ssh, "all"))
    start = remote.index(".venv/bin/python")
    assert remote[start : start + 8] == argv(
        f".venv/bin/python -m experiments.pretrain --config={config}:{phase} "
        f"--config.bucket=gs://bkt --workdir=gs://bkt/runs/bert_large_paper_{phase} "
        "--distributed --config.log_every=10"
    )
    # Detached by default: survives the ssh session, logs where tpu-logs looks.
    assert remote[start - 1] == "nohup" and remote[-1] == "&"
    assert f"~/logs/bert_large_paper_{phase}.log" in remote
    [logs] = dry("tpu-logs", CONFIG=config, PHASE=phase)
    assert _ssh(logs, "0") == f"tail -n 200 -f ~/logs/bert_large_paper_{phase}.log"
    # FOREGROUND=1 (the spot loop) stays attached.
    [attached] = dry("tpu-pretrain", CONFIG=config, PHASE=phase, FOREGROUND="1")
    assert "nohup" not in _ssh(attached, "all") and not _ssh(attached, "all").endswith("&")


TPU_CONFIGS = (
    "bert_base_paper.py",
    "bert_large_paper.py",
    "bert_large_v4.py",
    "bert_large_v5e.py",
    "bert_large_lamb.py",
    "modernbert_base_tpu.py",
)
# Configs whose phase 2 starts from phase 1's params with a fresh schedule (not a resume).
FRESH_PHASE_2 = ("bert_large_lamb.py", "modernbert_base_tpu.py")


@pytest.mark.parametrize("name", TPU_CONFIGS)
def test_phase_2_reads_where_tpu_pretrain_wrote_phase_1(name):
    [ssh] = dry("tpu-pretrain", CONFIG=f"experiments/configs/{name}", PHASE="phase1")
    workdir = next(a for a in shlex.split(_ssh(ssh, "all")) if a.startswith("--workdir="))
    checkpoints = workdir[len("--workdir=") :] + "/checkpoints"
    phase2 = load_config(name, "phase2")
    assert checkpoints == (phase2.init_from if name in FRESH_PHASE_2 else phase2.resume_from)


def test_modernbert_recipe_stages_resume_where_tpu_pretrain_wrote_the_last():
    # modernbert_base_recipe_tpu.py: each batch-warmup stage, then phase 1, then phase 2
    # continues the previous run's full train state (its docstring's loop of PHASE=...).
    name = "modernbert_base_recipe_tpu.py"
    variants = ("warmup1", "warmup2", "warmup3", "warmup4", "warmup5", "phase1", "phase2")
    assert not load_config(name, variants[0]).resume_from
    for previous, variant in zip(variants, variants[1:], strict=False):
        [ssh] = dry("tpu-pretrain", CONFIG=f"experiments/configs/{name}", PHASE=previous)
        workdir = next(a for a in shlex.split(_ssh(ssh, "all")) if a.startswith("--workdir="))
        resumed = load_config(name, variant).resume_from
        assert workdir[len("--workdir=") :] + "/checkpoints" == resumed, variant


def test_finetune_starts_from_the_phase_2_run():
    [ssh] = dry(
        "tpu-finetune",
        CONFIG="experiments/configs/bert_base_paper.py",
        FINETUNE_CONFIG="experiments/configs/finetune_glue.py:mrpc",
    )
    remote = _ssh(ssh, "all")
    # The fine-tuning scripts read local files: the run's checkpoints and vocab come first.
    fetch = (
        "mkdir -p pretrained/bert_base_paper_phase2/checkpoints && gcloud storage rsync "
        "--recursive gs://bkt/runs/bert_base_paper_phase2/checkpoints "
        "pretrained/bert_base_paper_phase2/checkpoints && gcloud storage cp "
        "gs://bkt/wikibooks/vocab.txt pretrained/bert_base_paper_phase2/"
    )
    assert remote.startswith(f"cd ~/bert_jax && {fetch} && ")
    remote = shlex.split(remote)
    start = remote.index(".venv/bin/python")
    assert remote[start : start + 7] == argv(
        ".venv/bin/python -m experiments.finetune_classification "
        "--config=experiments/configs/finetune_glue.py:mrpc "
        "--config.init_from=pretrained/bert_base_paper_phase2 "
        "--config.vocab_file=pretrained/bert_base_paper_phase2/vocab.txt "
        "--workdir=finetune_runs/finetune_glue_mrpc"
    )


def test_ssh_opens_worker_0():
    [ssh] = dry("tpu-ssh")
    assert ssh == argv(f"gcloud compute tpus tpu-vm ssh bert-x {FLAGS} --worker=0")


def test_data_is_made_on_worker_0_into_the_configs_paths():
    [ssh] = dry("tpu-data")
    remote = _ssh(ssh, "0")
    assert remote.startswith("cd ~/bert_jax && make tpu-data-local BUCKET=gs://bkt ")

    commands = dry("tpu-data-local", TPU_LOCAL_DATA="/scratch/wb", TRAIN_SHARDS="8")
    rsync = commands[-1]
    assert rsync == argv("gcloud storage rsync --recursive /scratch/wb gs://bkt/wikibooks")
    creates = [c for c in commands if "data_pipelines.create_pretraining_data" in c]
    assert len(creates) == 8  # {T=128, T=512} x {wiki, books} x {train, eval}
    for phase in ("phase1", "phase2"):
        config = load_config("bert_base_paper.py", phase)
        data = config.data
        made = {"train": 0, "eval": 0}
        for create in creates:
            flags = dict(a[2:].split("=", 1) for a in create if a.startswith("--") and "=" in a)
            if int(flags["max_seq_length"]) != data.max_seq_length:
                continue
            assert int(flags["max_predictions_per_seq"]) == data.max_predictions_per_seq
            assert flags["vocab_file"] == "/scratch/wb/vocab.txt"
            assert "--do_lower_case" in create and data.do_lower_case
            # Where the first shard lands once rsync'ed into the bucket.
            shards = int(flags["num_output_shards"])
            local = tfrecord_files.shard_paths(flags["output_file"], shards)[0]
            remote_path = "gs://bkt/wikibooks" + local[len("/scratch/wb") :]
            split = "train" if fnmatch.fnmatch(remote_path, data.train_files) else "eval"
            assert fnmatch.fnmatch(remote_path, getattr(data, f"{split}_files")), remote_path
            assert flags["tfds_split"] == ("train[:99%]" if split == "train" else "train[99%:]")
            made[split] += 1
        assert made == {"train": 2, "eval": 2}
        assert config.data.vocab_file == "gs://bkt/wikibooks/vocab.txt"


def test_aot_check_covers_every_tpu_config_variant():
    result = make("aot-check", DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    configs = os.path.join(REPO, "experiments", "configs")
    checked = 0
    for name in sorted(os.listdir(configs)):
        source = open(os.path.join(configs, name)).read() if name.endswith(".py") else ""
        if "def get_config(phase" not in source or "topology" not in load_config(name, "phase1"):
            continue
        for phase in ("phase1", "phase2"):
            assert f"{name}:{phase}" in result.stdout, f"aot-check misses {name}:{phase}"
            checked += 1
    assert checked == 12
    for variant in ("small", "base"):  # variants named otherwise than phases
        assert f"electra_paper.py:{variant}" in result.stdout


def test_make_n_prints_the_same_command():
    assignments = [f"{k}={v}" for k, v in VARS.items()]
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", "tpu-create", *assignments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [shlex.split(line) for line in result.stdout.splitlines()] == dry("tpu-create")


# --- runs against a fake gcloud -----------------------------------------------------------

FAKE_GCLOUD = '''#!{python}
"""Logs its argv; plays queued-resource states and ssh exit codes from a script file."""
import json, os, sys
log, script = os.environ["FAKE_LOG"], os.environ["FAKE_SCRIPT"]
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
with open(script) as f:
    plan = json.load(f)
args = sys.argv[1:]
def pop(key):
    value = plan[key].pop(0)
    with open(script, "w") as f:
        json.dump(plan, f)
    return value
if args[:3] == ["compute", "tpus", "queued-resources"] and args[3] == "describe":
    state = pop("states")
    if state == "NOT_FOUND":
        sys.exit("ERROR: (gcloud) NOT_FOUND")
    print(state)
elif args[:4] == ["compute", "tpus", "tpu-vm", "ssh"] and "experiments.pretrain" in args[-1]:
    sys.exit(pop("runs"))
'''


def test_dry_run_runs_nothing(tmp_path):
    log = _fake_gcloud(tmp_path, states=[], runs=[])
    for target in ("tpu-create", "tpu-pretrain", "tpu-qr-create", "tpu-delete"):
        result = make(target, env=_env(tmp_path), DRY_RUN="1")
        assert result.returncode == 0 and "gcloud" in result.stdout
    assert not os.path.exists(log)
    # Without DRY_RUN the same target does call gcloud.
    assert make("tpu-delete", env=_env(tmp_path)).returncode == 0
    assert _calls(log) == [argv(f"compute tpus tpu-vm delete bert-x {FLAGS} --quiet")]


def _fake_gcloud(tmp_path, states, runs) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    (tmp_path / "script.json").write_text(json.dumps({"states": states, "runs": runs}))
    return str(tmp_path / "calls.jsonl")


def _env(tmp_path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
    env.update(
        FAKE_LOG=str(tmp_path / "calls.jsonl"),
        FAKE_SCRIPT=str(tmp_path / "script.json"),
        POLL_SECONDS="0",
        MAX_FAILURES="2",
    )
    return env


def _calls(log: str) -> list[list[str]]:
    with open(log) as f:
        return [json.loads(line) for line in f]


def _summary(calls) -> list[str]:
    """Each call as one word: describe/create/delete (queued resource), scp, setup, run."""
    out = []
    for c in calls:
        if c[2] == "queued-resources":
            out.append(c[3])
        elif c[3] == "scp":
            out.append("scp")
        elif "experiments.pretrain" in c[-1]:
            assert "nohup" not in c[-1]  # attached, so the loop sees the run end
            out.append("run")
        else:
            out.append("setup")
    return out


def test_spot_loop_survives_a_preemption_and_finishes(tmp_path):
    log = _fake_gcloud(
        tmp_path,
        # absent -> queued -> granted -> (run dies) preempted -> freed -> granted again
        states=[
            "NOT_FOUND",
            "WAITING_FOR_RESOURCES",
            "ACTIVE",
            "SUSPENDED",
            "SUSPENDED",
            "NOT_FOUND",
            "ACTIVE",
        ],
        runs=[255, 0],
    )
    result = make(
        "tpu-spot-pretrain",
        env=_env(tmp_path),
        TPU_TARBALL=str(tmp_path / "t.tar.gz"),
        CONFIG="experiments/configs/bert_large_paper.py",
        PHASE="phase1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the slice was preempted" in result.stdout
    assert _summary(_calls(log)) == [
        "describe",
        "create",
        "describe",
        "describe",
        "scp",
        "setup",
        "run",
        "describe",
        "describe",
        "delete",
        "describe",
        "create",
        "describe",
        "scp",
        "setup",
        "run",
    ]
    assert (tmp_path / "t.tar.gz").stat().st_size > 0  # the committed tree, shipped twice


def test_spot_loop_gives_up_on_a_failing_run_on_a_live_slice(tmp_path):
    log = _fake_gcloud(tmp_path, states=["ACTIVE"] * 4, runs=[1, 1])
    result = make("tpu-spot-pretrain", env=_env(tmp_path), TPU_TARBALL=str(tmp_path / "t.tgz"))
    assert result.returncode != 0
    assert "giving up" in result.stderr
    assert _summary(_calls(log)).count("run") == 2  # MAX_FAILURES=2
