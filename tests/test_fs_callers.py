"""Every writer of the package goes through glassbox.fs, and fails the way it does: a user's files in an
output folder are kept byte for byte, a fault at any file-system call of a save leaves (after the next
read) the old content or the new one, a file where a folder goes is refused naming it, and what the
savers of earlier versions left when killed mid-swap is recovered."""

import ast
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fs_faults import fail_at, folder_state
from glassbox.fs import JOURNAL, RECORD

USER = {"README.md": b"# my SAE\n", "notes.txt": b"found feature 3 = commas", "figures/x.png": b"\x89PNG\r\n\x1a\n",
        "model-backup.safetensors": b"a user's look-alike", "pytorch_model-old.bin": b"another look-alike",
        "sae_weights-old.safetensors": b"and another"}


def add_user_files(folder: Path) -> None:
    for rel, data in USER.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def user_files(folder: Path) -> dict:
    return {rel: data for rel, data in folder_state(folder).items() if rel in USER}


def no_leftovers(folder: Path) -> bool:
    return not [e for e in os.listdir(folder) if e.startswith(".glassbox-") and e != RECORD] and \
        not [e for e in os.listdir(folder.parent) if e.startswith(("." + folder.name + ".", folder.name + ".glassbox"))]


# -- save_sae ---------------------------------------------------------------------------------------
def sae(arch="standard", seed=0):
    from glassbox.interp.sae.architectures import make_sae
    from glassbox.interp.sae.config import SAEConfig

    model = make_sae(SAEConfig(arch, 6, 11, "blocks.0.hook_resid_pre", metadata={"model_name": "tiny"}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def same_sae(a, b) -> bool:
    return a.architecture == b.architecture and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                                                        b.state_dict().values()))


def test_save_sae_overwrite_keeps_a_user_s_files_and_drops_only_stale_sae_files(tmp_path):
    from glassbox.interp.sae.format import load_sae, load_sparsity, save_sae

    folder = tmp_path / "s"
    save_sae(sae(), folder, sparsity=torch.zeros(11))
    add_user_files(folder)
    save_sae(sae("gated", 1), folder, overwrite=True)
    assert user_files(folder) == USER
    assert same_sae(load_sae(folder), sae("gated", 1))
    assert load_sparsity(folder) is None, "the old save's sparsity was kept beside the new SAE"
    assert no_leftovers(folder)
    # a folder written without glassbox's record (SAELens's, or an earlier glassbox's): its SAE files are
    # the SAE format's names; a stale scaler beside the new SAE would be folded into it on load
    os.unlink(folder / RECORD)
    (folder / "activation_scaler.json").write_text('{"scaling_factor": 2.0}')
    save_sae(sae(seed=4), folder, overwrite=True)
    assert not (folder / "activation_scaler.json").exists() and user_files(folder) == USER
    assert json.loads((folder / RECORD).read_text())["files"] == ["cfg.json", "sae_weights.safetensors"]


def test_save_final_of_a_finished_run_keeps_the_user_s_files(tmp_path):
    """train-sae --resume of a finished run writes the final SAE again through save_final."""
    from glassbox.interp.sae.format import load_sae
    from glassbox.train.sae.checkpoint import save_final

    folder = tmp_path / "run" / "sae"
    save_final(sae(), folder)
    add_user_files(folder)
    save_final(sae(seed=2), folder)
    assert user_files(folder) == USER and same_sae(load_sae(folder), sae(seed=2))


def test_save_sae_onto_a_file_is_refused_naming_it(tmp_path):
    from glassbox.interp.sae.format import save_sae

    path = tmp_path / "s"
    path.write_bytes(b"a user's file")
    for overwrite in (False, True):
        with pytest.raises(NotADirectoryError, match="not a folder") as info:
            save_sae(sae(), path, overwrite=overwrite)
        assert info.value.filename == str(path)
    assert path.read_bytes() == b"a user's file"


