"""Phase lines and progress bars (gemma_grpo/runtime/console.py)."""

import io
import logging
import subprocess
import sys
import time

from gemma_grpo.runtime import console


class FakeTerminal(io.StringIO):

  def isatty(self):
    return True


def test_a_phase_line_says_what_was_done_and_how_long_it_took(caplog):
  phases = console.Phases()
  with caplog.at_level(logging.INFO, logger="absl"):
    first = time.monotonic()
    phases.done("model: loaded")
    seconds = phases.done("LoRA: 10 trainable parameters")
    last = time.monotonic()
  lines = [r.getMessage() for r in caplog.records]
  assert lines[0].startswith("model: loaded (") and lines[0].endswith(" s since start)")
  assert lines[1].startswith("LoRA: 10 trainable parameters (")
  # The time between the two lines, bounded by this test's own clock around
  # them rather than by a fixed figure that a busy machine could exceed.
  assert 0 <= seconds <= last - first


def test_seconds_count_from_process_start_not_from_import():
  code = ("import time; time.sleep(1.5)\n"
          "from gemma_grpo.runtime import console\n"
          "print(console.seconds_since_start())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert float(out.stdout) >= 1.5


def test_a_terminal_gets_a_bar_with_an_eta(capsys):
  bar = console.progress(4, "train", "step", stream=FakeTerminal())
  assert not bar.disable
  bar.update(1)
  bar.refresh()
  bar.close()
  drawn = capsys.readouterr().err
  assert "train" in drawn and "1/4" in drawn and "<" in drawn  # elapsed<remaining


def test_no_bar_when_stdout_is_a_pipe_or_the_process_is_not_the_first(capsys):
  assert console.progress(4, "eval", "problem", stream=io.StringIO()).disable
  assert console.progress(4, "eval", "problem", stream=FakeTerminal(), enabled=False).disable
  bar = console.progress(4, "eval", "problem", stream=io.StringIO())
  bar.update(4)
  bar.close()
  assert capsys.readouterr().err == ""
