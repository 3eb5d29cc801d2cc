"""``python -m training build-glyphs``: a notMNIST-like image set rendered from installed fonts.

No scene data set ships offline, and the images of the sensing-kernel paper's section 5 need
patches of 16 x 16 pixels; letters rendered from many typefaces are real images of that size that
this machine can make without the network (Debian's font packages; ``make glyph-fonts``
installs the default set's, listed in the Makefile). Each
font file that renders every letter of :data:`LETTERS` (A to J, as notMNIST) as a distinct,
non-empty glyph gives one image per letter: the glyph rendered large, cropped to its ink, scaled
to fit ``size - 2 * margin`` pixels on its longer side and centred on a black ``size x size``
canvas, white ink, grey levels 0..255. Fonts whose ten glyphs repeat another font's exactly (the
same face as .otf and .ttf, or Type 1) count once.

The set is split by font, not by image, so that a model is tested on typefaces it never saw:
``train_per_class`` fonts (seeded) train, up to ``test_per_class`` of the others test. It is
written as a ``.npz`` that ``--data`` reads (``X``, ``y``, ``X_test``, ``y_test`` of shape
(n, size, size), uint8, read as ``grid(size, size, 1)``) with ``fonts`` and ``fonts_test``,
the font file of each image, for provenance. The images are never committed: the command
makes them again.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LETTERS = "ABCDEFGHIJ"
FONTS_DIR = Path("/usr/share/fonts")
FONT_SUFFIXES = (".ttf", ".otf", ".ttc", ".pfb", ".t1")
# Rendered at this many points, then scaled down: fine strokes survive the resampling.
RENDER_POINTS = 96


@dataclass
class Glyphs:
    """Every usable font's letters.

    Attributes
    ----------
    images : ndarray of shape (n_fonts, len(letters), size, size), uint8
    fonts : list of str
        The font file of each row (relative to the fonts folder).
    skipped : int
        Font files left out: unreadable, missing a letter, glyphs not distinct, or a
        duplicate of another font's.
    """

    images: np.ndarray
    fonts: list[str]
    skipped: int


def font_files(root: Path = FONTS_DIR) -> list[Path]:
    """Font files under ``root``, sorted by path (the set does not depend on the walk)."""
    found = [
        Path(folder) / name
        for folder, _, names in os.walk(root)
        for name in names
        if name.lower().endswith(FONT_SUFFIXES)
    ]
    return sorted(found)


def render_font(path: Path, letters: str = LETTERS, size: int = 64, margin: int = 4):
    """The letters of one font as ``size x size`` images, or None if the font cannot render
    each of them as a distinct glyph of its own (missing glyphs render as the font's
    placeholder, which every unknown character shares).

    Returns
    -------
    ndarray of shape (len(letters), size, size), uint8, or None
    """
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.truetype(str(path), RENDER_POINTS)
    except (OSError, ValueError):
        return None
    box = size - 2 * margin
    canvas_side = RENDER_POINTS * 3

    def ink(text: str):
        canvas = Image.new("L", (canvas_side, canvas_side), 0)
        try:
            ImageDraw.Draw(canvas).text((RENDER_POINTS, RENDER_POINTS // 2), text, 255, font=font)
        except (OSError, ValueError):
            return None
        bbox = canvas.getbbox()
        return None if bbox is None else canvas.crop(bbox)

    placeholder = ink("\ue000")  # a private-use character: no Latin font draws it
    images = []
    for letter in letters:
        glyph = ink(letter)
        if glyph is None or (
            placeholder is not None
            and glyph.size == placeholder.size
            and glyph.tobytes() == placeholder.tobytes()
        ):
            return None
        scale = box / max(glyph.size)
        width = max(1, round(glyph.width * scale))
        height = max(1, round(glyph.height * scale))
        glyph = glyph.resize((width, height), Image.Resampling.LANCZOS)
        image = Image.new("L", (size, size), 0)
        image.paste(glyph, ((size - width) // 2, (size - height) // 2))
        images.append(np.asarray(image, dtype=np.uint8))
    stacked = np.stack(images)
    if len({image.tobytes() for image in stacked}) < len(letters):
        return None
    return stacked


def render_glyphs(
    root: Path = FONTS_DIR, letters: str = LETTERS, size: int = 64, progress: bool = False
) -> Glyphs:
    """:func:`render_font` of every font file under ``root``, duplicates dropped."""
    from tqdm.auto import tqdm

    rows, names, seen, skipped = [], [], set(), 0
    for path in tqdm(font_files(root), desc="rendering fonts", disable=not progress):
        images = render_font(path, letters, size)
        digest = None if images is None else hashlib.sha256(images.tobytes()).hexdigest()
        if images is None or digest in seen:
            skipped += 1
            continue
        seen.add(digest)
        rows.append(images)
        names.append(str(path.relative_to(root)))
    empty = np.empty((0, len(letters), size, size), dtype=np.uint8)
    return Glyphs(np.stack(rows) if rows else empty, names, skipped)


def split_glyphs(
    glyphs: Glyphs,
    train_per_class: int,
    test_per_class: int,
    letters: str = LETTERS,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz``: ``train_per_class`` fonts train, up to ``test_per_class``
    others test, chosen by a seeded permutation of the fonts.

    Raises
    ------
    ValueError
        Fewer fonts than ``train_per_class`` plus one.
    """
    n_fonts = len(glyphs.fonts)
    if n_fonts <= train_per_class:
        raise ValueError(
            f"{n_fonts} usable fonts: at least {train_per_class + 1} are needed for "
            f"{train_per_class} training images per class and a test split (install the font "
            "packages: make glyph-fonts)"
        )
    order = np.random.default_rng(seed).permutation(n_fonts)
    train, test = order[:train_per_class], order[train_per_class:][:test_per_class]

    def part(fonts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        fonts = np.sort(fonts)
        X = glyphs.images[fonts].reshape(-1, *glyphs.images.shape[2:])
        y = np.tile(np.asarray(list(letters)), len(fonts))
        names = np.repeat(np.asarray(glyphs.fonts)[fonts], len(letters))
        return X, y, names

    X, y, fonts = part(train)
    X_test, y_test, fonts_test = part(test)
    return {
        "X": X,
        "y": y,
        "X_test": X_test,
        "y_test": y_test,
        "fonts": fonts,
        "fonts_test": fonts_test,
    }


def build_glyphs(
    out: Path,
    root: Path = FONTS_DIR,
    train_per_class: int = 100,
    test_per_class: int = 200,
    size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, int]:
    """Render, split and write the set to ``out`` (a ``.npz``, written beside and renamed).

    Returns
    -------
    dict
        ``fonts`` (usable), ``skipped``, ``train`` and ``test`` (images).
    """
    glyphs = render_glyphs(root, LETTERS, size, progress)
    arrays = split_glyphs(glyphs, train_per_class, test_per_class, LETTERS, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial.npz")
    np.savez_compressed(partial, **arrays)
    partial.replace(out)
    return {
        "fonts": len(glyphs.fonts),
        "skipped": glyphs.skipped,
        "train": len(arrays["y"]),
        "test": len(arrays["y_test"]),
    }
