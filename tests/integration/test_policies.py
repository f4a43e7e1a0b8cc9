"""Policies through maxqctl and pika: `maxqctl set-policy` / `clear-policy` and the admin API.

References: RabbitMQ's parameters.md "Policies": a policy matches queue names by a regular
expression and applies its definition (message-ttl, max-length, dead-letter-exchange, ...) to
every matching queue, existing or future; of several matching, the highest priority applies; a
queue's own arguments win over its policy; policies survive restarts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pika
import pytest

from ..helpers import GUEST_AUTH, drain, get_one

pytestmark = pytest.mark.timeout(90)

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def maxqctl(broker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{broker.http_port}", *args], capture_output=True, text=True, timeout=30
    )


def fill(channel, name: str, n: int) -> None:
    for i in range(n):
        channel.basic_publish("", name, b"%d" % i)


@pytest.fixture
def prefix(broker):
    """A pattern of this test's own, and its policies cleared afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = []
    yield tag, names
    for name in names:
        maxqctl(broker, "clear-policy", name)


def test_policy_applies_to_matching_queues_new_and_existing(env, broker, prefix):
    tag, names = prefix
    channel = env.channel()
    existing, other = env.queue_name(f"pol-{tag}"), env.queue_name(f"none-{tag}")
    channel.queue_declare(existing)
    channel.queue_declare(other)
    fill(channel, existing, 5)
    names.append(f"limit-{tag}")
    result = maxqctl(broker, "set-policy", f"limit-{tag}", f"^pol-{tag}", '{"max-length": 2}', "--apply-to", "queues")
    assert result.returncode == 0, result.stderr
    assert channel.queue_declare(existing, passive=True).method.message_count == 2  # dropped at once
    later = env.queue_name(f"pol-{tag}")
    channel.queue_declare(later)
    fill(channel, later, 5)
    fill(channel, other, 5)
    assert drain(channel, later) == [b"3", b"4"]
    assert len(drain(channel, other)) == 5  # does not match
    listed = json.loads(maxqctl(broker, "--json", "list", "policies").stdout)
    assert {
        "name": f"limit-{tag}",
        "pattern": f"^pol-{tag}",
        "definition": {"max-length": 2},
        "priority": 0,
        "apply-to": "queues",
        "vhost": "/",
    } in listed


def test_queue_arguments_win_over_the_policy(env, broker, prefix):
    tag, names = prefix
    names.append(f"limit-{tag}")
    assert maxqctl(broker, "set-policy", f"limit-{tag}", f"^arg-{tag}", '{"max-length": 1}').returncode == 0
    channel = env.channel()
    name = env.queue_name(f"arg-{tag}")
    channel.queue_declare(name, arguments={"x-max-length": 3})
    fill(channel, name, 5)
    assert drain(channel, name) == [b"2", b"3", b"4"]


def test_highest_priority_policy_applies_and_clearing_restores(env, broker, prefix):
    tag, names = prefix
    names += [f"low-{tag}", f"high-{tag}"]
    assert (
        maxqctl(broker, "set-policy", f"low-{tag}", f"^prio-{tag}", '{"max-length": 1}', "--priority", "1").returncode
        == 0
    )
    assert (
        maxqctl(broker, "set-policy", f"high-{tag}", f"prio-{tag}", '{"max-length": 2}', "--priority", "5").returncode
        == 0
    )
    channel = env.channel()
    name = env.queue_name(f"prio-{tag}")
    channel.queue_declare(name)
    fill(channel, name, 4)
    assert channel.queue_declare(name, passive=True).method.message_count == 2
    assert maxqctl(broker, "clear-policy", f"high-{tag}").returncode == 0
    assert channel.queue_declare(name, passive=True).method.message_count == 1  # the low one now
    assert maxqctl(broker, "clear-policy", f"low-{tag}").returncode == 0
    fill(channel, name, 4)
    assert channel.queue_declare(name, passive=True).method.message_count == 5  # no limit any more


