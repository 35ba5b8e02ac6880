"""What an export can be: the CLI's choices and the library's checks, in one place.

Kept free of heavy imports so that `gemma-grpo export --help` lists them at once.
"""

FORMATS = ("hf", "gguf")  # hf: a safetensors directory; gguf: one file for llama.cpp
DTYPES = ("float32", "bfloat16")  # the saved weights' dtype, cast after merging in float32
# GGUF block quantizations, by llama.cpp's names: the ones gguf-py can write. K-quants
# (q4_k_m, ...) it can only read: llama.cpp's llama-quantize makes them from the float32 file.
QUANTS = ("q8_0", "q4_0")
GGUF_FILE = "model.gguf"  # the one file a gguf export writes, beside its README.md
