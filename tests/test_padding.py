"""Batches of prompts: padding on either side changes nothing at real tokens, for GPT-2's tokenizer
where pad, BOS and EOS are one id. The oracle is each prompt run alone, unpadded."""

import pytest
import torch

from glassbox import Config, HookedTransformer
from glassbox.interp import get_last_token_logits
from glassbox.models import gpt2_tokenizer

EOT = 50256
PROMPTS = [
    "Hello world",
    "The cat sat on the mat and looked at the door",
    "<|endoftext|>Text with the end-of-text id<|endoftext|> inside it",
    "a",
]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Config(d_model=14, n_layers=2, n_heads=2, d_head=7, d_mlp=17, d_vocab=50257, n_ctx=31)
    m = HookedTransformer(cfg, tokenizer=gpt2_tokenizer()).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # generic biases, and a position embedding large enough to matter
        for name, param in m.named_parameters():
            if param.ndim == 1:
                param.copy_(0.3 * torch.randn(param.shape, generator=gen))
        m.pos_embed.W_pos.mul_(20)
    return m


def test_gpt2_pad_bos_and_eos_are_one_id(model):
    assert model.pad_token_id == model.bos_token_id == model.tokenizer.eos_token_id == EOT
    tokens, mask = model.tokenize(PROMPTS, padding_side="right")
    real_eot = int(((tokens == EOT) & mask).sum())
    assert real_eot == len(PROMPTS) + 2  # every BOS, and the two inside the third prompt
    assert int(((tokens == EOT) & ~mask).sum()) == int((~mask).sum()) > 0  # the pads


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_logits_equal_each_prompt_alone(model, side):
    tokens, mask = model.tokenize(PROMPTS, padding_side=side)
    with torch.no_grad():
        batch = model(PROMPTS, padding_side=side)
        torch.testing.assert_close(batch, model(tokens, attention_mask=mask), atol=0, rtol=0)
        for i, prompt in enumerate(PROMPTS):
            alone = model(prompt)[0]
            assert alone.shape[0] == int(mask[i].sum())
            # measured 3.7e-8 (values up to 0.17), bound 1e-5: 268x
            torch.testing.assert_close(batch[i][mask[i]], alone, atol=1e-5, rtol=0, msg=f"{side} {prompt!r}")
            # measured 3.7e-8 (values up to 0.17), bound 1e-5: 268x
            torch.testing.assert_close(get_last_token_logits(batch, mask)[i], alone[-1], atol=1e-5, rtol=0)
    if side == "right":
        assert not torch.allclose(batch[0, -1], get_last_token_logits(batch, mask)[0])  # [:, -1] is a pad


@pytest.mark.parametrize("side", ["left", "right"])
def test_positions_count_real_tokens_only(model, side):
    tokens, mask = model.tokenize(PROMPTS, padding_side=side)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter="hook_pos_embed",
                                        return_type=None)
    W_pos = model.W_pos.detach()
    for i in range(len(PROMPTS)):
        n = int(mask[i].sum())
        torch.testing.assert_close(cache["hook_pos_embed"][i][mask[i]], W_pos[:n], atol=0, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_loss_ignores_pads(model, side):
    tokens, mask = model.tokenize(PROMPTS, padding_side=side)
    with torch.no_grad():
        per_token = model(tokens, attention_mask=mask, return_type="loss", loss_per_token=True)
        mean = model(tokens, attention_mask=mask, return_type="loss")
        alone = [model(p, return_type="loss", loss_per_token=True)[0] for p in PROMPTS if len(model.to_tokens(p)[0]) > 1]
    pair = mask[:, 1:] & mask[:, :-1]
    rows = [per_token[i][pair[i]] for i in range(len(PROMPTS)) if pair[i].any()]
    for got, ref in zip(rows, alone):
        # measured 0 (values up to 11), bound 1e-5 (exact here)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert float(per_token[~pair].abs().max()) == 0.0
    # measured 0 (values up to 11), bound 1e-5 (exact here)
    torch.testing.assert_close(mean, torch.cat(alone).mean(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_cached_activations_match_alone(model, side):
    with torch.no_grad():
        _, cache = model.run_with_cache(PROMPTS, padding_side=side)
        mask = cache.attention_mask
        for i, prompt in enumerate(PROMPTS):
            _, alone = model.run_with_cache(prompt)
            for name in ("blocks.1.hook_resid_post", "blocks.0.attn.hook_z", "ln_final.hook_scale"):
                # measured 1.5e-7 (values up to 1.6), bound 1e-5: 67x
                torch.testing.assert_close(cache[name][i][mask[i]], alone[name][0], atol=1e-5, rtol=0, msg=name)
            real = mask[i].nonzero()[:, 0]
            pattern = cache["pattern", 1][i][:, real][:, :, real]  # real queries over real keys
            # measured 0 (values up to 1), bound 1e-6 (exact here)
            torch.testing.assert_close(pattern, alone["pattern", 1][0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_generation_equals_each_prompt_alone(model, side):
    tokens, mask = model.tokenize(PROMPTS[:3], padding_side=side)
    out = model.generate(PROMPTS[:3], 6, padding_side=side, eos_token_id=None)
    assert torch.equal(out[:, : tokens.shape[1]], tokens)
    for i, prompt in enumerate(PROMPTS[:3]):
        alone = model.generate(prompt, 6, eos_token_id=None)
        assert torch.equal(out[i, tokens.shape[1]:], alone[0, int(mask[i].sum()):]), prompt
