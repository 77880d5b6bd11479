"""Shared fixtures: seeded random Hugging Face GPT-2 references and their glassbox twins.

Tiny configs use distinct sizes (2 layers, 3 heads of 5, 7 MLP... see TINY) so a swapped axis cannot
pass. Every LayerNorm weight and bias and every linear bias is perturbed away from 1 and 0, so a
component that ignores one of them fails parity.

The suite runs on two pytest-xdist workers (setup.cfg's addopts). Each test file stays on one worker
(its module fixtures are built once), every file that starts a Ray cluster shares one worker (two local
clusters at once would fight over the two cores), and each worker and every process it starts computes
on one thread: bit-for-bit comparisons between a test and a subprocess need the same thread count on
both sides.
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from glassbox.models import HookedTransformer

TINY = dict(n_layer=2, n_embd=15, n_head=3, n_inner=22, vocab_size=29, n_positions=17)
SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)


@torch.no_grad()
def perturb_vectors(model) -> None:
    """Move every 1-d parameter (norm weights and biases) away from 1 and 0, so a dropped one shows."""
    for param in model.parameters():
        if param.ndim == 1:
            param.add_(0.3 * torch.randn_like(param))


def perturbed(cfg, seed=0, scale=0.3):
    """A model whose every parameter (norm weights and biases too) is random, so none can be ignored."""
    torch.manual_seed(seed)
    model = HookedTransformer(cfg, dtype=torch.float64).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn_like(param))
    return model



def assert_round_trips(hf, hf_class, tokens, folder, atol: float = 5e-5) -> HookedTransformer:
    """from_hf, to_hf, save_pretrained and from_pretrained dispatch on hf's architecture: the model
    matches hf's logits (within ``atol``), its export is an ``hf_class`` with the same bits, and so is
    a reload."""
    from glassbox.weights import from_pretrained, save_pretrained

    model = HookedTransformer.from_hf(hf)
    exported = model.to_hf()
    assert isinstance(exported, hf_class)
    save_pretrained(model, folder)
    reloaded = from_pretrained(folder)
    with torch.no_grad():
        expected = hf(tokens).logits
        # default: measured <= 4.5e-6 (GPT-J, GPT-NeoX, OLMo 2, Gemma; logits up to 7.8); bound 5e-5, 11x
        torch.testing.assert_close(model(tokens), expected, atol=atol, rtol=0)
        torch.testing.assert_close(exported(tokens).logits, expected, atol=0, rtol=0)
        torch.testing.assert_close(reloaded(tokens), model(tokens), atol=0, rtol=0)
    return model


def make_hf_gpt2(seed: int = 0, dtype=torch.float32, **sizes):
    """A ``transformers.GPT2LMHeadModel`` (eager attention) with seeded random, perturbed weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    last = sizes["vocab_size"] - 1
    config = GPT2Config(**sizes, attn_implementation="eager", bos_token_id=min(50256, last),
                        eos_token_id=min(50256, last))
    model = GPT2LMHeadModel(config)
    perturb_vectors(model)
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_hf():
    return make_hf_gpt2(**TINY)


@pytest.fixture(scope="session")
def tiny_model(tiny_hf):
    return HookedTransformer.from_hf(tiny_hf)


@pytest.fixture
def tiny_tokens():
    return torch.randint(0, TINY["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="session")
def small_hf():
    """GPT-2-small shape (124M parameters), random weights."""
    return make_hf_gpt2(seed=1, **SMALL)


@pytest.fixture(scope="session")
def small_model(small_hf):
    return HookedTransformer.from_hf(small_hf)


# Files whose tests start a local Ray cluster: one xdist worker runs them all, one after another.
RAY_FILES = {"test_cli_export.py", "test_scale_job.py", "test_scale_jobs.py", "test_scale_ray.py",
             "test_scale_validation.py"}


def pytest_collection_modifyitems(config, items):
    """Group tests by file for ``--dist loadgroup`` (the Ray files form one group)."""
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("ray" if name in RAY_FILES else name))


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A test that runs a command in-process with ``--threads`` (torch.set_num_threads) must not change the
    thread count of the tests after it: bit-for-bit comparisons with a subprocess depend on it."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
