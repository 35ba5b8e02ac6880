"""Rollouts that run ahead of the update by up to rollout.max_staleness = k steps.

Lockstep GRPO samples step s's batch, waits for its longest completion, then
updates. Here the engine's slots carry unfinished samples from one step's
decode call to the next (rl/engine/carry_over.py), so no slot idles while a
long completion finishes: step s's call admits batch s + k (read ahead from
the data) and must finish every sample of batch s, which step s then trains
on. So:

- the data order is lockstep's: step s trains on batch s, whatever k, and a
  resumed run trains on the batches the uninterrupted one would have (the
  samples in flight at a checkpoint are dropped; their batches are sampled
  again after the resume, from the restored policy, with the same keys);
- a sample of batch s was admitted under the policy of step s - k (after
  s - k updates) and may draw its later tokens under newer adapters; the
  sampler's log-probs of every token are kept, and the loss divides by them
  (the behaviour policy: PPO's ratio, or TIS's weight with grpo.tis_cap);
  no token is ever more than k updates old, and the step checks it;
- batch j is sampled with lockstep step j's key;
- with a device group of its own (mesh.rollout_devices; the engine decodes
  a copy of the policy there), step s hands its batch, already finished, to
  the update, and the rollout's call for step s + 1 (admit batch s + k,
  finish batch s + 1) runs on the engine's worker thread under step s's
  adapters while the other group updates (the head start). Each step then
  waits only for whichever group is slower. What a head start draws depends
  only on those adapters, not on how the groups' times compare: the sync
  before step s + 1 waits for it to end. With k = 1 every token of batch
  s + 1 comes from step s's policy: verl's one-step-off schedule;
- in a run of several processes, every process holds the same samples in
  flight: each runs the same calls on replicated state, and each step checks
  that their views agree (a digest of ids, policy versions and tokens)
  before it trains, so a divergence stops the run in one line.

Metrics (rollout/*): staleness of the batch's tokens (mean, max; in
updates), the share of tokens drawn after their sample's first call (under
newer adapters), the samples left in flight, occupancy as in lockstep, and
the seconds of the head start that ran beside the previous update.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from typing import Hashable, Iterable, Iterator

import jax
import numpy as np
from tunix.rl.rollout import base_rollout

from gemma_grpo.rl.engine import carry_over
from gemma_grpo.rl.engine import rollout as rollout_lib
from gemma_grpo.runtime import distributed


class Lookahead(Iterator):
  """Batches, with `peek` at the ones after the next: the trainer reads batch
  s from this iterator while its rollout already admits batch s + k."""

  def __init__(self, batches: Iterable):
    self._batches = iter(batches)
    self._read: collections.deque = collections.deque()

  def __next__(self):
    return self._read.popleft() if self._read else next(self._batches)

  def peek(self, n: int):
    """The n-th batch after the one last taken (0: the next), or None past the end."""
    while len(self._read) <= n:
      try:
        self._read.append(next(self._batches))
      except StopIteration:
        return None
    return self._read[n]


@dataclasses.dataclass
class _Batch:
  """A batch in flight: its samples, and which policy drew which of their tokens."""

  prompts: list[str]
  version: int  # updates done when it was admitted
  padded_BxP: np.ndarray
  finished: dict[int, carry_over.Finished] = dataclasses.field(default_factory=dict)
  # Per sample: (version, first completion slot) of each call it was decoded in.
  segments: dict[int, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepRollout:
  """What a step's calls produced for its own batch."""

  out: base_rollout.RolloutOutput  # the batch's completions, in row order
  seconds: float  # the step's decode calls, all batches
  stats: list[rollout_lib.DecodeStats]
  metrics: dict  # {name: (value, reduce)}


