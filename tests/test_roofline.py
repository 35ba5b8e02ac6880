"""bench/roofline.py's accounting: the bytes and FLOPs each phase must move or do."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

import roofline  # pylint: disable=g-import-not-at-top,wrong-import-position

# 1 layer, D=4, F=8, 2 heads of 2, 1 kv head, vocab 10; 1 prompt of 3 tokens, 2 rows, 2 new tokens.
SHAPE = roofline.Shape(layers=1, vocab=10, width=4, hidden=8, heads=2, head_dim=2, kv_heads=1,
                       prompts=1, rows=2, prompt_len=3, new_tokens=2)


def test_layer_params_count_every_projection_by_hand():
  # q 4x2x2 = 16, k and v 4x1x2 = 8 each, o 2x2x4 = 16, gate/up/down 4x8 = 32 each.
  assert roofline.layer_params(SHAPE) == 16 + 8 + 8 + 16 + 3 * 32


def test_accounting_by_hand():
  need = roofline.accounting(SHAPE)
  n = 144  # one layer's projections
  # Every weight (embedding as LM head included) once, plus (K + V) x head 2 of the
  # prompt's 3 slots once (its 2 rows share them) and of each row's 2 new slots.
  assert need["decode_bytes"] == 4 * (n + 10 * 4 + 2 * 1 * 2 * (1 * 3 + 2 * 2))
  attention = lambda q, k: 4 * 1 * 2 * 2 * q * k
  assert need["prefill_flops"] == 2 * n * 3 + attention(3, 3) + 2 * 4 * 10 * 2
  reference = 2 * n * (3 + 2 * 2) + attention(3, 3) + attention(4, 5) + 2 * 4 * 10 * 4
  assert need["reference_flops"] == reference
  assert need["update_flops"] == 2 * reference


def test_the_stored_report_recomputes_from_its_json(capsys):
  stored = pathlib.Path(__file__).resolve().parents[1] / "docs/results/roofline.json"
  if not stored.exists():
    pytest.skip("no stored roofline run")
  assert roofline.main(["--report", str(stored)]) == 0
  out = capsys.readouterr().out
  assert "decode, per token (8 rows)" in out and "the next target" in out
