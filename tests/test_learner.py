"""Tests for gemma_grpo.rl.learner: DAPO's pieces, the algorithm switch, and
two-step tiny runs of every algorithm with their diagnostics.
"""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from tunix.rl import function_registry

from configs import base
from conftest import run_cli
from gemma_grpo.tasks import data
from gemma_grpo.rl import learner
from gemma_grpo.rl import losses
from gemma_grpo.runtime import metrics
from gemma_grpo.tasks import prompts


# --- overlong penalty: L = 16 tokens, buffer B = 4, penalty 1.0 (or 0.5) ------

@pytest.mark.parametrize("length, penalty, expected", [
    (0, 1.0, 0.0),
    (11, 1.0, 0.0),     # below the buffer
    (12, 1.0, 0.0),     # L - B: the buffer starts after this
    (13, 1.0, -0.25),   # inside: -(13 - 12) / 4
    (14, 1.0, -0.5),
    (15, 1.0, -0.75),
    (16, 1.0, -1.0),    # at L: the full penalty
    (20, 1.0, -1.0),    # beyond L: stays at the full penalty
    (14, 0.5, -0.25),   # scaled by the penalty factor
    (16, 0.5, -0.5),
])
def test_overlong_penalty(length, penalty, expected):
  [value] = learner.overlong_penalty([length], max_length=16, buffer=4, penalty=penalty)
  assert value == pytest.approx(expected)


def test_overlong_penalty_off_with_zero_buffer():
  np.testing.assert_array_equal(learner.overlong_penalty([3, 16], 16, 0, 1.0), [0.0, 0.0])


# --- dynamic sampling ---------------------------------------------------------

FLAT = [1.0, 1.0]    # a group whose rewards are all equal (zero std)
SPREAD = [0.0, 1.0]  # a group with a reward spread


def test_has_signal():
  np.testing.assert_array_equal(
      learner.has_signal([FLAT, SPREAD, [0.0, 0.0], [-1.0, -1.5]]), [False, True, False, True])


def test_select_groups_keeps_informative_groups_without_refilling_when_full():
  calls = []
  sel = learner.select_groups([SPREAD, SPREAD], lambda r: calls.append(r), 2, 3)
  assert sel.picks == ((0, 0), (0, 1))
  assert calls == [] and sel.extra_rounds == 0 and sel.padded == 0


def test_select_groups_refills_from_extra_rounds_and_drops_flat_groups():
  refills = {1: [FLAT, SPREAD, FLAT], 2: [SPREAD, SPREAD, FLAT]}
  calls = []

  def roll_more(round_):
    calls.append(round_)
    return refills[round_]

  sel = learner.select_groups([SPREAD, FLAT, FLAT], roll_more, 3, 5)
  assert calls == [1, 2]  # stopped as soon as 3 informative groups were in
  assert sel.picks == ((0, 0), (1, 1), (2, 0))  # only groups with a spread
  assert sel.extra_rounds == 2
  assert sel.padded == 0
  assert sel.dropped == 5  # every flat group rolled out
  assert sel.surplus == 1  # (2, 1) had a spread but the batch was full
  assert (sel.zero_std, sel.rolled_out) == (5, 9)


def test_select_groups_stops_at_its_bound_and_pads_with_flat_groups():
  calls = []

  def roll_more(round_):
    calls.append(round_)
    return [FLAT, FLAT]

  sel = learner.select_groups([FLAT, SPREAD], roll_more, 2, 2)
  assert calls == [1, 2]  # max_extra_rounds = 2
  assert sel.picks == ((0, 0), (0, 1))  # the batch's own flat group fills the gap
  assert (sel.extra_rounds, sel.padded, sel.dropped) == (2, 1, 4)


def test_select_groups_without_refills_keeps_the_batch():
  sel = learner.select_groups([FLAT, SPREAD], None, 2, 3)
  assert sel.picks == ((0, 0), (0, 1)) and sel.extra_rounds == 0 and sel.padded == 1


PROBLEMS = [data.Problem(f"What is {i} + 1?", str(i + 1), "") for i in range(10)]


def test_refill_batch_is_deterministic_per_step_call_and_round():
  kwargs = dict(num_groups=3, num_generations=2, seed=7, step=4, call=0,
                columns={"prompts": [], "answer": [], "trajectory_ids": []})
  first = learner.refill_batch(PROBLEMS, round_=1, **kwargs)
  again = learner.refill_batch(PROBLEMS, round_=1, **kwargs)
  other = learner.refill_batch(PROBLEMS, round_=2, **kwargs)
  assert first["prompts"] == again["prompts"]
  assert first["prompts"] != other["prompts"]
  assert len(first["prompts"]) == 6 and first["prompts"][0] == first["prompts"][1]
  gold = {prompts.render_prompt(p.question): p.answer for p in PROBLEMS}
  assert all(gold[q] == a for q, a in zip(first["prompts"], first["answer"]))
  assert set(first) == {"prompts", "answer", "trajectory_ids"}


