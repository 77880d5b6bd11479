"""glassbox's export is SAELens's cached activations: its own CacheActivationsRunner agrees, and its
trainer learns an SAE from the folder through ``cached_activations_path``.

The same pretokenized rows go to both: ``glassbox.scale.export`` on a glassbox model saved to a folder,
and SAELens's ``CacheActivationsRunner`` (unshuffled) on TransformerLens 3.9 holding the same weights
(``tl_oracle.tl_twin``). SAELens's runner loads its model by name only, so ``load_model`` in its module
is replaced, for this test, by a function returning the twin.
"""

import pytest
import torch
from datasets import Dataset, load_from_disk
from sae_lens import (CacheActivationsRunner, CacheActivationsRunnerConfig, LanguageModelSAERunnerConfig,
                      LanguageModelSAETrainingRunner, LoggingConfig, StandardTrainingSAEConfig)

import sae_lens.cache_activations_runner as cache_runner_module
from glassbox.scale import export, load_manifest
from glassbox.weights import save_pretrained
from tl_oracle import max_diff, tiny_gpt2, tl_twin

HOOK = "blocks.0.hook_resid_post"
D_MODEL, CTX, ROWS, BATCH = 24, 16, 32, 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("saelens_export")
    model = tiny_gpt2(seed=7, d_model=D_MODEL)
    save_pretrained(model, root / "model")
    generator = torch.Generator().manual_seed(11)
    rows = torch.randint(1, 50256, (ROWS, CTX), generator=generator)
    rows[:, 0] = 50256  # a BOS on every row, as a pretokenizer puts it
    Dataset.from_dict({"tokens": rows.tolist()}).save_to_disk(str(root / "tokens"))
    out = export(str(root / "model"), root / "glassbox_acts", [HOOK], dataset=root / "tokens", batch_size=BATCH,
                 shard_size=2 * BATCH, progress=False)
    return root, model, rows, out


def test_saelenss_cache_runner_writes_the_same_activations(setup, monkeypatch):
    root, model, rows, out = setup
    twin = tl_twin(model)
    monkeypatch.setattr(cache_runner_module, "load_model", lambda **kwargs: twin)
    tokens_per_buffer = 2 * BATCH * CTX  # two model batches per SAELens shard
    cfg = CacheActivationsRunnerConfig(
        dataset_path="local tokens", model_name="tiny", model_batch_size=BATCH, hook_name=HOOK, d_in=D_MODEL,
        training_tokens=ROWS * CTX, context_size=CTX, new_cached_activations_path=str(root / "saelens_acts"),
        shuffle=False, dtype="float32", device="cpu", streaming=False, prepend_bos=False,
        buffer_size_gb=(tokens_per_buffer * D_MODEL * 4 + 0.5) / 1e9)
    theirs = CacheActivationsRunner(cfg, override_dataset=load_from_disk(str(root / "tokens"))).run()
    ours = load_from_disk(str(out))
    assert theirs.features == ours.features  # same columns, Array2D shapes and dtypes
    assert ours.column_names == [HOOK, "token_ids"] and len(ours) == len(theirs) == ROWS
    a, b = theirs.with_format("torch")[0:ROWS], ours.with_format("torch")[0:ROWS]
    assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(b["token_ids"], rows.to(torch.int32))
    scale = a[HOOK].abs().max().item()
    assert 0.5 < scale < 50
    # measured 7.0e-7 (values up to 2.3), bound 7e-6: 10x
    assert max_diff(a[HOOK], b[HOOK]) < 7e-6
    # both layouts keep one arrow file per shard in order: SAELens's 2-batch buffers, glassbox's 8-row shards
    assert len(ours.cache_files) == len(load_manifest(out)["plan"]) == ROWS // (2 * BATCH)


def test_saelens_trains_an_sae_from_the_export(setup):
    root, model, rows, out = setup
    cfg = LanguageModelSAERunnerConfig(
        sae=StandardTrainingSAEConfig(d_in=D_MODEL, d_sae=40, l1_coefficient=1.0), model_name="tiny",
        hook_name=HOOK, dataset_path="local tokens", is_dataset_tokenized=True, streaming=False, context_size=CTX,
        use_cached_activations=True, cached_activations_path=str(out), training_tokens=ROWS * CTX,
        train_batch_size_tokens=32, store_batch_size_prompts=BATCH, n_batches_in_buffer=4, lr=1e-3, device="cpu",
        logger=LoggingConfig(log_to_wandb=False), checkpoint_path=None, output_path=None, n_eval_batches=0,
        verbose=False)
    torch.manual_seed(0)
    runner = LanguageModelSAETrainingRunner(cfg, override_model=tl_twin(model),
                                            override_dataset=load_from_disk(str(root / "tokens")))
    store = runner.activations_store
    assert store.cached_activation_dataset is not None and len(store.cached_activation_dataset) == ROWS
    first = store.cached_activation_dataset.with_format("torch")[0:1][HOOK]
    assert torch.equal(first, load_from_disk(str(out)).with_format("torch")[0:1][HOOK])
    before = runner.sae.W_enc.detach().clone()
    sae = runner.run()
    assert sae.W_enc.shape == (D_MODEL, 40)
    assert torch.isfinite(sae.W_enc).all() and not torch.equal(sae.W_enc.detach(), before)
    with torch.no_grad():
        x = first.reshape(-1, D_MODEL)
        recon = sae.decode(sae.encode(x))
    assert torch.isfinite(recon).all() and recon.shape == x.shape
