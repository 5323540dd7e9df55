"""Errors a user can act on: which view, which field, what went wrong, what to do."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a declaration.

    `subject` says what `view` names: usually a view, but a source or the catalog
    itself can be at fault too ("source orders: ...").
    """

    view: str
    field: str | None
    message: str
    fix: str
    subject: str = "view"

    def __str__(self) -> str:
        where = f"{self.subject} {self.view}"
        if self.field is not None:
            where += f", field {self.field}"
        return f"{where}: {self.message}. Fix: {self.fix}"


class CatalogError(ValueError):
    """Raised with every problem found, so a user fixes them all in one go."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
