"""README.md and the documentation site (docs/, mkdocs.yml): every example is true.

Each fenced `python` or `bash` block in README.md and in the pages of the
site's nav carries a comment on the line above saying how it is checked:

  <!-- docs-test: python -->            the block runs (configs/gemma3_270m.py -> configs/tiny.py)
  <!-- docs-test: tests/test_journey.py ... -->   that test runs it (README's From Python example)
  <!-- docs-test: flags ... -->         every `gemma-grpo ...` and `python -m gemma_grpo.train ...`
                                        command is parsed by its own CLI, and its config with
                                        every override is loaded and validated, up to the point
                                        where it would load a model; installs (pip, npm) and
                                        `pytest` must be the ones .ci/run runs
  <!-- docs-test: dry-run ... -->       each launch/*.sh line runs with --dry-run (gcloud, sbatch
                                        and ssh commands printed, not run)
  <!-- docs-test: skip, REASON -->      not runnable in a test, and why

`text` blocks (consoles, file trees) are output, not commands. The generated
pages (configuration keys, error catalogue) are checked against the code here
too: docs/hooks.py makes them at build time.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO
from conftest import run_python

sys.path.insert(0, str(REPO / "docs"))
import hooks  # pylint: disable=g-import-not-at-top,wrong-import-position

MARKER = re.compile(r"<!-- docs-test: (.*?) -->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
KINDS = ("python", "tests/test_journey.py", "flags", "dry-run", "skip")


def nav_pages() -> list[pathlib.Path]:
  """README.md and every page of mkdocs.yml's nav that is not the dated history."""
  nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M)
  pages = [REPO / "docs" / p for p in nav if not p.startswith("benchmarks/")]
  return [REPO / "README.md", *pages]


def blocks() -> list[tuple[str, int, str, str, str]]:
  """(file, line, language, marker, code) for every fenced block of the checked pages."""
  out = []
  for path in nav_pages():
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
      fence = FENCE.match(lines[i])
      if not fence:
        i += 1
        continue
      start, language = i, fence.group(1)
      end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
      marker = MARKER.match(lines[start - 1]) if start else None
      out.append((str(path.relative_to(REPO)), start + 1, language,
                  marker.group(1) if marker else "", "\n".join(lines[start + 1:end]) + "\n"))
      i = end + 1
  return out


def blocks_of(kind: str) -> list[tuple[str, int, str, str, str]]:
  return [b for b in blocks() if b[3].startswith(kind)]


def _id(block) -> str:
  return f"{block[0]}:{block[1]}"


def test_every_code_block_has_a_language_and_says_how_it_is_checked():
  unmarked = []
  for path, line, language, marker, _ in blocks():
    if not language:
      unmarked.append(f"{path}:{line}: a fence without a language (python, bash or text)")
    elif language in ("python", "bash", "sh"):
      if not marker.startswith(KINDS):
        unmarked.append(f"{path}:{line}: no <!-- docs-test: {' | '.join(KINDS)} --> above it")
      elif marker.startswith("skip") and len(marker.split(",", 1)[-1].strip()) < 10:
        unmarked.append(f"{path}:{line}: a skip needs its reason: <!-- docs-test: skip, WHY -->")
    elif language != "text":
      unmarked.append(f"{path}:{line}: language {language!r}; use python, bash or text")
  assert not unmarked, "\n".join(unmarked)
  assert len(blocks_of("flags")) >= 8 and blocks_of("python")


def test_readme_starts_with_the_install_and_train_command_and_the_test_command():
  first = next(b for b in blocks() if b[0] == "README.md")
  commands = [line for line in first[4].splitlines() if line and not line.startswith("#")]
  assert commands == [
      "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
      "python -m gemma_grpo.train --config configs/gemma3_270m.py",
      "pip install -e '.[test,plan]' && npm ci --prefix tests/llama_cpp && pytest -q -n 2",
  ]
  assert len((REPO / "README.md").read_text().splitlines()) <= 200
  assert len((REPO / "BENCHMARKS.md").read_text().splitlines()) <= 250


