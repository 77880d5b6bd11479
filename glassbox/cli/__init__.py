"""The ``glassbox`` command line: one module per subcommand, each with ``add_parser`` and ``run``."""

import argparse
import importlib
import sys

COMMANDS = ("demo", "parity", "attention", "train")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glassbox", description="glassbox: a hooked, tested GPT-2 for mechanistic interpretability. "
        "demo, parity and attention use the shipped glassbox-austen model unless --model says otherwise.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