def test_refill_batch_needs_every_training_column():
  with pytest.raises(ValueError, match="difficulty"):
    learner.refill_batch(PROBLEMS, num_groups=1, num_generations=2, seed=0, step=0,
                         call=0, round_=1, columns={"prompts": [], "difficulty": []})


# --- the algorithm switch -----------------------------------------------------


def grpo_section(**overrides) -> ml_collections.ConfigDict:
  c = base.get_config().grpo
  with c.unlocked():
    c.update(overrides)
  return c


@pytest.mark.parametrize("algorithm, expected", [
    ("grpo", dict(advantage_estimator="grpo", loss_agg_mode="sequence-mean-token-mean",
                  loss_algo="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.08)),
    ("dapo", dict(advantage_estimator="grpo", loss_agg_mode="token-mean",
                  loss_algo="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.0)),
    ("dr_grpo", dict(advantage_estimator="drgrpo", loss_agg_mode="sequence-mean-token-scale",
                     loss_algo="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.08)),
    ("gspo", dict(advantage_estimator="grpo", loss_agg_mode="sequence-mean-token-mean",
                  loss_algo="gspo-token", epsilon=3e-4, epsilon_high=4e-4, beta=0.08)),
])
def test_algo_config(algorithm, expected):
  cfg = learner.algo_config(grpo_section(algorithm=algorithm))
  assert cfg.policy_loss_fn == "gemma_grpo"
  assert cfg.kl_loss_mode == "low_var_kl"
  assert {f: getattr(cfg, f) for f in expected} == pytest.approx(expected)


def test_algo_config_carries_the_tis_cap():
  assert learner.algo_config(grpo_section()).tis_cap == 0.0
  assert learner.algo_config(grpo_section(algorithm="gspo", tis_cap=2.0)).tis_cap == 2.0


def test_loss_metrics_log_tis_only_when_it_is_on():
  tis = {"tis/ratio_mean", "tis/ratio_min", "tis/ratio_max", "tis/capped_frac"}
  assert not tis & set(learner.loss_metrics(with_kl=True))
  on = learner.loss_metrics(with_kl=True, with_tis=True)
  assert tis <= set(on)
  assert (on["tis/ratio_min"], on["tis/ratio_max"]) == (np.min, np.max)


# --- which log-probs the ratio and TIS's weight divide by ---------------------

SAMPLER, TRAINER = "sampler", "trainer"


@pytest.mark.parametrize("sampler, tis, off_policy, expected", [
    # float32 sampler, TIS off: the loss's own log pi, or the trainer's old ones.
    (None, False, False, (None, None)),
    (None, False, True, (TRAINER, None)),
    # A bfloat16 sampler, TIS off: it is the behaviour policy of the ratio.
    (SAMPLER, False, False, (SAMPLER, None)),
    (SAMPLER, False, True, (SAMPLER, None)),
    # TIS on: the ratio keeps the trainer's log-probs, the weight takes the sampler's.
    (SAMPLER, True, False, (None, SAMPLER)),
    (SAMPLER, True, True, (TRAINER, SAMPLER)),
])
def test_behaviour_logps(sampler, tis, off_policy, expected):
  calls = []

  def trainer_old_logps():
    calls.append(1)
    return TRAINER

  got = learner.behaviour_logps(sampler, tis=tis,
                                trainer_old_logps=trainer_old_logps if off_policy else None)
  assert got == expected
  assert len(calls) == (expected[0] == TRAINER)  # the trainer's pass only when used


def test_algo_config_carries_dapo_extras():
  cfg = learner.algo_config(grpo_section(
      algorithm="dapo", beta=0.0, overlong_buffer=64, overlong_penalty=0.5,
      dynamic_sampling=True, max_resample_rounds=2))
  assert (cfg.overlong_buffer, cfg.overlong_penalty) == (64, 0.5)
  assert (cfg.dynamic_sampling, cfg.max_resample_rounds) == (True, 2)


@pytest.mark.parametrize("name, rewards, expected", [
    # GRPO: (r - mean) / std with the sample std (ddof 1) of the group.
    ("grpo", [1.0, 3.0, 0.0, 0.0], [-1 / np.sqrt(2), 1 / np.sqrt(2), 0.0, 0.0]),
    # Dr. GRPO: r - mean only.
    ("drgrpo", [1.0, 3.0, 0.0, 4.0], [-1.0, 1.0, -2.0, 2.0]),
])
def test_advantage_estimators(name, rewards, expected):
  fn = function_registry.get_advantage_estimator(name)
  np.testing.assert_allclose(fn(rewards=np.array(rewards), num_generations=2), expected,
                             rtol=1e-5, atol=1e-6)


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
)
DAPO = ("--config.grpo.beta=0", "--config.grpo.overlong_buffer=4",
        "--config.grpo.dynamic_sampling=true", "--config.grpo.max_resample_rounds=1")


@pytest.mark.parametrize("algorithm, extra", [
    ("grpo", ()),
    pytest.param("dapo", DAPO, marks=pytest.mark.slow),
    pytest.param("dr_grpo", (), marks=pytest.mark.slow),
    pytest.param("gspo", (), marks=pytest.mark.slow),
])
def test_tiny_config_trains_two_steps_and_logs_diagnostics(tmp_path, algorithm, extra):
  workdir = tmp_path / "run"
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir),
                  f"--config.grpo.algorithm={algorithm}", *extra])
  assert "entropy" in proc.stdout and "zero-std" in proc.stdout
  rows = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:
    missing = [k for k in DIAGNOSTICS if k not in row]
    assert not missing, missing
    # The tiny random model is near-uniform over Gemma's 262,144 tokens.
    assert row["actor/train/entropy"] == pytest.approx(np.log(262144), abs=0.1)
    assert 0 <= row["diagnostics/train/zero_std_frac"] <= 1
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
  original_example = learner._train_example  # pylint: disable=protected-access

  def keep(*args, **kwargs):
    captured["example"] = original_example(*args, **kwargs)
    return captured["example"]

  monkeypatch.setattr(learner, "_train_example", keep)
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.commands import train  # pylint: disable=g-import-not-at-top

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
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import errors  # pylint: disable=g-import-not-at-top

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
  run_cli(["train", *args, "--workdir", str(tmp_path / "parts"), "--config.train.max_steps=4"])
  run_cli(["train", *args, "--workdir", str(tmp_path / "parts"), "--config.train.max_steps=8"])
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


# --- Tool results: in the sequence, out of the loss ----------------------------

PAD = 0
# One completion that called a tool: the model wrote 5 tokens, the tool's
# result 3 (slots 3-5), then the model 2 more, then padding.
TOOL_ROW = np.array([11, 12, 13, 21, 22, 23, 14, 15, PAD, PAD])
TOOL_MASK = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0, 0], bool)
PLAIN_ROW = np.array([16, 17, 18, 19, PAD, PAD, PAD, PAD, PAD, PAD])


