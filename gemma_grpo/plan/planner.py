"""Compile a config's training step for a slice and judge it: fits, and how fast it can go.

A step runs, in order: the rollout (prefill once, then a decode iteration per
new token), the reference pass, and the update once per micro-batch. Its
time bound is the sum of each program's bound times its calls; its memory
peak is the largest program's, counting the training state (weights,
adapters, optimizer) that stays resident while a program that does not take
it as an argument runs. A device group that runs only some of the programs
(split.py: the rollout on some devices, the update on the others) is planned
the same way over just those programs; without the update it holds no
optimizer.
"""

from __future__ import annotations

import dataclasses
import math
import time

from flax import nnx
import jax

from gemma_grpo.config import settings
from gemma_grpo.plan import analysis
from gemma_grpo.plan import chips
from gemma_grpo.plan import programs as programs_lib
from gemma_grpo.plan import shapes

_FIXES = {
    "update": "more devices on mesh.fsdp, a smaller train.micro_batch_size, or model.dtype=bfloat16",
    "reference": "a smaller train.batch_size or rollout.max_new_tokens",
    "prefill": "a smaller train.batch_size or rollout.max_prompt_length",
    "decode": "a shorter rollout.max_new_tokens (the KV cache), a smaller train.batch_size,"
              " or rollout.decode_dtype=bfloat16",
}


class DoesNotFit(Exception):
  """A program needs more memory per device than the chip has."""

  def __init__(self, program: str, needed: int | None, capacity: int, detail: str = ""):
    self.program, self.needed, self.capacity = program, needed, capacity
    amount = f"{needed / 2**30:.2f} GiB per device" if needed else "more memory than a device has"
    super().__init__(
        f"{program} needs {amount}, the chip has {capacity / 2**30:.2f} GiB"
        f"{f' ({detail})' if detail else ''}; try {_FIXES[program]}")


@dataclasses.dataclass(frozen=True)
class Plan:
  topology: str
  chip: chips.Chip
  devices: int
  mesh: dict
  model: str
  resident_bytes: int  # weights, adapters, optimizer state per device
  programs: dict[str, analysis.Program]
  resident_outside: dict[str, int]  # resident bytes a program does not take as arguments
  adapter_bytes: int  # the LoRA adapters one device holds
  adapter_total_bytes: int  # all of the adapters, as one copy (what a split layout sends)

  def step_peak_bytes(self, name: str) -> int:
    return self.programs[name].peak_bytes + self.resident_outside[name]

  @property
  def peak_bytes(self) -> int:
    return max(self.step_peak_bytes(n) for n in self.programs)

  @property
  def fits(self) -> bool:
    return self.peak_bytes <= self.chip.hbm_bytes

  def program_seconds(self, name: str) -> float:
    p = self.programs[name]
    return p.seconds(self.chip) * p.calls_per_step

  @property
  def step_seconds(self) -> float:
    return sum(self.program_seconds(n) for n in self.programs)

  @property
  def step_cost_model_seconds(self) -> float:
    return sum(p.cost_model_seconds(self.chip) * p.calls_per_step for p in self.programs.values())

  @property
  def step_flops(self) -> float:
    """FLOPs of one step on one device (decode counted per token, times the tokens)."""
    return sum(p.flops * p.calls_per_step for p in self.programs.values())

  @property
  def step_model_flops(self) -> float:
    """The step's products as the programs are written (before XLA), on one device."""
    return sum(p.program_flops * p.calls_per_step for p in self.programs.values())

  @property
  def mfu_bound(self) -> float:
    """The highest model FLOPs utilisation the bound allows: model FLOPs / (bound x peak)."""
    return self.step_model_flops / (self.step_seconds * self.chip.peak_flops)

  def to_json(self) -> dict:
    return {
        "topology": self.topology,
        "chip": self.chip.name,
        "devices": self.devices,
        "mesh": self.mesh,
        "model": self.model,
        "hbm_bytes_per_device": self.chip.hbm_bytes,
        "peak_flops_per_device": self.chip.peak_flops,
        "hbm_bandwidth_per_device": self.chip.hbm_bandwidth,
        "fits": self.fits,
        "peak_bytes_per_device": self.peak_bytes,
        "resident_bytes_per_device": self.resident_bytes,
        "programs": {name: {
            "peak_bytes_per_device": p.peak_bytes,
            "step_peak_bytes_per_device": self.step_peak_bytes(name),
            "argument_bytes": p.argument_bytes, "output_bytes": p.output_bytes,
            "temp_bytes": p.temp_bytes, "alias_bytes": p.alias_bytes,
            "flops_per_device": p.flops, "compiler_flops_per_device": p.compiler_flops,
            "program_flops_per_device": p.program_flops,
            "bytes_accessed_per_device": p.bytes_accessed,
            "seconds_lower_bound": p.seconds(self.chip), "bound_by": p.bound_by(self.chip),
            "seconds_cost_model": p.cost_model_seconds(self.chip),
            "calls_per_step": p.calls_per_step, "unknown_trip_loops": p.unknown_trip_loops,
            "least_bytes_per_device": p.least_bytes, "unread_argument_bytes": p.unread_bytes,
            "compile_seconds": p.compile_seconds,
        } for name, p in self.programs.items()},
        "step_seconds_lower_bound": self.step_seconds,
        "step_seconds_cost_model": self.step_cost_model_seconds,
        "step_flops_per_device": self.step_flops,
        "step_model_flops_per_device": self.step_model_flops,
        "mfu_bound": self.mfu_bound,
    }


