"""Evaluation and reports: a model's held-out accuracy beside baselines
(:mod:`~training.evaluation.held_out`) and the Markdown report of a grid of configurations
(:mod:`~training.evaluation.report`, :mod:`~training.evaluation.report_data`,
:mod:`~training.evaluation.plots`)."""
