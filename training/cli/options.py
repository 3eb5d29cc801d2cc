"""Command-line options derived from an estimator's parameters, so that the estimator's
signature, constraints and docstring are the one place a parameter is declared.

Each keyword-only parameter of ``__init__`` becomes ``--name-with-dashes`` (``-C`` for a
one-letter name; ``dest`` the parameter's name): its type or choices come from the estimator's
``_parameter_constraints``, its help from the numpydoc ``Parameters`` section, its default from
the signature. An option left out is not set, so the estimator's own default applies and a
caller can tell what was given.
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

# scikit-learn has no public form of its parameter constraints; reading the estimator's own
# declaration is what keeps the options from listing the parameters a second time.
from sklearn.utils._param_validation import Interval, StrOptions

NONE_CHOICE = "none"


def option_name(parameter: str) -> str:
    """The option of a parameter: ``--name-with-dashes``, or ``-C`` for a one-letter one."""
    return f"-{parameter}" if len(parameter) == 1 else "--" + parameter.replace("_", "-")


def parameter_docs(cls: type) -> dict[str, str]:
    """Each parameter's description in ``cls``'s numpydoc ``Parameters`` section, as one line."""
    doc = inspect.getdoc(cls) or ""
    match = re.search(r"^Parameters\n-+\n(.*?)(?:^\S[^\n]*\n-+\n|\Z)", doc, re.M | re.S)
    if match is None:
        return {}
    docs: dict[str, list[str]] = {}
    name = None
    for line in match.group(1).splitlines():
        header = re.match(r"^(\w+) :", line)
        if header:
            name = header.group(1)
            docs[name] = []
        elif name is not None and line.strip():
            docs[name].append(line.strip())
    return {key: plain_text(" ".join(lines)) for key, lines in docs.items()}


def plain_text(text: str) -> str:
    """``text`` without reStructuredText markup: ``` ``code`` ``` as code, a role such as
    ``:class:`~a.b.C``` as its target's last name."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]*)``", r"\1", text)


def _kind(constraints: list[Any]) -> tuple[type | None, list[str] | None, bool]:
    """The argparse type, the choices, and whether None is allowed, from a constraint list."""
    allows_none = None in constraints
    for constraint in constraints:
        if isinstance(constraint, StrOptions):
            return str, sorted(constraint.options), allows_none
        if isinstance(constraint, Interval):
            return (int if constraint.type is Integral else float), None, allows_none
        if constraint is Integral:
            return int, None, allows_none
        if constraint is Real:
            return float, None, allows_none
        if constraint is str:
            return str, None, allows_none
    return None, None, allows_none


@dataclass(frozen=True)
class DerivedOption:
    """The option of one estimator parameter.

    Attributes
    ----------
    parameter : str
    flags : tuple of str
        Its option strings, the derived one first.
    none_choice : bool
        ``none`` is a choice that stands for the parameter's None (a choice-list parameter that
        may be None); other parameters take ``none`` as the value it is (``--normalization
        none``, ``--input-transform none``).
    """

    parameter: str
    flags: tuple[str, ...]
    none_choice: bool = False

    def given(self, args: argparse.Namespace) -> bool:
        return getattr(args, self.parameter) is not None

    def value(self, args: argparse.Namespace) -> Any:
        raw = getattr(args, self.parameter)
        return None if self.none_choice and raw == NONE_CHOICE else raw

    def as_written(self, argv: Sequence[str]) -> str:
        """The option string the command line used (an alias, if that is what was typed)."""
        for flag in self.flags:
            if any(arg == flag or arg.startswith(f"{flag}=") for arg in argv):
                return flag
        return self.flags[0]


def add_estimator_arguments(
    group,
    cls: type,
    *,
    skip: Collection[str] = (),
    aliases: Mapping[str, tuple[str, ...]] | None = None,
    defaults: Mapping[str, Any] | None = None,
    default_help: Mapping[str, str] | None = None,
    extra_help: Mapping[str, str] | None = None,
    help_text: Mapping[str, str] | None = None,
    types: Mapping[str, Callable[[str], Any]] | None = None,
) -> list[DerivedOption]:
    """Add one option per parameter of ``cls`` to ``group`` (a parser or an argument group).

    Parameters
    ----------
    group : argparse parser or argument group
    cls : type
        A scikit-learn estimator class: keyword-only ``__init__`` parameters, a
        ``_parameter_constraints`` dict and a numpydoc docstring.
    skip : collection of str
        Parameters that get no option (set by other options, or not the user's to set).
    aliases : mapping of str to tuple of str, optional
        More option strings for a parameter (kept for scripts written against older names).
    defaults : mapping of str to object, optional
        Defaults of this command that differ from the estimator's (they are applied by
        :func:`estimator_params`, and named in the help).
    default_help : mapping of str to str, optional
        How the help names a default that is no value a user would type (None, -1).
    extra_help : mapping of str to str, optional
        Text appended to a parameter's help.
    help_text : mapping of str to str, optional
        A parameter's help in place of its docstring's (where the Python API's words do not
        fit a command line).
    types : mapping of str to callable, optional
        How a parameter's text is read, in place of the type its constraints give (a
        ``ValueError``'s message is the command line's error).

    Returns
    -------
    list of DerivedOption
        One per parameter that got an option, in the signature's order.
    """
    aliases, defaults = aliases or {}, defaults or {}
    default_help, extra_help = default_help or {}, extra_help or {}
    docs = {**parameter_docs(cls), **(help_text or {})}
    types = types or {}
    constraints = getattr(cls, "_parameter_constraints", {})
    added = []
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY or name in skip:
            continue
        value_type, choices, allows_none = _kind(constraints.get(name, []))
        if name in types:
            value_type = _argument_type(types[name])
        if value_type is None:
            raise TypeError(f"{cls.__name__}.{name}: no option type can be derived")
        none_choice = choices is not None and allows_none
        if none_choice:
            choices = [*choices, NONE_CHOICE]
        default = defaults.get(name, parameter.default)
        shown = default_help.get(name, NONE_CHOICE if default is None else default)
        help_text = docs.get(name, "").rstrip(".")
        if name in extra_help:
            help_text = f"{help_text}; {extra_help[name]}"
        flags = (option_name(name), *aliases.get(name, ()))
        group.add_argument(
            *flags,
            dest=name,
            type=value_type,
            choices=choices,
            default=None,
            help=f"{help_text} (default: {shown})".replace("%", "%%"),
        )
        added.append(DerivedOption(name, flags, none_choice))
    return added


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse type whose ``ValueError`` says what was wrong (argparse would
    replace its message with "invalid value")."""

    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    read.__name__ = parse.__name__
    return read


def estimator_params(
    args: argparse.Namespace,
    options: Sequence[DerivedOption],
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters given on the command line, with this command's ``defaults`` for the ones
    left out; the estimator's defaults apply to the rest."""
    params = dict(defaults or {})
    params.update({o.parameter: o.value(args) for o in options if o.given(args)})
    return params
