"""Damaged stores: the server refuses them with a message an operator can act on, and `--check`
finds the damage offline.

A sound data folder is made once by a real broker (a durable queue of persistent messages,
stopped, started and stopped again so that RocksDB has written its SST files) and copied for
each case, which then damages its copy: RocksDB's own files (an SST truncated or with its footer
overwritten, CURRENT or MANIFEST garbled) or MaxQ's checksummed records (a message or counters
value replaced through rocksdict directly). Expected: `maxq-server` exits non-zero, without a
traceback, naming the file or record and what is wrong (3: the store cannot be opened; 1: its
contents cannot be recovered), and `maxq-server --check` exits 1 naming the same.

Damage deep inside a queue (neither its head nor its tail) is found by `--check`, not at start:
start-up reads no messages, so its time does not grow with depth. The broker meets such damage
when it reads there, logs it as CRITICAL and refuses the read (541) rather than deliver garbage;
what lies before the damage is delivered.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from rocksdict import Options, Rdict

from maxq_raft.storage.records import pack_key
from maxq_raft.storage.rocks import RocksSegmentStore

from ..conftest import BrokerProcess, free_port

pytestmark = pytest.mark.timeout(60)

MAXQ_SERVER = str(Path(sys.executable).parent / "maxq-server")
RUN_TIMEOUT_S = 15.0
MESSAGES = 3000
QUEUE = "q"


@pytest.fixture(scope="module")
def sound_data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sound")
    data_dir = root / "data"
    server = BrokerProcess(data_dir, root / "server.log").start()
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        for i in range(MESSAGES):
            channel.basic_publish("", QUEUE, b"%d:" % i + bytes(1000), pika.BasicProperties(delivery_mode=2))
        connection.close()
    finally:
        assert server.stop() == 0
    # A second run replays the WAL into an SST file at open.
    server = BrokerProcess(data_dir, root / "server2.log").start()
    assert server.stop() == 0
    return data_dir


@pytest.fixture
def data_dir(sound_data_dir, tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(sound_data_dir, copy)
    return copy


def run_server(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run maxq-server to completion; one that starts (and so never ends) fails the test."""
    command = [
        MAXQ_SERVER,
        "--data-dir",
        str(data_dir),
        "--amqp-port",
        str(free_port()),
        "--http-port",
        "0",
        "--prometheus-port",
        "0",
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXQ_")}
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=str(data_dir.parent)
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"maxq-server {' '.join(args)} did not exit: it started on a damaged store\n{exc.stderr}"
        ) from None


def assert_refused(data_dir: Path, exit_code: int, *words: str) -> None:
    """The server refuses to start, and --check reports, with every one of `words` in the message."""
    result = run_server(data_dir)
    assert result.returncode == exit_code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    check = run_server(data_dir, "--check")
    assert check.returncode == 1, (check.returncode, check.stdout, check.stderr)
    assert "Traceback" not in check.stderr + check.stdout, check.stderr
    for word in words:
        assert word in check.stdout, (word, check.stdout)


def store_dir(data_dir: Path) -> Path:
    return data_dir / "store"


def message_sst(data_dir: Path) -> Path:
    """The largest SST file: the one holding the messages."""
    ssts = sorted(store_dir(data_dir).glob("*.sst"), key=lambda p: p.stat().st_size)
    assert ssts and ssts[-1].stat().st_size > MESSAGES * 1000, [(p.name, p.stat().st_size) for p in ssts]
    return ssts[-1]


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
        f.write(data)


def queue_bounds(data_dir: Path) -> tuple[int, int, int]:
    with RocksSegmentStore(store_dir(data_dir)) as store:
        (queue_id,) = store.queue_ids()
        first, last = store.bounds(queue_id)
    assert (first, last) == (0, MESSAGES - 1)
    return queue_id, first, last


def put_raw(data_dir: Path, key: bytes, value: bytes, column_family: str | None = None) -> None:
    """Write a value as it is, checksum and all, past MaxQ's store (rocksdict directly)."""
    db = Rdict(str(store_dir(data_dir)), Options(raw_mode=True), column_families={"meta": Options(raw_mode=True)})
    try:
        target = db if column_family is None else db.get_column_family(column_family)
        target.put(key, value)
        if target is not db:
            target.close()
        db.flush_wal(True)
    finally:
        db.close()


# ------------------------------------------------------------------------------ sound


