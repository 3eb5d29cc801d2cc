"""The estimator, BasisExpandingSVC (:mod:`~training.estimator.estimator`), and what its fit is
made of: the inputs' preparation (:mod:`~training.estimator.preparation`,
:mod:`~training.estimator.preprocessing`, :mod:`~training.estimator.visual_words`), the basis
(:mod:`~training.estimator.basis`), the expansion and its normalisations
(:mod:`~training.estimator.expansion`, :mod:`~training.estimator.normalization`,
:mod:`~training.estimator.block_statistics`, :mod:`~training.estimator.diagnostics`), the SVM's
solver (:mod:`~training.estimator.solver`, :mod:`~training.estimator.hessian_kernels`), and the
same fit where the rows are on a Dask cluster (:mod:`~training.estimator.cluster_fit`,
:mod:`~training.estimator.distributed_solver`).
It never imports the model selection that wraps it (:mod:`training.selection`)."""
