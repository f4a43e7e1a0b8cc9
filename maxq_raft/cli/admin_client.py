"""maxqctl's client of a node's admin API: one request, its answer as JSON, and what went wrong
as a CtlError with maxqctl's exit code (maxqctl.py lists them)."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request


class CtlError(Exception):
    def __init__(self, message: str, code: int, body: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body = body


# The node is named explicitly: never route admin requests through an http_proxy from the
# environment (a proxy would answer for the node, or not at all).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
AUTH_HEADERS: dict[str, str] = {}  # set by main() from the credentials


_SCHEME = "http"  # https with --cacert or an https:// --node (the node's --https-port)


def use_tls(cacert: str | None) -> None:
    """Talk HTTPS to the node, trusting `cacert` (PEM) or else the system's CAs."""
    global _OPENER, _SCHEME
    try:
        context = ssl.create_default_context(cafile=cacert)
    except (OSError, ssl.SSLError) as exc:
        raise CtlError(f"cannot use --cacert {cacert}: {getattr(exc, 'strerror', None) or exc}", 2) from None
    _OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    _SCHEME = "https"


def split_scheme(node: str) -> tuple[str | None, str]:
    scheme, sep, rest = node.partition("://")
    return (scheme.lower(), rest) if sep else (None, node)


def fetch(
    node: str,
    path: str,
    timeout_s: float,
    method: str = "GET",
    body: dict | None = None,
    missing_ok: bool = False,
    headers: dict[str, str] | None = None,
):
    url = f"{_SCHEME}://{split_scheme(node)[1]}{path}"
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, method=method, headers={**sent, **(headers or {}), **AUTH_HEADERS})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            raw = response.read()
            return json.loads(raw) if raw else None  # 201/204 may carry no body
    except urllib.error.HTTPError as exc:
        if missing_ok and exc.code == 404:
            return None
        try:
            answer = json.loads(exc.read())
            detail = answer.get("error", "") if isinstance(answer, dict) else ""
            if isinstance(answer, dict) and answer.get("reason"):
                detail = f"{detail} ({answer['reason']})"
        except ValueError:
            answer, detail = None, ""
        code = 5 if exc.code >= 500 else 4
        raise CtlError(
            f"node {node} answered {exc.code}: {detail or exc.reason}",
            code,
            answer if isinstance(answer, dict) else None,
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise CtlError(
                f"node {node} did not answer within {timeout_s:g} s (a change may still complete: "
                "check `maxqctl status`)",
                3,
            ) from None
        raise CtlError(f"cannot reach node {node}: {reason}", 3) from None
    except (http.client.HTTPException, ValueError) as exc:
        # Something answered, but not our admin API (e.g. the AMQP port).
        raise CtlError(f"node {node} did not answer as a MaxQ-Raft admin API: {type(exc).__name__}: {exc}", 3) from None
