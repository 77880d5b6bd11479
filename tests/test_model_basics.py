"""Config validation, HOOK_SHAPES against every activation, residual identities, bad input, loss."""

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY
from glassbox.models import HOOK_SHAPES, Config, HookedTransformer, hook_pattern, hook_shape
from glassbox.models.hook_shapes import NON_DEFAULT_HOOKS


def record_all(model, tokens):
    acts = {}
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: True, lambda x, hook: acts.__setitem__(hook.name, x.clone()))])
    return acts


@pytest.mark.parametrize("fields,message", [
    (dict(d_model=16, n_heads=3), "d_model=16 is not divisible by n_heads=3"),
    (dict(n_layers=0), "n_layers must be a positive int"),
    (dict(act_fn="prelu"), "act_fn must be one of"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps must be a finite number > 0"),
    (dict(d_vocab=-3), "d_vocab must be a positive int, got -3"),
])
def test_config_errors_name_the_field(fields, message):
    base = dict(d_model=12, n_layers=2, n_heads=3, d_vocab=7, n_ctx=5)
    with pytest.raises(ValueError, match=message):
        Config(**{**base, **fields})


def test_config_is_frozen_and_derives_sizes():
    cfg = Config(d_model=12, n_layers=2, n_heads=3, d_vocab=7, n_ctx=5)
    assert (cfg.d_head, cfg.d_mlp) == (4, 48)
    with pytest.raises(Exception):
        cfg.d_model = 3


def test_every_activation_matches_hook_shapes_table(tiny_model, tiny_tokens):
    acts = record_all(tiny_model, tiny_tokens)
    assert set(acts) == set(tiny_model.hook_dict), "every hook point must fire on every forward"
    cfg = tiny_model.cfg
    sizes = dict(batch=3, pos=11, query_pos=11, key_pos=11, head=cfg.n_heads, d_model=cfg.d_model,
                 d_head=cfg.d_head, d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab)
    patterns = {hook_pattern(name) for name in acts}
    assert patterns == set(HOOK_SHAPES) - NON_DEFAULT_HOOKS, "HOOK_SHAPES must list exactly the hook points the model has"
    for name, act in acts.items():
        expected = tuple(int(ax) if ax.isdigit() else sizes[ax] for ax in hook_shape(name).split())
        assert tuple(act.shape) == expected, f"{name}: shape {tuple(act.shape)}, HOOK_SHAPES says {expected}"


def test_residual_identities(tiny_model, tiny_tokens):
    acts = record_all(tiny_model, tiny_tokens)
    torch.testing.assert_close(acts["blocks.0.hook_resid_pre"], acts["hook_embed"] + acts["hook_pos_embed"], atol=0, rtol=0)
    for L in range(TINY["n_layer"]):
        b = f"blocks.{L}."
        torch.testing.assert_close(acts[b + "hook_resid_mid"], acts[b + "hook_resid_pre"] + acts[b + "hook_attn_out"], atol=0, rtol=0)
        torch.testing.assert_close(acts[b + "hook_resid_post"], acts[b + "hook_resid_mid"] + acts[b + "hook_mlp_out"], atol=0, rtol=0)
    scores = acts["blocks.1.attn.hook_attn_scores"]
    assert torch.isinf(scores[..., 0, 1:]).all() and not torch.isinf(scores[..., -1, :]).any()


def test_layer_norm_hooks_by_hand(tiny_model, tiny_tokens):
    acts = record_all(tiny_model, tiny_tokens)
    x = acts["blocks.1.hook_resid_mid"].double()
    ln = tiny_model.blocks[1].ln2
    scale = ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True).add(ln.eps).sqrt()
    # measured 2.5e-8 (values up to 0.48), bound 1e-6: 40x
    torch.testing.assert_close(acts["blocks.1.ln2.hook_scale"].double(), scale, atol=1e-6, rtol=0)
    normalized = (x - x.mean(-1, keepdim=True)) / scale  # before w and b, as in TransformerLens 3.x
    # measured 2.8e-7 (values up to 2.2), bound 5e-6: 18x
    torch.testing.assert_close(acts["blocks.1.ln2.hook_normalized"].double(), normalized, atol=5e-6, rtol=0)
    expected = normalized * ln.w.double() + ln.b.double()
    # measured 5.4e-7 (values up to 2.8), bound 1e-5: 18x
    torch.testing.assert_close(acts["blocks.1.ln2.hook_out"].double(), expected, atol=1e-5, rtol=0)


