"""Each reach into Tunix/Qwix internals still finds what it expects (gemma_grpo/seam.py)."""

import pytest

from gemma_grpo import errors
from gemma_grpo import seam

# Every module that touches an internal imports the seam, so a wrong version stops it first.
TOUCHING = ("rl/cluster", "rl/trainers", "rl/learner", "model/gemma3_rl", "rl/rollout", "model/lora",
            "commands/export")


@pytest.mark.parametrize("touch", sorted(seam.canaries()))
def test_canary(touch):
  seam.canaries()[touch]()


def test_a_changed_internal_fails_in_one_line_naming_versions_and_touch():
  with pytest.raises(seam.TouchChanged) as failure:
    seam._expect(False, "3", "PeftTrainer has no self._jitted_train_step_fn")  # pylint: disable=protected-access
  message = str(failure.value)
  assert "\n" not in message
  assert message.startswith("google-tunix 0.1.7, qwix 0.1.8: touch 3 changed: PeftTrainer has no")


def test_another_tunix_version_is_refused_in_one_line():
  with pytest.raises(errors.UserError) as refused:
    seam.check_versions({"google-tunix": "0.1.8", "qwix": "0.1.8"})
  assert str(refused.value) == (
      "gemma-grpo needs google-tunix==0.1.7 (it reaches into its internals, gemma_grpo/seam.py),"
      " found 0.1.8; run `pip install -e .` in the checkout")
  seam.check_versions(dict(seam.SUPPORTED))  # the pinned set passes


@pytest.mark.parametrize("module", TOUCHING)
def test_every_module_that_touches_internals_imports_the_seam(module):
  import pathlib  # pylint: disable=g-import-not-at-top

  source = (pathlib.Path(seam.__file__).parent / f"{module}.py").read_text()
  assert "from gemma_grpo import seam" in source and "\nseam.check_versions()" in source, module



def test_fingerprint_ignores_layout_and_comment_lines_but_not_code():
  source = "  def block(self, x):\n    # why\n    y = self.mlp(x)\n\n    return y\n"
  relaid = "def block(self, x):\n        y = self.mlp(x)\n        return y"
  changed = "  def block(self, x):\n    y = self.mlp(x) * 2\n    return y\n"
  assert seam.fingerprint(source) == seam.fingerprint(relaid)
  assert seam.fingerprint(source) != seam.fingerprint(changed)
