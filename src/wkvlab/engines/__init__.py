"""Real engines next to the simulation: llama.cpp in-process and OpenAI-compatible servers.

See docs/engines.md. :mod:`wkvlab.engines.api` is the entry point; llama-cpp-python is imported
only when a llama.cpp engine is built, so the rest works without it.
"""
