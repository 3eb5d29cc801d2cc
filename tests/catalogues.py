"""Catalogues for the search tests: the digits model's test split (ids ``test-<j>``) rebuilt in
shards of a chosen size, with random attributes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.model import Predictor
from service.model.search import UnionOfSubspacesModel, search_dir
from training.retrieval.catalogue import build_catalogue

SOURCES = ("scan", "photo", "sketch")


def attributes_of(n: int, seed: int = 0) -> list[dict]:
    """Random attributes of ``n`` items: a year and a weight (numbers) of every item, and a
    source (a string) of all but every seventh."""
    rng = np.random.default_rng(seed)
    records = []
    for j in range(n):
        record = {"year": int(rng.integers(1990, 2030)), "weight": float(rng.normal())}
        if j % 7:
            record["source"] = SOURCES[int(rng.integers(0, 3))]
        records.append(record)
    return records


def rebuild_catalogue(path: Path, digits, shard_items: int, attributes=None) -> Path:
    """Rebuild the catalogue of the model at ``path`` (with its search model) from the digits
    test split, in shards of ``shard_items``, with ``attributes``; return ``path``."""
    predictor = Predictor.load(path)
    model = UnionOfSubspacesModel.load(search_dir(path), path)
    ids = np.array([f"test-{j}" for j in range(len(digits.y_test))])
    build_catalogue(path, predictor, model, digits.X_test, ids, labels=digits.y_test,
                    progress=False, overwrite=True, attributes=attributes,
                    shard_items=shard_items)  # fmt: skip
    return path
