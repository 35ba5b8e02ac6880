"""The metrics writer: step alignment, rows, console line."""

import io

import pytest

from gemma_grpo.runtime import metrics


@pytest.mark.parametrize("event, step, expected", [
    ("actor/train/loss", 3, 3),  # trainer scalars carry the updates done
    ("rewards/train/sum", 2, 3),  # rollout scalars carry the step before
    ("completions/train/mean_length", 0, 1),
    ("diagnostics/train/zero_std_frac", 4, 5),
])
def test_tunix_step_alignment(event, step, expected):
  assert metrics.tunix_step(event, step) == expected


def test_rows_are_written_when_finished_and_internals_ignored(tmp_path):
  out = io.StringIO()
  w = metrics.Writer(tmp_path, flush_every_steps=1, max_steps=2, console=out,
                     learning_rates=[0.5, 0.25])
  w.log_scalar("rewards/train/sum", 1.5, step=0)
  w.log_scalar("actor/train/loss", 0.1, step=1)
  w.log_scalar("actor/train/learning_rate", 0.25, step=1)  # Tunix: a step late
  w.log_scalar("/jax/orbax/write/gbytes", 1.0, step=1)
  w.log_scalar("actor/train/kl", 0.01, step=None)
  w.scalar("eval/accuracy", 0.75, 1)
  assert out.getvalue() == ""
  w.finish_through(1)
  line = out.getvalue().strip()
  assert line.startswith("step 1/2 | reward 1.5 | loss 0.1 | lr 0.5")
  assert line.endswith("eval/accuracy 0.75")
  w.log_scalar("actor/train/loss", 0.2, step=2)
  w.close()
  rows = metrics.read_jsonl(tmp_path / "metrics.jsonl")
  assert rows == [
      {"step": 1, "rewards/train/sum": 1.5, "actor/train/loss": 0.1,
       "actor/train/learning_rate": 0.5, "eval/accuracy": 0.75},
      {"step": 2, "actor/train/loss": 0.2},
  ]


def test_console_line_lists_reward_functions_but_not_aggregates():
  row = {"rewards/train/sum": 3.0, "rewards/train/mean": 1.0, "rewards/train/format_exact": 1.5,
         "rewards/train/answer_correct": 1.5, "actor/train/loss": float("nan")}
  line = metrics.console_line(4, 10, row)
  assert line == "step 4/10 | reward 3 | [answer_correct 1.5, format_exact 1.5]"


@pytest.mark.parametrize("logger_name, message", [
    ("absl", "Skipping non-TPU device: cpu. You might be missing jax[tpu] dependency."),
    ("transformers", "PyTorch was not found. Models won't be available and only tokenizers,"
                     " configuration and file/data utilities can be used."),
])
def test_misleading_dependency_warnings_are_dropped_and_no_others(caplog, logger_name, message):
  import logging  # pylint: disable=g-import-not-at-top

  metrics.configure_logging()
  logger = logging.getLogger(logger_name)
  with caplog.at_level(logging.WARNING):
    logger.warning(message)
    logger.warning("a warning a user should see")
  assert [r.getMessage() for r in caplog.records] == ["a warning a user should see"]
