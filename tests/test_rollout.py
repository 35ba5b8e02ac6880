"""The grouped rollout engine against Tunix's sampler on tiny random Gemma-3s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.generate import tokenizer_adapter
from tunix.models.gemma3 import model as gemma3
from tunix.rl.rollout import base_rollout

from conftest import device_mesh
from configs import tiny
from gemma_grpo.config import settings
from gemma_grpo.rl.engine import continuous
from gemma_grpo.rl.engine import decode_layers
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.rl.learner import logprobs
from gemma_grpo.model import lora
from gemma_grpo.model import model_loading
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.tasks import prompts
from gemma_grpo.rl.engine import rollout
from gemma_grpo.rl.engine import stop_text
from gemma_grpo.seam import jax_mesh

MAX_PROMPT = 64
MAX_NEW = 8
QUESTIONS = ("What is 2 + 3?", "Ann has 4 cats and 2 dogs. How many pets?", "Halve 18.")
GROUPED = [prompts.render_prompt(q) for q in QUESTIONS for _ in range(2)]
NO_STOP = [-1]  # no token has this id: every completion runs to the limit


def build(mesh, **random_overrides):
  c = tiny.get_config()
  for key, value in random_overrides.items():
    c.model.random[key] = value
  c = settings.from_config(c)
  loaded = model_loading.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  # Qwix starts B at zero; random adapters make the merge matter.
  state = nnx.state(actor, nnx.LoRAParam)
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(0)
  nnx.update(actor, jax.tree.unflatten(
      treedef, [jnp.asarray(0.3 * rng.normal(size=x.shape), x.dtype) for x in leaves]))
  tokenizer = tokenizer_adapter.TokenizerAdapter(loaded.tokenizer)
  engine = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=c.lora.scale)
  return actor, tokenizer, engine


def config(**kwargs):
  values = dict(max_tokens_to_generate=MAX_NEW, max_prompt_length=MAX_PROMPT,
                kv_cache_size=MAX_PROMPT + MAX_NEW, temperature=0.0, top_p=None, top_k=None,
                eos_tokens=NO_STOP)
  values.update(kwargs)
  return base_rollout.RolloutConfig(**values)


def tunix_greedy(actor, tokenizer, mesh, texts, eos_tokens=NO_STOP):
  cfg = actor.config
  sampler = sampler_lib.Sampler(actor, tokenizer, sampler_lib.CacheConfig(
      cache_size=MAX_PROMPT + MAX_NEW, num_layers=cfg.num_layers,
      num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
  with jax_mesh.tunix_mesh(mesh):
    out = sampler(texts, max_generation_steps=MAX_NEW, max_prompt_length=MAX_PROMPT,
                  echo=False, temperature=0.0, top_p=None, top_k=None, eos_tokens=eos_tokens)
  return [np.asarray(t).tolist() for t in out.tokens], np.asarray(out.padded_prompt_tokens)


@pytest.fixture(scope="module")
def tiny_setup():
  mesh = device_mesh()
  return (mesh, *build(mesh))


def generate(engine, mesh, texts, **kwargs):
  with jax_mesh.tunix_mesh(mesh):
    return engine.generate(texts, config(**kwargs))


@pytest.mark.parametrize("texts", [GROUPED, [prompts.render_prompt(q) for q in QUESTIONS]],
                         ids=["groups-of-2", "distinct"])
def test_greedy_matches_tunix_sampler_with_lora(tiny_setup, texts):
  mesh, actor, tokenizer, engine = tiny_setup
  out = generate(engine, mesh, texts)
  want_tokens, want_prompts = tunix_greedy(actor, tokenizer, mesh, texts)
  assert [t.tolist() for t in out.tokens] == want_tokens
  np.testing.assert_array_equal(out.left_padded_prompt_tokens, want_prompts)
  assert out.text == [tokenizer.decode(t) for t in want_tokens]


@pytest.mark.parametrize("window", [24, 5], ids=["cuts-the-prompt", "cuts-the-completion"])
def test_greedy_matches_tunix_with_grouped_query_heads_and_a_short_window(window):
  # Two key/value heads (G = 2 queries each) and a window shorter than the
  # prompts, so the sliding-window mask cuts the prompt's keys, which the
  # engine holds once per prompt, during prefill and decode; a window of 5
  # also cuts the completion's own first keys, held per row, from the 6th
  # new token on.
  mesh = device_mesh()
  actor, tokenizer, engine = build(mesh, num_kv_heads=2, sliding_window=window)
  out = generate(engine, mesh, GROUPED)
  want_tokens, _ = tunix_greedy(actor, tokenizer, mesh, GROUPED)
  assert [t.tolist() for t in out.tokens] == want_tokens


def test_sharded_mesh_gives_the_same_tokens(tiny_setup):
  mesh, _, _, engine = tiny_setup
  want = [t.tolist() for t in generate(engine, mesh, GROUPED).tokens]
  sharded = device_mesh(2, 2)
  _, _, sharded_engine = build(sharded)
  got = [t.tolist() for t in generate(sharded_engine, sharded, GROUPED).tokens]
  assert got == want


def test_a_stop_token_ends_the_completion_and_is_not_returned(tiny_setup):
  mesh, _, _, engine = tiny_setup
  free = generate(engine, mesh, GROUPED).tokens
  stop = int(free[0][3])
  cut = generate(engine, mesh, GROUPED, eos_tokens=[stop]).tokens
  for row_free, row_cut in zip(free, cut):
    hits = np.flatnonzero(row_free == stop)
    expected = row_free[:hits[0]] if hits.size else row_free
    assert row_cut.tolist() == expected.tolist()
  assert len(cut[0]) == 3


def test_sampling_is_reproducible_per_key_and_varies_across_keys(tiny_setup):
  mesh, _, _, engine = tiny_setup
  def sample(seed):
    out = generate(engine, mesh, GROUPED, temperature=1.0, top_p=1.0, top_k=50,
                   seed=jax.random.PRNGKey(seed))
    return [t.tolist() for t in out.tokens]
  first = sample(0)
  assert sample(0) == first
  assert sample(1) != first
  # Rows of a group share a prompt but draw their own tokens.
  assert first[0] != first[1]


def test_top_k_one_is_greedy(tiny_setup):
  mesh, _, _, engine = tiny_setup
  greedy = [t.tolist() for t in generate(engine, mesh, GROUPED).tokens]
  top1 = generate(engine, mesh, GROUPED, temperature=0.7, top_p=1.0, top_k=1,
                  seed=jax.random.PRNGKey(3))
  assert [t.tolist() for t in top1.tokens] == greedy


@pytest.mark.parametrize("texts, starts, size", [
    (["a", "a", "b", "b"], [0, 2], 2),
    (["a", "b", "c"], [0, 1, 2], 1),
    (["a", "a", "a", "b"], [0, 1, 2, 3], 1),  # unequal runs: no sharing
    (["a", "a", "b", "b", "a", "a"], [0, 2, 4], 2),
])
def test_group_rows(texts, starts, size):
  assert rollout.group_rows(texts) == (starts, size)


def test_engine_refuses_a_model_it_cannot_prefill(tiny_setup):
  _, actor, tokenizer, _ = tiny_setup
  plain = nnx.eval_shape(lambda: gemma3.Gemma3(actor.config, rngs=nnx.Rngs(0)))
  with pytest.raises(TypeError, match="gemma3_rl.Gemma3"):
    rollout.GroupedRollout(plain, tokenizer, None, lora_scale=1.0)


def trainer_logps(actor, out, temperature):
  """The trainer's log-probs (gemma_grpo.rl.learner.logprobs) of the engine's completions, [B, T]."""
  width = max(len(t) for t in out.tokens)
  pad = 0
  completion_BxT = np.stack([np.pad(t, (0, width - len(t)), constant_values=pad) for t in out.tokens])
  logps_BxT, _ = logprobs.per_token_logps(actor, jnp.asarray(out.left_padded_prompt_tokens),
                                          jnp.asarray(completion_BxT), pad, temperature)
  return np.asarray(logps_BxT)


def test_returned_logprobs_are_the_trainers_log_probs_of_the_drawn_tokens(tiny_setup):
  mesh, actor, _, engine = tiny_setup
  out = generate(engine, mesh, GROUPED, temperature=0.7, top_p=1.0, top_k=50,
                 seed=jax.random.PRNGKey(5), return_logprobs=True)
  want_BxT = trainer_logps(actor, out, temperature=0.7)
  for row, (tokens, logps) in enumerate(zip(out.tokens, out.logprobs)):
    assert len(logps) == len(tokens) == MAX_NEW
    np.testing.assert_allclose(logps, want_BxT[row], atol=2e-4)
  assert generate(engine, mesh, GROUPED).logprobs is None  # only when asked


def test_bfloat16_decode_rounds_the_decode_weights_and_stays_close_to_the_policy(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  weights = decode_layers.decode_weights(actor, lora_scale=1.0, dtype=jnp.bfloat16)
  assert weights[0].query_NHxD.dtype == jnp.bfloat16 and weights[0].down_DxF.dtype == jnp.bfloat16
  assert weights[0].attn_norm_D.dtype == jnp.float32
  half = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=engine._lora_scale,  # pylint: disable=protected-access
                                decode_dtype="bfloat16")
  full = generate(engine, mesh, GROUPED, return_logprobs=True)
  out = generate(half, mesh, GROUPED, return_logprobs=True)
  # The first token comes from the (float32) prefill, so it always agrees.
  assert [t[0] for t in out.tokens] == [t[0] for t in full.tokens]
  np.testing.assert_allclose([l[0] for l in out.logprobs], [l[0] for l in full.logprobs], atol=1e-6)
  # Later ones are drawn from bfloat16 logits: close to the float32 policy's, not equal.
  gap_BxT = np.abs(np.stack(out.logprobs) - trainer_logps(actor, out, temperature=1.0))
  # (float32 decoding is within 2e-4 of them: the test above.)
  assert 5e-4 < gap_BxT[:, 1:].max() < 0.1


def test_an_unknown_decode_dtype_is_refused(tiny_setup):
  mesh, actor, tokenizer, _ = tiny_setup
  with pytest.raises(ValueError, match="decode_dtype='float16': must be one of float32, bfloat16"):
    rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0, decode_dtype="float16")


SCREENED_SAMPLINGS = {
    "greedy": dict(),
    "top-k 50": dict(temperature=0.9, top_p=1.0, top_k=50),
    "top-k 5, top-p 0.8": dict(temperature=1.3, top_p=0.8, top_k=5),
}


@pytest.mark.parametrize("sampling", SCREENED_SAMPLINGS.values(), ids=SCREENED_SAMPLINGS.keys())
def test_the_screened_head_draws_the_tokens_of_the_float32_head(tiny_setup, sampling):
  mesh, actor, tokenizer, full = tiny_setup
  kwargs = dict(lora_scale=full._lora_scale, decode_dtype="float32")  # pylint: disable=protected-access
  off = rollout.GroupedRollout(actor, tokenizer, mesh, screen_lm_head="off", **kwargs)
  on = rollout.GroupedRollout(actor, tokenizer, mesh, screen_lm_head="on", **kwargs)
  for seed in range(3):
    keyed = dict(sampling, seed=jax.random.PRNGKey(seed)) if sampling else {}
    want = [t.tolist() for t in generate(off, mesh, GROUPED, **keyed).tokens]
    assert [t.tolist() for t in generate(on, mesh, GROUPED, **keyed).tokens] == want
    assert on.full_head_steps == 0  # every step proved: the candidates alone drew these
  # The tiny model's rows are far from flat: a wrong screen would show.
  assert len({tuple(t) for t in want}) > 1


def test_an_unknown_screen_setting_is_refused_and_auto_follows_the_cpu(tiny_setup, monkeypatch):
  mesh, actor, tokenizer, _ = tiny_setup
  with pytest.raises(ValueError, match="screen_lm_head='always': must be one of auto, on, off"):
    rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0, screen_lm_head="always")
  for pays in (True, False):
    monkeypatch.setattr(lm_head_screen, "screen_pays_off", lambda pays=pays: pays)
    engine = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0)
    assert engine._screen is pays  # pylint: disable=protected-access
  # A bfloat16 head is not screened: it is the screen's own precision.
  half = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0, decode_dtype="bfloat16",
                                screen_lm_head="on")
  assert not half._screen  # pylint: disable=protected-access


# --- continuous batching (rollout.slots) --------------------------------------

SAMPLINGS = {
    "greedy": dict(),
    "top-k 50": dict(temperature=0.9, top_p=1.0, top_k=50, seed=jax.random.PRNGKey(4)),
    "top-p 0.9": dict(temperature=1.1, top_p=0.9, top_k=None, seed=jax.random.PRNGKey(7)),
}


def with_slots(engine, actor, tokenizer, mesh, slots, **kwargs):
  return rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=engine._lora_scale,  # pylint: disable=protected-access
                                slots=slots, **kwargs)


def uneven_stop(engine, mesh):
  """A stop token that ends the greedy completions at different lengths (some never)."""
  free = [t.tolist() for t in generate(engine, mesh, GROUPED).tokens]
  return free[0][3]


# Top-p sorts the whole vocabulary every step (25 s a case here): one slot
# count for it; the slot counts' difference is the same for every rule.
@pytest.mark.parametrize("slots, sampling", [
    pytest.param(slots, SAMPLINGS[name], id=f"{slots}-{name}")
    for slots, name in ((2, "greedy"), (2, "top-k 50"), (2, "top-p 0.9"), (4, "greedy"),
                        (4, "top-k 50"))])
def test_continuous_batching_draws_every_completion_as_without_refills(tiny_setup, sampling,
                                                                      slots):
  # 6 completions in fewer slots: slots are refilled, samples start at
  # different steps and sit in different slots than with 6 slots, which
  # never refill; each completion's tokens and log-probs must not notice.
  mesh, actor, tokenizer, engine = tiny_setup
  for stops in (NO_STOP, [uneven_stop(engine, mesh)]):
    kwargs = dict(sampling, eos_tokens=stops, return_logprobs=True)
    every = with_slots(engine, actor, tokenizer, mesh, len(GROUPED))
    want = generate(every, mesh, GROUPED, **kwargs)
    assert every.take_decode_stats()[0].refills == 0
    few = with_slots(engine, actor, tokenizer, mesh, slots)
    got = generate(few, mesh, GROUPED, **kwargs)
    [stats] = few.take_decode_stats()
    assert stats.slots == slots and stats.refills >= len(GROUPED) - slots
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    for got_logps, want_logps in zip(got.logprobs, want.logprobs):
      np.testing.assert_array_equal(got_logps, want_logps)
    np.testing.assert_array_equal(got.left_padded_prompt_tokens, want.left_padded_prompt_tokens)
  if sampling:  # rows of a group still draw their own tokens
    assert got.tokens[0].tolist() != got.tokens[1].tolist()


@pytest.mark.parametrize("window", [None, 5], ids=["global", "window-cuts-the-completion"])
def test_greedy_continuous_batching_gives_the_lockstep_tokens_and_log_probs(window):
  # Two key/value heads and, in one case, a window of 5 that hides each
  # completion's first keys from the 6th new token on: per-row positions
  # and masks must match the lockstep engine's shared ones. A prompt slot's
  # rows attend to its prompt in lockstep's own dot, so the log-probs are
  # lockstep's to the bit.
  mesh = device_mesh()
  overrides = dict(num_kv_heads=2) if window is None else dict(num_kv_heads=2,
                                                               sliding_window=window)
  actor, tokenizer, engine = build(mesh, **overrides)
  stop = uneven_stop(engine, mesh)
  for stops in (NO_STOP, [stop]):
    want = generate(engine, mesh, GROUPED, eos_tokens=stops, return_logprobs=True)
    slotted = with_slots(engine, actor, tokenizer, mesh, 4)
    got = generate(slotted, mesh, GROUPED, eos_tokens=stops, return_logprobs=True)
    assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]
    for got_logps, want_logps in zip(got.logprobs, want.logprobs):
      np.testing.assert_array_equal(got_logps, want_logps)
    assert slotted.take_decode_stats()[0].refills >= 2


def test_continuous_batching_with_the_screened_head_draws_the_same_tokens(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  for sampling in (dict(), SAMPLINGS["top-k 50"]):
    off = with_slots(engine, actor, tokenizer, mesh, 3, screen_lm_head="off")
    on = with_slots(engine, actor, tokenizer, mesh, 3, screen_lm_head="on")
    want = [t.tolist() for t in generate(off, mesh, GROUPED, **sampling).tokens]
    assert [t.tolist() for t in generate(on, mesh, GROUPED, **sampling).tokens] == want
    assert on.full_head_steps == 0


def test_occupancy_counts_the_slot_steps_that_made_kept_tokens(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  stop = uneven_stop(engine, mesh)
  engine.take_decode_stats()
  out = generate(engine, mesh, GROUPED, eos_tokens=[stop])
  lengths = [len(t) for t in out.tokens]
  # A completion of n tokens ended by a stop took n decode steps (tokens
  # 1..n-1 and the stop; token 0 is the prefill's); one cut at MAX_NEW took MAX_NEW - 1.
  kept = sum(n if n < MAX_NEW else MAX_NEW - 1 for n in lengths)
  assert len(set(lengths)) > 1 and kept < len(GROUPED) * (MAX_NEW - 1)
  [lockstep] = engine.take_decode_stats()
  assert (lockstep.steps, lockstep.slots, lockstep.kept, lockstep.refills) == (
      max(min(n, MAX_NEW - 1) for n in lengths), len(GROUPED), kept, 0)
  slotted = with_slots(engine, actor, tokenizer, mesh, 2)
  generate(slotted, mesh, GROUPED, eos_tokens=[stop])
  [slot_stats] = slotted.take_decode_stats()
  assert slot_stats.kept == kept and slot_stats.slots == 2
  # A slot idles only once no sample waits: at most the last sample's steps.
  assert kept <= slot_stats.steps * 2 <= kept + 2 * (MAX_NEW - 1)
  assert (slot_stats.kept / (slot_stats.steps * slot_stats.slots)
          > lockstep.kept / (lockstep.steps * lockstep.slots))


def test_continuous_batching_compiles_its_loop_once_across_steps(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  slotted = with_slots(engine, actor, tokenizer, mesh, 3)
  other = [prompts.render_prompt(q) for q in ("Add 5 and 9.", "Double 21.", "What is 7 - 2?")
           for _ in range(2)]
  sampling = dict(SAMPLINGS["top-k 50"], return_logprobs=True)
  generate(slotted, mesh, GROUPED, **sampling)
  compiled = continuous.decode_slots._cache_size()  # pylint: disable=protected-access
  for step, texts in enumerate((other, GROUPED, other)):
    generate(slotted, mesh, texts, **dict(sampling, seed=jax.random.PRNGKey(10 + step)))
  assert continuous.decode_slots._cache_size() == compiled  # pylint: disable=protected-access


def test_continuous_batching_refuses_tools_and_negative_slots(tiny_setup):
  mesh, actor, tokenizer, _ = tiny_setup
  with pytest.raises(ValueError, match="slots=-1: must be >= 0"):
    rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0, slots=-1)
  with pytest.raises(ValueError, match="does not run tool calls yet"):
    rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0, slots=2,
                           tool_runner=object(), max_tool_calls=2)



# --- stop text (rollout.stop_text) --------------------------------------------

def learner_cut(tokenizer, tokens, stop):
  """The tokens the learner keeps of a completion (tokenizer.tokens_through)."""
  cut = tokenizer_lib.tokens_through(tokens, tokenizer.decode(tokens), stop, tokenizer)
  return tokens if cut is None else tokens[:cut[0]]


@pytest.mark.parametrize("sampling", [SAMPLINGS["greedy"], SAMPLINGS["top-k 50"]],
                         ids=["greedy", "top-k 50"])
@pytest.mark.parametrize("slots", [0, 2], ids=["lockstep", "2 slots"])
def test_a_row_ends_right_after_its_stop_text_with_the_tokens_it_would_have_drawn(
    tiny_setup, sampling, slots):
  mesh, actor, tokenizer, engine = tiny_setup
  kwargs = dict(sampling, return_logprobs=True)
  running_on = with_slots(engine, actor, tokenizer, mesh, slots)
  free = generate(running_on, mesh, GROUPED, **kwargs)
  rows = [t.tolist() for t in free.tokens]
  stop = tokenizer.decode(rows[0][2:4])
  want = [learner_cut(tokenizer, row, stop) for row in rows]
  assert len(want[0]) <= 4 and any(len(w) == MAX_NEW for w in want)
  stopping = with_slots(engine, actor, tokenizer, mesh, slots, stop_text=stop)
  got = generate(stopping, mesh, GROUPED, **kwargs)
  assert [t.tolist() for t in got.tokens] == want
  assert got.text == [tokenizer.decode(w) for w in want]
  for got_logps, free_logps, w in zip(got.logprobs, free.logprobs, want):
    np.testing.assert_array_equal(got_logps, free_logps[:len(w)])
  [free_stats], [stats] = running_on.take_decode_stats(), stopping.take_decode_stats()
  assert stats.kept == sum(len(w) - 1 if len(w) < MAX_NEW else MAX_NEW - 1 for w in want)
  assert stats.kept < free_stats.kept
  assert stats.steps <= free_stats.steps


def test_every_row_ending_at_its_stop_text_ends_the_lockstep_loop(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  rows = [t.tolist() for t in generate(engine, mesh, GROUPED).tokens]
  # Greedy rows of a group are equal: one stop text per group's third token.
  stops = {tokenizer.decode(row[2:3]) for row in rows}
  for stop in stops:
    engine.take_decode_stats()
    stopping = with_slots(engine, actor, tokenizer, mesh, 0, stop_text=stop)
    got = [t.tolist() for t in generate(stopping, mesh, GROUPED).tokens]
    assert got == [learner_cut(tokenizer, row, stop) for row in rows]
    [stats] = stopping.take_decode_stats()
    # A row of n tokens ended by its text took n - 1 decode steps (the first is the prefill's).
    used = [len(g) - 1 if stop in tokenizer.decode(g) else MAX_NEW - 1 for g in got]
    assert stats.kept_B == tuple(used) and stats.steps == max(used)


def test_a_stop_the_decoded_text_does_not_hold_is_refused(tiny_setup, monkeypatch):
  mesh, actor, tokenizer, engine = tiny_setup
  row = generate(engine, mesh, GROUPED).tokens[0].tolist()
  real = stop_text.token_texts

  def lying(tok, vocab):  # a tokenizer whose token texts do not add up
    texts = real(tok, vocab)
    texts[row[1]] = "ZZZ"
    return texts

  monkeypatch.setattr(stop_text, "token_texts", lying)
  stopping = with_slots(engine, actor, tokenizer, mesh, 0, stop_text="ZZZ")
  with pytest.raises(RuntimeError, match="does not hold it.*stop_text=''"):
    generate(stopping, mesh, GROUPED)
