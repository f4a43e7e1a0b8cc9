"""The admin-API half of scripts/fuzz: malformed HTTP requests, one per connection, and a reader
that checks the answer.

Theory of operation: `build_request(seed, index, auth)` makes request number `index` of a run from
its own Random, so any one can be rebuilt alone (`scripts/fuzz --admin-replay INDEX`). A request is
raw bytes (nothing between us and the socket normalises them): a valid request to a known endpoint
now and then, and otherwise one of the malformations in KINDS: bad request lines, huge or broken
headers, lying or malformed Content-Length, chunked bodies, a missing or foreign Host, bodies that
are not JSON or are JSON with huge integers, lone surrogates, deep nesting or wrong types for a
policy (PUT /api/policies/{vhost}/{name}), unknown paths and methods, percent-encoding junk,
pipelined requests, and slow partial requests (bounded: SLOW_SHARE of them, at most
SLOW_MAX_S each). Most requests carry `Authorization: Basic` with the run's credentials, some a
malformed one, some none: a 401 is a fine answer.

A policy the fuzzer could get accepted always has a pattern starting `^fz`, so it only ever
applies to the fuzzer's own queues, never to the probe's; scripts/fuzz clears policies as it goes.

`send_request` writes the bytes (in pieces, for the slow ones), shuts its write side unless the
request is meant to be left hanging, and reads until the server closes, within
ANSWER_TIMEOUT_S. The status is the first reply's code ("none": closed without a reply, "reset":
the connection was reset before one, "h2": answered in HTTP/2). A failure: any 5xx, a reply
that is not a well-formed HTTP response with a JSON body of the length it declares (but the
server's own empty refusals: see `check_reply`), or no close in time.
"""

from __future__ import annotations

import base64
import json
import random
import socket
import time
from dataclasses import dataclass

ANSWER_TIMEOUT_S = (
    12.0  # the server gives a head 5 s, then a body 5 s, drains 1 s, and closes 5 s after the last answer
)
SLOW_SHARE = 0.003  # of requests are slowloris-style
SLOW_MAX_S = 6.0
PATHS = [
    "/api/overview",
    "/api/cluster/status",
    "/api/queues",
    "/api/exchanges",
    "/api/bindings",
    "/api/connections",
    "/api/consumers",
    "/api/consumers/%2F",
    "/api/channels",
    "/api/vhosts/%2F/connections",
    "/api/connections/n9%40x.1/channels",
    "/api/channels/n1%40x.1%20(1)",
    "/api/health/checks/alarms",
    "/api/nodes",
    "/api/policies",
    "/api/feature-flags",
]
POLICY_NAMES = [f"fz-p{i}" for i in range(6)]
DEFINITION_KEYS = [
    "message-ttl",
    "expires",
    "max-length",
    "max-length-bytes",
    "overflow",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "delivery-limit",
    "queue-mode",
    "ha-mode",
    "bogus",
]


@dataclass
class AdminRequest:
    index: int
    kind: str
    data: bytes
    slow: bool = False  # sent in pieces with pauses
    leave_open: bool = False  # our write side stays open: the server must time the request out


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# ------------------------------------------------------------------------------ values


def _huge_int(rng: random.Random) -> int:
    return rng.choice([2**63, 2**64, -(2**63) - 1, 10**30, -(10**30), 2**1000, 10**4000])


def _json_value(rng: random.Random, depth: int = 0) -> object:
    pick = rng.randrange(10 if depth < 3 else 7)
    if pick == 0:
        return rng.randint(-5, 100_000)
    if pick == 1:
        return _huge_int(rng)
    if pick == 2:
        return rng.choice([0.5, -1.0, 1e308, 1e-300])
    if pick == 3:
        return rng.choice([True, False, None])
    if pick == 4:
        return rng.choice(["", "x", "fz-x0", "amq.direct", "reject-publish", "drop-head", "lazy", "all"])
    if pick == 5:
        return "\ud800" if rng.random() < 0.5 else "a\udfffb"
    if pick == 6:
        return "é" * rng.randint(1, 300)
    if pick == 7:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(DEFINITION_KEYS): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _definition(rng: random.Random) -> object:
    if rng.random() < 0.15:
        return _json_value(rng)  # not even an object, often
    definition: dict[str, object] = {}
    for _ in range(rng.randint(0, 4)):
        key = rng.choice(DEFINITION_KEYS)
        if rng.random() < 0.5:
            value: object = {
                "message-ttl": rng.choice([0, 1000, -1]),
                "expires": rng.choice([1, 60000, 0]),
                "max-length": rng.choice([0, 10, -5]),
                "max-length-bytes": rng.choice([0, 1 << 20]),
                "overflow": rng.choice(["drop-head", "reject-publish", "reject-publish-dlx", "nope"]),
                "dead-letter-exchange": rng.choice(["fz-x0", "", "amq.fanout"]),
                "dead-letter-routing-key": "k",
                "delivery-limit": rng.choice([1, 5, -1]),
                "queue-mode": "lazy",
                "ha-mode": "all",
                "bogus": 1,
            }[key]
        else:
            value = _json_value(rng)
        definition[key] = value
    return definition


