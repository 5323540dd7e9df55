"""graphql-js, the reference GraphQL implementation, installed with npm into the cache
folder: tests check the gateway's introspection with what JavaScript clients and codegen
tools run, not only with graphql-core's port of it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from viewgate.stack.errors import StackError

GRAPHQL_JS_VERSION = "16.9.0"


def graphql_js_dir(cache_dir: Path) -> Path:
    """Where `npm install --prefix` puts it: <cache_dir>/node."""
    return cache_dir / "node"


def ensure_graphql_js(cache_dir: Path, timeout_s: float = 300) -> Path:
    """The node_modules folder holding graphql@GRAPHQL_JS_VERSION, installed once."""
    prefix = graphql_js_dir(cache_dir)
    modules = prefix / "node_modules"
    manifest = modules / "graphql" / "package.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("version") \
            == GRAPHQL_JS_VERSION:
        return modules
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise StackError(f"{tool} is missing: install Node.js 18 or newer with npm "
                             "(e.g. `apt-get install nodejs npm`) to test introspection "
                             "with graphql-js")
    prefix.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
         "--save-exact", f"graphql@{GRAPHQL_JS_VERSION}"],
        capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0 or not manifest.exists():
        raise StackError(f"`npm install graphql@{GRAPHQL_JS_VERSION}` into {prefix} failed "
                         f"(exit {result.returncode}):\n{result.stderr[-2000:]}")
    return modules
