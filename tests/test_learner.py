"""Tests for gemma_grpo.rl.learner.learner: two-step tiny runs of every algorithm with
their diagnostics, a bfloat16 sampler, and several updates per batch.

The learner's pieces are tested in test_algorithms.py, test_dynamic_sampling.py,
test_rollout_rounds.py and test_train_examples.py.
"""

import json

import numpy as np
import pytest

from configs import base
from conftest import run_as_of_step
from conftest import run_cli
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.commands import train
from gemma_grpo.rl.learner import learner
from gemma_grpo.rl.learner import train_examples
from gemma_grpo.runtime import metrics


# --- two steps of every algorithm on configs/tiny.py --------------------------

DIAGNOSTICS = (
    "rewards/train/sum", "diagnostics/train/reward/mean", "diagnostics/train/reward/std",
    "diagnostics/train/reward_std/answer_correct", "diagnostics/train/zero_std_frac",
    "completions/train/mean_length", "completions/train/max_length",
    "completions/train/truncated_frac", "actor/train/entropy", "actor/train/token_prob",
    "actor/train/kl", "actor/train/clipfrac/low", "actor/train/clipfrac/high",
    "diagnostics/train/advantage/abs_mean", "diagnostics/train/advantage/max",
    "diagnostics/train/advantage/min", "diagnostics/train/advantage/nonzero_frac",
    "perf/train/rollout_tokens_per_second", "perf/train/step_seconds",
    "rollout/train/occupancy", "rollout/train/decode_steps",
)
DAPO = ("--config.grpo.beta=0", "--config.grpo.overlong_buffer=4",
        "--config.grpo.dynamic_sampling=true", "--config.grpo.max_resample_rounds=1")


@pytest.mark.parametrize("algorithm, extra", [
    ("grpo", ()),
    pytest.param("dapo", DAPO, marks=pytest.mark.slow),
    pytest.param("dr_grpo", (), marks=pytest.mark.slow),
    pytest.param("gspo", (), marks=pytest.mark.slow),
])
def test_tiny_config_trains_two_steps_and_logs_diagnostics(request, tmp_path, algorithm, extra):
  if algorithm == config_lib.defaults().grpo.algorithm:
    # The session's tiny_run is this run (plus a reward that varies): not trained twice.
    workdir = request.getfixturevalue("tiny_run")
    stdout = (workdir.parent / "stdout.txt").read_text()
  else:
    workdir = tmp_path / "run"
    stdout = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir),
                      f"--config.grpo.algorithm={algorithm}", *extra]).stdout
  assert "entropy" in stdout and "zero-std" in stdout
  rows = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:
    missing = [k for k in DIAGNOSTICS if k not in row]
    assert not missing, missing
    # The tiny random model is near-uniform over Gemma's 262,144 tokens.
    assert row["actor/train/entropy"] == pytest.approx(np.log(262144), abs=0.1)
    assert 0 <= row["diagnostics/train/zero_std_frac"] <= 1
    assert 0 < row["rollout/train/occupancy"] <= 1
  if algorithm == "dapo":
    for row in rows:
      assert row["diagnostics/train/dynamic_sampling/extra_rounds"] <= 1
      assert "diagnostics/train/dynamic_sampling/padded_groups" in row
      # Every completion hits the 16-token limit: the full overlong penalty.
      assert row["rewards/train/overlong"] == pytest.approx(-1.0)
      assert row["diagnostics/train/reward/mean"] == pytest.approx(row["rewards/train/sum"] - 1.0)



def one_bfloat16_sampled_step(monkeypatch, workdir, tis_cap: float):
  """(rollout round, train example, metrics row) of one tiny step decoded in bfloat16."""
  rounds = []
  original = learner.Learner._rollout

  def spy(self, inputs, mode, key):
    rounds.append(original(self, inputs, mode, key))
    return rounds[-1]

  monkeypatch.setattr(learner.Learner, "_rollout", spy)
  captured = {}
  original_example = train_examples.train_example

  def keep(*args, **kwargs):
    captured["example"] = original_example(*args, **kwargs)
    return captured["example"]

  monkeypatch.setattr(train_examples, "train_example", keep)
  c = config_lib.load("configs/tiny.py")
  c.rollout.decode_dtype = "bfloat16"
  c.grpo.tis_cap = tis_cap
  c.train.max_steps = c.ckpt.every_steps = 1
  c.eval.every_steps = 0
  assert train.train(c, str(workdir)) == 0
  (round_,) = rounds
  (row,) = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  return round_, captured["example"], row


