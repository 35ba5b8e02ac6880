"""First light on a GPU: the stack, correctness, then speed beside `gemma-grpo plan`.

  bash bench/gpu/run.sh                         # on the lent GPU machine (bench/gpu/README.md)
  python bench/gpu/first_light.py --out DIR     # the same, with this machine's Python
  JAX_PLATFORMS=cpu python bench/gpu/first_light.py --smoke --out DIR   # tiny shapes, any CPU

Writes DIR/first_light.json (every figure) and prints the log. Each part runs
in a child process of its own (a fresh JAX runtime: device memory peaks are
per part), in this order, skipped with a note when the --budget (seconds)
left is less than the part's estimate:
  stack       Python, jax, jaxlib, flax, tunix, qwix, torch, transformers; the
              device, its memory, the driver.
  forward     ours against transformers' own Gemma3ForCausalLM in torch on the
              same random checkpoint (bench/gpu/checkpoint.py), float32, a
              64-token input, 270M and 1B shapes: max |logit difference| /
              max |logit| under FORWARD_TOL at JAX's "highest" matmul
              precision (torch with TF32 off), and the same figure at JAX's
              default precision, reported.
  loss        one GRPO loss on a fixed batch (tiny shapes, LoRA): the trainer's
              per-token log-probs, the loss and the adapters' gradient norm,
              against bench/gpu/cpu_reference.json, which --write-reference
              made on a CPU (LOSS_TOL, relative).
  engine      the trainer's rollout engine on the 1B config's batch (4 prompts
              x 2, prompts of 256 tokens, bfloat16 decode as configs/gemma3_1b.py
              sets it): prefill = a 1-token rollout, decode per token = (a
              512-token rollout - the 1-token one) / 511, median of 3 after a
              warm-up; the first call's extra seconds are the compile.
  train       configs/gemma3_1b.py at its own batch, random 1B weights, 1 warm-up
              + 3 timed steps: step, rollout, reference and update seconds
              (medians), the sampler/trainer log-prob ratio of its bfloat16
              rollouts (tis/ratio_*), peak device memory; then --big-batch
              prompts per step, the batch that docs/results/gpu/plan/ plans to
              fill a good share of the chip.
Beside each measured figure: the plan's prediction for the same config on the
same chip (docs/results/gpu/plan/1b_<chip>-1[_batchN].json, made here with
`gemma-grpo plan`), and measured / predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position

FORWARD_TOL = 1e-4  # max |ours - transformers| / max |logit|, float32, highest precision
LOSS_TOL = 1e-3  # relative, against the CPU's values
PLAN_DIR = REPO / "docs" / "results" / "gpu" / "plan"
REFERENCE = HERE / "cpu_reference.json"
PROMPT_TOKENS, NEW_TOKENS, PROMPTS, GENERATIONS = 256, 512, 4, 2  # configs/gemma3_1b.py's workload
SMOKE = dict(prompt_tokens=48, new_tokens=8)
# Seconds each part takes on an H100 at most, as estimated before the first run.
ESTIMATE = {"stack": 30, "forward": 90, "loss": 60, "engine": 120, "train": 150}


def versions() -> dict:
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  found = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "flax", "google-tunix", "qwix", "optax", "numpy", "torch",
               "transformers", "jax-cuda13-plugin", "jax-cuda12-plugin"):
    try:
      found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      found[name] = None
  return found


# --- parts, each run in a child process: `first_light.py --part NAME` --------


def part_stack(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                           "--format=csv,noheader"], capture_output=True, text=True,
                          check=False).stdout.strip() if _has("nvidia-smi") else None
  cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
              if line.startswith("model name")), platform.processor())
  return {"versions": versions(), "platform": device.platform, "device_kind": device.device_kind,
          "devices": jax.device_count(), "device_memory_bytes": stats.get("bytes_limit"),
          "nvidia_smi": driver, "cpu": cpu, "cpu_count": os.cpu_count()}


def _has(program: str) -> bool:
  return any((pathlib.Path(d) / program).exists() for d in os.environ.get("PATH", "").split(":"))


def _mesh():
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  return mesh_lib.make_mesh(settings.MeshSettings(fsdp=-1, tp=1))


def _model_config(source: str, dtype: str):
  import dataclasses  # pylint: disable=g-import-not-at-top
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top

  model = settings.from_config(config_lib.defaults()).model
  return dataclasses.replace(model, source=source, dtype=dtype)


def part_forward(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  work = pathlib.Path(args.work)
  start = time.perf_counter()
  ckpt = checkpoint.write(work / f"ckpt_{args.shapes}", args.shapes)
  written = time.perf_counter() - start
  ids = np.random.default_rng(1).integers(200, checkpoint.SHAPES[args.shapes]["vocab_size"], 64)
  n = len(ids)
  mesh = _mesh()
  model = model_loading.build(_model_config(str(ckpt), "float32"), mesh).model

  @nnx.jit
  def forward(model, tokens):
    positions = jnp.arange(n)[None]
    return model(tokens, positions, None, jnp.tril(jnp.ones((1, n, n), bool)))[0]

  ours = {}
  for precision in ("highest", "default"):
    with jax.set_mesh(mesh), jax.default_matmul_precision(precision):
      ours[precision] = np.asarray(forward(model, jnp.asarray(ids)[None])[0], np.float64)
  del model
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  hf = transformers.Gemma3ForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).to(device)
  with torch.no_grad():
    theirs = hf(torch.tensor(ids[None], device=device)).logits[0].double().cpu().numpy()
  scale = float(np.abs(theirs).max())
  result = {"shapes": args.shapes, "tokens": n, "torch_device": device, "max_abs_logit": scale,
            "checkpoint_seconds": written, "tolerance": FORWARD_TOL}
  for precision, logits in ours.items():
    result[precision] = {"max_rel_diff": float(np.abs(logits - theirs).max() / scale),
                         "argmax_agree": float((logits.argmax(-1) == theirs.argmax(-1)).mean())}
  result["ok"] = result["highest"]["max_rel_diff"] <= FORWARD_TOL and result["highest"]["argmax_agree"] == 1.0
  return result


def part_loss(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.learner import losses  # pylint: disable=g-import-not-at-top

  ckpt = checkpoint.write(pathlib.Path(args.work) / "ckpt_tiny", "tiny")
  c = settings.from_config(config_lib.load(str(REPO / "configs" / "tiny.py")))
  mesh = _mesh()
  actor = lora.apply(model_loading.build(_model_config(str(ckpt), "float32"), mesh).model, c.lora, mesh)
  rng = np.random.default_rng(2)
  prompts = rng.integers(200, 5000, (4, 12))
  prompts[2, :3] = 0  # left padding
  completions = rng.integers(200, 5000, (4, 8))
  completions[1, 5:] = 0  # right padding
  mask = completions != 0
  advantages = rng.standard_normal(4).astype(np.float32)
  ref_offset = (0.1 * rng.standard_normal((4, 8))).astype(np.float32)

  def loss(model):
    logps, _ = losses.per_token_logps_and_entropy(model, jnp.asarray(prompts), jnp.asarray(completions),
                                                  0, 1, 0.9)
    value, aux = losses.policy_loss(
        logps, jnp.asarray(advantages), jnp.asarray(mask),
        ref_logps_BxT=jax.lax.stop_gradient(logps) + ref_offset, epsilon_low=0.2, epsilon_high=0.2,
        beta=0.08, sequence_ratio=False, aggregation="token-mean")
    return value, (logps, aux["kl"])

  grad_fn = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam), has_aux=True)
  with jax.set_mesh(mesh), jax.default_matmul_precision("highest"):
    (value, (logps, kl)), grads = nnx.jit(grad_fn)(actor)
  values = {"loss": float(value), "kl": float(kl), "grad_norm": float(optax.global_norm(grads)),
            "logps": [float(x) for x in np.asarray(logps)[mask]]}
  if args.write_reference:
    REFERENCE.write_text(json.dumps({**values, "made_with": versions(),
                                     "platform": jax.devices()[0].platform}, indent=1) + "\n")
    return {"values": values, "wrote": str(REFERENCE)}
  cpu = json.loads(REFERENCE.read_text())

  def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.maximum(np.abs(np.asarray(b)), 1e-6)))

  diffs = {k: rel(values[k], cpu[k]) for k in ("loss", "kl", "grad_norm")}
  diffs["logps"] = rel(values["logps"], cpu["logps"])
  return {"values": values, "cpu": {k: cpu[k] for k in ("loss", "kl", "grad_norm")},
          "rel_diff": diffs, "tolerance": LOSS_TOL, "ok": max(diffs.values()) <= LOSS_TOL}


def _synthetic_questions(tokenizer, n: int, width: int, seed: int) -> list[tuple[str, str]]:
  """(question, its chat prompt) pairs, each prompt exactly `width` tokens of the synthetic tokenizer."""
  import random  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top

  rng = random.Random(seed)
  overhead = len(tokenizer.encode(prompts.render_prompt("w1000")))
  words = width - overhead + 1
  out = []
  for _ in range(n):
    question = " ".join(f"w{rng.randrange(1000, 200000)}" for _ in range(words))
    text = prompts.render_prompt(question)
    assert len(tokenizer.encode(text)) == width, "the synthetic prompt is not `width` tokens"
    out.append((question, text))
  return out


def _workload(args) -> dict:
  smoke = dict(SMOKE) if args.smoke else {}
  return {"prompt_tokens": smoke.get("prompt_tokens", PROMPT_TOKENS),
          "new_tokens": smoke.get("new_tokens", NEW_TOKENS),
          "prompts": args.batch, "generations": GENERATIONS}


def part_engine(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout as rollout_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.seam import jax_mesh  # pylint: disable=g-import-not-at-top

  w = _workload(args)
  c = settings.from_config(config_lib.load(str(REPO / "configs" / "gemma3_1b.py")))
  ckpt = checkpoint.write(pathlib.Path(args.work) / f"ckpt_{args.shapes}", args.shapes)
  mesh = _mesh()
  loaded = model_loading.build(_model_config(str(ckpt), c.model.dtype), mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  engine = rollout_lib.GroupedRollout(actor, loaded.tokenizer, mesh, lora_scale=c.lora.scale,
                                      decode_dtype=c.rollout.decode_dtype,
                                      screen_lm_head=c.rollout.screen_lm_head)
  texts = [text for _, text in _synthetic_questions(loaded.tokenizer, w["prompts"], w["prompt_tokens"], 0)
           for _ in range(w["generations"])]
  seconds = {}
  with jax_mesh.tunix_mesh(mesh):
    for new_tokens in (1, w["new_tokens"]):
      runs = []
      for i in range(4):  # the first compiles
        config = base_rollout.RolloutConfig(
            max_tokens_to_generate=new_tokens, max_prompt_length=w["prompt_tokens"],
            kv_cache_size=w["prompt_tokens"] + new_tokens, temperature=c.rollout.temperature,
            top_p=c.rollout.top_p, top_k=c.rollout.top_k, eos_tokens=[-1],
            seed=jax.random.fold_in(jax.random.PRNGKey(0), i))
        start = time.perf_counter()
        engine.generate(texts, config)  # tokens come back to the host: synchronous
        runs.append(time.perf_counter() - start)
      seconds[new_tokens] = {"first": runs[0], "median": statistics.median(runs[1:])}
  one, full = seconds[1]["median"], seconds[w["new_tokens"]]["median"]
  decode = (full - one) / (w["new_tokens"] - 1)
  return {"workload": w, "rows": len(texts), "prefill_s": one, "decode_s_per_token": decode,
          "decode_tokens_per_s": len(texts) / decode if decode > 0 else None,
          "compile_s": {n: s["first"] - s["median"] for n, s in seconds.items()},
          "seconds": seconds, "peak_device_bytes": _peak_bytes()}


def _peak_bytes() -> int | None:
  import jax  # pylint: disable=g-import-not-at-top

  return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")


def part_train(args) -> dict:
  from gemma_grpo.commands import train  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  w = _workload(args)
  work = pathlib.Path(args.work)
  ckpt = checkpoint.write(work / f"ckpt_{args.shapes}", args.shapes)
  questions = _synthetic_questions(tokenizer_lib.load(ckpt), w["prompts"] * (args.steps + 1),
                                   w["prompt_tokens"], 1)
  data = work / f"problems_{w['prompts']}.jsonl"
  data.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q, _ in questions))
  run = work / f"run_{w['prompts']}"
  flags = {"model.source": ckpt, "data.source": data, "data.num_heldout": 0,
           "train.batch_size": w["prompts"], "train.max_steps": args.steps + 1,
           "rollout.max_prompt_length": w["prompt_tokens"], "rollout.max_new_tokens": w["new_tokens"],
           "rollout.kv_cache_size": w["prompt_tokens"] + w["new_tokens"], "rollout.ignore_eos": True,
           "optim.warmup_fraction": 0.0, "eval.every_steps": 0, "eval.num_examples": 0,
           "eval.max_new_tokens": w["new_tokens"], "ckpt.every_steps": 1000,
           "log.flush_every_steps": 1}
  start = time.perf_counter()
  code = train.main(["--config", str(REPO / "configs" / "gemma3_1b.py"), "--workdir", str(run),
                     *(f"--config.{k}={v}" for k, v in flags.items())])
  wall = time.perf_counter() - start
  if code != 0:
    raise SystemExit(f"the trainer exited {code}")
  rows = [r for r in metrics_lib.read_jsonl(run / "tensorboard" / "metrics.jsonl") if "perf/train/step_seconds" in r]
  timed = [r for r in rows if r["step"] > 1]

  def med(key):
    values = [r[key] for r in timed if key in r]
    return statistics.median(values) if values else None

  summary = {"step_s": med("perf/train/step_seconds"), "rollout_s": med("perf/train/rollout_seconds"),
             "reference_s": med("perf/train/reference_seconds"), "update_s": med("perf/train/update_seconds"),
             "rollout_tokens_per_s": med("perf/train/rollout_tokens_per_second")}
  # Step 1 compiles each phase's programs (the update's in a thread beside the rollout).
  compile_s = (sum(rows[0][f"perf/train/{phase}_seconds"] - summary[f"{phase}_s"]
                   for phase in ("rollout", "reference", "update")) if rows and timed else None)
  return {"workload": w, "exit_code": code, "wall_s": wall, "timed_steps": len(timed),
          "first_step": {k: v for k, v in (rows[0] if rows else {}).items() if k.startswith("perf/")},
          "compile_s": compile_s, **summary,
          "tis": {k.rsplit("/", 1)[-1]: med(k) for k in (
              "actor/train/tis/ratio_mean", "actor/train/tis/ratio_min", "actor/train/tis/ratio_max",
              "actor/train/tis/capped_frac")},
          "peak_device_bytes": _peak_bytes()}


PARTS = {"stack": part_stack, "forward": part_forward, "loss": part_loss, "engine": part_engine,
         "train": part_train}


# --- the plan's predictions ------------------------------------------------------


def chip_of(device_kind: str) -> str | None:
  """h100 / h200 from JAX's device kind ("NVIDIA H100 80GB HBM3"), else None."""
  kind = device_kind.upper()
  return next((name.lower() for name in ("H100", "H200") if name in kind), None)


