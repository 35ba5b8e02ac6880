"""Old module names, from before the package had layers, still import.

`import gemma_grpo.rewards` (or a config naming `gemma_grpo.rewards:fn`)
gets the very module object of gemma_grpo.tasks.rewards, with a
DeprecationWarning, and `python -m gemma_grpo.cli` runs the moved module.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

# Old name -> layer it moved into (gemma_grpo.<old> is now gemma_grpo.<layer>.<old>).
MOVED = {
    **dict.fromkeys(("cli", "command", "sft", "evaluate", "export", "plots"), "commands"),
    **dict.fromkeys(("learner", "losses", "logprobs", "rollout", "multi_turn", "cluster",
                     "trainers", "step_hooks", "eval_generation", "optim"), "rl"),
    **dict.fromkeys(("gemma3_rl", "lora", "model_loading", "gguf_io", "tokenizer", "policy",
                     "model_card"), "model"),
    **dict.fromkeys(("data", "prompts", "answers", "rewards", "tools", "scoring"), "tasks"),
    **dict.fromkeys(("distributed", "mesh", "workdir_lock", "checkpoints", "guards",
                     "metrics", "console", "host_memory", "hub"), "runtime"),
}


def new_name(old: str) -> str | None:
  """gemma_grpo.tasks.rewards for gemma_grpo.rewards; None for a name that did not move."""
  package, _, module = old.partition(".")
  if package != "gemma_grpo" or module not in MOVED:
    return None
  return f"gemma_grpo.{MOVED[module]}.{module}"


class _AliasLoader(importlib.abc.Loader):
  """Loads an old name as the module object of its new name."""

  def __init__(self, target: str):
    self.target = target
    self.target_spec = None

  def create_module(self, spec):
    warnings.warn(f"{spec.name} moved to {self.target}; import it from there",
                  DeprecationWarning, stacklevel=2)
    module = importlib.import_module(self.target)
    self.target_spec = module.__spec__
    return module

  def exec_module(self, module):
    # The target ran when it was imported; importlib has just pointed its
    # __spec__ at the old name, which must not outlive this import.
    module.__spec__ = self.target_spec

  def get_code(self, fullname):  # what runpy runs for `python -m OLD_NAME`
    del fullname
    return importlib.util.find_spec(self.target).loader.get_code(self.target)


class _MovedFinder(importlib.abc.MetaPathFinder):

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if (new := new_name(fullname)) is None:
      return None
    return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
  if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
