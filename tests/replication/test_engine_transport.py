"""The replication port: msgpack only, HMAC-authenticated peers, a MAC on every frame, the
configured address only.

Codec tests run on bytes; port tests run a real ReplicationNode in this process and talk to
its port with a raw socket (handshake built from wire.py's helpers, or deliberately wrong).
"""

from __future__ import annotations

import logging
import pickle
import socket
import time
from pathlib import Path

import msgpack
import pytest

from maxq_raft.replication import wire
from maxq_raft.replication.engine import ReplicationNode
from maxq_raft.replication.frame_mac import MAC_BYTES, FrameMac, frame_key

from ..conftest import free_port
from ..helpers import wait_until

pytestmark = pytest.mark.timeout(30)

SECRET = b"the-cluster-secret"


class Evil:
    """Unpickling this creates a file: proof that network bytes reached pickle.loads."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# -------------------------------------------------------------------------------- codec


def roundtrip(msg: dict) -> dict:
    return wire.decode_raft(wire.encode_raft("g", msg, {}))[1]


def test_every_message_type_roundtrips():
    msgs = [
        {"type": "request_vote", "term": 3, "last_log_index": 10, "last_log_term": 2},
        {"type": "response_vote", "term": 3},
        {"type": "timeout_now", "term": 3},
        {"type": "next_node_idx", "next_node_idx": 11, "reset": False, "success": True, "term": 3},
        {
            "type": "append_entries",
            "term": 3,
            "commit_index": 5,
            "prevLogIdx": 4,
            "prevLogTerm": 2,
            "entries": [[b"\x04abc", 5, 3], [b"\x01", 6, 3]],
        },
    ]
    for m in msgs:
        assert roundtrip(m) == m


def test_membership_entries_travel_as_msgpack_and_are_pickled_again_locally():
    cmd = wire.membership_command("add", "n4", ("127.0.0.1", 7000))
    msg = {
        "type": "append_entries",
        "term": 2,
        "commit_index": 1,
        "prevLogIdx": 1,
        "prevLogTerm": 0,
        "entries": [(cmd, 2, 2)],
    }
    body = wire.encode_raft("g", msg, {})
    assert b"pysyncobj" not in body and b"RaftNode" not in body  # no pickle on the wire
    got = wire.decode_raft(body)[1]["entries"][0][0]
    assert wire.membership_of(got) == ("add", "n4", ("127.0.0.1", 7000))


@pytest.mark.parametrize("kind", [wire.CMD_REGULAR, wire.CMD_VERSION, wire.CMD_MEMBERSHIP, 9])
def test_pickles_in_entries_are_refused(tmp_path, kind):
    evil = bytes([kind]) + pickle.dumps(Evil(tmp_path / "pwned"))
    body = msgpack.packb(["g", 3, 1, 1, 1, 0, [[evil, 2, 1]]])
    with pytest.raises(wire.WireError):
        wire.decode_raft(body)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "body",
    [
        pickle.dumps({"type": "append_entries", "term": 1}),  # what stock pysyncobj sends
        b"\xc1garbage",
        msgpack.packb(["g", 3, True, 1, 1, 0, []]),  # a bool is not a term
        msgpack.packb(["g", 3, -1, 1, 1, 0, []]),
        msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x01x", 2, 1]]]),  # a no-op with a body
        msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x04a", 3, 1]]]),  # not consecutive after prevLogIdx
        msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x04a", 2, 2]]]),  # entry term above the message term
        msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x04a", 2, 1], [b"\x04b", 3, 0]]]),  # terms falling
        msgpack.packb(["g", 99, 1]),
        msgpack.packb({"type": "append_entries"}),
        msgpack.packb(["g", 4, 5, False, True]),  # next_node_idx without a term
    ],
)
def test_malformed_frames_are_refused(body):
    with pytest.raises(wire.WireError):
        wire.decode_raft(body)


@pytest.mark.parametrize(
    "msg",
    [
        {"type": "apply_command", "command": b"x", "request_id": 1},
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 1,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "transmission": "start",
            "data": b"x",
        },
        {"type": "append_entries", "term": 1, "commit_index": 1, "serialized": b"x"},
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 1,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "entries": [(b"\x00" + pickle.dumps((0, ())), 2, 1)],
        },
    ],
)
def test_messages_that_would_need_pickle_are_never_encoded(msg):
    with pytest.raises(wire.WireError):
        wire.encode_raft("g", msg, {})


def test_handshake_helpers():
    hello, nonce_a = wire.server_hello()
    assert wire.parse_server_hello(hello) == nonce_a
    auth, nonce_c = wire.client_auth(SECRET, nonce_a, "n1")
    assert wire.parse_client_auth(auth[:-1], SECRET, nonce_a) is None  # incomplete
    assert wire.parse_client_auth(auth, SECRET, nonce_a) == ("n1", nonce_c, len(auth))
    with pytest.raises(wire.WireError, match="bad HMAC"):
        wire.parse_client_auth(auth, b"wrong", nonce_a)
    with pytest.raises(wire.WireError, match="bad HMAC"):
        wire.parse_client_auth(auth, SECRET, wire.server_hello()[1])  # a replay against a new nonce
    proof = wire.server_proof(SECRET, nonce_a, nonce_c, "n2")
    assert wire.parse_server_proof(proof, SECRET, nonce_a, nonce_c) == ("n2", len(proof))


# ---------------------------------------------------------------------------------- port


@pytest.fixture
def node(tmp_path):
    port = free_port()
    commits: list = []
    n = ReplicationNode(
        node_id="n1",
        raft_addr=("127.0.0.1", port),
        peers={"n2": ("127.0.0.1", free_port())},
        cluster_secret=SECRET,
        data_dir=tmp_path / "n1",
        groups=["g"],
        on_commit=lambda g, es: commits.extend(es),
    )
    n.start()
    try:
        yield n, port
    finally:
        n.stop()


def connect(port: int, host: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection((host, port), timeout=3)
    s.settimeout(3)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def closed_by_peer(s: socket.socket, within_s: float = 3.0) -> bool:
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def handshake(port: int, secret: bytes, node_id: str = "n2") -> tuple[socket.socket, FrameMac]:
    """A connection as peer `node_id` would make it, and the MAC state its frames are signed with."""
    s = connect(port)
    nonce_a = wire.parse_server_hello(recv_exact(s, wire.SERVER_HELLO_BYTES))
    auth, nonce_c = wire.client_auth(secret, nonce_a, node_id)
    s.sendall(auth)
    if secret == SECRET:
        n = recv_exact(s, 1)[0]
        proof = bytes([n]) + recv_exact(s, n + 32)
        assert wire.parse_server_proof(proof, SECRET, nonce_a, nonce_c)[0] == "n1"
    return s, FrameMac(frame_key(secret, nonce_a, nonce_c, node_id, "n1"))


def signed(mac: FrameMac, kind: int, body: bytes) -> bytes:
    """A frame as the transport sends it: header, body, MAC (the next in `mac`'s sequence)."""
    framed = wire.frame(kind, body)
    return framed + mac.sign(framed[:5], body)


def test_a_peer_with_a_wrong_hmac_is_dropped_and_logged(node, caplog):
    n, port = node
    caplog.set_level(logging.WARNING, logger="maxq_raft.replication.transport")
    s, _ = handshake(port, b"not-the-secret")
    try:
        s.sendall(wire.frame(wire.KIND_RAFT, msgpack.packb(["g", 2, 1])))  # never parsed
        assert closed_by_peer(s)
    finally:
        s.close()
    assert n.hub.stats["auth_rejected"] == 1 and n.hub.stats["frames_in"] == 0
    assert any("bad HMAC" in r.getMessage() for r in caplog.records)


def test_garbage_instead_of_a_handshake_is_dropped(node):
    n, port = node
    s = connect(port)
    try:
        recv_exact(s, wire.SERVER_HELLO_BYTES)
        s.sendall(pickle.dumps({"type": "request_vote"}) * 10)
        assert closed_by_peer(s)
    finally:
        s.close()
    assert n.hub.stats["frames_in"] == 0


def test_pickles_from_an_authenticated_peer_never_reach_pickle(node, tmp_path):
    n, port = node
    marker = tmp_path / "pwned"
    evil = pickle.dumps(Evil(marker))
    s, mac = handshake(port, SECRET)
    try:
        for body in (
            msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x00" + evil, 2, 1]]]),
            msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x02" + evil, 2, 1]]]),
            msgpack.packb(["g", 3, 1, 1, 1, 0, [[b"\x03" + evil, 2, 1]]]),
            evil,
        ):
            s.sendall(signed(mac, wire.KIND_RAFT, body))
        assert wait_until(lambda: n.stats["bad_raft_frames"] == 4, 3.0)
    finally:
        s.close()
    assert not marker.exists()
    assert n.status()["g"]["last_index"] == 1  # nothing reached the log


# --------------------------------------------------------------------------- frame MAC

VOTE = msgpack.packb(["g", 1, 7, 0, 0])  # request_vote, term 7: would reach the engine


def test_frame_mac_unit():
    key = frame_key(SECRET, b"a" * 32, b"c" * 32, "n2", "n1")
    assert key != frame_key(SECRET, b"a" * 32, b"c" * 32, "n1", "n2")  # each direction its own key
    assert key != frame_key(SECRET, b"a" * 32, b"d" * 32, "n2", "n1")  # each connection its own key
    sender, receiver = FrameMac(key), FrameMac(key)
    header, body = wire.frame(wire.KIND_RAFT, VOTE)[:5], VOTE
    tags = [sender.sign(header, body) for _ in range(3)]
    assert len(set(tags)) == 3 and all(len(t) == MAC_BYTES for t in tags)  # the number is in the tag
    assert receiver.check(header, body, tags[0])
    assert not receiver.check(header, body, tags[0])  # a replay is frame 1 with frame 0's tag
    for bad_header, bad_body in ((header, VOTE[:-1] + b"\x08"), (header[:4] + bytes([wire.KIND_CONTROL]), body)):
        check = FrameMac(key)
        assert not check.check(bad_header, bad_body, tags[0])


def test_frames_with_their_mac_are_taken(node):
    n, port = node
    s, mac = handshake(port, SECRET)
    try:
        s.sendall(b"".join(signed(mac, wire.KIND_PING, b"") for _ in range(3)))
        assert wait_until(lambda: n.hub.stats["frames_in"] == 3, 3.0)
        assert not closed_by_peer(s, 0.3) and n.hub.stats["mac_rejected"] == 0
    finally:
        s.close()


def _rejected(n, s, caplog, frames_in: int) -> None:
    assert closed_by_peer(s)
    assert n.hub.stats["mac_rejected"] == 1 and n.hub.stats["frames_in"] == frames_in
    assert n.stats["bad_raft_frames"] == 0  # the body never reached the decoder
    assert any("failed its MAC" in r.getMessage() for r in caplog.records)


def test_a_tampered_frame_is_rejected_and_closes_the_connection(node, caplog):
    n, port = node
    caplog.set_level(logging.WARNING, logger="maxq_raft.replication.transport")
    s, mac = handshake(port, SECRET)
    try:
        frame = bytearray(signed(mac, wire.KIND_RAFT, VOTE))
        frame[-MAC_BYTES - 1] ^= 0x01  # the vote's last field
        s.sendall(frame)
        _rejected(n, s, caplog, 0)
    finally:
        s.close()


def test_a_replayed_frame_is_rejected(node, caplog):
    n, port = node
    caplog.set_level(logging.WARNING, logger="maxq_raft.replication.transport")
    s, mac = handshake(port, SECRET)
    try:
        ping = signed(mac, wire.KIND_PING, b"")
        s.sendall(ping + ping)
        _rejected(n, s, caplog, 1)
    finally:
        s.close()


def test_reordered_frames_are_rejected(node, caplog):
    n, port = node
    caplog.set_level(logging.WARNING, logger="maxq_raft.replication.transport")
    s, mac = handshake(port, SECRET)
    try:
        first, second = signed(mac, wire.KIND_PING, b""), signed(mac, wire.KIND_PING, b"")
        s.sendall(second + first)
        _rejected(n, s, caplog, 0)
    finally:
        s.close()


def test_a_frame_from_another_connection_is_rejected(node, caplog):
    n, port = node
    caplog.set_level(logging.WARNING, logger="maxq_raft.replication.transport")
    s1, mac1 = handshake(port, SECRET)
    recorded = signed(mac1, wire.KIND_RAFT, VOTE)  # never sent on its own connection
    s1.close()
    s2, _ = handshake(port, SECRET)
    try:
        s2.sendall(recorded)
        _rejected(n, s2, caplog, 0)
    finally:
        s2.close()


def test_a_member_of_the_previous_wire_version_is_told_so(node, caplog):
    n, port = node
    caplog.set_level(logging.WARNING, logger="maxq_raft.replication.transport")
    s = connect(port)
    try:
        recv_exact(s, wire.SERVER_HELLO_BYTES)
        s.sendall(wire.MAGIC + bytes([1]) + b"\x00" * 40)
        assert closed_by_peer(s)
    finally:
        s.close()
    assert any("every member must run the same version" in r.getMessage() for r in caplog.records)


def test_the_port_is_bound_to_the_configured_address_only(node):
    n, port = node
    assert n.hub.listen_addr == ("127.0.0.1", port)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", port), timeout=1).close()


def test_nodes_with_different_secrets_never_connect(tmp_path):
    ports = {"a": free_port(), "b": free_port()}
    nodes = {
        k: ReplicationNode(
            node_id=k,
            raft_addr=("127.0.0.1", ports[k]),
            peers={o: ("127.0.0.1", p) for o, p in ports.items() if o != k},
            cluster_secret=b"secret-" + k.encode(),
            data_dir=tmp_path / k,
            groups=["g"],
            on_commit=lambda g, es: None,
        )
        for k in ports
    }
    for x in nodes.values():
        x.start()
    try:
        assert wait_until(lambda: all(x.hub.stats["auth_rejected"] > 0 for x in nodes.values()), 5)
        assert not nodes["a"].hub.is_up("b") and not nodes["b"].hub.is_up("a")
        assert nodes["a"].leader("g") is None and nodes["b"].leader("g") is None
    finally:
        for x in nodes.values():
            x.stop()


def idle_from(port: int, source: str) -> socket.socket:
    """A connection from `source` (a loopback address) that reads the hello and then says nothing."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def test_idle_unauthenticated_connections_cannot_keep_a_real_peer_out(node):
    # Before: 64 idle connections to the port (renewed every 2 s as their deadline ran out) made
    # it refuse every new one, real peers included.
    n, port = node
    idle = [idle_from(port, f"127.0.0.{2 + i % 16}") for i in range(80)]  # 16 addresses, 5 each
    try:
        pending = lambda: sum(1 for c in list(n.hub.inc.values()) if c.state == "auth")  # noqa: E731
        assert wait_until(lambda: pending() >= 64, 5), pending()  # every slot is taken
        s, _ = handshake(port, SECRET)  # the peer gets its proof back: it is in
        s.close()
        evicted = n.hub.stats["pending_evicted"]
        idle += [idle_from(port, "127.0.0.99") for _ in range(20)]  # one address: at most 8 wait
        assert wait_until(lambda: n.hub.stats["pending_evicted"] - evicted >= 20 - 8, 5)
        s, _ = handshake(port, SECRET)
        s.close()
    finally:
        for s in idle:
            s.close()


def nodes_on_loopback(tmp_path: Path, settings: dict[str, dict]) -> dict[str, ReplicationNode]:
    """One ReplicationNode per name (not started), each with the others as peers and its own
    keyword settings (groups, features, ...)."""
    ports = {name: free_port() for name in settings}
    return {
        name: ReplicationNode(
            node_id=name,
            raft_addr=("127.0.0.1", ports[name]),
            peers={other: ("127.0.0.1", port) for other, port in ports.items() if other != name},
            cluster_secret=SECRET,
            data_dir=tmp_path / name,
            on_commit=lambda g, es: None,
            **own,
        )
        for name, own in settings.items()
    }


def test_a_peer_with_another_group_list_is_cut_off_from_every_group(tmp_path, caplog):
    # n3 runs three shard groups where n1 and n2 run two (a member started with another --shards,
    # or on a machine with another core count): queues would hash to other groups on it. n1 and
    # n2 go on as a majority; n3 gets nothing of theirs, and each side says why.
    groups = {"n1": ["meta", "shard-0", "shard-1"], "n2": ["meta", "shard-0", "shard-1"]}
    groups["n3"] = ["meta", "shard-0", "shard-1", "shard-2"]
    nodes = nodes_on_loopback(tmp_path, {k: {"groups": g} for k, g in groups.items()})
    for x in nodes.values():
        x.start()
    try:
        cut_off = lambda: (  # noqa: E731
            set(nodes["n1"].mismatched_peers()) == {"n3"}
            and set(nodes["n2"].mismatched_peers()) == {"n3"}
            and set(nodes["n3"].mismatched_peers()) == {"n1", "n2"}
        )
        assert wait_until(cut_off, 10), {k: x.mismatched_peers() for k, x in nodes.items()}
        assert nodes["n1"].mismatched_peers()["n3"] == groups["n3"]
        assert wait_until(lambda: nodes["n1"].leader("meta") in ("n1", "n2"), 15)
        answers: list = []  # one per proposal, in order; a proposal is made once the last is answered

        def committed() -> bool:  # the majority commits without n3 (asked again while no leader is known)
            if len(answers) == proposals[0] and (not answers or answers[-1] == "not leader"):
                proposals[0] += 1
                nodes["n2"].propose("shard-0", b"\x01payload", lambda index, error: answers.append(error))
            return bool(answers) and answers[-1] is None

        proposals = [0]
        assert wait_until(committed, 30), answers
        assert set(answers) <= {None, "not leader"}
        time.sleep(1.0)  # (elections come and go: n3 never learns of a leader, nor leads)
        assert all(nodes["n3"].leader(g) is None for g in groups["n3"])
        assert nodes["n1"].leader("meta") != "n3" and nodes["n2"].leader("shard-0") != "n3"
        assert "n3 runs 4 groups" in caplog.text and "cut off from every group" in caplog.text
    finally:
        for x in nodes.values():
            x.stop()


def test_peers_announce_their_features_with_their_group_list_and_are_forgotten_when_down(tmp_path):
    # machines/features.py: what a peer's code supports travels in its "groups" op; a peer that
    # goes down no longer counts (a feature is enabled only while every member is linked).
    nodes = nodes_on_loopback(
        tmp_path,
        {"n1": {"groups": ["meta"], "features": ["alpha", "beta"]}, "n2": {"groups": ["meta"], "features": ["alpha"]}},
    )
    for x in nodes.values():
        x.start()
    try:
        assert wait_until(lambda: nodes["n1"].peer_features() == {"n2": frozenset({"alpha"})}, 10)
        assert wait_until(lambda: nodes["n2"].peer_features() == {"n1": frozenset({"alpha", "beta"})}, 10)
        nodes["n2"].stop()
        assert wait_until(lambda: nodes["n1"].peer_features() == {}, 15), nodes["n1"].peer_features()
    finally:
        for x in nodes.values():
            x.stop()


def test_a_group_list_without_features_is_an_earlier_release_and_a_bad_feature_list_is_refused(tmp_path):
    node = nodes_on_loopback(tmp_path, {"n1": {"groups": ["meta"], "features": ["alpha"]}})["n1"]  # (not started)
    node._on_control("old", {"op": "groups", "groups": ["meta"]})  # (the hub thread's call, made here)
    assert node.peer_features() == {"old": frozenset()}
    for bad in ("alpha", [1], {"alpha": 1}):
        with pytest.raises(wire.WireError, match="bad feature list"):
            node._on_control("odd", {"op": "groups", "groups": ["meta"], "features": bad})
    assert "odd" not in node.peer_features()


def test_a_restarted_node_numbers_its_requests_apart_from_its_earlier_process(tmp_path):
    """Peers answer a request (a forwarded proposal, a membership step) by node id over whatever
    link is up: a leader's answer to the earlier process's proposal, committed after the
    restart, reaches the new process. Its request ids must not start where the earlier
    process's did (both used to count from 1), or that answer is taken for a request of its
    own, with another entry's index."""

    def first_request_id() -> int:
        node = ReplicationNode(
            node_id="n1",
            raft_addr=("127.0.0.1", free_port()),
            peers={"n2": ("127.0.0.1", free_port())},
            cluster_secret=SECRET,
            data_dir=tmp_path / "n1",
            groups=["g"],
            on_commit=lambda g, es: None,
        )
        return next(node._req_ids)

    firsts = [first_request_id() for _ in range(3)]  # three processes of one node, one data folder
    assert len(set(firsts)) == 3, firsts
    # far apart: a process would have to send billions of requests to reach another's numbers
    assert min(abs(a - b) for a in firsts for b in firsts if a != b) > 2**32, firsts
