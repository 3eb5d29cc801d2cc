"""The artifact format: round trips, and refusal of tampered, truncated or newer artifacts."""

import ast
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from service.model import (
    ArtifactChangedError,
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactVersionError,
    Predictor,
)
from service.model.artifact import SCHEMA_VERSION, read_artifact, read_typed_artifact
from service.model.artifact_writing import exchange_paths, write_artifact


@pytest.fixture
def model_copy(digits_model_dir, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(digits_model_dir, path)
    return path


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path, manifest):
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_round_trip_gives_identical_predictions(digits_fit, digits_model_dir, digits):
    loaded = Predictor.load(digits_model_dir)
    original = digits_fit.predictor
    # The arrays round-trip exactly (checked below); the scores are compared within rounding
    # because the fixture's model may have scored under other BLAS/numba thread counts.
    np.testing.assert_allclose(
        loaded.decision_function(digits.X_test),
        original.decision_function(digits.X_test),
        rtol=1e-12,
        atol=1e-12,
    )
    np.testing.assert_array_equal(loaded.coef, original.coef)
    assert loaded.classes == original.classes
    assert loaded.specs == original.specs
    assert loaded.input_spec == original.input_spec
    assert loaded.name == "digits"


def test_manifest_describes_the_model(digits_model_dir):
    manifest = _manifest(digits_model_dir)
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["input"] == {"kind": "grid", "shape": [8, 8, 1]}
    assert manifest["classes"] == [str(d) for d in range(10)]
    assert manifest["similarities"] == ["rbf(gamma=1)"]
    assert manifest["created"].endswith("Z")
    assert {"numpy", "scikit-learn", "numba", "python"} <= manifest["versions"].keys()
    for name, entry in manifest["arrays"].items():
        assert (digits_model_dir / entry["file"]).is_file(), name
        assert len(entry["sha256"]) == 64


def test_a_tampered_array_is_refused(model_copy):
    coef = np.load(model_copy / "coef.npy")
    coef[0, 0] += 1.0
    np.save(model_copy / "coef.npy", coef)
    with pytest.raises(ArtifactIntegrityError, match=r"checksum of coef\.npy"):
        Predictor.load(model_copy)


