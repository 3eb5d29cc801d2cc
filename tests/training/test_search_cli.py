"""``python -m training dictionary`` and ``index``, and search on a text model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from service.model import Predictor
from service.model.search import SearchIndex, SearchQuery, UnionOfSubspacesModel, read_catalogue
from training.cli import main
from training.search import (
    build_catalogue,
    catalogue_dir,
    dataset_items,
    estimator_for,
    fit_search_model,
    search_dir,
)


@pytest.fixture
def model_copy(digits_model_dir, tmp_path):
    path = tmp_path / "digits"
    shutil.copytree(digits_model_dir, path)
    return path


def test_dictionary_help_shows_the_hyper_parameters(capsys):
    with pytest.raises(SystemExit):
        main(["dictionary", "--help"])
    text = capsys.readouterr().out
    for flag in ("--variant", "--atoms", "--alpha", "--beta", "--l1-ratio", "--lambda-z",
                 "--lambda-d", "--t0-z", "--epochs", "--sparsity", "--feature-space"):  # fmt: skip
        assert flag in text


def test_a_variant_from_the_command_line(model_copy, capsys):
    argv = ["dictionary", "--model", str(model_copy), "--variant", "us-svm-n", "--atoms", "16",
            "--epochs", "2", "--sparsity", "3", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "us-svm-n" in out
    assert "test mAP" in out
    model = UnionOfSubspacesModel.load(search_dir(model_copy), model_copy)
    assert model.n_atoms == 16
    assert (model.codes >= 0).all()
    assert ((model.codes != 0).sum(axis=0) <= 3).all()
    manifest = json.loads((search_dir(model_copy) / "manifest.json").read_text())
    assert manifest["estimator"]["nonnegative"] is True
    assert manifest["estimator"]["n_epochs"] == 2
    assert manifest["n_nonzero"] == 3
    # Present: an error without --force, a no-op with --if-missing.
    assert main(argv) == 2
    assert "pass --force" in capsys.readouterr().err
    assert main([*argv, "--if-missing"]) == 0


def test_index_from_a_memory_mapped_file_with_ids(model_copy, digits, tmp_path, capsys):
    small = ["dictionary", "--model", str(model_copy), "--atoms", "8", "--epochs", "1", "--quiet"]
    assert main(small) == 0
    items = tmp_path / "items.npy"
    np.save(items, digits.X_test[:50].reshape(50, 8, 8))
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(f"item{i}" for i in range(50)) + "\n")
    argv = ["index", "--model", str(model_copy), "--items", str(items), "--ids", str(ids),
            "--chunk-size", "7", "--negatives", "20", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    catalogue = read_catalogue(catalogue_dir(model_copy), search_dir(model_copy))
    assert catalogue.ids.tolist() == [f"item{i}" for i in range(50)]
    assert catalogue.negatives.size == 20
    assert catalogue.labels is None
    model = UnionOfSubspacesModel.load(search_dir(model_copy), model_copy)
    predictor = Predictor.load(model_copy)
    expected = (predictor.normalized_inputs(digits.X_test[:50]) @ model.dictionary).T
    np.testing.assert_allclose(catalogue.projected, expected, rtol=1e-5, atol=1e-6)
    assert main(argv) == 2  # present, no --force
    assert "pass --force" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--items", "x.npy", "--data", "digits"], "not both"),
        (["--ids", "ids.txt"], "--ids goes with --items"),
        (["--items", "missing.npy"], "must be an existing .npy file"),
    ],
)
def test_index_refuses_bad_sources(search_model_dir, tmp_path, capsys, extra, message):
    copy = tmp_path / "m"
    shutil.copytree(search_model_dir, copy)
    shutil.rmtree(catalogue_dir(copy))
    assert main(["index", "--model", str(copy), "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err


def test_index_needs_a_search_model(model_copy, capsys):
    assert main(["index", "--model", str(model_copy), "--quiet"]) == 2
    assert "no model artifact" in capsys.readouterr().err


def test_ids_count_must_match_items(model_copy, digits, tmp_path, capsys):
    assert main(["dictionary", "--model", str(model_copy), "--atoms", "8", "--epochs", "1",
                 "--quiet"]) == 0  # fmt: skip
    items = tmp_path / "items.npy"
    np.save(items, digits.X_test[:5])
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(4))
    argv = ["index", "--model", str(model_copy), "--items", str(items), "--ids", str(ids)]
    assert main(argv) == 2
    assert "4 ids for 5 items" in capsys.readouterr().err


def test_search_on_a_text_model_reads_besvm_features(text_fit, text_dataset, tmp_path):
    path = tmp_path / "topics"
    text_fit.predictor.save(path)
    predictor = Predictor.load(path)
    model = fit_search_model(
        predictor, text_dataset, estimator_for(n_atoms=8, n_epochs=5, random_state=0), sparsity=3
    )
    assert model.feature_space == "besvm"
    assert model.n_features == predictor.coef.shape[1]
    model.save(search_dir(path), path)
    items, ids, labels = dataset_items(text_dataset, "test")
    build_catalogue(path, predictor, model, items, ids, labels, chunk_size=5,
                    progress=False)  # fmt: skip
    index = SearchIndex.load(path, predictor)
    label = predictor.classes[0]
    result = index.run(SearchQuery(class_label=label, top_k=5))
    positions = [int(i.split("-")[1]) for i, _ in result.items]
    assert (labels[positions] == label).mean() >= 0.6
    with pytest.raises(ValueError, match="use the besvm feature space"):
        fit_search_model(predictor, text_dataset, estimator_for(), feature_space="inputs")


def test_refitting_a_model_says_its_search_model_went_with_it(search_model_dir, tmp_path, capsys):
    import shutil

    from training.cli import main

    path = tmp_path / "digits"
    shutil.copytree(search_model_dir, path)
    args = ["fit", "--data", "digits", "--similarity", "rbf", "--out", str(path), "--force"]
    assert main([*args, "--quiet"]) == 0
    assert not (path / "search").exists()
    assert "rebuild them (python -m training dictionary" in capsys.readouterr().err
