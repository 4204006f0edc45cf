"""A tool that starts tools stops them when it stops (data_pipelines.cli): the demo's stages
and its linear tagger do not train on behind a demo stopped by SIGTERM (a scheduler's stop, a
preemption) or by an error, where a rerun would start a second writer into their workdir."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from data_pipelines import cli

REPO = Path(__file__).resolve().parent.parent

# A stage that notes SIGTERM (as training does: it checkpoints, then stops) and otherwise runs
# for a minute.
STAGE = """
import os, signal, sys, time
out = sys.argv[1]
def stopped(*_):
    time.sleep(0.5)  # its checkpoint
    open(os.path.join(out, "stopped"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
with open(os.path.join(out, "pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(out, "pid.tmp"), os.path.join(out, "pid"))
time.sleep(60)
open(os.path.join(out, "finished"), "w").close()
"""

# A tool that runs the stage as the demo runs its pretraining.
TOOL = """
import sys
from data_pipelines import cli, recipe
def main(argv):
    recipe.run("1/1 stage", ["stage", sys.argv[1]])
if __name__ == "__main__":
    cli.run(main, stop_on_sigterm=True)
"""


def _wait_for(path: Path, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while not path.exists():
        assert time.time() < deadline, f"{path} did not appear in {timeout_s} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_a_tool_stops_its_running_stage_first(tmp_path):
    (tmp_path / "stage.py").write_text(textwrap.dedent(STAGE))
    (tmp_path / "tool.py").write_text(textwrap.dedent(TOOL))
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")
    tool = subprocess.Popen(
        [sys.executable, str(tmp_path / "tool.py"), str(out)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(out / "pid")
        stage_pid = int((out / "pid").read_text())
        tool.send_signal(signal.SIGTERM)
        _, stderr = tool.communicate(timeout=60)
    finally:
        tool.kill()
    assert tool.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "SIGTERM: stopping" in stderr
    # The stage got SIGTERM (time to checkpoint), not SIGKILL, and is gone with the tool.
    assert (out / "stopped").exists(), "the stage was not sent SIGTERM"
    assert not _alive(stage_pid), "the stage outlived the tool that started it"
    assert not (out / "finished").exists()


def test_a_stage_that_ignores_sigterm_is_killed_after_the_grace():
    process = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "ready"
    start = time.time()
    cli.stop(process, grace_s=1)
    assert process.returncode == -signal.SIGKILL
    assert time.time() - start < 30


def test_an_error_in_the_block_stops_the_process_and_goes_on():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(ValueError, match="the demo failed"):
        with cli.stops_with_this_process(process):
            raise ValueError("the demo failed")
    assert process.returncode == -signal.SIGTERM


def test_a_failed_demo_leaves_no_linear_tagger_fitting(tmp_path, parse_demo_flags):
    from experiments import demo

    parse_demo_flags(f"--workdir={tmp_path}", "--label_budgets=100", "--subsets=2")
    with pytest.raises(RuntimeError, match="pretraining failed"):
        with demo.linear_reference(str(tmp_path)) as linear:
            process = linear.process
            assert process is not None and process.poll() is None
            raise RuntimeError("pretraining failed")
    assert process.returncode is not None, "the linear tagger outlived the demo"
    assert not os.path.exists(linear.path)
