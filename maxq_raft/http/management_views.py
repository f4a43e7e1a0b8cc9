"""RabbitMQ management views that rabbitmqadmin and dashboards read: nodes, channels, the
overview's totals, and the kinds of object we do not have (runtime parameters, operator
policies), in RabbitMQ 3.10's JSON shapes.

Theory of operation: each view is a function from the broker's state (and, for a cluster's
nodes, the replication engine's status, read by the caller) to JSON-able values; the keys are
RabbitMQ's, and a key is present only when we have the thing it names. What RabbitMQ reports
that has no meaning here (Erlang processes, run queues, the statistics database, mnesia) is
left out rather than given an invented value (docs/operations.md, "Management API").

Names: a connection is named by its id ("maxq1@7": node and number, what `maxqctl` and
`DELETE /api/connections/{name}` use), not RabbitMQ's "peer -> local" text; a channel by its
connection's name and number, "maxq1@7 (1)", as RabbitMQ appends the number.
"""

from __future__ import annotations

import os
import time
from typing import Any

import trio

from .. import __version__
from ..machines.metadata import DEDUP_EXCHANGE_TYPE, DELAYED_EXCHANGE_TYPE
from ..machines.routing import EXCHANGE_TYPES
from ..server.alarms import rss_bytes
from ..server.message_rates import connection_counts, node_counts
from . import auth
from .metrics import CLUSTER_NAME
from .process_sample import sample_process
from .requests import HttpError, Reply, Request, json_safe

PRODUCT_NAME = "MaxQ-Raft"
CLOSE_REASON = "Closed via management plugin"  # RabbitMQ's, without an X-Reason header
CLOSE_REASON_MAX_BYTES = 200  # a reason goes into connection.close's reply text (a shortstr)


def connection_view(session: Any) -> dict:
    return {
        "name": session.id,
        "node": session.broker.node_id,
        "peer_host": session.peer_host,
        "user": session.user,
        "vhost": session.vhost,
        "channels": len(session.channels),
        "client": json_safe(session.client_properties.get("product", "")),
        "client_properties": json_safe(session.client_properties),
        "messages_in": session.messages_in,
        "messages_out": session.messages_out,
        # RabbitMQ's socket figures (ours count reads and writes where it counts packets)
        **session.broker.connection_rates.message_stats(trio.current_time(), session.id, connection_counts(session)),
        "recv_cnt": session.recv_cnt,
        "send_cnt": session.send_cnt,
    }


def connection_views(broker: Any) -> list[dict]:
    return [connection_view(session) for session in broker.sessions.values()]


def consumer_views(broker: Any) -> list[dict]:
    """RabbitMQ's consumer objects (`queue` and `channel_details` as objects), with `vhost` and
    `node` beside them (what the lists are filtered and sorted by)."""
    out = []
    for h in broker.consumers.values():
        channel = h.channel
        session = channel.session
        vhost, name = h.queue_key
        out.append(
            {
                "consumer_tag": h.tag,
                "queue": {"name": name, "vhost": vhost},
                "channel_details": {
                    "name": session.channel_name(channel.number),
                    "number": channel.number,
                    "connection_name": session.id,
                    "node": broker.node_id,
                    "peer_host": session.peer_host,
                    "user": session.user,
                },
                "ack_required": not h.no_ack,
                "exclusive": h.exclusive,
                "prefetch_count": channel.state.prefetch_count,
                "arguments": json_safe(h.arguments),
                "vhost": vhost,
                "node": broker.node_id,
            }
        )
    return out


def client_totals(broker: Any) -> list[dict]:
    """This member's connections, channels and consumers, counted (a list of one, as the other
    views are lists)."""
    sessions = broker.sessions.values()
    return [
        {
            "connections": len(sessions),
            "channels": sum(len(session.channels) for session in sessions),
            "consumers": len(broker.consumers),
        }
    ]


def alarm_list(broker: Any) -> list[dict[str, str]]:
    """This node's resource alarms in effect, as RabbitMQ's health checks list them."""
    alarms = broker.alarms
    if alarms is None:
        return []
    found = []
    if alarms.memory_alarm:
        found.append({"node": broker.node_id, "resource": "memory"})
    if alarms.disk_alarm:
        found.append({"node": broker.node_id, "resource": "disk"})
    return found


def close_reason(request: Request) -> str:
    """The X-Reason header's text, bounded, else RabbitMQ's."""
    given = request.headers.get("x-reason", "").strip().encode("utf-8", "replace")
    return given[:CLOSE_REASON_MAX_BYTES].decode("utf-8", "ignore") or CLOSE_REASON


def _session(broker: Any, request: Request) -> Any:
    """The connection named in the path, if the caller may see it (its own, or everyone's for
    monitoring and administrators); 404 if not (another member's: http/cluster_lists.py)."""
    session = broker.sessions.get(request.params["name"])
    caller = request.caller
    if session is None or caller is None or not (caller.sees_everything or session.user == caller.name):
        raise HttpError("404 Not Found", "Object Not Found", reason="Not Found")
    return session


