"""Verify AWS Signature Version 4 on an SQS request, as AWS does, without I/O.

A client signs a canonical form of its request (method, path, query, chosen headers, a hash of
the body) with a key derived from its secret, the date, the region and the service. The server
rebuilds the same canonical form from what it received, derives the same key from the secret it
holds for the access key id, and compares. Two places carry the signature:

    header   Authorization: AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/sqs/aws4_request,
             SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=<64 hex>
             with the time in X-Amz-Date (or Date), the body hash in X-Amz-Content-SHA256 if sent
    query    X-Amz-Algorithm, X-Amz-Credential, X-Amz-Date, X-Amz-Expires, X-Amz-SignedHeaders,
             X-Amz-Signature in the query string (presigned URLs)

The canonical request is AWS's (and botocore's, which the tests sign with):

    METHOD \n
    path, dot segments and repeated slashes removed, then percent-encoded again (so an encoded
         byte on the wire, %2F, is %252F here: "each segment encoded twice" for non-S3 services) \n
    query pairs, each name and value decoded then encoded (unreserved kept, %XX upper case,
         space as %20), sorted by name then value, X-Amz-Signature left out \n
    name:value \n for each signed header, in SignedHeaders order: values trimmed, inner runs of
         whitespace made one space, repeated headers joined with "," \n
    SignedHeaders \n
    hex SHA-256 of the body, or the X-Amz-Content-SHA256 value (checked against the body), or
         UNSIGNED-PAYLOAD where the caller allows it (TLS: the body cannot be changed in transit)

Failures raise SignatureError with the code and text AWS answers with (docs/sqs.md). Everything a
request controls is bounded before work is done on it, so a hostile request costs a few
microseconds and one secret lookup at most; the signature comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote_to_bytes

from .errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
TERMINATOR = "aws4_request"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# AWS refuses a request signed more than 15 minutes before or after its own clock.
MAX_SKEW_S = 15 * 60
# A presigned URL lives at most a week (X-Amz-Expires).
MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600

# Bounds on what a request controls (the HTTP server bounds the request as a whole too).
MAX_HEADERS = 128
MAX_SIGNED_HEADERS = 32
MAX_SIGNED_HEADER_CHARS = 16 * 1024  # all signed values together
MAX_AUTHORIZATION_CHARS = 4096
MAX_PATH_CHARS = 8192
MAX_QUERY_CHARS = 64 * 1024
MAX_QUERY_PARAMS = 128
MAX_ACCESS_KEY_ID_CHARS = 128

MSG_MISSING = "Request is missing Authentication Token"
MSG_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your AWS "
    "Secret Access Key and signing method. Consult the service documentation for details."
)
MSG_UNKNOWN_KEY = "The security token included in the request is invalid."

Headers = Mapping[str, str] | Iterable[tuple[str, str]]
SecretLookup = Callable[[str], str | None]

_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # an RFC 9110 token, lower case
_ACCESS_KEY_ID = re.compile(r"[A-Za-z0-9_+=.@-]+")
_QUERY_AUTH_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature")


class SignatureError(SqsError):
    """The request is not signed, or not signed right: code and message as AWS answers."""


@dataclass(frozen=True)
class _Auth:
    """What the request says about its signature, from the Authorization header or the query."""

    in_query: bool
    access_key_id: str
    scope_date: str
    region: str
    signed_headers: str  # as the request gave it: part of the canonical request
    signature: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    expires_s: int  # the presigned URL's X-Amz-Expires; 0 for the header form


def verify_request(
    *,
    method: str,
    path: str,
    query: str,
    headers: Headers,
    body: bytes,
    now_s: float,
    secret_for: SecretLookup,
    region: str | None = None,
    allow_unsigned_payload: bool = False,
) -> str:
    """Check the request's SigV4 signature; return the access key id that signed it.

    `path` and `query` are the request target as received, still percent-encoded (split at the
    first "?"); `headers` in any case, repeated names allowed. `region`, if given, is the only
    region a credential may be scoped to. `allow_unsigned_payload` lets a request sign
    UNSIGNED-PAYLOAD instead of its body's hash: pass True only on TLS connections.
    Raises SignatureError.
    """
    header_map = _header_map(headers)
    params = _query_params(query)
    auth = _read_auth(header_map, params)
    _check_scope(auth, region)
    signed_at = _parse_amz_date(auth.amz_date)
    _check_time(auth, signed_at, now_s)
    if "x-amz-security-token" in header_map or any(name == b"X-Amz-Security-Token" for name, _ in params):
        # MaxQ-Raft issues long-term keys only: a session token is one we never gave out.
        raise SignatureError("InvalidClientTokenId", MSG_UNKNOWN_KEY)
    secret = secret_for(auth.access_key_id)
    if secret is None:
        raise SignatureError("InvalidClientTokenId", MSG_UNKNOWN_KEY)

    canonical_prefix = "\n".join(
        [
            method,
            canonical_uri(path),
            canonical_query(params, skip_signature=auth.in_query),
            _canonical_headers(header_map, auth.signed_headers),
            auth.signed_headers,
        ]
    )
    key = signing_key(secret, auth.scope_date, auth.region)
    scope = f"{auth.scope_date}/{auth.region}/{SERVICE}/{TERMINATOR}"
    matched = False
    for payload_hash in _payload_hashes(header_map, body, auth.in_query, allow_unsigned_payload):
        canonical_request = f"{canonical_prefix}\n{payload_hash}"
        expected = _signature(key, string_to_sign(auth.amz_date, scope, canonical_request))
        # every candidate is computed and compared, so the time taken says nothing about which
        matched |= hmac.compare_digest(expected, auth.signature.lower())
    if not matched:
        raise SignatureError("SignatureDoesNotMatch", MSG_MISMATCH)
    return auth.access_key_id


def signing_key(secret: str, date: str, region: str) -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")."""
    key = ("AWS4" + secret).encode("utf-8")
    for part in (date, region, SERVICE, TERMINATOR):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return key


