"""The package's import graph: layers that only point down.

Read from the source (every `import`, module-level or inside a function,
since a function-local import is as real a dependency as any), so a cycle is
caught even where no test happens to import the modules in a bad order.
"""

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gemma_grpo"

# The layers, top first: a module imports only from its own layer or below.
# Each layer is a subpackage (or, at the bottom and the top, a few modules).
LAYERS = (
    ("api", "train", "commands", "plan"),  # front ends: the CLI, its entry point, the Python API
    ("rl", "sft"),  # RL (its homes below) and, beside it, supervised fine-tuning
    ("model",),  # Gemma-3 for RL, loading, the tokenizer, LoRA, a run's policy
    ("tasks",),  # problems, prompts, answers, rewards, tools, scores
    ("runtime",),  # mesh, processes, storage, the lease, checkpoints, metrics
    ("config", "errors", "seam", "storage", "user_code"),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}

# Inside that layer, each job has one home, and a home imports only the homes
# named here: a run drives the learner, the engine and the eval; the eval
# decodes with the engine; the engine and the learner import no other home,
# so either can be read, tested and changed without the rest. SFT shares the
# log-prob maths and the optimizer and trainers with RL, and RL imports no SFT.
HOMES = {
    "rl.run": {"rl.learner", "rl.engine", "rl.eval"},  # training_run, cluster, step_hooks, trainers, optim
    "rl.eval": {"rl.engine"},  # evaluation, generation, scoring, heldout, targets, reports, problem_sets
    "rl.engine": set(),  # rollout, continuous, decode_layers, decode_dots, lm_head_screen, sampling, multi_turn
    "rl.learner": set(),  # learner, losses, logprobs, algorithms, dynamic_sampling, batch_logps, ...
    "sft": {"rl.learner", "rl.run"},
}


def module_name(path: pathlib.Path) -> str:
  """rl.run.optim for gemma_grpo/rl/run/optim.py; rl.run for gemma_grpo/rl/run/__init__.py."""
  parts = path.relative_to(PACKAGE).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _ours(dotted: str) -> str | None:
  """rl.run.optim for gemma_grpo.rl.run.optim (or gemma_grpo.rl.run.optim.optimizer); None if not ours."""
  if not dotted.startswith("gemma_grpo."):
    return None
  parts = dotted.split(".")[1:]
  for n in range(len(parts), 0, -1):
    candidate = PACKAGE.joinpath(*parts[:n])
    if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
      return ".".join(parts[:n])
  return parts[0]


