"""gemma-grpo: teach Gemma-3 to reason with GRPO on verifiable math, on Tunix.

The package is in layers, each a subpackage that imports only those below it
(docs/architecture.md; tests/test_architecture.py enforces it):
`commands` (and `api`), `rl`, `model`, `tasks`, `runtime`, and at the bottom
`config`, `errors`, `seam` and `user_code`.
"""

__version__ = "0.1.0"