def test_the_api_example_of_the_docs_is_the_one_the_journey_runs():
  import test_api  # pylint: disable=g-import-not-at-top

  examples = blocks_of("tests/test_journey.py")
  assert len(examples) >= 2
  for block in examples:
    assert block[4] == test_api.readme_example(), _id(block)


@pytest.mark.parametrize("block", blocks_of("python"), ids=_id)
def test_python_blocks_run(block, tmp_path):
  code = block[4].replace("configs/gemma3_270m.py", str(REPO / "configs/tiny.py"))
  # A config file's example is checked as a config: get_config() validates.
  code += ("\nif 'get_config' in globals():\n"
           "  from gemma_grpo import config as _config_lib\n"
           "  _config_lib.validate(get_config())\n")
  run_python(code, cwd=tmp_path)


class _Checked(Exception):
  """Raised where a command would start real work: everything before it was checked."""


def _commands(code: str) -> list[list[str]]:
  """The commands of a shell block: continuations joined, comments dropped, split at &&."""
  text = code.replace("\\\n", " ")
  out = []
  for line in text.splitlines():
    line = re.sub(r"\s#\s.*$", "", line).strip()
    if not line or line.startswith("#"):
      continue
    out += [shlex.split(part) for part in line.split("&&")]
  return out


def _ci_script() -> str:
  return (REPO / ".ci" / "run").read_text()


def check_command(argv: list[str], monkeypatch) -> None:
  """Parses ARGV as its CLI would and validates its config; stops before any model loads."""
  if argv[:3] == ["python", "-m", "gemma_grpo.train"]:
    name, rest = "train", argv[3:]
  elif argv[0] == "gemma-grpo":
    name, rest = argv[1], argv[2:]
  else:
    raise AssertionError(f"not a gemma-grpo command: {shlex.join(argv)}")
  from gemma_grpo.commands import cli  # pylint: disable=g-import-not-at-top
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top

  assert name in cli.COMMANDS, argv
  module = importlib.import_module(cli.COMMANDS[name][0])
  validate = config_lib.validate

  def validated(c, *args, **kwargs):
    validate(c, *args, **kwargs)
    raise _Checked

  monkeypatch.setattr(config_lib, "validate", validated)
  if name in ("eval", "export", "plot"):  # flags first; their configs load with the model
    parse_known = argparse.ArgumentParser.parse_known_args

    def parsed(self, args=None, namespace=None):
      known, extra = parse_known(self, args, namespace)
      assert all(e.startswith("--config.") for e in extra), f"unknown flags {extra} in {argv}"
      raise _Checked

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parsed)
  with pytest.raises(_Checked):
    try:
      module.main(rest)
    except SystemExit as e:
      raise AssertionError(f"{shlex.join(argv)} exited {e.code} before it would start") from e


@pytest.mark.parametrize("block", blocks_of("flags"), ids=_id)
def test_shell_commands_parse_and_their_configs_validate(block, monkeypatch, tmp_path):
  monkeypatch.chdir(REPO)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # The placeholder a reader replaces with their copy of GSM8K: here, files in its format.
  gsm8k = tmp_path / "gsm8k"
  gsm8k.mkdir()
  for split in ("train", "test"):
    (gsm8k / f"{split}.jsonl").write_text('{"question": "1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n')
  commands = _commands(block[4].replace("/path/to/gsm8k", str(gsm8k)))
  assert commands, _id(block)
  for argv in commands:
    if argv[0] == "pip":
      assert argv[:3] == ["pip", "install", "-e"], argv
      extras = re.fullmatch(r"\.(?:\[([\w,]+)\])?", argv[3])[1] or ""
      for extra in filter(None, extras.split(",")):
        assert f"\n{extra} = [" in (REPO / "pyproject.toml").read_text(), extra
      ci_extras = re.search(r"-e '\.\[([\w,]+)\]'", _ci_script())[1].split(",")
      assert set(filter(None, extras.split(","))) <= set(ci_extras), (argv, ci_extras)
    elif argv[0] in ("pytest", "npm"):
      assert shlex.join(argv) in _ci_script(), argv
    elif argv[:2] in (["python3", "-m"], [".", ".venv/bin/activate"]):
      assert argv in (["python3", "-m", "venv", ".venv"], [".", ".venv/bin/activate"]), argv
    else:
      check_command(argv, monkeypatch)


