"""Evidence: steps that computed the whole float32 LM head although the screen was on.

Run from the repository root: python docs/results/continuous_batching/full_head_steps.py
Evidence, committed with its output in full_head_steps.txt (Intel Xeon with AMX, 2 cores).
"""
import sys, pathlib, jax
sys.path.insert(0, "bench")
import common
from continuous_batching import workload
from rollout import build_policy
from tunix.rl.rollout import base_rollout
from gemma_grpo.rl.engine import rollout
texts = workload(2, 8)
actor, tokenizer, mesh = build_policy(common.offline_270m_dir())
pw = max(len(tokenizer.encode(t)) for t in texts) + 1
for name, kw in [("cut after", {}), ("stop text", dict(stop_text="</answer>")), ("slots=8 stop", dict(stop_text="</answer>", slots=8))]:
  e = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=common.LORA_ALPHA / common.LORA_RANK, **kw)
  cfg = base_rollout.RolloutConfig(max_tokens_to_generate=256, max_prompt_length=pw, kv_cache_size=pw+256, temperature=common.TEMPERATURE, top_p=1.0, top_k=common.TOP_K, eos_tokens=[1,106], seed=jax.random.PRNGKey(0))
  with mesh:
    e.generate(texts, cfg)
  [s] = e.take_decode_stats()
  print(name, "screen", e._screen, "steps", s.steps, "full head steps", e.full_head_steps, flush=True)
