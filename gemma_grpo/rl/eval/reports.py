"""An eval.json report read back, printed as a table, and set beside another."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from gemma_grpo import errors
from gemma_grpo.rl.eval import scoring


def read_report(path: pathlib.Path) -> dict:
  """The eval.json of an eval output directory (or the file itself), checked."""
  file = path / scoring.SUMMARY_FILE if path.is_dir() else path
  try:
    report = json.loads(file.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise errors.UserError(f"--compare {path}: cannot read {file} ({e})") from None
  if not isinstance(report.get("metrics"), dict):
    raise errors.UserError(f"--compare {path}: {file} has no metrics; is it a gemma-grpo eval.json?")
  return report


def is_report(path: pathlib.Path) -> bool:
  """An eval output directory (with eval.json) or a .json file."""
  return ((path.is_dir() and (path / scoring.SUMMARY_FILE).is_file())
          or (path.is_file() and path.suffix == ".json"))


def read_samples(path: pathlib.Path) -> list[dict] | None:
  """The samples.jsonl beside a baseline's eval.json, if there is one."""
  file = (path if path.is_dir() else path.parent) / scoring.SAMPLES_FILE
  if not file.is_file():
    return None
  return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def format_value(name: str, value: Any) -> str:
  if value is None:
    return "-"
  if name.startswith("num_"):
    return str(int(value))
  if name.startswith("mean_length"):
    return f"{value:.1f}"
  return f"{value:.4f}"


def format_delta(name: str, base: Any, value: Any) -> str:
  if base is None or value is None:
    return "-"
  delta = value - base
  if name.startswith("num_"):
    return f"{int(delta):+d}"
  return f"{delta:+.1f}" if name.startswith("mean_length") else f"{delta:+.4f}"


def table(metrics: dict[str, float], base: dict[str, float] | None = None,
          base_label: str = "base") -> str:
  """metric | value, or metric | base | this run | delta."""
  names = list(metrics) + [n for n in (base or {}) if n not in metrics]
  if base is None:
    rows = [("metric", "value")] + [(n, format_value(n, metrics[n])) for n in names]
  else:
    rows = [("metric", base_label, "this run", "delta")] + [
        (n, format_value(n, base.get(n)), format_value(n, metrics.get(n)),
         format_delta(n, base.get(n), metrics.get(n))) for n in names]
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
           for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def setting_differences(base: dict, report: dict) -> list[str]:
  """Settings under which two reports are not comparable."""
  keys = (("data", ("source", "split", "num_test", "num_problems", "max_prompt_length")),
          ("decoding", ("mode", "num_samples", "max_new_tokens", "temperature", "top_p", "top_k")),
          ("rewards", ("preset",)))
  diffs = []
  for section, names in keys:
    a, b = base.get("settings", {}).get(section, {}), report["settings"][section]
    diffs += [f"{section}.{n} {a.get(n)!r} vs {b.get(n)!r}" for n in names if a.get(n) != b.get(n)]
  return diffs
