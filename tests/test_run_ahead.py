"""Rollouts run ahead of the update (rl/run/run_ahead.py), on a tiny random Gemma-3."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import run_as_of_step
from conftest import run_cli
from conftest import start_processes
from conftest import wait_all
from gemma_grpo.rl.eval import scoring
from gemma_grpo.rl.run import run_ahead
from gemma_grpo.runtime import metrics
from gemma_grpo.seam import jax_mesh
from gemma_grpo.tasks import prompts
from test_carry_over import tiny_setup  # noqa: F401  pylint: disable=unused-import
from test_placement import own_group
from test_rollout import SAMPLINGS, config, generate, uneven_stop, with_slots
from test_train import compiled_once, train_watching_compiles

G = 2
QUESTIONS = [f"What is {a} + {b}?" for a, b in ((2, 3), (4, 4), (9, 1), (6, 7), (5, 5), (8, 2),
                                                  (1, 1), (3, 9), (7, 7), (2, 8))]
BATCHES = [{"prompts": np.array([prompts.render_prompt(q) for q in QUESTIONS[i:i + 2]])}
           for i in range(0, len(QUESTIONS), 2)]  # 5 batches of 2 problems
KEY = jax.random.PRNGKey(3)


def rows(batch):
  """A batch's rows as the trainer hands them over: each problem G times."""
  return [p for p in batch["prompts"].tolist() for _ in range(G)]


def run(engine, mesh, steps, k, stops, start=0, update=lambda step: None):
  """Steps start.. of a trainer over BATCHES[start:], running ahead by k."""
  lookahead = run_ahead.Lookahead(BATCHES[start:])
  ahead = run_ahead.RunAhead(engine, lookahead, max_staleness=k, num_generations=G,
                             rollout_key=KEY)
  rollout_config = config(**SAMPLINGS["top-k 50"], eos_tokens=stops)
  outs = []
  for step in steps:
    batch = next(lookahead)  # as Tunix draws the step's batch before its rollout
    with jax_mesh.tunix_mesh(mesh):
      outs.append(ahead.rollout(step, rows(batch), rollout_config, version=step))
    update(step)
  return outs


@pytest.mark.parametrize("k", [1, 2])
def test_each_step_trains_its_own_batch_drawn_with_locksteps_key(tiny_setup, k):
  # Weights fixed: step s's completions are what one call of the plain slots
  # engine draws for batch s with lockstep step s's key, although its samples
  # were admitted k steps earlier and some spanned several calls.
  mesh, actor, tokenizer, engine = tiny_setup
  stops = [uneven_stop(engine, mesh)]
  outs = run(with_slots(engine, actor, tokenizer, mesh, 3), mesh, range(5), k, stops)
  plain = with_slots(engine, actor, tokenizer, mesh, 3)
  for step, out in enumerate(outs):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(KEY, step), 0), 0)
    want = generate(plain, mesh, rows(BATCHES[step]), **{**SAMPLINGS["top-k 50"], "seed": key},
                    eos_tokens=stops, return_logprobs=True)
    assert [t.tolist() for t in out.out.tokens] == [t.tolist() for t in want.tokens]
    for got, expected in zip(out.out.logprobs, want.logprobs):
      np.testing.assert_array_equal(got, expected)
    # Admitted at step max(step - k, 0), trained now: that many updates old at most.
    assert out.metrics["rollout/staleness_max"][0] == min(step, k)
  assert sum(o.metrics["rollout/newer_policy_token_frac"][0] > 0 for o in outs) >= 1
  # The last steps admit nothing new (the data ended) and finish what is in flight.
  assert outs[-1].metrics["rollout/in_flight"][0] == 0


