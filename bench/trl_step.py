"""The fixed GRPO workload through TRL's GRPOTrainer + PEFT LoRA, with phase timings.

  flock /tmp/gemma_grpo_heavy.lock python bench/trl_step.py --out /tmp/trl.json
Usually run by bench/peer_step.py in a fresh process; standalone it needs
--model-dir (default: the converted offline Gemma-3-270M) and --data (default:
the first 4 x (steps + 1) problems of GSM8K test). About 5 min on a 2-core CPU
for 1 warm-up + 4 timed steps. Prints figures; asserts nothing.

What is timed, per optimizer step (one step = 4 prompts x 2 generations):
  step       on_step_end of the previous step (or on_train_begin) -> on_step_end:
             everything, logging included, like gemma-grpo's perf/step_seconds;
             `step_inner` is on_step_begin -> on_step_end
  rollout    GRPOTrainer._generate: prompt tokenization, model.generate (through
             _generate_single_turn, PEFT adapter active), decoding to text
  reference  GRPOTrainer._get_per_token_logps_and_entropies called with gradients
             disabled: TRL's reference log-probs, computed with the adapter
             disabled (trl.trainer.utils.use_adapter(model, None)); with one
             iteration and aligned steps TRL computes no old log-probs, so this
             is the reference pass alone (`reference_calls` counts them)
  train      step - rollout - reference: rewards, advantages, the policy
             forward with gradients, backward, clip, AdamW

Settings that matter for fairness: float32 (bf16=False, TRL's default is bf16;
--bf16 turns it on, the peer of gemma-grpo's model.matmul_dtype=bfloat16),
gradient_checkpointing=False (TRL's default is True; gemma-grpo does not
rematerialise layers), loss_type="grpo" (sequence-mean token-mean, as ours),
min_new_tokens=64 so every completion is exactly 64 tokens, file order
(shuffle_dataset=False), the same `gemma_grpo.tasks.rewards` guarded preset.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--model-dir", type=pathlib.Path, help="HF checkpoint dir (default: offline 270M)")
  p.add_argument("--data", type=pathlib.Path, help="GSM8K-format jsonl, used in file order"
                 " (default: the first 4 x (steps + 1) problems of GSM8K test)")
  p.add_argument("--steps", type=int, default=4, help="timed steps after one warm-up step")
  p.add_argument("--generations", type=int, default=common.GENERATIONS)
  p.add_argument("--new-tokens", type=int, default=common.NEW_TOKENS)
  p.add_argument("--gradient-checkpointing", action="store_true",
                 help="TRL's own default (recomputes activations in backward)")
  p.add_argument("--bf16", action="store_true",
                 help="TRL's own default: bfloat16 autocast (float32 weights, bfloat16 products)")
  p.add_argument("--out", type=pathlib.Path, help="write per-step numbers as JSON here")
  return p.parse_args(argv)


def build_trainer(args, records: list[dict], workdir: str):
  """A GRPOTrainer subclass whose rollout and reference passes are timed."""
  import datasets  # pylint: disable=g-import-not-at-top
  import peft  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top

  from gemma_grpo.tasks import data as data_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import rewards  # pylint: disable=g-import-not-at-top

  class TimedGRPOTrainer(trl.GRPOTrainer):
    """Adds up, per optimizer step, the seconds of TRL's rollout and reference."""

    def __init__(self, *a, **kw):
      super().__init__(*a, **kw)
      self.phase = {"rollout": 0.0, "reference": 0.0, "reference_calls": 0}
      self.completion_lengths: list[int] = []
      self.prompt_widths: list[int] = []

    def _generate(self, prompts_batch):
      start = time.perf_counter()
      out = super()._generate(prompts_batch)
      self.phase["rollout"] += time.perf_counter() - start
      prompt_ids, completion_ids = out[0], out[1]
      self.completion_lengths.extend(len(c) for c in completion_ids)
      self.prompt_widths.append(max(len(p) for p in prompt_ids))
      return out

    def _get_per_token_logps_and_entropies(self, *a, **kw):
      if torch.is_grad_enabled():  # the policy pass inside the loss
        return super()._get_per_token_logps_and_entropies(*a, **kw)
      start = time.perf_counter()
      out = super()._get_per_token_logps_and_entropies(*a, **kw)
      self.phase["reference"] += time.perf_counter() - start
      self.phase["reference_calls"] += 1
      return out

  model_dir = str(args.model_dir)
  tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  problems = [data_lib.Problem(r["question"], data_lib.parse_gsm8k_answer(r["answer"])[1])
              for r in records]
  dataset = datasets.Dataset.from_list(
      [{"prompt": prompts.render_prompt(p.question), "answer": p.answer} for p in problems])
  batch = common.PROMPTS_PER_STEP * args.generations
  config = trl.GRPOConfig(
      output_dir=workdir,
      use_cpu=True,
      bf16=args.bf16,
      fp16=False,
      gradient_checkpointing=args.gradient_checkpointing,
      per_device_train_batch_size=batch,  # completions per optimizer step
      gradient_accumulation_steps=1,
      steps_per_generation=1,
      num_generations=args.generations,
      max_completion_length=args.new_tokens,
      generation_kwargs={"min_new_tokens": args.new_tokens},
      temperature=common.TEMPERATURE,
      top_k=common.TOP_K,
      top_p=1.0,
      beta=common.BETA,
      epsilon=common.EPSILON,
      num_iterations=1,
      loss_type="grpo",
      scale_rewards="group",
      learning_rate=common.LEARNING_RATE,
      lr_scheduler_type="cosine",
      warmup_steps=0,
      weight_decay=common.WEIGHT_DECAY,
      adam_beta1=common.ADAM_B1,
      adam_beta2=common.ADAM_B2,
      max_grad_norm=common.MAX_GRAD_NORM,
      max_steps=args.steps + common.WARMUP_STEPS,
      shuffle_dataset=False,
      use_vllm=False,
      logging_steps=1,
      report_to="none",
      save_strategy="no",
      dataloader_num_workers=0,
      seed=0,
  )
  lora = peft.LoraConfig(r=common.LORA_RANK, lora_alpha=common.LORA_ALPHA, lora_dropout=0.0,
                         target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
  return TimedGRPOTrainer(
      model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
      reward_funcs=rewards.build_reward_fns(common.REWARD_PRESET), peft_config=lora,
  )


def step_timer(trainer):
  """A TrainerCallback recording each step's times into `steps`."""
  import transformers  # pylint: disable=g-import-not-at-top

  class StepTimer(transformers.TrainerCallback):

    def __init__(self):
      self.steps: list[dict] = []
      self._last_end = None
      self._begin = None
      self._lengths_seen = 0

    def on_train_begin(self, args, state, control, **kwargs):
      self._last_end = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
      self._begin = time.perf_counter()
      trainer.phase.update(rollout=0.0, reference=0.0, reference_calls=0)

    def on_step_end(self, args, state, control, **kwargs):
      now = time.perf_counter()
      lengths = trainer.completion_lengths[self._lengths_seen:]
      self._lengths_seen = len(trainer.completion_lengths)
      step = now - self._last_end
      self.steps.append({
          "step": state.global_step,
          "step_seconds": step,
          "step_inner": now - self._begin,
          "rollout": trainer.phase["rollout"],
          "reference": trainer.phase["reference"],
          "reference_calls": trainer.phase["reference_calls"],
          "train": common.phases(step, trainer.phase["rollout"], trainer.phase["reference"]),
          "completion_tokens": sum(lengths) / max(len(lengths), 1),
          "completion_lengths": lengths,
          "prompt_width": trainer.prompt_widths[-1] if trainer.prompt_widths else None,
      })
      print(f"trl step {state.global_step}: {step:.2f} s (rollout"
            f" {trainer.phase['rollout']:.2f}, reference {trainer.phase['reference']:.2f})",
            flush=True)
      self._last_end = now

  return StepTimer()


def check_tokens(model_dir: pathlib.Path, records: list[dict]) -> int:
  """Prompts that TRL's tokenizer and gemma-grpo's tokenize differently."""
  import transformers  # pylint: disable=g-import-not-at-top

  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
  ours = tokenizer_lib.load(model_dir)
  texts = [prompts.render_prompt(r["question"]) for r in records]
  return sum(hf(text=t)["input_ids"] != ours.encode(t) for t in texts)


def main(argv=None) -> int:
  args = parse_args(argv)
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  args.model_dir = args.model_dir or common.offline_270m_dir()
  n = common.PROMPTS_PER_STEP * (args.steps + common.WARMUP_STEPS)
  if args.data:
    records = [json.loads(l) for l in args.data.read_text().splitlines() if l.strip()][:n]
  else:
    records = common.gsm8k_records(n)
  mismatched = check_tokens(args.model_dir, records)
  print(f"trl: {len(records)} prompts, {mismatched} tokenized differently from gemma-grpo",
        flush=True)
  with tempfile.TemporaryDirectory(prefix="trl_step_") as workdir:
    load_start = time.perf_counter()
    trainer = build_trainer(args, records, workdir)
    load_seconds = time.perf_counter() - load_start
    timer = step_timer(trainer)
    trainer.add_callback(timer)
    train_start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - train_start
  import torch  # pylint: disable=g-import-not-at-top

  result = {
      "framework": "trl",
      "trl_version": __import__("trl").__version__,
      "torch_threads": torch.get_num_threads(),
      "load_seconds": load_seconds,
      "train_seconds_total": train_seconds,
      "prompt_token_mismatches": mismatched,
      "peak_rss_gib_self": common.self_peak_rss_gib(),
      "steps": timer.steps,
  }
  summary = common.summarize(timer.steps)
  print(json.dumps({"trl_summary": summary}), flush=True)
  if args.out:
    args.out.write_text(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
