"""What the benchmark scripts share: the fixed workload, child processes, tables.

The fixed workload (so figures compare across time): Gemma-3-270M (the offline
GGUF converted to an HF directory, float32), LoRA r=32, alpha=32 on q, k/v, o,
gate, up, down; 4 GSM8K test prompts per step, the first 4 x steps of
test.jsonl in file order, each rendered by `prompts.render_prompt`; 2
generations per prompt, exactly 64 new tokens, temperature 0.9, top_k 50,
beta 0.08, epsilon 0.2, one iteration, AdamW 3e-6, grad clip 0.1.

Not a benchmark itself (`python bench/common.py` prints this text): the
scripts beside it import it. Nothing here asserts a figure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time
from typing import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

GSM8K_TEST = pathlib.Path(os.environ.get(
    "GEMMA_GRPO_GSM8K_TEST", "/work/shared/data/gsm8k/test.jsonl"))
HEAVY_LOCK = "/tmp/gemma_grpo_heavy.lock"

# The fixed workload.
PROMPTS_PER_STEP = 4
GENERATIONS = 2
NEW_TOKENS = 64
TEMPERATURE = 0.9
TOP_K = 50
BETA = 0.08
EPSILON = 0.2
LEARNING_RATE = 3e-6
MAX_GRAD_NORM = 0.1
WEIGHT_DECAY = 0.1  # configs/base.py's AdamW; TRL is set to match
ADAM_B1, ADAM_B2 = 0.9, 0.99
LORA_RANK, LORA_ALPHA = 32, 32.0
WARMUP_STEPS = 1
REWARD_PRESET = "guarded"  # gemma_grpo.tasks.rewards; both frameworks score with it


def gib(num_bytes: float) -> float:
  return num_bytes / 2**30


def median(values: Sequence[float | None]) -> float | None:
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
  return "n/a" if value is None else f"{value:.{digits}f}"


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  """A right-aligned text table: header, dashes, rows."""
  widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
  line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
  return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
  print("\n".join(table_lines(header, rows)), flush=True)


class Transcript:
  """What a benchmark prints, kept to be written to its --out file too."""

  def __init__(self):
    self.lines: list[str] = []

  def __call__(self, text: str = "") -> None:
    print(text, flush=True)
    self.lines.append(text)

  def write(self, path: pathlib.Path | None) -> None:
    if path:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text("\n".join(self.lines) + "\n")


# --- data --------------------------------------------------------------------


def gsm8k_records(n: int, path: pathlib.Path = GSM8K_TEST) -> list[dict]:
  """The first `n` records of a GSM8K jsonl, in file order."""
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        records.append(json.loads(line))
      if len(records) == n:
        return records
  raise SystemExit(f"error: {path} holds {len(records)} problems; {n} needed")


def write_jsonl(records: Sequence[dict], path: pathlib.Path) -> pathlib.Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
  return path


def prompt_lengths(records: Sequence[dict], tokenizer_dir: pathlib.Path) -> list[int]:
  """Tokens of each rendered prompt, <bos> included (what both frameworks feed)."""
  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  tok = tokenizer_lib.load(tokenizer_dir)
  return [len(tok.encode(prompts.render_prompt(r["question"]))) for r in records]


# --- models ------------------------------------------------------------------


def offline_270m_dir() -> pathlib.Path:
  """The converted Gemma-3-270M HF directory (converted once, then cached)."""
  from configs import base  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  return model_loading.offline_270m_dir(settings.from_config(base.get_config()).model)


def tiny_hf_dir(out: pathlib.Path) -> pathlib.Path:
  """A random 2-layer Gemma-3 HF checkpoint with the real Gemma tokenizer.

  For --smoke runs: both frameworks load it through their ordinary HF paths
  (ours as `model.source=<dir>`), so every code path of a real run is taken in
  seconds. Its timings mean nothing.
  """
  import shutil  # pylint: disable=g-import-not-at-top

  if (out / "model.safetensors").exists():
    return out
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  real = offline_270m_dir()
  config = transformers.Gemma3TextConfig(
      vocab_size=262144, hidden_size=64, intermediate_size=128,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
      head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
      bos_token_id=2, eos_token_id=1, pad_token_id=0, tie_word_embeddings=True,
  )
  torch.manual_seed(0)
  model = transformers.Gemma3ForCausalLM(config).to(torch.float32)
  out.mkdir(parents=True, exist_ok=True)
  model.save_pretrained(out)
  for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(real / name, out / name)
  return out


# --- child processes ---------------------------------------------------------


@dataclasses.dataclass
class Child:
  returncode: int
  seconds: float
  peak_rss_gib: float  # the child's own ru_maxrss (and of anything it waited for)


def run_child(cmd: Sequence[str], log: pathlib.Path | None = None,
              env: dict | None = None) -> Child:
  """Runs `cmd` in a fresh process; its output goes to the console and `log`.

  Peak RSS comes from wait4() on that one child, so it is the child's own
  peak, not the largest of all children so far (RUSAGE_CHILDREN's).
  """
  print("$ " + " ".join(str(c) for c in cmd), flush=True)
  start = time.perf_counter()
  out = open(log, "w", encoding="utf-8") if log else None
  try:
    proc = subprocess.Popen(
        [str(c) for c in cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1,
    )
    for line in proc.stdout:
      sys.stdout.write(line)
      if out:
        out.write(line)
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
  finally:
    if out:
      out.close()
  # ru_maxrss is in KiB on Linux.
  return Child(proc.returncode, time.perf_counter() - start, gib(usage.ru_maxrss * 1024))


def self_peak_rss_gib() -> float:
  return gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


# --- gemma-grpo runs ---------------------------------------------------------


def has_config_key(dotted: str) -> bool:
  """Whether configs/base.py defines `dotted` (e.g. "rollout.ignore_eos")."""
  from configs import base  # pylint: disable=g-import-not-at-top

  node = base.get_config()
  for part in dotted.split("."):
    if part not in node:
      return False
    node = node[part]
  return True


def ours_command(*, workdir: pathlib.Path, data: pathlib.Path, model_source: str,
                 steps: int, prompt_length: int, batch_size: int = PROMPTS_PER_STEP,
                 generations: int = GENERATIONS, new_tokens: int = NEW_TOKENS,
                 extra: Sequence[str] = ()) -> list[str]:
  """`python -m gemma_grpo.train` on the fixed workload (warm-up step included).

  The prompt width is set to the longest prompt of the data file (Tunix pads
  every prompt to rollout.max_prompt_length), and the KV cache to exactly
  prompt + completion, so no step does work beyond what the data needs.
  """
  flags = {
      "model.source": model_source,
      "model.dtype": "float32",
      "data.source": data,
      "data.num_heldout": 0,
      "data.max_examples": 0,
      "data.shuffle_seed": 0,
      "lora.rank": LORA_RANK,
      "lora.alpha": LORA_ALPHA,
      "rewards.preset": REWARD_PRESET,
      "train.batch_size": batch_size,
      "train.micro_batch_size": 0,
      "train.max_steps": steps,
      "grpo.algorithm": "grpo",
      "grpo.num_generations": generations,
      "grpo.num_iterations": 1,
      "grpo.beta": BETA,
      "grpo.epsilon": EPSILON,
      "rollout.max_prompt_length": prompt_length,
      "rollout.max_new_tokens": new_tokens,
      "rollout.kv_cache_size": prompt_length + new_tokens,
      "rollout.temperature": TEMPERATURE,
      "rollout.top_k": TOP_K,
      "rollout.top_p": 1.0,
      "optim.peak_lr": LEARNING_RATE,
      "optim.warmup_fraction": 0.0,
      "optim.max_grad_norm": MAX_GRAD_NORM,
      "optim.weight_decay": WEIGHT_DECAY,
      "eval.every_steps": 0,
      "eval.num_examples": 0,
      "eval.max_new_tokens": new_tokens,
      "ckpt.every_steps": 1000,
      "log.flush_every_steps": 1,
  }
  if has_config_key("rollout.ignore_eos"):
    flags["rollout.ignore_eos"] = True
  # The fixed workload predates the offline default's few-shot prompt and stop text.
  if has_config_key("data.few_shot"):
    flags["data.few_shot"] = "()"
  if has_config_key("rollout.stop_text"):
    flags["rollout.stop_text"] = ""
  args = [sys.executable, "-m", "gemma_grpo.train", "--config",
          str(REPO / "configs" / "gemma3_270m.py"), "--workdir", str(workdir)]
  args += [f"--config.{k}={v}" for k, v in flags.items()]
  return args + list(extra)


# Metric names the trainer has used, newest first (Tunix's metric buffer logs
# our per-step values as perf/train/<name>).
_OURS_KEYS = {
    "step_seconds": ("perf/train/step_seconds", "perf/step_seconds"),
    "rollout": ("perf/train/rollout_seconds", "perf/rollout_seconds"),
    "reference": ("perf/train/reference_seconds", "perf/reference_seconds"),
    # The trainer's own update phase (loss, backward, optimizer), for the record.
    "update_logged": ("perf/train/update_seconds", "perf/train_seconds"),
    "completion_tokens": ("completions/train/mean_length", "completions/mean_length"),
}


def _first(row: dict, names: Sequence[str]) -> float | None:
  for name in names:
    if name in row:
      return float(row[name])
  return None


def phases(step: float | None, rollout: float | None, reference: float | None) -> float | None:
  """Train seconds = the rest of the step: rewards, loss, backward, optimizer."""
  if step is None or rollout is None or reference is None:
    return None
  return step - rollout - reference


def ours_steps(workdir: pathlib.Path) -> list[dict]:
  """Per-step timings of a gemma-grpo run, from its metrics.jsonl."""
  from gemma_grpo.runtime import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  path = workdir / "tensorboard" / "metrics.jsonl"
  if not path.exists():
    return []
  steps = []
  for row in metrics_lib.read_jsonl(path):
    got = {name: _first(row, keys) for name, keys in _OURS_KEYS.items()}
    got["train"] = phases(got["step_seconds"], got["rollout"], got["reference"])
    steps.append({"step": row["step"], **got})
  return steps


def summarize(steps: Sequence[dict], warmup: int = WARMUP_STEPS) -> dict:
  """Medians over the timed steps (those after the warm-up)."""
  timed = [s for s in steps if s["step"] > warmup]
  keys = ("step_seconds", "rollout", "reference", "train", "completion_tokens")
  return {"timed_steps": len(timed), **{k: median([s.get(k) for s in timed]) for k in keys}}


if __name__ == "__main__":
  print(__doc__)
