"""The live dashboard at /dashboard: a page and its script bundle, built from dashboard/ by
`viewgate setup` (Chart.js, urql and graphql-ws from the npm registry, bundled by esbuild).
The page reads the gateway itself: live lists and the order feed over websockets (the feed's
cursor kept in the browser's storage), freshness from the `views` query."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "dashboard"  # the repository's dashboard/
_NOT_BUILT = ("the dashboard is not built: run `viewgate setup` (it needs Node.js and npm) "
              "or set VIEWGATE_GATEWAY_DASHBOARD_DIR")


def dashboard_routes(directory: Path | None) -> list[Route]:
    root = directory or DEFAULT_DIR
    page, bundle = root / "index.html", root / "dist" / "dashboard.js"

    async def index(_: Request) -> Response:
        if not page.is_file() or not bundle.is_file():
            return PlainTextResponse(_NOT_BUILT, status_code=503)
        return HTMLResponse(page.read_text())

    async def script(_: Request) -> Response:
        if not bundle.is_file():
            return PlainTextResponse(_NOT_BUILT, status_code=503)
        return FileResponse(bundle, media_type="text/javascript")

    return [Route("/dashboard", index), Route("/dashboard/dashboard.js", script)]