def test_check_passes_a_sound_folder_and_the_server_starts_on_it(data_dir, start_broker):
    check = run_server(data_dir, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip().endswith("OK")
    server = start_broker(data_dir=data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
    assert connection.channel().queue_declare(QUEUE, passive=True).method.message_count == MESSAGES
    connection.close()


# ------------------------------------------------------------------- RocksDB's files


def test_truncated_sst_is_refused(data_dir):
    sst = message_sst(data_dir)
    os.truncate(sst, sst.stat().st_size // 2)
    assert_refused(data_dir, 3, str(sst), "Sst file size mismatch")


def test_sst_with_overwritten_footer_is_refused(data_dir):
    sst = message_sst(data_dir)
    overwrite(sst, -16, b"\0" * 16)  # the table's magic number
    assert_refused(data_dir, 3, str(sst), "Bad table magic number")


def test_garbage_current_is_refused(data_dir):
    (store_dir(data_dir) / "CURRENT").write_bytes(b"garbage")
    assert_refused(data_dir, 3, str(store_dir(data_dir)), "CURRENT file")


def test_garbled_manifest_is_refused(data_dir):
    (manifest,) = store_dir(data_dir).glob("MANIFEST-*")
    overwrite(manifest, 64, b"\xff" * 64)
    assert_refused(data_dir, 3, str(manifest), "Corruption")


def test_missing_manifest_is_refused(data_dir):
    (manifest,) = store_dir(data_dir).glob("MANIFEST-*")
    manifest.unlink()
    assert_refused(data_dir, 3, str(manifest), "No such file")


# ------------------------------------------------------------------- MaxQ's records


def test_garbage_message_at_the_head_of_a_queue_is_refused(data_dir):
    queue_id, first, _last = queue_bounds(data_dir)
    put_raw(data_dir, pack_key(queue_id, first), b"\x00\x01garbage")
    assert_refused(data_dir, 1, str(store_dir(data_dir)), f"queue {queue_id} seq {first}", "checksum mismatch")


def test_garbage_message_at_the_tail_of_a_queue_is_refused(data_dir):
    queue_id, _first, last = queue_bounds(data_dir)
    put_raw(data_dir, pack_key(queue_id, last), b"\x00\x01\x02\x03" + b"x" * 100)
    assert_refused(data_dir, 1, f"queue {queue_id} seq {last}", "checksum mismatch")


def test_garbage_queue_counters_are_refused(data_dir):
    queue_id, _first, _last = queue_bounds(data_dir)
    put_raw(data_dir, f"queue-counters/{queue_id}".encode(), b"\xde\xad\xbe\xef" + bytes(24), "meta")
    assert_refused(data_dir, 1, f"meta key 'queue-counters/{queue_id}'", "checksum mismatch")


def test_garbage_metadata_snapshot_is_refused(data_dir):
    put_raw(data_dir, b"metadata/snapshot", b"not a checksum, not msgpack", "meta")
    assert_refused(data_dir, 1, "meta key 'metadata/snapshot'", "checksum mismatch")


def damage_middle_record(data_dir: Path) -> str:
    queue_id, _first, _last = queue_bounds(data_dir)
    put_raw(data_dir, pack_key(queue_id, MESSAGES // 2), b"\x00\x01\x02\x03garbage")
    return f"queue {queue_id} seq {MESSAGES // 2}: checksum mismatch"


def damage_middle_block(data_dir: Path) -> str:
    sst = message_sst(data_dir)
    overwrite(sst, sst.stat().st_size // 2, b"\xde\xad" * 8)
    return "block checksum mismatch"


@pytest.mark.parametrize("damage", [damage_middle_record, damage_middle_block])
def test_damage_inside_a_queue_is_found_by_check_and_logged_when_read(data_dir, start_broker, damage):
    what = damage(data_dir)
    check = run_server(data_dir, "--check")
    assert check.returncode == 1 and what in check.stdout, check.stdout
    if damage is damage_middle_block:
        assert message_sst(data_dir).name in check.stdout
    # Start-up reads no messages past the head and tail, so it starts; the read is refused.
    server = start_broker(data_dir=data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
    channel = connection.channel()
    delivered = []
    with pytest.raises(ChannelClosedByBroker) as refused:
        for _ in range(MESSAGES):
            _method, _props, body = channel.basic_get(QUEUE, auto_ack=True)
            delivered.append(body.split(b":")[0])
    assert refused.value.reply_code == 541 and what in refused.value.reply_text, refused.value
    # What lies before the damage (up to a scan of a few MiB before it) is delivered, in order.
    assert 0 < len(delivered) < MESSAGES // 2
    assert delivered == [b"%d" % i for i in range(len(delivered))]
    assert "CRITICAL" in server.log_text() and what in server.log_text(), server.log_text()
    connection.close()