def test_a_truncated_array_is_refused(model_copy):
    data = (model_copy / "basis.npy").read_bytes()
    (model_copy / "basis.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactIntegrityError, match="basis"):
        Predictor.load(model_copy)


def test_a_missing_array_file_is_refused(model_copy):
    (model_copy / "intercept.npy").unlink()
    with pytest.raises(ArtifactIntegrityError, match=r"intercept\.npy is missing"):
        Predictor.load(model_copy)


def test_a_newer_schema_is_refused(model_copy):
    manifest = _manifest(model_copy)
    manifest["schema_version"] = SCHEMA_VERSION + 1
    _write_manifest(model_copy, manifest)
    with pytest.raises(ArtifactVersionError, match="upgrade"):
        Predictor.load(model_copy)


def test_a_corrupt_manifest_is_refused(model_copy):
    (model_copy / "manifest.json").write_text('{"schema_version": 1, "arr')
    with pytest.raises(ArtifactIntegrityError, match="not valid JSON"):
        Predictor.load(model_copy)


def test_a_missing_directory_or_manifest_is_reported(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        Predictor.load(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match=r"manifest\.json is missing"):
        Predictor.load(tmp_path)


def test_an_edited_manifest_inconsistent_with_the_arrays_is_refused(model_copy):
    manifest = _manifest(model_copy)
    manifest["classes"] = manifest["classes"][:-1]
    _write_manifest(model_copy, manifest)
    with pytest.raises(ArtifactIntegrityError, match="coef has shape"):
        Predictor.load(model_copy)


def test_file_names_cannot_leave_the_directory(model_copy):
    manifest = _manifest(model_copy)
    manifest["arrays"]["coef"]["file"] = "../coef.npy"
    _write_manifest(model_copy, manifest)
    with pytest.raises(ArtifactIntegrityError, match="plain name"):
        Predictor.load(model_copy)


def test_a_pickled_array_is_never_loaded(model_copy):
    # Even with a matching checksum (an attacker rewrote the manifest), no pickle is unpickled.
    np.save(model_copy / "coef.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    manifest = _manifest(model_copy)
    from service.model.artifact_writing import _sha256

    manifest["arrays"]["coef"]["sha256"] = _sha256(model_copy / "coef.npy")
    _write_manifest(model_copy, manifest)
    with pytest.raises(ArtifactIntegrityError, match=r"cannot read coef\.npy"):
        Predictor.load(model_copy)


def test_object_arrays_are_refused_on_write(tmp_path):
    with pytest.raises(ArtifactError, match="Python objects"):
        write_artifact(tmp_path / "a", {}, {"x": np.array([None], dtype=object)})
    assert not list(tmp_path.iterdir()), "no partial artifact or staging directory is left"


def test_writing_never_clobbers_unless_asked(tmp_path):
    path = write_artifact(tmp_path / "a", {"name": "one"}, {"x": np.arange(3)})
    with pytest.raises(ArtifactError, match="already exists"):
        write_artifact(path, {"name": "two"}, {"x": np.arange(4)})
    write_artifact(path, {"name": "two"}, {"x": np.arange(4)}, overwrite=True)
    artifact = read_artifact(path)
    assert artifact.manifest["name"] == "two"
    np.testing.assert_array_equal(artifact.arrays["x"], np.arange(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"], "no staging leftovers"


def test_scalar_arrays_keep_their_shape(tmp_path):
    path = write_artifact(tmp_path / "a", {}, {"s": np.asarray(2.5)})
    assert read_artifact(path).arrays["s"].shape == ()


def test_the_typed_reader_checks_the_type_the_required_arrays_and_keeps_the_metadata(tmp_path):
    manifest = {"model_type": "thing", "size": 3, "note": "kept"}
    path = write_artifact(tmp_path / "a", manifest, {"x": np.arange(3), "y": np.ones(2)})
    artifact = read_typed_artifact(path, "thing", {"x"}, {"size"}, mmap={"y"})
    assert artifact.metadata.keys() == {"note", "created", "versions"}
    assert isinstance(artifact.arrays["y"], np.memmap)
    assert not isinstance(artifact.arrays["x"], np.memmap)
    with pytest.raises(ArtifactError, match=r"manifest\.json: model_type 'thing' is not 'other'"):
        read_typed_artifact(path, "other")
    with pytest.raises(ArtifactIntegrityError, match=r"arrays missing from manifest: \['z'\]"):
        read_typed_artifact(path, "thing", {"x", "z"})
    with pytest.raises(ArtifactIntegrityError, match=r"missing from manifest: \['z'\]"):
        read_typed_artifact(path, "thing", lambda m: {"z"} if m["size"] == 3 else set())
    with pytest.raises(ArtifactIntegrityError, match=r"manifest\.json: malformed manifest"):
        read_typed_artifact(path, "thing", lambda m: m["absent"])


def test_an_artifact_of_another_model_type_is_refused(model_copy):
    manifest = _manifest(model_copy)
    manifest["model_type"] = "us-svm"
    _write_manifest(model_copy, manifest)
    with pytest.raises(ArtifactError, match="model_type 'us-svm' is not 'besvm'"):
        Predictor.load(model_copy)


def test_a_manifest_without_its_input_entry_is_malformed(model_copy):
    manifest = _manifest(model_copy)
    del manifest["input"]
    _write_manifest(model_copy, manifest)
    with pytest.raises(ArtifactIntegrityError, match="malformed manifest: KeyError"):
        Predictor.load(model_copy)


def test_replacing_an_artifact_keeps_readers_memory_maps_and_leaves_no_debris(tmp_path):
    from service.model.artifact import read_artifact
    from service.model.artifact_writing import write_artifact

    path = tmp_path / "model"
    old = np.arange(1000, dtype=np.float32)
    write_artifact(path, {"model_type": "test"}, {"values": old})
    mapped = read_artifact(path, mmap=frozenset({"values"})).arrays["values"]
    new = -np.arange(1000, dtype=np.float32)
    write_artifact(path, {"model_type": "test"}, {"values": new}, overwrite=True)
    # The reader's map still holds the old version: the file was unlinked, not rewritten.
    np.testing.assert_array_equal(mapped, old)
    np.testing.assert_array_equal(read_artifact(path).arrays["values"], new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_exchange_paths_swaps_two_directories_atomically(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "from-a").touch()
    (tmp_path / "b" / "from-b").touch()
    if not exchange_paths(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this kernel cannot exchange two paths atomically")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["from-b"]
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["from-a"]


def test_a_mapped_file_tells_when_it_is_cut_short_or_rewritten_in_place(tmp_path):
    values = np.arange(4096, dtype=np.float32).reshape(64, 64)
    write_artifact(tmp_path / "a", {"model_type": "x"}, {"projected": values})
    artifact = read_artifact(tmp_path / "a", mmap=frozenset({"projected"}))
    mapped = artifact.mapped["projected"]
    np.testing.assert_array_equal(artifact.arrays["projected"], values)
    assert mapped.array is artifact.arrays["projected"]
    mapped.check()  # intact
    file = mapped.path
    # Replaced by rename: the map and its checks keep reading the old file.
    file.rename(tmp_path / "old.npy")
    np.save(file, values * 2)
    mapped.check()
    np.testing.assert_array_equal(mapped.array, values)
    # Cut short in place: reading the map past the new end would be SIGBUS; the check says so.
    with open(tmp_path / "old.npy", "r+b") as handle:
        handle.truncate(1000)
    with pytest.raises(ArtifactChangedError, match=r"cut to 1,000 bytes .* replaced by rename"):
        mapped.check()


def test_a_mapped_file_rewritten_in_place_at_its_size_is_noticed(tmp_path):
    write_artifact(tmp_path / "a", {"model_type": "x"}, {"projected": np.ones((8, 8))})
    mapped = read_artifact(tmp_path / "a", mmap=frozenset({"projected"})).mapped["projected"]
    data = mapped.path.read_bytes()
    os.utime(mapped.path, ns=(0, 0))  # whatever the clock's resolution, another time
    mapped.path.write_bytes(data)  # the same bytes: no truncation, a new modification time
    os.utime(mapped.path, ns=(1, 1))
    with pytest.raises(ArtifactChangedError, match="was rewritten in place"):
        mapped.check()


def test_npy_headers_are_parsed_one_thread_at_a_time(model_copy, monkeypatch):
    # numpy parses an .npy header with ast.literal_eval, and CPython 3.11's ast fails when two
    # threads build parse trees at once (python/cpython#106905): a model reload beside other
    # loads was refused with "SystemError: AST constructor recursion depth mismatch" in CI.
    # Watch how many threads are inside literal_eval at once while six load the model.
    inside, most = 0, 0
    guard = threading.Lock()
    literal_eval = ast.literal_eval

    def watched(text):
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.002)  # widen the window two parses would share
        try:
            return literal_eval(text)
        finally:
            with guard:
                inside -= 1

    monkeypatch.setattr(ast, "literal_eval", watched)
    failures = []

    def load():
        try:
            Predictor.load(model_copy)
        except Exception as error:
            failures.append(error)

    threads = [threading.Thread(target=load) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert most == 1
    # and what the loader reads is what numpy's own reader reads
    loaded = read_artifact(model_copy)
    for name, entry in _manifest(model_copy)["arrays"].items():
        expected = np.load(model_copy / entry["file"], allow_pickle=False)
        np.testing.assert_array_equal(np.asarray(loaded.arrays[name]), expected)
        assert np.asarray(loaded.arrays[name]).dtype == expected.dtype
