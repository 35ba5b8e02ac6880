"""A predicted split layout: the rollout on some of the slice's devices, the update on the rest.

By default the trainer runs every program on every device, one after
another. With mesh.rollout_devices = N and rollout.max_staleness = 1 it runs
the rollout (prefill, decode) on a group of its own and the update and
reference pass on the other group, each group working on a different step
(one-step-off: step t's samples come from the adapters of update t - 1;
rl/run/run_ahead.py's head start): a step then takes as long as the slower
group plus sending the new LoRA adapters across; the full weights never
move. This module predicts that step from each group's programs compiled on
a mesh of its own devices.

Each group's mesh keeps the slice's tp and puts its other devices on fsdp.
The chip table has no interconnect bandwidth, so the adapter transfer is
bounded below by HBM bandwidth: a sending device reads its share once and a
receiving device writes its share once. ICI and NVLink are slower than HBM,
so the real transfer takes longer than this bound.
"""

from __future__ import annotations

import dataclasses

from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.plan import chips
from gemma_grpo.plan import planner
from gemma_grpo.runtime import mesh as mesh_lib

ROLLOUT = ("prefill", "decode")
UPDATE = ("update", "reference")
ASSUMES = ("one-step-off overlap: each step's samples come from adapters one update old"
           " (staleness 1)")
TRANSFER = ("bounded below by HBM bandwidth: the chip table has no interconnect figure,"
            " and ICI or NVLink is slower than HBM, so the real transfer takes longer")


class GroupDoesNotFit(Exception):
  """A group's program needs more memory per device than the chip has."""

  def __init__(self, group: str, devices: int, cause: planner.DoesNotFit):
    self.group, self.devices, self.cause = group, devices, cause
    super().__init__(f"the {group} group ({devices} devices): {cause}, or another --rollout-devices")


@dataclasses.dataclass(frozen=True)
class Split:
  """The shared layout's plan beside the split layout's two groups."""

  shared: planner.Plan
  rollout: planner.Plan  # prefill and decode on the first N devices
  update: planner.Plan  # update and reference on the others

  @property
  def transfer_seconds(self) -> float:
    """A lower bound: the larger per-device share of the adapters, moved once at HBM bandwidth."""
    share = max(self.rollout.adapter_bytes, self.update.adapter_bytes)
    return share / self.shared.chip.hbm_bandwidth

  @property
  def step_seconds(self) -> float:
    return max(self.rollout.step_seconds, self.update.step_seconds) + self.transfer_seconds

  @property
  def step_cost_model_seconds(self) -> float:
    return (max(self.rollout.step_cost_model_seconds, self.update.step_cost_model_seconds)
            + self.transfer_seconds)

  @property
  def ratio(self) -> float:
    """The split bound over the shared one: below 1, the split is predicted faster."""
    return self.step_seconds / self.shared.step_seconds

  @property
  def fits(self) -> bool:
    return self.rollout.fits and self.update.fits

  def overflow(self) -> str | None:
    """Why a group does not fit, or None."""
    for group, p in (("rollout", self.rollout), ("update", self.update)):
      why = planner.overflow(p)
      if why is not None:
        return f"the {group} group ({p.devices} devices): {why}, or another --rollout-devices"
    return None

  def to_json(self) -> dict:
    return {
        "runs_in_trainer": True,
        "assumes": ASSUMES,
        "transfer_assumption": TRANSFER,
        "rollout_devices": self.rollout.devices,
        "update_devices": self.update.devices,
        "rollout": self.rollout.to_json(),
        "update": self.update.to_json(),
        "adapter_bytes": self.shared.adapter_total_bytes,
        "adapter_bytes_per_device": {"rollout": self.rollout.adapter_bytes,
                                     "update": self.update.adapter_bytes},
        "transfer_seconds_lower_bound": self.transfer_seconds,
        "fits": self.fits,
        "step_seconds_lower_bound": self.step_seconds,
        "step_seconds_cost_model": self.step_cost_model_seconds,
        "shared_step_seconds_lower_bound": self.shared.step_seconds,
        "ratio_to_shared": self.ratio,
    }


def meshes(devices: list, rollout_devices: int, tp: int):
  """(rollout mesh, update mesh): the first `rollout_devices` devices and the
  rest, each keeping the slice's resolved `tp` (as the trainer splits them:
  runtime/mesh.split_meshes); a one-line UserError when they cannot be formed."""
  return mesh_lib.split_meshes(devices, rollout_devices, tp, option="--rollout-devices ")


def plan(c: settings.Settings, topology: chips.Topology, shared: planner.Plan, groups,
         *, screen_lm_head: str, log=print) -> Split:
  """Compiles the rollout's programs on `groups[0]` and the update's on `groups[1]`."""
  plans = {}
  for group, mesh, names in (("rollout", groups[0], ROLLOUT), ("update", groups[1], UPDATE)):
    devices = list(mesh.devices.flat)
    log(f"Planning the {group} group: {len(devices)} devices, mesh {dict(mesh.shape)}")
    try:
      plans[group] = planner.plan(c, topology, devices, mesh, screen_lm_head=screen_lm_head,
                                  log=log, names=names)
    except planner.DoesNotFit as e:
      raise GroupDoesNotFit(group, len(devices), e) from None
    except errors.UserError as e:
      raise errors.UserError(f"the {group} group of --rollout-devices: {e}") from None
  return Split(shared=shared, **plans)
