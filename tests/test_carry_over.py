"""Slots carried from one decode call to the next (rl/engine/carry_over.py), tiny random Gemma-3."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gemma_grpo.rl.engine import carry_over
from gemma_grpo.rl.engine import continuous
from gemma_grpo.rl.engine import rollout
from gemma_grpo.seam import jax_mesh
from gemma_grpo.tasks import prompts
from conftest import device_mesh
from test_rollout import GROUPED, SAMPLINGS, build, config, generate, uneven_stop, with_slots

OTHER = [prompts.render_prompt(q) for q in ("Double 7.", "Add 5 and 6.", "What is 9 - 4?")
         for _ in range(2)]


@pytest.fixture(scope="module")
def tiny_setup():
  mesh = device_mesh()
  return (mesh, *build(mesh))


KEYS = {"a": jax.random.PRNGKey(11), "b": jax.random.PRNGKey(12), "drain": jax.random.PRNGKey(13)}


def decode(carry, mesh, texts, name, sampling, stops, must_finish=(), admit=True):
  kwargs = dict(sampling, eos_tokens=stops, return_logprobs=True, seed=KEYS[name])
  with jax_mesh.tunix_mesh(mesh):
    return carry.decode(texts, [(name, i) for i in range(len(texts))], config(**kwargs),
                        must_finish=lambda i: i[0] in must_finish, admit=admit)


def run_three_calls(carry, mesh, sampling, stops, between=lambda: None):
  """a; then b, finishing a; then a call that admits nothing, finishing b."""
  calls = [decode(carry, mesh, GROUPED, "a", sampling, stops)]
  between()
  calls.append(decode(carry, mesh, OTHER, "b", sampling, stops, must_finish=("a",)))
  between()
  calls.append(decode(carry, mesh, OTHER, "drain", sampling, stops, must_finish=("b",),
                      admit=False))
  return calls


def alone(engine, actor, tokenizer, mesh, texts, name, sampling, stops):
  """The same samples decoded in one call of the plain slots engine."""
  kwargs = dict(sampling, eos_tokens=stops, return_logprobs=True, seed=KEYS[name])
  return generate(with_slots(engine, actor, tokenizer, mesh, 2), mesh, texts, **kwargs)


@pytest.mark.parametrize("sampling", [SAMPLINGS["greedy"], SAMPLINGS["top-k 50"]],
                         ids=["greedy", "top-k 50"])
def test_carried_samples_draw_what_one_call_draws(tiny_setup, sampling):
  # With the weights unchanged, a sample that spans calls (and slots) draws
  # the tokens and log-probs it draws in one call: its key is its own.
  mesh, actor, tokenizer, engine = tiny_setup
  stops = [uneven_stop(engine, mesh)]
  carry = carry_over.CarryOver(with_slots(engine, actor, tokenizer, mesh, 4), slots=4)
  first, second, third = run_three_calls(carry, mesh, sampling, stops)
  assert first.carried, "the first call must leave samples in its slots"
  assert not any(i[0] == "a" for i in second.carried)  # a had to finish
  assert not third.carried and not third.finished.keys() - {("b", i) for i in range(6)}
  finished = {**first.finished, **second.finished, **third.finished}
  assert len(finished) == 12
  assert any(f.start > 0 for f in second.finished.values())  # some spanned two calls
  for name, texts in (("a", GROUPED), ("b", OTHER)):
    want = alone(engine, actor, tokenizer, mesh, texts, name, sampling, stops)
    for i in range(len(texts)):
      got = finished[(name, i)]
      assert got.tokens.tolist() == want.tokens[i].tolist()
      np.testing.assert_array_equal(got.logps, want.logprobs[i])
      assert got.text == want.text[i]
  # Every decode step a sample kept is counted once, in the call that ran it.
  kept = sum(c.stats.kept for c in (first, second, third))
  assert kept == sum(min(len(f.tokens), 7) for f in finished.values())


def test_new_adapters_between_calls_recompile_nothing_and_reach_the_carried_samples(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  stops = [uneven_stop(engine, mesh)]
  sampling = SAMPLINGS["greedy"]
  original = jax.tree.map(jnp.copy, nnx.state(actor, nnx.LoRAParam))
  jax.clear_caches()  # what this test compiles, it compiles itself
  carry = carry_over.CarryOver(with_slots(engine, actor, tokenizer, mesh, 4), slots=4)
  decode(carry, mesh, GROUPED, "a", sampling, stops)  # compiles prefill and loop once
  compiled = (continuous.decode_slots._cache_size(), rollout._prefill._cache_size())  # pylint: disable=protected-access
  assert compiled == (1, 1)
  fixed = run_three_calls(carry_over.CarryOver(with_slots(engine, actor, tokenizer, mesh, 4),
                                               slots=4), mesh, sampling, stops)

  def new_adapters():  # an update: only the LoRA parameters change
    nnx.update(actor, jax.tree.map(lambda x: x * 1.5, nnx.state(actor, nnx.LoRAParam)))

  try:
    changed = run_three_calls(carry_over.CarryOver(with_slots(engine, actor, tokenizer, mesh, 4),
                                                   slots=4), mesh, sampling, stops, new_adapters)
  finally:
    nnx.update(actor, original)
  assert (continuous.decode_slots._cache_size(), rollout._prefill._cache_size()) == compiled  # pylint: disable=protected-access
  spanned = [i for i, f in changed[1].finished.items() if i[0] == "a" and f.start > 0]
  assert spanned
  before = {**fixed[0].finished, **fixed[1].finished}
  for i in spanned:
    start = changed[1].finished[i].start
    # Drawn before the update: as with fixed weights; after it: the new policy's.
    assert changed[1].finished[i].tokens[:start].tolist() == before[i].tokens[:start].tolist()
  assert any(changed[1].finished[i].logps.tolist() != before[i].logps.tolist() for i in spanned)


def test_a_call_stops_when_a_slot_would_idle(tiny_setup):
  mesh, actor, tokenizer, engine = tiny_setup
  carry = carry_over.CarryOver(with_slots(engine, actor, tokenizer, mesh, 4), slots=4)
  # Every completion runs to the limit: the first four end together, the last
  # two take two slots and the other two would idle, so the call stops there.
  out = decode(carry, mesh, GROUPED, "a", SAMPLINGS["greedy"], [-1])
  assert out.carried == (("a", 4), ("a", 5)) and len(out.finished) == 4
  assert out.stats.steps == 7
  assert out.stats.kept == out.stats.steps * out.stats.slots  # no slot ever idled
  with pytest.raises(ValueError, match="ids for"):
    carry.decode(GROUPED, [0], config(), must_finish=lambda i: False)


def test_every_call_keeps_the_first_calls_group_size(tiny_setup):
  # Prompt slots hold groups of the first call's size. A later call that
  # draws one problem twice in a row (a run of 4) is still groups of 2, and
  # each of its samples draws what it draws alone; runs of 3 are refused.
  mesh, actor, tokenizer, engine = tiny_setup
  carry = carry_over.CarryOver(with_slots(engine, actor, tokenizer, mesh, 4), slots=4)
  sampling, stops = SAMPLINGS["top-k 50"], [uneven_stop(engine, mesh)]
  decode(carry, mesh, GROUPED, "a", sampling, stops)
  twice = OTHER[:2] * 2 + OTHER[2:4]
  second = decode(carry, mesh, twice, "b", sampling, stops, must_finish=("a",))
  third = decode(carry, mesh, OTHER, "drain", sampling, stops, must_finish=("b",), admit=False)
  want = alone(engine, actor, tokenizer, mesh, twice, "b", sampling, stops)
  finished = {**second.finished, **third.finished}
  for i in range(len(twice)):
    assert finished[("b", i)].tokens.tolist() == want.tokens[i].tolist()
  with pytest.raises(RuntimeError, match="not in runs of 2, the first call's group size"):
    decode(carry, mesh, OTHER[:1] * 3 + OTHER[2:3] * 3, "b", sampling, stops)
