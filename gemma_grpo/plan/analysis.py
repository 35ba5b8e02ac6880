"""What a compiled program costs on one device, and what a step then costs.

Memory is the compiler's own buffer assignment (`memory_analysis()`): the
arguments, outputs and temporaries one device holds, less the outputs that
reuse a donated argument's buffer. FLOPs are the compiler's count
(`cost_analysis()`, which counts each loop body once) plus, for every loop
with a constant trip count, its body's matrix products for the iterations
it left out (hlo_flops). Where the compiler gives no count (NVIDIA), the
products alone, counted from the program as lowered, divided over the devices.
Two times per program, on one device:
  lower bound    max(FLOPs / peak FLOP/s, (arguments + outputs) / HBM bandwidth):
                 every input read and every output written once, at the peaks;
  cost model     max(FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth), with
                 the compiler's count of bytes accessed, which sums each
                 operation's reads and writes: nearer a real run where buffers
                 are re-read from HBM, and above it where a cache serves them.
For the decode loop (its body counted once) both are per token; its
arguments are every weight and the prompts' keys and values, which each
token reads, and the input embedding table, of which a token reads one row
(left out of the least bytes).
"""

from __future__ import annotations

import dataclasses

import jax

from gemma_grpo.plan import chips
from gemma_grpo.plan import hlo_flops


@dataclasses.dataclass(frozen=True)
class Program:
  """One program's cost on one device."""

  name: str
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  flops: float  # per device, loops counted in full
  compiler_flops: float | None  # cost_analysis() as given (loop bodies once); None on NVIDIA
  program_flops: float  # the products as written (before XLA), loops in full, / devices
  bytes_accessed: float
  unknown_trip_loops: int
  unread_bytes: int  # argument bytes a call need not read (decode: the embedding table)
  calls_per_step: float
  compile_seconds: float

  @property
  def peak_bytes(self) -> int:
    return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

  @property
  def least_bytes(self) -> int:
    """Bytes any run must move: its arguments read and its outputs written once."""
    return self.argument_bytes - self.unread_bytes + self.output_bytes

  def seconds(self, chip: chips.Chip) -> float:
    """A lower bound on one call's time: the slower of compute and the least traffic."""
    return max(self.flops / chip.peak_flops, self.least_bytes / chip.hbm_bandwidth)

  def cost_model_seconds(self, chip: chips.Chip) -> float:
    """One call's time with the compiler's count of bytes accessed."""
    return max(self.flops / chip.peak_flops, self.bytes_accessed / chip.hbm_bandwidth)

  def bound_by(self, chip: chips.Chip) -> str:
    return "compute" if self.flops / chip.peak_flops >= self.least_bytes / chip.hbm_bandwidth else "memory"


def analyse(name: str, lowered: jax.stages.Lowered, compiled: jax.stages.Compiled,
            *, devices: int, calls_per_step: float, compile_seconds: float,
            unread_bytes: int = 0) -> Program:
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax returned one dict per program
    cost = cost[0] if cost else None
  counted = hlo_flops.count(lowered.as_text(dialect="hlo"))
  left_out = (counted.flops - counted.flops_bodies_once) / devices
  if cost and "flops" in cost:
    flops, compiler_flops = float(cost["flops"]) + left_out, float(cost["flops"])
    traffic = float(cost.get("bytes accessed", 0.0))
  else:
    flops, compiler_flops, traffic = counted.flops / devices, None, 0.0
  arguments, outputs = int(memory.argument_size_in_bytes), int(memory.output_size_in_bytes)
  return Program(
      name=name, argument_bytes=arguments, output_bytes=outputs,
      temp_bytes=int(memory.temp_size_in_bytes), alias_bytes=int(memory.alias_size_in_bytes),
      flops=flops, compiler_flops=compiler_flops, program_flops=counted.flops / devices,
      bytes_accessed=max(traffic, float(arguments + outputs)),
      unknown_trip_loops=counted.unknown_trip_loops, unread_bytes=unread_bytes,
      calls_per_step=calls_per_step,
      compile_seconds=compile_seconds)
