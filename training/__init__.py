"""Offline training of Basis Expanding SVMs: data sets, fitting, evaluation, the command line."""
