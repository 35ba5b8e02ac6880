"""How close is `gemma-grpo plan`'s time bound to a step measured on this CPU?

  python bench/plan_calibration.py [--roofline docs/results/roofline.json] [--json OUT]
About 3 min on a 2-core CPU. Plans bench/roofline.py's fixed workload
(Gemma-3-270M float32, LoRA r=32, 4 prompts x 2 completions x 64 new tokens)
for `--topology cpu` with the machine figures that roofline run measured
(read bandwidth, float32 matmul rate) and prints, per phase, the plan's lower
bound beside the roofline run's measured time:
  prefill     plan's prefill program          roofline's 1-token rollout
  decode      plan's decode loop, per token   roofline's (64-token - 1-token rollout) / 63
  reference   plan's reference program        the trainer's perf/train/reference_seconds
  update      plan's update program           the trainer's perf/train/update_seconds
Prefill and decode are planned at the rollout's prompt width, reference and
update at the trainer's (roofline measured them at those widths). The plan
compiles for this machine's devices, so its memory and FLOPs are XLA:CPU's.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

REPO = common.REPO


def plan_command(width: int, machine: dict, data: pathlib.Path, out: pathlib.Path) -> list[str]:
  """`gemma-grpo plan --topology cpu` with the fixed workload's config flags."""
  train = common.ours_command(workdir=out.parent / "unused", data=data,
                              model_source="gguf:gemma-3-270m", steps=1, prompt_length=width)
  flags = [a for a in train if a.startswith("--config.")]
  return [sys.executable, "-m", "gemma_grpo.commands.cli", "plan", "--config",
          str(REPO / "configs" / "gemma3_270m.py"), "--topology", "cpu",
          "--cpu-flops", str(machine["matmul_flops_per_s"]),
          "--cpu-bandwidth", str(machine["bandwidth_bytes_per_s"]), "--json", str(out), *flags]


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--roofline", type=pathlib.Path, default=REPO / "docs/results/roofline.json")
  p.add_argument("--json", type=pathlib.Path, help="write plan and measurement here")
  args = p.parse_args()
  roofline = json.loads(args.roofline.read_text())
  machine, rollout, step = roofline["machine"], roofline["rollout"], roofline["step"]
  measured = {
      "prefill": rollout["seconds"]["1"],
      "decode": (rollout["seconds"][str(common.NEW_TOKENS)] - rollout["seconds"]["1"])
                / (common.NEW_TOKENS - 1),
      "reference": step["reference"],
      "update": step["update"],
  }
  plans = {}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    data = common.write_jsonl(common.gsm8k_records(common.PROMPTS_PER_STEP), tmp / "problems.jsonl")
    for label, width in (("rollout", rollout["prompt_width"]), ("step", step["prompt_width"])):
      out = tmp / f"{label}.json"
      cmd = plan_command(width, machine, data, out)
      print("$ python", " ".join(cmd[1:]), flush=True)
      result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
      if result.returncode:
        print(result.stdout[-3000:], result.stderr[-3000:], file=sys.stderr)
        return result.returncode
      plans[label] = json.loads(out.read_text())
  source = {"prefill": "rollout", "decode": "rollout", "reference": "step", "update": "step"}
  rows = []
  for phase, label in source.items():
    program = plans[label]["programs"][phase]
    bound, model = program["seconds_lower_bound"], program["seconds_cost_model"]
    rows.append({"phase": phase, "prompt_width": rollout["prompt_width"] if label == "rollout"
                 else step["prompt_width"], "plan_bound_s": bound, "measured_s": measured[phase],
                 "measured_over_bound": measured[phase] / bound, "bound_by": program["bound_by"],
                 "plan_cost_model_s": model, "measured_over_cost_model": measured[phase] / model,
                 "flops_per_device": program["flops_per_device"],
                 "bytes_accessed_per_device": program["bytes_accessed_per_device"],
                 "peak_bytes_per_device": program["peak_bytes_per_device"]})
  common.print_table(
      ["phase", "prompt width", "plan bound s", "cost model s", "measured s", "measured / bound",
       "measured / cost model", "bound by"],
      [[r["phase"], str(r["prompt_width"]), f"{r['plan_bound_s']:.4f}", f"{r['plan_cost_model_s']:.4f}",
        f"{r['measured_s']:.4f}", f"{r['measured_over_bound']:.2f}",
        f"{r['measured_over_cost_model']:.2f}", r["bound_by"]] for r in rows])
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"roofline": str(args.roofline.relative_to(REPO)),
                                     "machine": machine, "phases": rows, "plans": plans},
                                    indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
