"""Data folders written by earlier versions open with this one (issue #23, format versions).

Each `tests/upgrade/fixtures/*.tar.gz` is a single node's data folder that
`scripts/make_data_fixture.py` wrote with the code of its time (the `.json` beside it says which
commit, which format versions, and what the folder must hold). A release adds its own and keeps the
older ones, so every later version is tested against every earlier folder. Each is opened by a
real node of this checkout and read back with pika and the admin API: the definitions export, every
queue's messages in order, unacked deliveries redelivered, a dead letter's x-death, the
deduplication window, a user's password; then the node is restarted on the folder it has now
written to, and it opens again.
"""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

import pika
import pytest

from ..helpers import api

FIXTURES = Path(__file__).parent / "fixtures"
GET_TIMEOUT_S = 10.0
AT_LEAST_ONCE_COPIES_MAX = 5  # a dead letter performed again by each leader of its shard during a restart


def manifest_of(archive: Path) -> dict:
    return json.loads(archive.with_name(archive.name.removesuffix(".tar.gz") + ".json").read_text())


CASES = sorted(FIXTURES.glob("*.tar.gz"))
SINGLE_NODE = [case for case in CASES if not manifest_of(case)["members"]]
CLUSTER = [case for case in CASES if manifest_of(case)["members"]]


def name_of(archive: Path) -> str:
    return archive.name.removesuffix(".tar.gz")


def test_there_are_folders_to_open() -> None:
    # The parametrized tests below would pass by running nothing if the fixtures went missing.
    assert SINGLE_NODE and CLUSTER, f"no single-node or no cluster data folders under {FIXTURES}"


def unpack(archive: Path, into: Path) -> dict:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return manifest_of(archive)


def comparable(definitions: dict) -> dict[str, list[str]]:
    """The export's item lists, each item as canonical JSON (versions and product names differ)."""
    return {
        key: sorted(json.dumps(item, sort_keys=True) for item in value)
        for key, value in definitions.items()
        if isinstance(value, list)
    }


def holds(newer: object, older: object) -> bool:
    """Whether `newer` has everything `older` has: a later version may add fields to an item."""
    if isinstance(older, dict):
        return isinstance(newer, dict) and all(k in newer and holds(newer[k], v) for k, v in older.items())
    return newer == older


def check_definitions(node, expected: dict) -> None:
    status, now, _ = api(node, "GET", "/api/definitions")
    assert status == 200
    for key, items in expected.items():
        if not isinstance(items, list):
            continue
        found = now.get(key, [])
        assert len(found) == len(items), f"{key}: {len(found)} now, {len(items)} written"
        for item in items:
            assert any(holds(candidate, item) for candidate in found), f"{key}: {item} is gone"


def drain(
    node, name: str, spec: dict, copies_max: int = 1
) -> list[tuple[bytes, pika.spec.Basic.GetOk, pika.BasicProperties]]:
    """Every message of the queue, up to `copies_max` of each expected one, and one more: nothing may follow."""
    credentials = pika.PlainCredentials(spec.get("user", "guest"), spec.get("password", "guest"))
    params = pika.ConnectionParameters("127.0.0.1", node.amqp_port, spec["vhost"], credentials, heartbeat=0)
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        got = []
        deadline = time.monotonic() + GET_TIMEOUT_S
        for _ in range(len(spec["bodies"]) * copies_max + 1):
            method, props, body = channel.basic_get(name, auto_ack=True)
            while method is None and len(got) < len(spec["bodies"]) and time.monotonic() < deadline:
                time.sleep(0.05)  # (a restart redelivers unacked messages as it reads its queues)
                method, props, body = channel.basic_get(name, auto_ack=True)
            if method is None:
                break
            got.append((body, method, props))
        return got
    finally:
        connection.close()


def check_queue(node, name: str, spec: dict, killed: bool) -> None:
    at_least_once = killed and "x_death" in spec
    got = drain(node, name, spec, copies_max=AT_LEAST_ONCE_COPIES_MAX if at_least_once else 1)
    bodies = [body.decode() for body, _, _ in got]
    if at_least_once:
        # Dead lettering is at-least-once (docs/queue-features.md): a node killed between the
        # target's enqueue and the source's DeadLettered dead-letters that message again.
        assert sorted(set(bodies)) == sorted(spec["bodies"]), name
    elif spec["ordered"]:
        assert bodies == spec["bodies"], name
    else:
        assert sorted(bodies) == sorted(spec["bodies"]), name
    if spec.get("redelivered"):
        assert all(method.redelivered for _, method, _ in got), f"{name}: unacked before the stop, not redelivered"
    if "x_death" in spec:
        for _, _, props in got:
            death = props.headers["x-death"][0]
            assert death["queue"] == spec["x_death"]["queue"] and death["reason"] == spec["x_death"]["reason"]


