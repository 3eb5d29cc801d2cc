"""The trainer on text: fit a JSON-lines corpus, evaluate it beside the text baselines, a small
text report, and what fortunes gives (when the Debian packages are installed)."""

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from service.model import Predictor
from training import BasisExpandingSVC
from training.cli.main import main
from training.data.datasets import FORTUNES_DIR, load_dataset
from training.estimator.preparation import fit_vocabulary
from training.evaluation.report import parse_configuration, render_markdown, run_report
from training.evaluation.report_data import ReportGrid
from training.fitting import fit_dataset


@pytest.fixture
def jsonl_corpus(tmp_path, text_dataset) -> Path:
    path = tmp_path / "topics.jsonl"
    rows = [
        {"text": str(text), "label": str(label)}
        for text, label in zip(
            [*text_dataset.X_train, *text_dataset.X_test],
            [*text_dataset.y_train, *text_dataset.y_test],
            strict=True,
        )
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_fit_and_evaluate_a_jsonl_corpus(jsonl_corpus, tmp_path, capsys):
    out = tmp_path / "topics"
    args = ["fit", "--data", str(jsonl_corpus), "--similarity", "sensing2(n_words=40)"]
    assert (
        main([*args, "--basis-per-class", "6", "--min-df", "1", "--out", str(out), "--quiet"]) == 0
    )
    summary = capsys.readouterr().out
    predictor = Predictor.load(out)
    assert (
        f"inputs           counts({predictor.vocabulary.size}) (a vocabulary reads raw text)"
        in summary
    )
    assert "sensing2(n_words=40): NgRat" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training"]["config"]["min_df"] == 1
    assert manifest["training"]["test_accuracy"] > 0.8
    assert main(["evaluate", "--model", str(out), "--repeats", "1"]) == 0
    table = capsys.readouterr().out
    for method in (
        "BE-SVM sensing2(n_words=40)",
        "tf-idf + LinearSVC",
        "multinomial naive Bayes",
        "SVC(RBF, gamma=1) on tf-idf",
        "tf-idf + LinearSVC, every word",
    ):
        assert method in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--similarity", "rigid(1)"], "rigid(h=1) does not apply to bag-of-words documents"),
        (["--similarity", "linear", "--transform", "hog"], "needs images"),
        (["--similarity", "linear", "--min-df", "1000"], "no vocabulary"),
    ],
)
def test_text_fit_errors_exit_2_with_a_message(jsonl_corpus, tmp_path, capsys, args, message):
    out = tmp_path / "m"
    assert main(["fit", "--data", str(jsonl_corpus), "--out", str(out), "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_sensing_measures_are_refused_on_images(tmp_path, capsys):
    assert main(["fit", "--similarity", "sensing1", "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "compares bag-of-words documents" in capsys.readouterr().err


def test_a_small_text_report(text_dataset):
    grid = ReportGrid(
        configurations=(
            parse_configuration("sensing1(n=150)", text_dataset),
            parse_configuration("sensing1(n=150) + linear [C=3]", text_dataset),
        ),
        basis_sizes=(4,),
        strategies=("index",),
        normalizations=("besvm",),
        reference_size=4,
        folds=2,
        repeats=1,
    )
    report = run_report(text_dataset, grid, verbose=False)
    assert [r.configuration.label for r in report.records] == [
        "sensing1(n=150)",
        "sensing1(n=150) + linear [C=3]",
    ]
    assert report.records[1].configuration.C == 3.0
    assert {b.method for b in report.baselines} >= {"tf-idf + LinearSVC", "multinomial naive Bayes"}
    assert all(r.test_accuracy > 0.8 for r in report.records)


def test_the_default_vocabulary_is_scikit_learns_tfidf_vectorizers(text_dataset):
    """Every word of the training texts, stop words too: the vocabulary of the usual baseline
    (tf-idf + LinearSVC with scikit-learn's defaults)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [*text_dataset.X_train, "the of and", "unique"]
    labels = [*text_dataset.y_train, text_dataset.y_train[0], text_dataset.y_train[-1]]
    model = BasisExpandingSVC(similarity="linear", basis_per_class=3).fit(texts, labels)
    expected = TfidfVectorizer().fit(texts).get_feature_names_out().tolist()
    assert list(model.predictor_.vocabulary.terms) == expected
    assert {"the", "of", "and", "unique"} <= set(expected)


def test_a_text_report_reads_the_vocabulary_it_is_given(text_dataset):
    """The report's fits and baselines count the words of its grid's vocabulary, and its page
    says which."""
    for min_df, stop_words in ((1, None), (3, "english")):
        grid = ReportGrid(
            configurations=(parse_configuration("linear", text_dataset),),
            basis_sizes=(3,), strategies=("index",), normalizations=("besvm",),
            reference_size=3, folds=2, repeats=1, min_df=min_df, stop_words=stop_words,
        )  # fmt: skip
        report = run_report(text_dataset, grid, verbose=False)
        words = fit_vocabulary(text_dataset.X_train, min_df, stop_words).size
        n_classes = len(text_dataset.classes)
        svm = next(b for b in report.baselines if b.method == "tf-idf + LinearSVC")
        # Its idf, then a weight a word and an intercept a class.
        assert svm.n_parameters == words + n_classes * (words + 1)
        page = render_markdown(report, defaultdict(lambda: "figure.png"), "report")
        said = {
            1: "every word of the training split.",
            3: "the words of at least 3 texts of the training split but the english stop words.",
        }
        assert f"The vocabulary: {said[min_df]}" in page


@pytest.mark.parametrize(
    ("texts", "stop_words", "message"),
    [
        (["a b", "c d"], None, "no word of two or more letters or digits is in the training texts"),
        (["the of", "and a"], "english", "other than english stop words, is in the training"),
    ],
)
def test_texts_without_a_word_are_refused_saying_why(texts, stop_words, message):
    with pytest.raises(ValueError, match=message):
        BasisExpandingSVC(similarity="linear", stop_words=stop_words).fit(texts, [0, 1])


def _fortunes_or_skip():
    if not FORTUNES_DIR.is_dir() and os.environ.get("CI") != "true":
        pytest.skip(
            "Debian's fortunes packages are not installed (apt-get install fortunes fortunes-min)"
        )


def test_sensing1_learns_fortunes_well_above_chance():
    _fortunes_or_skip()
    dataset = load_dataset("fortunes")
    result = fit_dataset(dataset, "f", similarity="sensing1(n=150)", basis_per_class=10)
    accuracy = (result.predictor.predict(dataset.X_test) == dataset.y_test).mean()
    # 32 classes, the largest 8.5% of the test split; tf-idf + LinearSVC reaches about 44%.
    assert accuracy > 0.25