def imports_of(path: pathlib.Path) -> set[str]:
  """Names (rl.learner, config, ...) of the gemma_grpo modules that `path` imports anywhere."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gemma_grpo":
      for alias in node.names:
        found.add(_ours(f"{node.module}.{alias.name}") or _ours(node.module))
    elif isinstance(node, ast.Import):
      found.update(_ours(a.name) for a in node.names if a.name.startswith("gemma_grpo."))
  found.discard(None)
  return found - {module_name(path)}


def graph() -> dict[str, set[str]]:
  return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")
          if module_name(p)}


def layer(module: str) -> int:
  return LAYER_OF[module.split(".")[0]]


def home(module: str) -> str | None:
  """rl.run for rl.run.optim, sft for sft.sft; None outside the homes of HOMES."""
  return next((h for h in HOMES if module == h or module.startswith(h + ".")), None)


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


def test_imports_of_reads_every_form_of_import(tmp_path):
  source = PACKAGE / "rl" / "_probe_for_test.py"
  source.write_text("def f():\n  from gemma_grpo.model import lora\n  import gemma_grpo.runtime.mesh\n"
                    "from gemma_grpo import config\nfrom gemma_grpo.tasks.rewards import from_config\n")
  try:
    assert imports_of(source) == {"model.lora", "runtime.mesh", "config", "tasks.rewards"}
  finally:
    source.unlink()


def test_every_module_is_in_a_layer():
  edges = graph()
  assert len(edges) > 40  # the package was read
  assert not [m for m in edges if m.split(".")[0] not in LAYER_OF]


def test_no_module_of_the_package_imports_itself_back():
  edges = graph()
  assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_imports_point_down_the_layers():
  upward = sorted(f"{m} -> {t}" for m, targets in graph().items() for t in targets
                  if layer(t) < layer(m))
  assert not upward, f"imports that point up the layers: {upward}"


def test_every_module_of_the_rl_layer_has_a_home():
  """rl/ holds its four homes and nothing loose beside them."""
  layer_modules = [m for m in graph() if m.split(".")[0] in ("rl", "sft")
                   and not m.rpartition(".")[2].startswith("_")]  # the probes other tests write
  assert not [m for m in layer_modules if m not in ("rl", "sft") and home(m) is None]
  assert {home(m) for m in layer_modules} - {None} == set(HOMES)


def test_homes_import_only_the_homes_they_may():
  crossing = sorted(f"{m} -> {t}" for m, targets in graph().items() for t in targets
                    if home(m) and home(t) and home(t) != home(m) and home(t) not in HOMES[home(m)])
  assert not crossing, f"imports between homes that HOMES does not allow: {crossing}"


def test_the_home_check_finds_a_forbidden_import():
  assert home("rl.engine.rollout") == "rl.engine" and home("rl.eval") == "rl.eval"
  assert home("sft.sft") == "sft" and home("rl") is None and home("tasks.data") is None
  assert "rl.learner" not in HOMES["rl.engine"] and "rl.run" not in HOMES["rl.eval"]


def test_only_the_command_line_imports_a_command():
  """The Python API and the planner are front ends beside the CLI, not above it."""
  for module, targets in graph().items():
    if not module.startswith("commands") and module != "train":
      assert not {t for t in targets if t.startswith("commands")}, module


def test_config_is_data_and_imports_nothing_of_the_trainer():
  paths = list((PACKAGE / "config").rglob("*.py"))
  assert len(paths) > 3
  for path in paths:  # storage: configs on gs://
    assert {m for m in imports_of(path) if m.split(".")[0] != "config"} <= {"errors", "storage"}, path


# --- Typed settings below the commands ------------------------------------------
# The front ends turn the user's ConfigDict into config.settings' frozen
# dataclasses; every module below them takes the slice it needs and never
# reads a ConfigDict (a function's signature then says what it depends on).
READS_CONFIG_DICTS = ("api", "train", "commands", "plan", "config")


def config_dict_uses(path: pathlib.Path) -> list[str]:
  """`line: what` for each import of ml_collections and each ConfigDict annotation in `path`."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found += [f"{node.lineno}: import {a.name}" for a in node.names
                if a.name.split(".")[0] == "ml_collections"]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ml_collections":
      found.append(f"{node.lineno}: from {node.module} import ...")
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      args = node.args
      for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if arg is not None and arg.annotation is not None and "ConfigDict" in ast.unparse(arg.annotation):
          found.append(f"{arg.lineno}: {node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
      if node.returns is not None and "ConfigDict" in ast.unparse(node.returns):
        found.append(f"{node.lineno}: {node.name}() -> {ast.unparse(node.returns)}")
  return found


def test_no_module_below_the_front_ends_reads_a_config_dict():
  below = [p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p).split(".")[0] not in READS_CONFIG_DICTS]
  assert len(below) > 40
  uses = [f"{p.relative_to(PACKAGE)}:{use}" for p in below for use in config_dict_uses(p)]
  assert not uses, "take a config.settings slice instead of a ConfigDict:\n" + "\n".join(uses)


def test_the_config_dict_check_finds_each_form(tmp_path):
  source = tmp_path / "probe.py"
  source.write_text("import ml_collections\nfrom ml_collections import config_dict\n"
                    "def f(c: ml_collections.ConfigDict, *, d: 'ConfigDict | None' = None): ...\n"
                    "def g(x: int) -> ml_collections.ConfigDict: ...\ndef h(c): ...\n")
  assert config_dict_uses(source) == [
      "1: import ml_collections", "2: from ml_collections import ...",
      "3: f(c: ml_collections.ConfigDict)", "3: f(d: 'ConfigDict | None')",
      "4: g() -> ml_collections.ConfigDict"]


