"""Checkpoints and TransformerLens's short names, against TransformerLens 3.9 reading the same offline
hub cache: its aliases, its checkpoint labels, its config's checkpoint fields and the weights it
loads for a checkpoint."""

import shutil
import sys
from pathlib import Path

import pytest
import torch

import transformer_lens
import transformer_lens.loading_from_pretrained as tl_loading

import glassbox.tl as gtl
from glassbox.tl import loading_from_pretrained as gb_loading

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hub_cache import cache_hf_model, repo_folder  # noqa: E402

TOKENIZER = Path(gtl.__file__).resolve().parents[1] / "assets" / "gpt2-tokenizer"
REPO = "EleutherAI/pythia-14m"  # a Pythia repo TransformerLens knows; a tiny seeded stand-in here


def test_every_short_name_glassbox_takes_is_transformer_lens_s_name_for_the_same_repo():
    shipped = set(gb_loading.shipped_models())
    checked = 0
    for official, aliases in gb_loading.MODEL_ALIASES.items():
        if official in shipped:
            continue
        for name in [official, *aliases]:
            assert tl_loading.get_official_model_name(name) == official, name
            assert gb_loading.get_official_model_name(name) == official, name
            checked += 1
    assert checked > 70, checked


@pytest.mark.parametrize("name", ["pythia-70m", "pythia-160m-deduped-v0", "pythia-12b-v0", "stanford-gpt2-small-a",
                                  "stanford-gpt2-medium-e"])
def test_checkpoint_labels_are_transformer_lens_s(name):
    assert gb_loading.get_checkpoint_labels(name) == tl_loading.get_checkpoint_labels(name)


def test_a_model_without_checkpoints_is_a_value_error_in_both():
    with pytest.raises(ValueError):
        tl_loading.get_checkpoint_labels("gpt2")
    with pytest.raises(ValueError, match="'gpt2' has no training checkpoints"):
        gb_loading.get_checkpoint_labels("gpt2")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """REPO at main, step0, step512 and step143000, each a different seeded model with GPT-2's tokenizer."""
    import huggingface_hub.constants as hub
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    folder = tmp_path / "hub"
    commits = {}
    for seed, ref in enumerate(["main", "step0", "step512", "step143000"]):
        torch.manual_seed(seed)
        config = GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=52,
                               vocab_size=50304, max_position_embeddings=64, rotary_pct=0.25,
                               tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
        snapshot = cache_hf_model(folder, REPO, GPTNeoXForCausalLM(config).eval())
        for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZER / name, snapshot / name)
        commits[ref] = snapshot.name
    for ref, commit in commits.items():
        (repo_folder(folder, REPO) / "refs" / ref).write_text(commit)
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_CACHE", str(folder))):
        monkeypatch.setenv(var, value)
    # huggingface_hub (which TransformerLens and transformers use) read these when imported
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return folder


@pytest.mark.parametrize("kwargs", [dict(checkpoint_value=512), dict(checkpoint_index=-1), dict(checkpoint_index=0)])
def test_a_checkpoint_loads_the_revision_transformer_lens_loads(cache, kwargs):
    ref = transformer_lens.HookedTransformer.from_pretrained(REPO, device="cpu", **kwargs)
    ours = gtl.HookedTransformer.from_pretrained(REPO, device="cpu", **kwargs)
    for field in ("from_checkpoint", "checkpoint_index", "checkpoint_value", "checkpoint_label_type"):
        assert getattr(ours.cfg, field) == getattr(ref.cfg, field), field
    config = gb_loading.get_pretrained_model_config(REPO, **kwargs)
    tl_config = tl_loading.get_pretrained_model_config(REPO, **kwargs)
    for field in ("from_checkpoint", "checkpoint_index", "checkpoint_value", "checkpoint_label_type", "n_layers"):
        assert getattr(config, field) == getattr(tl_config, field), field
    tokens = torch.tensor([[0, 464, 3290, 318, 257, 1332, 13, 198, 50, 7]])
    with torch.no_grad():
        gap = (ours(tokens) - ref(tokens)).abs().max().item()
    # measured 1.8e-7 at most over the three; processed in float64 here, float32 there
    assert gap < 2e-6, gap


def test_the_final_checkpoint_and_main_are_different_snapshots_here(cache):
    """The stand-in's revisions differ, so the test above can tell which one was loaded."""
    tokens = torch.tensor([[0, 464, 3290, 318]])
    with torch.no_grad():
        last = gtl.HookedTransformer.from_pretrained(REPO, device="cpu", checkpoint_index=-1)(tokens)
        main = gtl.HookedTransformer.from_pretrained(REPO, device="cpu")(tokens)
    assert (last - main).abs().max() > 0.01


def test_a_checkpoint_missing_from_the_cache_names_the_revision(cache):
    with pytest.raises(OSError, match=r"revision 'step1000' of 'EleutherAI/pythia-14m' is not in the local"):
        gtl.HookedTransformer.from_pretrained(REPO, device="cpu", checkpoint_value=1000)
    with pytest.raises(ValueError, match="either side are 512 and 1000"):
        gtl.HookedTransformer.from_pretrained(REPO, device="cpu", checkpoint_value=600)
    with pytest.raises(ValueError, match="give either revision='main' or a checkpoint"):
        gtl.HookedTransformer.from_pretrained(REPO, device="cpu", checkpoint_value=512, revision="main")
    with pytest.raises(ValueError, match="checkpoint_value or checkpoint_label, not both"):
        gtl.HookedTransformer.from_pretrained(REPO, device="cpu", checkpoint_value=512, checkpoint_label=512)