def test_loss_is_mean_next_token_cross_entropy(tiny_model, tiny_tokens):
    with torch.no_grad():
        logits, loss = tiny_model(tiny_tokens, return_type="both")
        per_token = tiny_model(tiny_tokens, return_type="loss", loss_per_token=True)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tiny_tokens[:, 1:].reshape(-1), reduction="none")
    # measured 0 (values up to 3.6), bound 1e-6 (exact here)
    torch.testing.assert_close(per_token, expected.view(3, 10), atol=1e-6, rtol=0)
    # measured 0 (values up to 3.4), bound 1e-6 (exact here)
    torch.testing.assert_close(loss, expected.mean(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("tokens,message", [
    (torch.tensor([[1, 2, 29]]), "token id 29 is outside \\[0, d_vocab=29\\)"),
    (torch.tensor([[1, -1]]), "token id -1 is outside"),
    (torch.zeros(1, 18, dtype=torch.long), "18 tokens is longer than n_ctx=17"),
    (torch.tensor([[1.0, 2.0]]), "integer tensor, got dtype torch.float32"),
    (torch.zeros(1, 0, dtype=torch.long), "empty"),
])
def test_bad_tokens_are_refused_by_name(tiny_model, tokens, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(tokens)


def test_weights_stored_in_kernel_layout(tiny_model):
    attn = tiny_model.blocks[0].attn
    cfg = tiny_model.cfg
    assert attn.W_Q.shape == (cfg.n_heads, cfg.d_model, cfg.d_head)
    flat = attn.W_Q.permute(1, 0, 2).reshape(cfg.d_model, -1)
    assert flat.data_ptr() == attn.W_Q.data_ptr() and flat.is_contiguous(), "forward must read W_Q without a copy"
    assert tiny_model.W_U.data_ptr() == tiny_model.W_E.data_ptr(), "GPT-2's unembedding is tied to W_E"


def test_meta_device_and_dtype():
    cfg = Config(d_model=12, n_layers=2, n_heads=3, d_vocab=7, n_ctx=5)
    model = HookedTransformer(cfg, device="meta", dtype=torch.float16)
    assert all(p.device.type == "meta" and p.dtype == torch.float16 for p in model.parameters())


def test_replace_derives_sizes_again():
    cfg = Config(d_model=12, n_layers=2, n_heads=3, d_vocab=7, n_ctx=5)
    smaller = cfg.replace(d_model=8, n_heads=2)
    assert (smaller.d_head, smaller.d_mlp) == (4, 32)
    explicit = Config(d_model=12, n_layers=2, n_heads=3, d_vocab=7, n_ctx=5, d_head=5, d_mlp=7)
    assert (explicit.replace(d_model=20).d_head, explicit.replace(d_model=20).d_mlp) == (5, 7)


def test_init_zeroes_every_bias_and_scales_residual_writers():
    torch.manual_seed(0)
    model = HookedTransformer(Config(d_model=64, n_layers=8, n_heads=4, d_vocab=97, n_ctx=16))
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "b" or leaf.startswith("b_"):
            assert not param.any(), f"{name} should start at zero"
        elif leaf == "w":
            assert (param == 1).all(), name
    w_q, w_o = model.blocks[0].attn.W_Q, model.blocks[0].attn.W_O
    assert 0.018 < float(w_q.detach().std()) < 0.022
    assert 0.018 / 4 < float(w_o.detach().std()) < 0.022 / 4  # 0.02 / sqrt(2 * 8 layers)