def _device_bytes(tree, *, whole: bool = False) -> int:
  """Bytes of `tree`'s ShapeDtypeStructs that one device holds (all of them if `whole`)."""
  total = 0
  for x in jax.tree.leaves(tree):
    if isinstance(x, jax.ShapeDtypeStruct):
      shard = x.sharding.shard_shape(x.shape) if x.sharding is not None and not whole else x.shape
      total += jax.numpy.dtype(x.dtype).itemsize * math.prod(shard)
  return total


def _compile(name: str, lowered, chip: chips.Chip):
  try:
    return lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text:
      raise DoesNotFit(name, None, chip.hbm_bytes, text.splitlines()[0][:200]) from None
    raise


def plan(c: settings.Settings, topology: chips.Topology, devices: list, mesh,
         *, screen_lm_head: str, log=print, names: tuple[str, ...] = programs_lib.NAMES) -> Plan:
  """Builds, compiles and analyses the programs `names` (all four) of `c`'s step on `mesh`."""
  start = time.perf_counter()
  builder = programs_lib.Builder(c, mesh, screen_lm_head=screen_lm_head)
  log(f"  models built from shapes ({time.perf_counter() - start:.0f} s)")
  work = builder.work
  calls = {"update": work.update_calls, "reference": 1 if _with_reference(c) else 0,
           "prefill": 1, "decode": work.decode_tokens}
  results, compiled = {}, {}
  # Decode looks up one row of the input embedding per token (the LM head,
  # passed separately, is read whole).
  unread = {"decode": _device_bytes(builder.actor.embedder.input_embedding.get_value())}
  for name in names:
    if not calls[name] and name == "reference":
      continue
    t0 = time.perf_counter()
    lowered = builder.decode(compiled["prefill"]) if name == "decode" else getattr(builder, name)()
    compiled[name] = _compile(name, lowered, topology.chip)
    seconds = time.perf_counter() - t0
    results[name] = analysis.analyse(name, lowered, compiled[name], devices=len(devices),
                                     calls_per_step=calls[name], compile_seconds=seconds,
                                     unread_bytes=unread.get(name, 0))
    log(f"  {name}: compiled in {seconds:.0f} s")
  adapters = nnx.state(builder.actor, nnx.LoRAParam)
  lora_bytes = _device_bytes(adapters)
  model_bytes = _device_bytes(nnx.state(builder.actor))
  # The optimizer lives where the update runs (the update builds it).
  optimizer_bytes = _device_bytes(nnx.state(builder.optimizer)) if "update" in names else 0
  embed_and_norm = _device_bytes((builder.actor.embedder.input_embedding.get_value(),
                                  builder.actor.final_norm.scale.get_value()))
  resident = model_bytes + optimizer_bytes
  outside = {"update": 0, "reference": lora_bytes + optimizer_bytes, "prefill": optimizer_bytes,
             "decode": resident - embed_and_norm}
  result = Plan(topology=topology.name, chip=topology.chip, devices=len(devices),
                mesh=dict(mesh.shape), model=_describe(c), resident_bytes=resident,
                programs=results, resident_outside={n: outside[n] for n in results},
                adapter_bytes=lora_bytes,
                adapter_total_bytes=_device_bytes(adapters, whole=True))
  return result


def overflow(result: Plan) -> DoesNotFit | None:
  """Why `result` does not fit (the program with the largest peak), or None."""
  if result.fits:
    return None
  worst = max(result.programs, key=result.step_peak_bytes)
  return DoesNotFit(worst, result.step_peak_bytes(worst), result.chip.hbm_bytes)


def _with_reference(c: settings.Settings) -> bool:
  return bool(c.grpo.beta) or c.grpo.log_kl


def _describe(c: settings.Settings) -> str:
  return shapes.describe(c)