def predicted(chip: str | None, prompts: int) -> dict | None:
  """The plan's per-phase seconds and peak memory for the 1B config at `prompts` per step."""
  if chip is None:
    return None
  suffix = "" if prompts == PROMPTS else f"_batch{prompts}"
  path = PLAN_DIR / f"1b_{chip}-1{suffix}.json"
  if not path.exists():
    return None
  p = json.loads(path.read_text())
  programs = p["programs"]
  return {"file": str(path.relative_to(REPO)), "fits": p["fits"],
          "prefill_s": programs["prefill"]["seconds_lower_bound"],
          "decode_s_per_token": programs["decode"]["seconds_lower_bound"],
          "reference_s": programs["reference"]["seconds_lower_bound"],
          "update_s": programs["update"]["seconds_lower_bound"],
          "step_s": p["step_seconds_lower_bound"], "step_cost_model_s": p["step_seconds_cost_model"],
          "peak_device_bytes": p["peak_bytes_per_device"],
          "update_flops": programs["update"]["flops_per_device"], "peak_flops": p["peak_flops_per_device"]}


def beside(measured: dict, plan: dict | None) -> list[dict]:
  """Rows of figure, measured, predicted (lower bound), measured / predicted."""
  rows = []
  for key in ("prefill_s", "decode_s_per_token", "reference_s", "update_s", "step_s", "peak_device_bytes"):
    if key not in measured:
      continue
    m, p = measured[key], (plan or {}).get(key)
    rows.append({"figure": key, "measured": m, "predicted": p,
                 "ratio": (m / p) if m is not None and p else None})
  return rows


