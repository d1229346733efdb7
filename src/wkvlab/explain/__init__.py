"""Explain where combined weight × KV-cache quantization error comes from (issue #5)."""
