"""The admin API's users, vhosts, permissions and limits: RabbitMQ management's paths and shapes.

    GET /api/whoami
    GET /api/users                      GET, PUT, DELETE /api/users/{name}
    GET /api/vhosts                     GET, PUT, DELETE /api/vhosts/{name}
    GET /api/permissions                GET, PUT, DELETE /api/permissions/{vhost}/{user}
    GET /api/topic-permissions          GET, PUT, DELETE /api/topic-permissions/{vhost}/{user}
    GET /api/vhost-limits               PUT, DELETE /api/vhost-limits/{vhost}/{name}
    GET /api/user-limits                PUT, DELETE /api/user-limits/{user}/{name}
    GET /api/access-keys                GET, POST /api/users/{name}/access-keys
                                        DELETE /api/access-keys/{key id}

Access keys are MaxQ-Raft's own (RabbitMQ has none): the SQS endpoint's SigV4 credentials
(docs/sqs.md). A POST draws the key id and secret here, proposes them, and answers the secret
once (201); no listing shows it again.

A PUT answers 201 Created when it made something and 204 No Content when it changed what was
there; a DELETE answers 204. Every value is checked (machines/metadata.access_refusal and the
log's own encoding) before anything is proposed, so a refused request leaves the log as it was.
A password given in clear is hashed here, with a fresh salt, before it is proposed: no log,
snapshot or reply ever holds it.
"""

from __future__ import annotations

from typing import Any

from ..machines import access
from ..machines import metadata as md
from ..machines.queue_types import Rejected
from ..server.persistence import unstorable
from .requests import HttpError, NotFoundHere, Reply, Request, commit

NOT_FOUND = "404 Not Found"
BAD = "400 Bad Request"


async def _change(broker: Any, command: Any) -> Any:
    refused = md.access_refusal(command) or unstorable(command)
    if isinstance(refused, Rejected):
        raise HttpError(BAD, refused.reply_text)
    return await commit(broker, command)


def _created(reply: Any) -> Reply:
    return Reply("201 Created" if reply is True else "204 No Content")


def _string(body: dict, key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if type(value) is not str:
        raise HttpError(BAD, f"'{key}' must be a string")
    return value


# ------------------------------------------------------------------------------------- users


def user_view(user: access.UserRecord) -> dict:
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": user.hashing_algorithm,
        "tags": list(user.tags),
        "limits": dict(user.limits),
    }


def whoami(broker: Any, caller: Any) -> dict:
    return {"name": caller.name, "tags": list(caller.user.tags)}


def list_users(broker: Any) -> list:
    return [user_view(u) for u in broker.meta.users.values()]


def get_user(broker: Any, request: Request) -> dict:
    user = broker.meta.users.get(request.params["name"])
    if user is None:
        raise HttpError(NOT_FOUND, f"no user '{request.params['name']}'")
    return user_view(user)


def parse_tags(value: Any) -> list[str]:
    """RabbitMQ takes tags as "a,b" (and, since 3.9, as a list)."""
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(type(t) is str for t in value):
        return [t.strip() for t in value if t.strip()]
    raise HttpError(BAD, "'tags' must be a comma-separated string or a list of strings")


async def put_user(broker: Any, request: Request) -> Reply:
    name = request.params["name"]
    body = request.json()
    existing = broker.meta.users.get(name)
    tags = parse_tags(body.get("tags", ""))
    algorithm = access.SHA256
    if "password" in body:
        password = _string(body, "password")
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            raise HttpError(BAD, "the password is not valid Unicode") from None
        password_hash = access.hash_password(password)
    elif "password_hash" in body:
        password_hash = _string(body, "password_hash")
        algorithm = _string(body, "hashing_algorithm", access.SHA256)
    elif existing is not None:
        password_hash, algorithm = existing.password_hash, existing.hashing_algorithm
    else:
        raise HttpError(BAD, "a new user needs 'password' or 'password_hash' ('' for no password login)")
    return _created(await _change(broker, md.PutUser(name, password_hash, algorithm, tags)))


async def delete_user(broker: Any, request: Request) -> Reply:
    await commit(broker, md.DeleteUser(request.params["name"]))
    return Reply("204 No Content")


# ------------------------------------------------------------------------------------ vhosts


def vhost_view(name: str, vhost: md.VHost) -> dict:
    return {"name": name, "description": "", "tags": [], "tracing": False, "limits": dict(vhost.limits)}


def list_vhosts(broker: Any) -> list:
    return [vhost_view(name, v) for name, v in broker.meta.vhosts.items()]


def get_vhost(broker: Any, request: Request) -> dict:
    name = request.params["name"]
    vhost = broker.meta.vhosts.get(name)
    if vhost is None:
        raise HttpError(NOT_FOUND, f"no vhost '{name}'")
    return vhost_view(name, vhost)


async def put_vhost(broker: Any, request: Request) -> Reply:
    """Create a vhost; as RabbitMQ's HTTP API does (not rabbitmqctl), the user who creates it
    gets every permission in it, so an administrator can use what it just made."""
    name = request.params["name"]
    created = await _change(broker, md.PutVhost(name))
    if created is True and request.caller is not None:
        await _change(broker, md.SetPermissions(name, request.caller.name, ".*", ".*", ".*"))
    return _created(created)


async def delete_vhost(broker: Any, request: Request) -> Reply:
    await commit(broker, md.DeleteVhost(request.params["name"]))
    return Reply("204 No Content")


# ------------------------------------------------------------------------------- permissions