# --- the parent ---------------------------------------------------------------------


def run_part(name: str, args, work: pathlib.Path, extra: list[str], timeout: float) -> dict:
  cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--part", name, "--work", str(work),
         "--result", str(work / f"{name}.json"), *extra, *(["--smoke"] if args.smoke else [])]
  start = time.perf_counter()
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired as e:
    return {"error": f"timed out after {timeout:.0f} s", "log_tail": (e.stderr or "")[-3000:]
            if isinstance(e.stderr, str) else ""}
  seconds = time.perf_counter() - start
  if proc.returncode != 0:
    return {"error": f"exit {proc.returncode}", "seconds": seconds, "log_tail": proc.stderr[-4000:]}
  result = json.loads((work / f"{name}.json").read_text())
  return {**result, "seconds": seconds}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", type=pathlib.Path, help="where first_light.json goes")
  p.add_argument("--smoke", action="store_true", help="tiny shapes and few tokens: the plumbing, on any CPU")
  p.add_argument("--budget", type=float, default=450.0, help="seconds for all parts")
  p.add_argument("--big-batch", type=int, default=None,
                 help="prompts per step of the second train part (default: the planned one)")
  p.add_argument("--write-reference", action="store_true",
                 help="with --part loss on a CPU: write bench/gpu/cpu_reference.json")
  p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
  p.add_argument("--work", help=argparse.SUPPRESS)
  p.add_argument("--result", help=argparse.SUPPRESS)
  p.add_argument("--shapes", default="1b", help=argparse.SUPPRESS)
  p.add_argument("--batch", type=int, default=PROMPTS, help=argparse.SUPPRESS)
  p.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.part:
    result = PARTS[args.part](args)
    pathlib.Path(args.result).write_text(json.dumps(result, indent=1, default=str))
    return 0
  if args.out is None:
    p.error("--out is required")
  args.out.mkdir(parents=True, exist_ok=True)
  deadline = time.monotonic() + args.budget
  steps = "1" if args.smoke else "3"
  results = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "smoke": args.smoke, "budget_s": args.budget}

  def attempt(key: str, name: str, extra: list[str]) -> dict:
    left = deadline - time.monotonic()
    if left < ESTIMATE[name] * (0.2 if args.smoke else 1.0):
      outcome = {"skipped": f"{left:.0f} s of the budget left, the part needs about {ESTIMATE[name]} s"}
    else:
      outcome = run_part(name, args, work, extra, timeout=left)
    results[key] = outcome
    print(f"{key}: {json.dumps(outcome, default=str)[:1500]}", flush=True)
    (args.out / "first_light.json").write_text(json.dumps(results, indent=1, default=str))
    return outcome

  with tempfile.TemporaryDirectory(prefix="first_light_") as tmp:
    work = pathlib.Path(tmp)
    stack = attempt("stack", "stack", [])
    chip = chip_of(stack.get("device_kind", ""))
    for shapes in (("tiny",) if args.smoke else ("270m", "1b")):
      attempt(f"forward_{shapes}", "forward", ["--shapes", shapes])
    attempt("loss", "loss", [])
    shapes = "tiny" if args.smoke else "1b"
    engine = attempt("engine", "engine", ["--shapes", shapes])
    train = attempt("train", "train", ["--shapes", shapes, "--steps", steps])
    big = args.big_batch or _planned_big_batch(chip)
    train_big = (attempt(f"train_batch{big}", "train", ["--shapes", shapes, "--steps", steps,
                                                        "--batch", str(big)]) if big else {})
  plan = predicted(chip, PROMPTS)
  results["predicted"] = {"chip": chip, str(PROMPTS): plan,
                          **({str(big): predicted(chip, big)} if big else {})}
  results["measured_vs_predicted"] = {
      str(PROMPTS): beside({**_phases(engine), **_phases(train)}, plan),
      **({str(big): beside(_phases(train_big), predicted(chip, big))} if big else {})}
  if plan and train.get("update_s"):
    results["update_mfu"] = plan["update_flops"] / train["update_s"] / plan["peak_flops"]
  (args.out / "first_light.json").write_text(json.dumps(results, indent=1, default=str))
  for batch, rows in results["measured_vs_predicted"].items():
    print(f"\n{batch} prompts x {GENERATIONS} per step, measured vs planned ({chip or 'no plan for this device'}):")
    for r in rows:
      print(f"  {r['figure']:<20} {_fmt(r['measured']):>12} {_fmt(r['predicted']):>12} "
            f"{_fmt(r['ratio']):>8}")
  failed = [k for k, v in results.items() if isinstance(v, dict) and (v.get("error") or v.get("ok") is False)]
  print(f"\nwrote {args.out / 'first_light.json'}; " + (f"FAILED: {', '.join(failed)}" if failed else "no part failed"))
  return 1 if failed else 0


def _phases(part: dict) -> dict:
  keys = ("prefill_s", "decode_s_per_token", "reference_s", "update_s", "step_s", "peak_device_bytes")
  return {k: part[k] for k in keys if k in part and part[k] is not None}


def _planned_big_batch(chip: str | None) -> int | None:
  """The largest batch with a plan for this chip (docs/results/gpu/plan/1b_<chip>-1_batchN.json)."""
  if chip is None:
    return None
  batches = [int(p.stem.rsplit("batch", 1)[1]) for p in PLAN_DIR.glob(f"1b_{chip}-1_batch*.json")]
  return max(batches) if batches else None


def _fmt(x) -> str:
  if x is None:
    return "-"
  return f"{x:.4g}"


if __name__ == "__main__":
  sys.exit(main())
