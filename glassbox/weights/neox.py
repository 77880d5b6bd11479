"""Pure converters between ``transformers`` GPT-NeoX / Pythia and glassbox, both ways."""

FAMILIES = []
