"""PNG curves of a run: `gemma-grpo plot WORKDIR` -> WORKDIR/plots/*.png.

Reads <workdir>/tensorboard/metrics.jsonl (one row per step) and draws the
curves that tell whether GRPO training is healthy: rewards (total and per
function), completion length and truncation, policy entropy, KL to the
reference, clip fractions and the policy ratio (they leave 0 and 1 only with
several updates per batch, grpo.num_iterations > 1), rollout throughput and
step time, and held-out accuracy when the run evaluated. Noisy per-step
series are drawn faint with a moving average on top (gemma_grpo.runtime.curves).
"""

from __future__ import annotations

import argparse
import sys

from gemma_grpo import errors

def main(argv: list[str] | None = None) -> int:
  """`gemma-grpo plot WORKDIR`."""
  parser = argparse.ArgumentParser(prog="gemma-grpo plot", description=__doc__.splitlines()[0])
  parser.add_argument("workdir", help="a training run's work directory")
  args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
  with errors.exit_on_user_error():
    # matplotlib takes a second to import: only once the arguments parse.
    from gemma_grpo.runtime import curves  # pylint: disable=g-import-not-at-top

    for path in curves.write_plots(args.workdir):
      print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
