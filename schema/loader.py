"""Load the catalog named by a `module:attribute` spec and validate it."""

from __future__ import annotations

import importlib

from schema.catalog import Catalog
from schema.errors import CatalogError, Problem

DEFAULT_CATALOG = "schema.demo:CATALOG"


def load_catalog(spec: str | None = None) -> Catalog:
    """Import `module:attribute` (default schema.demo:CATALOG), check it is a valid Catalog."""
    spec = spec or DEFAULT_CATALOG
    module_name, sep, attribute = spec.partition(":")

    def fail(message: str, fix: str) -> CatalogError:
        return CatalogError([Problem(spec, None, message, fix, subject="catalog")])

    if not sep or not module_name or not attribute:
        raise fail("is not of the form module:attribute", f"use e.g. {DEFAULT_CATALOG}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise fail(f"cannot import module {module_name} ({exc})",
                   "check the module path and that its package is installed") from exc
    catalog = getattr(module, attribute, None)
    if not isinstance(catalog, Catalog):
        raise fail(f"{module_name}.{attribute} is {type(catalog).__name__}, not a Catalog",
                   f"point at a Catalog object, e.g. {DEFAULT_CATALOG}")
    catalog.validate()
    return catalog
