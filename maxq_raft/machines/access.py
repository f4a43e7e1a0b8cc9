"""Users, their passwords, tags and limits, and permissions per vhost: RabbitMQ's access model.

Theory of operation: the records live in the metadata machine (so every member holds the same),
and everything here is pure. A password is kept only as RabbitMQ's salted hash
(`rabbit_password_hashing_sha256`: base64 of a 4-byte salt followed by SHA-256(salt ++ password)),
so definitions exported from RabbitMQ import as they are; the salt is drawn by whoever proposes
the change and carried in the command, so the machine stays deterministic.

A permission is three patterns (configure, write, read) matched, as RabbitMQ's re:run, anywhere in
a resource's name; the empty pattern matches only the empty name (RabbitMQ reads "" as "^$").
Patterns are RE2 (policy_pattern.py): linear-time matching, the same on every member. The
default exchange is checked under the name "amq.default", as rabbit_access_control does.

An access key (the SQS endpoint's credential, docs/sqs.md) is a key id and a secret that belong
to a user: requests signed with it act as that user. AWS Signature V4 is an HMAC keyed by the
secret, so the server must hold the secret itself, not a hash of it: it is kept as given, in
the log and snapshots like the password hashes, and shown only once, to whoever created it. The
id and secret are drawn by the proposer (`new_access_key`), never in the machine.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass, field

from .policy_pattern import PatternError, PolicyPattern, compile_pattern

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"  # RabbitMQ before 3.6; still accepted in definitions
_DIGESTS = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}
HASHING_ALGORITHMS = tuple(_DIGESTS)
SALT_BYTES = 4  # rabbit_password:generate_salt
TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")
USER_LIMITS = ("max-connections", "max-channels")
VHOST_LIMITS = ("max-connections", "max-queues")
NAME_CHARS_MAX = 255  # users and vhosts: a short string, as AMQP's shortstr carries them
DEFAULT_EXCHANGE_NAME = "amq.default"
ACCESS_KEY_PREFIX = "MQ"  # as AWS's long-term key ids start with "AKIA"
ACCESS_KEY_ID_CHARS = 20
SECRET_KEY_CHARS = 40
ACCESS_KEYS_PER_USER_MAX = 2  # as IAM allows two per user: one in use, one being rotated in
_KEY_ID = re.compile(r"[A-Z0-9]{16,128}")
_SECRET = re.compile(r"[A-Za-z0-9/+]{40}")
_KEY_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_SECRET_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+"


class AccessError(ValueError):
    """Why a user, vhost, permission or limit is refused, in words for the client."""


def hash_password(password: str, salt: bytes | None = None, algorithm: str = SHA256) -> str:
    """RabbitMQ's password hash: base64(salt ++ digest(salt ++ utf8(password)))."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = _DIGESTS[algorithm](salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_hash(password_hash: str, algorithm: str) -> None:
    """AccessError unless `password_hash` is "" (no password login) or a hash of `algorithm`."""
    if algorithm not in _DIGESTS:
        raise AccessError(f"unknown hashing algorithm '{algorithm}' (known: {', '.join(HASHING_ALGORITHMS)})")
    if password_hash == "":
        return
    try:
        raw = base64.b64decode(password_hash.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise AccessError("password_hash is not base64") from None
    if len(raw) != SALT_BYTES + _DIGESTS[algorithm]().digest_size:
        raise AccessError(f"password_hash has {len(raw)} bytes, not a {SALT_BYTES}-byte salt and a digest")


@dataclass
class UserRecord:
    name: str
    password_hash: str  # "" : no password login (EXTERNAL only)
    hashing_algorithm: str = SHA256
    tags: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)

    def password_matches(self, password: str) -> bool:
        if not self.password_hash:
            return False
        raw = base64.b64decode(self.password_hash)
        salt, expected = raw[:SALT_BYTES], raw[SALT_BYTES:]
        digest = _DIGESTS[self.hashing_algorithm](salt + password.encode("utf-8")).digest()
        return hmac.compare_digest(digest, expected)  # constant time: a refusal's timing tells nothing


