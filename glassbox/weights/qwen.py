"""Pure converters between ``transformers`` Qwen2 / Qwen2.5 and Qwen3 and glassbox, both ways."""

FAMILIES = []
