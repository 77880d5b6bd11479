"""`glassbox parity` on a saved model folder: exits 0 and prints every stage."""

import subprocess
import sys


def test_parity_command_on_a_folder(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    run = subprocess.run([sys.executable, "-m", "glassbox", "parity", "--model", str(tmp_path), "--prompt", "Hello world"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    for stage in ("blocks.0.hook_resid_pre", "blocks.1.attn.hook_pattern", "ln_final.hook_out", "logits"):
        assert stage in out
    assert "PARITY HOLDS" in out