@dataclass(frozen=True)
class AccessKeyRecord:
    key_id: str
    user: str
    secret: str


def new_access_key() -> tuple[str, str]:
    """A fresh (key id, secret): "MQ" + 18 of A-Z 0-9, and 40 of base64's alphabet, as AWS's."""
    key_id = ACCESS_KEY_PREFIX + "".join(
        secrets.choice(_KEY_ID_ALPHABET) for _ in range(ACCESS_KEY_ID_CHARS - len(ACCESS_KEY_PREFIX))
    )
    secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_KEY_CHARS))
    return key_id, secret


def check_access_key(key_id: object, secret: object) -> None:
    if type(key_id) is not str or not _KEY_ID.fullmatch(key_id):
        raise AccessError("an access key id is 16 to 128 characters of A-Z and 0-9")
    if type(secret) is not str or not _SECRET.fullmatch(secret):
        raise AccessError("a secret access key is 40 characters of A-Z a-z 0-9 / +")


def _pattern(text: str) -> PolicyPattern:
    return compile_pattern("^$" if text == "" else text)


@dataclass
class Permission:
    configure: str
    write: str
    read: str
    _compiled: tuple[PolicyPattern, PolicyPattern, PolicyPattern] | None = field(
        default=None, compare=False, repr=False
    )

    def allows(self, kind: str, name: str) -> bool:
        """kind: "configure", "write" or "read"."""
        if self._compiled is None:
            self._compiled = (_pattern(self.configure), _pattern(self.write), _pattern(self.read))
        index = 0 if kind == "configure" else 1 if kind == "write" else 2
        return self._compiled[index].matches(DEFAULT_EXCHANGE_NAME if name == "" else name)


@dataclass
class TopicPermission:
    write: str
    read: str

    def allows(self, kind: str, routing_key: str, variables: dict[str, str]) -> bool:
        """RabbitMQ's topic authorisation: the pattern, with {username} and {vhost} expanded,
        against the routing key."""
        text = self.write if kind == "write" else self.read
        for key, value in variables.items():
            text = text.replace("{" + key + "}", value)
        try:
            return _pattern(text).matches(routing_key)
        except PatternError:
            return False  # an expanded pattern that is no longer valid grants nothing


def check_name(name: object, what: str) -> str:
    if type(name) is not str or not name:
        raise AccessError(f"a {what} name must be a non-empty string")
    if len(name) > NAME_CHARS_MAX:
        raise AccessError(f"a {what} name is at most {NAME_CHARS_MAX} characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise AccessError(f"the {what} name is not valid Unicode") from None
    return name


def check_tags(tags: object) -> list[str]:
    if not isinstance(tags, list) or not all(type(t) is str for t in tags):
        raise AccessError("tags must be a list of strings")
    for tag in tags:
        check_name(tag, "tag")
    return list(dict.fromkeys(tags))  # RabbitMQ keeps unknown tags too; duplicates go


def check_patterns(*patterns: object) -> None:
    for text in patterns:
        if type(text) is not str:
            raise AccessError("a permission is three regular expressions (strings)")
        try:
            _pattern(text)
        except PatternError as exc:
            raise AccessError(str(exc)) from None


def check_limits(limits: object, known: tuple[str, ...], what: str) -> dict[str, int]:
    """Limits as RabbitMQ sets them: a non-negative integer each, or a negative one for none."""
    if not isinstance(limits, dict):
        raise AccessError(f"{what} limits must be a JSON object")
    out: dict[str, int] = {}
    for key, value in limits.items():
        if key not in known:
            raise AccessError(f"unknown {what} limit '{key}' (known: {', '.join(known)})")
        if type(value) is not int or not -(1 << 31) <= value < (1 << 31):
            raise AccessError(f"the {what} limit '{key}' must be an integer")
        if value >= 0:
            out[key] = value
    return out
