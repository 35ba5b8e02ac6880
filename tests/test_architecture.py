"""The package's import graph: layers that only point down.

Read from the source (every `import`, module-level or inside a function,
since a function-local import is as real a dependency as any), so a cycle is
caught even where no test happens to import the modules in a bad order.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gemma_grpo"
# The front ends, the CLI's commands and the Python API; nothing below may import them.
COMMANDS = {"train", "sft", "evaluate", "export", "plots", "cli", "api", "command"}


def imports_of(path: pathlib.Path) -> set[str]:
  """Names of the gemma_grpo modules that `path` imports anywhere."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module == "gemma_grpo":
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gemma_grpo."):
      found.add(node.module.split(".")[1])
    elif isinstance(node, ast.Import):
      found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("gemma_grpo."))
  return found - {path.stem}


def graph() -> dict[str, set[str]]:
  return {p.stem: imports_of(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """One import cycle as [a, b, ..., a], or None."""
  state = {}  # module -> "open" while on the path, "done" after

  def visit(module, path):
    state[module] = "open"
    for target in sorted(edges.get(module, ())):
      if state.get(target) == "open":
        return path[path.index(target):] + [target]
      if target not in state and (cycle := visit(target, path + [target])):
        return cycle
    state[module] = "done"
    return None

  for module in sorted(edges):
    if module not in state and (cycle := visit(module, [module])):
      return cycle
  return None


def test_the_graph_check_finds_a_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_of_reads_function_local_imports(tmp_path):
  source = tmp_path / "m.py"
  source.write_text("def f():\n  from gemma_grpo import lora\n  import gemma_grpo.mesh\n")
  assert imports_of(source) == {"lora", "mesh"}


def test_no_module_of_the_package_imports_itself_back():
  edges = graph()
  assert len(edges) > 20  # the package was read
  assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_library_modules_never_import_a_command():
  for module, targets in graph().items():
    if module not in COMMANDS:
      assert not targets & COMMANDS, (module, targets & COMMANDS)


def test_config_is_data_and_imports_nothing_of_the_trainer():
  assert imports_of(PACKAGE / "config.py") <= {"errors", "storage", "rewards"}


def readme_layers() -> list[set[str]]:
  """The module map of docs/architecture.md: one set of modules per line, top line first."""
  page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
  block = page.split("own line or below", 1)[1].split("```", 2)[1].removeprefix("text")
  return [set(line.split(None, 1)[1].replace(",", " ").split())
          for line in block.strip().splitlines()]


def test_the_module_map_names_every_module_once_and_matches_the_imports():
  layers = readme_layers()
  edges = graph()
  named = [m for layer in layers for m in layer]
  assert sorted(named) == sorted(edges), set(named) ^ set(edges)
  line_of = {m: i for i, layer in enumerate(layers) for m in layer}
  upward = [(m, t) for m, targets in edges.items() for t in targets if line_of[t] < line_of[m]]
  assert not upward, f"imports that point up docs/architecture.md's map: {upward}"


# Third-party packages whose import takes 0.1 s to seconds here (JAX and what
# builds on it, plotting, symbolic math): the CLI imports them only once the
# input has been checked, so bad input fails in a fraction of a second.
DEFERRED = ("jax", "flax", "tunix", "qwix", "orbax", "optax", "grain", "transformers", "torch",
            "matplotlib", "tensorboardX", "sympy", "math_verify", "ml_dtypes", "reasoning_gym",
            "pyarrow", "gguf")


def _imported_names(node) -> list[str]:
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if node.module in ("gemma_grpo", "configs"):
    return [f"{node.module}.{a.name}" for a in node.names]
  return [node.module]


def _module_level_imports(path: pathlib.Path) -> list[str]:
  return [name for node in ast.parse(path.read_text()).body
          if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _imported_names(node)]


def heavy_modules() -> set[str]:
  """gemma_grpo modules whose import (at module level, transitively) pulls in a DEFERRED package."""
  top = {p.stem: _module_level_imports(p) for p in PACKAGE.glob("*.py")}
  heavy: set[str] = set()
  while True:
    more = {m for m, names in top.items() if m not in heavy and any(
        n.split(".")[0] in DEFERRED or (n.startswith("gemma_grpo.") and n.split(".")[1] in heavy)
        for n in names)}
    if not more:
      return heavy
    heavy |= more


def test_function_local_imports_are_only_of_what_is_slow_to_import():
  heavy = heavy_modules()
  assert {"policy", "cluster", "rollout"} <= heavy and not {"config", "errors"} & heavy
  light = []
  for path in sorted(PACKAGE.glob("*.py")):
    for function in ast.walk(ast.parse(path.read_text())):
      if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(function):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          light += [f"{path.name}:{node.lineno} {name}" for name in _imported_names(node)
                    if name.split(".")[0] not in DEFERRED
                    and not (name.startswith("gemma_grpo.") and name.split(".")[1] in heavy)]
  assert not light, f"import these at module level: {light}"


def test_the_plan_package_sits_on_top_and_imports_only_downward():
  """gemma_grpo/plan (the `plan` command and its library) is above the trainer:
  it builds the trainer's programs, and no module of the trainer imports it."""
  for module, targets in graph().items():
    assert "plan" not in targets, module
  plan_dir = PACKAGE / "plan"
  for path in plan_dir.glob("*.py"):
    assert not imports_of(path) & (COMMANDS - {"command"}), path.name
