"""The /search model's offline build: the US-SVM dictionary and class codes
(:mod:`~training.retrieval.dictionary`, :mod:`~training.retrieval.search_model`), the catalogue
``X' = D^T X`` (:mod:`~training.retrieval.catalogue`), and retrieval's evaluation, mAP against
sparsity (:mod:`~training.retrieval.evaluation`)."""
