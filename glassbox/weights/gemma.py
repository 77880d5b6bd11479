"""Pure converters between ``transformers`` Gemma 1, 2 and 3 and glassbox, both ways."""

FAMILIES = []