def test_policy_dead_letter_and_ttl(env, broker, prefix):
    tag, names = prefix
    channel = env.channel()
    dead = env.queue_name(f"dead-{tag}")
    channel.queue_declare(dead)
    names.append(f"dlx-{tag}")
    definition = json.dumps({"message-ttl": 50, "dead-letter-exchange": "", "dead-letter-routing-key": dead})
    assert maxqctl(broker, "set-policy", f"dlx-{tag}", f"^ttl-{tag}", definition).returncode == 0
    name = env.queue_name(f"ttl-{tag}")
    channel.queue_declare(name)
    channel.basic_publish("", name, b"m")
    method, props, body = get_one(channel, dead, 10, auto_ack=True)
    assert props.headers["x-death"][0]["reason"] == "expired" and props.headers["x-death"][0]["queue"] == name


@pytest.mark.parametrize(
    "definition, error",
    [
        ('{"max-length": -1}', "{value_negative,-1}"),
        ('{"no-such-key": 1}', "are not recognised policy settings"),
        ('{"max-priority": 5}', "are not recognised policy settings"),
    ],
)
def test_bad_policies_are_refused(broker, definition, error):
    result = maxqctl(broker, "set-policy", "bad", ".*", definition)
    assert result.returncode == 4 and error in result.stderr
    result = maxqctl(broker, "set-policy", "bad", "(", '{"max-length": 1}')
    assert result.returncode == 4 and "not a valid regular expression" in result.stderr


def test_clearing_a_missing_policy_is_404(broker):
    result = maxqctl(broker, "clear-policy", "no-such-policy")
    assert result.returncode == 4 and "404" in result.stderr


def test_policies_survive_a_restart(start_broker):
    broker = start_broker()
    assert maxqctl(broker, "set-policy", "keep", "^kept", '{"max-length": 1}').returncode == 0
    assert maxqctl(broker, "set-operator-policy", "cap", "^capped", '{"max-length": 2}').returncode == 0
    broker.stop()
    broker = start_broker(data_dir=broker.data_dir)
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{broker.http_port}/api/policies", headers=GUEST_AUTH), timeout=5
    ) as response:
        assert [p["name"] for p in json.load(response)] == ["keep"]
    assert [p["name"] for p in json.loads(maxqctl(broker, "--json", "list", "operator-policies").stdout)] == ["cap"]
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("kept-q")
    fill(channel, "kept-q", 3)
    assert drain(channel, "kept-q") == [b"2"]
    channel.queue_declare("capped-q")
    fill(channel, "capped-q", 3)
    assert drain(channel, "capped-q") == [b"1", b"2"]
    connection.close()