def test_the_train_example_masks_tool_results_token_by_token():
  completion_ids = jnp.asarray(np.stack([TOOL_ROW, PLAIN_ROW]))
  example = learner._train_example(  # pylint: disable=protected-access
      jnp.ones((2, 4), jnp.int32), completion_ids, np.zeros(2), None, None, None, PAD,
      np.stack([TOOL_MASK, np.zeros(10, bool)]))
  np.testing.assert_array_equal(example.completion_ids, completion_ids)  # read by the model
  np.testing.assert_array_equal(example.completion_mask, [
      [1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
      [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_tool_tokens_change_no_term_of_the_loss(algorithm):
  """Values at tool-result slots (log-probs, old and reference log-probs, the
  sampler's) move neither the loss nor any metric, and the loss equals that of
  the same completion with the result's slots cut out (token counts, DAPO's
  included, see only the model's tokens)."""
  algo = learner.algo_config(grpo_section(algorithm=algorithm, beta=0.04, tis_cap=2.0))
  rng = np.random.default_rng(0)
  logps, old, ref, sampler = (jnp.asarray(-rng.uniform(0.1, 3.0, (2, 10)), jnp.float32)
                              for _ in range(4))
  mask = jnp.asarray(np.stack([~TOOL_MASK & (TOOL_ROW != PAD), PLAIN_ROW != PAD]))
  advantages = jnp.asarray([1.0, -0.5])

  def loss(logps, old, ref, sampler, mask):
    return losses.policy_loss(
        logps, advantages, mask, old_logps_BxT=old, ref_logps_BxT=ref,
        sampler_logps_BxT=sampler, tis_cap=algo.tis_cap, epsilon_low=algo.epsilon,
        epsilon_high=algo.epsilon_high, beta=algo.beta,
        sequence_ratio=algo.loss_algo == "gspo-token", aggregation=algo.loss_agg_mode)

  want, want_aux = loss(logps, old, ref, sampler, mask)
  noise = jnp.asarray(np.stack([TOOL_MASK, np.zeros(10, bool)])) * 5.0
  got, got_aux = loss(logps - noise, old + noise, ref - noise, sampler + noise, mask)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for name in want_aux:
    np.testing.assert_allclose(got_aux[name], want_aux[name], rtol=1e-6, err_msg=name)

  keep = np.flatnonzero(~TOOL_MASK)  # row 0 with the tool's slots cut out, padded again

  def cut(x_BxT):
    x_BxT = np.array(x_BxT)
    x_BxT[0] = np.r_[x_BxT[0, keep], np.zeros(len(TOOL_ROW) - len(keep), x_BxT.dtype)]
    return jnp.asarray(x_BxT)

  cut_loss, _ = loss(cut(logps), cut(old), cut(ref), cut(sampler), cut(mask))
  np.testing.assert_allclose(cut_loss, want, rtol=1e-6)