def list_permissions(broker: Any) -> list:
    return [
        {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
        for vhost, v in broker.meta.vhosts.items()
        for user, p in v.permissions.items()
    ]


def get_permissions(broker: Any, request: Request) -> dict:
    vhost, user = request.params["vhost"], request.params["name"]
    permission = broker.meta.permission(vhost, user)
    if permission is None:
        raise HttpError(NOT_FOUND, f"no permissions for user '{user}' in vhost '{vhost}'")
    return {
        "user": user,
        "vhost": vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


async def put_permissions(broker: Any, request: Request) -> Reply:
    vhost, user = request.params["vhost"], request.params["name"]
    body = request.json()
    command = md.SetPermissions(vhost, user, *(_string(body, key) for key in ("configure", "write", "read")))
    had = broker.meta.permission(vhost, user) is not None
    await _change(broker, command)
    return Reply("204 No Content" if had else "201 Created")


async def delete_permissions(broker: Any, request: Request) -> Reply:
    await commit(broker, md.ClearPermissions(request.params["vhost"], request.params["name"]))
    return Reply("204 No Content")


def list_topic_permissions(broker: Any) -> list:
    return [
        {"user": user, "vhost": vhost, "exchange": exchange, "write": t.write, "read": t.read}
        for vhost, v in broker.meta.vhosts.items()
        for user, by_exchange in v.topic_permissions.items()
        for exchange, t in by_exchange.items()
    ]


def get_topic_permissions(broker: Any, request: Request) -> list:
    vhost, user = request.params["vhost"], request.params["name"]
    found = [t for t in list_topic_permissions(broker) if t["vhost"] == vhost and t["user"] == user]
    if not found:
        raise HttpError(NOT_FOUND, f"no topic permissions for user '{user}' in vhost '{vhost}'")
    return found


async def put_topic_permissions(broker: Any, request: Request) -> Reply:
    vhost, user = request.params["vhost"], request.params["name"]
    body = request.json()
    exchange = _string(body, "exchange")
    command = md.SetTopicPermissions(vhost, user, exchange, _string(body, "write"), _string(body, "read"))
    v = broker.meta.vhosts.get(vhost)
    had = v is not None and exchange in v.topic_permissions.get(user, {})
    await _change(broker, command)
    return Reply("204 No Content" if had else "201 Created")


async def delete_topic_permissions(broker: Any, request: Request) -> Reply:
    await commit(broker, md.ClearTopicPermissions(request.params["vhost"], request.params["name"], ""))
    return Reply("204 No Content")


# ------------------------------------------------------------------------------------ limits


def list_vhost_limits(broker: Any) -> list:
    return [{"vhost": name, "value": dict(v.limits)} for name, v in broker.meta.vhosts.items() if v.limits]


def list_user_limits(broker: Any) -> list:
    return [{"user": name, "value": dict(u.limits)} for name, u in broker.meta.users.items() if u.limits]


def _limit_value(request: Request) -> int:
    value = request.json().get("value")
    if type(value) is not int or not -(1 << 31) <= value < (1 << 31):
        raise HttpError(BAD, 'a limit is a JSON object {"value": <integer>} (negative: no limit)')
    return value


async def _set_limit(broker: Any, kind: str, owner: str, name: str, value: int | None) -> Reply:
    if kind == "vhost":
        v = broker.meta.vhosts.get(owner)
        current = dict(v.limits) if v is not None else None
    else:
        u = broker.meta.users.get(owner)
        current = dict(u.limits) if u is not None else None
    if current is None:  # (a lookup before any change: again after a metadata barrier, admin_app)
        raise NotFoundHere(NOT_FOUND, f"no {kind} '{owner}'")
    known = access.VHOST_LIMITS if kind == "vhost" else access.USER_LIMITS
    if name not in known:
        raise HttpError(BAD, f"unknown {kind} limit '{name}' (known: {', '.join(known)})")
    if value is None or value < 0:
        current.pop(name, None)
    else:
        current[name] = value
    await _change(broker, md.SetLimits(kind, owner, current))
    return Reply("204 No Content")


async def put_vhost_limit(broker: Any, request: Request) -> Reply:
    return await _set_limit(broker, "vhost", request.params["vhost"], request.params["name"], _limit_value(request))


async def delete_vhost_limit(broker: Any, request: Request) -> Reply:
    return await _set_limit(broker, "vhost", request.params["vhost"], request.params["name"], None)


async def put_user_limit(broker: Any, request: Request) -> Reply:
    return await _set_limit(broker, "user", request.params["vhost"], request.params["name"], _limit_value(request))


async def delete_user_limit(broker: Any, request: Request) -> Reply:
    return await _set_limit(broker, "user", request.params["vhost"], request.params["name"], None)


# ------------------------------------------------------------------------------- access keys


def access_key_view(record: access.AccessKeyRecord) -> dict:
    return {"access_key_id": record.key_id, "user": record.user}


def list_access_keys(broker: Any) -> list:
    return [access_key_view(k) for k in broker.meta.access_keys.values()]


def user_access_keys(broker: Any, request: Request) -> list:
    name = request.params["name"]
    if name not in broker.meta.users:
        raise HttpError(NOT_FOUND, f"no user '{name}'")
    return [access_key_view(k) for k in broker.meta.access_keys.values() if k.user == name]


async def create_access_key(broker: Any, request: Request) -> Reply:
    name = request.params["name"]
    if name not in broker.meta.users:  # (a lookup before any change, as in _set_limit)
        raise NotFoundHere(NOT_FOUND, f"no user '{name}'")
    key_id, secret = access.new_access_key()
    await _change(broker, md.PutAccessKey(key_id, name, secret))
    return Reply("201 Created", {"access_key_id": key_id, "secret_access_key": secret, "user": name})


async def delete_access_key(broker: Any, request: Request) -> Reply:
    await _change(broker, md.DeleteAccessKey(request.params["name"]))
    return Reply("204 No Content")
