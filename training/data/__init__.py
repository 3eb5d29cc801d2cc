"""Data sets: the embedded digits, Debian's fortunes, the files a user brings
(:mod:`~training.data.datasets`, reading them with :mod:`~training.data.readers`), the held-back
sets packages ship (:mod:`~training.data.packaged`) and glyphs rendered from fonts
(:mod:`~training.data.glyphs`)."""
