"""A benchmark peer living in another Python (its own virtual environment), driven over a pipe.

TransformerLens 4 and nnsight cannot share a process with TransformerLens 3.9 (the same
``transformer_lens`` package) nor with the main suite's typeguard, so each runs in a worker started
with its own interpreter (``peers_tl4.py``, ``peers_nnsight.py``). The parent keeps the interleaving
of ``timing.py``: a peer's turn is one ``run`` message, answered once the work is done, so its time
is that work plus one pipe round trip (measured by ``Remote.round_trip_s`` and printed: about 0.1 ms,
against 50 ms for the smallest forward here).

Protocol: length-prefixed pickles. The worker announces ``{"ready": True, "version": ...}``; then
``{"op": "prepare", "args": {...}}`` builds a case and answers its output once (for the numerical
checks), ``{"op": "run"}`` runs the prepared case once, ``{"op": "quit"}`` ends the worker. An error
in the worker comes back as ``{"error": traceback}`` and is raised in the parent as ``RuntimeError``.
The worker's prints go to stderr, so nothing else ever writes to the protocol stream.
"""

import os
import pickle
import struct
import subprocess
import sys
import time
import traceback
from typing import Callable


def send(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def recv(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the peer worker closed its pipe")
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def serve(version: str, prepare: Callable) -> None:
    """The worker's loop: ``prepare(**args)`` returns (zero-argument callable, output to check)."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed from here on goes to stderr
    requests = os.fdopen(0, "rb")
    send(replies, {"ready": True, "version": version})
    current = None
    while True:
        msg = recv(requests)
        try:
            if msg["op"] == "prepare":
                current = None
                current, output = prepare(**msg["args"])
                send(replies, {"output": output})
            elif msg["op"] == "run":
                current()
                send(replies, {})
            elif msg["op"] == "ping":
                send(replies, {})
            elif msg["op"] == "quit":
                send(replies, {})
                return
            else:
                send(replies, {"error": f"unknown op {msg['op']!r}"})
        except Exception:  # reported to the parent, which raises it with the case named
            send(replies, {"error": traceback.format_exc()})


class Remote:
    """The parent's handle on one worker: ``prepare(**args)`` -> output, ``run()``, ``close()``."""

    def __init__(self, name: str, python: str, script: str, shape: str, seed: int, threads: int):
        self.name = name
        env = dict(os.environ, TQDM_DISABLE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([python, script, "--shape", shape, "--seed", str(seed), "--threads",
                                      str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.version = self._reply()["version"]

    def _reply(self):
        msg = recv(self.proc.stdout)
        if "error" in msg:
            raise RuntimeError(f"{self.name} worker: {msg['error']}")
        return msg

    def call(self, op: str, **args):
        send(self.proc.stdin, {"op": op, "args": args})
        return self._reply()

    def prepare(self, **args):
        return self.call("prepare", **args)["output"]

    def run(self) -> None:
        self.call("run")

    def round_trip_s(self, n: int = 50) -> float:
        start = time.perf_counter()
        for _ in range(n):
            self.call("ping")
        return (time.perf_counter() - start) / n

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("quit")
            except (EOFError, BrokenPipeError, RuntimeError):
                pass
            self.proc.wait(timeout=30)


def start(name: str, python: str, script: str, shape: str, seed: int, threads: int):
    """(Remote or None, why it is absent or None): a missing interpreter or a failed start is a reason."""
    if not os.path.exists(python):
        return None, f"{python} does not exist (bash benchmarks/peer_envs.sh builds it)"
    try:
        return Remote(name, python, script, shape, seed, threads), None
    except (EOFError, RuntimeError, OSError) as err:
        return None, f"{type(err).__name__}: {str(err)[-300:]}"


def worker_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description="a benchmark peer worker (started by benchmarks/run.py)")
    parser.add_argument("--shape", default="small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return args
