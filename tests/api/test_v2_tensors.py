"""The protocol's outputs from a batch's answers: how many classes the model must rank for the
outputs asked for, and the scores in the classes' order whatever was ranked."""

import pytest

from service.api.protocol.tensors import classes_to_rank, output_tensors


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("label",), 1),
        (("label", "scores"), 1),
        (("scores",), 1),
        (("label", "top_k_labels"), 3),
        (("top_k_scores", "scores"), 3),
    ],
)
def test_only_the_top_k_outputs_need_more_than_the_best_class_ranked(names, expected):
    assert classes_to_rank(names, 3) == expected


def test_scores_come_in_the_classes_order_from_answers_that_ranked_one_class(digits_predictor):
    images = [[[float(i + j) for j in range(8)] for i in range(8)], [[0.0] * 8] * 8]
    answers = digits_predictor.classify(images, top_k=1)
    full = digits_predictor.classify(images, top_k=100)
    classes = digits_predictor.classes
    label, scores = output_tensors(answers, classes, ("label", "scores"), 1)
    assert label["data"] == [a.label for a in full]
    assert scores["shape"] == [2, len(classes)]
    by_class = [dict(a.ranked) for a in full]
    assert scores["data"] == [row[c] for row in by_class for c in classes]
    top = output_tensors(full, classes, ("top_k_labels", "top_k_scores"), 2)
    assert top[0]["data"] == [c for a in full for c, _ in a.ranked[:2]]
    assert top[1]["shape"] == [2, 2]
