"""glassbox.tl.HookedTransformer's TransformerLens-facing defaults on the shipped model: to_tokens
truncates as TransformerLens's does, default_padding_side reaches every tokenizing method, and
generate has TransformerLens's return types.

Oracles: the tokenizer's own ids, each prompt run alone (for padding), glassbox's own greedy
generate (for generate's tokens).
"""

import pytest
import torch

import glassbox
from glassbox import tl


@pytest.fixture(scope="module")
def base():
    return glassbox.HookedTransformer.from_pretrained("glassbox-austen")


@pytest.fixture(scope="module")
def model():
    return tl.HookedTransformer.from_pretrained_no_processing("glassbox-austen")


def test_to_tokens_truncates_by_default_as_transformer_lens(model):
    long = "Elizabeth walked on. " * 200
    ids = [model.tokenizer.bos_token_id] + model.tokenizer.encode(long, add_special_tokens=False)
    assert len(ids) > model.cfg.n_ctx
    assert model.to_tokens(long).tolist() == [ids[: model.cfg.n_ctx]]
    assert model.to_tokens(long, truncate=False).tolist() == [ids]


def test_default_padding_side_left_reaches_tokenize_and_forward(base):
    left = tl.HookedTransformer.from_pretrained_no_processing("glassbox-austen", default_padding_side="left")
    prompts = ["Elizabeth read the letter", "Jane"]
    toks = left.to_tokens(prompts)
    alone = [left.to_tokens(p)[0] for p in prompts]
    assert toks[1, -len(alone[1]):].tolist() == alone[1].tolist()  # padded on the left
    assert left.to_str_tokens(prompts)[1][-1] == "Jane"
    with torch.no_grad():
        last = left(prompts)[:, -1]
        for row, prompt in enumerate(prompts):
            # measured 8.6e-6 (logits up to 12) against the prompt alone, bound 1e-4: 12x
            assert (last[row] - base(prompt)[0, -1]).abs().max() < 1e-4


def test_generate_has_transformer_lens_return_types(model, base):
    prompt = "Elizabeth read the"
    text = model.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False)
    assert isinstance(text, str) and text.startswith(prompt)
    expected = base.generate(prompt, max_new_tokens=6)
    tokens = model.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False, return_type="tokens")
    assert torch.equal(tokens, expected)
    assert text == prompt + model.tokenizer.decode(expected[0, len(model.to_tokens(prompt)[0]):])


def test_tokenizer_name_of_a_folder_reloads_its_tokenizer(tmp_path):
    """cfg.tokenizer_name is where AutoTokenizer finds the model's tokenizer, as in TransformerLens
    (circuit-tracer's frontend export reloads it by that name): a folder holding tokenizer files;
    None where the tokenizer was passed in, or the folder holds none."""
    import shutil

    from transformers import AutoTokenizer

    shipped = glassbox.weights.pretrained.SHIPPED_DIR / "glassbox-austen"
    folder = tmp_path / "with_tokenizer"
    shutil.copytree(shipped, folder)
    model = tl.HookedTransformer.from_pretrained_no_processing(str(folder))
    assert model.cfg.tokenizer_name == str(folder)
    text = "Elizabeth read the letter, and Jane"
    assert AutoTokenizer.from_pretrained(model.cfg.tokenizer_name).encode(text) == model.tokenizer.encode(text)
    given = tl.HookedTransformer.from_pretrained_no_processing(str(folder), tokenizer=model.tokenizer)
    assert given.cfg.tokenizer_name is None
    assert tl.HookedTransformer.from_pretrained_no_processing("glassbox-austen").cfg.tokenizer_name is None