def _pattern(rng: random.Random) -> object:
    pick = rng.randrange(8)
    if pick == 0:
        return _json_value(rng)  # wrong type, mostly
    if pick == 1:
        return "^fz" + rng.choice(["(a+)+$", "(a|aa)*$", "(.*)*x", "((((((a*)*)*)*)*)*)", "\\", "(", "[z-a]", "\\1"])
    if pick == 2:
        return "^fz" + "(" * rng.randint(100, 2000) + ")" * rng.randint(0, 2000)
    if pick == 3:
        return "^fz" + "\ud800"
    if pick == 4:
        return "^fz" + "a" * rng.randint(1000, 5000)
    return rng.choice(["^fz-q", "^fz-q[0-3]$", "^fz-", "^fz-x", "^fz-q\\d+"])


def _policy_body(rng: random.Random) -> object:
    body: dict[str, object] = {}
    if rng.random() < 0.9:
        body["pattern"] = _pattern(rng)
    if rng.random() < 0.9:
        body["definition"] = _definition(rng)
    if rng.random() < 0.5:
        body["priority"] = rng.choice([0, 1, -1, "1", 1.5, True, None, _huge_int(rng)])
    if rng.random() < 0.4:
        body["apply-to"] = rng.choice(["queues", "exchanges", "all", "nope", 1, None, ["queues"], "\ud800"])
    if rng.random() < 0.1:
        body[rng.choice(["extra", "", "\ud800"])] = _json_value(rng)
    return body


def _json_text(rng: random.Random, value: object) -> bytes:
    """JSON as a client might send it, lone surrogates escaped (json.dumps does) or raw."""
    text = json.dumps(value, ensure_ascii=rng.random() < 0.7)
    return text.encode("utf-8", "surrogatepass")


