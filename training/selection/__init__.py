"""Model selection: :class:`~training.selection.forward_selection.ForwardSelectionCV`, the
wrapper (like scikit-learn's ``GridSearchCV``) that chooses a BE-SVM's configuration by
cross-validation. Its rooms: the space of candidates (:mod:`~training.selection.space`), the
folds and their racing (:mod:`~training.selection.folds`), the budget
(:mod:`~training.selection.budget`), the state of a selection (:mod:`~training.selection.state`),
where the fold fits run (:mod:`~training.selection.sites`) and the stages
(:mod:`~training.selection.stages`)."""