def string_to_sign(amz_date: str, scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def canonical_uri(path: str) -> str:
    """The path with dot segments and empty segments removed, then percent-encoded once more."""
    if len(path) > MAX_PATH_CHARS:
        raise SignatureError("IncompleteSignature", "The request path is too long to be signed.")
    return quote(_remove_dot_segments(path) or "/", safe="/~")


def canonical_query(params: list[tuple[bytes, bytes]], *, skip_signature: bool = False) -> str:
    """Names and values (already decoded) encoded as AWS says, sorted, joined with "&"."""
    pairs = sorted(
        (quote(name, safe="-_.~"), quote(value, safe="-_.~"))
        for name, value in params
        if not (skip_signature and name == b"X-Amz-Signature")
    )
    return "&".join(f"{name}={value}" for name, value in pairs)


def _remove_dot_segments(path: str) -> str:
    # RFC 3986 5.2.4, and AWS also drops empty segments (repeated slashes), as botocore does
    if not path:
        return ""
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if out:
                out.pop()
        elif segment and segment != ".":
            out.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and out else ""
    return first + "/".join(out) + last


def _header_map(headers: Headers) -> dict[str, list[str]]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, list[str]] = {}
    for count, (name, value) in enumerate(items):
        if count >= MAX_HEADERS:
            raise SignatureError("IncompleteSignature", "The request has too many headers to be verified.")
        out.setdefault(name.lower(), []).append(value)
    return out


def _query_params(query: str) -> list[tuple[bytes, bytes]]:
    if len(query) > MAX_QUERY_CHARS:
        raise SignatureError("IncompleteSignature", "The query string is too long to be verified.")
    parts = [part for part in query.split("&") if part]
    if len(parts) > MAX_QUERY_PARAMS:
        raise SignatureError("IncompleteSignature", "The query string has too many parameters to be verified.")
    params = []
    for part in parts:
        # "+" is a space, as in a form: Python's urlencode (which botocore's request preparer
        # uses) sends one for a space it signed as %20; a literal plus arrives as %2B
        name, _, value = part.replace("+", "%20").partition("=")
        params.append((unquote_to_bytes(name), unquote_to_bytes(value)))
    return params


def _first(header_map: dict[str, list[str]], name: str) -> str | None:
    values = header_map.get(name)
    return values[0] if values else None


def _read_auth(header_map: dict[str, list[str]], params: list[tuple[bytes, bytes]]) -> _Auth:
    authorization = _first(header_map, "authorization")
    in_query = any(name.decode("latin-1") in _QUERY_AUTH_PARAMS for name, _ in params)
    if authorization is not None and in_query:
        raise SignatureError(
            "IncompleteSignature",
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter or the "
            "Authorization header should be specified",
        )
    if in_query:
        return _read_query_auth(params)
    if authorization is None:
        raise SignatureError("MissingAuthenticationToken", MSG_MISSING)
    return _read_header_auth(authorization, header_map)


