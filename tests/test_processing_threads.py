"""refactor_factored_attn_matrices runs its SVDs on one CPU thread, whatever the caller's setting.

LAPACK's SVD of [head d_model+1 d_head] matrices gains nothing from threads, and with threads on a
busy machine each of its many small parallel regions waits for every core: GPT-2 small's 72 SVDs took
85 s at 2 threads (load 13) against about 1 s on one. One thread also makes the refactored weights
the same bits whatever torch.get_num_threads() is. The caller's thread count is restored, also when
the SVD fails.
"""

import pytest
import torch

from glassbox.models import HookedTransformer, preset_config
from glassbox.weights.processing import refactor_factored_attn_matrices


@pytest.fixture
def model():
    # d_model 256 so that LAPACK's inner products are long enough to be split across threads
    cfg = preset_config("gpt2", d_model=256, n_layers=2, n_heads=4, d_head=64, d_vocab=29, n_ctx=19)
    torch.manual_seed(0)
    return HookedTransformer(cfg, dtype=torch.float64)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_svds_run_on_one_thread_and_the_setting_is_restored(model, two_threads, monkeypatch):
    seen, svd = [], torch.linalg.svd

    def recording_svd(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return svd(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", recording_svd)
    refactor_factored_attn_matrices(model.state_dict(), model.cfg)
    assert seen and set(seen) == {1}, seen
    assert torch.get_num_threads() == 2


def test_result_does_not_depend_on_the_thread_count(model, two_threads):
    at_two = refactor_factored_attn_matrices(model.state_dict(), model.cfg)
    torch.set_num_threads(1)
    at_one = refactor_factored_attn_matrices(model.state_dict(), model.cfg)
    for key, value in at_two.items():
        assert torch.equal(value, at_one[key]), key


def test_thread_count_restored_when_the_svd_fails(model, two_threads, monkeypatch):
    def failing_svd(*args, **kwargs):
        raise RuntimeError("linalg.svd: the algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "svd", failing_svd)
    with pytest.raises(RuntimeError, match="failed to converge"):
        refactor_factored_attn_matrices(model.state_dict(), model.cfg)
    assert torch.get_num_threads() == 2
