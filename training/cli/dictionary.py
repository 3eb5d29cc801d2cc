"""``python -m training dictionary``: learn a model's US-SVM dictionary and class codes (its
/search model)."""

from __future__ import annotations

import argparse
import shlex

from service.model import Predictor
from service.model.search import UnionOfSubspacesModel, search_dir
from training.cli.common import (
    add_feature_space_argument,
    add_model_arguments,
    add_output_flags,
    already_there,
    model_dataset,
    status,
)
from training.retrieval.dictionary import UnionOfSubspacesSVM
from training.retrieval.search_model import (
    DEFAULT_SPARSITY,
    DEFAULT_VARIANT,
    VARIANTS,
    estimator_for,
    fit_search_model,
)

# Command-line flag -> UnionOfSubspacesSVM parameter, with the help text's description.
_DICTIONARY_FLAGS = {
    "atoms": ("n_atoms", int, "A, the dictionary's atoms"),
    "alpha": ("alpha", float, "weight of ||Dz||^2/2; 0 is the fast case"),
    "beta": ("beta", float, "weight of the codes' l1 / elastic-net penalty"),
    "l1-ratio": ("l1_ratio", float, "r: 1 is l1, below 1 the elastic net (default: the variant's)"),
    "lambda-z": ("lambda_z", float, "codes' learning rate numerator: lambda / (t + t0)"),
    "lambda-d": ("lambda_d", float, "dictionary's learning rate numerator; 0 keeps D fixed"),
    "t0-z": ("t0_z", float, "codes' learning rate offset"),
    "t0-d": ("t0_d", float, "dictionary's learning rate offset"),
    "bias-multiplier": ("bias_multiplier", float, "the bias's learning rate multiplier"),
    "epochs": ("n_epochs", int, "passes over the training set"),
    "block-size": ("block_size", int, "samples per block of code, then dictionary, steps"),
}


HELP = "learn a US-SVM dictionary and sparse class codes for a model's search"
DESCRIPTION = (
    "Learn the Union-of-Subspaces SVM of a trained model (Algorithm 1 of the "
    "US-SVM paper: SGD on a dictionary D and sparse codes z_k, w_k = D z_k) on the model's "
    "features of its training split, prune every code to --sparsity non-zeros, and write it "
    "to <model>/search. A catalogue built with an older dictionary is removed: run "
    "'python -m training index' afterwards."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    learn = parser.add_argument_group("US-SVM")
    learn.add_argument(
        "--variant",
        choices=tuple(VARIANTS),
        default=DEFAULT_VARIANT,
        help="us-svm (l1 codes), us-svm-e (elastic net, r = 0.5), us-svm-n (non-negative "
        "codes), us-svm-ne (both) (default: %(default)s)",
    )
    add_feature_space_argument(learn)
    learn.add_argument(
        "--sparsity",
        type=int,
        default=DEFAULT_SPARSITY,
        help="non-zeros kept in every class code (default: %(default)s)",
    )
    defaults = UnionOfSubspacesSVM().get_params()
    for flag, (param, kind, text) in _DICTIONARY_FLAGS.items():
        shown = "the variant's" if param == "l1_ratio" else f"{defaults[param]:g}"
        learn.add_argument(
            f"--{flag}", dest=param, type=kind, default=None, help=f"{text} (default: {shown})"
        )
    add_output_flags(parser, "search model")


def run(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    out = search_dir(args.model)
    if already_there(
        args, out, lambda: UnionOfSubspacesModel.load(out, args.model), "a search model"
    ):
        return 0
    dataset = model_dataset(args, predictor)
    estimator = estimator_for(
        args.variant,
        random_state=args.seed,
        **{param: getattr(args, param) for param, _, _ in _DICTIONARY_FLAGS.values()},
    )
    status(
        args,
        f"learning a {estimator.n_atoms}-atom dictionary ({args.variant}) on "
        f"{len(dataset.y_train):,} training items ...",
    )
    model = fit_search_model(
        predictor, dataset, estimator, feature_space=args.feature_space, sparsity=args.sparsity
    )
    model.save(out, args.model, overwrite=args.force)
    t = model.metadata["training"]
    print(
        "\n".join(
            [
                f"search model     {out}",
                f"variant          {args.variant}",
                f"feature space    {model.feature_space} ({model.n_features} features)",
                f"dictionary       {model.n_atoms} atoms",
                f"codes            {args.sparsity} non-zeros kept per class "
                f"(mean {model.metadata['mean_nonzeros']:.1f})",
                f"test accuracy    {t['test_accuracy']:.2%} "
                f"(unpruned {t['test_accuracy_unpruned']:.2%})",
                f"test mAP         {t['test_map']:.4f} (unpruned {t['test_map_unpruned']:.4f})",
                f"train time       {t['fit_seconds']:.2f} s",
                "next             python -m training index --model " + shlex.quote(str(args.model)),
            ]
        )
    )
    return 0
