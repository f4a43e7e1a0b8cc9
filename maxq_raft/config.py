"""Node settings: defaults < config file (TOML) < MAXQ_* environment variables < command line.

Each setting has one name used everywhere: `--amqp-port`, `MAXQ_AMQP_PORT`, `amqp_port = …` in
the file. Bad values are reported as a `SettingsError` naming the setting and its source.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from . import __version__
from .machines.placement import LOCATORS


class SettingsError(Exception):
    pass


@dataclass
class Settings:
    data_dir: str = "./data"
    amqp_host: str = "127.0.0.1"
    amqp_port: int = 5672
    http_host: str = "127.0.0.1"
    http_port: int = 15672
    # Host names the admin API answers to besides IP literals, localhost and this machine's
    # name (comma-separated; e.g. the name of a proxy in front of it): a DNS-rebinding page
    # reaches the API under its own name, which is refused.
    http_allowed_hosts: str = ""
    # The first administrator of a node whose users were never changed (replaces guest, who can
    # only log in from loopback); the password from default_pass, or the first line of a file.
    default_user: str = ""
    default_pass: str = ""
    default_pass_file: str = ""
    max_connections: int = 0  # AMQP connections this node accepts at once (0: no limit), RabbitMQ's connection_max
    # TLS (docs/security.md): with a certificate, AMQP is also served over TLS on amqps_port and
    # the admin API over HTTPS on https_port (RabbitMQ's 5671 and 15671; 0 disables either).
    tls_cert: str = ""  # PEM certificate chain of this node
    tls_key: str = ""  # PEM private key (default: in the tls_cert file)
    tls_ca: str = ""  # PEM CA bundle that client certificates must chain to
    tls_verify_peer: str = "none"  # none | optional | required (RabbitMQ's fail_if_no_peer_cert)
    tls_min_version: str = "1.2"  # 1.2 or 1.3
    amqps_port: int = 5671
    https_port: int = 15671
    node_id: str = "maxq1"
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    handshake_timeout_s: float = 10.0  # RabbitMQ's handshake_timeout: header to connection.open
    fsync: str = "on"  # "off" skips fsync before confirms (benchmarks only; logged loudly)
    memory_high_watermark_mb: int = 0  # 0: 40 % of the machine's memory, RabbitMQ's default ratio
    disk_free_limit_mb: int = 50  # RabbitMQ's default disk_free_limit
    log_level: str = "info"
    raft_addr: str = ""  # HOST:PORT for Raft traffic; set (or peers given) = a cluster member
    peer: str = ""  # the other members, NAME@HOST:PORT, comma-separated (--peer once per member)
    cluster_secret: str = ""  # shared by the members; authenticates every Raft connection
    shards: int = 0  # data shard groups; 0: cluster.default_shards (two per core, at least two per member)
    # replicas of each shard group, placed at a cluster's first start (all members when fewer; 0:
    # every member holds every group, and a new member joins every group)
    replication_factor: int = 3
    # where a new queue goes without an x-queue-leader-locator argument or policy: "client-local"
    # (a group the declaring member leads; RabbitMQ's default) or "balanced" (its name's hash)
    queue_leader_locator: str = "client-local"
    join: str = "off"  # "on": start as a new member, to be added with `maxqctl add-node`
    snapshot_every_mb: float = 64.0  # a group snapshots its state (and compacts its log) after this much log
    version: str = __version__
    # Prometheus metrics (RabbitMQ's 15692: /metrics, /metrics/per-object) on http_host; 0 disables
    prometheus_port: int = 15692
    # The SQS-compatible endpoint (docs/sqs.md): off unless a port is given; HTTPS with tls_cert.
    sqs_port: int = 0
    sqs_host: str = ""  # default: http_host

    @property
    def clustered(self) -> bool:
        return bool(self.raft_addr or self.peer)

    def peers(self) -> dict[str, tuple[str, int]]:
        out = {}
        for item in filter(None, (p.strip() for p in self.peer.split(","))):
            name, _, addr = item.partition("@")
            out[name] = parse_addr(addr, f"peer {item!r}")
        return out


def parse_addr(text: str, what: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise SettingsError(f"{what}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


CLI_SETTINGS = (
    "data_dir",
    "amqp_host",
    "amqp_port",
    "http_host",
    "http_port",
    "http_allowed_hosts",
    "default_user",
    "default_pass",
    "default_pass_file",
    "max_connections",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "tls_verify_peer",
    "tls_min_version",
    "amqps_port",
    "https_port",
    "node_id",
    "frame_max",
    "channel_max",
    "heartbeat_s",
    "handshake_timeout_s",
    "fsync",
    "memory_high_watermark_mb",
    "disk_free_limit_mb",
    "log_level",
    "raft_addr",
    "peer",
    "cluster_secret",
    "shards",
    "replication_factor",
    "queue_leader_locator",
    "join",
    "snapshot_every_mb",
    "prometheus_port",
    "sqs_port",
    "sqs_host",
)
CLUSTER_FRAME_MAX = 262144
SHARDS_MAX = 1024  # --shards, and the count a data folder holds (server/shard_count.py)
NODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _convert(name: str, raw, source: str):
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if isinstance(raw, (bool, dict, list)) or (kind == "int" and isinstance(raw, float)):
        raise SettingsError(f"{source}: {name} must be {'an integer' if kind == 'int' else 'a ' + kind}, got {raw!r}")
    if kind == "int":
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{source}: {name} must be an integer, got {raw!r}") from None
        if name.endswith("_port") and not 0 <= value <= 65535:
            raise SettingsError(f"{source}: {name} must be a port number 0-65535, got {value}")
        if value < 0:
            raise SettingsError(f"{source}: {name} must not be negative, got {value}")
        return value
    if kind == "float":
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise SettingsError(f"{source}: {name} must be a number, got {raw!r}") from None
        if not value > 0 or value == float("inf"):
            raise SettingsError(f"{source}: {name} must be a positive number, got {raw!r}")
        return value
    if not isinstance(raw, str):
        raise SettingsError(f"{source}: {name} must be a string, got {raw!r}")
    return raw


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maxq-server", description="MaxQ-Raft: an AMQP 0-9-1 broker replicated with Raft."
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings (same names as the options, with _)")
    parser.add_argument("--data-dir", help="folder for this node's data (default ./data)")
    parser.add_argument("--amqp-host", help="address to listen on for AMQP (default 127.0.0.1)")
    parser.add_argument("--amqp-port", help="AMQP port (default 5672)")
    parser.add_argument("--http-host", help="address for the HTTP admin API (default 127.0.0.1)")
    parser.add_argument("--http-port", help="HTTP admin API port (default 15672; 0 disables it)")
    parser.add_argument(
        "--http-allowed-hosts",
        help="host names the admin API answers to besides IP addresses, localhost and this machine's name "
        "(comma-separated)",
    )
    parser.add_argument(
        "--default-user",
        help="first administrator, made on a node whose users were never changed; replaces guest (MAXQ_DEFAULT_USER)",
    )
    parser.add_argument("--default-pass", help="its password (better: MAXQ_DEFAULT_PASS or --default-pass-file)")
    parser.add_argument("--default-pass-file", help="file whose first line is the default user's password")
    parser.add_argument("--max-connections", help="AMQP connections this node accepts at once (default 0: no limit)")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain): serve AMQP over TLS and HTTPS")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (default: in that file)")
    parser.add_argument("--tls-ca", metavar="FILE", help="PEM CA bundle that client certificates must chain to")
    parser.add_argument(
        "--tls-verify-peer",
        help="client certificates: none (default: not asked for), optional (checked when sent; "
        "allows EXTERNAL login) or required (a client without one is refused)",
    )
    parser.add_argument("--tls-min-version", help="oldest TLS version accepted: 1.2 (default) or 1.3")
    parser.add_argument(
        "--amqps-port", help="AMQP over TLS port, on --amqp-host (default 5671 with --tls-cert; 0 disables it)"
    )
    parser.add_argument(
        "--https-port", help="HTTPS admin API port, on --http-host (default 15671 with --tls-cert; 0 disables it)"
    )
    parser.add_argument("--node-id", help="this node's name (default maxq1)")
    parser.add_argument("--frame-max", help="largest frame offered in connection.tune (default 131072)")
    parser.add_argument("--channel-max", help="most channels per connection (default 2047)")
    parser.add_argument("--heartbeat-s", help="heartbeat interval offered, seconds (default 60; 0 disables)")
    parser.add_argument(
        "--handshake-timeout-s", help="seconds a client has from connecting to connection.open (default 10)"
    )
    parser.add_argument("--fsync", help="on (default): a confirm means fsynced; off: no fsync (benchmarks only)")
    parser.add_argument("--memory-high-watermark-mb", help="block publishers above this RSS (default 0: 40%% of RAM)")
    parser.add_argument("--disk-free-limit-mb", help="block publishers when the data disk has less free (default 50)")
    parser.add_argument("--log-level", help="debug, info, warning or error (default info)")
    parser.add_argument(
        "--raft-addr", help="HOST:PORT this node serves Raft on (a cluster member; default: none, a single node)"
    )
    parser.add_argument(
        "--peer",
        action="append",
        metavar="NAME@HOST:PORT",
        help="another cluster member (repeat for each); MAXQ_PEER takes them comma-separated",
    )
    parser.add_argument("--cluster-secret", help="secret shared by the members (or MAXQ_CLUSTER_SECRET)")
    parser.add_argument(
        "--shards",
        help="data shard groups (default 0: two per core at a member's first start, and with --replication-factor "
        "above 0 at least two per member of the cluster; then kept in its data folder); the same on every member",
    )
    parser.add_argument(
        "--replication-factor",
        help="replicas of each shard group, placed at the cluster's first start over the members given with "
        "--peer, the same on every member (default 3, or every member when fewer; 0: every member holds every "
        "group, and a new member joins every group); with --join on, the new member holds no shard group "
        "until `maxqctl rebalance`. A member serves queues of groups it holds no replica of through their leaders",
    )
    parser.add_argument(
        "--queue-leader-locator",
        help="a cluster's default for queues declared without x-queue-leader-locator: client-local (default, as "
        "RabbitMQ's: a group the declaring member leads, else one it holds, so that its clients skip a hop to the "
        "group's leader) or balanced (the queue's group by the hash of its name)",
    )
    parser.add_argument(
        "--snapshot-every-mb",
        help="a cluster member snapshots a group's state and compacts its log "
        "after this many MB of new log (default 64; fractions allowed)",
    )
    parser.add_argument("--join", help="on: start as a new member and wait to be added (maxqctl add-node)")
    parser.add_argument("--check", action="store_true", help="verify the data folder offline and exit (0: sound)")
    parser.add_argument(
        "--repair-from-peers",
        action="store_true",
        help="a cluster member whose data fails its checks moves it aside (damaged-<time>/) and starts empty, "
        "to be installed from the other members after `maxqctl repair-member` (sound data is left alone)",
    )
    parser.add_argument(
        "--prometheus-port",
        help="Prometheus metrics port (/metrics, /metrics/per-object), on --http-host, without credentials "
        "(default 15692; 0 disables it)",
    )
    parser.add_argument(
        "--sqs-port",
        help="port of the SQS-compatible endpoint (AWS JSON 1.0, SigV4 with `maxqctl add-access-key` keys; "
        "HTTPS with --tls-cert; default 0: off)",
    )
    parser.add_argument("--sqs-host", help="address for the SQS endpoint (default: --http-host)")
    return parser


def load_settings(argv: list[str] | None = None, environ: dict | None = None) -> tuple[Settings, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    settings = Settings()
    config_path = args.config or environ.get("MAXQ_CONFIG")
    if config_path:
        path = Path(config_path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SettingsError(f"config file {path} does not exist") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"config file {path}: {exc}") from None
        for key, raw in data.items():
            name = key.replace("-", "_")
            if name not in CLI_SETTINGS:
                raise SettingsError(f"config file {path}: unknown setting {key!r}")
            setattr(settings, name, _convert(name, raw, f"config file {path}"))
    for name in CLI_SETTINGS:
        env_name = "MAXQ_" + name.upper()
        if env_name in environ:
            setattr(settings, name, _convert(name, environ[env_name], f"environment {env_name}"))
    for name in CLI_SETTINGS:
        raw = getattr(args, name)
        if isinstance(raw, list):
            raw = ",".join(raw)
        if raw is not None:
            setattr(settings, name, _convert(name, raw, "--" + name.replace("_", "-")))
    if not NODE_ID.match(settings.node_id):
        raise SettingsError(f"node_id must be 1-64 of letters, digits, '_', '.', '-', got {settings.node_id!r}")
    if settings.join not in ("on", "off"):
        raise SettingsError(f"join must be on or off, got {settings.join!r}")
    if settings.clustered:
        if not settings.raft_addr:
            raise SettingsError("a cluster member needs --raft-addr HOST:PORT")
        parse_addr(settings.raft_addr, "raft_addr")
        for name in settings.peers():
            if not NODE_ID.match(name):
                raise SettingsError(f"peer name {name!r}: use 1-64 of letters, digits, '_', '.', '-'")
        if not settings.cluster_secret:
            raise SettingsError("a cluster member needs --cluster-secret (or MAXQ_CLUSTER_SECRET)")
    if settings.fsync not in ("on", "off"):
        raise SettingsError(f"fsync must be on or off, got {settings.fsync!r}")
    if settings.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"log_level must be debug, info, warning or error, got {settings.log_level!r}")
    if settings.queue_leader_locator not in LOCATORS:
        raise SettingsError(
            f"queue_leader_locator must be one of {', '.join(LOCATORS)}, got {settings.queue_leader_locator!r}"
        )
    if settings.replication_factor < 0:
        raise SettingsError(f"replication_factor must be 0 (every member) or more, got {settings.replication_factor}")
    if settings.shards > SHARDS_MAX:
        raise SettingsError(f"shards must be at most {SHARDS_MAX}, got {settings.shards}")
    for name, most in (("heartbeat_s", 65535), ("channel_max", 65535), ("frame_max", 2**32 - 1)):  # tune's field sizes
        if getattr(settings, name) > most:
            raise SettingsError(f"{name} must be at most {most}, got {getattr(settings, name)}")
    if settings.default_pass_file:
        try:
            with open(settings.default_pass_file, encoding="utf-8") as file:
                settings.default_pass = file.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"default_pass_file {settings.default_pass_file}: {exc}") from None
    if settings.default_user and not settings.default_pass:
        raise SettingsError("default_user needs a password: MAXQ_DEFAULT_PASS, --default-pass or --default-pass-file")
    if settings.default_user:
        from .machines.access import AccessError, check_name

        try:
            check_name(settings.default_user, "user")
        except AccessError as exc:
            raise SettingsError(f"default_user: {exc}") from None
    _check_tls(settings)
    if settings.frame_max and settings.frame_max < 4096:
        raise SettingsError(f"frame_max must be at least 4096 (the AMQP minimum), got {settings.frame_max}")
    if settings.clustered and not 0 < settings.frame_max <= CLUSTER_FRAME_MAX:
        # A message and its properties (one frame at most) go into one Raft log entry of at most 1 MiB.
        raise SettingsError(
            f"a cluster member's frame_max is 4096 to {CLUSTER_FRAME_MAX} (a message and its properties must fit "
            f"one Raft log entry), got {settings.frame_max}"
        )
    return settings, args


def _check_tls(settings: Settings) -> None:
    """The TLS options' values; the files themselves are read (and refused) by server/tls.py."""
    if settings.tls_verify_peer not in ("none", "optional", "required"):
        raise SettingsError(f"tls_verify_peer must be none, optional or required, got {settings.tls_verify_peer!r}")
    if settings.tls_min_version not in ("1.2", "1.3"):
        raise SettingsError(f"tls_min_version must be 1.2 or 1.3, got {settings.tls_min_version!r}")
    if not settings.tls_cert:
        for name in ("tls_key", "tls_ca"):
            if getattr(settings, name):
                raise SettingsError(f"{name} needs tls_cert (the node's certificate)")
        if settings.tls_verify_peer != "none":
            raise SettingsError("tls_verify_peer needs tls_cert (the node's certificate)")
    elif settings.tls_verify_peer != "none" and not settings.tls_ca:
        # Never the system's CAs: any publicly issued certificate would then log in with EXTERNAL.
        raise SettingsError(
            f"tls_verify_peer {settings.tls_verify_peer} needs tls_ca (the CAs client certificates chain to)"
        )
