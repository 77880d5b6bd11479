"""examples/transformer_lens_tour.py: TransformerLens code runs on the shipped model after one line.

It runs in a subprocess (``as_transformer_lens()`` changes ``sys.modules`` for the whole process) and
must find what the model card documents: layer 0 head 2 is the previous-token head, layer 1 head 0
the induction head, and patching that head's output restores most of the clean logit difference.
"""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "transformer_lens_tour.py"


def test_the_transformer_lens_tour_runs_and_finds_the_induction_circuit():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "normalization LNPre" in out  # TransformerLens's processing defaults applied
    assert re.search(r"previous_token_head: best L0H2", out)
    assert re.search(r"induction_head: best L1H0", out)
    assert "Rank: 0" in out and "Token: | letter|" in out
    restored = float(re.search(r"L1H0 restores (-?[\d.]+)", out).group(1))
    assert 0.5 < restored <= 1.05, out  # the induction head carries most of the effect (0.92 measured)
    assert "transformer_lens" not in sys.modules  # the alias stayed in the subprocess
