"""experiments.plot_metrics: the curves it draws, the PNG it writes, and its errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import plot_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(step, loss, **extra):
    record = {
        "step": step,
        "split": "train",
        "loss": loss,
        "mlm_accuracy": 0.1 * step,
        "nsp_accuracy": 0.5,
        "learning_rate": 1e-4 * step,
        "grad_norm": 2.0 / step,
        "update_norm": 0.1 / step,
        "param_norm": 40.0,
        "sequences_per_second": 100.0 + step,
        "tokens_per_second": 12800.0,
        "mfu": 0.01 * step,
    }
    return record | extra


def _eval(step, loss):
    return {
        "step": step,
        "split": "eval",
        "loss": loss,
        "mlm_accuracy": 0.05 * step,
        "nsp_accuracy": 0.6,
    }


def _write(workdir, records_or_lines):
    workdir.mkdir(exist_ok=True)
    with open(workdir / "metrics.jsonl", "w") as f:
        for item in records_or_lines:
            f.write((item if isinstance(item, str) else json.dumps(item)) + "\n")
    return workdir


@pytest.fixture
def resumed_run(tmp_path):
    """Steps 1-4, a kill after a checkpoint at 2, then steps 3-6 again (the resumed run)."""
    records = [_eval(0, 11.0)] + [_train(s, 10.0 - s) for s in range(1, 5)]
    records += [_train(s, 9.5 - s) for s in range(3, 7)] + [_eval(6, 4.0)]
    return _write(tmp_path / "run", records)


def test_last_record_of_each_step_wins(resumed_run):
    records = plot_metrics.read_metrics(str(resumed_run / "metrics.jsonl"))
    assert plot_metrics.curve(records, "train", "loss") == (
        [1, 2, 3, 4, 5, 6],
        [9.0, 8.0, 6.5, 5.5, 4.5, 3.5],
    )
    assert plot_metrics.curve(records, "eval", "loss") == ([0, 6], [11.0, 4.0])
    assert plot_metrics.curve(records, "eval", "learning_rate") == ([], [])


def test_figure_draws_train_and_eval_curves(resumed_run):
    records = plot_metrics.read_metrics(str(resumed_run / "metrics.jsonl"))
    figure = plot_metrics.build_figure(records)
    by_title = {ax.get_title(): ax for ax in figure.axes if ax.get_title()}
    assert set(by_title) == {title for title, *_ in plot_metrics.PANELS}

    def lines(title):
        return {
            line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in by_title[title].get_lines()
        }

    loss = lines("loss (MLM + NSP)")
    assert loss["train"] == ([1, 2, 3, 4, 5, 6], [9.0, 8.0, 6.5, 5.5, 4.5, 3.5])
    assert loss["eval"] == ([0, 6], [11.0, 4.0])
    assert lines("MLM accuracy")["eval"][1] == [0.0, pytest.approx(0.3)]
    assert set(lines("gradient and update norms")) == {"train grad_norm", "train update_norm"}
    assert by_title["gradient and update norms"].get_yscale() == "log"
    assert list(lines("learning rate")) == ["train"]  # eval logs no learning rate
    mfu_axis = [ax for ax in figure.axes if ax.get_ylabel() == "mfu"]
    assert len(mfu_axis) == 1
    assert list(mfu_axis[0].get_lines()[0].get_ydata()) == pytest.approx(
        [0.01 * s for s in range(1, 7)]
    )


def test_cli_writes_a_png(resumed_run, tmp_path):
    output = tmp_path / "plots" / "curves.png"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.plot_metrics", str(resumed_run), f"--output={output}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    from matplotlib import image

    pixels = image.imread(output)
    assert pixels.shape[:2] == (850, 1500)  # figsize (15, 8.5) at 100 dpi
    assert np.ptp(pixels[..., :3]) > 0.5  # something was drawn on the white page
    assert not os.path.exists(str(output) + ".tmp")
    # The default output sits in the workdir.
    assert plot_metrics.plot_metrics(str(resumed_run)) == str(resumed_run / "metrics.png")
    assert image.imread(resumed_run / "metrics.png").shape == pixels.shape


def test_cli_help_and_errors(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "experiments.plot_metrics", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    shown = run("--help")
    assert shown.returncode == 0  # absl alone exits 1 after printing; data_pipelines.cli: 0
    help_text = shown.stdout
    assert "python -m experiments.plot_metrics WORKDIR" in help_text and "--output" in help_text
    missing = run(str(tmp_path / "nowhere"))
    assert missing.returncode == 1
    assert f"{tmp_path / 'nowhere' / 'metrics.jsonl'}: no such file" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.parametrize(
    "lines, message",
    [
        ([], "no records"),
        (["", "   "], "no records"),
        (
            [json.dumps(_train(1, 5.0)), '{"step": 2, "split": "train", "loss": 4.'],
            "line 2: not valid JSON",
        ),
        (["[1, 2]"], "line 1: expected a JSON object"),
        (
            [json.dumps(_train(1, 5.0)), "", json.dumps({"split": "train", "loss": 1.0})],
            "line 3: 'step' must be an integer, got None",
        ),
        (
            [json.dumps({"step": 1, "split": "test", "loss": 1.0})],
            "line 1: 'split' must be one of ('train', 'eval'), got 'test'",
        ),
        (
            [json.dumps({"step": 1, "split": "train", "loss": "high"})],
            "line 1: 'loss' is not a number: 'high'",
        ),
    ],
    ids=["empty", "blank", "truncated", "not_object", "no_step", "bad_split", "not_number"],
)
def test_malformed_files_name_the_line(tmp_path, lines, message):
    workdir = _write(tmp_path / "run", lines)
    with pytest.raises(plot_metrics.MetricsFileError) as error:
        plot_metrics.plot_metrics(str(workdir))
    assert str(error.value).startswith(str(workdir / "metrics.jsonl"))
    assert message in str(error.value)
    assert not os.path.exists(workdir / "metrics.png")
