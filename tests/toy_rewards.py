"""A reward a random model's output varies on, for tests that need learning.

A randomly initialised model never writes the answer tags, so every built-in
reward gives every completion the same score: zero advantages, zero
gradients, and a test of resuming or exporting would compare untrained
weights. Tests add this one with `--config.rewards.custom=tests.toy_rewards:vowel_share`.
"""


def vowel_share(prompts, completions, answer, **unused):
  """The share of a completion's letters that are vowels (0..1)."""
  del prompts, answer, unused
  scores = []
  for completion in completions:
    letters = [ch for ch in str(completion).lower() if ch.isalpha()]
    scores.append(sum(ch in "aeiou" for ch in letters) / max(len(letters), 1))
  return scores


def prompt_code(prompts, completions, answer, **unused):
  """A number per prompt (0..1), the same for a group's rows: zero advantage,
  but its logged mean tells which problems a step trained on."""
  del completions, answer, unused
  import zlib  # pylint: disable=g-import-not-at-top

  return [zlib.crc32(str(p).encode()) % 1000 / 1000 for p in prompts]


def fails_in_process_1(prompts, completions, answer, **unused):
  """Raises in JAX process 1 only: a fault that one process of a run meets alone."""
  del prompts, answer, unused
  import jax  # pylint: disable=g-import-not-at-top

  if jax.process_index() == 1:
    raise ValueError("bad input")
  return [0.0] * len(completions)
