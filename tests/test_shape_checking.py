"""The suite runs with jaxtyping's import hook and typeguard 2.13.3 (setup.cfg addopts). These tests
prove the checker is really active: a wrong shape at a public boundary fails here, while the same call
to the undecorated function goes through silently; and the library itself is not decorated."""

import inspect
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from jaxtyping import TypeCheckError

from glassbox import Config
from glassbox.interp import detection_pattern
from glassbox.models import LayerNorm, lm_loss
from glassbox.models.generate import sample_next
from glassbox.train.sae.losses import batch_metrics

PACKAGE = Path(__file__).resolve().parent.parent / "glassbox"


def test_the_hook_and_the_checker_are_configured(pytestconfig):
    packages = pytestconfig.getoption("jaxtyping_packages").split(",")
    assert "glassbox" in packages and "typeguard.typechecked" in packages
    assert metadata.version("typeguard") == "2.13.3"


def test_a_wrong_rank_fails_only_under_the_checker():
    logits = torch.randn(2, 3, 5)  # [batch pos d_vocab] where [batch d_vocab] is expected
    with pytest.raises(TypeCheckError, match="logits"):
        sample_next(logits)
    assert sample_next.__wrapped__(logits).shape == (2, 3)  # unchecked: a silently wrong answer


def test_an_axis_that_disagrees_between_arguments_fails():
    x, feature_acts = torch.randn(4, 6), torch.randn(5, 9)  # tokens 4 vs 5
    with pytest.raises(TypeCheckError, match="feature_acts"):
        batch_metrics(x, x, feature_acts)
    assert set(inspect.unwrap(batch_metrics)(x, x, feature_acts)) == {"l0", "explained_variance"}  # unchecked: silent
    # lm_loss checks its own shapes (a ValueError in library use too, where the checker is off)
    logits, tokens = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 4))  # pos 5 vs 4
    with pytest.raises(ValueError, match=r"logits \(2, 5, 7\) and tokens \(2, 4\) differ"):
        lm_loss.__wrapped__(logits, tokens)


def test_dtypes_and_methods_are_checked_too():
    with pytest.raises(TypeCheckError, match="tokens"):
        detection_pattern("previous_token", torch.zeros(1, 4))  # float where token ids are expected
    norm = LayerNorm(Config(d_model=6, n_layers=1, n_heads=2, d_vocab=5, n_ctx=4))
    with pytest.raises(TypeCheckError, match="Norm.forward"):  # LayerNorm's, defined on HookedNorm
        norm(torch.randn(3, 6))  # [batch d_model] where [batch pos d_model] is expected
    assert norm(torch.randn(1, 3, 6)).shape == (1, 3, 6)


def test_library_code_is_not_decorated():
    """Checking is the test suite's job: outside it, public functions are plain functions."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "@jaxtyped" not in text and "@typechecked" not in text, path
        assert "from __future__ import annotations" not in text, path
    probe = "from glassbox.models.generate import sample_next; print(hasattr(sample_next, '__wrapped__'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