def test_save_sae_faulted_at_any_call_leaves_the_old_or_new_sae_and_the_user_s_files(tmp_path):
    from glassbox.interp.sae.format import load_sae, save_sae

    old, new, event, seen = sae(seed=0), sae("jumprelu", 5), 1, set()
    while True:
        folder = tmp_path / str(event) / "s"
        save_sae(old, folder)
        add_user_files(folder)
        faulted, error = fail_at(event, lambda: save_sae(new, folder, overwrite=True))
        if not faulted:
            break
        assert isinstance(error, OSError), f"event {event}: {error!r}"
        back = load_sae(folder)  # recovers an interrupted save first
        assert same_sae(back, old) or same_sae(back, new), f"event {event}: a mix"
        assert user_files(folder) == USER and no_leftovers(folder), f"event {event}"
        seen.add(same_sae(back, new))
        event += 1
    assert event > 15 and seen == {False, True}


def test_an_sae_left_aside_by_the_earlier_two_rename_save_is_put_back(tmp_path):
    """The earlier save_sae renamed s into .s.XXXXXXXX.old/ and a .s.XXXXXXXX.tmp/ into place; killed in
    between, no s/ was left and nothing recovered it."""
    from glassbox.interp.sae.format import load_sae, save_sae

    save_sae(sae(seed=3), tmp_path / "s")
    (tmp_path / ".s.ab12cd34.old").mkdir()
    os.rename(tmp_path / "s", tmp_path / ".s.ab12cd34.old" / "s")
    (tmp_path / ".s.zz99yy88.tmp").mkdir()
    (tmp_path / ".s.zz99yy88.tmp" / "cfg.json").write_text("{half")
    (tmp_path / "s.old").mkdir()  # a user's folder that only looks like a leftover
    assert same_sae(load_sae(tmp_path / "s"), sae(seed=3))
    assert sorted(os.listdir(tmp_path)) == ["s", "s.old"]


# -- save_pretrained --------------------------------------------------------------------------------
def tiny_model(n_layers, seed):
    from glassbox import Config, HookedTransformer

    torch.manual_seed(seed)
    return HookedTransformer(Config(d_model=15, n_layers=n_layers, n_heads=3, d_mlp=22, d_vocab=29, n_ctx=17)).eval()


def model_logits(model):
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 2, 28, 7]]))


def test_save_pretrained_keeps_look_alikes_and_drops_only_the_shards_the_index_names(tmp_path):
    """A folder an earlier glassbox wrote, sharded (no record): its index names a.safetensors and
    b.safetensors; model-backup.safetensors and pytorch_model-old.bin are the user's."""
    from safetensors.torch import save_file

    from glassbox.weights import from_pretrained, save_pretrained, to_hf

    old, new = tiny_model(2, 0), tiny_model(3, 1)
    folder = tmp_path / "model"
    save_pretrained(old, folder)
    (folder / RECORD).unlink(missing_ok=True)
    state = {k: v.contiguous() for k, v in to_hf(old).state_dict().items() if k != "lm_head.weight"}
    first = {k: v for k, v in state.items() if k.startswith("transformer.h.0.")}
    rest = {k: v for k, v in state.items() if k not in first}
    os.unlink(folder / "model.safetensors")
    save_file(first, str(folder / "a.safetensors"))
    save_file(rest, str(folder / "b.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {**{k: "a.safetensors" for k in first}, **{k: "b.safetensors" for k in rest}}}))
    assert torch.equal(model_logits(from_pretrained(folder)), model_logits(old))
    add_user_files(folder)
    save_pretrained(new, folder)
    assert user_files(folder) == USER
    assert sorted(e for e in os.listdir(folder) if e not in {p.split("/")[0] for p in USER}) == [
        RECORD, "config.json", "generation_config.json", "model.safetensors"]
    assert torch.equal(model_logits(from_pretrained(folder)), model_logits(new))
    save_pretrained(old, folder)  # and with the record: the same
    assert user_files(folder) == USER and torch.equal(model_logits(from_pretrained(folder)), model_logits(old))


def test_save_pretrained_onto_a_file_and_over_an_sae_folder_is_refused(tmp_path):
    from glassbox.interp.sae.format import save_sae
    from glassbox.weights import save_pretrained

    (tmp_path / "file").write_bytes(b"mine")
    with pytest.raises(NotADirectoryError) as info:
        save_pretrained(tiny_model(2, 0), tmp_path / "file")
    assert info.value.filename == str(tmp_path / "file") and (tmp_path / "file").read_bytes() == b"mine"
    save_sae(sae(), tmp_path / "s")
    before = folder_state(tmp_path / "s")
    with pytest.raises(ValueError, match="holds glassbox 'sae' files"):
        save_pretrained(tiny_model(2, 0), tmp_path / "s")
    assert folder_state(tmp_path / "s") == before


# -- no module writes to disk but through glassbox.fs ------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent / "glassbox"
# Every writer of the package goes through glassbox.fs: nothing is allowed past the scan.
ALLOWED = ()
WRITING_FUNCTIONS = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("os", "remove"), ("os", "unlink"),
                     ("os", "rmdir"), ("os", "removedirs"), ("os", "open"), ("os", "truncate"), ("shutil", "rmtree"),
                     ("shutil", "move"), ("shutil", "copy"), ("shutil", "copy2"), ("shutil", "copyfile"),
                     ("shutil", "copytree"), ("torch", "save")}
WRITING_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "rename", "touch", "save_file", "save_model"}


