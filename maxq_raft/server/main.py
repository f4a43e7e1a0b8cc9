"""`maxq-server`: run one node (a one-member cluster unless peers are given).

Theory of operation: parse settings, lock the data folder so two nodes never share it, then run
the trio shell: an AMQP listener whose handler wraps each connection in a `Session`, the HTTP
admin API, with a certificate the same two over TLS (server/tls.py), and a signal receiver.
SIGTERM/SIGINT close every connection with 320
CONNECTION_FORCED (as RabbitMQ does on shutdown), wait briefly for them to go, and exit 0.

Fail-stop (a cluster member only): when the member cannot keep its Raft state or its store (a
full disk, an I/O error: the engine's `on_fatal`, the store's `on_failure`), it stops the same way,
so it no longer votes, leads or acknowledges and its clients reconnect to another member, then
waits until its data folder has room and takes a test write (written, fsynced, removed: a
disk whose fsync fails would fail the store's open again), then starts again from its files
(the same process, re-executed), catching up from the others. A single node instead keeps
serving and recovers its store in place (store_health.py): it has no one else to hand its
clients to. A joining member
whose shard count was only its default and is not the cluster's stops the same way and starts
again at once with the cluster's (shard_count.py).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import signal
import ssl
import sys
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple

import trio

from ..amqp import spec
from ..config import Settings, SettingsError, load_settings, parse_addr
from ..http import cluster_lists
from ..http.admin import allowed_hosts
from ..http.admin_app import open_admin_listeners, open_admin_tls_listeners, serve_admin
from ..http.metrics_server import open_metrics_listeners, serve_metrics
from ..http.sqs_app import open_sqs_listeners, receipt_keys, serve_sqs
from ..machines import metadata as md
from ..machines.access import hash_password
from ..machines.features import SUPPORTED
from ..machines.metadata import META_GROUP
from ..replication.engine import ReplicationNode
from ..replication.group_set import GroupSetError
from ..replication.journal import JournalCorruption, JournalError
from ..replication.snapshot_file import SnapshotError
from ..storage.errors import StorageError, StoreCorruption, StoreLocked
from ..storage.guarded import GuardedStore
from ..storage.rocks import RocksSegmentStore, interrupted_creation
from ..storage.rocks import verify as verify_store
from . import collector, heap, persistence, tls
from .alarms import ResourceAlarms, disk_free_bytes
from .broker import Broker
from .cluster import ClusterLog, default_shards
from .errors import ChannelError
from .feature_flags import enable_features
from .first_placement import choice as first_placement_choice
from .first_placement import take_first_placement
from .folder_owner import NodeNameError, check_node_name, member_data, single_node_data
from .hosts import is_ip, machine_of
from .local_log import LocalLog
from .member_repair import RAFT_FOLDER, member_problems, move_aside, raft_problems
from .recovery import recover
from .session import Session, tick_sessions
from .shard_count import ProvisionalCount, ShardCountError, is_provisional, member_shard_count, read_pinned
from .store_health import StoreWatch
from .trace_store import RocksKV, TraceLog
from .tracer import compact_trace

log = logging.getLogger("maxq.server")

SHUTDOWN_GRACE_S = 3.0
RESTART_DELAY_S = 5.0  # a member that failed waits at least this long before it starts again
RESTART_FREE_BYTES_MIN = 64 << 20  # ... and until its data folder has this much free (plus the disk limit)
RESTART_WAIT_S_MAX = 24 * 3600.0  # then it gives up (exit 75) and leaves the rest to an operator
RESTART_LOG_EVERY_S = 60.0
# A member re-executed after a storage failure whose start fails again on its disk (a disk that
# failed once more between the test write and the open) waits and tries again, up to this many
# starts in a row, then exits with the start's error and code. Both travel to the next life in
# the environment and are cleared once a life serves; a start failure that is not the disk's
# (damage, a port in use, a halt) exits at once, as a start by hand does.
RESTARTED_ENV = "MAXQ_RESTARTED_AFTER_FAILURE"  # set: this life was re-executed after one
FAILED_STARTS_ENV = "MAXQ_FAILED_STARTS"  # how many such lives in a row failed to start
FAILED_STARTS_MAX = 10
DISK_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS})
WRITE_PROBE_NAME = ".maxq-write-probe"  # the test write's file in the data folder, removed after it
WRITE_PROBE_BYTES = 4096


class StopRequest:
    """Why the node stops: a signal (reason None), or a failure it must restart after."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.failure: str | None = None
        self.restart = True  # False: starting again cannot help (halt)
        self.wait_for_room = True  # False: start again at once (the cause was no storage failure)
        self._token = trio.lowlevel.current_trio_token()

    def fail(self, reason: str) -> None:
        """From any thread: stop serving because this member's storage failed."""
        try:
            self._token.run_sync_soon(self._fail_here, reason)
        except trio.RunFinishedError:
            pass

    def start_again(self, reason: str) -> None:
        """From any thread: stop serving and start again at once, for `reason`."""
        try:
            self._token.run_sync_soon(self._start_again_here, reason)
        except trio.RunFinishedError:
            pass

    def _start_again_here(self, reason: str) -> None:
        if self.event.is_set():
            return
        self.wait_for_room = False
        self.failure = reason
        log.warning("this member stops serving to start again: %s", reason)
        self.event.set()

    def halt(self, reason: str) -> None:
        """From the loop: stop serving for a reason a restart would meet again (this member's
        log holds entries of a newer version): the process exits 1 instead of starting again."""
        self.restart = False
        self._fail_here(reason)

    def _fail_here(self, reason: str) -> None:
        if self.event.is_set():
            return
        self.failure = reason
        log.critical("this member stops serving: %s", reason)
        self.event.set()


