"""The command line, ``python -m training COMMAND``: one module per command, the table of
commands in :mod:`~training.cli.main`."""