def check_dedup_window(node, name: str, spec: dict) -> None:
    """The ids published before the stop are still in the window: a retry of one is dropped."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port, heartbeat=0))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for known in spec["dedup_known_ids"]:
            props = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": known})
            channel.basic_publish("", name, b"retry", props)  # confirmed, and dropped
        props = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": "after-upgrade"})
        channel.basic_publish("", name, b"new", props)
        assert channel.queue_declare(name, passive=True).method.message_count == 1
        method, _props, body = channel.basic_get(name, auto_ack=True)
        assert body == b"new"
    finally:
        connection.close()


def check_everything(node, manifest: dict) -> None:
    check_definitions(node, manifest["definitions"])
    for name, spec in manifest["queues"].items():
        check_queue(node, name, spec, killed=manifest["made_by"]["stopped_by"] == "SIGKILL")
        if "dedup_known_ids" in spec:
            check_dedup_window(node, name, spec)


def check_empty(node, manifest: dict) -> None:
    check_definitions(node, manifest["definitions"])
    for name, spec in manifest["queues"].items():
        status, queue, _ = api(node, "GET", f"/api/queues/{'%2F' if spec['vhost'] == '/' else spec['vhost']}/{name}")
        assert status == 200 and queue["messages"] == 0, (name, queue)


@pytest.mark.parametrize("archive", SINGLE_NODE, ids=name_of)
def test_an_earlier_versions_data_folder_opens_with_everything_in_it(start_broker, tmp_path, archive: Path) -> None:
    data_dir = tmp_path / "data"
    manifest = unpack(archive, data_dir)
    node = start_broker(data_dir=data_dir)
    check_everything(node, manifest)
    # The folder, now written to by this version, opens again and holds what is left: nothing.
    node.stop()
    check_empty(start_broker(data_dir=data_dir), manifest)


@pytest.mark.parametrize("archive", CLUSTER, ids=name_of)
def test_an_earlier_versions_cluster_folders_open_with_everything_in_them(tmp_path, archive: Path) -> None:
    """The members' Raft journals, group snapshots and stores; started on new ports (a member's
    peers are given on its command line, not read from its folder)."""
    from ..cluster.conftest import running_cluster

    manifest = unpack(archive, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == manifest["members"] == ["n1", "n2", "n3"]
    with running_cluster(tmp_path) as cluster:
        check_everything(cluster["n1"], manifest)
        cluster.restart("n2")
        check_empty(cluster["n2"], manifest)


def test_a_later_versions_store_is_refused_with_both_versions_named(start_broker, tmp_path) -> None:
    """A folder written by a newer format than this code reads is refused at start, untouched."""
    from rocksdict import Options, Rdict

    from maxq_raft.storage.records import encode_value
    from maxq_raft.storage.rocks import _FORMAT_KEY, FORMAT_VERSION, META_CF

    data_dir = tmp_path / "data"
    unpack(SINGLE_NODE[0], data_dir)
    later = str(int(FORMAT_VERSION) + 1).encode()
    db = Rdict(str(data_dir / "store"), Options(raw_mode=True))
    meta = db.get_column_family(META_CF)
    meta[_FORMAT_KEY] = encode_value(_FORMAT_KEY, later)
    meta.close()
    db.close()
    before = raw_contents(data_dir / "store")
    assert len(before["default"]) >= 50 and before["meta"]  # (the messages and the queues' counters)
    with pytest.raises(RuntimeError) as refused:
        start_broker(data_dir=data_dir)
    assert f"store format {later!r}, this build reads format {FORMAT_VERSION!r}" in str(refused.value)
    assert str(data_dir / "store") in str(refused.value)
    # (RocksDB's own open may move its write-ahead log into a table file: the same keys and values.)
    assert raw_contents(data_dir / "store") == before


def raw_contents(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every column family's keys and values, read with rocksdict directly (the fixtures are small)."""
    from rocksdict import Options, Rdict

    db = Rdict(str(path), Options(raw_mode=True))
    try:
        names = Rdict.list_cf(str(path), Options(raw_mode=True))
        contents = {}
        for name in names:
            family = db.get_column_family(name)
            contents[name] = list(family.items())
            if name != "default":
                family.close()
        return contents
    finally:
        db.close()
