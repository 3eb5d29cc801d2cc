"""``python -m training dictionary`` and ``index``, and search on a text model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from service.model import Predictor
from service.model.search import (
    SearchIndex,
    SearchQuery,
    UnionOfSubspacesModel,
    catalogue_dir,
    read_catalogue,
    search_dir,
)
from training.cli.main import main
from training.retrieval.catalogue import build_catalogue, dataset_items
from training.retrieval.search_model import estimator_for, fit_search_model


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

    from training.cli.main import main

    path = tmp_path / "digits"
    shutil.copytree(search_model_dir, path)
    args = ["fit", "--data", "digits", "--similarity", "rbf", "--out", str(path), "--force"]
    assert main([*args, "--quiet"]) == 0
    assert not (path / "search").exists()
    assert "rebuild them (python -m training dictionary" in capsys.readouterr().err


# -- shards, updates and attributes from the command line ------------------------------------


@pytest.fixture
def search_copy(search_model_dir, tmp_path):
    path = tmp_path / "digits-search"
    shutil.copytree(search_model_dir, path)
    return path


def _ranking(path, **query) -> list:
    index = SearchIndex.load(path, Predictor.load(path))
    return index.run(SearchQuery(**query)).items


def test_index_with_attributes_in_shards_then_append_delete_and_compact(
    search_copy, digits, tmp_path, capsys
):
    records = [{"source": "scan" if j % 2 else "photo", "year": 1990 + j % 30} for j in range(797)]
    attributes = tmp_path / "attributes.jsonl"
    attributes.write_text("\n".join(json.dumps(r) for r in records))
    argv = ["index", "--model", str(search_copy), "--attributes", str(attributes),
            "--shard-items", "200", "--force", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert "in 4 shard(s)" in capsys.readouterr().out
    catalogue = read_catalogue(catalogue_dir(search_copy), search_dir(search_copy))
    assert [s.n_items for s in catalogue.shards] == [200, 200, 200, 197]
    assert catalogue.attributes == {"source": "string", "year": "number"}
    scans = {"must": [{"key": "source", "match": {"value": "scan"}}]}
    hits = _ranking(search_copy, class_label="3", top_k=797, filter=scans)
    assert len(hits) == 398
    assert all(int(i.split("-")[1]) % 2 for i, _ in hits)
    before = _ranking(search_copy, class_label="5", top_k=797)
    # Append: the training split's first 50 items, one id replaced.
    items, ids = tmp_path / "items.npy", tmp_path / "ids.txt"
    np.save(items, digits.X_train[:50])
    ids.write_text("\n".join(["test-0", *(f"extra-{j}" for j in range(49))]))
    csv_file = tmp_path / "extra.csv"
    csv_file.write_text("source,year\n" + "\n".join("sketch,2001" for _ in range(50)))
    assert main(["index", "--model", str(search_copy), "--append", "--items", str(items),
                 "--ids", str(ids), "--attributes", str(csv_file), "--quiet"]) == 0  # fmt: skip
    assert "version 2, 846 items in 5 shards (50 written, 1 replaced)" in capsys.readouterr().out
    sketches = {"must": [{"key": "source", "match": {"value": "sketch"}}]}
    assert len(_ranking(search_copy, class_label="1", top_k=100, filter=sketches)) == 50
    # Delete the new ones (and one that is not there), then compact: the ranking as before.
    ids.write_text("\n".join([*(f"extra-{j}" for j in range(49)), "nope"]))
    assert main(["index", "--model", str(search_copy), "--delete", "--ids", str(ids)]) == 0
    assert "49 removed, 1 not there (e.g. 'nope')" in capsys.readouterr().out
    assert main(["index", "--model", str(search_copy), "--compact", "--shard-items", "500"]) == 0
    assert "version 4, 797 items in 2 shards (compacted)" in capsys.readouterr().out
    catalogue = read_catalogue(catalogue_dir(search_copy), search_dir(search_copy))
    assert not catalogue.tombstones.size
    after = _ranking(search_copy, class_label="5", top_k=797)
    # test-0 now holds a training image: every other item keeps its place and score.
    assert [i for i in after if i[0] != "test-0"] == [i for i in before if i[0] != "test-0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--delete"], "--delete needs --ids"),
        (["--attributes", "{tmp}/a.txt"], "reads a .jsonl or a .csv file"),
        (["--attributes", "{tmp}/short.jsonl"], "1 records for 797 items"),
        (["--attributes", "{tmp}/bad.jsonl"], "not JSON"),
        (["--append", "--delete"], None),
        (["--cluster", "nowhere"], "names no cluster"),
    ],
)
def test_index_changes_refuse_bad_options(search_copy, tmp_path, capsys, argv, message):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "short.jsonl").write_text('{"a": 1}')
    (tmp_path / "bad.jsonl").write_text("{nope")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if message is None:  # argparse refuses it
        with pytest.raises(SystemExit):
            main(["index", "--model", str(search_copy), *argv])
        return
    assert main(["index", "--model", str(search_copy), "--force", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_index_on_a_local_cluster_writes_the_shards_the_process_would(search_copy, tmp_path):
    records = [{"year": j} for j in range(797)]
    attributes = tmp_path / "attributes.jsonl"
    attributes.write_text("\n".join(json.dumps(r) for r in records))
    common = ["index", "--model", str(search_copy), "--attributes", str(attributes),
              "--shard-items", "300", "--force", "--quiet"]  # fmt: skip
    assert main(common) == 0
    here = read_catalogue(catalogue_dir(search_copy), search_dir(search_copy))
    expected = np.array(here.projected)
    assert main([*common, "--cluster", "local:2"]) == 0
    there = read_catalogue(catalogue_dir(search_copy), search_dir(search_copy))
    assert [s.n_items for s in there.shards] == [300, 300, 197]
    np.testing.assert_allclose(there.projected, expected, rtol=2.0**-23, atol=1e-12)
    np.testing.assert_array_equal(there.ids, here.ids)
    np.testing.assert_array_equal(there.labels, here.labels)
    assert there.attributes_at(np.array([5, 796])) == [{"year": 5.0}, {"year": 796.0}]
    assert not list(search_copy.glob("search/.items-*"))  # the items' file for the workers
