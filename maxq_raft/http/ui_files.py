"""The web UI's files: `/` is its page, `/ui/<file>` its script and style sheet.

Theory of operation: the UI is a few static files in the package (maxq_raft/http/ui/, package data
in pyproject.toml), plain JavaScript with no build step and nothing fetched from elsewhere; the page
logs in with a node user and calls the /api/... routes with HTTP basic auth, as any client does.
The files hold no data, so they are served without credentials, as RabbitMQ serves its
management UI's; the requests that reach here have passed the API's own checks first (the Host
names this node, the head's size: admin_app.read_request).

Every answer carries a Content-Security-Policy that lets the page load script, style, images and
fetch() only from this node, and run no inline script: text a queue name or a payload brings can
never run even where the page got escaping wrong. `frame-ancestors 'none'` and X-Frame-Options
keep another site from framing the page (clickjacking the purge and close buttons).
"""

from __future__ import annotations

import re
from importlib import resources

from starlette.responses import Response

UI_PREFIX = "/ui/"
INDEX_PATH = "/"
INDEX_FILE = "index.html"
FAVICON_PATH = "/favicon.ico"  # browsers ask for it by themselves; answered empty, not with a 401
FILE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,40}\.(html|js|css)$")  # no folders, no dots but the suffix
CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # the files change with the installed version; a browser asks again rather than keep an old one
    "Cache-Control": "no-cache",
}


def is_ui_path(path: str) -> bool:
    return path in (INDEX_PATH, FAVICON_PATH) or path.startswith(UI_PREFIX)


def _contents(name: str) -> bytes | None:
    # Read at each request, not kept: a few KiB each, asked for once per page load, and an edit
    # in a development checkout shows without restarting the node.
    file = resources.files(__package__).joinpath("ui", name)
    return file.read_bytes() if file.is_file() else None


def answer(method: str, path: str) -> Response:
    """The file `path` names (is_ui_path), with the UI's security headers; 404 for any other,
    405 for a method other than GET."""
    if method != "GET":
        return Response(b"", 405, {**SECURITY_HEADERS, "Allow": "GET"})
    if path == FAVICON_PATH:
        return Response(b"", 204, SECURITY_HEADERS)
    name = INDEX_FILE if path == INDEX_PATH else path[len(UI_PREFIX) :]
    match = FILE_NAME.match(name)
    contents = _contents(name) if match else None
    if match is None or contents is None:
        return Response(b"not found\n", 404, SECURITY_HEADERS, media_type="text/plain")
    return Response(contents, 200, SECURITY_HEADERS, media_type=CONTENT_TYPES[match.group(1)])
