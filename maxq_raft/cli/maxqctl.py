"""`maxqctl`: look at a node, and change the cluster's membership, through its HTTP admin API.

Every failure prints what was wrong on stderr and exits non-zero:

    2  a bad command line (unknown command, bad NAME, HOST:PORT or number)
    3  the node cannot be reached (or is not a MaxQ-Raft admin API)
    4  the node refused the request: unknown node or group, a membership change already in
       progress, a removal that would lose quorum (without --force), this node does not lead the
       group, the node is not a cluster member, ...
    5  the cluster could not carry out the change: timeout, new node unreachable, no leader

Membership changes may be asked of any member: the engine carries them to each group's leader.
While one waits (as a leadership transfer does), a progress line on stderr says how many groups
have carried it out (progress.py).
A leadership transfer must be asked of the group's current leader; elsewhere the answer names
it. With --json, an error's JSON body is printed on stdout too.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import stat
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..machines.access import USER_LIMITS, VHOST_LIMITS
from . import maintenance, objects, progress, replicas, trace
from .admin_client import AUTH_HEADERS, CtlError, fetch, split_scheme, use_tls

LISTS = {
    "queues": ("/api/queues", ["vhost", "name", "messages_ready", "messages_unacknowledged", "consumers", "durable"]),
    "exchanges": ("/api/exchanges", ["vhost", "name", "type", "durable", "auto_delete", "internal"]),
    "bindings": ("/api/bindings", ["vhost", "source", "destination_type", "destination", "routing_key"]),
    "connections": ("/api/connections", ["name", "peer_host", "user", "vhost", "channels", "client"]),
    "channels": (
        "/api/channels",
        ["name", "user", "vhost", "consumer_count", "messages_unacknowledged", "prefetch_count", "confirm"],
    ),
    "consumers": (
        "/api/consumers",
        ["vhost", "queue.name", "consumer_tag", "channel_details.name", "prefetch_count", "ack_required"],
    ),
    "nodes": ("/api/nodes", ["name", "running", "mem_used", "disk_free", "fd_used", "uptime"]),
    "policies": ("/api/policies", ["vhost", "name", "pattern", "apply-to", "definition", "priority"]),
    "operator-policies": ("/api/operator-policies", ["vhost", "name", "pattern", "apply-to", "definition", "priority"]),
    "users": ("/api/users", ["name", "tags", "limits"]),
    "vhosts": ("/api/vhosts", ["name", "limits"]),
    "permissions": ("/api/permissions", ["vhost", "user", "configure", "write", "read"]),
    "topic-permissions": ("/api/topic-permissions", ["vhost", "user", "exchange", "write", "read"]),
}
CREDENTIALS_FILE = "~/.maxqctl.toml"  # user = "...", password = "..."; mode 0600
NODE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as maxq_raft.config.NODE_ID
READ_TIMEOUT_S = 5.0
MEMBER_CHANGE_TIMEOUT_S = 45.0  # the node gives up after 35 s
TRANSFER_TIMEOUT_S = 20.0  # the node gives up after 10 s
REPAIR_START_WAIT_S = 300.0  # repair-member: how long it waits for the removed member to be started again
AWAIT_STARTUP_TIMEOUT_S = 300.0  # rabbitmqctl await_startup's default
AWAIT_STARTUP_POLL_S = 0.5
STATUS_POLL_TIMEOUT_S = 2.0  # one read of the cluster status for a progress line
IMPORT_TIMEOUT_S = 600.0  # an import commits its commands one by one: large files take a while


def credentials(args, environ) -> tuple[str, str]:
    """(user, password): --user/--password, else MAXQCTL_USER/MAXQCTL_PASSWORD, else the
    credentials file (--credentials-file, MAXQCTL_CREDENTIALS or ~/.maxqctl.toml, which must be
    readable by its owner only), else guest/guest (which works from loopback only)."""
    user = args.user or environ.get("MAXQCTL_USER")
    password = args.password if args.password is not None else environ.get("MAXQCTL_PASSWORD")
    path = args.credentials_file or environ.get("MAXQCTL_CREDENTIALS")
    if path or (user is None or password is None) and os.path.exists(os.path.expanduser(CREDENTIALS_FILE)):
        path = os.path.expanduser(path or CREDENTIALS_FILE)
        try:
            mode = os.stat(path).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise CtlError(f"credentials file {path} is readable by others: chmod 600 {path}", 2)
            with open(path, "rb") as file:
                data = tomllib.load(file)
        except OSError as exc:
            raise CtlError(f"cannot read credentials file {path}: {exc.strerror or exc}", 2) from None
        except tomllib.TOMLDecodeError as exc:
            raise CtlError(f"credentials file {path} is not TOML: {exc}", 2) from None
        if not isinstance(data.get("user"), str) or not isinstance(data.get("password"), str):
            raise CtlError(f'credentials file {path} needs user = "..." and password = "..."', 2)
        user = user or data["user"]
        password = password if password is not None else data["password"]
    return user or "guest", password if password is not None else "guest"


def table(rows: list[dict], columns: list[str]) -> str:
    """`rows` under `columns`; a column "a.b" is row["a"]["b"] (RabbitMQ's nested objects)."""
    cells = [[_cell(_field(row, c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _field(row: dict, column: str) -> Any:
    value: Any = row
    for key in column.split("."):
        value = value.get(key, "") if isinstance(value, dict) else ""
    return value


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _node_name(text: str) -> str:
    if not NODE_NAME.match(text):
        raise argparse.ArgumentTypeError(f"a node name is 1-64 of letters, digits, '_', '.', '-', got {text!r}")
    return text


def _host_port(text: str) -> str:
    if not _valid_node(text) or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port 1-65535, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maxqctl",
        description="Inspect and manage MaxQ-Raft nodes.",
        epilog="exit codes: 2 bad command line, 3 node unreachable, 4 refused by the node, "
        "5 the cluster could not do it",
    )
    parser.add_argument(
        "--node",
        default="127.0.0.1:15672",
        help="HOST:HTTP_PORT of the node to ask (default 127.0.0.1:15672); https://HOST:PORT for its --https-port",
    )
    parser.add_argument(
        "--cacert", metavar="FILE", help="PEM CA bundle to verify the node's HTTPS certificate with (implies https)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--user", "-u", help="the admin API user (or MAXQCTL_USER; default guest)")
    parser.add_argument("--password", "-p", help="its password (better: MAXQCTL_PASSWORD or a credentials file)")
    parser.add_argument(
        "--credentials-file",
        help=f"TOML file with user and password, mode 0600 (or MAXQCTL_CREDENTIALS; default {CREDENTIALS_FILE})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for the node (default {READ_TIMEOUT_S:g}; {MEMBER_CHANGE_TIMEOUT_S:g} for "
        f"membership changes, {TRANSFER_TIMEOUT_S:g} for transfers)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", help="members, group leaders, commit/applied index and lag")
    sub.add_parser(
        "await-startup",
        help=f"wait until the node serves its admin API (up to --timeout, default {AWAIT_STARTUP_TIMEOUT_S:g} s)",
    )
    listing = sub.add_parser(
        "list", help="list queues, exchanges, bindings, connections, channels, consumers, nodes, ..."
    )
    listing.add_argument("what", choices=sorted(LISTS))
    add = sub.add_parser(
        "add-node",
        help="add a started node (maxq-server --join on) to the metadata group: it gets replicas of the shard "
        "groups from a rebalance (a cluster with --replication-factor 0: to every group)",
    )
    add.add_argument("name", type=_node_name, metavar="NAME", help="the new node's --node-id")
    add.add_argument(
        "--rebalance",
        action="store_true",
        help="then move replicas onto it (as maxqctl rebalance; groups on a few members)",
    )
    add.add_argument(
        "--raft-addr", type=_host_port, required=True, metavar="HOST:PORT", help="the new node's --raft-addr"
    )
    remove = sub.add_parser("remove-node", help="remove a member from every group (then stop it)")
    remove.add_argument("name", type=_node_name, metavar="NAME")
    remove.add_argument("--force", action="store_true", help="remove it even if a group would be left without a quorum")
    repair = sub.add_parser(
        "repair-member",
        help="rebuild a stopped member whose data failed its checks from the others: remove it from every "
        "group and add it back (then start it with maxq-server --repair-from-peers)",
    )
    repair.add_argument("name", type=_node_name, metavar="NAME")
    repair.add_argument(
        "--raft-addr", type=_host_port, required=True, metavar="HOST:PORT", help="the member's --raft-addr"
    )
    transfer = sub.add_parser(
        "transfer-leadership",
        help="move a group's leadership to a member (ask the group's leader; "
        "GROUP 'all': every group the asked node leads)",
    )
    transfer.add_argument("group", metavar="GROUP", help="meta, shard-N or all")
    transfer.add_argument("target", type=_node_name, metavar="NODE")
    set_policy = sub.add_parser("set-policy", help="set a policy: queues whose name matches PATTERN get DEFINITION")
    set_policy.add_argument("name")
    set_policy.add_argument("pattern", help="a regular expression matched against queue names")
    set_policy.add_argument(
        "definition", help='JSON, RabbitMQ\'s keys: \'{"max-length": 1000, "dead-letter-exchange": "dlx"}\''
    )
    set_policy.add_argument("--priority", type=int, default=0)
    set_policy.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"])
    set_policy.add_argument("--vhost", default="/")
    clear_policy = sub.add_parser("clear-policy", help="remove a policy")
    clear_policy.add_argument("name")
    clear_policy.add_argument("--vhost", default="/")
    set_operator = sub.add_parser(
        "set-operator-policy",
        help="set an operator policy: queues whose name matches PATTERN get at most DEFINITION's limits",
    )
    set_operator.add_argument("name")
    set_operator.add_argument("pattern", help="a regular expression matched against queue names")
    set_operator.add_argument(
        "definition",
        help="JSON: expires, message-ttl, max-length, max-length-bytes, delivery-limit; '{\"max-length\": 1000}'",
    )
    set_operator.add_argument("--priority", type=int, default=0)
    set_operator.add_argument("--vhost", default="/")
    clear_operator = sub.add_parser("clear-operator-policy", help="remove an operator policy")
    clear_operator.add_argument("name")
    clear_operator.add_argument("--vhost", default="/")
    export = sub.add_parser("export-definitions", help="write RabbitMQ's definitions JSON (users, vhosts, queues, ...)")
    export.add_argument("file", nargs="?", default="-", metavar="FILE|-", help="where (default -: stdout)")
    export.add_argument("--vhost", help="only this vhost's definitions (RabbitMQ's per-vhost shape)")
    load = sub.add_parser("import-definitions", help="import a definitions JSON file (one exported from RabbitMQ too)")
    load.add_argument("file", metavar="FILE|-", help="the file (-: stdin)")
    load.add_argument("--vhost", help="import a per-vhost file into this vhost")
    _add_access_verbs(sub)
    for command in (status, listing, add, remove, transfer):
        # --json may also follow the command (`maxqctl list queues --json`).
        command.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of tables"
        )
    objects.add_commands(sub)
    trace.add_command(sub)
    maintenance.add_commands(sub, _node_name)
    replicas.add_commands(sub, _node_name)
    return parser


def _add_access_verbs(sub) -> None:
    add_user = sub.add_parser("add-user", help="add a user (the password is read from stdin when not given)")
    add_user.add_argument("name")
    add_user.add_argument("new_password", nargs="?", metavar="PASSWORD")
    add_user.add_argument(
        "--tags", default="", help="comma-separated: administrator, monitoring, policymaker, management"
    )
    sub.add_parser("delete-user", help="delete a user").add_argument("name")
    change = sub.add_parser("change-password", help="set a user's password (read from stdin when not given)")
    change.add_argument("name")
    change.add_argument("new_password", nargs="?", metavar="PASSWORD")
    tags = sub.add_parser("set-user-tags", help="replace a user's tags (none: no tags)")
    tags.add_argument("name")
    tags.add_argument("tags", nargs="*")
    sub.add_parser("list-users", help="users and their tags")
    sub.add_parser(
        "add-access-key", help="make an access key for USER (the SQS endpoint's credentials): prints id and secret"
    ).add_argument("name", metavar="USER")
    sub.add_parser("delete-access-key", help="delete an access key").add_argument("key_id", metavar="KEY_ID")
    list_keys = sub.add_parser("list-access-keys", help="access key ids and their users (never the secrets)")
    list_keys.add_argument("--user", default=None, help="only this user's")
    sub.add_parser("add-vhost", help="add a vhost").add_argument("name")
    sub.add_parser("delete-vhost", help="delete a vhost with everything in it").add_argument("name")
    sub.add_parser("list-vhosts", help="vhosts")
    perms = sub.add_parser("set-permissions", help="a user's configure, write and read patterns in a vhost")
    perms.add_argument("username", metavar="USER")
    perms.add_argument("configure")
    perms.add_argument("write")
    perms.add_argument("read")
    clear = sub.add_parser("clear-permissions", help="remove a user's permissions in a vhost")
    clear.add_argument("username", metavar="USER")
    listing = sub.add_parser("list-permissions", help="permissions (of one vhost with --vhost)")
    topic = sub.add_parser(
        "set-topic-permissions", help="a user's write and read routing-key patterns on a topic exchange"
    )
    topic.add_argument("username", metavar="USER")
    topic.add_argument("exchange")
    topic.add_argument("write")
    topic.add_argument("read")
    clear_topic = sub.add_parser("clear-topic-permissions", help="remove a user's topic permissions in a vhost")
    clear_topic.add_argument("username", metavar="USER")
    vhost_limits = sub.add_parser(
        "set-vhost-limits", help='replace a vhost\'s limits: \'{"max-connections": 64, "max-queues": 1000}\''
    )
    vhost_limits.add_argument("limits", help="JSON object; {} clears them")
    user_limits = sub.add_parser(
        "set-user-limits", help='replace a user\'s limits: \'{"max-connections": 10, "max-channels": 100}\''
    )
    user_limits.add_argument("username", metavar="USER")
    user_limits.add_argument("limits", help="JSON object; {} clears them")
    for verb in (perms, clear, topic, clear_topic, vhost_limits):
        verb.add_argument("--vhost", default="/", help="default /")
    listing.add_argument("--vhost", default=None, help="only this vhost's")


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _password(given: str | None) -> str:
    if given is not None:
        return given
    line = sys.stdin.readline()
    if not line:
        raise CtlError("no password: give it after the name or on stdin", 2)
    return line.rstrip("\r\n")


def _limits(text: str) -> dict:
    try:
        limits = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"limits must be a JSON object: {exc}", 2) from None
    if not isinstance(limits, dict) or not all(type(v) is int for v in limits.values()):
        raise CtlError('limits must be a JSON object of integers, e.g. {"max-connections": 10}', 2)
    return limits


KNOWN_LIMITS = {"vhost": VHOST_LIMITS, "user": USER_LIMITS}


def _set_limits(args, kind: str, owner: str, text: str) -> str:
    limits = _limits(text)
    unknown = sorted(set(limits) - set(KNOWN_LIMITS[kind]))
    if unknown:
        raise CtlError(f"unknown {kind} limits {unknown} (known: {', '.join(KNOWN_LIMITS[kind])})", 2)
    base = f"/api/{kind}-limits/{_quote(owner)}/"
    for name in KNOWN_LIMITS[kind]:  # the whole set is replaced, as rabbitmqctl set_{kind}_limits
        if name in limits:
            fetch(args.node, base + name, args.timeout or READ_TIMEOUT_S, "PUT", {"value": limits[name]})
        else:
            fetch(args.node, base + name, args.timeout or READ_TIMEOUT_S, "DELETE")
    return f"limits of {kind} '{owner}' set to {json.dumps(limits)}"


def run_access(args) -> str | None:
    """The user, vhost, permission and limit verbs; None for any other command."""
    node, timeout, command = args.node, args.timeout or READ_TIMEOUT_S, args.command
    if command == "add-user":
        tags = [t.strip() for t in args.tags.split(",") if t.strip()]
        if fetch(node, f"/api/users/{_quote(args.name)}", timeout, "GET", None, missing_ok=True) is not None:
            raise CtlError(f"user '{args.name}' already exists", 4)
        body = {"password": _password(args.new_password), "tags": tags}
        fetch(node, f"/api/users/{_quote(args.name)}", timeout, "PUT", body)
        return f"user '{args.name}' added" + (f" with tags {', '.join(tags)}" if tags else "")
    if command == "delete-user":
        fetch(node, f"/api/users/{_quote(args.name)}", timeout, "DELETE")
        return f"user '{args.name}' deleted"
    if command in ("change-password", "set-user-tags"):
        user = fetch(node, f"/api/users/{_quote(args.name)}", timeout)
        if command == "change-password":
            body = {"password": _password(args.new_password), "tags": user["tags"]}
            done = "password changed"
        else:
            body = {"tags": [t for arg in args.tags for t in arg.split(",") if t]}
            done = f"tags set to [{', '.join(body['tags'])}]"
        fetch(node, f"/api/users/{_quote(args.name)}", timeout, "PUT", body)
        return f"user '{args.name}': {done}"
    if command == "add-access-key":
        key = fetch(node, f"/api/users/{_quote(args.name)}/access-keys", timeout, "POST")
        if args.json:
            return json.dumps(key, indent=1)
        # the secret is shown this once: the node never shows it again
        return f"access key id: {key['access_key_id']}\nsecret access key: {key['secret_access_key']}"
    if command == "delete-access-key":
        fetch(node, f"/api/access-keys/{_quote(args.key_id)}", timeout, "DELETE")
        return f"access key '{args.key_id}' deleted"
    if command == "list-access-keys":
        path = f"/api/users/{_quote(args.user)}/access-keys" if args.user else "/api/access-keys"
        rows = fetch(node, path, timeout)
        return json.dumps(rows, indent=1) if args.json else table(rows, ["access_key_id", "user"])
    if command == "add-vhost":
        fetch(node, f"/api/vhosts/{_quote(args.name)}", timeout, "PUT", {})
        return f"vhost '{args.name}' added"
    if command == "delete-vhost":
        fetch(node, f"/api/vhosts/{_quote(args.name)}", timeout, "DELETE")
        return f"vhost '{args.name}' deleted"
    if command in ("set-permissions", "clear-permissions", "set-topic-permissions", "clear-topic-permissions"):
        topic = "topic" in command
        path = f"/api/{'topic-' if topic else ''}permissions/{_quote(args.vhost)}/{_quote(args.username)}"
        what = f"{'topic ' if topic else ''}permissions of user '{args.username}' in vhost '{args.vhost}'"
        if command.startswith("clear"):
            fetch(node, path, timeout, "DELETE")
            return f"{what} cleared"
        names = ("exchange", "write", "read") if topic else ("configure", "write", "read")
        fetch(node, path, timeout, "PUT", {name: getattr(args, name) for name in names})
        return f"{what} set"
    if command == "set-vhost-limits":
        return _set_limits(args, "vhost", args.vhost, args.limits)
    if command == "set-user-limits":
        return _set_limits(args, "user", args.username, args.limits)
    listings = {"list-users": "users", "list-vhosts": "vhosts", "list-permissions": "permissions"}
    if command in listings:
        path, columns = LISTS[listings[command]]
        rows = fetch(node, path, timeout)
        if command == "list-permissions" and args.vhost:
            rows = [r for r in rows if r["vhost"] == args.vhost]
        return json.dumps(rows, indent=1) if args.json else table(rows, columns)
    return None


def _valid_node(node: str) -> bool:
    scheme, node = split_scheme(node)
    if scheme not in (None, "http", "https"):
        return False
    host, _, port = node.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def render_status(status: dict) -> str:
    if not status.get("clustered"):
        members = table(status["members"], ["node", "state", "role"])
        rows = [
            {
                "group": g["group"],
                "leader": g["leader"],
                "commit_index": g["commit_index"],
                "applied_index": g["applied_index"],
                "lag": ", ".join(f"{m['node']}={m['lag']}" for m in g["members"]),
            }
            for g in status["groups"]
        ]
        return f"node {status['node']}\n\nmembers\n{members}\n\ngroups\n" + table(
            rows, ["group", "leader", "commit_index", "applied_index", "lag"]
        )
    members = table(status["members"], ["node", "state", "role", "leads", "groups"])
    rows = [
        {
            "group": g["group"],
            "leader": g["leader"],
            "term": g["term"],
            "commit_index": g["commit_index"],
            "applied_index": g["applied_index"],
            "snapshot": g.get("snapshot_index") or "",
            "here": g["role"] + (" removed" if g.get("removed") else ""),
            "change": "pending" if g["membership_change_pending"] else "",
            "queues": g["queues"] if g.get("queues") is not None else "",
            "lag": ", ".join(
                f"{m['node']}={_cell(m['lag']) if m['lag'] is not None else '?'}" + ("" if m["connected"] else "(down)")
                for m in g["members"]
            ),
        }
        for g in status["groups"]
    ]
    head = f"node {status['node']}"
    if status.get("removed"):
        head += " (REMOVED from the cluster: stop it)"
    notes = [
        "lag: entries behind the group's last index, known to the group's leader ('?' elsewhere)",
        "snapshot: the index of this node's latest snapshot of the group (the log before it is compacted)",
    ]
    if status.get("placement_recorded"):
        notes.append("queues: how many queues the metadata group records in the shard group")
    if status.get("membership_change_pending"):
        notes.append("a membership change is in progress")
    return (
        f"{head}\n\nmembers\n{members}\n\ngroups\n"
        + table(
            rows,
            ["group", "leader", "term", "commit_index", "applied_index", "snapshot", "here", "change", "queues", "lag"],
        )
        + "\n\n"
        + "\n".join(notes)
    )


def _policy_path(vhost: str, name: str, kind: str = "policies") -> str:
    return f"/api/{kind}/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(name, safe='')}"


def _definitions_path(vhost: str | None) -> str:
    return "/api/definitions" + ("" if vhost is None else "/" + urllib.parse.quote(vhost, safe=""))


def run_definitions(args) -> str | None:
    """export-definitions and import-definitions; None for other commands."""
    if args.command == "export-definitions":
        document = fetch(args.node, _definitions_path(args.vhost), args.timeout or READ_TIMEOUT_S)
        text = json.dumps(document, indent=2)
        if args.file == "-":
            return text
        try:
            # password hashes inside: readable by its owner only, as the credentials file
            fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(text + "\n")
        except OSError as exc:
            raise CtlError(f"cannot write {args.file}: {exc.strerror or exc}", 2) from None
        return f"definitions exported to {args.file}"
    if args.command == "import-definitions":
        try:
            if args.file == "-":
                document = json.load(sys.stdin)
            else:
                with open(args.file, "rb") as file:
                    document = json.load(file)
        except OSError as exc:
            raise CtlError(f"cannot read {args.file}: {exc.strerror or exc}", 2) from None
        except ValueError as exc:
            raise CtlError(f"{args.file} is not JSON: {exc}", 2) from None
        fetch(args.node, _definitions_path(args.vhost), args.timeout or IMPORT_TIMEOUT_S, "POST", document)
        return f"definitions imported from {args.file}"
    return None


def await_startup(node: str, timeout_s: float) -> str:
    """Ask the node who we are until it answers (RabbitMQ's `rabbitmqctl await_startup`): only
    "cannot reach" is retried; an answer that refuses us (bad credentials) ends the wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        left_s = deadline - time.monotonic()
        try:
            fetch(node, "/api/whoami", max(0.1, min(READ_TIMEOUT_S, left_s)))
            return f"node {node} is up"
        except CtlError as exc:
            if exc.code != 3:
                raise
            if time.monotonic() + AWAIT_STARTUP_POLL_S >= deadline:
                raise CtlError(f"node {node} did not start within {timeout_s:g} s ({exc})", 3) from None
        time.sleep(AWAIT_STARTUP_POLL_S)


def _with_progress(node: str, call, describe, label: str):
    """`call()` with a progress line on stderr (progress.py) read from the node's status."""
    return progress.wait_with_progress(
        call, lambda: fetch(node, "/api/cluster/status", STATUS_POLL_TIMEOUT_S), describe, label, sys.stderr
    )


def run(args) -> str:
    timeout = args.timeout
    for verbs in (run_access, run_definitions):
        done = verbs(args)
        if done is not None:
            return done
    done = objects.run(args, timeout or READ_TIMEOUT_S)
    if done is not None:
        return done
    done = trace.run(args, timeout or READ_TIMEOUT_S, table)
    if done is not None:
        return done
    done = maintenance.run(args, timeout)
    if done is not None:
        return done
    done = replicas.run(args, timeout)
    if done is not None:
        return done
    if args.command == "set-policy":
        try:
            definition = json.loads(args.definition)
        except ValueError as exc:
            raise CtlError(f"the definition must be JSON: {exc}", 2) from None
        fetch(
            args.node,
            _policy_path(args.vhost, args.name),
            timeout or READ_TIMEOUT_S,
            "PUT",
            {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": args.apply_to},
        )
        return f"policy '{args.name}' set in vhost '{args.vhost}'"
    if args.command == "clear-policy":
        fetch(args.node, _policy_path(args.vhost, args.name), timeout or READ_TIMEOUT_S, "DELETE")
        return f"policy '{args.name}' cleared in vhost '{args.vhost}'"
    if args.command == "set-operator-policy":
        try:
            definition = json.loads(args.definition)
        except ValueError as exc:
            raise CtlError(f"the definition must be JSON: {exc}", 2) from None
        fetch(
            args.node,
            _policy_path(args.vhost, args.name, "operator-policies"),
            timeout or READ_TIMEOUT_S,
            "PUT",
            {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": "queues"},
        )
        return f"operator policy '{args.name}' set in vhost '{args.vhost}'"
    if args.command == "clear-operator-policy":
        path = _policy_path(args.vhost, args.name, "operator-policies")
        fetch(args.node, path, timeout or READ_TIMEOUT_S, "DELETE")
        return f"operator policy '{args.name}' cleared in vhost '{args.vhost}'"
    if args.command == "await-startup":
        return await_startup(args.node, timeout or AWAIT_STARTUP_TIMEOUT_S)
    if args.command == "status":
        status = fetch(args.node, "/api/cluster/status", timeout or READ_TIMEOUT_S)
        return json.dumps(status, indent=1) if args.json else render_status(status)
    if args.command == "add-node":
        answer = add_member(args, timeout, f"adding {args.name}")
        if args.rebalance:
            return replicas.rebalance(args.node, timeout)
        if args.json:
            return json.dumps(answer, indent=1)
        if not replicas.groups_held(args.node, args.name):
            return (
                f"node {args.name} ({args.raft_addr}) added to the metadata group; it holds no shard group until "
                "`maxqctl rebalance` moves replicas onto it"
            )
        return f"node {args.name} ({args.raft_addr}) added to every group"
    if args.command == "remove-node":
        path = "/api/cluster/members/" + urllib.parse.quote(args.name) + ("?force=1" if args.force else "")
        answer = _with_progress(
            args.node,
            lambda: fetch(args.node, path, timeout or MEMBER_CHANGE_TIMEOUT_S, "DELETE"),
            lambda status: progress.groups_without_member(status, args.name),
            f"removing {args.name}",
        )
        if args.json:
            return json.dumps(answer, indent=1)
        return (
            f"node {args.name} removed from every group"
            + (" (forced: a group may have lost its quorum)" if answer.get("forced") else "")
            + "; stop it now"
        )
    if args.command == "repair-member":
        return repair_member(args, timeout)
    if args.command == "transfer-leadership":
        answer = _with_progress(
            args.node,
            lambda: fetch(
                args.node,
                "/api/cluster/transfer-leadership",
                timeout or TRANSFER_TIMEOUT_S,
                "POST",
                {"group": args.group, "node": args.target},
            ),
            lambda status: progress.groups_led_by(status, args.target, args.group),
            f"moving leadership to {args.target}",
        )
        if args.json:
            return json.dumps(answer, indent=1)
        rows = [{"group": g, "result": r} for g, r in answer["results"].items()]
        return f"leadership to {args.target}\n" + table(rows, ["group", "result"])
    path, columns = LISTS[args.what]
    rows = fetch(args.node, path, timeout or READ_TIMEOUT_S)
    return json.dumps(rows, indent=1) if args.json else table(rows, columns)


def add_member(args: argparse.Namespace, timeout: float | None, label: str) -> dict:
    """Add args.name at args.raft_addr to every group, with a progress line (add-node, repair-member)."""
    return _with_progress(
        args.node,
        lambda: fetch(
            args.node,
            "/api/cluster/members",
            timeout or MEMBER_CHANGE_TIMEOUT_S,
            "POST",
            {"node": args.name, "raft_addr": args.raft_addr},
        ),
        lambda status: progress.groups_with_member(status, args.name),
        label,
    )


def repair_member(args: argparse.Namespace, timeout: float | None) -> str:
    """Remove NAME from every group and add it back (server/member_repair.py): Raft lets a member
    come back with less than it had only as a new one. NAME must be stopped (it would otherwise
    go on with what it has), and the node refuses the removal when the others could not form a
    majority without it (exit 4): then its copy is needed and must not be thrown away. After the
    removal the operator starts NAME with --repair-from-peers (empty, joining); the addition is
    retried while NAME cannot be reached, for up to REPAIR_START_WAIT_S."""
    status = fetch(args.node, "/api/cluster/status", timeout or READ_TIMEOUT_S)
    members = {m["node"]: m for m in status.get("members", [])}
    member = members.get(args.name)
    if member is None:
        raise CtlError(f"node {args.name} is not a member of the cluster (members: {', '.join(sorted(members))})", 4)
    if member.get("state") == "up":
        raise CtlError(
            f"node {args.name} is up: stop it first (repair-member rebuilds a member whose data failed its "
            "checks; a running member keeps what it has)",
            4,
        )
    held = replicas.groups_held(args.node, args.name)  # (its replicas, given back after: groups placed)
    path = "/api/cluster/members/" + urllib.parse.quote(args.name)
    _with_progress(
        args.node,
        lambda: fetch(args.node, path, timeout or MEMBER_CHANGE_TIMEOUT_S, "DELETE"),
        lambda status: progress.groups_without_member(status, args.name),
        f"removing {args.name}",
    )
    # Added back only once it runs again, empty and joining: a member is added by talking to it.
    print(
        f"maxqctl: {args.name} removed; now start it with `maxq-server ... --repair-from-peers` "
        f"(waiting up to {REPAIR_START_WAIT_S:g} s for it)",
        file=sys.stderr,
        flush=True,
    )
    deadline = time.monotonic() + REPAIR_START_WAIT_S
    while True:  # bounded by the deadline; each turn waits for the node's answer or 1 s
        try:
            answer = add_member(args, timeout, f"adding {args.name} back")
            break
        except CtlError as exc:
            unreachable = exc.code == 5 and (exc.body or {}).get("reason") == "unreachable"
            if not unreachable or time.monotonic() >= deadline:
                raise CtlError(
                    f"{exc}; {args.name} is removed: add it with `maxqctl add-node {args.name} --raft-addr "
                    f"{args.raft_addr}` once it runs with --repair-from-peers",
                    exc.code,
                    exc.body,
                ) from None
            time.sleep(1.0)
    # Groups placed on a few members: added back, it holds the metadata group only (a new member
    # does), and each group it held had one replica less; it gets those replicas back, one move
    # each (a learner first, installed from the others). In the layout of every group the
    # addition gave them back already.
    lacking = [group for group in held if group not in replicas.groups_held(args.node, args.name)]
    if lacking:
        replicas.execute(args.node, [replicas.Move(group, args.name, None) for group in lacking], timeout)
    if args.json:
        return json.dumps({**answer, "action": "repaired", "groups": held}, indent=1)
    back = f"the metadata group and {', '.join(held)}" if held else "the metadata group"
    return f"node {args.name} removed and added back to {back}: it is installed from the other members"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with a usage message on a bad command line
    if not _valid_node(args.node):
        print(f"maxqctl: --node must be HOST:PORT with a port 1-65535, got {args.node!r}", file=sys.stderr)
        return 2
    if args.timeout is not None and not args.timeout > 0:
        print(f"maxqctl: --timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2
    try:
        user, password = credentials(args, os.environ)
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        AUTH_HEADERS["Authorization"] = f"Basic {token}"
        scheme = split_scheme(args.node)[0]
        if scheme == "https" or (args.cacert and scheme is None):
            use_tls(args.cacert)
        print(run(args))
    except CtlError as exc:
        if args.json and exc.body is not None:
            print(json.dumps(exc.body, indent=1))
        print(f"maxqctl: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
