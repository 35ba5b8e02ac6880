"""Batched greedy or sampled generation for `gemma-grpo eval`.

It decodes with the run's rollout engine (`rollout.engine`): by default
gemma_grpo.rl.engine.rollout, the engine of training rollouts and of the in-training
eval, so `gemma-grpo eval` of a checkpoint gives the completions the training
run's own eval gave (tests/test_eval_generation.py checks it token for token);
with rollout.engine=tunix, Tunix's Sampler. Every batch has the same shape (prompts left-padded to
`max_prompt_length`, the last batch filled up with copies of its last prompt),
so XLA compiles once and the same command gives the same tokens every time.

Sampling draws batch b with the key fold_in(PRNGKey(seed), b); a completion
therefore depends on the seed, the batch size and its row, and a fixed command
reproduces it exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
from tunix.generate import sampler as sampler_lib
from tunix.rl.rollout import base_rollout

from gemma_grpo.config import settings
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.rl.engine import multi_turn
from gemma_grpo.rl.engine import rollout
from gemma_grpo.runtime import console
from gemma_grpo.seam import jax_mesh


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoding:
  """How tokens are chosen; temperature 0 is greedy (argmax)."""

  max_new_tokens: int  # tokens generated per completion, stop token excluded
  temperature: float = 0.0  # 0 = greedy; > 0 samples from softmax(logits / T)
  top_p: float = 1.0  # nucleus mass kept when sampling
  top_k: int = 0  # most likely tokens kept when sampling; 0 = all
  seed: int = 0  # sampling key of batch b: fold_in(PRNGKey(seed), b)

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature}: must be >= 0")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k}: must be >= 0 (0 = no top-k)")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


@dataclasses.dataclass
class Completions:
  """One entry per prompt, in prompt order."""

  texts: list[str]  # decoded, without the stop token
  num_tokens: list[int]  # tokens the model wrote: no stop token, no tool result
  truncated: list[bool]  # hit max_new_tokens without emitting a stop token
  token_ids: list[list[int]]  # the completion's tokens (tool results too), no stop token


class Generator:
  """Completes rendered prompts with a (LoRA or plain) Gemma-3 model.

  Prompts must already fit `max_prompt_length` tokens (with <bos>); the
  evaluation drops longer ones rather than truncating them.
  """

  def __init__(self, model, tokenizer, mesh, *, max_prompt_length: int,
               max_new_tokens: int, stop_token_ids: Sequence[int], stop_text: str = "",
               engine: str = "tunix", lora_scale: float = 1.0, decode_dtype: str = "float32",
               screen_lm_head: str = "auto", tool_runner=None, max_tool_calls: int = 0):
    """`engine` "grouped" decodes with the training rollout engine
    (gemma_grpo.rl.engine.rollout, `lora_scale` = alpha / r, its `decode_dtype` and
    `screen_lm_head`, and its tools: `tool_runner`, `max_tool_calls`), as the
    in-training eval does; "tunix" with Tunix's Sampler."""
    self._mesh = mesh
    self._max_prompt_length = max_prompt_length
    self._max_new_tokens = max_new_tokens
    self._stop_token_ids = list(stop_token_ids)
    self._stop_text = stop_text
    self._tokenizer = tokenizer
    self._engine = engine
    if engine == "grouped":
      self._rollout = rollout.GroupedRollout(model, tokenizer, mesh, lora_scale=lora_scale,
                                             decode_dtype=decode_dtype,
                                             screen_lm_head=screen_lm_head,
                                             tool_runner=tool_runner,
                                             max_tool_calls=max_tool_calls,
                                             stop_text=stop_text)
      return
    if engine != "tunix":
      raise ValueError(f"engine={engine!r}: must be 'grouped' or 'tunix'")
    if tool_runner is not None and max_tool_calls:
      raise ValueError("tools need engine='grouped' (Tunix's sampler cannot pause for a tool)")
    config = model.config
    self._sampler = sampler_lib.Sampler(
        model, tokenizer,
        sampler_lib.CacheConfig(
            # Prompt and completion exactly: attention cost grows with it.
            cache_size=max_prompt_length + max_new_tokens,
            num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        ),
    )

  @classmethod
  def from_settings(cls, model, tokenizer, mesh, rollout_c: settings.RolloutSettings,
                    lora_c: settings.LoraSettings, *, max_new_tokens: int,
                    max_prompt_length: int | None = None) -> "Generator":
    """The generator of a run's `rollout` and `lora` settings: its engine, stops
    and tools, LoRA scale alpha / r, prompts up to `max_prompt_length` (default
    rollout.max_prompt_length)."""
    if max_prompt_length is None:
      max_prompt_length = rollout_c.max_prompt_length
    return cls(
        model, tokenizer, mesh, max_prompt_length=max_prompt_length,
        max_new_tokens=max_new_tokens, stop_token_ids=tokenizer_lib.stop_token_ids(tokenizer),
        stop_text=rollout_c.stop_text, engine=rollout_c.engine,
        lora_scale=lora_c.scale, decode_dtype=rollout_c.decode_dtype,
        screen_lm_head=rollout_c.screen_lm_head, tool_runner=multi_turn.tool_runner(rollout_c),
        max_tool_calls=rollout_c.max_tool_calls)

  @property
  def stop_token_ids(self) -> list[int]:
    return list(self._stop_token_ids)

  def prompt_length(self, prompt: str) -> int:
    """Tokens the sampler feeds for `prompt`, <bos> included."""
    if self._engine == "grouped":
      return len(self._rollout.tokenize(prompt))
    return len(self._sampler.tokenize(prompt))

  def generate(self, prompts: Sequence[str], decoding: Decoding, *,
               batch_size: int, progress: bool = False) -> Completions:
    """Completes every prompt, `batch_size` at a time."""
    if decoding.max_new_tokens > self._max_new_tokens:
      raise ValueError(
          f"max_new_tokens={decoding.max_new_tokens} exceeds the cache built"
          f" for {self._max_new_tokens}")
    prompts = list(prompts)
    batch_size = max(1, min(batch_size, len(prompts)))
    starts = range(0, len(prompts), batch_size)
    bar = console.progress(len(prompts), "generating", "completion", enabled=progress)
    out = Completions([], [], [], [])
    for batch_number, start in enumerate(starts):
      chunk = prompts[start:start + batch_size]
      filled = chunk + [chunk[-1]] * (batch_size - len(chunk))
      texts, tokens, tool_masks = self._generate_batch(filled, decoding, batch_number)
      for text, ids, tool_mask in list(zip(texts, tokens, tool_masks))[:len(chunk)]:
        ids = [int(i) for i in ids]
        cut = tokenizer_lib.tokens_through(ids, text, self._stop_text, self._tokenizer)
        if cut is not None:
          ids, text = ids[:cut[0]], cut[1]
        out.texts.append(text)
        out.num_tokens.append(len(ids) - int(sum(tool_mask[:len(ids)])))
        # Tunix cuts a completion at its first stop token, so a completion
        # that has all max_new_tokens tokens never emitted one.
        out.truncated.append(cut is None and len(ids) >= decoding.max_new_tokens)
        out.token_ids.append(ids)
      bar.update(len(chunk))
    bar.close()
    return out

  def _generate_batch(self, prompts: list[str], decoding: Decoding,
                      batch_number: int) -> tuple[list[str], list[Any], list[Any]]:
    """(texts, token ids, tool masks: True where a token is a tool's result)."""
    if decoding.greedy:
      sampling = dict(temperature=0.0, top_p=None, top_k=None, seed=None)
    else:
      key = jax.random.fold_in(jax.random.PRNGKey(decoding.seed), batch_number)
      sampling = dict(temperature=decoding.temperature, top_p=decoding.top_p,
                      top_k=decoding.top_k or None, seed=key)
    if self._engine == "grouped":
      # What the RLCluster hands the engine for an in-training eval (greedy:
      # top_p None), or a training rollout's settings for sampling.
      config = base_rollout.RolloutConfig(
          max_tokens_to_generate=decoding.max_new_tokens,
          max_prompt_length=self._max_prompt_length,
          kv_cache_size=self._max_prompt_length + decoding.max_new_tokens,
          eos_tokens=self._stop_token_ids, temperature=sampling["temperature"] or 0.0,
          top_p=sampling["top_p"], top_k=sampling["top_k"], seed=sampling["seed"])
      with jax_mesh.tunix_mesh(self._mesh):
        output = self._rollout.generate(prompts, config)
      turns = self._rollout.take_tool_turns()
      masks = ([t.tool_mask for t in turns] if turns
               else [[False] * len(ids) for ids in output.tokens])
      return output.text, output.tokens, masks
    # As Tunix's RLCluster runs its rollouts: under the model's mesh.
    with jax_mesh.tunix_mesh(self._mesh):
      output = self._sampler(
          input_strings=prompts,
          max_generation_steps=decoding.max_new_tokens,
          max_prompt_length=self._max_prompt_length,
          echo=False,
          eos_tokens=self._stop_token_ids,
          pad_output=False,
          **sampling,
      )
    return output.text, output.tokens, [[False] * len(ids) for ids in output.tokens]
