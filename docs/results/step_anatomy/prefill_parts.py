# Evidence, committed with its output in 44cdf16: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-44cdf16 44cdf16
import os, sys, time
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import common, jax, jax.numpy as jnp, numpy as np
from flax import nnx
from tunix.rl.rollout import base_rollout
import rollout as rollout_bench
from gemma_grpo import rollout, logprobs
actor, tokenizer, mesh = rollout_bench.build_policy(common.offline_270m_dir())
texts = rollout_bench.batch_texts(common.PROMPTS_PER_STEP, common.GENERATIONS)
width = max(len(tokenizer.encode(t)) for t in texts)
eng = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=common.LORA_ALPHA / common.LORA_RANK)
def cfg(n, s):
    return base_rollout.RolloutConfig(max_tokens_to_generate=n, max_prompt_length=width, kv_cache_size=width + n,
        temperature=common.TEMPERATURE, top_p=1.0, top_k=common.TOP_K, eos_tokens=[-1], seed=jax.random.PRNGKey(s))
rows = [eng.tokenize(p) for p in texts]
pad = eng.pad_id()
P = 157
padded = np.stack([np.pad(r, (P - len(r), 0), constant_values=pad) for r in rows])
starts, G = rollout.group_rows(texts)
ids = jnp.asarray(padded[starts])
sampling = rollout.Sampling(greedy=False, temperature=0.9, top_k=50, top_p=1.0)

@jax.jit
def fwd_only(graphdef, state, ids):
    model = nnx.merge(graphdef, state)
    cache = model.empty_cache(ids.shape[0], ids.shape[1] + 64)
    pos, mask = logprobs.positions_and_mask(ids, pad)
    mask = jnp.pad(mask, ((0,0),(0,0),(0,64)))
    logits, cache = model(ids, pos, cache, mask, decode_only_last_token=True)
    return logits, cache

@jax.jit
def screen_only(emb):
    return emb.astype(jnp.bfloat16), jnp.max(jnp.linalg.norm(emb.astype(jnp.float32), axis=-1))

@jax.jit
def merge_only(graphdef, state):
    model = nnx.merge(graphdef, state)
    return rollout.decode_weights(model, 1.0)

def t(name, f, n=5):
    ts = []
    for i in range(n+1):
        t0 = time.perf_counter(); out = f(); jax.block_until_ready(out); 
        if i: ts.append(time.perf_counter() - t0)
    print(f"{name}: min {min(ts)*1e3:.1f} med {sorted(ts)[len(ts)//2]*1e3:.1f} ms", flush=True)

with mesh:
    t("nnx.split", lambda: nnx.split(actor))
    g, s = nnx.split(actor)
    t("fwd_only", lambda: fwd_only(g, s, ids))
    emb = actor.embedder.input_embedding.value
    t("screen_only", lambda: screen_only(emb))
    t("merge_only", lambda: merge_only(g, s))
    t("_prefill", lambda: rollout._prefill(g, s, ids, jax.random.PRNGKey(0), lora_scale=1.0, rows_per_prompt=G, new_tokens=64, pad_id=pad, sampling=sampling, decode_dtype="float32", screened=True))
    t("generate 1", lambda: eng.generate(texts, cfg(1, 0)).tokens)
    t("tokenize", lambda: [eng.tokenize(p) for p in texts])
