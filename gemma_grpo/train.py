"""`python -m gemma_grpo.train --config FILE`: the training command.

The command itself is gemma_grpo.commands.train; this file keeps the entry
point the launch scripts and every config's docstring name.
"""

import sys

from gemma_grpo.commands.train import main

if __name__ == "__main__":
  sys.exit(main())
