"""Command line of the trainer: ``python -m training COMMAND --help``, one module per command
(:data:`COMMANDS`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from service.model import ModelError
from training.cli import (
    build_glyphs,
    dictionary,
    evaluate,
    evaluate_search,
    fit,
    index,
    report,
    shard,
)
from training.cluster.connection import ClusterError
from training.data.readers import DatasetError

# Every command, in the order ``--help`` lists them: its name, and its module, which says what it
# does (``HELP``, ``DESCRIPTION`` and any other ``PARSER_OPTIONS``), adds its options
# (``add_arguments(parser)``) and runs it (``run(args)``, the exit status).
COMMANDS = {
    "fit": fit,
    "dictionary": dictionary,
    "index": index,
    "evaluate-search": evaluate_search,
    "shard": shard,
    "build-glyphs": build_glyphs,
    "evaluate": evaluate,
    "report": report,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train and evaluate Basis Expanding SVMs offline; the artifacts they write "
        "are served by 'python -m service.api'.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        options = getattr(command, "PARSER_OPTIONS", {})
        subparser = commands.add_parser(
            name, help=command.HELP, description=command.DESCRIPTION, **options
        )
        command.add_arguments(subparser)
        subparser.set_defaults(handler=command.run)
    return parser


@contextlib.contextmanager
def _progress_lines(show: bool) -> Iterator[None]:
    """While the command runs, the ``training`` loggers' INFO lines (such as a cluster fit's
    steps) on this call's standard error (``show``, i.e. no --quiet); the loggers as they were
    after it (the stream may be gone then: a test's)."""
    if not show:
        yield
        return
    trainer = logging.getLogger("training")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = trainer.level, trainer.propagate
    trainer.addHandler(handler)
    trainer.setLevel(logging.INFO)
    trainer.propagate = False
    try:
        yield
    finally:
        trainer.removeHandler(handler)
        trainer.setLevel(level)
        trainer.propagate = propagate


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    with _progress_lines(not getattr(args, "quiet", False)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The command's exit status; an error it raises printed as one line, and 2."""
    try:
        return args.handler(args)
    except (DatasetError, ModelError, ValueError, ClusterError) as error:
        print(f"error: {error}", file=sys.stderr)
    except OSError as error:  # a file that cannot be read or written, a full disk
        where = f"{error.filename}: " if error.filename else ""
        print(f"error: {where}{error.strerror or error}", file=sys.stderr)
    except MemoryError:
        print("error: out of memory: the data is too large for this machine", file=sys.stderr)
    return 2
