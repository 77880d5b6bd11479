"""User errors on the command line: one line on stderr, ``glassbox <command>: error: ...``, exit 2.

A command raises ``UsageError`` (or lets ``user_errors`` turn a library error it expects into one)
for anything the user can fix: a bad value, a missing file, a model that cannot be found. Anything
else is a bug and keeps its traceback.
"""

import argparse
import sys
from contextlib import contextmanager
from typing import Iterator


class UsageError(Exception):
    """A mistake in the command's arguments or inputs; the message names the value and what is accepted."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with a one-line error (no usage block): ``PROG: error: MESSAGE``, exit 2; a value
    outside a flag's (or the subcommand's) choices is answered with the closest ones."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def _check_value(self, action, value):  # argparse calls it for every value of an action with choices
        if action.choices is not None and value not in action.choices:
            from ..suggest import did_you_mean

            names = ", ".join(repr(c) for c in action.choices)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{did_you_mean(value, action.choices)} "
                                                 f"(choose from {names})")


@contextmanager
def user_errors(*types: type, prefix: str = "") -> Iterator[None]:
    """Re-raise the library errors ``types`` (the ones a command expects from user input) as UsageError.

    Only the first line of the library's message is kept, so chained causes never reach the user.
    """
    try:
        yield
    except types as error:
        message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
        raise UsageError(f"{prefix}{first}") from error


def device_arg(value: str) -> str:
    """argparse ``type=`` for ``--device``: a device torch knows and this build can use."""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {value!r}; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"device {value!r}: this torch build has no usable CUDA device; use cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"device {value!r}: only {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"device {value!r}: MPS is not available in this torch build")
    if device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"device {value!r}: glassbox runs on cpu, cuda or mps")
    return value