def architecture_map() -> list[set[str]]:
  """The layer map of docs/architecture.md: the names on each line, top line first."""
  page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
  block = page.split("own line or below", 1)[1].split("```", 2)[1].removeprefix("text")
  return [set(line.split(None, 1)[1].replace(",", " ").replace("/", "").split())
          for line in block.strip().splitlines()]


def test_the_architecture_page_draws_these_layers():
  assert architecture_map() == [set(names) for names in LAYERS]


def architecture_homes() -> dict[str, set[str]]:
  """The directions of docs/architecture.md: each home and the homes it may import."""
  page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
  block = page.split("imports only the homes", 1)[1].split("```", 2)[1].removeprefix("text")
  drawn = {}
  for line in block.strip().splitlines():
    source, _, targets = line.partition("->")
    names = lambda text: {n.strip("/").replace("/", ".") for n in text.replace(",", " ").split()
                          if n != "nothing"}
    drawn[source.strip().strip("/").replace("/", ".")] = names(targets)
  return drawn


def test_the_architecture_page_draws_these_homes():
  assert architecture_homes() == HOMES


def test_no_module_is_over_500_lines():
  long = {module_name(p): n for p in PACKAGE.rglob("*.py")
          if (n := len(p.read_text().splitlines())) > 500}
  assert not long, long


# Third-party packages whose import takes 0.1 s to seconds here (JAX and what
# builds on it, plotting, symbolic math): the commands import them only once the
# input has been checked, so `--help` and bad input answer in a fraction of a
# second (tests/test_train.py times it).
DEFERRED = ("jax", "flax", "tunix", "qwix", "orbax", "optax", "grain", "transformers", "torch",
            "matplotlib", "tensorboardX", "sympy", "math_verify", "ml_dtypes", "reasoning_gym",
            "pyarrow", "gguf")


def is_command(module: str) -> bool:
  """The modules that may defer imports: a CLI command, and the entry point to one."""
  return module.split(".")[0] == "commands" or module in ("plan.command", "train")


def _imported_names(node) -> list[str]:
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if (node.module or "").split(".")[0] in ("gemma_grpo", "configs"):
    return [f"{node.module}.{a.name}" for a in node.names]
  return [node.module]


def _module_level_imports(path: pathlib.Path) -> list[str]:
  return [name for node in ast.parse(path.read_text()).body
          if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _imported_names(node)]


def heavy_modules() -> set[str]:
  """gemma_grpo modules whose import (at module level, transitively) pulls in a DEFERRED package."""
  top = {module_name(p): _module_level_imports(p) for p in PACKAGE.rglob("*.py")}
  heavy: set[str] = set()
  while True:
    more = {m for m, names in top.items() if m not in heavy and any(
        n.split(".")[0] in DEFERRED or _ours(n) in heavy
        for n in names)}
    if not more:
      return heavy
    heavy |= more