def test_a_bfloat16_sampler_is_the_ratios_behaviour_policy(monkeypatch, tmp_path):
  # The float32 trainer scores samples drawn from the policy rounded to
  # bfloat16 against the sampler's own log-probs: each row's end where its
  # trained tokens end, the train example carries them as the old log-probs,
  # and the first update's ratio pi / sampler is no longer exactly 1 (as it
  # is with a float32 sampler, tests above), but close to it.
  round_, example, row = one_bfloat16_sampled_step(monkeypatch, tmp_path / "run", tis_cap=0.0)
  sample_logps = round_.sample_logps
  assert sample_logps is not None and sample_logps.shape == round_.completion_ids.shape
  for i, length in enumerate(round_.lengths):
    assert np.all(sample_logps[i, :length] < 0), i
    assert np.all(sample_logps[i, length:] == 0), i
  np.testing.assert_array_equal(np.asarray(example.old_per_token_logps), sample_logps)
  assert example.sampler_per_token_logps is None
  low, high = row["actor/train/ratio/min"], row["actor/train/ratio/max"]
  assert high - low > 1e-4, (low, high)
  assert 0.9 < low < 1 < high < 1.1, (low, high)
  assert "actor/train/tis/ratio_mean" not in row


@pytest.mark.slow
def test_with_tis_the_bfloat16_samplers_logps_weight_the_loss_instead(monkeypatch, tmp_path):
  # grpo.tis_cap > 0: the ratio divides by the trainer's own log-probs (one
  # update per rollout: the loss's own, so exactly 1) and the sampler's
  # log-probs travel in their own field to TIS's weight, pi / sampler.
  round_, example, row = one_bfloat16_sampled_step(monkeypatch, tmp_path / "run", tis_cap=2.0)
  assert example.old_per_token_logps is None
  np.testing.assert_array_equal(np.asarray(example.sampler_per_token_logps), round_.sample_logps)
  assert row["actor/train/ratio/min"] == row["actor/train/ratio/max"] == 1.0
  low, high = row["actor/train/tis/ratio_min"], row["actor/train/tis/ratio_max"]
  assert high - low > 1e-4, (low, high)
  assert 0.9 < low < 1 < high < 1.1, (low, high)
  assert low <= row["actor/train/tis/ratio_mean"] <= high
  assert row["actor/train/tis/capped_frac"] == 0.0  # no ratio near C = 2

# --- several updates per batch (grpo.num_iterations) ---------------------------

TWO_UPDATES = ("--config.grpo.num_iterations=2", "--config.train.max_steps=2",
               "--config.ckpt.every_steps=2", "--config.rewards.custom=tests.toy_rewards:vowel_share",
               "--config.optim.peak_lr=0.01")


@pytest.fixture(scope="module")
def two_updates_per_batch(tmp_path_factory):
  """Metrics rows of one batch trained twice by grpo, gspo and dapo (same samples)."""
  runs = {}
  for algorithm, extra in (("grpo", ()), ("gspo", ()),
                           # A narrow upper clip, so clip-higher visibly engages.
                           ("dapo", ("--config.grpo.beta=0", "--config.grpo.epsilon=0.01",
                                     "--config.grpo.epsilon_high=0.02"))):
    workdir = tmp_path_factory.mktemp(algorithm)
    run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir),
             f"--config.grpo.algorithm={algorithm}", *TWO_UPDATES, *extra])
    runs[algorithm] = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  return runs


@pytest.mark.slow
def test_mini_batches_share_one_rollout_and_the_later_ones_are_off_policy(tmp_path):
  # train.mini_batch_size=1 of batch 2: one rollout, one update per prompt (verl's mini-batches).
  run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path),
           "--config.train.mini_batch_size=1", "--config.train.max_steps=2",
           "--config.ckpt.every_steps=2", "--config.rewards.custom=tests.toy_rewards:vowel_share",
           "--config.optim.peak_lr=0.01", "--config.grpo.algorithm=dapo", "--config.grpo.beta=0",
           "--config.grpo.epsilon=0.01", "--config.grpo.epsilon_high=0.02"])
  first, second = metrics.read_jsonl(tmp_path / "tensorboard" / "metrics.jsonl")
  assert (first["step"], second["step"]) == (1, 2)
  # One rollout for both updates: its metrics once, over all 2 x 2 completions.
  assert "rewards/train/sum" in first and "rewards/train/sum" not in second
  assert "perf/train/rollout_seconds" in first and "perf/train/rollout_seconds" not in second
  assert first["actor/train/ratio/min"] == pytest.approx(1.0, abs=1e-5)
  assert first["actor/train/ratio/max"] == pytest.approx(1.0, abs=1e-5)
  assert second["actor/train/ratio/max"] - second["actor/train/ratio/min"] > 1e-2
  # The first update moved the second prompt's completions past DAPO's narrow clip.
  clipped = lambda row: row["actor/train/clipfrac/low"] + row["actor/train/clipfrac/high"]
  assert clipped(second) > 0 and clipped(first) == 0


