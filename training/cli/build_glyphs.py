"""``python -m training build-glyphs``: render a notMNIST-like image set from the installed
fonts."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from training.cli.common import status
from training.data.glyphs import FONTS_DIR, build_glyphs
from training.data.readers import DatasetError

HELP = "render a notMNIST-like image set (letters A-J) from the installed fonts"
DESCRIPTION = textwrap.fill(
    "Render the letters A to J of every installed font (Debian's font packages: make "
    "glyph-fonts) as size x size grey images, split by font into training and test "
    "fonts, and write a .npz that --data reads as grid(size, size, 1): real images "
    "large enough for the bof transform's 16 x 16 patches.",
    width=88,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    parser.add_argument(
        "--fonts-dir", type=Path, default=FONTS_DIR, help="where fonts are (default: %(default)s)"
    )
    parser.add_argument(
        "--train-per-class",
        type=int,
        default=100,
        help="training fonts, i.e. images per letter (default: %(default)s, as the paper's 100 "
        "images per class)",
    )
    parser.add_argument(
        "--test-per-class",
        type=int,
        default=200,
        help="test fonts at most (default: %(default)s)",
    )
    parser.add_argument("--size", type=int, default=64, help="image side (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split (default: 0)")
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        raise DatasetError(f"{args.out} already exists: pass --force to replace it")
    for name in ("train_per_class", "test_per_class", "size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.size < 16:
        raise ValueError("--size must be at least 16 (a 16 x 16 patch)")
    counts = build_glyphs(
        args.out,
        root=args.fonts_dir,
        train_per_class=args.train_per_class,
        test_per_class=args.test_per_class,
        size=args.size,
        seed=args.seed,
        progress=not args.quiet,
    )
    status(
        args,
        f"wrote {args.out}: {counts['train']} training and {counts['test']} test images from "
        f"{counts['fonts']} fonts ({counts['skipped']} font files left out)",
    )
    return 0
