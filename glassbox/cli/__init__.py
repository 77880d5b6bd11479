"""The ``glassbox`` command line: one module per subcommand, each with ``add_parser`` and ``run``."""

import importlib
import os
import sys

from .errors import Parser, UsageError

COMMANDS = ("demo", "parity", "attention", "train", "circuit", "graph", "train_sae", "export", "scale_jobs")


def build_parser() -> Parser:
    from .. import __version__

    parser = Parser(
        prog="glassbox", description="glassbox: a hooked, tested reimplementation of transformer language models (GPT-2, "
        "Llama, Mistral, Qwen, Gemma, GPT-NeoX, OLMo 2, GPT-J) for mechanistic interpretability. "
        "demo, parity and attention use the shipped glassbox-austen model unless --model says otherwise. "
        "A mistake in the arguments prints one line (glassbox COMMAND: error: ...) and exits with status 2.")
    parser.add_argument("--version", action="version", version=f"glassbox {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args) or 0
        sys.stdout.flush()  # inside the try: a reader that went away shows here, not at exit
        return code
    except UsageError as error:
        print(f"glassbox {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (glassbox ... | head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
