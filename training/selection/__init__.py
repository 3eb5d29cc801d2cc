"""Model selection: the wrapper that chooses a BE-SVM's configuration by cross-validation,
:class:`~training.selection.forward_selection.ForwardSelectionCV` (like scikit-learn's
``GridSearchCV``). Its rooms: the space of candidates (:mod:`~training.selection.space`), the
folds and their racing (:mod:`~training.selection.folds`), the budget
(:mod:`~training.selection.budget`), the state of a selection (:mod:`~training.selection.state`),
where the fold fits run (:mod:`~training.selection.sites`), the stages
(:mod:`~training.selection.stages`), and after them the basis ladder on the whole split
(:mod:`~training.selection.basis_ladder`) from the folds' basis grown to the split
(:mod:`~training.selection.grown_basis`), with its hold-out (:mod:`~training.selection.holdout`)
and memory bound (:mod:`~training.selection.memory`), and the kernel SVM's grid on splits of a
few thousand items (:mod:`~training.selection.kernel_grid`)."""
