"""Model selection: the wrapper that chooses a BE-SVM's configuration by cross-validation,
:class:`~training.selection.forward_selection.ForwardSelectionCV` (like scikit-learn's
``GridSearchCV``). Its rooms: the space of candidates (:mod:`~training.selection.space`), the
folds and their racing (:mod:`~training.selection.folds`), the budget
(:mod:`~training.selection.budget`), the state of a selection (:mod:`~training.selection.state`),
where the fold fits run (:mod:`~training.selection.sites`) and the stages
(:mod:`~training.selection.stages`)."""
