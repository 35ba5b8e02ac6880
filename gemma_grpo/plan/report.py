"""The plan as a person reads it: a table per program, the step, a verdict."""

from __future__ import annotations


from gemma_grpo.config import settings
from gemma_grpo.plan import planner
from gemma_grpo.plan import split as split_lib

GIB = 2**30


def _gib(n: float) -> str:
  return f"{n / GIB:.2f}"


def _table(p: planner.Plan) -> list[str]:
  """One row per program: memory per device, FLOPs and time bound per call, calls per step."""
  lines = ["per device     args GiB  temp GiB  out GiB  peak GiB  +resident  TFLOP/call"
           "  bound s/call  by       calls/step"]
  for name, prog in p.programs.items():
    lines.append(
        f"{name:<13} {_gib(prog.argument_bytes):>9} {_gib(prog.temp_bytes):>9}"
        f" {_gib(prog.output_bytes):>8} {_gib(prog.peak_bytes):>9} {_gib(p.step_peak_bytes(name)):>10}"
        f" {prog.flops / 1e12:>11.3f} {prog.seconds(p.chip):>13.4f}  {prog.bound_by(p.chip):<8}"
        f" {prog.calls_per_step:>10g}")
  return lines


def render(p: planner.Plan, c: settings.Settings) -> str:
  chip = p.chip
  lines = [
      f"{p.model}",
      f"{p.devices} x {chip.name} ({_gib(chip.hbm_bytes)} GiB, {chip.peak_flops / 1e12:.0f} TFLOP/s,"
      f" {chip.hbm_bandwidth / 1e9:.0f} GB/s each), mesh {p.mesh}",
      f"step: {c.train.batch_size} prompts x {c.grpo.num_generations} completions,"
      f" prompts {c.rollout.max_prompt_length} + {c.rollout.max_new_tokens} new tokens",
      "",
      *_table(p),
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


def render_split(s: split_lib.Split) -> str:
  """The split layout's prediction, beside the shared layout's bound it is compared with."""
  r, u = s.rollout, s.update
  lines = [
      "",
      (f"split layout: rollout on {r.devices} devices, update on {u.devices} (a prediction of"
       f" the trainer's --config.mesh.rollout_devices={r.devices} --config.rollout.max_staleness=1)"),
      f"assumes {split_lib.ASSUMES}",
  ]
  for group, p in (("rollout", r), ("update", u)):
    fits = "fits" if p.fits else "does not fit"
    lines += ["", (f"{group} group: {p.devices} devices, mesh {p.mesh}, peak {_gib(p.peak_bytes)}"
                   f" of {_gib(p.chip.hbm_bytes)} GiB per device, resident {_gib(p.resident_bytes)}"
                   f" GiB, bound {p.step_seconds:.3g} s ({fits})"), *_table(p)]
  cost_ratio = s.step_cost_model_seconds / s.shared.step_cost_model_seconds
  lines += [
      "",
      (f"adapter transfer: {s.shared.adapter_total_bytes / 2**20:.1f} MiB a step, at least"
       f" {s.transfer_seconds:.3g} s ({split_lib.TRANSFER})"),
      (f"split step time lower bound: max(rollout {r.step_seconds:.3g} s, update"
       f" {u.step_seconds:.3g} s) + transfer {s.transfer_seconds:.3g} s = {s.step_seconds:.3g} s;"
       f" shared {s.shared.step_seconds:.3g} s; split / shared = {s.ratio:.2f}"),
      (f"with the compiler's bytes accessed: split {s.step_cost_model_seconds:.3g} s,"
       f" shared {s.shared.step_cost_model_seconds:.3g} s, split / shared = {cost_ratio:.2f}"),
  ]
  why = s.overflow()
  lines.append(f"split verdict: fits on {s.shared.topology} split {r.devices} + {u.devices}"
               if why is None else f"split verdict: does not fit: {why}")
  return "\n".join(lines)
