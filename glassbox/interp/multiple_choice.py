"""Zero-shot multiple-choice accuracy (MMLU's format): each question shown with its lettered choices,
scored by the next-token log-probability of each choice's letter after "Answer:".

The prompt is ``"Question: {q}\\nChoices:\\nA. {c0}\\nB. {c1}\\n...Answer:"``, tokenised by
``tokenizer.encode`` as it is (GPT-2's adds no BOS; ``bos_id`` puts one first where encode did not),
one forward per question, no padding. A letter
is the single token " A" if the tokenizer has it, else the first token of "A". Ties go to the
earliest choice. Footgun: a prompt longer than the model's context is refused by the forward.
"""

from typing import Dict, List, Optional

import torch

LETTERS = ("A", "B", "C", "D")


def prompt_of(question: str, choices) -> str:
    lines = [f"Question: {question}", "Choices:"] + [f"{LETTERS[i]}. {c}" for i, c in enumerate(choices)]
    return "\n".join(lines) + "\nAnswer:"


def letter_ids(tokenizer) -> List[int]:
    ids = []
    for letter in LETTERS:
        spaced = tokenizer.encode(" " + letter, add_special_tokens=False)
        ids.append(spaced[0] if len(spaced) == 1 else tokenizer.encode(letter, add_special_tokens=False)[0])
    return ids


def multiple_choice_accuracy(model, examples: List[dict], tokenizer, bos_id: Optional[int] = None) -> Dict:
    """{"accuracy", "num_correct", "num_total", "subject_scores": {subject: accuracy}} over ``examples``
    (``{"question", "choices", "answer", "subject"}``, as glassbox.train.mmlu.load_mmlu gives)."""
    if not examples:
        raise ValueError("no questions to score")
    if tokenizer is None:
        raise ValueError("the model has no tokenizer: pass tokenizer=")
    ids = letter_ids(tokenizer)
    device = next(model.parameters()).device
    correct: Dict[str, int] = {}
    total: Dict[str, int] = {}
    with torch.no_grad():
        for example in examples:
            prompt_ids = tokenizer.encode(prompt_of(example["question"], example["choices"]))
            if bos_id is not None and (not prompt_ids or prompt_ids[0] != bos_id):
                prompt_ids = [bos_id] + list(prompt_ids)
            tokens = torch.tensor([prompt_ids], device=device)
            # the letters' logits: their order is their log-probabilities' order (one shift for all)
            last = model(tokens)[0, -1].double()
            scores = [last[ids[i]].item() for i in range(len(example["choices"]))]
            subject = example["subject"]
            total[subject] = total.get(subject, 0) + 1
            correct[subject] = correct.get(subject, 0) + int(scores.index(max(scores)) == example["answer"])
    n_correct, n_total = sum(correct.values()), sum(total.values())
    return {"accuracy": n_correct / n_total, "num_correct": n_correct, "num_total": n_total,
            "subject_scores": {s: correct[s] / total[s] for s in total}}
