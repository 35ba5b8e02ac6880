"""The GRPO rollout engine: each prompt prefilled once, decoding on merged weights.

Tunix's vanilla sampler prefills every row of a batch, although GRPO's R rows
of a group share one prompt, and on XLA:CPU its decode step spends more time
moving memory than computing: the attention einsums' weights are re-laid out
at every token (XLA assigns layouts after hoisting loop invariants) and the
KV cache, laid out [B, S, K, H], is copied around the attention dots.

This engine (a Tunix `BaseRollout`, plugged into the RLCluster as its rollout
engine) instead
- prefills each distinct prompt once with the LoRA policy itself and keeps
  that prompt's keys and values once: while decoding, the R rows of a group
  attend to them together, in one dot whose rows are all their query heads,
  and only the completions' keys and values are held per row;
- before decoding, merges the adapters into one copy of the projection
  weights, laid out for the decode dots, with caches laid out as XLA:CPU's
  attention dots read them fastest (decode_layers.py, decode_dots.py).

`decode_dtype="bfloat16"` (rollout.decode_dtype) holds that copy and a copy
of the LM head (the tied embedding, a decode step's largest read) in
bfloat16 for the decode loop: each dot reads half the bytes and, on CPUs with
AVX512_BF16, runs as a bfloat16 dot accumulated in float32. Prefill, the
trainer and the reference pass stay in the model's own dtype, so the samples
come from a policy that differs from the trained one by bfloat16 rounding;
`return_logprobs` gives the decode loop's own log-probabilities of the drawn
tokens: the learner divides by them in the importance ratio (the sampler is
the behaviour policy); BENCHMARKS.md, "Decode in bfloat16", measures the difference.

A float32 head may instead be screened (rollout.screen_lm_head,
lm_head_screen.py): a bfloat16 copy ranks the vocabulary and the float32
top-k is proved among a few hundred rescored candidates.

The decode loop is lockstep.py's, or with rollout.slots continuous.py's.
Tokens are chosen as Tunix's sampler chooses them (sampling.py). Completions
stop at the first stop token (excluded from the returned tokens), right
after `stop_text` (rollout.stop_text, kept; stop_text.py), or at
`max_tokens_to_generate`.

With tools (`tool_runner`), completions are multi-turn: the decode loop
pauses where a row may have closed a tool call, the host runs it, and the
result's tokens are fed into the row's next slots (multi_turn.py). Without
tools the loop is traced exactly as the one-turn loop.

Shapes: B rows, U distinct prompts of R rows each, P prompt width, T new
tokens, S = P + T, L layers, K key/value heads, H head width, D model
width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import tokenizer_adapter
from tunix.rl import common
from tunix.rl.rollout import base_rollout

from gemma_grpo import config as config_lib
from gemma_grpo.model import gemma3_rl
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.rl.engine import background as background_lib
from gemma_grpo.rl.engine import continuous
from gemma_grpo.rl.engine import decode_layers
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.rl.engine import lockstep
from gemma_grpo.rl.engine import multi_turn
from gemma_grpo.rl.engine import placement
from gemma_grpo.rl.engine import sampling as sampling_lib
from gemma_grpo.rl.engine import stop_text as stop_text_lib
from gemma_grpo.runtime import distributed
from gemma_grpo.tasks import tools as tools_lib

# The dtypes that config.DECODE_DTYPES names (bench/studies/decode_precision.py reads this too).
DECODE_DTYPES = {name: getattr(jnp, name) for name in config_lib.DECODE_DTYPES}


@functools.partial(jax.jit, static_argnames=("lora_scale", "rows_per_prompt", "pad_id",
                                             "sampling", "decode_dtype", "screened",
                                             "per_sample_keys"))
def _prefill(graphdef, state, prompt_ids_UxP, rng, *, lora_scale, rows_per_prompt, pad_id,
             sampling, decode_dtype, screened, per_sample_keys=False):
  """Distinct prompts through the policy once; first tokens and their log-probs; decode inputs.

  Its cache holds only the prompt's slots, so one program serves every
  completion length. With `per_sample_keys` (continuous batching) row b's
  first token is drawn with fold_in(sample_keys(rng)[b], 0), as
  continuous.decode_slots draws its later ones.
  """
  model = nnx.merge(graphdef, state)
  num_prompts, prompt_width = prompt_ids_UxP.shape
  cfg = model.config
  cache = model.empty_cache(num_prompts, prompt_width)
  positions_UxP, mask_UxPxP = gemma3_rl.positions_and_mask(prompt_ids_UxP, pad_id)
  logits_Ux1xV, cache = model(prompt_ids_UxP, positions_UxP, cache, mask_UxPxP,
                              decode_only_last_token=True)
  # The prompt's keys and values stay one per prompt (decode_layers.decode_layer).
  prompt_cache = (
      jnp.stack([cache[f"layer_{i}"]["k"].transpose(0, 2, 3, 1) for i in range(cfg.num_layers)]),
      jnp.stack([cache[f"layer_{i}"]["v"].transpose(0, 2, 1, 3) for i in range(cfg.num_layers)]))
  repeat = functools.partial(jnp.repeat, repeats=rows_per_prompt, axis=0)
  logits_BxV = repeat(logits_Ux1xV[:, 0])
  if per_sample_keys:
    keys_B = sampling_lib.sample_keys(rng, logits_BxV.shape[0])
    first_B = sampling_lib.sample_rows(
        logits_BxV, jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_B, 0), sampling)
  else:
    first_B = sampling_lib.sample_tokens(logits_BxV, jax.random.fold_in(rng, 0), sampling)
  dtype = DECODE_DTYPES[decode_dtype]
  # The float32 head is the model's own array: pass it through, do not copy it.
  embedding_VxD = model.embedder.input_embedding.get_value()
  head_VxD = None if dtype == jnp.float32 else embedding_VxD.astype(dtype)
  screen = None
  if screened:  # the LM head's bfloat16 copy and the largest row norm (lm_head_screen)
    screen = (embedding_VxD.astype(jnp.bfloat16),
              jnp.max(jnp.linalg.norm(embedding_VxD.astype(jnp.float32), axis=-1)))
  return (decode_layers.decode_weights(model, lora_scale, dtype), head_VxD, screen, first_B,
          sampling_lib.token_logps(logits_BxV, first_B, sampling), prompt_cache,
          repeat(positions_UxP[:, -1]) + 1, prompt_ids_UxP != pad_id)


@dataclasses.dataclass(frozen=True)
class DecodeStats:
  """What one generate()'s decode loop did, for `rollout/occupancy`."""

  steps: int  # decode steps run (the prefill's first tokens are not decode steps)
  slots: int  # rows each step decoded: every completion in lockstep, rollout.slots otherwise
  # Per completion, in order: the decode steps whose token it kept, or the stop
  # token that ended it; the other slot-steps decoded a row that had already
  # ended, or an idle slot.
  kept_B: tuple[int, ...]
  refills: int  # times a slot took a new sample after its last one ended

  @property
  def kept(self) -> int:
    return sum(self.kept_B)


