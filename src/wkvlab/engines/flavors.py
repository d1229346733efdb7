"""Known OpenAI-compatible servers; plain data, so ``wkvlab engine eval --help`` lists them without torch."""
from __future__ import annotations

# Known servers: how each one scores prompts, and whether windows must start with BOS.
FLAVORS = {
    "vllm": ("prompt_logprobs", "ids", False),
    "sglang": ("echo", "ids", False),
    "llama-cpp-python": ("echo", "text", True),
}