def test_no_token_is_older_than_the_bound_when_every_completion_runs_to_the_limit(tiny_setup):
  # The slowest case: every completion needs all its tokens, so the slots
  # always hold unfinished samples; each step must still finish its batch.
  mesh, actor, tokenizer, engine = tiny_setup
  updates = []

  def update(step):  # an update between steps: new adapters, as the trainer's
    updates.append(step)
    nnx.update(actor, jax.tree.map(lambda x: x * 1.01, nnx.state(actor, nnx.LoRAParam)))

  original = jax.tree.map(lambda x: x, nnx.state(actor, nnx.LoRAParam))
  try:
    outs = run(with_slots(engine, actor, tokenizer, mesh, 3), mesh, range(5), 1, [-1],
               update=update)
  finally:
    nnx.update(actor, original)
  for out in outs:
    assert all(len(t) == 8 for t in out.out.tokens)
    assert out.metrics["rollout/staleness_max"][0] <= 1
  assert any(o.metrics["rollout/in_flight"][0] > 0 for o in outs[:-1])
  # Tokens drawn after an update come from the newer policy (staleness 0).
  assert any(0 < o.metrics["rollout/newer_policy_token_frac"][0] < 1 for o in outs)


def test_a_resumed_run_starts_again_at_its_step_and_refuses_a_batch_out_of_order(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  stops = [uneven_stop(engine, mesh)]
  slotted = with_slots(engine, actor, tokenizer, mesh, 3)
  # After a resume at step 2, the pipeline starts at batch 2: nothing lost, nothing twice.
  resumed = run(slotted, mesh, range(2, 5), 1, stops, start=2)
  assert [len(o.out.tokens) for o in resumed] == [2 * G] * 3
  lookahead = run_ahead.Lookahead(BATCHES)
  ahead = run_ahead.RunAhead(slotted, lookahead, max_staleness=1, num_generations=G,
                             rollout_key=KEY)
  rollout_config = config(**SAMPLINGS["top-k 50"], eos_tokens=stops)
  with jax_mesh.tunix_mesh(mesh):
    ahead.rollout(0, rows(next(lookahead)), rollout_config, version=0)
    next(lookahead)
    with pytest.raises(RuntimeError, match="step 1's batch is not the one read ahead"):
      ahead.rollout(1, rows(BATCHES[3]), rollout_config, version=1)


def test_the_samples_in_flight_read_alike_only_where_they_were_drawn_alike(tiny_setup):
  # What each step compares across processes: equal for the same calls,
  # different once one sampled token differs (another key).
  mesh, actor, tokenizer, engine = tiny_setup
  rollout_config = config(**SAMPLINGS["top-k 50"], eos_tokens=[uneven_stop(engine, mesh)])
  views = []
  for key in (KEY, KEY, jax.random.PRNGKey(4)):
    lookahead = run_ahead.Lookahead(BATCHES)
    ahead = run_ahead.RunAhead(with_slots(engine, actor, tokenizer, mesh, 3), lookahead,
                               max_staleness=1, num_generations=G, rollout_key=key)
    with jax_mesh.tunix_mesh(mesh):
      ahead.rollout(0, rows(next(lookahead)), rollout_config, version=0)
    views.append(ahead.in_flight())
  assert views[0] == views[1] and "batch 1 from version 0" in views[0]
  assert views[2] != views[0]


class InLine:
  """A head start's schedule without the thread: each call runs when started."""

  def start(self, fn):
    fn()

  def settle(self):
    pass

  def close(self):
    pass


def test_a_head_start_beside_the_update_draws_what_it_draws_in_line(tiny_setup):
  # With a device group of its own the engine finishes batch s + 1 on its
  # worker thread while the update runs. What it draws depends only on the
  # adapters it started with: head starts run in line, with no thread and
  # no overlap, draw the same tokens.
  mesh, actor, tokenizer, engine = tiny_setup
  stops = [uneven_stop(engine, mesh)]
  group = own_group()
  original = jax.tree.map(lambda x: x, nnx.state(actor, nnx.LoRAParam))
  runs = []
  try:
    for in_line in (False, True):
      nnx.update(actor, original)
      own = with_slots(engine, actor, tokenizer, group, 3)
      if in_line:
        own.background = InLine()

      def update(step, own=own):  # the trainer's update on its device, then the sync
        del step
        nnx.update(actor, jax.tree.map(lambda x: x * 1.01, nnx.state(actor, nnx.LoRAParam)))
        own.update_params(nnx.state(actor, nnx.LoRAParam), (nnx.LoRAParam,))

      runs.append(run(own, group, range(5), 1, stops, update=update))
  finally:
    nnx.update(actor, original)
  threaded, in_line = runs
  for a, b in zip(threaded, in_line):
    assert [t.tolist() for t in a.out.tokens] == [t.tolist() for t in b.out.tokens]
    for got, expected in zip(a.out.logprobs, b.out.logprobs):
      np.testing.assert_array_equal(got, expected)
  # One step off: every token of batch s >= 1 was drawn by step s - 1's policy.
  assert [o.metrics["rollout/staleness_mean"][0] for o in threaded] == [0, 1, 1, 1, 1]
  assert all(o.metrics["rollout/newer_policy_token_frac"][0] == 0 for o in threaded)
  assert all(o.metrics["rollout/head_start_seconds"][0] > 0 for o in threaded[1:])


def test_lookahead_peeks_without_taking():
  lookahead = run_ahead.Lookahead(iter(range(4)))
  assert lookahead.peek(1) == 1 and lookahead.peek(0) == 0
  assert next(lookahead) == 0 and lookahead.peek(2) == 3 and lookahead.peek(3) is None
  assert list(lookahead) == [1, 2, 3]


# --- end to end: configs/tiny.py ----------------------------------------------

AHEAD = ("--config.rollout.slots=3", "--config.rollout.max_staleness=1",
         "--config.rewards.custom=tests.toy_rewards:vowel_share,tests.toy_rewards:prompt_code",
         "--config.optim.peak_lr=0.05", "--config.ckpt.every_steps=1", "--config.eval.every_steps=0")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """An uninterrupted 3-step run of AHEAD in one process, watched for compiles."""
  workdir = tmp_path_factory.mktemp("ahead") / "whole"
  return workdir, train_watching_compiles(workdir, ["--config.train.max_steps=3", *AHEAD])


def test_a_run_ahead_resumed_trains_the_batches_the_uninterrupted_one_does(tmp_path, whole):
  # Uninterrupted, nothing compiles after the first update: each step's call
  # merges new adapters at its prefill and takes the slots the last call left.
  workdir, watched = whole
  assert watched == compiled_once(3)
  rows_whole = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  assert [r["rollout/train/staleness_max"] for r in rows_whole] == [0, 1, 1]
  # The run as a kill -9 after step 2's checkpoint leaves it, with batch 3 in
  # flight in the slots: resumed, it samples batch 3 again from step 2's policy.
  parts = run_as_of_step(workdir, tmp_path / "parts", 2)
  jsonl = parts / "tensorboard" / "metrics.jsonl"
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(parts),
                  "--config.train.max_steps=3", *AHEAD])
  assert "Resuming from step 2" in proc.stderr
  resumed = metrics.read_jsonl(jsonl)
  assert [r["step"] for r in resumed] == [1, 2, 3]
  # Each step's batch, by the mean of its prompts' codes: the resumed run
  # trained every batch of the uninterrupted run, once each, in its order.
  codes = lambda rows: [r["rewards/train/prompt_code"] for r in rows]
  assert codes(resumed) == codes(rows_whole) and len(set(codes(rows_whole))) == 3
  # Step 1 trains tokens of the policy it updates: the ratio is 1. Step 2's
  # were drawn (mostly) before update 1, which the toy reward made visible.
  first, second = rows_whole[0], rows_whole[1]
  assert first["actor/train/ratio/min"] == pytest.approx(1.0, abs=1e-5)
  assert first["actor/train/ratio/max"] == pytest.approx(1.0, abs=1e-5)
  assert second["actor/train/ratio/max"] - second["actor/train/ratio/min"] > 1e-3


