"""Folders in TransformerLens's own checkpoint format (glassbox.weights.tl_format): a good one loads
(the weights land where TransformerLens's keys say), and every damaged or hand-edited one is refused
naming the file and the field or key. TransformerLens itself writing and loading these files is the
oracle in tests_tl/test_own_format_loading_tl.py."""

import json
import pickle
from pathlib import Path

import pytest
import torch

from glassbox.models import GPT2_TOKENIZER_DIR
from glassbox.weights import from_pretrained
from glassbox.weights.pretrained import ModelNotFoundError, config_of

SIZES = dict(d_model=10, n_layers=2, d_mlp=14, d_head=5, n_heads=2, n_ctx=13, d_vocab=50257)
CONFIG = dict(**SIZES, act_fn="solu_ln", attn_only=False, normalization="LN", shortformer_pos=False)


def tl_state(n_layers: int = 2, seed: int = 0) -> dict:
    """A state dict in TransformerLens's layout, written out key by key (not by glassbox)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    d, h, e, m, v, n = 10, 2, 5, 14, 50257, 13
    state = {"embed.W_E": r(v, d), "pos_embed.W_pos": r(n, d)}
    for L in range(n_layers):
        p = f"blocks.{L}."
        state.update({p + "ln1.w": 1 + r(d) / 5, p + "ln1.b": r(d) / 5, p + "ln2.w": 1 + r(d) / 5, p + "ln2.b": r(d) / 5,
                      p + "attn.W_Q": r(h, d, e), p + "attn.W_K": r(h, d, e), p + "attn.W_V": r(h, d, e),
                      p + "attn.W_O": r(h, e, d), p + "attn.b_Q": r(h, e), p + "attn.b_K": r(h, e),
                      p + "attn.b_V": r(h, e), p + "attn.b_O": r(d), p + "attn.mask": torch.ones(n, n).tril().bool(),
                      p + "attn.IGNORE": torch.tensor(-1e5), p + "mlp.W_in": r(d, m), p + "mlp.b_in": r(m),
                      p + "mlp.W_out": r(m, d), p + "mlp.b_out": r(d), p + "mlp.ln.w": 1 + r(m) / 5,
                      p + "mlp.ln.b": r(m) / 5})
    state.update({"ln_final.w": 1 + r(d) / 5, "ln_final.b": r(d) / 5, "unembed.W_U": r(d, v), "unembed.b_U": r(v)})
    return state


def folder_with(tmp_path: Path, config=None, state=None, name: str = "SoLU_2L_final.pth") -> Path:
    folder = tmp_path / "solu"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    torch.save(tl_state() if state is None else state, folder / name)
    return folder


def test_a_good_folder_loads_with_the_weights_where_transformer_lens_s_keys_say(tmp_path):
    state = tl_state()
    model = from_pretrained(folder_with(tmp_path, state=state))
    cfg = model.cfg
    assert (cfg.act_fn, cfg.mlp_ln, cfg.attn_only, cfg.normalization, cfg.d_vocab) == ("solu", True, False, "LN", 50257)
    assert not cfg.tied_unembed and cfg.unembed_bias and cfg.layer_norm_eps == 1e-5
    assert torch.equal(model.W_U, state["unembed.W_U"])  # [d_model d_vocab] as TransformerLens holds it
    assert torch.equal(model.blocks[1].mlp.ln.w, state["blocks.1.mlp.ln.w"])
    assert torch.equal(model.blocks[0].attn.W_O, state["blocks.0.attn.W_O"])
    assert model._tokenizer is None  # no tokenizer_name: none loaded (the model falls back to GPT-2's)
    assert config_of(folder_with(tmp_path, state=state)) == cfg


def test_the_tokenizer_comes_from_the_repo_the_config_names(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    repo = hub / "models--NeelNanda--gpt-neox-tokenizer-digits"
    snap = repo / "snapshots" / ("1" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    for file in ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (snap / file).write_bytes((Path(GPT2_TOKENIZER_DIR) / file).read_bytes())
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = folder_with(tmp_path, config={**CONFIG, "tokenizer_name": "NeelNanda/gpt-neox-tokenizer-digits"})
    model = from_pretrained(folder)
    assert model.to_tokens("Hello world").tolist() == [[50256, 15496, 995]]
    missing = folder_with(tmp_path, config={**CONFIG, "tokenizer_name": "NeelNanda/no-such-tokenizer"})
    with pytest.raises(ModelNotFoundError, match="NeelNanda/no-such-tokenizer.*tokenizer_name"):
        from_pretrained(missing)


@pytest.mark.parametrize("edit,named", [
    (lambda c: c.pop("d_head"), "'d_head' is missing"),
    (lambda c: c.update(n_layers="2"), "n_layers must be a positive int"),
    (lambda c: c.update(d_mlp=0), "d_mlp must be a positive int"),
    (lambda c: c.update(attn_only="no"), "attn_only must be true or false"),
    (lambda c: c.update(act_fn="solu_lnn"), "act_fn='solu_lnn'"),
    (lambda c: c.update(act_fn=3), "act_fn must be a string"),
    (lambda c: c.update(shortformer_pos=True), "shortformer_pos=True"),
    (lambda c: c.update(normalization="LNPre"), "normalization='LNPre'"),
    (lambda c: c.pop("normalization"), "normalization_type=None"),
    (lambda c: c.update(final_rms=True), "final_rms=True"),
    (lambda c: c.update(tokenizer_name=""), "tokenizer_name must be"),
    (lambda c: c.update(n_heads=3, d_head=5), "blocks.0.attn.W_Q"),  # sizes the weights do not have
])
def test_a_hand_edited_config_is_refused_naming_the_file_and_field(tmp_path, edit, named):
    config = dict(CONFIG)
    edit(config)
    folder = folder_with(tmp_path, config=config)
    with pytest.raises(ValueError, match=named) as err:
        from_pretrained(folder)
    assert str(folder) in str(err.value)


def _drop(key):
    def edit(s):
        s.pop(key)
    return edit


@pytest.mark.parametrize("edit,named", [
    (_drop("blocks.1.mlp.ln.w"), "missing blocks.1.mlp.ln.w"),
    (lambda s: s.update({"blocks.0.mlp.W_inn": s.pop("blocks.0.mlp.W_in")}), "unexpected blocks.0.mlp.W_inn"),
    (lambda s: s.update({"blocks.0.attn.W_Q": s["blocks.0.attn.W_Q"].transpose(1, 2)}), "blocks.0.attn.W_Q"),
    (lambda s: s.update({"unembed.W_U": s["unembed.W_U"].T.contiguous()}), "unembed.W_U"),
    (lambda s: s["blocks.1.mlp.W_out"].__setitem__((3, 4), float("nan")), "blocks.1.mlp.W_out"),
    (lambda s: s["ln_final.b"].__setitem__(0, float("inf")), "ln_final.b"),
    (lambda s: s.update({"blocks.0.ln1.w": torch.ones(10, dtype=torch.int64)}), "blocks.0.ln1.w"),
])
def test_a_hand_edited_state_dict_is_refused_naming_the_file_and_key(tmp_path, edit, named):
    state = tl_state()
    edit(state)
    folder = folder_with(tmp_path, state=state)
    with pytest.raises(ValueError, match=named) as err:
        from_pretrained(folder)
    assert "SoLU_2L_final.pth" in str(err.value)


def test_damaged_checkpoint_files_are_refused_naming_the_file(tmp_path):
    folder = folder_with(tmp_path)
    path = folder / "SoLU_2L_final.pth"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
    with pytest.raises(ValueError, match="SoLU_2L_final.pth"):
        from_pretrained(folder)
    path.write_bytes(pickle.dumps({"embed.W_E": Path("/")}))  # needs more than tensors to unpickle
    with pytest.raises(ValueError, match="refused to load .*SoLU_2L_final.pth"):
        from_pretrained(folder)
    torch.save({"embed.W_E": [1.0, 2.0]}, path)  # not a tensor
    with pytest.raises(ValueError, match="'embed.W_E' is a list"):
        from_pretrained(folder)


def test_no_or_several_final_checkpoints_are_refused_naming_them(tmp_path):
    folder = folder_with(tmp_path)
    torch.save(tl_state(seed=1), folder / "other_final.pth")
    with pytest.raises(ValueError, match="SoLU_2L_final.pth, other_final.pth"):
        from_pretrained(folder)
    for path in folder.glob("*final.pth"):
        path.unlink()
    with pytest.raises(FileNotFoundError, match=r"no TransformerLens checkpoint \(\*final.pth\) in .*solu"):
        from_pretrained(folder)


def test_an_attention_only_folder_needs_no_mlp_weights(tmp_path):
    state = {k: v for k, v in tl_state().items() if ".mlp." not in k and ".ln2." not in k}
    model = from_pretrained(folder_with(tmp_path, config={**CONFIG, "attn_only": True}, state=state))
    assert model.cfg.attn_only and not hasattr(model.blocks[0], "mlp")
    with pytest.raises(ValueError, match="unexpected blocks.0.mlp"):  # an MLP an attention-only model lacks
        from_pretrained(folder_with(tmp_path, config={**CONFIG, "attn_only": True}))


def test_clear_huggingface_cache_deletes_nothing(tmp_path, monkeypatch):
    from glassbox.tl import utils

    (tmp_path / "models--org--x").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(NotImplementedError, match="never deletes the Hugging Face cache"):
        utils.clear_huggingface_cache()
    assert (tmp_path / "models--org--x").is_dir()