def get_connection(broker: Any, request: Request) -> dict:
    return connection_view(_session(broker, request))


def close_connection(broker: Any, request: Request) -> Reply:
    """RabbitMQ's DELETE /api/connections/{name}: 320 CONNECTION_FORCED with the X-Reason header's
    text. A management user may close its own connections; an administrator any."""
    session = _session(broker, request)
    if session.user != request.caller.name and not request.caller.has(auth.Need.ADMINISTRATOR):
        raise auth.Forbidden("Access refused.")
    session.force_close(close_reason(request))
    return Reply("204 No Content")


def channel_views(broker: Any) -> list[dict]:
    out = []
    for session in broker.sessions.values():
        for number, channel in session.channels.items():
            state = channel.state
            out.append(
                {
                    "name": session.channel_name(number),
                    "number": number,
                    "node": broker.node_id,
                    "user": session.user,
                    "vhost": session.vhost,
                    "connection_details": {"name": session.id, "peer_host": session.peer_host},
                    "state": "running",
                    "consumer_count": len(channel.consumers),
                    "messages_unacknowledged": len(state.unacked),
                    "messages_unconfirmed": state.unconfirmed_count,
                    "prefetch_count": state.prefetch_count,
                    "global_prefetch_count": state.prefetch_count_global,
                    "confirm": state.confirm,
                    "transactional": state.tx,
                }
            )
    return out


def this_node(broker: Any) -> dict:
    """RabbitMQ's node object for the node asked, from what it can read about itself."""
    alarms = broker.alarms
    data_dir = alarms.data_dir if alarms is not None else "."
    sample = sample_process(data_dir)
    return {
        "name": broker.node_id,
        "type": "disc",
        "running": True,
        "being_drained": broker.node_id in broker.meta.draining,  # (maxqctl drain: machines/maintenance.py)
        "os_pid": str(os.getpid()),
        "uptime": int((time.time() - broker.started_at) * 1000),
        "processors": os.cpu_count() or 1,
        "mem_used": rss_bytes(),
        "mem_limit": alarms.memory_limit_bytes if alarms is not None else 0,
        "mem_alarm": bool(alarms is not None and alarms.memory_alarm),
        "mem_calculation_strategy": "rss",
        "disk_free": sample.disk_free_bytes,
        "disk_free_limit": alarms.disk_limit_bytes if alarms is not None else 0,
        "disk_free_alarm": bool(alarms is not None and alarms.disk_alarm),
        "fd_used": sample.open_fds,
        "fd_total": sample.max_fds,
        "sockets_used": len(broker.sessions),
        "partitions": [],
        "db_dir": os.path.abspath(data_dir),
        "rates_mode": "basic",
        "enabled_plugins": [],
        "exchange_types": exchange_types(),
    }


def node_views(broker: Any, groups: dict[str, dict] | None) -> list[dict]:
    """Every member this node knows of (a single node: itself). Another member is named with
    whether this node sees it connected (admin.py adds the figures it gives of itself)."""
    nodes = [this_node(broker)]
    if groups:
        seen: dict[str, bool] = {}
        for group in groups.values():
            for name, member in group.get("members", {}).items():
                if name != broker.node_id:
                    seen[name] = seen.get(name, False) or bool(member.get("connected"))
        draining = broker.meta.draining
        nodes += [
            {"name": name, "type": "disc", "running": up, "being_drained": name in draining}
            for name, up in sorted(seen.items())
        ]
    return nodes


def exchange_types() -> list[dict]:
    names = [*EXCHANGE_TYPES, DELAYED_EXCHANGE_TYPE, DEDUP_EXCHANGE_TYPE]  # (the plugins' types too)
    return [{"name": name, "description": "", "enabled": True} for name in names]


def overview_extras(broker: Any) -> dict:
    """RabbitMQ's overview keys that rabbitmqadmin `show overview` and dashboards read."""
    queues = broker.shown_queues()  # every queue of the cluster, also those held elsewhere
    ready = sum(queue.ready_count for _key, queue in queues)
    unacked = sum(queue.unacked_count for _key, queue in queues)
    exchanges = sum(len(vhost.exchanges) for vhost in broker.meta.vhosts.values())
    return {
        "product_name": PRODUCT_NAME,
        "product_version": __version__,
        "cluster_name": CLUSTER_NAME,
        "rates_mode": "basic",
        "exchange_types": exchange_types(),
        "message_stats": broker.message_rates.message_stats(trio.current_time(), node_counts(broker)),
        "queue_totals": {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked},
        "object_totals": {
            **client_totals(broker)[0],  # (this member's; admin.py's overview adds the others')
            "exchanges": exchanges,
            "queues": len(queues),
        },
        "listeners": [
            {"node": broker.node_id, "protocol": protocol, "port": port} for protocol, port in broker.listeners.items()
        ],
    }
