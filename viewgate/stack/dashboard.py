"""Build the live dashboard (dashboard/: Chart.js, urql and graphql-ws from the npm registry,
bundled by esbuild) that the gateway serves at /dashboard. Rebuilt only when its sources
changed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from viewgate.stack.errors import StackError

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "dashboard"
BUNDLE = "dist/dashboard.js"


def _sources(root: Path) -> list[Path]:
    return [root / "package.json", root / "package-lock.json", *(root / "src").rglob("*")]


def _npm(root: Path, *args: str, timeout_s: float) -> None:
    result = subprocess.run(["npm", *args, "--no-audit", "--no-fund"], cwd=root,
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise StackError(f"`npm {' '.join(args)}` in {root} failed:\n"
                         + (result.stderr or result.stdout)[-2000:])


def build_dashboard(root: Path = DASHBOARD_DIR, timeout_s: float = 600) -> Path:
    """The bundle's path, after `npm ci` and `npm run build` if it is missing or older
    than any source."""
    bundle = root / BUNDLE
    if not root.is_dir():
        raise StackError(f"the dashboard's sources are not at {root}")
    newest = max(p.stat().st_mtime for p in _sources(root) if p.is_file())
    installed = (root / "node_modules" / ".package-lock.json").is_file()
    if bundle.is_file() and installed and bundle.stat().st_mtime >= newest:
        return bundle
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise StackError(f"{tool} is missing: install Node.js 18 or newer with npm "
                             "(`apt-get install nodejs npm`) to build the dashboard")
    if not installed or (root / "node_modules" / ".package-lock.json").stat().st_mtime < (
            root / "package-lock.json").stat().st_mtime:
        _npm(root, "ci", timeout_s=timeout_s)
    _npm(root, "run", "build", timeout_s=timeout_s)
    return bundle