class RunAhead:
  """Each step's rollout, k batches ahead; see the module docstring."""

  def __init__(self, engine: rollout_lib.GroupedRollout, lookahead: Lookahead, *,
               max_staleness: int, num_generations: int, rollout_key,
               last_step: int | None = None, head_start: bool | None = None):
    """`last_step`: batches after it are never trained (no head start for
    them); `head_start`: whether each step's head start runs, on the engine's
    worker thread (None: where the engine holds weights of its own)."""
    if max_staleness < 1:
      raise ValueError(f"max_staleness={max_staleness}: running ahead needs >= 1")
    self._engine = engine
    self._head_start = engine.holds_own_weights if head_start is None else head_start
    if self._head_start and not engine.holds_own_weights:
      # On the trainer's own module the update would donate the arrays it decodes with.
      raise ValueError("a head start needs an engine with weights of its own (mesh.rollout_devices)")
    self._last_step = last_step
    self._ahead: list = []  # (seconds, stats) of the head start that ran beside the last update
    self._carry = carry_over.CarryOver(engine, engine.slots)
    self._lookahead = lookahead
    self._k = max_staleness
    self._g = num_generations
    self._key = rollout_key
    self._batches: dict[int, _Batch] = {}
    self._next = 0  # the next batch to admit

  def _call(self, j: int, prompts: list[str], rollout_config, version: int, *, due: int,
            admit: bool = True) -> carry_over.Decoded:
    """Admits batch j (unless not `admit`), finishing every sample of batches <= due."""
    config = dataclasses.replace(
        rollout_config, return_logprobs=True,
        # Lockstep's key for step j's first call, first round (learner.py).
        seed=jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(self._key, j), 0), 0))
    ids: list[Hashable] = [(j, i) for i in range(len(prompts))]
    carried_in = self._carry.entering()
    decoded = self._carry.decode(prompts, ids, config, must_finish=lambda i: i[0] <= due,
                                 admit=admit)
    if admit:
      self._batches[j] = _Batch(prompts, version, decoded.padded_BxP,
                                segments={i: [(version, 0)] for i in range(len(prompts))})
    for (b, i), start in carried_in.items():
      self._batches[b].segments[i].append((version, start))
    for (b, i), done in decoded.finished.items():
      self._batches[b].finished[i] = done
    return decoded

  def rollout(self, step: int, prompts: list[str], rollout_config, version: int) -> StepRollout:
    """Batch `step`'s completions (its rows `prompts`: each problem's G copies).

    `version`: the updates done so far. A step whose batch is not in flight
    (the first, or the first after a resume) admits it and the k after it
    (k - 1 with a head start, whose call admits the k-th).
    """
    self._engine.background.settle()  # the head start (already settled by the sync)
    start = time.perf_counter()
    stats = []
    ahead_seconds = 0.0
    if self._ahead:
      ahead_seconds, ahead_stats = self._ahead.pop()
      stats.append(ahead_stats)
    if step not in self._batches:  # nothing read ahead yet: start the pipeline here
      self._carry.drop()
      self._batches.clear()
      self._ahead.clear()
      self._next = step
    elif self._batches[step].prompts != prompts:
      raise RuntimeError(
          f"rollout.max_staleness: step {step}'s batch is not the one read ahead for it;"
          " the trainer read its data out of order: set --config.rollout.max_staleness=0")
    # With a head start, batch step + k is admitted by the head start after this call.
    while self._next <= step + self._k - int(self._head_start):
      j = self._next
      batch = prompts if j == step else self._peek(j - step - 1)
      if batch is None:
        break  # the data ends: nothing more to admit
      stats.append(self._call(j, batch, rollout_config, version, due=j - self._k).stats)
      self._next += 1
    if len(self._batches[step].finished) < len(prompts):
      # No batch to admit (the data ended): finish this one without admitting any.
      stats.append(self._call(step, prompts, rollout_config, version, due=step,
                              admit=False).stats)
    if distributed.process_count() > 1:  # one process has no other view to compare
      distributed.check_same(
          f"step {step + 1}: the set of samples in flight (rollout.max_staleness)",
          self.in_flight(), "set --config.rollout.max_staleness=0 and report it")
    batch = self._batches.pop(step)
    assert len(batch.finished) == len(prompts), (step, len(batch.finished))
    metrics = self._metrics(batch, version)
    seconds = time.perf_counter() - start
    if self._head_start:
      metrics["rollout/head_start_seconds"] = (ahead_seconds, np.mean)
      self._start_head_start(step, rollout_config, version)
    return StepRollout(self._output(batch), seconds + ahead_seconds, stats, metrics)

  def _start_head_start(self, step: int, rollout_config, version: int) -> None:
    """Step s + 1's call, started on the engine's worker under `version`'s
    adapters: admits batch step + k (if the data has one) and finishes
    batch step + 1."""
    due = step + 1
    if self._last_step is not None and due >= self._last_step:
      return  # never trained
    j = self._next
    # Read here, on the trainer's data thread, not on the worker.
    batch = self._peek(j - step - 1)
    admit = batch is not None
    if admit:
      self._next += 1
    elif due in self._batches:  # the data ended: finish what is in flight
      j, batch = due, self._batches[due].prompts
    else:
      return

    def head_start():
      begin = time.perf_counter()
      decoded = self._call(j, batch, rollout_config, version, due=due, admit=admit)
      self._ahead.append((time.perf_counter() - begin, decoded.stats))

    self._engine.background.start(head_start)

  def in_flight(self) -> str:
    """The samples in flight, as text: which batches, drawn by which policies,
    which samples ended (a digest of their tokens and log-probs) and which
    sit in which slot. Every process of a run must hold the same."""
    lines = [f"next batch {self._next}; slots {self._carry.entering()}"]
    for j, batch in sorted(self._batches.items()):
      ended = hashlib.sha256()
      for i, done in sorted(batch.finished.items()):
        ended.update(f"{i}:".encode() + done.tokens.tobytes() + done.logps.tobytes())
      lines.append(f"batch {j} from version {batch.version}: segments {sorted(batch.segments.items())},"
                   f" ended {sorted(batch.finished)} {ended.hexdigest()[:16]}")
    return "\n".join(lines)

  def _peek(self, n: int) -> list[str] | None:
    """The prompts of the n-th batch after the trainer's, each repeated G times as Tunix does."""
    batch = self._lookahead.peek(n)
    if batch is None:
      return None
    return [p for p in np.asarray(batch["prompts"]).tolist() for _ in range(self._g)]

  def _output(self, batch: _Batch) -> base_rollout.RolloutOutput:
    rows = [batch.finished[i] for i in range(len(batch.prompts))]
    return base_rollout.RolloutOutput(
        text=[r.text for r in rows], logits=None, tokens=[r.tokens for r in rows],
        left_padded_prompt_tokens=batch.padded_BxP, logprobs=[r.logps for r in rows])

  def _metrics(self, batch: _Batch, version: int) -> dict:
    staleness = []  # per token: updates between the policy that drew it and this update
    for i, row in batch.finished.items():
      segments = batch.segments[i]
      for (drawn_by, first), nxt in zip(segments, [*segments[1:], (None, len(row.tokens))]):
        staleness += [version - drawn_by] * max(min(nxt[1], len(row.tokens)) - first, 0)
    staleness = np.asarray(staleness or [version - batch.version])
    if version - batch.version > self._k or staleness.max() > self._k:
      raise AssertionError(f"a sample {version - batch.version} updates old; the bound is {self._k}")
    return {
        "rollout/staleness_mean": (staleness.mean(), np.mean),
        "rollout/staleness_max": (staleness.max(), np.max),
        "rollout/newer_policy_token_frac": (
            (staleness < version - batch.version).mean(), np.mean),
        "rollout/in_flight": (len(self._carry.carried), np.mean),
    }
