"""MkDocs hooks: the pages that are generated from the code at build time, so they cannot drift.

- docs/configuration.md: `<!-- generated: config keys -->` becomes every key of
  gemma_grpo/config/defaults.py with its default and the comment that documents it.
- docs/troubleshooting.md: `<!-- generated: error catalogue -->` becomes every
  one-line `error:` message the package can raise for bad input.

tests/test_docs.py calls the same functions.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG_MARKER = "<!-- generated: config keys -->"
ERRORS_MARKER = "<!-- generated: error catalogue -->"
_ASSIGN = re.compile(r"^\s*c\.([\w.]+)\s*=\s*(.*)$")


DEFAULTS = REPO / "gemma_grpo" / "config" / "defaults.py"


def _load_defaults(path: pathlib.Path):
  spec = importlib.util.spec_from_file_location("_docs_config_defaults", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.defaults()


def _flatten(config, prefix: str = "") -> list[tuple[str, object]]:
  rows = []
  for key in config.keys():
    value = config[key] if not hasattr(config, "_fields") else config._fields[key]  # pylint: disable=protected-access
    name = f"{prefix}{key}"
    if hasattr(value, "keys") and len(value.keys()) > 0:  # a section or a dict of values
      rows += _flatten(value, name + ".")
    else:
      rows.append((name, value))
  return rows


def key_comments(source: str) -> dict[str, str]:
  """`section.key` -> its comment: the comment lines just above the assignment and the one after it."""
  comments, above = {}, []
  for line in source.splitlines():
    stripped = line.strip()
    if stripped.startswith("#"):
      above.append(stripped.lstrip("#").strip())
      continue
    match = _ASSIGN.match(line)
    if match:
      inline = match.group(2).split("  # ", 1)[1].strip() if "  # " in match.group(2) else ""
      comments[match.group(1)] = " ".join(filter(None, [*above, inline]))
    above = []
  return comments


def _default(value) -> str:
  if hasattr(value, "default") and hasattr(value, "field_type"):  # a placeholder
    value = value.default
  if hasattr(value, "keys"):
    value = dict(value)
  text = repr(value)
  if len(text) > 60:
    text = text[:57] + "..."
  return text.replace("|", "\\|")


def config_keys(path: pathlib.Path = DEFAULTS) -> list[tuple[str, str, str]]:
  """(key, default, meaning) for every key of the defaults, in file order."""
  comments = key_comments(path.read_text())
  rows = []
  for key, value in _flatten(_load_defaults(path)):
    parts = key.split(".")
    meaning, owner = "", key
    for n in range(len(parts), 0, -1):  # a dict's entries share the comment of the dict
      owner = ".".join(parts[:n])
      if comments.get(owner):
        meaning = comments[owner]
        break
    if meaning and owner != key:
      meaning = f"(`{owner}`) {meaning}"
    rows.append((key, _default(value), meaning))
  order = {key: i for i, key in enumerate(comments)}  # file order, sections first
  def position(row):
    parts = row[0].split(".")
    for n in range(len(parts), 0, -1):
      if ".".join(parts[:n]) in order:
        return (order[parts[0]] if parts[0] in order else 0, order[".".join(parts[:n])], row[0])
    return (len(order), len(order), row[0])
  return sorted(rows, key=position)


def config_page(path: pathlib.Path = DEFAULTS) -> str:
  out, section = [], None
  for key, default, meaning in config_keys(path):
    top = key.split(".", 1)[0]
    if top != section:
      section = top
      out += ["", f"## `{top}`", "", "| key | default | meaning |", "| --- | --- | --- |"]
    meaning = meaning.replace("|", "\\|").replace("<", "&lt;")
    out.append(f"| `{key}` | `{default}` | {meaning} |")
  return "\n".join(out).strip() + "\n"


def _template(node: ast.AST) -> str | None:
  """The text of a message expression, formatted values shown as {expr}; None if not literal."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return node.value
  if isinstance(node, ast.JoinedStr):
    parts = []
    for value in node.values:
      if isinstance(value, ast.Constant):
        parts.append(str(value.value))
      else:
        parts.append("{" + ast.unparse(value.value) + "}")
    return "".join(parts)
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
    left, right = _template(node.left), _template(node.right)
    return None if left is None or right is None else left + right
  return None


def _is_user_error(call: ast.Call) -> bool:
  func = call.func
  name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
  return name == "UserError"


def _is_config_problem(call: ast.Call) -> bool:
  func = call.func
  return (isinstance(func, ast.Attribute) and func.attr == "append"
          and isinstance(func.value, ast.Name) and func.value.id == "problems")


def error_messages(package: pathlib.Path = REPO / "gemma_grpo") -> list[tuple[str, int, str]]:
  """(module path, line, message template) for every literal UserError message and config problem."""
  found = []
  for path in sorted(package.rglob("*.py")):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
      if isinstance(node, ast.Call) and node.args and (_is_user_error(node) or _is_config_problem(node)):
        text = _template(node.args[0])
        if text and text.strip():
          found.append((str(path.relative_to(REPO)), node.lineno, " ".join(text.split())))
  return sorted(found)


def error_page(package: pathlib.Path = REPO / "gemma_grpo") -> str:
  out, module = [], None
  for path, _, text in error_messages(package):
    if path != module:
      module = path
      out += ["", f"### `{path}`", ""]
    out.append(f"- `` error: {text.replace('`', chr(39))} ``")
  return "\n".join(out).strip() + "\n"


def on_page_markdown(markdown: str, page, config, files):  # pylint: disable=unused-argument
  """MkDocs hook: fill in the generated parts of a page."""
  if CONFIG_MARKER in markdown:
    markdown = markdown.replace(CONFIG_MARKER, config_page())
  if ERRORS_MARKER in markdown:
    markdown = markdown.replace(ERRORS_MARKER, error_page())
  return markdown
