"""The plan as a person reads it: a table per program, the step, a verdict."""

from __future__ import annotations


from gemma_grpo.config import settings
from gemma_grpo.plan import planner

GIB = 2**30


def _gib(n: float) -> str:
  return f"{n / GIB:.2f}"


def render(p: planner.Plan, c: settings.Settings) -> str:
  chip = p.chip
  lines = [
      f"{p.model}",
      f"{p.devices} x {chip.name} ({_gib(chip.hbm_bytes)} GiB, {chip.peak_flops / 1e12:.0f} TFLOP/s,"
      f" {chip.hbm_bandwidth / 1e9:.0f} GB/s each), mesh {p.mesh}",
      f"step: {c.train.batch_size} prompts x {c.grpo.num_generations} completions,"
      f" prompts {c.rollout.max_prompt_length} + {c.rollout.max_new_tokens} new tokens",
      "",
      "per device     args GiB  temp GiB  out GiB  peak GiB  +resident  TFLOP/call"
      "  bound s/call  by       calls/step",
  ]
  for name, prog in p.programs.items():
    lines.append(
        f"{name:<13} {_gib(prog.argument_bytes):>9} {_gib(prog.temp_bytes):>9}"
        f" {_gib(prog.output_bytes):>8} {_gib(prog.peak_bytes):>9} {_gib(p.step_peak_bytes(name)):>10}"
        f" {prog.flops / 1e12:>11.3f} {prog.seconds(chip):>13.4f}  {prog.bound_by(chip):<8}"
        f" {prog.calls_per_step:>10g}")
  lines += [
      "",
      f"resident training state (weights, adapters, optimizer): {_gib(p.resident_bytes)} GiB per device",
      f"step time lower bound: {p.step_seconds:.2f} s ("
      + ", ".join(f"{n} {p.program_seconds(n):.2f} s" for n in p.programs) + ")",
      f"step time with the compiler's bytes accessed: {p.step_cost_model_seconds:.2f} s",
      f"MFU bound: {p.mfu_bound:.1%} (the step's model FLOPs at the chip's peak, over the lower bound)",
  ]
  why = planner.overflow(p)
  if why is None:
    lines.append(f"verdict: fits on {p.topology}, peak {_gib(p.peak_bytes)} of"
                 f" {_gib(chip.hbm_bytes)} GiB per device"
                 f" ({max(p.programs, key=p.step_peak_bytes)} is the largest)")
  else:
    lines.append(f"verdict: does not fit on {p.topology}: {why}")
  lines.append("decode is counted per token (its loop's body once), times the new tokens;"
               " the step bound assumes every completion runs to rollout.max_new_tokens")
  return "\n".join(lines)
