"""maxqctl's verbs for queues, exchanges, bindings and connections, through the management API
routes RabbitMQ has for them (docs/operations.md): declare, delete and purge a queue, declare and
delete an exchange, bind and unbind, close a connection, pause and resume a queue's consumers.

Each verb is one request (or two: unbind reads the bindings between the two ends to find the
one to remove, as rabbitmqadmin asks for its properties_key); what the node refuses comes back as
the CtlError of admin_client.fetch (exit 4 with the node's reason, 3 unreachable).
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from .admin_client import CtlError, fetch

VERBS = (
    "declare-queue",
    "delete-queue",
    "purge-queue",
    "declare-exchange",
    "delete-exchange",
    "bind",
    "unbind",
    "close-connection",
    "pause-consumers",
    "resume-consumers",
)
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers", "x-delayed-message", "x-message-deduplication")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_commands(sub: Any) -> None:
    """The verbs' parsers, on maxqctl's subcommands."""
    declare = sub.add_parser("declare-queue", help="declare a queue (as queue.declare; an existing alike one is kept)")
    declare.add_argument("name")
    declare.add_argument("--vhost", default="/")
    declare.add_argument("--transient", action="store_true", help="not durable (default: durable)")
    declare.add_argument("--auto-delete", action="store_true")
    declare.add_argument("--arguments", type=_json_object, default={}, help="JSON: '{\"x-max-length\": 1000}'")
    delete = sub.add_parser("delete-queue", help="delete a queue and its messages")
    delete.add_argument("name")
    delete.add_argument("--vhost", default="/")
    delete.add_argument("--if-empty", action="store_true")
    delete.add_argument("--if-unused", action="store_true")
    purge = sub.add_parser("purge-queue", help="remove a queue's ready messages")
    purge.add_argument("name")
    purge.add_argument("--vhost", default="/")
    exchange = sub.add_parser("declare-exchange", help="declare an exchange")
    exchange.add_argument("name")
    exchange.add_argument("type", choices=EXCHANGE_TYPES)
    exchange.add_argument("--vhost", default="/")
    exchange.add_argument("--transient", action="store_true", help="not durable (default: durable)")
    exchange.add_argument("--auto-delete", action="store_true")
    exchange.add_argument("--internal", action="store_true")
    exchange.add_argument("--arguments", type=_json_object, default={})
    drop = sub.add_parser("delete-exchange", help="delete an exchange")
    drop.add_argument("name")
    drop.add_argument("--vhost", default="/")
    drop.add_argument("--if-unused", action="store_true")
    for verb, help_text in (("bind", "bind a queue or exchange to an exchange"), ("unbind", "remove a binding")):
        binding = sub.add_parser(verb, help=help_text)
        binding.add_argument("source", help="the exchange")
        binding.add_argument("destination", help="the queue (or exchange, with --to-exchange)")
        binding.add_argument("--vhost", default="/")
        binding.add_argument("--routing-key", default="")
        binding.add_argument("--to-exchange", action="store_true")
        binding.add_argument("--arguments", type=_json_object, default={})
    close = sub.add_parser("close-connection", help="close a client connection (320 CONNECTION_FORCED)")
    close.add_argument("name", help="its name, from `maxqctl list connections`")
    close.add_argument("--reason", default="", help="the text the client gets")
    for verb, help_text in (
        ("pause-consumers", "stop deliveries to a queue's consumers (they keep their subscription and unacked)"),
        ("resume-consumers", "lift a pause set by pause-consumers (the same --consumer-tag / --connection)"),
    ):
        pause = sub.add_parser(verb, help=help_text)
        pause.add_argument("queue")
        pause.add_argument("--vhost", default="/")
        which = pause.add_mutually_exclusive_group()
        which.add_argument("--consumer-tag", help="only consumers with this tag (default: every consumer)")
        which.add_argument("--connection", help="only consumers on this connection (`maxqctl list connections`)")


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _flag(query: list[str]) -> str:
    return ("?" + "&".join(query)) if query else ""


def run(args: argparse.Namespace, timeout_s: float) -> str | None:
    """Carry out one verb; its message for people, or None when `args` is another command."""
    node, command = args.node, args.command
    if command not in VERBS:
        return None
    if command == "close-connection":
        headers = {"X-Reason": args.reason} if args.reason else None
        fetch(node, f"/api/connections/{_q(args.name)}", timeout_s, "DELETE", headers=headers)
        return f"connection '{args.name}' closed"
    vhost = _q(args.vhost)
    if command in ("pause-consumers", "resume-consumers"):
        body = {"action": command.replace("-", "_")}
        scope = "every consumer"
        if args.consumer_tag is not None:
            body["consumer_tag"], scope = args.consumer_tag, f"consumers tagged '{args.consumer_tag}'"
        elif args.connection is not None:
            body["connection"], scope = args.connection, f"consumers on connection '{args.connection}'"
        path = f"/api/queues/{vhost}/{_q(args.queue)}"
        fetch(node, f"{path}/actions", timeout_s, "POST", body)
        queue = fetch(node, path, timeout_s) or {}
        done = "paused" if command == "pause-consumers" else "resumed"
        return (
            f"{scope} of queue '{args.queue}' {done}; "
            f"{queue.get('paused_consumers', '?')} of its {queue.get('consumers', '?')} consumers are paused"
        )
    if command == "declare-queue":
        body = {"durable": not args.transient, "auto_delete": args.auto_delete, "arguments": args.arguments}
        fetch(node, f"/api/queues/{vhost}/{_q(args.name)}", timeout_s, "PUT", body)
        return f"queue '{args.name}' declared in vhost '{args.vhost}'"
    if command == "delete-queue":
        query = [f"if-{what}=true" for what, on in (("empty", args.if_empty), ("unused", args.if_unused)) if on]
        fetch(node, f"/api/queues/{vhost}/{_q(args.name)}{_flag(query)}", timeout_s, "DELETE")
        return f"queue '{args.name}' deleted from vhost '{args.vhost}'"
    if command == "purge-queue":
        fetch(node, f"/api/queues/{vhost}/{_q(args.name)}/contents", timeout_s, "DELETE")
        return f"queue '{args.name}' purged"
    if command == "declare-exchange":
        body = {
            "type": args.type,
            "durable": not args.transient,
            "auto_delete": args.auto_delete,
            "internal": args.internal,
            "arguments": args.arguments,
        }
        fetch(node, f"/api/exchanges/{vhost}/{_q(args.name)}", timeout_s, "PUT", body)
        return f"exchange '{args.name}' ({args.type}) declared in vhost '{args.vhost}'"
    if command == "delete-exchange":
        query = ["if-unused=true"] if args.if_unused else []
        fetch(node, f"/api/exchanges/{vhost}/{_q(args.name)}{_flag(query)}", timeout_s, "DELETE")
        return f"exchange '{args.name}' deleted from vhost '{args.vhost}'"
    ends = f"/api/bindings/{vhost}/e/{_q(args.source)}/{'e' if args.to_exchange else 'q'}/{_q(args.destination)}"
    if command == "bind":
        fetch(node, ends, timeout_s, "POST", {"routing_key": args.routing_key, "arguments": args.arguments})
        return f"'{args.destination}' bound to '{args.source}' with routing key '{args.routing_key}'"
    bindings = fetch(node, ends, timeout_s) or []
    wanted = [b for b in bindings if b["routing_key"] == args.routing_key and (b["arguments"] or {}) == args.arguments]
    if not wanted:
        raise CtlError(
            f"no binding of '{args.destination}' to '{args.source}' with routing key '{args.routing_key}'"
            + (" and those arguments" if args.arguments else ""),
            4,
        )
    fetch(node, f"{ends}/{_q(wanted[0]['properties_key'])}", timeout_s, "DELETE")
    return f"'{args.destination}' unbound from '{args.source}' (routing key '{args.routing_key}')"
