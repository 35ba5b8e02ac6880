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
  """The module map of README.md: one set of modules per line, top line first."""
  readme = (PACKAGE.parent / "README.md").read_text()
  block = readme.split("own line or below", 1)[1].split("```", 2)[1]
  return [set(line.split(None, 1)[1].replace(",", " ").split())
          for line in block.strip().splitlines()]


def test_readme_module_map_names_every_module_once_and_matches_the_imports():
  layers = readme_layers()
  edges = graph()
  named = [m for layer in layers for m in layer]
  assert sorted(named) == sorted(edges), set(named) ^ set(edges)
  line_of = {m: i for i, layer in enumerate(layers) for m in layer}
  upward = [(m, t) for m, targets in edges.items() for t in targets if line_of[t] < line_of[m]]
  assert not upward, f"imports that point up README's map: {upward}"