def _mode(call) -> str:
    args = list(call.args[1:2]) + [k.value for k in call.keywords if k.arg == "mode"]
    return args[0].value if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str) else "r"


# Writes that are not to a user's output: (file, what) -> why.
EXEMPT = {("train/tokenizer.py", ".save_model"): "the tokenizers trainer writes into a private temporary "
          "folder; its files are then written out through glassbox.fs",
          ("scale/export.py", "shutil.copy2"): "fills the temporary file a FolderWriter.write_file hands it (where a "
          "hard link cannot be made); glassbox.fs renames it into place"}
# Functions returning a glassbox.fs.FolderWriter: ``with NAME(...) as w`` binds a writer too.
WRITER_FACTORIES = {"FolderWriter", "outputs"}  # outputs: glassbox/scale/manifest.py


def _writers(tree) -> set:
    """The names bound by ``with FolderWriter(...) as NAME``: their write_* methods go through glassbox.fs."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", None)) \
                        in WRITER_FACTORIES and isinstance(item.optional_vars, ast.Name):
                    names.add(item.optional_vars.id)
    return names


def direct_writes(source: str) -> list:
    """(line, what) of every call in ``source`` that writes, renames or deletes a file itself."""
    found = []
    tree = ast.parse(source)
    writers = _writers(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and (func.value.id, func.attr) in WRITING_FUNCTIONS:
            if func.attr == "open" and node.args and ast.unparse(node.args[0]) == "os.devnull":
                continue  # the null device: nothing on disk
            found.append((node.lineno, f"{func.value.id}.{func.attr}"))
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in writers:
            continue
        elif isinstance(func, ast.Attribute) and func.attr in WRITING_METHODS:
            found.append((node.lineno, f".{func.attr}"))
        elif isinstance(func, ast.Name) and func.id in ("save_file", "open"):
            if func.id == "save_file" or set(_mode(node)) & set("wax+"):
                found.append((node.lineno, f"{func.id}({_mode(node)!r})" if func.id == "open" else func.id))
        elif isinstance(func, ast.Attribute) and func.attr == "open" and set(_mode(ast.Call(
                func=func, args=[None] + node.args, keywords=node.keywords))) & set("wax+"):
            found.append((node.lineno, ".open(write)"))
    return found


def test_no_module_outside_glassbox_fs_writes_files_itself():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("fs/") or rel.startswith(ALLOWED):
            continue
        offenders += [f"{rel}:{line} {what}" for line, what in direct_writes(path.read_text(encoding="utf-8"))
                      if (rel, what) not in EXEMPT]
    assert not offenders, "write through glassbox.fs instead:\n" + "\n".join(offenders)


def test_the_scan_sees_each_kind_of_direct_write():
    source = """
