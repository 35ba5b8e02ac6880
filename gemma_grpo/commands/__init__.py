"""The command line: one module per `gemma-grpo` command, and the scaffold they share."""
