"""GPT-2 weight conversion both ways, loading by folder and by hub name (offline cache), configs."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import TINY, make_hf_gpt2
from glassbox.models import Config, HookedTransformer
from glassbox.weights import HUB_MODELS, config_from_hf, glassbox_to_hf, hf_to_glassbox, hub_config


def test_round_trip_ours_hf_ours_is_exact(tiny_model):
    ours = tiny_model.state_dict()
    back = hf_to_glassbox(glassbox_to_hf(ours, tiny_model.cfg), tiny_model.cfg)
    assert set(back) == set(ours)
    for key in ours:
        assert torch.equal(back[key], ours[key]), key


def test_to_hf_exports_same_logits(tiny_model, tiny_hf, tiny_tokens):
    exported = tiny_model.to_hf()
    with torch.no_grad():
        torch.testing.assert_close(exported(tiny_tokens).logits, tiny_hf(tiny_tokens).logits, atol=0, rtol=0)


def test_shape_check_names_the_tensor(tiny_hf):
    cfg = config_from_hf(tiny_hf.config)
    sd = dict(tiny_hf.state_dict())
    sd["transformer.h.1.mlp.c_fc.weight"] = sd["transformer.h.1.mlp.c_fc.weight"][:, :-1]
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.mlp\.c_fc\.weight has shape \(15, 21\), expected \(15, 22\)"):
        hf_to_glassbox(sd, cfg)


def test_save_pretrained_folder_loads_in_both(tiny_model, tiny_tokens, tmp_path):
    from transformers import GPT2LMHeadModel

    tiny_model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    again = HookedTransformer.from_pretrained(str(tmp_path))
    hf = GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        expected = tiny_model(tiny_tokens)
        torch.testing.assert_close(again(tiny_tokens), expected, atol=0, rtol=0)
        # measured 0 (values up to 0.21), bound 1e-5 (exact here)
        torch.testing.assert_close(hf(tiny_tokens).logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2"])
def test_hub_configs_build_correctly_shaped_models(name):
    from transformers import GPT2Config, GPT2LMHeadModel

    n_layer, n_embd, n_head = HUB_MODELS[name]
    cfg = hub_config(name)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp) == (n_layer, n_embd, n_head, n_embd // n_head, 4 * n_embd)
    assert (cfg.d_vocab, cfg.n_ctx, cfg.act_fn) == (50257, 1024, "gelu_new")
    model = HookedTransformer(cfg, device="meta")
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head))
    hf_shapes = {k: tuple(v.shape) for k, v in glassbox_to_hf(model.state_dict(), cfg).items()}
    for key, value in hf.state_dict().items():
        if key in hf_shapes:
            assert hf_shapes[key] == tuple(value.shape), key
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf.parameters())


def _fill_hub_cache(cache, model):
    """Lay out a Hugging Face hub cache entry the way huggingface_hub writes one: blobs + snapshot links."""
    repo = cache / "models--gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    staging = cache / "staging"
    model.save_pretrained(staging)
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in staging.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_from_pretrained_by_hub_name_uses_offline_cache(tiny_model, tiny_tokens, tmp_path):
    cache = tmp_path / "hub"
    _fill_hub_cache(cache, tiny_model)
    with torch.no_grad():
        expected = tiny_model(tiny_tokens)
    torch.save(tiny_tokens, tmp_path / "tokens.pt")
    script = textwrap.dedent(f"""
        import torch
        from glassbox import HookedTransformer
        model = HookedTransformer.from_pretrained("gpt2")
        tokens = torch.load({str(tmp_path / 'tokens.pt')!r}, weights_only=True)
        with torch.no_grad():
            torch.save(model(tokens), {str(tmp_path / 'logits.pt')!r})
        print(model.cfg.n_layers, model.cfg.d_model)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [str(TINY["n_layer"]), str(TINY["n_embd"])]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt", weights_only=True), expected, atol=0, rtol=0)


def test_hub_name_missing_from_offline_cache_says_so(tmp_path):
    script = "from glassbox import HookedTransformer; HookedTransformer.from_pretrained('gpt2-medium')"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path), "HF_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "could not fetch 'gpt2-medium'" in run.stderr


def test_unknown_name_is_refused_clearly():
    with pytest.raises(ValueError, match="'not-a-model' is neither a folder"):
        HookedTransformer.from_pretrained("not-a-model")