def _read_header_auth(authorization: str, header_map: dict[str, list[str]]) -> _Auth:
    if len(authorization) > MAX_AUTHORIZATION_CHARS:
        raise SignatureError("IncompleteSignature", "The Authorization header is too long.")
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SignatureError("IncompleteSignature", f"Unsupported AWS 'algorithm': '{algorithm[:64]}'.")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, sep, value = item.strip().partition("=")
        if sep and name not in fields:
            fields[name] = value.strip()
    missing = [name for name in ("Credential", "Signature", "SignedHeaders") if name not in fields]
    if missing:
        text = " ".join(f"Authorization header requires '{name}' parameter." for name in missing)
        raise SignatureError("IncompleteSignature", f"{text} Authorization={authorization[:256]}")
    amz_date = _first(header_map, "x-amz-date")
    if amz_date is None:
        http_date = _first(header_map, "date")
        if http_date is None:
            raise SignatureError(
                "IncompleteSignature",
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header. "
                f"Authorization={authorization[:256]}",
            )
        amz_date = _from_http_date(http_date)
    key_id, scope_date, region = _read_credential(fields["Credential"])
    return _Auth(False, key_id, scope_date, region, fields["SignedHeaders"], fields["Signature"], amz_date, 0)


def _read_query_auth(params: list[tuple[bytes, bytes]]) -> _Auth:
    wanted = (
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Expires",
    )
    found: dict[str, str] = {}
    for name_bytes, value in params:
        name = name_bytes.decode("latin-1")
        if name in wanted:
            if name in found:
                raise SignatureError("IncompleteSignature", f"The query string has more than one '{name}'.")
            found[name] = value.decode("utf-8", errors="replace")
    missing = [name for name in wanted[:5] if name not in found]
    if missing:
        raise SignatureError(
            "IncompleteSignature",
            "AWS query-string parameters must include 'X-Amz-Algorithm', 'X-Amz-Credential', 'X-Amz-Date', "
            "'X-Amz-SignedHeaders' and 'X-Amz-Signature'. Re-examine the query-string parameters.",
        )
    if found["X-Amz-Algorithm"] != ALGORITHM:
        raise SignatureError("IncompleteSignature", f"Unsupported AWS 'algorithm': '{found['X-Amz-Algorithm'][:64]}'.")
    expires_s = MAX_SKEW_S
    if "X-Amz-Expires" in found:
        text = found["X-Amz-Expires"]
        if not (text.isascii() and text.isdigit() and len(text) <= 7):
            raise SignatureError("IncompleteSignature", "X-Amz-Expires should be a number of seconds.")
        expires_s = int(text)
        if not 1 <= expires_s <= MAX_PRESIGN_EXPIRES_S:
            raise SignatureError(
                "IncompleteSignature",
                f"X-Amz-Expires must be between 1 and {MAX_PRESIGN_EXPIRES_S} seconds (a week).",
            )
    key_id, scope_date, region = _read_credential(found["X-Amz-Credential"])
    return _Auth(
        True,
        key_id,
        scope_date,
        region,
        found["X-Amz-SignedHeaders"],
        found["X-Amz-Signature"],
        found["X-Amz-Date"],
        expires_s,
    )


def _read_credential(credential: str) -> tuple[str, str, str]:
    parts = credential.split("/")
    if len(parts) != 5:
        raise SignatureError(
            "IncompleteSignature",
            "Credential must have exactly 5 slash-delimited elements, e.g. keyid/date/region/service/term, "
            f"got '{credential[:256]}'",
        )
    key_id, scope_date, region, service, terminator = parts
    if not (0 < len(key_id) <= MAX_ACCESS_KEY_ID_CHARS and _ACCESS_KEY_ID.fullmatch(key_id)):
        raise SignatureError("InvalidClientTokenId", MSG_UNKNOWN_KEY)
    if service != SERVICE:
        raise SignatureError("SignatureDoesNotMatch", f"Credential should be scoped to correct service: '{SERVICE}'.")
    if terminator != TERMINATOR:
        raise SignatureError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped with a valid terminator: '{TERMINATOR}', not '{terminator[:64]}'.",
        )
    return key_id, scope_date, region


