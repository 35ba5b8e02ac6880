"""Tests for gemma_grpo.runtime.curves and `gemma-grpo plot`: PNGs from a finished tiny run, and bad input."""

import json
import shutil

import numpy as np
import pytest

from conftest import run_cli
from gemma_grpo import errors
from gemma_grpo.commands import plots
from gemma_grpo.runtime import curves

CHARTS = ("rewards.png", "completion_length.png", "entropy.png", "loss.png", "kl.png",
          "clipping.png", "throughput.png")


def read_png(path) -> np.ndarray:
  from matplotlib import image  # pylint: disable=g-import-not-at-top

  return image.imread(path)  # [H, W, 3 or 4] floats in [0, 1]


def assert_non_trivial(path):
  pixels = read_png(path)
  assert pixels.shape[0] >= 300 and pixels.shape[1] >= 600, pixels.shape
  rgb = pixels[..., :3].reshape(-1, 3)
  # Not blank: some ink on the white page, in more than a couple of colours.
  assert (rgb.min(axis=1) < 0.5).mean() > 0.005, f"{path.name} is nearly blank"
  assert len(np.unique((rgb * 255).astype(np.uint8), axis=0)) > 20, path.name


def test_plot_command_writes_readable_pngs_of_a_finished_run(tiny_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run, workdir)
  proc = run_cli(["plot", str(workdir)], timeout=120)
  written = sorted(p.name for p in (workdir / "plots").glob("*.png"))
  assert written == sorted(CHARTS)  # the tiny run has no eval/ metrics
  assert sorted(line.rsplit("/", 1)[1] for line in proc.stdout.split()) == written
  for name in CHARTS:
    path = workdir / "plots" / name
    assert path.stat().st_size > 10_000
    assert_non_trivial(path)


def test_write_plots_draws_accuracy_when_the_run_evaluated(tmp_path):
  rows = [{"step": s, "rewards/train/sum": float(s), "eval/accuracy": s / 10,
           "eval/format_accuracy": s / 5} for s in range(1, 5)]
  (tmp_path / "tensorboard").mkdir()
  (tmp_path / "tensorboard" / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows))
  written = curves.write_plots(tmp_path)
  assert [p.name for p in written] == ["rewards.png", "accuracy.png"]
  assert_non_trivial(tmp_path / "plots" / "accuracy.png")


def test_write_plots_of_an_sft_run_draw_its_loss(tmp_path):
  rows = [{"step": s, "actor/train/loss": 2.0 / s, "actor/train/learning_rate": 1e-4}
          for s in range(1, 6)]
  (tmp_path / "tensorboard").mkdir()
  (tmp_path / "tensorboard" / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows))
  assert [p.name for p in curves.write_plots(tmp_path)] == ["loss.png"]
  assert_non_trivial(tmp_path / "plots" / "loss.png")


@pytest.mark.parametrize("content, needle", [
    (None, "missing"),
    ("", "no metrics yet"),
    ('{"step": 1, "something/else": 1.0}\n', "none of the plotted metrics"),
])
def test_write_plots_rejects_runs_without_metrics(tmp_path, content, needle):
  if content is not None:
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "metrics.jsonl").write_text(content)
  with pytest.raises(errors.UserError, match=needle):
    curves.write_plots(tmp_path)


def test_plot_command_exits_2_with_one_line_on_a_missing_run(tmp_path):
  proc = run_cli(["plot", str(tmp_path / "nope")], check=False, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("values, window, expected", [
    ([1, 2, 3, 4], 1, [1, 2, 3, 4]),
    ([1, 2, 3, 4], 2, [1, 1.5, 2.5, 3.5]),
    ([2, 4, 6], 5, [2, 3, 4]),
])
def test_moving_average(values, window, expected):
  np.testing.assert_allclose(curves.moving_average(np.array(values, float), window), expected)


@pytest.mark.parametrize("num_points, window", [(1, 1), (7, 1), (14, 3), (100, 25), (1000, 25)])
def test_short_runs_are_smoothed_enough_to_show_their_trend(num_points, window):
  assert curves.smoothing_window(num_points) == window