import os, shutil, torch
from safetensors.torch import save_file
os.replace(a, b); os.rename(a, b); shutil.rmtree(p); shutil.move(a, b); torch.save(x, p)
save_file(t, p); st.save_file(t, p); p.write_text("x"); p.write_bytes(b""); p.unlink()
open(p, "w"); open(p, mode="ab"); open(p, "x"); p.open("w"); open(p); open(p, "rb"); p.open()
os.open(os.devnull, os.O_WRONLY)
with FolderWriter(f, "x") as w:
    w.write_text("a", "b")
other.write_text("a", "b")
"""
    whats = [what for _, what in direct_writes(source)]
    assert whats == ["os.replace", "os.rename", "shutil.rmtree", "shutil.move", "torch.save", "save_file",
                     ".save_file", ".write_text", ".write_bytes", ".unlink", "open('w')", "open('ab')", "open('x')",
                     ".open(write)", ".write_text"], whats


# -- checkpoints and pages --------------------------------------------------------------------------
def ckpt(seed):
    from glassbox.train import init_model
    from glassbox.models import Config

    cfg = Config(d_model=15, n_layers=2, n_heads=3, d_mlp=22, d_vocab=29, n_ctx=17)
    state = {"step": seed, "optimizer": {}, "data_rng": torch.Generator().manual_seed(seed).get_state(),
             "history": {"train": [[seed, 1.0]], "eval": []}, "train_config": {"big": torch.zeros(30000)}}
    return init_model(cfg, seed), state


def test_a_full_disk_mid_checkpoint_is_an_os_error_naming_the_file_and_keeps_the_old_one(tmp_path):
    """RLIMIT_FSIZE (64 KiB): the trainer state (120 KB) cannot be written. torch.save alone raises
    '[enforce fail at inline_container.cc:672]'; the save must say which file and why."""
    from glassbox.train import load_checkpoint, save_checkpoint

    folder = tmp_path / "checkpoint"
    model, state = ckpt(3)
    state["train_config"] = {}
    save_checkpoint(folder, model, state)
    (folder / "notes.txt").write_bytes(b"mine")
    before = folder_state(folder)
    script = f"""
import errno, resource, signal, sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_fs_callers import ckpt
from glassbox.train import save_checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
model, state = ckpt(6)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
try:
    save_checkpoint({str(folder)!r}, model, state)
except OSError as e:
    print(e.errno, e.filename, str(e).splitlines()[0])
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    code, filename, message = run.stdout.strip().splitlines()[-1].split(" ", 2)
    assert int(code) == errno.EFBIG and filename == str(folder / "trainer_state.pt"), run.stdout
    assert "File too large" in message and "enforce fail" not in message.split("(writing")[0], message
    assert folder_state(folder) == before and no_leftovers(folder)
    assert load_checkpoint(folder)[2]["step"] == 3


def test_a_checkpoint_keeps_other_files_in_its_folder(tmp_path):
    from glassbox.train import load_checkpoint, save_checkpoint

    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, *ckpt(3))
    add_user_files(folder)
    save_checkpoint(folder, *ckpt(6))
    assert user_files(folder) == USER and load_checkpoint(folder)[2]["step"] == 6


def test_a_fault_while_saving_a_page_leaves_the_old_page(tmp_path):
    import plotly.graph_objects as go

    from glassbox.interp.plots.html import save_html

    path = tmp_path / "page.html"
    path.write_text("<html>the old page</html>")
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    event, seen = 1, set()
    while True:
        faulted, error = fail_at(event, lambda: save_html(fig, path))
        if not faulted:
            break
        assert isinstance(error, OSError) and error.filename == str(path), f"call {event}: {error!r}"
        page = path.read_text()
        assert page == "<html>the old page</html>" or page.endswith("</html>\n") and "plotly" in page
        seen.add(page == "<html>the old page</html>")
        assert os.listdir(tmp_path) == ["page.html"], f"call {event}: a leftover"
        event += 1
    # a fault at the last call (the folder's fsync, after the rename) raises with the new page in place
    assert seen == {True, False}, seen
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        save_html(fig, tmp_path)