@pytest.mark.slow
def test_two_processes_run_ahead_with_one_view_of_the_samples_in_flight(tmp_path, whole):
  # One mesh over two processes of one device each. Each step checks that
  # both hold the same samples in flight (run_ahead.RunAhead.in_flight) and
  # stops in one line if not; both run every step's calls on replicated state.
  workdir = tmp_path / "run"
  procs = start_processes(["train", "--config", "configs/tiny.py", "--workdir", str(workdir),
                           "--config.train.max_steps=3", *AHEAD], devices=1, logdir=tmp_path)
  assert wait_all(procs, timeout=600) == [0, 0], (tmp_path / "p0.err").read_text()[-3000:]
  two = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  one = metrics.read_jsonl(whole[0] / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in two] == [1, 2, 3]
  assert [r["rollout/train/staleness_max"] for r in two] == [0, 1, 1]
  # The same batches in the same order as one process, drawn alike: one
  # device's run of the same steps gives the same rewards where the float32
  # rounding of the two-device update has not yet moved a sampled token
  # (tests/test_distributed.py compares the first two steps likewise).
  for key in ("rewards/train/prompt_code", "rewards/train/vowel_share"):
    assert [r[key] for r in two[:2]] == [r[key] for r in one[:2]], key
  assert [r["rewards/train/prompt_code"] for r in two] == [r["rewards/train/prompt_code"] for r in one]


