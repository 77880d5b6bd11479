"""A Hugging Face hub cache (HF_HUB_CACHE layout) of seeded random stand-ins for the models that
TransformerLens's test suites and demos load by name, so they run offline on glassbox.tl.

Layout, as huggingface_hub writes it: ``models--ORG--NAME/snapshots/COMMIT/<files>``, ``refs/main``
holding COMMIT, and one ref per training checkpoint (``refs/step1000`` for Pythia,
``refs/checkpoint-100`` for Stanford CRFM's GPT-2s), each a different seeded model, so a test can
tell which revision it loaded. Every weight is random (``transformers``' own initialisation under a
seed per repo and revision): a test that compares with the real model's numbers cannot pass here and
is out of scope (see scope.py).

TransformerLens's own-format models (``TL_FORMAT_MODELS``: NeelNanda's SoLU, GELU and attention-only
1-4 layer repos, the names "solu-1l" .. "attn-only-4l") are a config.json and a ``*final.pth`` state
dict in TransformerLens's layout, smaller than the real ones (see the table), with a tokenizer repo
``NeelNanda/gpt-neox-tokenizer-digits`` holding GPT-2's tokenizer.

Shapes: the real configs where a model is cheap (GPT-2 small, DistilGPT-2, Pythia-14m/70m); the
Stanford CRFM GPT-2 and its checkpoints are a 2-layer, 96-wide GPT-2 (no test checks their sizes).
MMLU (the ``cais/mmlu`` dataset repo) holds tests/data/mmlu_tiny.json's invented questions (two
subjects, abstract_algebra and anatomy), enough for TransformerLens's MMLU tests' counts. Tokenizers: GPT-2's (shipped in glassbox) for
every repo, Pythia's included (the real Pythia tokenizer is not on this machine; its ids differ).

    python benchmarks/tl_suite/hub_cache.py OUT_DIR     # then HF_HUB_CACHE=OUT_DIR HF_HUB_OFFLINE=1
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPT2_TOKENIZER = REPO / "glassbox" / "assets" / "gpt2-tokenizer"


def gpt2_config(n_layer=12, n_embd=768, n_head=12):
    from transformers import GPT2Config

    # n_ctx as in the real GPT-2 config.json files: TransformerLens 3.9 reads hf_config.n_ctx, which
    # transformers 5 no longer derives from n_positions
    return GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=50257, n_positions=1024, n_ctx=1024)


def neox_config(hidden, layers, heads):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=4 * hidden, vocab_size=50304, max_position_embeddings=2048,
                         rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False,
                         bos_token_id=0, eos_token_id=0)


# repo id -> (config factory, [revisions besides main]); the names TransformerLens's tests and demos use.
STANFORD = "stanford-crfm/alias-gpt2-small-x21"
MODELS = {
    "gpt2": (gpt2_config, []),
    "distilgpt2": (lambda: gpt2_config(n_layer=6), []),
    "EleutherAI/pythia-70m": (lambda: neox_config(512, 6, 8), ["step0", "step1", "step512", "step1000",
                                                               "step143000"]),
    "EleutherAI/pythia-14m": (lambda: neox_config(128, 6, 4), []),
    STANFORD: (lambda: gpt2_config(n_layer=2, n_embd=96, n_head=4), ["checkpoint-0", "checkpoint-10", "checkpoint-400000"]),
}


# OPT, GPT-Neo (TinyStories) and GPT-J, the names TransformerLens's tests load: TinyStories-1M at its
# real shape; the others 64-128 wide (OPT-125m and GPT-Neo-125M with their real 12 layers, which a test
# hooks by index; GPT-J-6B 2 of its 28, TinyStories-33M its 4) with their real vocabularies, context
# and every other config field as in the real repo (GPT-J-6B's 28 x 4096 layers would be 24 GB).
def opt_config():
    from transformers import OPTConfig

    return OPTConfig(hidden_size=64, num_hidden_layers=12, num_attention_heads=4, ffn_dim=256, vocab_size=50272,
                     max_position_embeddings=2048, word_embed_proj_dim=64)


def neo_config(hidden, layers, heads, pattern_repeats):
    from transformers import GPTNeoConfig

    return GPTNeoConfig(hidden_size=hidden, num_layers=layers, num_heads=heads, vocab_size=50257,
                        max_position_embeddings=2048, window_size=256,
                        attention_types=[[["global", "local"], pattern_repeats]])


def gptj_config():
    from transformers import GPTJConfig

    return GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=50400, n_positions=2048)


FAMILY_MODELS = {
    "facebook/opt-125m": (opt_config, []),
    "EleutherAI/gpt-neo-125M": (lambda: neo_config(64, 12, 4, 6), []),
    "roneneldan/TinyStories-1M": (lambda: neo_config(64, 8, 16, 4), []),
    "roneneldan/TinyStories-33M": (lambda: neo_config(128, 4, 16, 2), []),
    "EleutherAI/gpt-j-6B": (gptj_config, []),
}


def commit_of(repo_id: str, revision: str) -> str:
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


def seed_of(repo_id: str, revision: str) -> int:
    return int(commit_of(repo_id, revision)[:8], 16)


def write_snapshot(cache: Path, repo_id: str, revision: str, config) -> Path:
    """One revision's snapshot (config, safetensors weights, GPT-2 tokenizer) and its ref."""
    import torch
    from transformers import AutoModelForCausalLM

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit_of(repo_id, revision)
    snapshot = repo / "snapshots" / commit
    if not (snapshot / "model.safetensors").is_file():
        torch.manual_seed(seed_of(repo_id, revision))
        model = AutoModelForCausalLM.from_config(config)
        tmp = snapshot.with_name(commit + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
            shutil.copy(GPT2_TOKENIZER / name, tmp / name)
        shutil.rmtree(snapshot, ignore_errors=True)
        tmp.rename(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


# TransformerLens's own-format models (tl_format.py): NeelNanda's repos, their config.json fields as
# TransformerLens's convert_neel_model_config reads them, a state dict in TransformerLens's key layout.
# Smaller than the real ones (d_model 512, 8 heads of 64, d_mlp 2048): 128 wide, 8 heads of 16, d_mlp
# 512, so a dozen fit the suite's time; the real head count (tests index heads) and n_ctx 1024. d_vocab is GPT-2's 50257 (the real
# 48262 is NeelNanda/gpt-neox-tokenizer-digits', which is not on this machine: its stand-in repo holds
# GPT-2's tokenizer, whose ids go up to 50256).
TL_TOKENIZER = "NeelNanda/gpt-neox-tokenizer-digits"
TL_CHECKPOINT = "model_final.pth"  # TransformerLens loads the repo's one file ending in final.pth


def tl_format_config(n_layers: int, act_fn: str, attn_only: bool = False) -> dict:
    return dict(d_model=128, n_layers=n_layers, d_mlp=512, d_head=16, n_heads=8, n_ctx=1024, d_vocab=50257,
                act_fn=act_fn, attn_only=attn_only, normalization="LN", shortformer_pos=False, final_rms=False,
                tokenizer_name=TL_TOKENIZER, ln_eps=1e-5)


TL_FORMAT_MODELS = {
    **{f"NeelNanda/SoLU_{n}L512W_C4_Code": tl_format_config(n, "solu_ln") for n in (1, 2, 3, 4)},
    **{f"NeelNanda/GELU_{n}L512W_C4_Code": tl_format_config(n, "gelu") for n in (1, 2, 3, 4)},
    # act_fn is unused without an MLP; with "solu_ln" TransformerLens 3.9's own fold_ln fails on these
    **{f"NeelNanda/Attn_Only_{n}L512W_C4_Code": tl_format_config(n, "gelu", attn_only=True) for n in (1, 2, 3, 4)},
}


def tl_format_state_dict(config: dict, seed: int) -> dict:
    """Seeded random weights in TransformerLens's layout (its key names, W_U [d_model d_vocab], the mask
    buffers it saves), norms and biases away from 1 and 0 so that folding them changes the weights."""
    import torch

    from glassbox.models import HookedTransformer
    from glassbox.weights.tl_format import config_from_tl

    torch.manual_seed(seed)
    model = HookedTransformer(config_from_tl(config, "stand-in"), init=True)
    state = {}
    for name, value in model.state_dict().items():
        value = value.clone()
        if name.endswith(".w"):
            value += 0.1 * torch.randn_like(value)
        elif name.rsplit(".", 1)[-1] in ("b",) or name.rsplit(".", 1)[-1].startswith("b_"):
            value = 0.02 * torch.randn_like(value)
        state[name] = value
    state["unembed.W_U"] = state.pop("unembed.W_U_T").T.contiguous()
    n_ctx = config["n_ctx"]
    for layer in range(config["n_layers"]):
        state[f"blocks.{layer}.attn.mask"] = torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool))
        state[f"blocks.{layer}.attn.IGNORE"] = torch.tensor(-torch.inf)
    return state


