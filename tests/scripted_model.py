"""A tiny random Gemma-3 with a planted script: it calls the calculator.

The tiny random model of configs/tiny.py almost never writes a tool call, and
the real 270M writes them but compiles for minutes in each process of a
two-process run. This model is the tiny one (same shapes) plus a lookup in its
first MLP that makes each token of one short script predict the next, so that
after the chat prompt's final "\\n" every completion calls the tool, and samples
which call, at odds of about 4 to 1 (52 and 12 of 64 samples at temperature
0.9, from `gemma-grpo eval --config configs/tiny.py --model DIR --num-test 8
--num-samples 8 --max-new-tokens 48 --config.rollout.tools=calculator`):

  <tool_call>calculator: 6*7</tool_call>   (the tool answers 42);
  <tool_call>calculator: 6/</tool_call>    (the tool answers an error);

then, after the result, it repeats "calculator: 6*7</tool_call>" (a malformed
call: no opening tag, answered with an error) until its token budget.
Everything else about it is random, so every weight still gets gradients.

How the lookup works: each script token k owns a basis direction u_k of the
embedding space; its embedding is SCALE * u_k, far larger than the random
rows. MLP unit k of layer 0 fires only on u_k (its gate and up rows read
u_k) and writes the sum of u_s over k's successors s; a large post-MLP norm
scale on the script directions makes that write dominate the residual, so the
tied LM head ranks the successors first, in the order of their weights.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
from safetensors.numpy import save_file

from configs import tiny
from gemma_grpo.config import settings
from gemma_grpo.model import model_loading

NEWLINE = 107
LT, TOOL, UNDERSCORE, CALL, GT = 236820, 13205, 236779, 6639, 236813
CALCULATOR, COLON, SPACE, SIX, TIMES, SEVEN, CLOSE, DIVIDE_CLOSE = (
    47552, 236787, 236743, 236825, 236829, 236832, 954, 102268)

# token -> the tokens it predicts, each with the weight of its direction in
# the MLP's write (0.99 made the odds 31 to 1; 0.998, 4 to 1)
SUCCESSORS = {
    NEWLINE: ((LT, 1.0),),
    LT: ((TOOL, 1.0),), TOOL: ((UNDERSCORE, 1.0),), UNDERSCORE: ((CALL, 1.0),),
    CALL: ((GT, 1.0),), GT: ((CALCULATOR, 1.0),), CALCULATOR: ((COLON, 1.0),),
    COLON: ((SPACE, 1.0),), SPACE: ((SIX, 1.0),),
    SIX: ((TIMES, 1.0), (DIVIDE_CLOSE, 0.998)),
    TIMES: ((SEVEN, 1.0),), SEVEN: ((CLOSE, 1.0),), CLOSE: ((TOOL, 1.0),),
    DIVIDE_CLOSE: ((TOOL, 1.0),),
}
SCALE = 20.0


def _hf_config(r) -> dict:
  """The tiny random model's config, as a checkpoint's config.json."""
  return {**model_loading.random_hf_config(r), "architectures": ["Gemma3ForCausalLM"],
          "model_type": "gemma3_text", "tie_word_embeddings": True}


def _tensors(r, seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  d, f, h = r.embed_dim, r.hidden_dim, r.head_dim

  def normal(*shape, fan_in):
    return (rng.standard_normal(shape) * fan_in ** -0.5).astype(np.float32)

  script = sorted({*SUCCESSORS, *(s for nxt in SUCCESSORS.values() for s, _ in nxt)})
  axis = {token: i for i, token in enumerate(script)}  # token -> its basis direction
  assert len(script) <= d and len(SUCCESSORS) <= f

  embed = normal(r.vocab_size, d, fan_in=d)
  embed[script] = 0.0
  embed[script, [axis[t] for t in script]] = SCALE
  out = {"model.embed_tokens.weight": embed, "model.norm.weight": np.zeros(d, np.float32)}
  for layer in range(r.num_layers):
    p = f"model.layers.{layer}."
    gate, up, down = normal(f, d, fan_in=d), normal(f, d, fan_in=d), normal(d, f, fan_in=f)
    post_mlp = np.zeros(d, np.float32)
    if layer == 0:
      for unit, (token, successors) in enumerate(SUCCESSORS.items()):
        gate[unit], up[unit], down[:, unit] = 0.0, 0.0, 0.0
        gate[unit, axis[token]] = 10.0
        up[unit, axis[token]] = 1.0
        for s, weight in successors:
          down[axis[s], unit] = weight
      post_mlp[:len(script)] = 4 * SCALE - 1  # norm scale is 1 + w
    out.update({
        f"{p}self_attn.q_proj.weight": normal(r.num_heads * h, d, fan_in=d),
        f"{p}self_attn.k_proj.weight": normal(r.num_kv_heads * h, d, fan_in=d),
        f"{p}self_attn.v_proj.weight": normal(r.num_kv_heads * h, d, fan_in=d),
        f"{p}self_attn.o_proj.weight": normal(d, r.num_heads * h, fan_in=r.num_heads * h),
        f"{p}self_attn.q_norm.weight": np.zeros(h, np.float32),
        f"{p}self_attn.k_norm.weight": np.zeros(h, np.float32),
        f"{p}mlp.gate_proj.weight": gate, f"{p}mlp.up_proj.weight": up,
        f"{p}mlp.down_proj.weight": down,
        f"{p}post_feedforward_layernorm.weight": post_mlp,
        **{f"{p}{norm}.weight": np.zeros(d, np.float32) for norm in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm")},
    })
  return out


def write(out_dir: pathlib.Path, tokenizer_dir: pathlib.Path, seed: int = 0) -> pathlib.Path:
  """Writes the model as a Hugging Face checkpoint directory (model.source)."""
  r = settings.from_config(tiny.get_config()).model.random
  out_dir.mkdir(parents=True, exist_ok=True)
  save_file(_tensors(r, seed), str(out_dir / "model.safetensors"))
  (out_dir / "config.json").write_text(json.dumps(_hf_config(r), indent=1))
  for name in ("tokenizer.json", "tokenizer_config.json"):
    if (tokenizer_dir / name).exists():
      shutil.copy(tokenizer_dir / name, out_dir / name)
  return out_dir
