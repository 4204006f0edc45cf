"""Cloud TPU slice names and the mesh/batch fit check (`experiments.tpu_slice`).

The names follow the Cloud TPU docs: v2/v3/v4/v5p accelerator types count TensorCores
(two per chip), v5e (`v5litepod-N`) and v6e count chips. `make tpu-*` uses this through
tests/test_tpu_make.py; here the arithmetic, the refusals and the command line.
"""

import os
import subprocess
import sys

import pytest

from experiments import tpu_slice
from experiments.configs import (
    bert_base,
    bert_base_paper,
    bert_large_lamb,
    bert_large_paper,
    bert_large_v4,
    bert_large_v5e,
)
from experiments.tpu_slice import Slice

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "topology, chips, hosts, devices, accelerator",
    [
        ("v3:4x4", 16, 4, 32, "v3-32"),  # BERT-Base in the paper: 4 Cloud TPUs, 16 chips
        ("v3:8x8", 64, 16, 128, "v3-128"),  # BERT-Large: 16 Cloud TPUs, 64 chips
        ("v3:32x32", 1024, 256, 2048, "v3-2048"),  # a full v3 pod
        ("v3:2x2", 4, 1, 8, "v3-8"),  # one host, one device per core
        ("v4:2x2x1", 4, 1, 4, "v4-8"),  # megacore: one device per chip
        ("v4:2x2x4", 16, 4, 16, "v4-32"),
        ("v5e:2x4", 8, 1, 8, "v5litepod-8"),  # one 8-chip VM
        ("v5e:4x4", 16, 4, 16, "v5litepod-16"),
        ("v5e:16x16", 256, 64, 256, "v5litepod-256"),
        ("v5p:2x2x1", 4, 1, 4, "v5p-8"),
        ("v6e:4x4", 16, 4, 16, "v6e-16"),
    ],
)
def test_topology_names(topology, chips, hosts, devices, accelerator):
    assert tpu_slice.topology_chips(topology) == chips
    assert tpu_slice.topology_hosts(topology) == hosts
    assert tpu_slice.topology_device_count(topology) == devices
    assert tpu_slice.accelerator_type(topology) == accelerator
    # The accelerator type names the same slice.
    assert Slice.from_accelerator_type(accelerator) == Slice.from_topology(topology)


@pytest.mark.parametrize(
    "module, accelerator",
    [
        (bert_base_paper, "v3-32"),
        (bert_large_paper, "v3-128"),
        (bert_large_lamb, "v3-2048"),
        (bert_large_v4, "v4-32"),
        (bert_large_v5e, "v5litepod-16"),
    ],
)
def test_every_tpu_config_fits_its_own_slice(module, accelerator):
    for phase in ("phase1", "phase2"):
        config = module.get_config(phase)
        assert tpu_slice.resolve(config, "c", None) == accelerator
        assert tpu_slice.resolve(config, "c", accelerator) == accelerator


@pytest.mark.parametrize("bad", ["v3", "v3:", "v3:8xx8", "8x8", "v9:2x2"])
def test_malformed_topology_is_named(bad):
    with pytest.raises(ValueError, match="topology"):
        tpu_slice.topology_chips(bad)


@pytest.mark.parametrize("bad", ["v3", "v3-", "v3-0", "v3-7", "v5e-16", "tpu-8", "v3-8x"])
def test_malformed_accelerator_type_is_named(bad):
    with pytest.raises(ValueError, match=f"accelerator type '{bad}'"):
        Slice.from_accelerator_type(bad)


def test_an_explicit_slice_wins_when_the_config_fits_it():
    config = bert_large_paper.get_config("phase2")  # v3:8x8, batch 256, (-1, 8, 1)
    assert tpu_slice.resolve(config, "c", "v3-256") == "v3-256"  # 1 sequence per core
    assert tpu_slice.resolve(config, "c", "v4-32") == "v4-32"


@pytest.mark.parametrize(
    "module, phase, accelerator, why",
    [
        # 512 cores for 256 sequences (phase 2's mesh: data x 8-way FSDP).
        (
            bert_large_paper,
            "phase2",
            "v3-512",
            "mesh_shape (-1, 8, 1) -> data 64 x fsdp 8 x tensor 1: global_batch_size 256 "
            "does not divide over data x fsdp",
        ),
        # An 8-way FSDP axis on 4 devices.
        (bert_large_lamb, "phase2", "v4-8", "mesh_shape (-1, 8, 1): 4 devices do not divide"),
        # 512 megacore devices for 256 sequences.
        (bert_large_v4, "phase1", "v4-1024", "global_batch_size 256 does not divide"),
    ],
)
def test_a_slice_the_mesh_does_not_fit_is_refused(module, phase, accelerator, why):
    config = module.get_config(phase)
    name = f"{module.__name__}:{phase}"
    with pytest.raises(ValueError) as error:
        tpu_slice.resolve(config, name, accelerator)
    message = str(error.value)
    assert message.startswith(f"{name} does not fit {accelerator} (")
    assert why in message and "\n" not in message


def test_sharded_model_dimensions_must_divide_their_axes():
    config = bert_large_v4.get_config("phase1")
    config.mesh_shape = (-1, 1, 32)  # 16 heads over 32-way tensor parallelism
    assert "model num_attention_heads 16 does not divide over tensor" in tpu_slice.misfit(
        config, Slice("v4", 256)
    )
    config.mesh_shape = (1, -1, 1)  # hidden 1024 over 2048-way FSDP
    config.global_batch_size = 4096
    assert "model hidden_size 1024 does not divide over fsdp" in tpu_slice.misfit(
        config, Slice("v3", 1024)
    )


def test_a_config_without_topology_needs_a_slice():
    config = bert_base.get_config("phase1")
    with pytest.raises(ValueError, match="bert_base.py has no topology: give the slice"):
        tpu_slice.resolve(config, "bert_base.py", None)
    assert tpu_slice.resolve(config, "bert_base.py", "v3-8") == "v3-8"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "experiments.tpu_slice", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_command_line_prints_the_type_or_one_refusal_line():
    config = "--config=experiments/configs/bert_large_paper.py:phase2"
    result = _cli(config)
    assert (result.returncode, result.stdout) == (0, "v3-128\n"), result.stderr
    result = _cli(config, "--accelerator_type=v3-512")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(
        "refused: experiments/configs/bert_large_paper.py:phase2 does not fit v3-512 "
        "(512 devices on 64 hosts): mesh_shape (-1, 8, 1)"
    )
    assert result.stderr.count("\n") == 1


def test_help():
    result = _cli("--help")
    assert result.returncode == 0
    assert "--accelerator_type" in result.stdout and "--config" in result.stdout


def test_the_check_never_imports_jax():
    # tpu.mk runs it before every slice target, and the spot loop on every relaunch: JAX's
    # import (seconds) would be paid each time for arithmetic on the config.
    code = (
        "import sys\n"
        "from experiments import tpu_slice\n"
        "from experiments.configs import bert_large_paper\n"
        "config = bert_large_paper.get_config('phase2')\n"
        "print(tpu_slice.resolve(config, 'bert_large_paper.py', None))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.stdout == "v3-128\n[]\n", result.stderr
