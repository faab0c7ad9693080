"""Errors a caller can act on.

The algorithms raise these for input they cannot work with; the service maps
every one of them to a 4xx problem-details answer (``InvalidInput`` -> 422,
``InputTooLarge`` -> 413, ``Infeasible`` -> 422 with its own problem type, ``DoesNotFit``
-> 422 titled "Does not fit"), so the
``detail`` must say what is wrong and, where it can, how to fix it.
"""

from __future__ import annotations

__all__ = ["InvalidInput", "InputTooLarge", "Infeasible", "DoesNotFit"]


class InvalidInput(ValueError):
    """The input is malformed or inconsistent (a cycle, an unknown tensor, a bad size).

    Parameters
    ----------
    detail : str
        A sentence a person can act on, naming the offending object.
    field : str, optional
        Dotted path of the offending field (``"graph.nodes[3].inputs"``).
    code : str
        Short machine-readable kind (``"cycle"``, ``"unknown-tensor"``, ...), used as
        the last segment of the problem ``type``.
    """

    code_default = "invalid-input"

    def __init__(self, detail: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.code = code or self.code_default


class InputTooLarge(InvalidInput):
    """The input is over a configured size limit (operators, tensors, bytes)."""

    code_default = "too-large"


class Infeasible(InvalidInput):
    """The input is well formed but no placement satisfies its constraints (memory)."""

    code_default = "infeasible"


class DoesNotFit(Infeasible):
    """No placement fits in the devices' memory.

    Its ``detail`` names the device and the bytes over, then only the changes that
    could make a plan fit (:func:`partitioners.placement.fit_hints.fit_remedies`).
    """

    code_default = "does-not-fit"