def _deep_json(rng: random.Random) -> bytes:
    depth = rng.choice([100, 1000, 3000, 7000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"pattern": "^fz", "definition": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


def _junk_body(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"",
            b"not json",
            b"{",
            b"[1, 2]",
            b'"string"',
            b"null",
            b"\xff\xfe\x00{",
            b'{"pattern": "^fz", "definition": {"max-length": 1}',  # cut short
            b'{"pattern": "^fz", "pattern": 1, "definition": {"max-length": 1}}',  # duplicate key
            b'{"pattern": NaN, "definition": {"max-length": Infinity}}',
            b'{"pattern": "^fz", "definition": {"max-length": 1' + b"0" * 5000 + b"}}",
            b'{"pattern": "^fz\\ud800", "definition": {"max-length": 1}}',
            b'{"pattern": "^fz", "definition": {"dead-letter-exchange": "\\udc00"}}',
            rng.randbytes(rng.randint(1, 200)),
        ]
    )


def _junk_segment(rng: random.Random) -> str:
    return rng.choice(
        [
            "%ZZ",
            "%",
            "%00",
            "%2F",
            "%FF%FE",
            "%C0%AF",
            "..",
            "%2e%2e",
            "a" * rng.randint(200, 4000),
            "%ED%A0%80",  # an encoded lone surrogate
            "\u00e9",
            "fz-p0%20x",
            "",
        ]
    )


# ------------------------------------------------------------------------------ requests


def _request(
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes = b"",
    version: str = "HTTP/1.1",
    eol: bytes = b"\r\n",
) -> bytes:
    head = f"{method} {target} {version}".encode("utf-8", "surrogatepass") + eol
    for key, value in headers:
        head += f"{key}: {value}".encode("utf-8", "surrogatepass") + eol
    return head + eol + body


def _base_headers(rng: random.Random, auth: str, body: bytes | None, host: str) -> list[tuple[str, str]]:
    headers = [("Host", host)]
    roll = rng.random()
    if roll < 0.85:
        headers.append(("Authorization", auth))
    elif roll < 0.95:
        headers.append(
            (
                "Authorization",
                rng.choice(
                    [
                        "Basic",
                        "Basic !!!",
                        "Basic " + base64.b64encode(b"nocolon").decode(),
                        "Basic " + base64.b64encode(b"guest:wrong").decode(),
                        "Basic " + base64.b64encode(b"\xff\xfe:\x00").decode(),
                        "Basic " + "A" * 3000,
                        "Bearer abc",
                        "basic " + auth.split(" ", 1)[1],
                        "Basic " + auth.split(" ", 1)[1] + "=",
                    ]
                ),
            )
        )
    if body is not None:
        headers.append(("Content-Type", "application/json"))
        headers.append(("Content-Length", str(len(body))))
    rng.shuffle(headers)
    return headers


def _policy_target(rng: random.Random) -> str:
    vhost = "%2F" if rng.random() < 0.85 else rng.choice(["other", "%2Fx", _junk_segment(rng)])
    name = rng.choice(POLICY_NAMES) if rng.random() < 0.8 else _junk_segment(rng)
    return f"/api/policies/{vhost}/{name}"


def build_request(seed: int, index: int, auth: str, host: str) -> AdminRequest:
    """Request number `index` of the run with `seed`."""
    rng = random.Random(seed * 1_000_033 + index)
    kind = rng.choice(KINDS)
    return maybe_slow(rng, kind(rng, index, auth, host))


def k_valid_get(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    target = rng.choice(PATHS) + rng.choice(["", "", "/", "?x=1", "?force=%ZZ&&=&", "#frag"])
    return AdminRequest(index, "valid_get", _request("GET", target, _base_headers(rng, auth, None, host)))


def k_policy(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    body = _json_text(rng, _policy_body(rng))
    method = "PUT" if rng.random() < 0.85 else "DELETE"
    if method == "DELETE":
        body = b""
    headers = _base_headers(rng, auth, body if body else None, host)
    return AdminRequest(index, "policy", _request(method, _policy_target(rng), headers, body))


def k_policy_junk_body(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    body = _deep_json(rng) if rng.random() < 0.3 else _junk_body(rng)
    headers = _base_headers(rng, auth, body, host)
    return AdminRequest(index, "policy_junk_body", _request("PUT", _policy_target(rng), headers, body))


def k_cluster(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    pick = rng.randrange(4)
    if pick == 3:  # maintenance: refused on a single node whatever the body (409), or a 400
        body = _json_text(rng, {"node": rng.choice(["maxq1", 1, None, ""]), "dry_run": _json_value(rng)})
        path = rng.choice(["/api/cluster/drain", "/api/cluster/revive"])
        return AdminRequest(index, "cluster", _request("POST", path, _base_headers(rng, auth, body, host), body))
    if pick == 0:
        body = _json_text(rng, {"node": _json_value(rng), "raft_addr": rng.choice(["x:1", "[::1]:99999", 5, ""])})
        return AdminRequest(
            index, "cluster", _request("POST", "/api/cluster/members", _base_headers(rng, auth, body, host), body)
        )
    if pick == 1:
        target = (
            "/api/cluster/members/" + rng.choice(["maxq1", "n2", _junk_segment(rng)]) + rng.choice(["", "?force=1"])
        )
        return AdminRequest(index, "cluster", _request("DELETE", target, _base_headers(rng, auth, None, host)))
    body = _json_text(rng, {"node": rng.choice(["maxq1", 1, None]), "group": rng.choice(["all", "meta", 2, ""])})
    headers = _base_headers(rng, auth, body, host)
    return AdminRequest(index, "cluster", _request("POST", "/api/cluster/transfer-leadership", headers, body))


def k_request_line(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    headers = b"Host: " + host.encode() + b"\r\nAuthorization: " + auth.encode() + b"\r\n\r\n"
    line = rng.choice(
        [
            b"GET\r\n",
            b"GET /api/overview\r\n",
            b"GET /api/overview HTTP/9.9\r\n",
            b"GET /api/overview HTTP/1.1 extra\r\n",
            b"GET  /api/overview  HTTP/1.1\r\n",
            b"get /api/overview HTTP/1.1\r\n",
            b"GET /api/overview FTP/1.0\r\n",
            b"\r\n",
            b" \r\n",
            b"GET http://localhost/api/overview HTTP/1.1\r\n",
            b"GET * HTTP/1.1\r\n",
            b"GET api/overview HTTP/1.1\r\n",
            b"GET /api/\x00overview HTTP/1.1\r\n",
            b"GET /api/\xff\xfe HTTP/1.1\r\n",
            b"GET /" + b"a" * rng.randint(5000, 20000) + b" HTTP/1.1\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(40) + b"\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n",
            rng.randbytes(rng.randint(1, 100)) + b"\r\n",
        ]
    )
    return AdminRequest(index, "request_line", line + headers)


def k_method(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    method = rng.choice(
        ["PATCH", "OPTIONS", "HEAD", "TRACE", "CONNECT", "BREW", "G\x00T", "É", "X" * 500, "POST", "PUT"]
    )
    target = rng.choice([*PATHS, "/api/policies/%2F/fz-p0", "/api/cluster/members"])
    return AdminRequest(index, "method", _request(method, target, _base_headers(rng, auth, None, host)))


def k_path(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    target = rng.choice(
        [
            "/",
            "/api",
            "/api/",
            "/api/nope",
            "/api/queues/%2F",
            "/api/queues/%2F/q",
            "/api/policies/%2F",
            "/api/policies/%2F/a/b/c",
            "/api/cluster/members/",
            "//api//overview",
            "/api/overview/../queues",
            "/%61pi/overview",
            "/api/" + _junk_segment(rng),
            "/api/policies/" + _junk_segment(rng) + "/" + _junk_segment(rng),
            "/api/overview?" + "&".join(["a=%ZZ"] * rng.randint(1, 500)),
        ]
    )
    method = rng.choice(["GET", "GET", "DELETE", "PUT"])
    return AdminRequest(index, "path", _request(method, target, _base_headers(rng, auth, None, host)))


def k_headers(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    headers = _base_headers(rng, auth, None, host)
    pick = rng.randrange(7)
    if pick == 0:
        headers += [(f"X-Junk-{i}", "v" * 50) for i in range(rng.randint(100, 600))]  # over 16 KiB, often
    elif pick == 1:
        headers.append(("X-Big", "v" * rng.randint(10000, 40000)))
    elif pick == 2:
        headers.append(("Host", rng.choice(["evil.example", host])))  # twice
    elif pick == 3:
        headers.append((" folded", "value"))
    elif pick == 4:
        headers.append(("X-Bytes", "\u00ff\u00fe" * 10))
    elif pick == 5:
        headers.append(("", "empty name"))
    else:
        data = _request("GET", rng.choice(PATHS), headers)[:-2] + b"no colon here\r\n\r\n"
        return AdminRequest(index, "headers", data)
    return AdminRequest(index, "headers", _request("GET", rng.choice(PATHS), headers))


def k_content_length(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    body = _json_text(rng, {"pattern": "^fz-q", "definition": {"max-length": 10}})
    headers = [(k, v) for k, v in _base_headers(rng, auth, body, host) if k != "Content-Length"]
    length = rng.choice(
        [
            "-1",
            "abc",
            "1e3",
            "+5",
            " 5",
            "5, 5",
            "0x10",
            str(10**30),
            str(len(body) + rng.randint(1, 100)),  # more than we send: our FIN ends it
            str(max(0, len(body) - rng.randint(1, 10))),  # less: the rest is junk after the request
            "99999999",
            "٣",  # an Arabic-Indic digit: isdigit() is True for it
        ]
    )
    headers.append(("Content-Length", length))
    if rng.random() < 0.2:
        headers.append(("Content-Length", str(len(body))))  # a second, conflicting one
    return AdminRequest(index, "content_length", _request("PUT", _policy_target(rng), headers, body))


def k_chunked(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    payload = _json_text(rng, {"pattern": "^fz-q", "definition": {"max-length": 10}})
    body = f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n"
    headers = [(k, v) for k, v in _base_headers(rng, auth, body, host) if k != "Content-Length"]
    headers.append(("Transfer-Encoding", rng.choice(["chunked", "gzip, chunked", "Chunked", "identity"])))
    if rng.random() < 0.3:
        headers.append(("Content-Length", str(len(body))))  # both: request smuggling's classic
    return AdminRequest(index, "chunked", _request("PUT", _policy_target(rng), headers, body))


def k_host(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    bad = rng.choice(
        [
            None,
            "",
            "evil.example",
            "evil.example:15672",
            "localhost.evil.example",
            "127.0.0.1:notaport",
            "[::1]",
            "[::1]:15672",
            "[::1",
            "[evil]:1",
            "LOCALHOST.",
            "127.0.0.1:",
            "0x7f.1",
            "a" * 1000,
            "\u00e9.example",
        ]
    )
    headers = [(k, v) for k, v in _base_headers(rng, auth, None, host) if k != "Host"]
    if bad is not None:
        headers.append(("Host", bad))
    return AdminRequest(index, "host", _request(rng.choice(["GET", "DELETE"]), rng.choice(PATHS), headers))


def k_content_type(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    body = _json_text(rng, _policy_body(rng))
    headers = [(k, v) for k, v in _base_headers(rng, auth, body, host) if k != "Content-Type"]
    kind = rng.choice([None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=utf-16"])
    if kind is not None:
        headers.append(("Content-Type", kind))
    return AdminRequest(index, "content_type", _request("PUT", _policy_target(rng), headers, body))


def k_line_endings(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    eol = rng.choice([b"\n", b"\r", b"\r\r\n", b"\n\r"])
    version = rng.choice(["HTTP/1.1", "HTTP/1.0"])
    return AdminRequest(
        index,
        "line_endings",
        _request("GET", rng.choice(PATHS), _base_headers(rng, auth, None, host), b"", version, eol),
    )


def k_pipelined(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    one = _request("GET", rng.choice(PATHS), _base_headers(rng, auth, None, host))
    return AdminRequest(index, "pipelined", one * rng.randint(2, 50))


def k_oversize_body(rng: random.Random, index: int, auth: str, host: str) -> AdminRequest:
    body = b'{"pattern": "^fz", "definition": {"x": "' + b"a" * rng.randint(16000, 300000) + b'"}}'
    headers = _base_headers(rng, auth, body, host)
    return AdminRequest(index, "oversize_body", _request("PUT", _policy_target(rng), headers, body))


KINDS = [
    k_valid_get,
    k_policy,
    k_policy,
    k_policy,
    k_policy_junk_body,
    k_cluster,
    k_request_line,
    k_method,
    k_path,
    k_headers,
    k_content_length,
    k_chunked,
    k_host,
    k_content_type,
    k_line_endings,
    k_pipelined,
    k_oversize_body,
]


def maybe_slow(rng: random.Random, request: AdminRequest) -> AdminRequest:
    """Now and then, make a request slowloris-style: sent in pieces with pauses, perhaps never
    finished."""
    if rng.random() < SLOW_SHARE:
        request.slow = True
        request.leave_open = rng.random() < 0.5
        request.kind = "slow_" + request.kind
    return request


# ------------------------------------------------------------------------------ sending


@dataclass
class AdminOutcome:
    status: str  # "200", "404", ..., "none" (closed without a reply), "reset"
    failure: str | None = None
    reply_head: str = ""


def send_request(host: str, port: int, request: AdminRequest, rng: random.Random) -> AdminOutcome:
    """Send one request on a new connection; read until the server closes (bounded)."""
    try:
        sock = socket.create_connection((host, port), timeout=5.0)
    except OSError as exc:
        return AdminOutcome("refused", f"cannot connect: {exc}")
    reply = b""
    reset = False
    closed = False
    try:
        try:
            if request.slow:
                started = time.monotonic()
                data = request.data if not request.leave_open else request.data[: max(1, len(request.data) // 2)]
                step = max(1, len(data) // rng.randint(2, 10))
                for start in range(0, len(data), step):
                    if time.monotonic() - started > SLOW_MAX_S:
                        break
                    sock.sendall(data[start : start + step])
                    time.sleep(rng.uniform(0.05, 1.0))
            else:
                sock.sendall(request.data)
            if not request.leave_open:
                sock.shutdown(socket.SHUT_WR)
        except TimeoutError:
            pass  # the server stopped reading a large request
        except OSError:
            pass  # the server answered early and hung up (a reset, ENOTCONN); its answer may be readable
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                reset = True
                closed = True
                break
            if not chunk:
                closed = True
                break
            reply += chunk
    finally:
        sock.close()
    if not closed:
        return AdminOutcome(
            "hang", f"the server did not close within {ANSWER_TIMEOUT_S:.0f} s", reply[:200].decode("latin-1")
        )
    if not reply:
        return AdminOutcome("reset" if reset else "none")
    return check_reply(reply, request.data)


def check_reply(reply: bytes, request: bytes = b"") -> AdminOutcome:
    """The status of the first reply on the connection, and a failure if any reply is 5xx or not
    well-formed. A connection may carry several replies (the server keeps connections alive):
    one per pipelined request, and one for the junk after a short Content-Length, read as the
    next request. Each is HTTP/1.1 with a JSON body of the length it declares, except:
    - 201 Created and 204 No Content, empty as RabbitMQ's (a 204 without a Content-Length);
    - the server's own refusal of what it cannot parse (h11, in hypercorn): a 4xx with an empty
      body and Connection: close, last on the connection;
    - HTTP/2 framing (a SETTINGS frame first) for a request that opens with HTTP/2's preface."""
    if request.startswith(H2_PREFACE_START) and reply[3:4] == H2_SETTINGS_FRAME_TYPE:
        return AdminOutcome("h2")
    first: AdminOutcome | None = None
    rest = reply
    for _ in range(REPLIES_MAX):
        outcome, rest = _check_one_reply(rest, request)
        if first is None:
            first = outcome
        if outcome.failure is not None:
            return AdminOutcome(first.status, outcome.failure, outcome.reply_head)
        if not rest:
            return first
    assert first is not None
    return AdminOutcome(first.status, f"more than {REPLIES_MAX} replies on one connection", first.reply_head)


H2_PREFACE_START = b"PRI * HTTP/2.0\r\n"
H2_SETTINGS_FRAME_TYPE = b"\x04"
REPLIES_MAX = 64  # a pipelined request is at most 50 requests (k_pipelined)


def _is_ui_request(request: bytes) -> bool:
    """Whether `request` asks for one of the web UI's paths (`/`, `/ui/...`, `/favicon.ico`)."""
    target = request.split(b"\r\n", 1)[0].split(b" ")
    path = target[1].split(b"?", 1)[0] if len(target) >= 2 else b""
    return path in (b"/", b"/favicon.ico") or path.startswith(b"/ui/")


def _check_one_reply(data: bytes, request: bytes) -> tuple[AdminOutcome, bytes]:
    """The first reply in `data` (its outcome) and what follows it."""
    head, sep, after = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or parts[0] != "HTTP/1.1" or not parts[1].isdigit():
        return AdminOutcome("malformed", f"not an HTTP response: {data[:200]!r}", lines[0][:200]), b""
    status = parts[1]
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length_text = headers.get("content-length", "")
    if status == "204" and not length_text:
        length_text = "0"  # a 204 has no body, so it needs no Content-Length (RFC 9110 8.6)
    if not length_text.isdigit():
        return AdminOutcome(status, f"no Content-Length ({length_text!r})", lines[0][:200]), b""
    length = int(length_text)
    if request.startswith(b"HEAD "):
        length = 0  # an answer to HEAD declares the length a GET would get, and sends no body
    body, rest = after[:length], after[length:]
    failure = None
    closes = headers.get("connection", "").lower() == "close"
    if len(body) < length:
        failure = f"Content-Length {length} but {len(body)} bytes of body"
    elif status.startswith("5"):
        failure = f"{lines[0]}: {body[:300]!r}"
    elif rest and closes:
        failure = f"{len(rest)} bytes after a reply that said Connection: close"
    elif not body and (status in ("201", "204") or request.startswith(b"HEAD ") or (status[0] in "45" and closes)):
        pass  # no content (RabbitMQ's 201 Created and 204 No Content); or the server's own refusal (see check_reply)
    elif _is_ui_request(request):
        # The web UI's files (maxq_raft/http/ui_files.py): HTML, JavaScript, CSS, a plain-text
        # 404, an empty 405; never JSON, and always with the UI's Content-Security-Policy.
        if "content-security-policy" not in headers:
            failure = f"a web UI answer without its Content-Security-Policy: {lines[0][:100]}"
    else:
        try:
            json.loads(body)
        except ValueError as exc:
            failure = f"the body is not JSON: {exc}: {body[:200]!r}"
    return AdminOutcome(status, failure, lines[0][:200]), rest
