"""Text data sets: Debian's fortunes, a folder of class sub-folders, a JSON Lines file."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from service.model.inputs.spec import InputSpec
from training.data.datasets import (
    FORTUNES,
    FORTUNES_DIR,
    FORTUNES_MIN_QUOTES,
    Dataset,
    load_dataset,
    load_fortunes_dataset,
)
from training.data.readers import DatasetError

TEXT = InputSpec("text", ())


# -- helpers ------------------------------------------------------------------------------------


def _assert_text_dataset(dataset: Dataset) -> None:
    assert dataset.input_spec == TEXT
    for X, y in ((dataset.X_train, dataset.y_train), (dataset.X_test, dataset.y_test)):
        assert X.dtype == object
        assert X.ndim == 1
        assert all(type(document) is str for document in X)
        assert y.dtype.kind == "U"
        assert y.shape == X.shape


def _assert_same(first: Dataset, second: Dataset) -> None:
    assert first.name == second.name
    assert first.input_spec == second.input_spec
    for name in ("X_train", "y_train", "X_test", "y_test"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))


def _assert_stratified(dataset: Dataset, test_fraction: float) -> None:
    """Every class in both splits, test share within one document per class of the fraction."""
    assert set(dataset.y_train.tolist()) == set(dataset.y_test.tolist())
    n = len(dataset.y_train) + len(dataset.y_test)
    assert abs(len(dataset.y_test) - test_fraction * n) <= 1
    train, test = Counter(dataset.y_train.tolist()), Counter(dataset.y_test.tolist())
    for label in train:
        total = train[label] + test[label]
        assert abs(test[label] - test_fraction * total) <= 1


def _all(dataset: Dataset) -> list[tuple[str, str]]:
    """Every (label, document) pair of both splits, sorted."""
    pairs = zip(
        np.concatenate([dataset.y_train, dataset.y_test]).tolist(),
        np.concatenate([dataset.X_train, dataset.X_test]).tolist(),
        strict=True,
    )
    return sorted(pairs)


def _write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- a folder of class sub-folders --------------------------------------------------------------


def _corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for i in range(8):
        _write_bytes(root / "spam" / f"s{i}.txt", f"buy now {i}".encode())
    for i in range(3):
        _write_bytes(root / "ham" / f"h{i}.eml", f"meeting at {i}\nsee you".encode())
    _write_bytes(root / "ham" / "blank", b"   \n")  # empty after strip: kept as it is
    _write_bytes(root / "spam" / ".DS_Store", b"\x00\x01 hidden file")
    _write_bytes(root / ".git" / "HEAD", b"hidden folder")
    _write_bytes(root / "ham" / "nested" / "deep.txt", b"in a sub-sub-folder: not a document")
    _write_bytes(root / "README", b"a file beside the class folders: not a document")
    return root


def test_folder_corpus_round_trip(tmp_path):
    root = _corpus(tmp_path)
    dataset = load_dataset(str(root), test_fraction=0.25, seed=3)
    _assert_text_dataset(dataset)
    assert dataset.name == "corpus"
    assert dataset.classes == ["ham", "spam"]
    assert (len(dataset.y_train), len(dataset.y_test)) == (9, 3)
    _assert_stratified(dataset, 0.25)
    expected = [("ham", f"meeting at {i}\nsee you") for i in range(3)] + [("ham", "   \n")]
    expected += [("spam", f"buy now {i}") for i in range(8)]
    assert _all(dataset) == sorted(expected)
    assert dataset.source == {"path": str(root), "test_fraction": 0.25, "seed": 3}
    _assert_same(dataset, load_dataset(dataset.source))


def test_folder_corpus_split_depends_on_the_seed_only(tmp_path):
    root = _corpus(tmp_path)
    _assert_same(load_dataset(str(root), seed=1), load_dataset(str(root), seed=1))
    splits = {tuple(load_dataset(str(root), seed=seed).X_test.tolist()) for seed in range(6)}
    assert len(splits) > 1


def test_folder_corpus_replaces_bytes_that_are_not_utf8(tmp_path):
    root = tmp_path / "corpus"
    for label in ("a", "b"):
        for i in range(2):
            _write_bytes(root / label / f"{i}.txt", b"caf\xe9 " + label.encode())
    dataset = load_dataset(str(root), test_fraction=0.5)
    assert sorted(dataset.X_train.tolist() + dataset.X_test.tolist()) == [
        "caf\ufffd a",
        "caf\ufffd a",
        "caf\ufffd b",
        "caf\ufffd b",
    ]


def test_folder_without_class_sub_folders(tmp_path):
    root = tmp_path / "flat"
    _write_bytes(root / "one.txt", b"a document outside any class folder")
    _write_bytes(root / ".hidden" / "two.txt", b"hidden folders are no classes")
    with pytest.raises(DatasetError, match=re.escape(f"{root}: no class sub-folders")):
        load_dataset(str(root))


def test_folder_with_one_class_holding_documents(tmp_path):
    root = tmp_path / "corpus"
    for i in range(4):
        _write_bytes(root / "full" / f"{i}.txt", b"text")
    (root / "empty").mkdir()
    _write_bytes(root / "hidden-only" / ".secret", b"skipped")
    message = re.escape(f"{root}: needs at least 2 class sub-folders holding documents, found 1")
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(root))


def test_folder_with_an_unreadable_file(tmp_path, monkeypatch):
    root = _corpus(tmp_path)
    bad = root / "spam" / "s3.txt"
    read_bytes = Path.read_bytes

    def refuse(self: Path) -> bytes:
        if self == bad:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(DatasetError, match=re.escape(f"{bad}: cannot read (Permission denied)")):
        load_dataset(str(root))


def test_folder_whose_split_is_impossible(tmp_path):
    root = tmp_path / "corpus"
    for i in range(5):
        _write_bytes(root / "many" / f"{i}.txt", b"text")
    _write_bytes(root / "single" / "only.txt", b"alone")
    message = re.escape(f"{root}: cannot make a stratified split") + r".*'single' with 1 document"
    with pytest.raises(DatasetError, match=message):
        load_dataset(str(root))


def test_text_data_sets_take_no_input_shape(tmp_path):
    root = _corpus(tmp_path)
    with pytest.raises(DatasetError, match="takes no input shape"):
        load_dataset(str(root), input_shape="grid(2, 2, 1)")


@pytest.mark.parametrize("test_fraction", [-0.1, 1.0])
def test_text_data_sets_check_the_test_fraction(tmp_path, test_fraction):
    root = _corpus(tmp_path)
    with pytest.raises(DatasetError, match="test fraction must be at least 0"):
        load_dataset(str(root), test_fraction=test_fraction)


def test_a_test_fraction_of_0_keeps_every_document_for_training(tmp_path):
    root = _corpus(tmp_path)
    everything = load_dataset(str(root), test_fraction=0.0)
    split = load_dataset(str(root))
    assert len(everything.y_test) == 0
    assert len(everything.y_train) == len(split.y_train) + len(split.y_test)
    assert sorted(everything.X_train.tolist()) == sorted([*split.X_train, *split.X_test])


# -- a JSON Lines file --------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "reviews.jsonl"
    records = [{"text": f"good film {i}", "label": "pos"} for i in range(4)]
    records += [{"text": f"bad film {i}", "label": 0, "id": i} for i in range(4)]
    records += [{"text": "", "label": 7}, {"text": "line\u2028separator", "label": 7}]
    lines = [json.dumps(record, ensure_ascii=False) for record in records]
    lines[2:2] = ["", "   \t"]  # blank lines are ignored
    path.write_text("\n".join(lines) + "\r\n\n", encoding="utf-8")
    dataset = load_dataset(str(path), test_fraction=0.5, seed=2)
    _assert_text_dataset(dataset)
    assert dataset.name == "reviews"
    assert dataset.classes == ["0", "7", "pos"]
    assert (len(dataset.y_train), len(dataset.y_test)) == (5, 5)
    _assert_stratified(dataset, 0.5)
    expected = [(str(record["label"]), record["text"]) for record in records]
    assert _all(dataset) == sorted(expected)
    assert dataset.source == {"path": str(path), "test_fraction": 0.5, "seed": 2}
    _assert_same(dataset, load_dataset(dataset.source))


def test_jsonl_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.jsonl"
    lines = [json.dumps({"text": f"t{i}", "label": "ab"[i % 2]}) for i in range(4)]
    _write_bytes(path, b"\xef\xbb\xbf" + "\n".join(lines).encode())
    assert sorted(load_dataset(str(path), test_fraction=0.5).classes) == ["a", "b"]


_GOOD = '{"text": "fine", "label": "a"}'


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_GOOD, "", '{"text": "oops", "label": }'], r":3: invalid JSON"),
        ([_GOOD, '{"text": "unterminated'], r":2: invalid JSON"),
        (['["text", "label"]'], r":1: expected a JSON object .* got an array"),
        ([_GOOD, '"just a string"'], r":2: expected a JSON object .* got a string"),
        ([_GOOD, _GOOD, "", "", '{"label": "a"}'], r":5: missing 'text'; found keys \['label'\]"),
        (['{"text": "no label"}'], r":1: missing 'label'"),
        (['{"txt": "typo", "lbl": 1}'], r":1: missing 'text' and 'label'"),
        (['{"text": 3, "label": "a"}'], r':1: "text" must be a string, got a number \(3\)'),
        (['{"text": null, "label": "a"}'], r':1: "text" must be a string, got null'),
        ([_GOOD, '{"text": "x", "label": 1.5}'], r':2: "label" must be a string or an integer'),
        (['{"text": "x", "label": true}'], r':1: "label" must be .* got a boolean'),
        (['{"text": "x", "label": null}'], r':1: "label" must be .* got null'),
        (['{"text": "x", "label": ["a"]}'], r':1: "label" must be .* got an array'),
        (['{"text": "x", "label": {"a": 1}}'], r':1: "label" must be .* got an object'),
        (['{"text": "x", "label": " "}'], r':1: "label" is empty'),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=re.escape(str(path)) + message):
        load_dataset(str(path))


def test_jsonl_that_is_not_utf8_names_the_line(tmp_path):
    path = _write_bytes(tmp_path / "latin.jsonl", _GOOD.encode() + b'\n{"text": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=re.escape(f"{path}:2: not valid UTF-8")):
        load_dataset(str(path))


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_jsonl(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=re.escape(f"{path}: no documents")):
        load_dataset(str(path))


def test_jsonl_whose_split_is_impossible(tmp_path):
    path = tmp_path / "few.jsonl"
    records = [{"text": "x", "label": "a"}] * 4 + [{"text": "y", "label": "b"}]
    path.write_text("\n".join(json.dumps(record) for record in records))
    with pytest.raises(DatasetError, match=re.escape(f"{path}: cannot make a stratified split")):
        load_dataset(str(path))


def test_errors_for_unknown_sources_mention_the_text_options(tmp_path):
    with pytest.raises(DatasetError, match="no such file") as missing:
        load_dataset(str(tmp_path / "nothing-here"))
    with pytest.raises(DatasetError, match="unsupported file type") as unsupported:
        load_dataset(str(_write_bytes(tmp_path / "notes.txt", b"hello")))
    for error in (missing, unsupported):
        message = str(error.value)
        assert FORTUNES in message
        assert ".jsonl" in message
        assert "sub-folder" in message


# -- fortunes: a small synthetic folder ---------------------------------------------------------


def _synthetic_fortunes(tmp_path: Path) -> Path:
    root = tmp_path / "fortunes"
    _write_bytes(
        root / "alpha",
        b"one\n%\n  two, with a 100% guarantee  \n%  \t\n\n%\nthree\n%not a separator\nlines\n%\n",
    )
    _write_bytes(root / "beta", b"caf\xe9\r\n%\r\nsecond\r\n%\r\n\r\nthird\r\n")  # CRLF, latin-1
    _write_bytes(root / "gamma", b"the only quote\n%\n")  # below min_quotes
    _write_bytes(root / "empty", b"")
    _write_bytes(root / "alpha.dat", b"\x00\x00\x00\x02\xff\xfe%\n%\ngarbage\n%\nmore\n%\nx\n")
    (root / "alpha.u8").symlink_to("alpha")
    (root / "beta-link").symlink_to("beta")  # not a regular file: skipped
    _write_bytes(root / "off" / "rude", b"a\n%\nb\n%\nc\n%\nd\n%\ne\n")
    return root


ALPHA = ["one", "two, with a 100% guarantee", "three\n%not a separator\nlines"]
BETA = ["caf\ufffd", "second", "third"]


def test_fortunes_parsing_on_a_synthetic_folder(tmp_path):
    root = _synthetic_fortunes(tmp_path)
    dataset = load_fortunes_dataset(root, min_quotes=3, test_fraction=1 / 3, seed=5)
    _assert_text_dataset(dataset)
    assert dataset.name == FORTUNES
    assert dataset.classes == ["alpha", "beta"]
    assert (len(dataset.y_train), len(dataset.y_test)) == (4, 2)
    _assert_stratified(dataset, 1 / 3)
    assert _all(dataset) == sorted([("alpha", q) for q in ALPHA] + [("beta", q) for q in BETA])
    assert dataset.source == {
        "path": FORTUNES,
        "min_quotes": 3,
        "root": str(root),
        "test_fraction": 1 / 3,
        "seed": 5,
    }
    _assert_same(dataset, load_dataset(dataset.source))


def test_fortunes_min_quotes_keeps_small_categories(tmp_path):
    root = _synthetic_fortunes(tmp_path)
    _write_bytes(root / "gamma", b"the first quote\n%\nthe second\n")
    dataset = load_fortunes_dataset(root, min_quotes=2, test_fraction=0.5)
    assert dataset.classes == ["alpha", "beta", "gamma"]  # "empty" has no quotes at all
    assert sorted(dataset.X_train.tolist() + dataset.X_test.tolist()) == sorted(
        [*ALPHA, *BETA, "the first quote", "the second"]
    )


def test_fortunes_with_a_category_too_small_to_split(tmp_path):
    root = _synthetic_fortunes(tmp_path)
    with pytest.raises(
        DatasetError, match=r"cannot make a stratified split.*'gamma' with 1 document"
    ):
        load_fortunes_dataset(root, min_quotes=1, test_fraction=0.25)


def test_fortunes_with_fewer_than_two_categories(tmp_path):
    root = _synthetic_fortunes(tmp_path)
    _write_bytes(root / "alpha", b"a\n%\nb\n%\nc\n%\nd\n")
    message = re.escape(f"{root}: fewer than 2 categories have at least 4 quotes (1 do)")
    with pytest.raises(DatasetError, match=message):
        load_fortunes_dataset(root, min_quotes=4)


@pytest.mark.parametrize("min_quotes", [0, -1, 2.5, True])
def test_fortunes_min_quotes_must_be_a_positive_integer(tmp_path, min_quotes):
    with pytest.raises(DatasetError, match="min_quotes must be a positive integer"):
        load_fortunes_dataset(_synthetic_fortunes(tmp_path), min_quotes=min_quotes)


def test_fortunes_missing_folder_says_what_to_install(tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as error:
        load_fortunes_dataset(root)
    message = str(error.value)
    assert "does not exist" in message
    assert f"looked in {root}" in message
    assert "fortunes-min" in message
    assert "apt-get install fortunes fortunes-min" in message


def test_fortunes_folder_without_fortune_files(tmp_path):
    root = tmp_path / "fortunes"
    _write_bytes(root / "cookie.dat", b"\x00\x01")
    (root / "cookie.u8").symlink_to("cookie")  # dangling, like a half-removed package
    _write_bytes(root / "off" / "rude", b"a\n%\nb\n")
    with pytest.raises(DatasetError, match=r"holds no fortune files.*apt-get install fortunes"):
        load_fortunes_dataset(root)


def test_recorded_fortunes_source_with_unknown_settings(tmp_path):
    source = {"path": FORTUNES, "root": str(_synthetic_fortunes(tmp_path)), "colour": "red"}
    with pytest.raises(DatasetError, match=r"unknown settings \['colour'\]"):
        load_dataset(source)


# -- fortunes: the installed Debian packages ----------------------------------------------------


def _installed_fortunes_dir() -> Path:
    """The installed fortunes folder; skips when it is missing, unless running in CI.

    In CI (``CI=true``) the tests run regardless, so missing packages fail them loudly.
    """
    if not FORTUNES_DIR.exists() and os.environ.get("CI") != "true":
        pytest.skip(
            f"{FORTUNES_DIR} does not exist: install the Debian packages fortunes and "
            "fortunes-min (`apt-get install fortunes fortunes-min`); set CI=true to fail instead"
        )
    return FORTUNES_DIR


@pytest.fixture(scope="module")
def fortunes_dir() -> Path:
    return _installed_fortunes_dir()


@pytest.fixture(scope="module")
def fortunes(fortunes_dir: Path) -> Dataset:
    return load_dataset(FORTUNES)


def _quotes_per_category_by_lines(root: Path) -> dict[str, int]:
    """An independent count: read line by line, a quote ends at a line that is just "%"."""
    counts = {}
    for name in os.listdir(root):
        full = os.path.join(root, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(full) or not os.path.isfile(full):
            continue
        quotes, has_text = 0, False
        with open(full, "rb") as handle:
            for raw in handle:
                line = raw.decode("utf-8", errors="replace")
                if line.rstrip() == "%":
                    quotes += has_text
                    has_text = False
                elif line.strip():
                    has_text = True
        counts[name] = quotes + has_text
    return counts


def test_fortunes_categories_and_counts(fortunes_dir, fortunes):
    _assert_text_dataset(fortunes)
    expected = {
        name: n
        for name, n in _quotes_per_category_by_lines(fortunes_dir).items()
        if n >= FORTUNES_MIN_QUOTES
    }
    labels = Counter(fortunes.y_train.tolist()) + Counter(fortunes.y_test.tolist())
    assert len(fortunes.classes) == 32
    assert dict(labels) == expected
    assert len(fortunes.y_train) + len(fortunes.y_test) == sum(expected.values())
    assert all(document for document in fortunes.X_train)
    assert all(document == document.strip() for document in fortunes.X_test)
    assert not any(label.endswith((".dat", ".u8")) for label in labels)
    assert "computers" in labels


def test_fortunes_chance_level(fortunes):
    labels = np.concatenate([fortunes.y_train, fortunes.y_test])
    _, counts = np.unique(labels, return_counts=True)
    assert 0.07 < counts.max() / counts.sum() < 0.10


def test_fortunes_split_is_stratified_and_deterministic(fortunes_dir, fortunes):
    _assert_stratified(fortunes, 0.25)
    assert fortunes.source == {
        "path": FORTUNES,
        "min_quotes": 100,
        "test_fraction": 0.25,
        "seed": 0,
    }
    _assert_same(fortunes, load_fortunes_dataset())
    _assert_same(fortunes, load_dataset(fortunes.source))
    other = load_dataset(FORTUNES, seed=1)
    assert other.source["seed"] == 1
    assert not np.array_equal(fortunes.y_test, other.y_test)
