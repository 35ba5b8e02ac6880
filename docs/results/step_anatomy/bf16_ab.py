# Evidence, committed with its output in 44cdf16: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-44cdf16 44cdf16
import sys, time, statistics
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import common, jax
from tunix.rl.rollout import base_rollout
import rollout as rollout_bench
from gemma_grpo import rollout
actor, tokenizer, mesh = rollout_bench.build_policy(common.offline_270m_dir())
texts = rollout_bench.batch_texts(common.PROMPTS_PER_STEP, common.GENERATIONS)
width = max(len(tokenizer.encode(t)) for t in texts)
mk = lambda d: rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=common.LORA_ALPHA / common.LORA_RANK, decode_dtype=d)
variants = {"f32 screened": (mk("float32"), False), "bf16 + logps (trainer)": (mk("bfloat16"), True), "bf16 no logps": (mk("bfloat16"), False)}
def cfg(n, i, lp):
    return base_rollout.RolloutConfig(max_tokens_to_generate=n, max_prompt_length=width, kv_cache_size=width + n,
        temperature=common.TEMPERATURE, top_p=1.0, top_k=common.TOP_K, eos_tokens=[-1], return_logprobs=lp,
        seed=jax.random.fold_in(jax.random.PRNGKey(0), i))
sec = {(v, n): [] for v in variants for n in (1, 64)}
with mesh:
    for i in range(int(sys.argv[1]) + 1):
        for v, (e, lp) in variants.items():
            for n in (1, 64):
                t0 = time.perf_counter(); e.generate(texts, cfg(n, i, lp)); dt = time.perf_counter() - t0
                if i: sec[(v, n)].append(dt)
        print("round", i, {k: round(x[-1], 2) for k, x in sec.items() if x}, flush=True)
for v in variants:
    f, o = sec[(v, 64)], sec[(v, 1)]
    print(f"{v:25s} per token fastest {(min(f)-min(o))/63*1e3:.1f} ms, median {(statistics.median(f)-statistics.median(o))/63*1e3:.1f} ms; 1-token {min(o):.2f}/{statistics.median(o):.2f} s; 64-token {min(f):.2f}/{statistics.median(f):.2f} s")