def _check_scope(auth: _Auth, region: str | None) -> None:
    if not auth.region or (region is not None and auth.region != region) or len(auth.region) > 64:
        raise SignatureError(
            "SignatureDoesNotMatch", f"Credential should be scoped to a valid region, not '{auth.region[:64]}'."
        )
    if not _AMZ_DATE.fullmatch(auth.amz_date):
        raise SignatureError(
            "IncompleteSignature", f"Date must be in ISO-8601 'basic format'. Got '{auth.amz_date[:64]}'."
        )
    if auth.scope_date != auth.amz_date[:8]:
        raise SignatureError(
            "SignatureDoesNotMatch",
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
            f"'{auth.scope_date[:16]}' != '{auth.amz_date[:8]}', from '{auth.amz_date}'.",
        )
    if not _HEX64.fullmatch(auth.signature):
        raise SignatureError("SignatureDoesNotMatch", MSG_MISMATCH)
    names = auth.signed_headers.split(";")
    if len(names) > MAX_SIGNED_HEADERS:
        raise SignatureError("IncompleteSignature", f"At most {MAX_SIGNED_HEADERS} headers may be signed.")
    if len(set(names)) != len(names) or not all(_HEADER_NAME.fullmatch(name) for name in names):
        raise SignatureError(
            "IncompleteSignature", "SignedHeaders must be distinct lower-case header names separated by ';'."
        )
    if "host" not in names:
        raise SignatureError("IncompleteSignature", "'Host' must be a 'SignedHeader' in the AWS Authorization.")


def _parse_amz_date(amz_date: str) -> float:
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError(
            "IncompleteSignature", f"Date must be in ISO-8601 'basic format'. Got '{amz_date}'."
        ) from None
    return signed_at.timestamp()


def _from_http_date(http_date: str) -> str:
    # botocore signs with the Date header's time when a request has one; the string to sign
    # still carries the time in the basic format
    try:
        parsed = parsedate_to_datetime(http_date[:64])
    except (TypeError, ValueError):
        raise SignatureError("IncompleteSignature", f"Date header is not an HTTP date: '{http_date[:64]}'.") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def _basic(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y%m%dT%H%M%SZ")


def _check_time(auth: _Auth, signed_at_s: float, now_s: float) -> None:
    if signed_at_s > now_s + MAX_SKEW_S:
        raise SignatureError(
            "SignatureDoesNotMatch",
            f"Signature not yet current: {auth.amz_date} is still later than {_basic(now_s + MAX_SKEW_S)} "
            f"({_basic(now_s)} + 15 min.)",
        )
    if auth.in_query:
        if now_s > signed_at_s + auth.expires_s:
            raise SignatureError(
                "SignatureDoesNotMatch",
                f"Signature expired: {auth.amz_date} is now earlier than {_basic(now_s - auth.expires_s)} "
                f"({_basic(now_s)} - {auth.expires_s} sec.)",
            )
    elif signed_at_s < now_s - MAX_SKEW_S:
        raise SignatureError(
            "SignatureDoesNotMatch",
            f"Signature expired: {auth.amz_date} is now earlier than {_basic(now_s - MAX_SKEW_S)} "
            f"({_basic(now_s)} - 15 min.)",
        )


def _canonical_headers(header_map: dict[str, list[str]], signed_headers: str) -> str:
    lines = []
    total_chars = 0
    for name in signed_headers.split(";"):
        values = header_map.get(name, [])
        total_chars += sum(len(value) for value in values)
        if total_chars > MAX_SIGNED_HEADER_CHARS:
            raise SignatureError("IncompleteSignature", "The signed headers are too long to be verified.")
        lines.append(name + ":" + ",".join(" ".join(value.split()) for value in values) + "\n")
    return "".join(lines)


def _payload_hashes(
    header_map: dict[str, list[str]], body: bytes, in_query: bool, allow_unsigned_payload: bool
) -> list[str]:
    """What the request may have signed as its payload hash: one value, two for a presigned URL
    without X-Amz-Content-SHA256 (botocore signs UNSIGNED-PAYLOAD there over TLS)."""
    body_hash = hashlib.sha256(body).hexdigest()
    declared = _first(header_map, "x-amz-content-sha256")
    if declared is None:
        if in_query and allow_unsigned_payload:
            return [body_hash, UNSIGNED_PAYLOAD]
        return [body_hash]
    if declared == UNSIGNED_PAYLOAD:
        if not allow_unsigned_payload:
            raise SignatureError(
                "IncompleteSignature", "UNSIGNED-PAYLOAD is accepted over TLS only: sign the body's SHA-256."
            )
        return [declared]
    if not (_HEX64.fullmatch(declared) and hmac.compare_digest(declared.lower(), body_hash)):
        raise SignatureError(
            "SignatureDoesNotMatch", "The provided 'x-amz-content-sha256' header does not match what was computed."
        )
    return [declared]


def _signature(key: bytes, to_sign: str) -> str:
    return hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
