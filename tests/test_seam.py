"""The seam (gemma_grpo/seam): each reach into Tunix, Qwix or JAX internals
still finds what it expects, and no module outside the seam reaches in."""

import ast
import functools
import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest

from gemma_grpo import errors
from gemma_grpo import seam
from gemma_grpo.seam import versions

PACKAGE = pathlib.Path(seam.__file__).resolve().parents[1]
LIBRARIES = ("tunix", "qwix", "flax", "jax", "jaxlib", "orbax")


@pytest.mark.parametrize("touch", sorted(seam.canaries()))
def test_canary(touch):
  seam.canaries()[touch]()


def test_the_canaries_are_numbered_one_to_eleven():
  assert [int(t.split()[0]) for t in seam.canaries()] == list(range(1, 13))


def test_a_changed_internal_fails_in_one_line_naming_versions_and_touch():
  with pytest.raises(seam.TouchChanged) as failure:
    versions.expect(False, "3", "PeftTrainer has no self._jitted_train_step_fn")
  message = str(failure.value)
  assert "\n" not in message
  assert message.startswith("google-tunix 0.1.7, qwix 0.1.8: touch 3 changed: PeftTrainer has no")


def test_another_tunix_version_is_refused_in_one_line():
  with pytest.raises(errors.UserError) as refused:
    seam.check_versions({"google-tunix": "0.1.8", "qwix": "0.1.8"})
  assert str(refused.value) == (
      "gemma-grpo needs google-tunix==0.1.7 (it reaches into its internals,"
      " gemma_grpo/seam), found 0.1.8; run `pip install -e .` in the checkout")
  seam.check_versions(dict(seam.SUPPORTED))  # the pinned set passes


def test_fingerprint_ignores_layout_and_comment_lines_but_not_code():
  source = "  def block(self, x):\n    # why\n    y = self.mlp(x)\n\n    return y\n"
  relaid = "def block(self, x):\n        y = self.mlp(x)\n        return y"
  changed = "  def block(self, x):\n    y = self.mlp(x) * 2\n    return y\n"
  assert seam.fingerprint(source) == seam.fingerprint(relaid)
  assert seam.fingerprint(source) != seam.fingerprint(changed)


# --- Nothing outside the seam touches a private name of the libraries. ---


def _private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def _names_defined_in(tree: ast.AST) -> set[str]:
  """Private names a source defines: attributes it assigns, functions and classes."""
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
      found.add(node.attr)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      found.add(node.name)
  return {n for n in found if _private(n)}


@functools.cache
def _library_sources() -> tuple[str, ...]:
  texts = []
  for library in LIBRARIES:
    for root in importlib.util.find_spec(library).submodule_search_locations:
      for path in pathlib.Path(root).rglob("*.py"):
        try:
          texts.append(path.read_text())
        except UnicodeDecodeError:
          continue
  return tuple(texts)


def _defined_in_libraries(names: set[str]) -> set[str]:
  """Those of `names` that a library defines: `def`, `class` or an attribute assignment.

  A text search rather than a parse of every library file: the same names,
  in a fraction of the time.
  """
  if not names:
    return set()
  alternatives = "|".join(re.escape(n) for n in sorted(names))
  definition = re.compile(rf"(?:\b(?:def|class)\s+({alternatives})\b)"
                          rf"|(?:\.({alternatives})\s*(?::[^=\n]*)?=(?!=))")
  found = set()
  for text in _library_sources():
    for match in definition.finditer(text):
      found.add(match.group(1) or match.group(2))
  return found


def _private_reads(tree: ast.AST) -> set[str]:
  """Private attributes read off something other than self or cls."""
  return {node.attr for node in ast.walk(tree)
          if isinstance(node, ast.Attribute) and _private(node.attr)
          and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))}


def _ours() -> list[tuple[str, ast.Module]]:
  return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text()))
          for p in sorted(PACKAGE.rglob("*.py")) if "seam" not in p.relative_to(PACKAGE).parts]


def _library_classes_above(module_path: str, class_name: str) -> list[type]:
  """The Tunix/Qwix/Flax/JAX classes (or seam classes) a class of ours inherits from."""
  module = importlib.import_module("gemma_grpo." + module_path.removesuffix(".py").replace("/", "."))
  cls = getattr(module, class_name, None)
  if not isinstance(cls, type):
    return []
  return [c for c in cls.__mro__[1:]
          if c.__module__.split(".")[0] in LIBRARIES or c.__module__.startswith("gemma_grpo.seam")]


def _private_names_of(classes: list[type]) -> set[str]:
  found = set()
  for cls in classes:
    try:
      found |= _names_defined_in(ast.parse(inspect.getsource(cls).strip()))
    except (OSError, TypeError, SyntaxError, IndentationError):
      found |= {n for n in vars(cls) if _private(n)}
  return found


def private_touches(only: str | None = None) -> list[str]:
  """'file:line what' for each reach into a library's private name outside the seam.

  `only`: the one module (a path under gemma_grpo/) to read; all by default.
  """
  sources = _ours()
  ours = set().union(*(_names_defined_in(tree) for _, tree in sources))
  library_names = _defined_in_libraries(
      set().union(*(_private_reads(tree) for _, tree in sources)) - ours)
  touches = []
  for path, tree in sources:
    if only is not None and path != only:
      continue
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [f"{node.module}.{a.name}" for a in node.names])
        for name in names:
          parts = name.split(".")
          if parts[0] in LIBRARIES and any(_private(p) for p in parts[1:]):
            touches.append(f"{path}:{node.lineno} imports {name}")
      elif isinstance(node, ast.ClassDef):
        inherited = _private_names_of(_library_classes_above(path, node.name))
        for inner in ast.walk(node):
          if (isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name)
              and inner.value.id in ("self", "cls") and inner.attr in inherited):
            touches.append(f"{path}:{inner.lineno} {node.name} uses its library base's {inner.attr}")
          elif isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.name in inherited:
            touches.append(f"{path}:{inner.lineno} {node.name} overrides its library base's {inner.name}")
      elif (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr in library_names
            and node.attr not in ours
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
        touches.append(f"{path}:{node.lineno} reads .{node.attr}")
  return sorted(set(touches))


def test_the_private_name_finder_finds_each_kind_of_touch():
  module = PACKAGE / "rl" / "_seam_probe_for_test.py"
  module.write_text(
      "from jax._src import distributed\n"
      "from tunix.rl.grpo import grpo_learner\n"
      "class L(grpo_learner.GRPOLearner):\n"
      "  def _generate_and_compute_advantage(self, training_input, mode):\n"
      "    return self._rollout_micro_batch_size\n"
      "def f(attention):\n"
      "  return attention._query_norm\n")
  try:
    found = private_touches(only="rl/_seam_probe_for_test.py")
  finally:
    module.unlink()
  assert [t.split(":", 1)[1] for t in found] == [
      "1 imports jax._src.distributed",
      "4 L overrides its library base's _generate_and_compute_advantage",
      "5 L uses its library base's _rollout_micro_batch_size",
      "7 reads ._query_norm",
  ]


def test_no_module_outside_the_seam_touches_a_private_name_of_tunix_qwix_flax_or_jax():
  touches = private_touches()
  assert not touches, "\n".join(touches)