def put_policy(broker, name: str, raw_json: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}/api/policies/%2F/{name}",
        data=raw_json,
        method="PUT",
        headers={"Content-Type": "application/json", **GUEST_AUTH},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize(
    "raw_json",
    [
        b'{"pattern": ".*", "definition": {"max-length": 1}, "priority": 1000000000000000000000000000000}',
        b'{"pattern": ".*", "definition": {"max-length": 100000000000000000000000}}',
        b'{"pattern": "\\ud800", "definition": {"max-length": 1}}',
    ],
)
def test_a_policy_no_log_can_store_is_refused_and_leaves_no_hole(start_broker, raw_json):
    """Before the fix the value reached the metadata log after its index was taken: 500, and a
    node that refused to start ("metadata log entry N missing") and failed --check."""
    broker = start_broker()
    status, text = put_policy(broker, "huge", raw_json)
    assert status == 400, (status, text)
    assert maxqctl(broker, "set-policy", "after", "^after", '{"max-length": 2}').returncode == 0
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{broker.http_port}/api/policies", headers=GUEST_AUTH), timeout=5
    ) as response:
        assert [p["name"] for p in json.load(response)] == ["after"]
    assert broker.stop() == 0
    check = subprocess.run(
        [sys.executable, "-m", "maxq_raft", "--check", "--data-dir", str(broker.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    broker = start_broker(data_dir=broker.data_dir)
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{broker.http_port}/api/policies", headers=GUEST_AUTH), timeout=5
    ) as response:
        assert [p["name"] for p in json.load(response)] == ["after"]


def test_a_catastrophic_pattern_cannot_freeze_the_node(env, broker, prefix):
    """`^(a+)+$` against a 40-character name ran for hours with Python's `re`, on every member
    and again at each restart; patterns are matched by RE2 now (machines/policy_pattern.py)."""
    tag, names = prefix
    names.append("redos")
    assert maxqctl(broker, "set-policy", "redos", "^(a+)+$", '{"max-length": 1}').returncode == 0
    channel = env.channel()
    slow = "a" * 40 + "!"  # no match: the backtracking worst case
    fits = "a" * 200  # a match: the policy applies
    for name in (slow, fits):
        env.queues.append(name)
        channel.queue_declare(name)
        fill(channel, name, 3)
    assert len(drain(channel, slow)) == 3
    assert drain(channel, fits) == [b"2"]


@pytest.mark.parametrize("pattern", [r"(?=a)b", r"(a)\1", "("])
def test_a_pattern_rabbitmq_might_take_but_re2_cannot_is_refused_before_the_log(start_broker, pattern):
    broker = start_broker()
    status, text = put_policy(broker, "p", json.dumps({"pattern": pattern, "definition": {"max-length": 1}}).encode())
    assert status == 400 and "is not a valid regular expression" in text, (status, text)
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{broker.http_port}/api/overview", headers=GUEST_AUTH), timeout=5
    ) as response:
        overview = json.load(response)
    assert broker.stop() == 0
    check = subprocess.run(
        [sys.executable, "-m", "maxq_raft", "--check", "--data-dir", str(broker.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert overview is not None


def test_an_operator_policy_caps_what_users_chose(env, broker, prefix):
    """rabbitmqctl set_operator_policy's limits: the lower of the operator policy's value and the
    queue's own argument (or its policy's) applies; clearing it gives the users' back. Only an
    administrator may set one, and only its limit keys."""
    tag, names = prefix
    channel = env.channel()
    own, by_policy = env.queue_name(f"ops-{tag}-own"), env.queue_name(f"ops-{tag}-pol")
    channel.queue_declare(own, arguments={"x-max-length": 10})
    channel.queue_declare(by_policy)
    names.append(f"user-{tag}")
    assert maxqctl(broker, "set-policy", f"user-{tag}", f"^ops-{tag}-pol", '{"max-length": 1}').returncode == 0
    result = maxqctl(broker, "set-operator-policy", f"cap-{tag}", f"^ops-{tag}", '{"max-length": 3}')
    try:
        assert result.returncode == 0, result.stderr
        fill(channel, own, 6)
        fill(channel, by_policy, 6)
        assert channel.queue_declare(own, passive=True).method.message_count == 3  # 3 < its own 10
        assert channel.queue_declare(by_policy, passive=True).method.message_count == 1  # its policy's 1 < 3
        listed = json.loads(maxqctl(broker, "--json", "list", "operator-policies").stdout)
        assert {
            "vhost": "/",
            "name": f"cap-{tag}",
            "pattern": f"^ops-{tag}",
            "apply-to": "queues",
            "definition": {"max-length": 3},
            "priority": 0,
        } in listed
        refused = maxqctl(broker, "set-operator-policy", f"bad-{tag}", ".*", '{"dead-letter-exchange": "x"}')
        assert refused.returncode != 0 and "not recognised operator policy settings" in refused.stderr
        assert f"bad-{tag}" not in maxqctl(broker, "list", "operator-policies").stdout
    finally:
        assert maxqctl(broker, "clear-operator-policy", f"cap-{tag}").returncode == 0
    fill(channel, own, 6)
    assert channel.queue_declare(own, passive=True).method.message_count == 9  # its own 10 again
    assert maxqctl(broker, "clear-operator-policy", f"cap-{tag}").returncode != 0  # gone: 404
