"""RabbitMQ's health checks (`GET /api/health/checks/...`) and `GET /api/cluster-name`.

Theory of operation: each check is a function from the node's state to RabbitMQ's answer: 200
with `{"status": "ok", ...}` when it passes, 503 with `{"status": "failed", "reason": ..., ...}`
when it fails, with the same keys and reason texts as RabbitMQ 3.10 (checked side by side with
its management plugin), so load balancers, Kubernetes probes and monitoring scripts written for
RabbitMQ read ours unchanged. What each means here:

- alarms / local-alarms: the resource alarms (alarms.py: memory, disk, a store that cannot
  write). local-alarms answers for this node; alarms for the cluster, as RabbitMQ's: each
  member knows its own, so the member asked asks the others (http/cluster_lists.py; one that
  does not answer is left out, as a node that is down has no alarm to report).
- port-listener/{port}, protocol-listener/{protocol}: what this node listens on (Broker.listeners,
  RabbitMQ's protocol names: amqp, amqp/ssl, http, https, http/prometheus, clustering).
- virtual-hosts: a vhost here is a record in the replicated metadata and cannot be "down" on
  one node as RabbitMQ's vhost supervisors can, so it passes whenever the node serves.
- node-is-quorum-critical: fails when shutting this node down would leave a Raft group it is a
  member of without a majority (its other members that this node sees connected are fewer than
  a majority of the group), listing the queues those groups hold, as RabbitMQ lists the quorum
  queues that would lose their quorum; `groups` names the groups (the metadata group too).
  node-is-mirror-sync-critical has no meaning here (no classic mirrored queues): it passes, as
  RabbitMQ's does on a node without mirrored queues.
"""

from __future__ import annotations

from typing import Any

from . import cluster_lists, management_views
from .engine_status import engine_status
from .metrics import CLUSTER_NAME, QUEUE_TYPE
from .requests import HttpError, Reply, Request

OK = {"status": "ok"}
SINGLE_NODE = {"status": "ok", "reason": "single node cluster"}


def _failed(reason: str, **extra: Any) -> Reply:
    return Reply("503 Service Unavailable", {"status": "failed", "reason": reason, **extra})


async def check_alarms(broker: Any, request: Request) -> Any:
    alarms = await cluster_lists.gather(broker, "alarms")
    return _failed("There are alarms in effect in the cluster", alarms=alarms) if alarms else OK


def check_local_alarms(broker: Any, request: Request) -> Any:
    alarms = management_views.alarm_list(broker)
    return _failed("There are alarms in effect on the node", alarms=alarms) if alarms else OK


def check_port_listener(broker: Any, request: Request) -> Any:
    text = request.params.get("name", "")
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise HttpError("400 Bad Request", f"invalid port: {text!r}")
    port = int(text)
    ports = sorted(set(broker.listeners.values()))
    if port in ports:
        return {"status": "ok", "port": port}
    return _failed("No active listener", missing=port, ports=ports)


def check_protocol_listener(broker: Any, request: Request) -> Any:
    protocol = request.params.get("name", "")
    if protocol in broker.listeners:
        return {"status": "ok", "protocol": protocol}
    return _failed("No active listener", missing=protocol, protocols=list(broker.listeners))


def check_virtual_hosts(broker: Any, request: Request) -> Any:
    return OK


def check_mirror_sync_critical(broker: Any, request: Request) -> Any:
    return OK if broker.log.replication_node is not None else SINGLE_NODE


def quorum_critical_groups(groups: dict[str, dict], node: str) -> list[str]:
    """Groups with `node` as a member that would have no majority without it: its other members
    this node sees connected are fewer than a majority of all the group's members. Pure."""
    critical = []
    for name, group in groups.items():
        members = group.get("members", {})
        if node not in members:
            continue
        others_up = sum(1 for mid, m in members.items() if mid != node and m.get("connected"))
        if others_up < len(members) // 2 + 1:
            critical.append(name)
    return critical


async def check_quorum_critical(broker: Any, request: Request) -> Any:
    if broker.log.replication_node is None:
        return SINGLE_NODE
    groups = quorum_critical_groups(await engine_status(broker), broker.node_id)
    if not groups:
        return OK
    queues = [
        {"name": name, "virtual_host": vhost, "type": QUEUE_TYPE}
        for vhost, name in broker.queues
        if broker.log.group_of((vhost, name)) in groups
    ]
    return _failed(
        "There are quorum queues that would lose their quorum if the target node is shut down",
        queues=queues,
        groups=groups,
    )


def cluster_name(broker: Any, request: Request) -> Any:
    return {"name": CLUSTER_NAME}
