"""`gemma-grpo plan`: will this config fit on that slice, and how fast can its step go?

  gemma-grpo plan --config configs/gemma3_1b.py --topology v5e-8 [--json OUT]
                  [--rollout-devices N] [--config.section.key=value ...]

Compiles the training step's programs (update, reference, prefill, decode)
for the slice on this machine, with no accelerator and no weights, and
prints each one's memory per device, FLOPs and time bound, the step's time
bound and MFU bound, and a verdict. Exit codes: 0 fits; 2 bad input, or it
does not fit (one `error:` line naming the program, the bytes and a fix).
`--topology cpu` plans for this machine's own devices, whose figures must be
given (`--cpu-flops`, `--cpu-bandwidth`; bench/roofline.py measures them).
`--rollout-devices N` also predicts the split layout the trainer runs with
`--config.mesh.rollout_devices=N`: the rollout on N devices and the update
on the rest, one step apart (split.py), and prints its step bound beside the
shared layout's (exit 2 if a group does not fit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.plan import chips
from gemma_grpo.tasks import rewards

_CPU_HELP = "this machine's {} (bench/roofline.py measures it); needed with --topology cpu"


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="gemma-grpo plan", description=__doc__.splitlines()[0],
                                   epilog="Override any config key with --config.section.key=value.")
  parser.add_argument("--config", required=True, help="config file, e.g. configs/gemma3_1b.py")
  parser.add_argument("--topology", required=True, help=f"one of: {', '.join(chips.names())}")
  parser.add_argument("--json", type=pathlib.Path, help="write the plan as JSON here")
  parser.add_argument("--cpu-flops", type=float, help=_CPU_HELP.format("matmul FLOP/s"))
  parser.add_argument("--cpu-bandwidth", type=float, help=_CPU_HELP.format("read bytes/s"))
  parser.add_argument("--cpu-memory", type=float, help="bytes a CPU device may use (default: all RAM)")
  parser.add_argument("--rollout-devices", type=int, default=0, metavar="N",
                      help="also predict the rollout on N devices and the update on the rest,"
                           " samples one update old (the trainer's mesh.rollout_devices=N)")
  return parser


def _topology(args):
  if args.topology == chips.CPU:
    if not args.cpu_flops or not args.cpu_bandwidth:
      raise errors.UserError("--topology cpu: give --cpu-flops and --cpu-bandwidth"
                             " (bench/roofline.py prints this machine's)")
    memory = args.cpu_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    chip = chips.Chip("this CPU", int(memory), args.cpu_flops, args.cpu_bandwidth)
    return chips.Topology(chips.CPU, chip, "cpu", "")
  try:
    return chips.topology(args.topology)
  except KeyError:
    raise errors.UserError(f"--topology {args.topology}: unknown; use one of"
                           f" {', '.join(chips.names())}") from None


def main(argv: list[str] | None = None) -> int:
  # Compiling for a slice needs no device: keep JAX off any accelerator here,
  # and let several plans (and the tests) load libtpu at once, which its
  # lockfile refuses by default though none of them opens a TPU.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  argv = list(sys.argv[1:] if argv is None else argv)
  with errors.exit_on_user_error():
    args, rest = _parser().parse_known_args(argv)
    c = config_lib.load(args.config)
    leftover = config_lib.apply_overrides(c, rest)
    if leftover:
      raise errors.UserError(f"unrecognized arguments: {' '.join(leftover)}")
    config_lib.validate(c)
    s = settings.from_config(c)
    rewards.check(s.rewards)
    topology = _topology(args)
    if c.rollout.engine != "grouped":
      raise errors.UserError("rollout.engine: plan compiles the grouped engine's programs;"
                             " set --config.rollout.engine=grouped")
    return _run(s, topology, args)


def _run(c: settings.Settings, topology, args) -> int:
  # JAX and the compiler load only now, once the input is known to be good.
  import jax  # pylint: disable=g-import-not-at-top

  from gemma_grpo.plan import devices as devices_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.plan import planner  # pylint: disable=g-import-not-at-top
  from gemma_grpo.plan import report  # pylint: disable=g-import-not-at-top
  from gemma_grpo.plan import split  # pylint: disable=g-import-not-at-top

  if topology.platform == "cpu":
    devices = jax.devices()
  else:
    devices = devices_lib.for_topology(topology)
  config_lib.mesh_shape(c.mesh, len(devices))  # a mesh that cannot fill the slice: one line
  mesh = devices_lib.mesh_for(c.mesh, devices)
  # The groups are checked before anything compiles, which takes minutes.
  groups = split.meshes(devices, args.rollout_devices, mesh.shape["tp"]) if args.rollout_devices else None
  # "auto" is resolved for the slice's backend, not this machine's: the LM
  # head's screen was measured faster only on CPUs (lm_head_screen.py).
  screen = c.rollout.screen_lm_head
  if screen == "auto" and topology.platform != "cpu":
    screen = "off"
  print(f"Planning {args.config} for {topology.name}: {len(devices)} x {topology.chip.name},"
        f" mesh {dict(mesh.shape)}", flush=True)
  try:
    result = planner.plan(c, topology, devices, mesh, screen_lm_head=screen,
                          log=lambda line: print(line, flush=True))
  except planner.DoesNotFit as e:
    if args.json:
      _write(args.json, {"topology": topology.name, "devices": len(devices), "fits": False,
                         "hbm_bytes_per_device": topology.chip.hbm_bytes,
                         "overflow": {"program": e.program, "needed_bytes": e.needed},
                         "programs": {}, "step_seconds_lower_bound": None})
    raise errors.UserError(f"does not fit on {topology.name}: {e}") from None
  print(report.render(result, c), flush=True)
  values = result.to_json() | {"config": args.config}
  layout = None
  if groups is not None:
    layout = _split(c, topology, result, groups, screen, args, values)
    print(report.render_split(layout), flush=True)
    values["split"] = layout.to_json()
  if args.json:
    _write(args.json, values)
  why = planner.overflow(result)
  if why is not None:
    raise errors.UserError(f"does not fit on {topology.name}: {why}")
  if layout is not None and not layout.fits:
    raise errors.UserError(f"split layout does not fit on {topology.name}: {layout.overflow()}")
  return 0


def _split(c: settings.Settings, topology, shared, groups, screen: str, args, values: dict):
  """The split layout's plan; one line (and the JSON so far) if a group cannot compile."""
  from gemma_grpo.plan import split  # pylint: disable=g-import-not-at-top

  try:
    layout = split.plan(c, topology, shared, groups, screen_lm_head=screen,
                        log=lambda line: print(line, flush=True))
  except split.GroupDoesNotFit as e:
    if args.json:
      _write(args.json, values | {"split": {
          "runs_in_trainer": True, "fits": False, "rollout_devices": args.rollout_devices,
          "overflow": {"group": e.group, "program": e.cause.program, "needed_bytes": e.cause.needed}}})
    raise errors.UserError(f"split layout does not fit on {topology.name}: {e}") from None
  return layout


def _write(path: pathlib.Path, values: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n")