def write_tl_format_snapshot(cache: Path, repo_id: str, config: dict) -> Path:
    import torch

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit_of(repo_id, "main")
    snapshot = repo / "snapshots" / commit
    if not (snapshot / TL_CHECKPOINT).is_file():
        tmp = snapshot.with_name(commit + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        torch.save(tl_format_state_dict(config, seed_of(repo_id, "main")), tmp / TL_CHECKPOINT)
        shutil.rmtree(snapshot, ignore_errors=True)
        tmp.rename(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def write_tokenizer_snapshot(cache: Path, repo_id: str) -> Path:
    """A repo holding only a tokenizer: GPT-2's files."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit_of(repo_id, "main")
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(GPT2_TOKENIZER / name, snapshot / name)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def build_tl_format(cache: Path) -> dict:
    """The stand-ins of TL_FORMAT_MODELS and their tokenizer repo; returns {repo id: [revisions]}."""
    made = {}
    for repo_id, config in TL_FORMAT_MODELS.items():
        write_tl_format_snapshot(cache, repo_id, config)
        made[repo_id] = ["main"]
    write_tokenizer_snapshot(cache, TL_TOKENIZER)
    made[TL_TOKENIZER + " (tokenizer)"] = ["main"]
    return made


def build(cache: Path) -> dict:
    """Every stand-in of MODELS and FAMILY_MODELS in ``cache``; returns {repo id: [revisions]}."""
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    cache.mkdir(parents=True, exist_ok=True)
    made = {}
    for repo_id, (make_config, revisions) in {**MODELS, **FAMILY_MODELS}.items():
        for revision in ["main", *revisions]:
            write_snapshot(cache, repo_id, revision, make_config())
        made[repo_id] = ["main", *revisions]
    # MMLU's questions for make_mmlu_data_loader / mmlu_eval: the small invented fixture the tests use
    sys.path.insert(0, str(REPO / "tests"))
    from hub_cache import cache_mmlu

    cache_mmlu(cache, json.loads((REPO / "tests" / "data" / "mmlu_tiny.json").read_text()))
    made["cais/mmlu (dataset)"] = ["main"]
    made.update(build_tl_format(cache))
    (cache / "glassbox-standins.json").write_text(json.dumps(made, indent=1))
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(build(Path(sys.argv[1]).resolve()), indent=1))