def lock_data_dir(data_dir: str):
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    lock_file = open(path / "LOCK", "a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise SettingsError(f"data folder {path} is in use by another maxq-server") from None
        raise
    return lock_file


async def handle_connection(
    broker: Broker, settings: Settings, raw_stream: trio.SocketStream, tls_context: ssl.SSLContext | None = None
) -> None:
    try:
        peer_host = raw_stream.socket.getpeername()[0]  # (the TCP peer, under TLS too)
    except OSError:
        return
    stream: trio.abc.Stream = raw_stream
    tls_user = None
    if tls_context is not None:
        tls_stream = await tls.accept(raw_stream, tls_context, settings.handshake_timeout_s, peer_host)
        if tls_stream is None:
            return
        stream, tls_user = tls_stream, tls.peer_common_name(tls_stream)
    session = None
    try:
        session = Session(broker, stream, peer_host, settings, tls_user=tls_user)
        await session.run()
    except Exception:  # one connection's bug must never take the node down
        log.exception("connection %s from %s failed", session.id if session else "(new)", peer_host)
        with trio.CancelScope(shield=True):
            await stream.aclose()


def damaged_raft_data(settings: Settings, exc: Exception) -> str:
    """What to say of Raft data that cannot be started from, and how to repair it."""
    return (
        f"cannot start from the Raft data in {settings.data_dir}: {exc}. The other members hold this "
        f"data: `maxqctl --node <another member> repair-member {settings.node_id} --raft-addr "
        f"{settings.raft_addr}`, then start this node with --repair-from-peers (docs/operations.md)"
    )


class StartupError(Exception):
    """The node cannot start (a port in use, an address we cannot bind); the message says why.
    `disk`: the cause is the disk failing (a start after a storage failure then waits again)."""

    def __init__(self, message: str, *, disk: bool = False) -> None:
        super().__init__(message)
        self.disk = disk


async def _bind(what: str, host: str, port: int, opener) -> list:
    try:
        return await opener()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason = "the port is in use by another process"
        raise StartupError(f"cannot listen for {what} on {host}:{port}: {reason}") from None


def store_path(settings: Settings) -> Path:
    return Path(settings.data_dir) / "store"


def repair_from_peers(settings: Settings) -> Settings:
    """`--repair-from-peers`: a member whose data fails its checks moves it aside and starts empty,
    to be installed from its peers (member_repair.py); sound data is left alone."""
    data_dir = Path(settings.data_dir)
    problems = member_problems(data_dir)
    if not problems:
        if member_data(data_dir / RAFT_FOLDER) is None:
            # An empty folder (a disk replaced): the member repair-member adds back is a new
            # one, and says so (--join on), or its peers take its new folder for lost data.
            log.info("repair from peers: %s holds no Raft data; starting as a new member", data_dir)
            settings.join = "on"
            return settings
        log.info("repair from peers: %s passes every check; starting from it as usual", data_dir)
        return settings
    for problem in problems:
        log.warning("repair from peers: %s", problem)
    try:
        kept_count = read_pinned(data_dir / RAFT_FOLDER)
    except ShardCountError:
        kept_count = None  # (its record is damaged too: the start chooses again)
    moved = move_aside(data_dir)
    if kept_count is not None and not settings.shards:
        settings.shards = kept_count  # the cluster's count is not damaged data: the new raft/ keeps it
    log.warning(
        "repair from peers: the damaged data is in %s; starting empty, to be installed from the other members "
        "once `maxqctl repair-member %s` has added this node back",
        moved,
        settings.node_id,
    )
    settings.join = "on"
    return settings


def check_data_dir(settings: Settings) -> int:
    """`maxq-server --check`: verify every record and the metadata log offline, and a cluster
    member's Raft data (journals, term files, snapshots); 0 when sound."""
    raft = Path(settings.data_dir) / RAFT_FOLDER
    raft_found = raft_problems(Path(settings.data_dir)) if raft.exists() else []
    if raft.exists():
        for problem in raft_found:
            print(f"{raft}: {problem}")
        print(f"{raft}: {'OK' if not raft_found else f'{len(raft_found)} problem(s)'}")
    path = store_path(settings)
    if not path.exists() or interrupted_creation(path):
        what = "a creation that did not finish, created again at start" if path.exists() else "nothing to check"
        print(f"{path}: no message store here ({what})")
        return 0 if not raft_found else 1
    problems = verify_store(path)
    if not problems:
        try:
            with RocksSegmentStore(path, read_only=True) as store:
                persistence.MetadataLog(store).entries()
        except (StorageError, persistence.MetadataCorruption) as exc:
            problems.append(str(exc))
    for problem in problems:
        print(f"{path}: {problem}")
    print(f"{path}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems and not raft_found else 1


class Stopped(NamedTuple):
    """Why a cluster member stopped serving by itself; the caller starts the process again."""

    reason: str
    wait_for_room: bool  # a storage failure: once its data folder has room; else at once


async def serve(settings: Settings, store=None, task_status=trio.TASK_STATUS_IGNORED) -> Stopped | None:
    """Run the node until a signal (returns None) or, for a cluster member, a storage failure or
    a shard count to take (returns why: the caller starts the process again)."""
    try:
        tls_context = tls.server_context(settings)
    except tls.TLSConfigError as exc:
        raise StartupError(str(exc)) from None
    broker = Broker(settings.node_id, store, fsync=settings.fsync == "on")
    if store is not None:  # x-trace's records (tracer.py), in a RocksDB of their own beside the store
        trace_path = Path(settings.data_dir) / "trace"
        try:
            broker.tracer.log = TraceLog(RocksKV(trace_path), replayed=settings.clustered)
        except Exception as exc:  # rocksdict raises plain Exception: a damaged trace store, a full disk
            # Derived data: the node serves, its new records kept in memory until it stops.
            log.error("trace store %s cannot be opened (%s): trace records are kept in memory only", trace_path, exc)
    stop = StopRequest()
    if settings.clustered:
        try:
            await _serve_clustered(broker, settings, task_status, stop, tls_context)
        finally:
            broker.close()
        if stop.failure is not None and not stop.restart:
            raise StartupError(f"this member stopped: {stop.failure}")
        return Stopped(stop.failure, stop.wait_for_room) if stop.failure is not None else None
    described = member_data(Path(settings.data_dir) / RAFT_FOLDER)
    if described is not None:
        broker.close()
        raise StartupError(
            f"{settings.data_dir} holds {described}: start it as that member again (its --node-id, --raft-addr, "
            "--peer and --cluster-secret); a single node needs a --data-dir of its own"
        )
    try:
        broker.attach(LocalLog(broker))
        if store is not None:
            if settings.fsync == "off":
                log.warning("fsync is OFF: confirmed messages can be lost if the machine crashes (benchmarks only)")
            try:
                recover(broker, broker.log, trio.lowlevel.current_trio_token().run_sync_soon)
            except (StorageError, persistence.MetadataCorruption) as exc:
                raise StartupError(f"cannot recover the data in {store.path}: {exc}") from None
            watch = StoreWatch(store, settings.data_dir)
            store.on_failure = watch.on_failure
        await _serve(
            broker, settings, task_status, stop, watch=watch if store is not None else None, tls_context=tls_context
        )
    finally:
        broker.close()
    return None


def first_start_shards(settings: Settings) -> int:
    """The shard groups a member starts without --shards (cluster.default_shards), counting the
    members of the cluster's first start: its --peer list and itself. A joiner counts the members
    it is told of (the cluster's own count if it never grew); its count is provisional until a
    peer's list says (shard_count.py)."""
    members = len(settings.peers()) + (0 if settings.join == "on" else 1)
    return default_shards(members, settings.replication_factor)


async def _serve_clustered(
    broker: Broker, settings: Settings, task_status, stop: StopRequest, tls_context: ssl.SSLContext | None
) -> None:
    """A cluster member: the machines are applied from the Raft groups; the store only takes
    what overflows memory, so it starts empty (the retained Raft log rebuilds everything)."""
    if settings.fsync == "off":
        log.warning("fsync is OFF: confirmed messages can be lost if the machines crash (benchmarks only)")
    if broker.store is not None:
        described = single_node_data(broker.store)
        if described is not None:
            raise StartupError(
                f"{settings.data_dir} holds {described}: a cluster member keeps its state in the Raft groups and "
                "empties its store at start, which would delete it. Start the member on an empty --data-dir; to "
                "carry this node's definitions over, start it alone again (without --raft-addr) and use `maxqctl "
                "export-definitions` there and `import-definitions` on the cluster (messages are not carried)"
            )
        broker.store.on_failure = lambda reason: stop.fail(f"the message store cannot write: {reason}")
        broker.open_for_cluster()
    raft_dir = Path(settings.data_dir) / RAFT_FOLDER
    try:
        incarnation = check_node_name(raft_dir, settings.node_id, fsync=settings.fsync == "on")
    except NodeNameError as exc:
        raise StartupError(str(exc)) from None
    except OSError as exc:  # (writing the record at a first start: a full disk waits for room)
        raise StartupError(
            f"cannot record this member's name in {raft_dir}: {exc}", disk=exc.errno in DISK_ERRNOS
        ) from None
    try:
        shard_count = member_shard_count(
            raft_dir, settings.shards, first_start_shards(settings), joining=settings.join == "on"
        )
    except (ShardCountError, OSError) as exc:
        raise StartupError(str(exc)) from None
    provisional = ProvisionalCount(raft_dir, shard_count, META_GROUP, stop) if is_provisional(raft_dir) else None
    cluster = ClusterLog(
        broker, None, shard_count, snapshot_every_bytes=max(4096, int(settings.snapshot_every_mb * (1 << 20)))
    )
    cluster.default_locator = settings.queue_leader_locator
    cluster.replication_factor = settings.replication_factor
    cluster.answer_lists = partial(cluster_lists.answer, broker)  # (another member asks for this one's clients)
    broker.attach(cluster)
    cluster.on_fatal = stop.halt
    held, proposal = _first_placement(settings, cluster.shards)
    try:
        node = ReplicationNode(
            node_id=settings.node_id,
            raft_addr=parse_addr(settings.raft_addr, "raft_addr"),
            peers=settings.peers(),
            cluster_secret=settings.cluster_secret.encode(),
            data_dir=Path(settings.data_dir) / RAFT_FOLDER,
            groups=[META_GROUP, *cluster.shards],
            fsync=settings.fsync == "on",
            on_commit=cluster.on_commit,
            on_snapshot=cluster.on_snapshot,
            joining=settings.join == "on",
            on_fatal=stop.fail,
            apply_backlog_bytes=cluster.apply_backlog_bytes,
            features=SUPPORTED,
            on_peer_groups=provisional.on_peer_groups if provisional is not None else None,
            held=held,
            on_message=cluster.on_message,
            await_placement=proposal is not None,
            incarnation=incarnation,
        )
        node.start()
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise StartupError(
                f"cannot open the Raft data in {settings.data_dir}: {exc.strerror or exc}", disk=True
            ) from None
        raise StartupError(f"cannot listen for Raft on {settings.raft_addr}: {exc.strerror or exc}") from None
    except JournalError as exc:
        if not isinstance(exc, JournalCorruption):  # (a write or fsync at open that failed: the disk)
            raise StartupError(f"cannot open the Raft data in {settings.data_dir}: {exc}", disk=True) from None
        raise StartupError(damaged_raft_data(settings, exc)) from None
    except (SnapshotError, GroupSetError) as exc:  # (GroupSetError: a record of the groups held, or of peers)
        raise StartupError(damaged_raft_data(settings, exc)) from None
    cluster.node = node
    if node.kept_every_group:
        log.warning(
            "--replication-factor %d is not applied: it places the groups at a cluster's first start, and this "
            "member's data holds every group (the cluster was started with --replication-factor 0, the default "
            "before 2026-12-07); it keeps them (docs/operations.md)",
            settings.replication_factor,
        )
    log.info(
        "node %s: Raft on %s, %d shard groups, peers %s%s",
        settings.node_id,
        settings.raft_addr,
        shard_count,
        ", ".join(f"{k}@{h}:{p}" for k, (h, p) in settings.peers().items()) or "none",
        " (joining: waiting to be added)" if settings.join == "on" else "",
    )
    if provisional is not None:
        log.info(
            "node %s: %d shard groups is this machine's default: the first peer's group list decides (shard_count.py)",
            settings.node_id,
            shard_count,
        )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cluster.retry_proposals)
            nursery.start_soon(cluster.serve_remote)
            nursery.start_soon(cluster.snapshot_when_due)
            catching_up = trio.CancelScope()
            nursery.start_soon(_cancel_when_stopped, stop, catching_up)
            with catching_up:
                if node.awaiting_placement:
                    own = parse_addr(settings.raft_addr, "raft_addr")
                    refused = await take_first_placement(cluster, proposal or [], own)
                    if refused is not None:
                        stop.halt(refused)
                if not stop.event.is_set():
                    await cluster.barrier()
            if stop.event.is_set():
                nursery.cancel_scope.cancel()  # failed while catching up: no client to close yet
                return
            log.info("node %s: caught up with the cluster", settings.node_id)
            nursery.start_soon(cluster.watch_members)
            await _serve(broker, settings, task_status, stop, tls_context=tls_context)
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(node.stop)


def _first_placement(settings: Settings, shards: list[str]) -> tuple[list[str] | None, list[list] | None]:
    """With a --replication-factor (3 by default): the groups this member holds at its first
    start (the metadata group only) and its proposal of the cluster's first placement
    (server/first_placement.py: the metadata group records the first proposed, and every member
    starts the groups it lists for it): each group on `factor` members, or on all of them when
    there are fewer. A joining member (--join on) holds only the metadata group and proposes
    nothing: its replicas come by a rebalance. The engine records what it holds in the data
    folder (replication/group_set.py); a later start takes it from there.
    None, None: every member holds every group (--replication-factor 0).

    A cluster of as many members as the factor or fewer is placed too, every group on every
    member, rather than left in the layout of every group: grown by a member, it then keeps the
    factor (the new member holds nothing until a rebalance spreads the replicas), where the
    layout of every group makes each new member one more replica of every group."""
    factor = settings.replication_factor
    if factor and settings.join == "on":
        return [META_GROUP], None  # a new member: replicas come by a rebalance (maxqctl rebalance)
    addresses = {**settings.peers(), settings.node_id: parse_addr(settings.raft_addr, "raft_addr")}
    if not factor:
        return None, None
    hosts = {member: machine_of(host) for member, (host, _port) in addresses.items()}
    if factor < len(addresses) and any(ipaddress.ip_address(h).is_unspecified for h in hosts.values() if is_ip(h)):
        raise StartupError(
            "--replication-factor places each group's replicas on different machines, told apart by the "
            "host of each member's Raft address: give --raft-addr the address the other members list in "
            f"their --peer, not {settings.raft_addr}"
        )
    return [META_GROUP], first_placement_choice(shards, addresses, factor, hosts)


DEFAULT_USER_TIMEOUT_S = 30.0


async def _seed_default_user(broker: Broker, settings: Settings) -> None:
    """--default-user on a node whose users were never changed: it replaces guest. In a cluster
    every member may propose it; the machine takes the first and ignores the rest."""
    if not settings.default_user or broker.meta.users_seeded:
        return
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    replies: list = []

    def then(reply) -> None:
        replies.append(reply)
        token.run_sync_soon(done.set)

    command = md.SeedDefaultUser(settings.default_user, hash_password(settings.default_pass))
    try:
        broker.meta_call(command, then)
    except ChannelError as err:
        replies.append(err)
        done.set()
    with trio.move_on_after(DEFAULT_USER_TIMEOUT_S):
        await done.wait()
    reply = replies[0] if replies else None
    if reply is True:
        log.info(
            "default user %r created (administrator, all permissions on vhost '/'); guest removed",
            settings.default_user,
        )
    elif reply is False:
        pass  # another member's seeding, or a user change, came first
    else:
        log.warning("default user %r not created (%s): the next start tries again", settings.default_user, reply)


def listening_ports(amqp, http, amqps, https, prometheus, raft_addr: str) -> dict[str, int]:
    """{protocol: port} in RabbitMQ's protocol names (its health checks report them)."""
    ports = {"amqp": amqp[1]}
    for protocol, addr in (("amqp/ssl", amqps), ("http", http), ("https", https), ("http/prometheus", prometheus)):
        if addr is not None:
            ports[protocol] = addr[1]
    if raft_addr:
        ports["clustering"] = int(raft_addr.rpartition(":")[2])
    return ports


async def _cancel_when_stopped(stop: StopRequest, scope: trio.CancelScope) -> None:
    await stop.event.wait()
    scope.cancel()  # (a no-op once the scope has been left)


async def _stop_on_signal(signals, stop: StopRequest) -> None:
    async for signum in signals:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.event.set()
        return


async def _serve(
    broker: Broker,
    settings: Settings,
    task_status,
    stop: StopRequest,
    watch: StoreWatch | None = None,
    tls_context: ssl.SSLContext | None = None,
) -> None:
    """Serve clients until `stop`; `watch` recovers a single node's store when it cannot write."""
    broker.alarms = ResourceAlarms(settings.data_dir, settings.memory_high_watermark_mb, settings.disk_free_limit_mb)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # Bind every port before serving anything: a busy port must fail the start cleanly
        # (raised inside the nursery, trio would wrap it in an ExceptionGroup).
        listeners = await _bind(
            "AMQP",
            settings.amqp_host,
            settings.amqp_port,
            partial(trio.open_tcp_listeners, settings.amqp_port, host=settings.amqp_host),
        )
        admin_listeners = []
        if settings.http_port:
            admin_listeners = await _bind(
                "HTTP", settings.http_host, settings.http_port, partial(open_admin_listeners, settings)
            )
        amqps_listeners, https_listeners = [], []
        if tls_context is not None and settings.amqps_port:
            amqps_listeners = await _bind(
                "AMQP over TLS",
                settings.amqp_host,
                settings.amqps_port,
                partial(trio.open_tcp_listeners, settings.amqps_port, host=settings.amqp_host),
            )
        if tls_context is not None and settings.https_port:
            https_listeners = await _bind(
                "HTTPS",
                settings.http_host,
                settings.https_port,
                partial(open_admin_tls_listeners, settings),
            )
        metrics_listeners = []
        if settings.prometheus_port:
            metrics_listeners = await _bind(
                "Prometheus", settings.http_host, settings.prometheus_port, partial(open_metrics_listeners, settings)
            )
        sqs_listeners = []
        if settings.sqs_port:
            sqs_listeners = await _bind(
                "SQS", settings.sqs_host or settings.http_host, settings.sqs_port, partial(open_sqs_listeners, settings)
            )
        await _seed_default_user(broker, settings)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.alarms.run)
            nursery.start_soon(heap.trim_periodically)
            nursery.start_soon(broker.message_rates.sample_every, broker)
            if watch is not None:
                nursery.start_soon(watch.run, broker.alarms)
            nursery.start_soon(tick_sessions, broker)
            nursery.start_soon(compact_trace, broker.tracer, broker.clock_ms)
            nursery.start_soon(broker.log.tick_queues)
            nursery.start_soon(enable_features, broker)
            nursery.start_soon(partial(trio.serve_listeners, partial(handle_connection, broker, settings), listeners))
            amqp_addr = listeners[0].socket.getsockname()
            http_addr = None
            if admin_listeners:
                http_addr = await nursery.start(
                    serve_admin, broker, admin_listeners, allowed_hosts(settings.http_allowed_hosts)
                )
            if metrics_listeners:
                metrics_addr = await nursery.start(
                    serve_metrics,
                    broker,
                    metrics_listeners,
                    allowed_hosts(settings.http_allowed_hosts),
                    settings.data_dir,
                )
                log.info("Prometheus metrics on %s:%s/metrics", metrics_addr[0], metrics_addr[1])
            tls_note = ""
            if amqps_listeners:
                handler = partial(handle_connection, broker, settings, tls_context=tls_context)
                nursery.start_soon(partial(trio.serve_listeners, handler, amqps_listeners))
                amqps_addr = amqps_listeners[0].socket.getsockname()
                tls_note += f", AMQP over TLS on {amqps_addr[0]}:{amqps_addr[1]}"
            if https_listeners:
                https_addr = await nursery.start(
                    partial(
                        serve_admin,
                        broker,
                        https_listeners,
                        allowed_hosts(settings.http_allowed_hosts),
                        ssl_context=tls_context,
                    )
                )
                tls_note += f", HTTPS admin on {https_addr[0]}:{https_addr[1]}"
            if sqs_listeners:
                sqs_addr = await nursery.start(
                    partial(serve_sqs, broker, sqs_listeners, receipt_keys(settings), ssl_context=tls_context)
                )
                tls_note += f", SQS{' over HTTPS' if tls_context else ''} on {sqs_addr[0]}:{sqs_addr[1]}"
            broker.listeners = listening_ports(
                amqp_addr,
                http_addr,
                amqps_listeners[0].socket.getsockname() if amqps_listeners else None,
                https_addr if https_listeners else None,
                metrics_addr if metrics_listeners else None,
                settings.raft_addr,
            )
            os.environ.pop(RESTARTED_ENV, None)  # this life serves: a later failure counts from 0
            os.environ.pop(FAILED_STARTS_ENV, None)
            log.info(
                "maxq-server ready: node %s accepting AMQP 0-9-1 on %s:%s%s%s, data in %s",
                settings.node_id,
                amqp_addr[0],
                amqp_addr[1],
                f", HTTP admin on {http_addr[0]}:{http_addr[1]}" if http_addr else "",
                tls_note,
                os.path.abspath(settings.data_dir),
            )
            task_status.started((amqp_addr, http_addr, broker))
            collector.freeze_startup()
            nursery.start_soon(_stop_on_signal, signals, stop)
            await stop.event.wait()
            # As RabbitMQ on shutdown: every open connection gets 320 CONNECTION_FORCED; we wait
            # (bounded) for the clients' close-ok, then cancel whatever is left.
            reason = "shutdown" if stop.failure is None else "storage failure"
            for session in list(broker.sessions.values()):
                session.conn.close(
                    spec.CONNECTION_FORCED,
                    f"broker forced connection closure with reason '{reason}'",
                    now=trio.current_time(),
                )
                session.wake()
            with trio.move_on_after(SHUTDOWN_GRACE_S):
                while broker.sessions:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    log.info("maxq-server stopped")


