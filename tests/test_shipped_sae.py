"""The SAE shipped for glassbox-austen (glassbox/assets/saes/glassbox-austen-L1-resid-pre): it loads
with nothing refused or warned about, splices into the shipped model with the error term exactly, and
its model card's numbers recompute from the card's own eval (the held-out 5% of data/austen.txt
through ``evaluate_sae``, SAELens's evals) within the noise stated beside each bound. The eval is the
card's own code block, run as written in a fresh interpreter on one thread (outside the test suite's
runtime shape checks): three passes over the 425 held-out windows, ~40 s."""

import ast
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from glassbox.interp.report_features import SAES_DIR, shipped_sae, shipped_sae_folder
from glassbox.interp.sae.architectures import TopKSAE
from glassbox.interp.sae.format import load_sae
from glassbox.models import HookedTransformer

FOLDER = SAES_DIR / "glassbox-austen-L1-resid-pre"
HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen")


@pytest.fixture(scope="module")
def sae():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading refuses nothing and warns about nothing
        return load_sae(FOLDER)


def card() -> str:
    return (FOLDER / "README.md").read_text(encoding="utf-8")


def card_value(label: str) -> str:
    found = re.search(r"^\| " + re.escape(label) + r" \| \*{0,2}([^|*]+?)\*{0,2} \|", card(), re.M)
    assert found, f"the card has no row {label!r}"
    return found.group(1)


