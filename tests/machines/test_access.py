"""Users, passwords, permissions and limits: the pure parts (machines/access.py and the metadata
machine's access commands) and the admin API's tag rules (http/auth.py)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.http import auth
from maxq_raft.machines import access
from maxq_raft.machines import metadata as md
from maxq_raft.machines.queue_types import Meta, Rejected


def test_password_hashes_are_rabbitmqs() -> None:
    # The examples of RabbitMQ's "Credentials and Passwords" guide: SHA-256 (3.6 on) and MD5.
    assert (
        access.hash_password("test12", salt=bytes.fromhex("908DC60A"))
        == "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
    )
    assert access.hash_password("simon", bytes.fromhex("CAD5089B"), access.MD5) == "ytUIm8s3AnKsXQjptplKFytfVxI="
    user = access.UserRecord("u", "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR")
    assert user.password_matches("test12") and not user.password_matches("test13")
    assert not access.UserRecord("u", "").password_matches("")  # no password: no password login


@given(st.text(max_size=40), st.text(max_size=40))
def test_a_hash_matches_its_password_only(password: str, other: str) -> None:
    try:
        password.encode("utf-8")
        other.encode("utf-8")
    except UnicodeEncodeError:
        return
    user = access.UserRecord("u", access.hash_password(password))
    assert user.password_matches(password)
    assert user.password_matches(other) == (other == password)


def test_permission_patterns_match_as_rabbitmqs() -> None:
    p = access.Permission("^app\\.", "", ".*")
    assert p.allows("configure", "app.orders") and not p.allows("configure", "my.app.orders")
    assert not p.allows("write", "anything") and not p.allows("write", "")  # "" is ^$ ...
    assert access.Permission("", "^amq\\.default$", "").allows("write", "")  # ... the default exchange is amq.default
    assert p.allows("read", "x")
    topic = access.TopicPermission("^orders\\.{username}\\.", "{vhost}")
    assert topic.allows("write", "orders.ann.1", {"username": "ann", "vhost": "/"})
    assert not topic.allows("write", "orders.bob.1", {"username": "ann", "vhost": "/"})


def test_bad_access_values_are_refused_before_anything_is_applied() -> None:
    for command in (
        md.PutUser("", "", access.SHA256, []),
        md.PutUser("u\ud800", "", access.SHA256, []),
        md.PutUser("u", "!!", access.SHA256, []),
        md.PutUser("u", base64.b64encode(b"short").decode(), access.SHA256, []),
        md.PutUser("u", "", "rot13", []),
        md.PutUser("u", "", access.SHA256, "administrator"),
        md.PutVhost("x" * 300),
        md.SetPermissions("/", "guest", "(a", ".*", ".*"),
        md.SetPermissions("/", "guest", "(?=a)", ".*", ".*"),  # look-around: RE2 refuses it
        md.SetTopicPermissions("/", "guest", 5, ".*", ".*"),
        md.SetLimits("vhost", "/", {"max-bananas": 1}),
        md.SetLimits("user", "guest", {"max-connections": "1"}),
        md.SetLimits("user", "guest", {"max-connections": 1 << 40}),
        md.SetLimits("node", "guest", {}),
    ):
        refused = md.access_refusal(command)
        assert isinstance(refused, Rejected) and refused.reply_code == 400, command
        machine = md.MetadataMachine()
        reply, _ = machine.apply(Meta(1, 0), command)
        assert type(reply) is Rejected and machine.access_version == 0, command


def apply(machine: md.MetadataMachine, command) -> object:
    reply, effects = machine.apply(Meta(1, 0), command)
    return reply, effects


def test_the_default_user_replaces_guest_once() -> None:
    machine = md.MetadataMachine()
    assert machine.users[md.GUEST].password_matches("guest") and machine.permission("/", md.GUEST)
    assert apply(machine, md.SeedDefaultUser("admin", access.hash_password("pw")))[0] is True
    assert set(machine.users) == {"admin"} and machine.users["admin"].tags == ["administrator"]
    assert machine.permission("/", "admin") == access.Permission(".*", ".*", ".*")
    assert apply(machine, md.SeedDefaultUser("other", access.hash_password("pw")))[0] is False
    assert set(machine.users) == {"admin"}
    # Any user change first: the node counts as set up, and the seed does nothing.
    machine = md.MetadataMachine()
    apply(machine, md.PutUser("bob", access.hash_password("b"), access.SHA256, []))
    assert apply(machine, md.SeedDefaultUser("admin", access.hash_password("pw")))[0] is False
    assert set(machine.users) == {"guest", "bob"}


def test_deleting_a_vhost_deletes_its_queues_and_a_queue_limit_holds() -> None:
    machine = md.MetadataMachine()
    apply(machine, md.PutVhost("v"))
    apply(machine, md.SetLimits("vhost", "v", {"max-queues": 2}))
    for name in ("a", "b"):
        assert not isinstance(
            apply(machine, md.DeclareQueue("v", name, False, True, False, False, {}, "c1"))[0], Rejected
        )
    reply, _ = apply(machine, md.DeclareQueue("v", "c", False, True, False, False, {}, "c1"))
    assert reply == Rejected(406, "cannot declare queue 'c': queue limit in vhost 'v' (2) is reached")
    # a redeclare of an existing queue is not a new one
    assert not isinstance(apply(machine, md.DeclareQueue("v", "a", False, True, False, False, {}, "c1"))[0], Rejected)
    reply, effects = apply(machine, md.DeleteVhost("v"))
    assert reply is True and "v" not in machine.vhosts
    assert [type(e).__name__ for e in effects] == ["QueueDeleted", "QueueDeleted", "VhostDeleted"]
    assert apply(machine, md.DeleteVhost("v"))[0] == Rejected(404, "no vhost 'v'")


def test_deleting_a_user_removes_its_permissions_everywhere() -> None:
    machine = md.MetadataMachine()
    apply(machine, md.PutVhost("v"))
    apply(machine, md.PutUser("u", "", access.SHA256, []))
    apply(machine, md.SetPermissions("v", "u", ".*", ".*", ".*"))
    apply(machine, md.SetTopicPermissions("v", "u", "amq.topic", ".*", ".*"))
    assert apply(machine, md.SetPermissions("v", "nobody", ".*", ".*", ".*"))[0] == Rejected(404, "no user 'nobody'")
    apply(machine, md.DeleteUser("u"))
    assert machine.permission("v", "u") is None and "u" not in machine.vhosts["v"].topic_permissions


def caller(*tags: str) -> auth.Caller:
    return auth.Caller(access.UserRecord("u", access.hash_password("p"), tags=list(tags)))


def test_admin_api_tags_as_rabbitmq_management() -> None:
    assert not caller().has(auth.Need.MANAGEMENT)
    assert caller("management").has(auth.Need.MANAGEMENT)
    assert not caller("management").has(auth.Need.POLICYMAKER)
    assert caller("policymaker").has(auth.Need.POLICYMAKER) and not caller("policymaker").has(auth.Need.MONITORING)
    assert caller("monitoring").has(auth.Need.MONITORING) and not caller("monitoring").has(auth.Need.ADMINISTRATOR)
    assert all(caller("administrator").has(need) for need in auth.Need)


def test_admin_api_login() -> None:
    machine = md.MetadataMachine()
    apply(machine, md.PutUser("app", access.hash_password("pw"), access.SHA256, []))
    apply(machine, md.PutUser("ops", access.hash_password("pw"), access.SHA256, ["monitoring"]))

    def basic(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert auth.authenticate(machine, basic("guest", "guest"), "127.0.0.1").name == "guest"
    assert auth.authenticate(machine, basic("ops", "pw"), "10.0.0.9").name == "ops"
    for header, peer, reason in (
        (None, "127.0.0.1", "Not authorized"),
        ("Bearer x", "127.0.0.1", "only HTTP basic"),
        ("Basic !!!", "127.0.0.1", "malformed"),
        (basic("guest", "nope"), "127.0.0.1", "Login failed"),
        (basic("guest", "guest"), "10.0.0.9", "via localhost"),
    ):
        with pytest.raises(auth.Unauthorized, match=reason):
            auth.authenticate(machine, header, peer)
    with pytest.raises(auth.Forbidden, match="Not management user"):  # known, but without the tag
        auth.authenticate(machine, basic("app", "pw"), "127.0.0.1")


def test_management_users_see_their_vhosts_and_their_own_connections_and_channels() -> None:
    machine = md.MetadataMachine()
    apply(machine, md.PutVhost("mine"))
    apply(machine, md.PutUser("u", "", access.SHA256, ["management"]))
    apply(machine, md.SetPermissions("mine", "u", ".*", ".*", ".*"))
    items = [
        {"vhost": "mine", "name": "q1"},
        {"vhost": "/", "name": "q2"},
        {"vhost": "mine", "peer_host": "1.2.3.4", "user": "other"},
        {"vhost": "mine", "peer_host": "1.2.3.4", "user": "u"},
        {"vhost": "mine", "connection_details": {"name": "n1@1"}, "user": "other"},  # channels
        {"vhost": "mine", "connection_details": {"name": "n1@2"}, "user": "u"},
    ]
    who = auth.Caller(machine.users["u"])
    assert auth.visible(who, machine, items) == [items[0], items[3], items[5]]
    assert auth.visible(auth.Caller(machine.users["guest"]), machine, items) == items
    with pytest.raises(auth.Forbidden, match="User not authorised to access virtual host"):
        auth.check(auth.Caller(access.UserRecord("p", "", tags=["policymaker"])), auth.Need.POLICYMAKER, machine, "/")


# --------------------------------------------------------------------------- access keys


def test_access_keys_belong_to_a_user_and_go_with_it() -> None:
    machine = md.MetadataMachine()
    key_id, secret = access.new_access_key()
    assert key_id.startswith("MQ") and len(key_id) == 20 and key_id.isalnum() and key_id == key_id.upper()
    assert len(secret) == 40
    assert apply(machine, md.PutAccessKey(key_id, "nobody", secret))[0] == Rejected(404, "no user 'nobody'")
    assert apply(machine, md.PutAccessKey(key_id, "guest", secret))[0] is True
    assert machine.access_key_secret(key_id) == secret
    assert type(apply(machine, md.PutAccessKey(key_id, "guest", secret))[0]) is Rejected  # ids are unique
    second = access.new_access_key()
    assert apply(machine, md.PutAccessKey(second[0], "guest", second[1]))[0] is True
    third = access.new_access_key()
    refused = apply(machine, md.PutAccessKey(third[0], "guest", third[1]))[0]
    assert type(refused) is Rejected and "most a user may have" in refused.reply_text
    assert apply(machine, md.DeleteAccessKey(second[0]))[0] is True
    assert apply(machine, md.DeleteAccessKey(second[0]))[0] == Rejected(404, f"no access key '{second[0]}'")
    assert apply(machine, md.DeleteUser("guest"))[0] is True
    assert machine.access_keys == {} and machine.access_key_secret(key_id) is None


@pytest.mark.parametrize(
    "command",
    [
        md.PutAccessKey("short", "guest", "s" * 40),
        md.PutAccessKey("MQ" + "a" * 18, "guest", "s" * 40),  # lower case
        md.PutAccessKey("MQ" + "A" * 18, "guest", "s" * 39),
        md.PutAccessKey("MQ" + "A" * 18, "guest", "s" * 39 + "!"),
        md.PutAccessKey("MQ" + "A" * 18, "", "s" * 40),
        md.PutAccessKey(7, "guest", "s" * 40),
        md.DeleteAccessKey(None),
    ],
)
def test_malformed_access_keys_are_refused_before_and_on_apply(command) -> None:
    assert type(md.access_refusal(command)) is Rejected
    machine = md.MetadataMachine()
    assert type(apply(machine, command)[0]) is Rejected
    assert machine.access_keys == {}


def test_set_queue_arguments_changes_only_sqs_arguments_and_the_ttl() -> None:
    machine = md.MetadataMachine()
    apply(machine, md.DeclareQueue("/", "q", False, True, False, False, {"x-max-length": 5}, ""))
    reply, effects = apply(
        machine, md.SetQueueArguments("/", "q", {"x-sqs-visibility-timeout": 9, "x-message-ttl": 1000})
    )
    assert reply is True and effects == [md.PolicyChanged("/")]  # the queue's settings are recomputed
    assert machine.queue("/", "q").arguments == {
        "x-max-length": 5,
        "x-sqs-visibility-timeout": 9,
        "x-message-ttl": 1000,
    }
    for refused in (
        md.SetQueueArguments("/", "q", {"x-max-length": 1}),  # AMQP's own arguments stay as declared
        md.SetQueueArguments("/", "q", {"x-message-ttl": -1}),
        md.SetQueueArguments("/", "q", "not a table"),
    ):
        assert type(apply(machine, refused)[0]) is Rejected
    assert apply(machine, md.SetQueueArguments("/", "nope", {}))[0] == Rejected(404, "no queue 'nope' in vhost '/'")
    assert machine.queue("/", "q").arguments["x-max-length"] == 5


def test_set_queue_arguments_removes_those_named_with_no_value() -> None:
    # (SQS SetQueueAttributes with an empty RedrivePolicy: its arguments go, the others stay)
    machine = md.MetadataMachine()
    redrive = {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dlq",
        "x-delivery-limit": 1,
        "x-sqs-redrive-policy": "{}",
    }
    apply(machine, md.DeclareQueue("/", "q", False, True, False, False, {"x-max-length": 5, **redrive}, ""))
    reply, effects = apply(machine, md.SetQueueArguments("/", "q", {**dict.fromkeys(redrive), "x-sqs-absent": None}))
    assert reply is True and effects == [md.PolicyChanged("/")]
    assert machine.queue("/", "q").arguments == {"x-max-length": 5}
    refused = apply(machine, md.SetQueueArguments("/", "q", {"x-max-length": None}))[0]
    assert type(refused) is Rejected and machine.queue("/", "q").arguments == {"x-max-length": 5}
