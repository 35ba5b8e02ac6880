"""`gemma-grpo <command> ...`: dispatch only; each command lives in its module."""

from __future__ import annotations

import importlib
import sys

# command -> (module with `main(argv) -> int`, one-line help)
COMMANDS = {
    "train": ("gemma_grpo.commands.train", "GRPO-train Gemma-3 (python -m gemma_grpo.train)"),
    "eval": ("gemma_grpo.commands.evaluate", "evaluate a model or a training run on held-out problems"),
    "export": ("gemma_grpo.commands.export", "merge LoRA into Hugging Face safetensors or GGUF"),
    "sft": ("gemma_grpo.commands.sft", "supervised warm start on worked solutions"),
    "plot": ("gemma_grpo.commands.plots", "PNG curves of a run's metrics"),
    "plan": ("gemma_grpo.plan.command", "compile a config for a TPU/GPU slice: fits? how fast?"),
}


def usage() -> str:
  lines = ["usage: gemma-grpo <command> [options]", "", "commands:"]
  lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
  lines += ["", "`gemma-grpo <command> --help` for a command's options."]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return 0
  name, rest = argv[0], argv[1:]
  if name not in COMMANDS:
    print(f"error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
    return 2
  module = importlib.import_module(COMMANDS[name][0])
  return module.main(rest) or 0


if __name__ == "__main__":
  sys.exit(main())