def function_local_imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line number, source line) of each import inside a function of `path`."""
  lines = path.read_text().splitlines()
  found = set()
  for function in ast.walk(ast.parse("\n".join(lines))):
    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
      found |= {(node.lineno, lines[node.lineno - 1].strip()) for node in ast.walk(function)
                if isinstance(node, (ast.Import, ast.ImportFrom))}
  return sorted(found)


# A module that defers the same imports in several functions says why once, at
# its top level: `# Deferred imports (jax, gemma_grpo.seam.jax_distributed): <reason>`.
_MODULE_DEFERRAL = re.compile(r"^# Deferred imports \(([^)]+)\): \S")


def deferred_by_the_module(lines: list[str]) -> set[str]:
  """The names a module-level `# Deferred imports (names): reason` comment covers."""
  return {name.strip() for line in lines if (match := _MODULE_DEFERRAL.match(line))
          for name in match.group(1).split(",")}


def _full_names(import_line: str) -> set[str]:
  """jax.experimental.multihost_utils for `from jax.experimental import multihost_utils`."""
  try:
    node = ast.parse(import_line.partition("#")[0].strip()).body[0]
  except (SyntaxError, IndexError):
    return set()
  if isinstance(node, ast.Import):
    return {a.name for a in node.names}
  return {f"{node.module}.{a.name}" for a in node.names}


def reason_for_deferring(lines: list[str], lineno: int) -> str | None:
  """The comment that says why the import on line `lineno` (1-based) is in a function.

  Either the line's own comment names an import cycle, or the comment line
  just above it (above the imports grouped with it) starts with "Deferred:",
  or the module's top-level `# Deferred imports (names): ...` names what it imports.
  """
  own = lines[lineno - 1].partition("#")[2]
  if "cycle" in own.lower():
    return own.strip()
  i = lineno - 2
  while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
    i -= 1
  above = lines[i].strip() if i >= 0 else ""
  if above.startswith("# Deferred:") or (above.startswith("#") and "cycle" in above.lower()):
    return above.lstrip("# ")
  declared = deferred_by_the_module(lines)
  names = _full_names(lines[lineno - 1])
  if names and all(any(n == d or n.startswith(d + ".") for d in declared) for n in names):
    return next(line for line in lines if _MODULE_DEFERRAL.match(line)).lstrip("# ")
  return None


def test_the_import_rule_reads_function_local_imports_and_their_reasons(tmp_path):
  source = tmp_path / "probe.py"
  source.write_text("import os\ndef f():\n  import jax\n  def g():\n    import json  # an import cycle: x\n"
                    "  # Deferred: seconds to import.\n  import sympy\n  from a import b\n")
  found = function_local_imports(source)
  assert [n for n, _ in found] == [3, 5, 7, 8]
  lines = source.read_text().splitlines()
  assert [reason_for_deferring(lines, n) for n, _ in found] == [
      None, "an import cycle: x", "Deferred: seconds to import.", "Deferred: seconds to import."]


def test_one_module_level_comment_explains_the_imports_it_names(tmp_path):
  source = tmp_path / "probe.py"
  source.write_text("# Deferred imports (jax, a.b): seconds to import.\ndef f():\n  import jax\n"
                    "def g():\n  from jax.experimental import multihost_utils\n"
                    "def h():\n  from a import b\n  import sympy\n")
  lines = source.read_text().splitlines()
  reasons = [reason_for_deferring(lines, n) for n, _ in function_local_imports(source)]
  assert reasons == ["Deferred imports (jax, a.b): seconds to import."] * 3 + [None]


def test_library_modules_import_at_the_top():
  """Only a command defers imports freely (it answers --help at once); a
  library module imports at its top, unless a comment says why not: the
  import cycle it breaks, `# Deferred: <reason>` on the line above, or one
  `# Deferred imports (names): <reason>` for the module."""
  late = []
  for path in sorted(PACKAGE.rglob("*.py")):
    if is_command(module_name(path)):
      continue
    lines = path.read_text().splitlines()
    late += [f"{path.relative_to(PACKAGE)}:{n} {line}" for n, line in function_local_imports(path)
             if reason_for_deferring(lines, n) is None]
  assert not late, "import these at module top (or say why not):\n" + "\n".join(late)


def test_commands_load_no_heavy_package_before_their_input_is_checked():
  heavy = heavy_modules()
  assert {"model.policy", "rl.run.cluster", "rl.engine.rollout"} <= heavy and not {"config", "errors"} & heavy
  commands = {module_name(p) for p in PACKAGE.rglob("*.py") if is_command(module_name(p))}
  assert {"commands.train", "commands.cli", "plan.command", "train"} <= commands
  assert not commands & heavy, sorted(commands & heavy)
