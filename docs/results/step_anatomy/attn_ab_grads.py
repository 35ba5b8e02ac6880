exec(open("docs/results/step_anatomy/attn_ab.py").read().split("    times = {n: []")[0] + "    outs = {n: p(lora_state, rest) for n, p in programs.items()}\n")
import numpy as np
gq, go = outs["qwix output"][1], outs["lora_dot output"][1]
fq, fo = dict(nnx.to_flat_state(gq)), dict(nnx.to_flat_state(go))
rows = []
for k in fq:
    a, b = np.asarray(fq[k].value), np.asarray(fo[k].value)
    rows.append((float(np.abs(a - b).max() / (np.abs(a).max() + 1e-30)), float(np.abs(a).max()), float(np.abs(b).max()), k))
rows.sort(reverse=True)
for r in rows[:8]: print(f"{r[0]:.2e} qwix max {r[1]:.3e} ours max {r[2]:.3e} {r[3]}")
print("median rel", sorted(r[0] for r in rows)[len(rows)//2])
num = sum(float(np.sum((np.asarray(fq[k].value, np.float64) - np.asarray(fo[k].value, np.float64)) ** 2)) for k in fq)
den = sum(float(np.sum(np.asarray(fq[k].value, np.float64) ** 2)) for k in fq)
print(f"||g_ours - g_qwix|| / ||g_qwix|| over all LoRA gradients: {np.sqrt(num / den):.2e}")
flat_q = np.concatenate([np.asarray(fq[k].value).ravel() for k in fq]); flat_o = np.concatenate([np.asarray(fo[k].value).ravel() for k in fq])
print(f"cosine {float(flat_q @ flat_o / np.linalg.norm(flat_q) / np.linalg.norm(flat_o)):.8f}; largest entry difference / largest entry: {np.abs(flat_q - flat_o).max() / np.abs(flat_q).max():.2e}")
