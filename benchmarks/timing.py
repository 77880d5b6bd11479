"""Interleaved timing: the peers of one case run in turn, round after round (A B C A B C ...).

Running the peers alternately, rather than one after the other, spreads slow drifts of the machine
(other processes, thermal state, allocator growth) over all of them. Each round's order is rotated
so that no peer always runs straight after the same other one. Reported per peer: every time, the
median, and the median over rounds of the per-round ratio to the reference peer, which cancels
whatever slowed a whole round.
"""

import gc
import statistics
import time
from typing import Callable, Dict


def interleaved(fns: Dict[str, Callable[[], object]], reference: str, rounds: int, warmup: int = 1) -> dict:
    """Time each zero-argument callable ``rounds`` times, interleaved; ratios are against ``reference``."""
    if reference not in fns:
        raise KeyError(f"reference peer {reference!r} is not among {list(fns)}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    result = {}
    for name in names:
        ratios = [t / ref for t, ref in zip(times[name], times[reference])]
        result[name] = {
            "median_s": statistics.median(times[name]),
            "ratio_vs_" + reference: statistics.median(ratios),
            "times_s": times[name],
        }
    return result