def main(argv: list[str] | None = None) -> int:
    try:
        settings, args = load_settings(argv)
        try:
            lock = lock_data_dir(settings.data_dir)
        except OSError as exc:  # the data folder cannot be created or locked
            raise SettingsError(f"data folder {settings.data_dir}: {exc.strerror or exc}") from None
    except SettingsError as exc:
        print(f"maxq-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.check:
        lock.close()
        return check_data_dir(settings)
    if args.repair_from_peers:
        if not settings.clustered:
            lock.close()
            print("maxq-server: --repair-from-peers is for a cluster member (--raft-addr, --peer)", file=sys.stderr)
            return 2
        settings = repair_from_peers(settings)
    path = store_path(settings)
    try:
        store = GuardedStore(
            lambda read_only: RocksSegmentStore(path, read_only=read_only), redo=not settings.clustered
        )
    except StorageError as exc:
        lock.close()
        disk = not isinstance(exc, (StoreCorruption, StoreLocked))
        return start_failed(settings, f"cannot open the message store: {exc}", 3, disk=disk)
    failure = None
    collector.tune()
    try:
        failure = trio.run(serve, settings, store)
    except StartupError as exc:
        lock.close()
        return start_failed(settings, str(exc), 1, disk=exc.disk)
    except KeyboardInterrupt:  # a SIGINT before the signal receiver was installed
        pass
    finally:
        lock.close()
    if failure is not None and not failure.wait_for_room:
        log.warning("node %s starts again: %s", settings.node_id, failure.reason)
        return start_again()
    if failure is not None:
        return restart_when_room(settings, failure.reason, failed_starts())
    return 0


def failed_starts() -> int:
    """How many lives in a row, re-executed after a storage failure, failed to start on their
    disk (0 in a process that was not re-executed after one, or whose previous life served)."""
    try:
        return max(0, int(os.environ.get(FAILED_STARTS_ENV, "0")))
    except ValueError:
        return 0


def start_failed(settings: Settings, error: str, code: int, *, disk: bool) -> int:
    """A start that failed: a cluster member re-executed after a storage failure whose disk
    failed again waits and tries again (FAILED_STARTS_MAX in a row); anything else exits."""
    tries = failed_starts() + 1
    if settings.clustered and disk and RESTARTED_ENV in os.environ:
        if tries <= FAILED_STARTS_MAX:
            return restart_when_room(settings, f"its start failed again: {error}", tries)
        log.critical("node %s: %d starts in a row failed on its disk; giving up", settings.node_id, tries)
    print(f"maxq-server: {error}", file=sys.stderr)
    return code


def restart_when_room(settings: Settings, failure: str, failed_starts_now: int) -> int:
    """Fail-stop's second half: wait until the data folder has room and takes a test write, then
    start this process again (exec: same pid, same arguments, every file and thread of this life
    gone), telling it how many starts in a row failed. Returns only on giving up (75,
    EX_TEMPFAIL) or a signal (0)."""
    needed = RESTART_FREE_BYTES_MIN + (settings.disk_free_limit_mb << 20)
    stopped_at = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.critical(
        "node %s stopped (%s); it starts again from its files once %s has %d MiB free",
        settings.node_id,
        failure,
        settings.data_dir,
        needed >> 20,
    )
    logged_at = stopped_at
    write_failed_before = False
    try:
        while True:  # bounded by RESTART_WAIT_S_MAX; each turn sleeps
            now = time.monotonic()
            free = disk_free_bytes(settings.data_dir)
            write_error = None
            if free >= needed and now - stopped_at >= RESTART_DELAY_S:
                write_error = write_probe_error(settings.data_dir)
                if write_error is None:
                    break
            if now - stopped_at >= RESTART_WAIT_S_MAX:
                log.critical(
                    "node %s: the disk did not recover in %.0f s; giving up", settings.node_id, now - stopped_at
                )
                return 75
            first_write_failure = write_error is not None and not write_failed_before
            write_failed_before |= first_write_failure
            if first_write_failure or now - logged_at >= RESTART_LOG_EVERY_S:
                logged_at = now
                if write_error is not None:
                    log.warning(
                        "node %s still waits: a test write in %s failed: %s",
                        settings.node_id,
                        settings.data_dir,
                        write_error,
                    )
                else:
                    log.warning(
                        "node %s still waits for room: %d MiB free in %s, %d MiB wanted",
                        settings.node_id,
                        free >> 20,
                        settings.data_dir,
                        needed >> 20,
                    )
            time.sleep(1.0)
    except KeyboardInterrupt:
        return 0
    log.warning("node %s starts again (%d MiB free)", settings.node_id, disk_free_bytes(settings.data_dir) >> 20)
    os.environ[RESTARTED_ENV] = "1"
    os.environ[FAILED_STARTS_ENV] = str(failed_starts_now)
    return start_again()


def write_probe_error(data_dir: str) -> str | None:
    """None when a small file can be written, fsynced and removed in `data_dir`; else the error.
    Free space alone does not say a disk works again: one whose fsync fails (EIO) has room."""
    path = os.path.join(data_dir, WRITE_PROBE_NAME)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return exc.strerror or str(exc)
    error = None
    # Every step runs (the file is closed and removed whatever failed); the first error is kept.
    steps = (lambda: os.write(fd, bytes(WRITE_PROBE_BYTES)), lambda: os.fsync(fd), lambda: os.close(fd))
    for step in (*steps, lambda: os.unlink(path)):
        try:
            step()
        except OSError as exc:
            error = error or exc.strerror or str(exc)
    return error


def start_again() -> int:
    """Execute this process again: same pid, same arguments, every file and thread of this life gone."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