@pytest.mark.parametrize("block", blocks_of("dry-run"), ids=_id)
def test_launch_commands_run_as_dry_runs(block, tmp_path):
  env = {**os.environ, "HOME": str(tmp_path)}
  for argv in _commands(block[4]):
    if argv[0] == "export":
      env.update(a.split("=", 1) for a in argv[1:])
      continue
    assert argv[0].startswith("launch/"), argv
    argv = [re.sub(r"\$(\w+)", lambda m: env[m[1]], a) for a in argv]
    proc = subprocess.run([*argv, "--dry-run"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])


def test_the_one_line_error_shown_in_troubleshooting_is_the_real_one():
  from gemma_grpo import api  # pylint: disable=g-import-not-at-top
  from gemma_grpo import errors  # pylint: disable=g-import-not-at-top

  page = (REPO / "docs" / "troubleshooting.md").read_text()
  shown = re.search(r"```text\n(error: .*)\n```", page)[1]
  with pytest.raises(errors.UserError) as e:
    api.load_config(str(REPO / "configs/gemma3_270m.py"), {"train.max_stepz": 2})
  assert shown == f"error: --config.{str(e.value).split('--config.', 1)[1]}"


def test_troubleshooting_rows_name_messages_the_code_prints():
  page = (REPO / "docs" / "troubleshooting.md").read_text()
  source = "\n".join(p.read_text() for p in (REPO / "gemma_grpo").rglob("*.py"))
  rows = re.findall(r"^\| `([^`]+)` \|", page, re.M)
  assert len(rows) >= 8
  for row in rows:
    fragments = [f.strip() for f in re.split(r"<[^>]+>|\.\.\.|\b[A-Z]\b", row.removeprefix("error: "))]
    for fragment in filter(lambda f: len(f) >= 4, fragments):
      assert fragment in source, (row, fragment)


def test_error_catalogue_lists_the_config_and_workdir_errors():
  messages = [text for _, _, text in hooks.error_messages()]
  assert len(messages) > 80
  assert any("unknown key" in m for m in messages)
  assert any(m.startswith("--workdir") for m in messages)
  page = hooks.error_page()
  assert page.count("- `` error: ") == len(messages)


def _default_keys() -> set[str]:
  from gemma_grpo import config  # pylint: disable=g-import-not-at-top

  def walk(c, prefix=""):
    for key in c.keys():
      value = c._fields[key] if hasattr(c, "_fields") else c[key]  # pylint: disable=protected-access
      if hasattr(value, "keys") and len(value.keys()):
        yield from walk(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}"

  return set(walk(config.defaults()))


def test_configuration_page_lists_every_key_of_the_defaults_with_its_comment():
  rows = hooks.config_keys()
  assert {key for key, _, _ in rows} == _default_keys()
  meaning = {key: text for key, _, text in rows}
  assert meaning["grpo.beta"] == "KL (k3) weight to the reference policy; 0 disables it"
  assert meaning["lora.alpha"] == "update scale is alpha / r"
  assert meaning["rewards.weights.answer_correct"].startswith("(`rewards.weights`) Per-function weights")
  assert "<!-- generated: config keys -->" in (REPO / "docs" / "configuration.md").read_text()


def test_a_key_added_to_the_defaults_appears_on_the_page_with_its_comment(tmp_path):
  defaults = (REPO / "gemma_grpo" / "config" / "defaults.py").read_text()
  changed = defaults.replace("  c.lock()", "  # Seconds a run may take; 0 = no limit.\n"
                                       "  c.train.time_limit = 0.0\n  c.lock()")
  (tmp_path / "defaults.py").write_text(changed)
  page = hooks.config_page(tmp_path / "defaults.py")
  assert "| `train.time_limit` | `0.0` | Seconds a run may take; 0 = no limit. |" in page
