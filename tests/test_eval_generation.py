"""Batched generation with Tunix's sampler on the tiny random Gemma-3."""

import dataclasses

import pytest

from conftest import device_mesh
from configs import tiny
from gemma_grpo.config import settings
from gemma_grpo.rl.eval import generation
from gemma_grpo.model import model_loading
from gemma_grpo.tasks import prompts
from gemma_grpo.model import tokenizer as tokenizer_lib

MAX_PROMPT = 64
MAX_NEW = 6
PROMPTS = [prompts.render_prompt(q) for q in (
    "What is 2 + 3?", "Ann has 4 cats and 2 dogs. How many pets?", "Halve 18.")]


@pytest.fixture(scope="module")
def loaded():
  # One device: the simulated 8-device CPU would split this tiny model.
  mesh = device_mesh()
  return model_loading.build(settings.from_config(tiny.get_config()).model, mesh), mesh


def make_generator(loaded, stop_ids=None):
  (model, mesh) = loaded
  return generation.Generator(
      model.model, model.tokenizer, mesh, max_prompt_length=MAX_PROMPT,
      max_new_tokens=MAX_NEW,
      stop_token_ids=stop_ids or tokenizer_lib.stop_token_ids(model.tokenizer))


@pytest.fixture(scope="module")
def generator(loaded):
  return make_generator(loaded)


def test_greedy_is_deterministic_and_batched(generator):
  greedy = generation.Decoding(max_new_tokens=MAX_NEW)
  first = generator.generate(PROMPTS, greedy, batch_size=2)  # 2 + 1 (filled up)
  again = generator.generate(PROMPTS, greedy, batch_size=2)
  assert first == again
  assert len(first.texts) == len(PROMPTS)
  for ids, n, cut in zip(first.token_ids, first.num_tokens, first.truncated):
    assert len(ids) == n <= MAX_NEW
    assert cut == (n == MAX_NEW)


def test_sampling_is_reproducible_per_seed(generator):
  def sample(seed):
    decoding = generation.Decoding(max_new_tokens=MAX_NEW, temperature=1.0, seed=seed)
    return generator.generate(PROMPTS[:1] * 2, decoding, batch_size=2).token_ids

  assert sample(0) == sample(0)
  assert sample(0) != sample(1)
  # The two copies of a prompt draw different tokens (a random model samples
  # nearly uniformly from 262k tokens: equal draws are practically impossible).
  tokens = sample(0)
  assert tokens[0] != tokens[1]


def test_a_stop_token_ends_the_completion_untruncated(loaded, generator):
  greedy = generation.Decoding(max_new_tokens=MAX_NEW)
  # Batch size 2 as above: compiled once per generator.
  free = generator.generate(PROMPTS[:2], greedy, batch_size=2)
  ids = free.token_ids[0]
  assert len(ids) >= 3, "the random model stopped early; pick another prompt"
  stop = ids[2]
  stopped = make_generator(loaded, [stop]).generate(PROMPTS[:2], greedy, batch_size=2)
  cut_at = ids.index(stop)  # the first occurrence ends it
  assert stopped.token_ids[0] == ids[:cut_at]
  assert stopped.num_tokens[0] == cut_at and stopped.truncated[0] is False
  assert stopped.texts[0] == loaded[0].tokenizer.decode(ids[:cut_at])


def test_prompt_length_counts_bos(loaded, generator):
  tok = loaded[0].tokenizer
  assert generator.prompt_length(PROMPTS[0]) == len(tok.encode(PROMPTS[0]))
  assert tok.encode(PROMPTS[0])[0] == tok.bos_id()


@pytest.mark.parametrize("kwargs", [
    dict(max_new_tokens=0), dict(max_new_tokens=4, temperature=-1.0),
    dict(max_new_tokens=4, top_p=0.0), dict(max_new_tokens=4, top_k=-1),
])
def test_decoding_rejects_bad_values(kwargs):
  with pytest.raises(ValueError):
    generation.Decoding(**kwargs)


def test_from_settings_builds_the_generator_of_the_rollout_and_lora_settings(loaded, generator):
  (model, mesh) = loaded
  c = settings.from_config(tiny.get_config())
  rollout = dataclasses.replace(c.rollout, engine="tunix",  # the engine of the `generator` fixture
                                max_prompt_length=MAX_PROMPT)
  built = generation.Generator.from_settings(model.model, model.tokenizer, mesh, rollout,
                                             c.lora, max_new_tokens=MAX_NEW)
  assert built.stop_token_ids == tokenizer_lib.stop_token_ids(model.tokenizer)
  greedy = generation.Decoding(max_new_tokens=MAX_NEW)
  assert (built.generate(PROMPTS[:2], greedy, batch_size=2)
          == generator.generate(PROMPTS[:2], greedy, batch_size=2))
