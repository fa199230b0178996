"""RAPT's tuning: the tuners (prompt, prefix, LoRA, full), task heads, plain-token reconstruction,
many LoRA adapters in one pass, and ``tune`` that puts them together."""
