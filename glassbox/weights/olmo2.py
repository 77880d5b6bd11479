"""Pure converters between ``transformers`` OLMo 2 and glassbox, both ways."""

FAMILIES = []
