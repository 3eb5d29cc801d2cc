"""The one text form of measures, transforms and normalisations: ``name`` or ``name(args)``.

Arguments are positional (in the parameter order) or ``key=value``; this module only splits
and binds them, each caller converts and checks the values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from service.model.errors import SpecError

_CALL_PATTERN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def parse_call(text: str, what: str) -> tuple[str, str | None]:
    """Split ``name(arguments)`` into the lower-cased name and the raw argument text.

    Raises
    ------
    SpecError
        If the text is not of that form; ``what`` names the thing in the message.
    """
    match = _CALL_PATTERN.match(text)
    if match is None:
        raise SpecError(f"cannot parse {what} {text!r}: expected name or name(arguments)")
    return match.group(1).lower(), match.group(2)


def bind_arguments(
    name: str, arguments: str | None, parameters: Sequence[str], text: str
) -> dict[str, str]:
    """Map the raw arguments of ``name`` onto its parameter names.

    Returns
    -------
    dict of str to str
        The given parameters only, values as written (stripped).

    Raises
    ------
    SpecError
        Too many positional arguments, an unknown parameter, or one given twice.
    """
    values: dict[str, str] = {}
    if arguments is None or not arguments.strip():
        return values
    for position, argument in enumerate(arguments.split(",")):
        key, sep, raw = argument.partition("=")
        if not sep:
            if position >= len(parameters):
                raise SpecError(
                    f"{name} takes {len(parameters)} parameter(s), got more in {text!r}"
                )
            key, raw = parameters[position], key
        key = key.strip().lower()
        if key not in parameters:
            expected = ", ".join(parameters) or "none"
            raise SpecError(f"{name} has no parameter {key!r} (parameters: {expected})")
        if key in values:
            raise SpecError(f"{name}: parameter {key} given twice in {text!r}")
        values[key] = raw.strip()
    return values