def test_folder_is_small_and_in_saelens_format():
    files = sorted(p.name for p in FOLDER.iterdir())
    assert files == ["README.md", "cfg.json", "evals.json", "sae_weights.safetensors", "train_sae_settings.json"], files
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < 2_000_000
    cfg = json.loads((FOLDER / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["metadata"]["model_name"] == "glassbox-austen"
    assert cfg["metadata"]["hook_name"] == HOOK and cfg["d_in"] == 192


def test_loads_as_the_card_says(sae, model):
    assert isinstance(sae, TopKSAE)
    assert (sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.k, sae.cfg.hook_name) == (192, 1024, 32, HOOK)
    assert sae.dtype == torch.float32
    assert f"TopK, k = {sae.cfg.k}, {sae.cfg.d_sae:,} features" in card()
    assert shipped_sae_folder(model) == FOLDER and isinstance(shipped_sae(model), TopKSAE)


def test_only_the_weights_it_was_trained_on_get_it(model):
    from glassbox.interp.report_features import weights_digest
    from glassbox.train.sae.api import digest

    assert weights_digest(model) == digest(p for _, p in sorted(model.state_dict().items()))
    other = HookedTransformer.from_pretrained("glassbox-austen")
    with torch.no_grad():
        other.blocks[0].mlp.b_out[3] += 1e-3
    assert other.cfg.model_name == "glassbox-austen" and shipped_sae_folder(other) is None
    assert shipped_sae_folder(HookedTransformer.from_pretrained("glassbox-austen", dtype=torch.float64)) is None


def test_splices_into_the_shipped_model_exactly_with_the_error_term(sae, model):
    tokens = model.to_tokens("Elizabeth read the letter again, and then walked to the window.")
    clean_logits, clean = model.run_with_cache(tokens)
    with model.saes([sae], use_error_term=True):
        logits, cache = model.run_with_cache(tokens)
    assert torch.equal(logits, clean_logits), "with the error term the logits are the clean model's, bit for bit"
    assert torch.equal(cache["blocks.1.hook_resid_post"], clean["blocks.1.hook_resid_post"])
    acts = cache[f"{HOOK}.hook_sae_acts_post"]
    assert acts.shape == (1, tokens.shape[1], 1024)
    assert ((acts != 0).sum(-1) == 32).all(), "TopK keeps k = 32 features at every position"
    x = clean[HOOK]
    recons = cache[f"{HOOK}.hook_sae_recons"]
    error = cache[f"{HOOK}.hook_sae_error"]
    assert torch.equal(error, x - recons)  # the error term is exactly what the reconstruction misses
    with model.saes([sae]):
        spliced = model(tokens)
    assert not torch.equal(spliced, clean_logits)
    assert model.acts_to_saes == {}, "the context leaves no SAE behind"


# --- the card's numbers -----------------------------------------------------------------------------

def card_eval_code() -> str:
    """The eval the card states: its python block that calls evaluate_sae."""
    blocks = re.findall(r"```python\n(.*?)```", card(), re.S)
    code = [b for b in blocks if "evaluate_sae(" in b]
    assert len(code) == 1, "the card states its eval once"
    return code[0]


@pytest.fixture(scope="module")
def evals():
    """The card's eval, run as written in a fresh interpreter in the repository root (it prints the dict)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as trained; on 2 busy cores, 2 threads run 4x slower
    done = subprocess.run([sys.executable, "-c", card_eval_code()], cwd=root, capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_card_numbers_recompute_from_its_eval(evals):
    result = evals
    assert result["n_tokens"] == 425 * 127 == 53_975 and result["n_ce_tokens"] == 53_550
    recorded = json.loads((FOLDER / "evals.json").read_text())["evals"]
    # The eval is deterministic: measured here, a rerun gives the training run's evals.json bit for bit, and
    # batch size 16 instead of 8 moves only the explained variance, by 8e-11. Another CPU's float32 kernels
    # sum in another order, like transformers' against glassbox's (5.5e-7 relative on this model's logits):
    # bound 1e-5 relative, 18x that.
    for name in ("l0", "explained_variance", "mse", "ce_loss_score", "ce_loss_without_sae", "ce_loss_with_sae",
                 "ce_loss_with_ablation", "kl_div_with_sae", "dead_fraction"):
        assert abs(result[name] - recorded[name]) <= 1e-5 * max(1.0, abs(recorded[name])), (name, result[name],
                                                                                         recorded[name])
    # the card prints them rounded to the digits shown: within half a unit of the last digit
    for label, name in (("L0", "l0"), ("explained variance", "explained_variance"),
                        ("CE loss recovered", "ce_loss_score"), ("MSE", "mse"),
                        ("KL divergence with the SAE (nats)", "kl_div_with_sae")):
        shown = card_value(label)
        digits = len(shown.split(".")[1]) if "." in shown else 0
        assert abs(float(shown) - result[name]) <= 0.5 * 10 ** -digits + 1e-5, (label, shown, result[name])
    losses = [float(v) for v in card_value("CE loss: clean / with the SAE / zero-ablated (nats)").split(" / ")]
    for shown, name in zip(losses, ("ce_loss_without_sae", "ce_loss_with_sae", "ce_loss_with_ablation")):
        assert abs(shown - result[name]) <= 0.0005 + 1e-5, (name, shown, result[name])
    dead = card_value("dead fraction")
    assert dead.startswith(f"{result['dead_fraction']:.4f} ({result['n_dead']} of 1,024")



def test_the_demo_finds_it_with_the_held_out_text(model, sae, tmp_path):
    from glassbox.cli import build_parser
    from glassbox.cli.demo import feature_inputs
    from glassbox.interp.report_features import feature_section
    from glassbox.train.data import split_text

    found, text = feature_inputs(model)
    assert isinstance(found, TopKSAE) and torch.equal(found.W_dec, sae.W_dec)
    assert text == split_text(Path("data/austen.txt").read_text(encoding="utf-8"), 0.05)[1]
    assert build_parser().parse_args(["demo", "--no-features"]).no_features

    tokens = model.to_tokens("Elizabeth read the letter again. Elizabeth read the")
    letter, garden = model.to_single_token(" letter"), model.to_single_token(" garden")
    summary, caption, _ = feature_section(model, sae, tokens, letter, garden, " letter", " garden", tmp_path)
    acts = sae.encode(model.run_with_cache(tokens)[1][HOOK][0, -1])
    assert [r["feature"] for r in summary["top_features"]] == acts.topk(5).indices.tolist()
    assert summary["l0"] == 32.0 and summary["error_term_max_abs_logit_change"] == 0.0
    assert caption.startswith("topk SAE at blocks.1.hook_resid_pre (1,024 features, k=32). On the prompt: L0 32.0")


def test_the_cards_usage_example_runs_as_written():
    usage = re.findall(r"```python\n(.*?)```", card(), re.S)[0]
    scope = {}
    exec(compile(usage, "README.md", "exec"), scope)  # run in the repository root, as the card's paths are
    acts = scope["cache"]["blocks.1.hook_resid_pre.hook_sae_acts_post"]
    assert acts.shape == (1, 7, 1024) and ((acts != 0).sum(-1) == 32).all()
    clean, _ = scope["model"].run_with_cache("Elizabeth read the letter again.")  # the same kernels, no SAE
    assert torch.equal(scope["logits"], clean)