@pytest.mark.slow
def test_the_second_update_of_a_batch_is_off_policy(two_updates_per_batch):
  for algorithm, rows in two_updates_per_batch.items():
    first, second = rows
    assert (first["step"], second["step"]) == (1, 2)
    # The batch's rollout metrics sit on its first update, once.
    assert "rewards/train/sum" in first and "rewards/train/sum" not in second, algorithm
    # Update 1 scores the samples under the policy that drew them: ratio 1.
    assert first["actor/train/ratio/min"] == pytest.approx(1.0, abs=1e-5), algorithm
    assert first["actor/train/ratio/max"] == pytest.approx(1.0, abs=1e-5), algorithm
    # Update 2 scores them under the updated policy.
    spread = second["actor/train/ratio/max"] - second["actor/train/ratio/min"]
    assert spread > 1e-2, (algorithm, spread)
  assert two_updates_per_batch["dapo"][1]["actor/train/clipfrac/high"] > 0
  assert two_updates_per_batch["dapo"][0]["actor/train/clipfrac/high"] == 0


@pytest.mark.slow
def test_gspo_and_grpo_agree_on_policy_and_differ_off_it(two_updates_per_batch):
  grpo, gspo = two_updates_per_batch["grpo"], two_updates_per_batch["gspo"]
  # Same samples (same seed); at ratio 1 the sequence ratio's gradient is the
  # sequence-mean of the token ratios' gradients: the same first update.
  assert gspo[0]["rewards/train/sum"] == grpo[0]["rewards/train/sum"]
  assert gspo[0]["actor/train/grad_norm"] == pytest.approx(grpo[0]["actor/train/grad_norm"], rel=1e-3)
  # Off-policy, GSPO clips its sequence ratio at 1 +- 3e-4 and GRPO its token
  # ratios at 1 +- 0.2: the second updates differ.
  assert gspo[1]["actor/train/pg_clipfrac"] > grpo[1]["actor/train/pg_clipfrac"]
  assert gspo[1]["actor/train/grad_norm"] != pytest.approx(grpo[1]["actor/train/grad_norm"], rel=1e-2)


def test_several_updates_per_batch_must_tile_the_schedule():

  c = base.get_config()
  c.grpo.num_iterations = 2
  c.train.max_steps = 5
  with pytest.raises(errors.UserError, match=r"train.max_steps=5: must be a multiple of 2 \(grpo.num_iterations=2: "):
    config_lib.validate(c)
  c.grpo.num_iterations, c.train.batch_size, c.train.mini_batch_size, c.train.max_steps = 2, 4, 2, 4
  c.ckpt.every_steps, c.eval.every_steps = 6, 8
  with pytest.raises(errors.UserError, match=r"ckpt.every_steps=6: must be a multiple of 4 \(grpo.num_iterations=2"
                                             r" x train.batch_size / train.mini_batch_size = 2: "):
    config_lib.validate(c)
  c.train.mini_batch_size = 3
  with pytest.raises(errors.UserError, match="train.mini_batch_size=3: must divide train.batch_size=4"):
    config_lib.validate(c)


@pytest.mark.slow
def test_a_resumed_run_with_four_updates_per_batch_continues_exactly(tmp_path):
  # Two mini-batches, each trained twice: 4 updates per batch. A constant
  # rate, so a 4-step run and the 8-step run share their first steps.
  args = ["--config", "configs/tiny.py", "--config.grpo.num_iterations=2",
          "--config.train.mini_batch_size=1", "--config.eval.every_steps=0",
          "--config.ckpt.every_steps=4", "--config.rewards.custom=tests.toy_rewards:vowel_share",
          "--config.optim.peak_lr=0.01", "--config.optim.end_lr=0.01",
          "--config.optim.warmup_fraction=0"]
  run_cli(["train", *args, "--workdir", str(tmp_path / "whole"), "--config.train.max_steps=8"])
  # The run as it was after its checkpoint at step 4 (a stop then, or a
  # crash before step 8's checkpoint): what a 4-step run of the same config
  # would leave, without training those 4 steps again.
  parts = run_as_of_step(tmp_path / "whole", tmp_path / "parts", 4)
  jsonl = parts / "tensorboard" / "metrics.jsonl"
  resumed = run_cli(["train", *args, "--workdir", str(parts), "--config.train.max_steps=8"])
  assert "Resuming from step 4" in resumed.stderr, resumed.stderr[-3000:]
  logged = [json.loads(line)["step"] for line in jsonl.read_text().splitlines()]
  assert logged == list(range(1, 9)), logged  # steps 5-8 trained once, after the copied 1-4
  whole, parts = (
      {r["step"]: r for r in metrics.read_jsonl(tmp_path / name / "tensorboard" / "metrics.jsonl")}
      for name in ("whole", "parts"))
  # One rollout per batch, its metrics on the batch's first update.
  assert sorted(s for s, r in whole.items() if "rewards/train/sum" in r) == [1, 5]
  # The resumed run rolls out the second batch (not the fifth: Tunix counts
  # updates, four per batch) with the same key, and trains on it the same way.
  assert parts[5]["rewards/train/sum"] == pytest.approx(whole[5]["rewards/train/sum"], rel=1e-6)
  for step in (5, 6, 7, 8):
    for key in ("actor/train/loss", "actor/train/grad_norm"):
      assert parts[step][key] == pytest.approx(whole[step][key], rel=1e-4, abs=1e-7), (step, key)
