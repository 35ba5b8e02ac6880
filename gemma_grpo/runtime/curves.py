"""PNG curves of a run's metrics: <workdir>/tensorboard/metrics.jsonl -> <workdir>/plots/*.png.

The curves that tell whether GRPO training is healthy: rewards (total and per
function), completion length and truncation, policy entropy, KL to the
reference, clip fractions and the policy ratio (they leave 0 and 1 only with
several updates per batch, grpo.num_iterations > 1), rollout throughput and
step time, and held-out accuracy when the run evaluated. Noisy per-step
series are drawn faint with a moving average on top.
"""

from __future__ import annotations

from etils import epath
import matplotlib
from matplotlib import figure
from matplotlib import ticker
import numpy as np

from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.runtime import metrics as metrics_lib

_REWARD_SUMMARIES = ("sum", "mean", "min", "max")


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the rows holding a finite `key`."""
  pairs = [(r["step"], r[key]) for r in rows
           if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
  if not pairs:
    return np.array([]), np.array([])
  steps, values = zip(*pairs)
  return np.asarray(steps), np.asarray(values, dtype=np.float64)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing mean over up to `window` points (shorter at the start)."""
  sums = np.cumsum(np.insert(values, 0, 0.0))
  ends = np.arange(1, len(values) + 1)
  starts = np.maximum(ends - window, 0)
  return (sums[ends] - sums[starts]) / (ends - starts)


def smoothing_window(num_points: int) -> int:
  """A quarter of a short run (its trend must show), at most 25 steps."""
  return max(1, min(num_points // 4, 25))


def _draw(ax, steps, values, label: str, color) -> None:
  window = smoothing_window(len(values))
  if window > 1:
    ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
    ax.plot(steps, moving_average(values, window), color=color, linewidth=2,
            label=f"{label} (mean of {window})")
  else:
    ax.plot(steps, values, color=color, linewidth=2, marker="o", markersize=3, label=label)


def _panel(ax, rows: list[dict], title: str, ylabel: str,
           curves: list[tuple[str, str]], band: tuple[str, str] | None) -> None:
  colors = matplotlib.colormaps["tab10"].colors
  for i, (key, label) in enumerate(curves):
    steps, values = _series(rows, key)
    _draw(ax, steps, values, label, colors[i % len(colors)])
  if band is not None:
    mean_steps, means = _series(rows, band[0])
    std_steps, stds = _series(rows, band[1])
    if len(mean_steps) and np.array_equal(mean_steps, std_steps):
      ax.fill_between(mean_steps, means - stds, means + stds, color=colors[0],
                      alpha=0.12, label="± std over completions")
  ax.set_title(title)
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  if ylabel == "fraction":
    ax.set_ylim(-0.03, 1.03)
  ax.grid(True, alpha=0.3)
  ax.legend(loc="best", fontsize=8)


def _chart(path: epath.Path, rows: list[dict], panels: list[tuple]) -> bool:
  """Writes one PNG of stacked panels (title, ylabel, curves, band).

  curves are [(metric key, label)]; panels without data are left out, and
  so is the file when no panel has any (returns False).
  """
  panels = [(title, ylabel, [(k, label) for k, label in curves if len(_series(rows, k)[0])], band)
            for title, ylabel, curves, band in panels]
  panels = [p for p in panels if p[2]]
  if not panels:
    return False
  # A Figure of its own, not pyplot's: no global backend or figure list to
  # touch in the process that trains (or in a user's notebook).
  fig = figure.Figure(figsize=(8, 3.6 * len(panels)), dpi=120)
  axes = fig.subplots(len(panels), 1, squeeze=False)
  for ax, panel in zip(axes[:, 0], panels):
    _panel(ax, rows, *panel)
  fig.tight_layout()
  storage.save_figure(fig, path)
  return True


def write_plots(workdir: storage.PathLike) -> list[epath.Path]:
  """Writes the run's PNG charts into <workdir>/plots/ and returns their paths.

  Raises:
    errors.UserError: the run has no metrics yet.
  """
  workdir = storage.path(workdir)
  source = workdir / "tensorboard" / "metrics.jsonl"
  if not source.is_file():
    raise errors.UserError(f"{source}: missing; is {workdir} a gemma-grpo work directory with at least one step?")
  rows = metrics_lib.read_jsonl(source)
  if not rows:
    raise errors.UserError(f"{source}: no metrics yet; plot again after the first training step")
  out = workdir / "plots"
  out.mkdir(parents=True, exist_ok=True)
  keys = sorted({k for r in rows for k in r})
  reward_fns = [k for k in keys if k.startswith("rewards/train/")
                and k.rsplit("/", 1)[1] not in _REWARD_SUMMARIES]
  charts = {
      "rewards.png": [
          ("Reward per completion", "reward",
           [("diagnostics/train/reward/mean", "total (advantage input)"),
            ("rewards/train/sum", "sum of reward functions")],
           ("diagnostics/train/reward/mean", "diagnostics/train/reward/std")),
          ("Reward per function (mean)", "reward",
           [(k, k.rsplit("/", 1)[1]) for k in reward_fns], None),
      ],
      "completion_length.png": [
          ("Completion length", "tokens",
           [("completions/train/mean_length", "mean"), ("completions/train/max_length", "max"),
            ("completions/train/min_length", "min")], None),
          ("Completions cut at the length limit; groups with equal rewards", "fraction",
           [("completions/train/truncated_frac", "truncated"),
            ("diagnostics/train/zero_std_frac", "zero-std groups")], None),
      ],
      "entropy.png": [
          ("Policy entropy per completion token", "nats",
           [("actor/train/entropy", "entropy")], None),
      ],
      "loss.png": [
          ("Training loss (GRPO: policy loss; SFT: NLL of the model turn)", "loss",
           [("actor/train/loss", "loss")], None),
      ],
      "kl.png": [
          ("KL to the reference policy (k3, per token)", "nats",
           [("actor/train/kl", "KL")], None),
      ],
      "clipping.png": [
          ("Clipped share of the policy ratio (0 while every update is on-policy)", "fraction",
           [("actor/train/clipfrac/low", "below 1 - epsilon"),
            ("actor/train/clipfrac/high", "above 1 + epsilon(_high)")], None),
          ("Policy ratio pi / pi_old over completion tokens", "ratio",
           [("actor/train/ratio/min", "min"), ("actor/train/ratio/mean", "mean"),
            ("actor/train/ratio/max", "max")], None),
      ],
      "throughput.png": [
          ("Rollout throughput", "tokens / s",
           [("perf/train/rollout_tokens_per_second", "generated tokens per second")], None),
          ("Wall time per step", "seconds",
           [("perf/train/step_seconds", "step"), ("perf/train/update_seconds", "update")], None),
      ],
      "accuracy.png": [
          ("Held-out accuracy (greedy decoding)", "fraction",
           [("eval/accuracy", "accuracy"), ("eval/format_accuracy", "format accuracy")], None),
      ],
  }
  written = [out / name for name, panels in charts.items() if _chart(out / name, rows, panels)]
  if not written:
    raise errors.UserError(f"{source}: none of the plotted metrics is present")
  return written
