"""Continuous batching whose slots outlive a call (rollout.max_staleness > 0).

With rollout.slots alone, a call decodes until its last sample ends: at the
end fewer samples than slots remain and the other slots idle (the drain).
Here a call stops as soon as a slot would idle and leaves its unfinished
samples in the slots, caches and all; the next call, after the update,
decodes them on under the new adapters beside its own new samples
(continuous.decode_slots with `carried`). The caller names the samples a
call must finish (their staleness bound is due): those are decoded to their
end before the call returns.

Nothing recompiles between calls: the prefill merges the current adapters
into the decode weights, which the loop takes as arguments, and a carrying
call's shapes do not change from one call to the next.

A sample is named by the caller's `ids` (any hashable); it keeps the key of
the call that admitted it (sampling.sample_keys), so its tokens do not depend
on the calls it spanned or the slots it ran in, only on the weights of each
call.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Hashable, Sequence

import jax
from jax import sharding
import numpy as np
from tunix.rl.rollout import base_rollout

from gemma_grpo.rl.engine import continuous
from gemma_grpo.rl.engine import rollout as rollout_lib


@dataclasses.dataclass(frozen=True)
class Finished:
  """A sample that ended during a call."""

  tokens: np.ndarray  # its completion, cut where it ended (GroupedRollout.finish_rows)
  logps: np.ndarray  # the sampler's log-probs of them
  text: str
  # Completion slots [start, len(tokens)) were drawn in this call; earlier
  # ones in earlier calls (or the prefill, slot 0, in the call that admitted it).
  start: int


@dataclasses.dataclass(frozen=True)
class Decoded:
  """What one carrying call did."""

  finished: dict[Hashable, Finished]
  carried: tuple[Hashable, ...]  # samples left unfinished in the slots, in slot order
  stats: rollout_lib.DecodeStats  # kept_B: per sample touched, decode steps it kept this call
  padded_BxP: np.ndarray  # the call's prompts, left-padded


class CarryOver:
  """An engine's slots, carried from one `decode` call to the next."""

  def __init__(self, engine: rollout_lib.GroupedRollout, slots: int):
    if slots < 1:
      raise ValueError(f"slots={slots}: carrying needs >= 1 slot (rollout.slots)")
    self._engine = engine
    self._slots = slots
    self._state: continuous.SlotState | None = None
    self._ids: list[Hashable | None] = [None] * slots
    self._t_S = np.zeros(slots, np.int64)  # each carried sample's next completion slot
    self._rows_per_prompt: int | None = None  # the first call's; the prompt slots' lanes

  def _placed(self, state: continuous.SlotState) -> continuous.SlotState:
    """`state` replicated on the engine's mesh: the empty state and a call's
    output then key the loop's compiled program alike (one compile)."""
    if self._engine.mesh is None:
      return state
    return jax.device_put(state, sharding.NamedSharding(self._engine.mesh, sharding.PartitionSpec()))

  @property
  def carried(self) -> tuple[Hashable, ...]:
    return tuple(i for i in self._ids if i is not None)

  def entering(self) -> dict[Hashable, int]:
    """Each carried sample's next completion slot, where the next call's tokens for it start."""
    return {i: int(t) for i, t in zip(self._ids, self._t_S) if i is not None}

  def drop(self) -> None:
    """Forgets the carried samples (a resumed run starts without them)."""
    self._state = None
    self._ids = [None] * self._slots
    self._t_S[:] = 0

  def decode(self, prompts: Sequence[str], ids: Sequence[Hashable],
             rollout_config: base_rollout.RolloutConfig, *,
             must_finish: Callable[[Hashable], bool], admit: bool = True) -> Decoded:
    """Admits `prompts` (sample ids `ids`; none if not `admit`) and decodes
    until a slot idles and every sample that `must_finish` names, carried or
    admitted now, has ended.

    `prompts` are equal-length runs (groups), as generate()'s; every call
    must have as many, with the group size, prompt width and sampling rule
    of the first (the group size is the first call's even where a later
    call's runs are longer: two groups of one problem in a row).
    """
    engine = self._engine
    if len(ids) != len(prompts):
      raise ValueError(f"{len(ids)} ids for {len(prompts)} prompts")
    call = engine.prepare(list(prompts), rollout_config, rows_per_prompt=self._rows_per_prompt)
    if self._rows_per_prompt not in (None, call.rows_per_prompt):
      raise RuntimeError(f"a carrying call's prompts are not in runs of {self._rows_per_prompt},"
                         " the first call's group size: every call needs one group size")
    self._rows_per_prompt = call.rows_per_prompt
    fn, args, kwargs = engine.prefill_call(
        call.prompt_ids_UxP, call.rng, rows_per_prompt=call.rows_per_prompt,
        sampling=call.sampling, screen_width=call.screen_width, slots=self._slots)
    prefilled = fn(*args, **kwargs)
    new_tokens = rollout_config.max_tokens_to_generate
    if self._state is None:
      self._state = self._placed(continuous.empty_slots(
          prefilled[5], slots=self._slots, rows_per_prompt=call.rows_per_prompt,
          new_tokens=new_tokens, with_logps=call.with_logps))
    elif self._state.valid_QxP.shape[1] != call.padded_BxP.shape[1]:
      raise RuntimeError(
          f"a carrying call's prompts are {call.padded_BxP.shape[1]} tokens wide, the carried"
          f" samples' {self._state.valid_QxP.shape[1]}: every call needs one prompt width")
    finish_S = np.array([i is not None and bool(must_finish(i)) for i in self._ids])
    fn, args, kwargs = engine.decode_call(
        prefilled, call.stop_ids, call.rng, new_tokens=new_tokens, sampling=call.sampling,
        with_logps=call.with_logps, screen_width=call.screen_width, slots=self._slots,
        rows_per_prompt=call.rows_per_prompt)
    admit_N = np.full(len(prompts), admit)
    finish_new_N = np.array([admit and bool(must_finish(i)) for i in ids])
    out = fn(*args, self._state, finish_S, admit_N, finish_new_N, **kwargs)
    tokens_NxT, logps_NxT, full_heads, steps, refills, sample_S, self._state = out
    self._state = self._placed(self._state)
    tokens_NxT, logps_NxT, full_heads, steps, refills, sample_S = jax.device_get(
        (tokens_NxT, logps_NxT, full_heads, steps, refills, sample_S))
    t_S = np.asarray(jax.device_get(self._state.t_S))
    engine.full_head_steps = int(full_heads)
    names = [*self._ids, *ids]  # the call's sample index space: carried slots, then new
    start_N = np.concatenate([self._t_S, np.zeros(len(ids), np.int64)])
    # A new sample's token 0 came from this call's prefill (not a decode step).
    in_slot = {int(n): s for s, n in enumerate(sample_S) if n < len(names)}
    ended = [n for n in range(len(names)) if names[n] is not None and n not in in_slot
             and (n < self._slots or admit)]
    completions, logps, kept, texts = engine.finish_rows(tokens_NxT[ended], logps_NxT[ended],
                                                         call.stop_ids)
    finished = {}
    kept_B = []
    for n, tokens, row_logps, used, text in zip(ended, completions, logps, kept, texts):
      before = max(int(start_N[n]) - 1, 0)
      finished[names[n]] = Finished(tokens, row_logps, text, start=int(start_N[n]))
      kept_B.append(used - before)
    for n, s in in_slot.items():
      kept_B.append(int(t_S[s]) - 1 - max(int(start_N[n]) - 1, 0))
    self._ids = [names[int(n)] if n < len(names) else None for n in sample_S]
    self._t_S = np.where([i is not None for i in self._ids], t_S, 0)
    return Decoded(finished, self.carried,
                   rollout_lib.DecodeStats(steps=int(steps), slots=self._slots,
                                           kept_B=tuple(kept_B), refills=int(refills)),
                   call.padded_BxP)
