# Evidence, committed with its output in 44cdf16: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-44cdf16 44cdf16
import sys, time
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import common, jax
from tunix.rl.rollout import base_rollout
import rollout as rollout_bench
from gemma_grpo import rollout
actor, tokenizer, mesh = rollout_bench.build_policy(common.offline_270m_dir())
texts = rollout_bench.batch_texts(common.PROMPTS_PER_STEP, common.GENERATIONS)
width = max(len(tokenizer.encode(t)) for t in texts)
dtype = sys.argv[1]
e = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0, decode_dtype=dtype)
cfg = lambda n: base_rollout.RolloutConfig(max_tokens_to_generate=n, max_prompt_length=width, kv_cache_size=width + n,
        temperature=0.9, top_p=1.0, top_k=50, eos_tokens=[-1], return_logprobs=dtype == "bfloat16", seed=jax.random.PRNGKey(0))
with mesh:
    for _ in range(2): e.generate(texts, cfg(64))
    t0 = time.perf_counter(); e.generate(texts, cfg(64)); print("rollout", time.perf_counter() - t0)
    jax.profiler.start_trace(f"/tmp/adhoc/tr_dec_{dtype}", create_perfetto_trace=True)
    e.generate(texts, cfg(64))
    jax.profiler.stop_trace()
