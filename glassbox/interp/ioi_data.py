"""IOIDataset: indirect-object-identification prompts from templates (Wang et al. 2022).

A template such as "[A] and [B] went to the [LOCATION] ... [B] handed the [OBJECT] to [A]" gets one
random noun per placeholder of ``nouns`` (the same noun at every occurrence), then two distinct
names: A is the indirect object (IO, the right answer), B the subject (S). ``symmetric`` adds the
same filled template with the names swapped. The defaults are TransformerLens's templates, names and
nouns, and the draws are made in TransformerLens's order with Python's ``random``, so a ``seed``
gives TransformerLens's prompts for that seed.

Differences from TransformerLens: a ``seed`` seeds a private ``random.Random`` (TransformerLens
reseeds the global generator); without one the global ``random`` is used, as there. Texts are
encoded without special tokens (``add_special_tokens=False``; the same ids for GPT-2's tokenizer),
so a tokenizer that adds its own BOS does not get two.
"""

import random
from typing import Dict, List, Optional

import torch
from torch.utils.data import Dataset


class IOIDataset(Dataset):
    """Items ``{"prompt": ids (BOS first if prepend_bos), "IO": ids of " A", "S": ids of " B"}``."""

    def __init__(self, tokenizer, templates: Optional[List[str]] = None, names: Optional[List[str]] = None,
                 nouns: Optional[Dict[str, List[str]]] = None, num_samples: int = 1000, symmetric: bool = False,
                 prepend_bos: bool = True, seed: Optional[int] = None):
        self.tokenizer = tokenizer
        self.prepend_bos = prepend_bos
        self.templates = list(templates) if templates is not None else self.get_default_templates()
        self.names = list(names) if names is not None else self.get_default_names()
        self.nouns = dict(nouns) if nouns is not None else self.get_default_nouns()
        if not self.templates:
            raise ValueError("IOIDataset needs at least one template")
        if len(set(self.names)) < 2:
            raise ValueError(f"IOIDataset needs at least two distinct names, got {self.names!r}")
        for kind, choices in self.nouns.items():
            if not choices:
                raise ValueError(f"nouns[{kind!r}] is empty")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples must be an int >= 0, got {num_samples!r}")
        if prepend_bos and tokenizer.bos_token_id is None:
            raise ValueError("prepend_bos=True but the tokenizer has no BOS token")
        self._rng = random.Random(seed) if seed is not None else None
        self.samples: List[Dict[str, str]] = []
        for _ in range(num_samples // 2 if symmetric else num_samples):
            self.samples.extend(self.get_sample(symmetric=symmetric))

    def __len__(self) -> int:
        return len(self.samples)

    def _encode(self, text: str) -> List[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def __getitem__(self, idx) -> dict:
        sample = self.samples[idx]
        prompt = self._encode(sample["text"])
        if self.prepend_bos:
            prompt = [self.tokenizer.bos_token_id] + prompt
        return {"prompt": torch.LongTensor(prompt), "IO": torch.LongTensor(self._encode(sample["IO"])),
                "S": torch.LongTensor(self._encode(sample["S"]))}

    def get_sample(self, symmetric: bool = False) -> List[Dict[str, str]]:
        """One filled template (two with ``symmetric``): ``{"text", "IO", "S"}``, names with a leading space."""
        rng = self._rng if self._rng is not None else random
        template = rng.choice(self.templates)
        for kind, choices in self.nouns.items():
            template = template.replace(f"[{kind}]", rng.choice(choices))
        a, b = rng.sample(self.names, 2)
        samples = [{"text": template.replace("[A]", a).replace("[B]", b), "IO": " " + a, "S": " " + b}]
        if symmetric:
            samples.append({"text": template.replace("[A]", b).replace("[B]", a), "IO": " " + b, "S": " " + a})
        return samples

    @staticmethod
    def get_default_names() -> List[str]:
        return ["John", "Mary"]

    @staticmethod
    def get_default_templates() -> List[str]:
        return [
            "[A] and [B] went to the [LOCATION] to buy [OBJECT]. [B] handed the [OBJECT] to [A]",
            "Then, [B] and [A] went to the [LOCATION]. [B] gave the [OBJECT] to [A]",
        ]

    @staticmethod
    def get_default_nouns() -> Dict[str, List[str]]:
        return {"LOCATION": ["store", "market"], "OBJECT": ["milk", "eggs", "bread"]}