@pytest.mark.slow
def test_a_rollout_group_of_its_own_runs_one_step_off_resumes_and_evaluates_each_update(tmp_path,
                                                                                     whole):
  # 8 simulated devices: the rollout on the first 4, the update and the
  # reference on the other 4. Each step's batch was finished on the rollout's
  # group while the previous update ran (the head start, run_ahead.py).
  workdir = tmp_path / "split"
  split = ["train", "--config", "configs/tiny.py", "--workdir", str(workdir), *AHEAD,
           "--config.mesh.rollout_devices=4", "--config.eval.every_steps=3"]
  proc = run_cli([*split, "--config.train.max_steps=2"], devices=8)
  assert ("the rollout on 4, mesh {'fsdp': 4, 'tp': 1}; the update and reference on 4,"
          " mesh {'fsdp': 4, 'tp': 1}") in proc.stderr
  assert "Resuming from step 2" in run_cli([*split, "--config.train.max_steps=3"], devices=8).stderr
  rows = [r for r in metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
          if "rewards/train/sum" in r]
  one = metrics.read_jsonl(whole[0] / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  # Step 2 trains a batch drawn whole before update 1. Step 3, the first
  # after the resume, samples its batch from the restored policy, which the
  # engine's copy must hold too: its tokens are the policy it updates (ratio 1).
  assert [r["rollout/train/staleness_mean"] for r in rows] == [0, 1, 0]
  assert [r["rollout/train/head_start_seconds"] > 0 for r in rows] == [False, True, False]
  assert rows[2]["actor/train/ratio/min"] == pytest.approx(1.0, abs=1e-5)
  assert rows[2]["actor/train/ratio/max"] == pytest.approx(1.0, abs=1e-5)
  assert rows[1]["actor/train/ratio/max"] - rows[1]["actor/train/ratio/min"] > 1e-3
  # The batches of one process on one mesh, in its order; step 1's samples
  # are drawn alike (one policy, sampled before any update).
  assert [r["rewards/train/prompt_code"] for r in rows] == [r["rewards/train/prompt_code"] for r in one]
  assert rows[0]["rewards/train/vowel_share"] == one[0]["rewards/train/vowel_share"]
  # The eval after the last update ran on the rollout's group, between the
  # update and the sync: it must see that update's adapters. The eval
  # command, on one device from the checkpoint, writes the same completions.
  own = [json.loads(line) for line in
         (workdir / "eval" / "step_000003" / scoring.SAMPLES_FILE).read_text().splitlines()]
  heldout = tmp_path / "heldout.jsonl"
  heldout.write_text("".join(
      json.dumps({"question": s["question"], "answer": f"#### {s['gold']}"}) + "\n" for s in own))
  out = tmp_path / "cli"
  run_cli(["eval", "--workdir", str(workdir), "--data", str(heldout), "--num-test", str(len(own)),
           "--batch-size", str(len(own)), "--max-new-tokens", "16", "--out", str(out)])
  cli = [json.loads(line) for line in (out / scoring.SAMPLES_FILE).read_text().splitlines()]
  assert [s["completion"] for s in cli] == [s["completion"] for s in own]
  start = [json.loads(line)["completion"] for line in
           (workdir / "eval" / "step_000000" / scoring.SAMPLES_FILE).read_text().splitlines()]
  assert start != [s["completion"] for s in own]  # the updates changed what it writes
