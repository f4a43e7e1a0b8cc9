"""`maxqctl`: look at a node through its HTTP admin API.

Every failure prints what was wrong on stderr and exits non-zero: 2 for a bad command line,
3 when the node cannot be reached, 4 when the node answers with an error.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
import urllib.request

LISTS = {
    "queues": ("/api/queues", ["vhost", "name", "messages_ready", "messages_unacknowledged", "consumers", "durable"]),
    "exchanges": ("/api/exchanges", ["vhost", "name", "type", "durable", "auto_delete", "internal"]),
    "bindings": ("/api/bindings", ["vhost", "source", "destination_type", "destination", "routing_key"]),
    "connections": ("/api/connections", ["name", "peer_host", "user", "vhost", "channels", "client"]),
    "consumers": ("/api/consumers", ["vhost", "queue", "consumer_tag", "connection", "channel", "ack_required"]),
    "policies": ("/api/policies", ["vhost", "name", "pattern", "apply-to", "definition", "priority"]),
}


class CtlError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# The node is named explicitly: never route admin requests through an http_proxy from the
# environment (a proxy would answer for the node, or not at all).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(node: str, path: str, timeout_s: float, method: str = "GET", body: dict | None = None):
    url = f"http://{node}{path}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except ValueError:
            detail = ""
        raise CtlError(f"node {node} answered {exc.code}: {detail or exc.reason}", 4) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CtlError(f"cannot reach node {node}: {reason}", 3) from None
    except (http.client.HTTPException, ValueError) as exc:
        # Something answered, but not our admin API (e.g. the AMQP port).
        raise CtlError(f"node {node} did not answer as a MaxQ-Raft admin API: {type(exc).__name__}: {exc}", 3) from None


def table(rows: list[dict], columns: list[str]) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maxqctl", description="Inspect and manage MaxQ-Raft nodes.")
    parser.add_argument("--node", default="127.0.0.1:15672", help="HOST:HTTP_PORT of the node to ask (default 127.0.0.1:15672)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the node (default 5)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", help="members, group leaders, commit/applied index and lag")
    listing = sub.add_parser("list", help="list queues, exchanges, bindings, connections or consumers")
    listing.add_argument("what", choices=sorted(LISTS))
    set_policy = sub.add_parser("set-policy", help="set a policy: queues whose name matches PATTERN get DEFINITION")
    set_policy.add_argument("name")
    set_policy.add_argument("pattern", help="a regular expression matched against queue names")
    set_policy.add_argument("definition", help='JSON, RabbitMQ\'s keys: \'{"max-length": 1000, "dead-letter-exchange": "dlx"}\'')
    set_policy.add_argument("--priority", type=int, default=0)
    set_policy.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"])
    set_policy.add_argument("--vhost", default="/")
    clear_policy = sub.add_parser("clear-policy", help="remove a policy")
    clear_policy.add_argument("name")
    clear_policy.add_argument("--vhost", default="/")
    for command in (status, listing):
        # --json may also follow the command (`maxqctl list queues --json`).
        command.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of tables")
    return parser


def _valid_node(node: str) -> bool:
    host, _, port = node.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def _policy_path(vhost: str, name: str) -> str:
    from urllib.parse import quote

    return f"/api/policies/{quote(vhost, safe='')}/{quote(name, safe='')}"


def run(args) -> str:
    if args.command == "set-policy":
        try:
            definition = json.loads(args.definition)
        except ValueError as exc:
            raise CtlError(f"the definition must be JSON: {exc}", 2) from None
        fetch(args.node, _policy_path(args.vhost, args.name), args.timeout, "PUT",
              {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": args.apply_to})
        return f"policy '{args.name}' set in vhost '{args.vhost}'"
    if args.command == "clear-policy":
        fetch(args.node, _policy_path(args.vhost, args.name), args.timeout, "DELETE")
        return f"policy '{args.name}' cleared in vhost '{args.vhost}'"
    if args.command == "status":
        status = fetch(args.node, "/api/cluster/status", args.timeout)
        if args.json:
            return json.dumps(status, indent=1)
        rows = [{"group": g["group"], "leader": g["leader"], "commit_index": g["commit_index"], "applied_index": g["applied_index"],
                 "lag": ", ".join(f"{m['node']}={m['lag']}" for m in g["members"])} for g in status["groups"]]
        members = table(status["members"], ["node", "state", "role"])
        return f"node {status['node']}\n\nmembers\n{members}\n\ngroups\n" + table(rows, ["group", "leader", "commit_index", "applied_index", "lag"])
    path, columns = LISTS[args.what]
    rows = fetch(args.node, path, args.timeout)
    return json.dumps(rows, indent=1) if args.json else table(rows, columns)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with a usage message on a bad command line
    if not _valid_node(args.node):
        print(f"maxqctl: --node must be HOST:PORT with a port 1-65535, got {args.node!r}", file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print(f"maxqctl: --timeout must be a positive number of seconds, got {args.timeout}", file=sys.stderr)
        return 2
    try:
        print(run(args))
    except CtlError as exc:
        print(f"maxqctl: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