class Call(NamedTuple):
  """A generate() call's prompts, key and sampling rule, prepared (GroupedRollout.prepare)."""

  padded_BxP: np.ndarray  # every row's prompt, left-padded
  prompt_ids_UxP: jax.Array  # the distinct prompts
  rows_per_prompt: int
  rng: jax.Array
  stop_ids: jax.Array
  sampling: sampling_lib.Sampling
  with_logps: bool
  screen_width: int


def group_rows(prompts: Sequence[str], size: int | None = None) -> tuple[list[int], int]:
  """(index of each run's first row, run length) if `prompts` is equal-length
  runs (of `size` rows, if given), else (every row, 1)."""
  starts = [i for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1]]
  if size is not None:
    starts = list(range(0, len(prompts), size))
  size = len(prompts) // len(starts)
  equal_runs = size * len(starts) == len(prompts) and all(
      prompts[s:s + size] == [prompts[s]] * size for s in starts)
  if equal_runs:
    return starts, size
  return list(range(len(prompts))), 1


class GroupedRollout(base_rollout.BaseRollout):
  """Rollouts for the RLCluster; see the module docstring."""

  def __init__(self, rollout_actor, tokenizer, mesh=None, rollout_config=None, *,
               lora_scale: float, decode_dtype: str = "float32", screen_lm_head: str = "auto",
               tool_runner: tools_lib.ToolRunner | None = None, max_tool_calls: int = 0,
               slots: int = 0, stop_text: str = ""):
    """An engine decoding with `rollout_actor`'s live weights.

    Args:
      rollout_actor: the policy, a gemma3_rl.Gemma3 (LoRA applied or not): the
        trainer's own module, so every rollout samples the current weights.
      tokenizer: the checkpoint's tokenizer, or Tunix's TokenizerAdapter of it.
      mesh: the engine's mesh: the policy's, or a device group of its own
        (mesh.rollout_devices), where it then decodes a copy of the policy
        (placement.py) and `background` may run its work beside the update.
      rollout_config: unused (Tunix's signature); each generate() call brings its own.
      lora_scale: alpha / r, the factor of the adapters merged before decoding.
      decode_dtype: rollout.decode_dtype, one of config.DECODE_DTYPES: the
        precision of the decode loop's merged weights and LM head.
      screen_lm_head: rollout.screen_lm_head, one of config.SCREEN_SETTINGS
        (lm_head_screen.py); only a float32 head is screened.
      tool_runner: the tools completions may call (multi_turn.py), or None.
      max_tool_calls: calls per completion; 0 turns the tools off.
        `take_tool_turns` then says what the calls of a rollout did.
      slots: rollout.slots: 0 decodes every completion of a call together
        until the longest ends (lockstep); N > 0 keeps N rows busy, each
        taking the next pending completion when its own ends (continuous
        batching, continuous.py), with at most as many rows as completions.
      stop_text: rollout.stop_text: a completion also ends right after it
        (stop_text.py); "" = at stop tokens only.

    Raises:
      TypeError: `rollout_actor` is not a gemma3_rl.Gemma3.
      ValueError: an unknown `decode_dtype` or `screen_lm_head`, slots < 0,
        or slots with tools.
    """
    del rollout_config  # each generate() call brings its own
    if not isinstance(rollout_actor, gemma3_rl.Gemma3):
      # Converting would make a second module that the trainer never updates.
      raise TypeError(
          f"GroupedRollout needs a gemma_grpo.model.gemma3_rl.Gemma3, got {type(rollout_actor)}")
    self.holds_own_weights = mesh is not None and not placement.lives_on(rollout_actor, mesh)
    self._model = placement.copy_to(rollout_actor, mesh) if self.holds_own_weights else rollout_actor
    self.background = background_lib.Worker()
    if not isinstance(tokenizer, tokenizer_adapter.TokenizerAdapter):
      tokenizer = tokenizer_adapter.TokenizerAdapter(tokenizer)
    self._tokenizer = tokenizer
    self.mesh = mesh
    self._lora_scale = float(lora_scale)
    if decode_dtype not in config_lib.DECODE_DTYPES:
      raise ValueError(f"decode_dtype={decode_dtype!r}: must be one of"
                       f" {', '.join(config_lib.DECODE_DTYPES)}")
    self._decode_dtype = decode_dtype
    if screen_lm_head not in config_lib.SCREEN_SETTINGS:
      raise ValueError(f"screen_lm_head={screen_lm_head!r}: must be one of"
                       f" {', '.join(config_lib.SCREEN_SETTINGS)}")
    # Only a float32 head is screened: a bfloat16 one is already as cheap.
    self._screen = decode_dtype == "float32" and (
        screen_lm_head == "on" or (screen_lm_head == "auto" and lm_head_screen.screen_pays_off()))
    self.full_head_steps = 0  # of the last generate(): decode steps the screen did not prove
    self._shapes = tuple(decode_layers.layer_shape(layer) for layer in rollout_actor.layers)
    self._tool_runner = tool_runner if max_tool_calls > 0 else None
    self._max_tool_calls = max_tool_calls
    self._call_ends = None  # multi_turn.CallEnds on device, built at the first tool rollout
    self._tool_turns: list[multi_turn.RowTurns] = []
    if slots < 0:
      raise ValueError(f"slots={slots}: must be >= 0 (0 = lockstep decoding)")
    if slots and self._tool_runner is not None:
      # A tool pause stops the whole loop; slots would have to pause per sample.
      raise ValueError("continuous batching (slots > 0) does not run tool calls yet")
    self._slots = slots
    self._decode_stats: list[DecodeStats] = []
    self._stop_text = stop_text
    self._next_state = None  # (host table, device table), built at the first generate()

  def stop_text_table(self):
    """(next_state_SxV on the host, on the device) for the stop text, or (None, None)."""
    if not self._stop_text:
      return None, None
    if self._next_state is None:
      vocab = self._model.embedder.input_embedding.get_value().shape[0]
      table = stop_text_lib.transition_table(
          stop_text_lib.token_texts(self._tokenizer, vocab), self._stop_text)
      self._next_state = (table, jnp.asarray(table))
    return self._next_state

  def tokenize(self, prompt: str) -> np.ndarray:
    """The ids Tunix's sampler feeds for `prompt` (<bos> once)."""
    ids = self._tokenizer.encode(prompt)
    bos = [self._tokenizer.bos_id()] if self._tokenizer.bos_id() else []
    return np.array(self._tokenizer.dedup_bos_ids(bos + ids), dtype=np.int32)

  def generate(self, prompts: list[str], rollout_config: base_rollout.RolloutConfig,
               **kwargs) -> base_rollout.RolloutOutput:
    del kwargs
    self.background.settle()
    call = self.prepare(prompts, rollout_config)
    slots = min(self._slots, len(prompts))
    fn, args, kwargs = self.prefill_call(call.prompt_ids_UxP, call.rng,
                                         rows_per_prompt=call.rows_per_prompt,
                                         sampling=call.sampling,
                                         screen_width=call.screen_width, slots=slots)
    fn, args, kwargs = self.decode_call(
        fn(*args, **kwargs), call.stop_ids, call.rng,
        new_tokens=rollout_config.max_tokens_to_generate, sampling=call.sampling,
        with_logps=call.with_logps, screen_width=call.screen_width, slots=slots,
        rows_per_prompt=call.rows_per_prompt)
    turns = None
    steps = refills = None
    if slots:
      tokens_BxT, logps_BxT, full_heads, steps, refills = jax.device_get(fn(*args, **kwargs))
    elif self._tool_runner is None:
      tokens_BxT, logps_BxT, full_heads = jax.device_get(fn(*args, **kwargs))
    else:
      turns, (tokens_BxT, logps_BxT, full_heads) = self._decode_with_tools(args, kwargs)
    del fn, args, kwargs
    self.full_head_steps = int(full_heads)
    completions, logprobs_out, kept_B, texts = self.finish_rows(tokens_BxT, logps_BxT,
                                                                call.stop_ids)
    if steps is None:
      # Lockstep decodes every row until the last one's stop (or the limit).
      steps = max(kept_B)
    self._decode_stats.append(DecodeStats(steps=int(steps), slots=slots or len(prompts),
                                          kept_B=tuple(kept_B), refills=int(refills or 0)))
    if turns is not None:
      self._tool_turns.extend(turns.rows([len(c) for c in completions]))
    return base_rollout.RolloutOutput(
        text=texts,
        logits=None,
        tokens=completions,
        left_padded_prompt_tokens=call.padded_BxP,
        logprobs=logprobs_out if call.with_logps else None,
    )

  def prepare(self, prompts: list[str], rollout_config: base_rollout.RolloutConfig,
              rows_per_prompt: int | None = None) -> Call:
    """What a generate() call of `prompts` decodes from (its Call): its
    prompts in runs of `rows_per_prompt` rows if they are, else as found."""
    rows = [self.tokenize(p) for p in prompts]
    prompt_width = rollout_config.max_prompt_length
    longest = max(len(r) for r in rows)
    if prompt_width is None or prompt_width < longest:
      prompt_width = 1 << (longest - 1).bit_length()  # as Tunix's sampler does
    padded_BxP = tokenizer_lib.left_pad(rows, self.pad_id(), prompt_width)
    starts, rows_per_prompt = group_rows(prompts, rows_per_prompt)
    rng = rollout_config.seed  # as Tunix's sampler: a key, an int seed, or None (0)
    if rng is None:
      rng = jax.random.PRNGKey(0)
    elif isinstance(rng, int):
      rng = jax.random.PRNGKey(rng)
    stop_ids = jnp.asarray(list(rollout_config.eos_tokens or [self.eos_id()]), jnp.int32)
    sampling, with_logps, screen_width = self.settings(rollout_config,
                                                       rollout_config.return_logprobs)
    return Call(padded_BxP, jnp.asarray(padded_BxP[starts]), rows_per_prompt, rng, stop_ids,
                sampling, with_logps, screen_width)

  def finish_rows(self, tokens_BxT, logps_BxT, stop_ids):
    """Decoded rows cut where they ended: (tokens, log-probs, kept decode steps, texts), per row.

    A row ends before its first stop token, right after its stop text, or at
    the limit; the kept decode steps made its tokens 1.. and the token that
    ended it (the prefill made token 0).
    """
    tokens_BxT, logps_BxT = np.asarray(tokens_BxT), np.asarray(logps_BxT)
    text_table, _ = self.stop_text_table()
    stops = np.asarray(stop_ids)
    completions, logprobs_out, kept_B, by_text = [], [], [], []
    for row, row_logps in zip(tokens_BxT, logps_BxT):
      # A tool result holds no stop token (multi_turn.ToolTurns drops them).
      hits = np.flatnonzero(np.isin(row, stops))
      end = hits[0] if hits.size else len(row)
      # Decode steps that made the row's tokens 1..end-1 and the stop token at end.
      used = min(end, len(row) - 1)
      through = None if text_table is None else stop_text_lib.length_through(text_table, row[:end])
      if through:  # what follows the stop text is the loop's filler (stop ids or zeros)
        end, used = through, through - 1
      by_text.append(bool(through))
      completions.append(row[:end])
      logprobs_out.append(row_logps[:end])
      kept_B.append(int(used))
    texts = [self._tokenizer.decode(c.tolist()) for c in completions]
    self._check_stop_text(by_text, texts)
    return completions, logprobs_out, kept_B, texts

  def _check_stop_text(self, by_text, texts) -> None:
    """Refuses a completion the stop text ended (`by_text`) that does not hold
    it (a tokenizer whose tokens' texts do not add up, stop_text.py): training
    on it would be silently wrong."""
    for ended, text in zip(by_text, texts):
      if ended and self._stop_text not in text:
        raise RuntimeError(
            f"the decode loop stopped a completion at rollout.stop_text={self._stop_text!r} that"
            f" does not hold it ({text[-80:]!r}); this tokenizer's token texts do not add up:"
            " set --config.rollout.stop_text='' and report it")

  def _decode_with_tools(self, args, kwargs):
    """decode_call's loop, paused for each tool call (multi_turn.py); (turns, its outputs)."""
    (weights, embed_VxD, head_VxD, screen, final_norm_D, first_B, first_logp_B, prompt_cache,
     next_position_B, valid_UxP, stop_ids, next_state_SxV, rng) = args
    new_tokens, with_logps = kwargs["new_tokens"], kwargs["with_logps"]
    if self._call_ends is None:
      vocab = embed_VxD.shape[0]
      ends = multi_turn.CallEnds.from_texts([self._tokenizer.decode([i]) for i in range(vocab)])
      self._call_ends = tuple(jnp.asarray(x) for x in dataclasses.astuple(ends))
    specials = [self._tokenizer.bos_id(), self.pad_id(), self.eos_id()]
    turns = multi_turn.ToolTurns(
        self._tool_runner, self._tokenizer.decode, self._tokenizer.encode,
        max_calls=self._max_tool_calls, rows=first_B.shape[0], width=new_tokens,
        banned_ids=[i for i in [*specials, *np.asarray(stop_ids).tolist()] if i is not None])
    carry = lockstep.turn_start(first_B, first_logp_B, prompt_cache, stop_ids, next_state_SxV,
                               new_tokens=new_tokens, with_logps=with_logps)
    while True:
      carry = lockstep.turn(
          (*carry, jnp.zeros(first_B.shape, bool)), weights, embed_VxD, head_VxD, screen,
          final_norm_D, prompt_cache, next_position_B, valid_UxP, stop_ids, next_state_SxV, rng,
          (jnp.asarray(turns.forced_BxT), *self._call_ends), **kwargs)
      t, paused = jax.device_get((carry[0], carry[8]))
      carry = carry[:8]
      if int(t) >= new_tokens or not paused.any():
        break
      turns.resume(np.asarray(jax.device_get(carry[1])), int(t), paused)
      # Every process runs the calls, as it runs the reward functions; process
      # 0's results are fed to all, so a tool that answers differently in
      # another process cannot make their programs' inputs differ.
      turns.forced_BxT = distributed.from_chief(turns.forced_BxT)
    _, tokens_BxT, logps_BxT, _, _, _, full_heads, _ = carry
    return turns, jax.device_get((tokens_BxT, logps_BxT, full_heads))

  def take_tool_turns(self) -> list[multi_turn.RowTurns]:
    """What the tools did in each row generated since the last call, in row order.

    Tunix's RLCluster rebuilds the engine's outputs from their standard
    fields, so the learner reads this after each `generate`.
    """
    turns, self._tool_turns = self._tool_turns, []
    return turns

  def take_decode_stats(self) -> list[DecodeStats]:
    """What the decode loop did in each generate() since the last call (see take_tool_turns)."""
    stats, self._decode_stats = self._decode_stats, []
    return stats

  @property
  def slots(self) -> int:
    """rollout.slots: decode rows kept busy; 0 = lockstep."""
    return self._slots

  @property
  def uses_tools(self) -> bool:
    return self._tool_runner is not None

  def settings(self, rollout_config: base_rollout.RolloutConfig,
               with_logps: bool) -> tuple[sampling_lib.Sampling, bool, int]:
    """(sampling rule, whether decode returns log-probs, screen width; 0 = unscreened)."""
    greedy = not rollout_config.temperature or rollout_config.top_p is None
    sampling = sampling_lib.Sampling(
        greedy=greedy, temperature=float(rollout_config.temperature or 1.0),
        top_k=None if greedy else (rollout_config.top_k or None),
        top_p=1.0 if greedy else float(rollout_config.top_p))
    vocab = self._model.embedder.input_embedding.get_value().shape[0]
    # Log-probs need every logit: no screen then.
    screen_width = (0 if with_logps or not self._screen
                    else lm_head_screen.screen_width(sampling, vocab))
    return sampling, bool(with_logps), screen_width

  def prefill_call(self, prompt_ids_UxP, rng, *, rows_per_prompt: int,
                   sampling: sampling_lib.Sampling, screen_width: int, slots: int = 0):
    """(the jitted prefill, its arguments, its keywords) for the distinct prompts."""
    graphdef, state = nnx.split(self._model)
    extra = dict(per_sample_keys=True) if slots else {}  # lockstep's program stays today's
    return _prefill, (graphdef, state, prompt_ids_UxP, rng), dict(
        lora_scale=self._lora_scale, rows_per_prompt=rows_per_prompt, pad_id=self.pad_id(),
        sampling=sampling, decode_dtype=self._decode_dtype, screened=bool(screen_width), **extra)

  def decode_call(self, prefilled, stop_ids, rng, *, new_tokens: int,
                  sampling: sampling_lib.Sampling, with_logps: bool, screen_width: int,
                  slots: int = 0, rows_per_prompt: int = 1, next_state_SxV=None):
    """(the jitted decode loop, its arguments, its keywords), fed what the prefill returned;
    with `slots`, the continuous-batching loop of that many rows (continuous.py).
    `next_state_SxV` stands in for the stop text's table (plan lowers with its shape)."""
    (weights, head_VxD, screen, first_B, first_logp_B, prompt_cache, next_position_B,
     valid_UxP) = prefilled
    embed_VxD = self._model.embedder.input_embedding.get_value()
    return continuous.decode_slots if slots else lockstep.decode, (
        weights, embed_VxD, embed_VxD if head_VxD is None else head_VxD, screen,
        self._model.final_norm.scale.get_value(), first_B, first_logp_B, prompt_cache,
        next_position_B, valid_UxP, stop_ids,
        self.stop_text_table()[1] if next_state_SxV is None else next_state_SxV, rng), dict(
            shapes=self._shapes, new_tokens=new_tokens, sampling=sampling,
            with_logps=with_logps, screen_width=screen_width,
            **(dict(slots=slots, rows_per_prompt=rows_per_prompt) if slots else {}))

  def get_per_token_logps(self, prompt_tokens, completion_tokens):
    graphdef, state = nnx.split(self._model)
    return common.compute_per_token_logps(
        graphdef, state, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        pad_id=self.pad_id(), eos_id=self.eos_id(), stop_gradient=True, return_logits=False)

  def update_params(self, params, filter_types=None) -> None:
    # On the policy's own mesh the engine reads the actor's live state at every
    # generate(); this only matters for a copy of its own (placement.send).
    self.background.settle()  # a call in flight decodes under the adapters it started with
    if self.holds_own_weights:
      placement.send(params, self._model, filter_types)
    else:
      nnx.update(self._model, params)

  def pad_id(self) -> int:
    return self._tokenizer.pad_id()

  def eos_id(self) -> int:
    return self._tokenizer.eos_id()

  def model(self) -> Any:
    return self._model
