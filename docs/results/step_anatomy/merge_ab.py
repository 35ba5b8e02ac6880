# Evidence, committed with its output in 44cdf16: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-44cdf16 44cdf16
import sys, time, statistics
exec(open("docs/results/step_anatomy/prefill_parts.py").read().split("def t(name")[0])
from gemma_grpo import lora
from gemma_grpo.rollout import LayerWeights
def merged_as(module, name, scale, perm):
    w = getattr(module, name).value
    w_t = jnp.transpose(w, perm)
    a = getattr(module, f"{name}_lora_a", None)
    if a is None: return w_t
    b = getattr(module, f"{name}_lora_b").value
    es = getattr(module, "einsum_str", None)
    a_str, b_str, w_str = lora.einsum_lora_strs(es) if es else ("ir", "ro", "io")
    out = "".join(w_str[p] for p in perm)
    delta = jnp.einsum(f"{a_str},{b_str}->{out}", a.value, b)
    return w_t + (scale * delta).astype(w.dtype)
def decode_weights2(model, lora_scale, dtype=jnp.float32):
    layers = []
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        q = merged_as(attn.q_einsum, "w", lora_scale, (0, 2, 1))
        kv = merged_as(attn.kv_einsum, "w", lora_scale, (0, 1, 3, 2))
        out = merged_as(attn.attn_vec_einsum, "w", lora_scale, (2, 0, 1))
        d = q.shape[-1]
        layers.append(LayerWeights(
            attn_norm_D=layer.pre_attention_norm.scale.value,
            query_NHxD=q.reshape(-1, d).astype(dtype),
            key_value_2KHxD=kv.reshape(-1, d).astype(dtype),
            query_norm_H=attn._query_norm.scale.value, key_norm_H=attn._key_norm.scale.value,
            out_DxNH=out.reshape(out.shape[0], -1).astype(dtype),
            post_attn_norm_D=layer.post_attention_norm.scale.value,
            ffw_norm_D=layer.pre_ffw_norm.scale.value,
            gate_up_2FxD=jnp.concatenate([merged_as(mlp.gate_proj, "kernel", lora_scale, (1, 0)),
                                          merged_as(mlp.up_proj, "kernel", lora_scale, (1, 0))], axis=0).astype(dtype),
            down_DxF=merged_as(mlp.down_proj, "kernel", lora_scale, (1, 0)).astype(dtype),
            post_ffw_norm_D=layer.post_ffw_norm.scale.value))
    return layers
# give adapters nonzero B
lstate = nnx.state(actor, nnx.LoRAParam)
nnx.update(actor, jax.tree.map(lambda x: x + 0.01, lstate))
@jax.jit
def m1(g, s): return rollout.decode_weights(nnx.merge(g, s), 1.0)
@jax.jit
def m2(g, s): return decode_weights2(nnx.merge(g, s), 1.0)
with mesh:
    g, s = nnx.split(actor)
    a, b = m1(g, s), m2(g, s)
    diffs = jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)
    print("max abs diff", max(jax.tree.leaves(diffs)), "equal shapes", jax.tree.map(lambda x, y: x.shape == y.shape, a, b) and True)
    ts = {"old": [], "new": []}
    for r in range(8):
        for n, f in (("old", m1), ("new", m2)):
            t0 = time.perf_counter(); jax.block_until_ready(f(g, s)); ts[n].append(time.perf_counter() - t0)
    for n, t in ts.items(): print(n, f"min {min(t)*1e3:.0f} med {statistics.median(t)*1e3:.0f} ms")
