"""Definitions export and import (maxq_raft/http/definitions.py), pure: a machine exported and
imported into a fresh one is the same machine; a RabbitMQ 3.10 export imports; a bad document is
refused whole, naming its first bad item."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.http import definitions as defs
from maxq_raft.machines import access
from maxq_raft.machines import metadata as md
from maxq_raft.machines.queue_types import Rejected

FIXTURE = Path(__file__).with_name("rabbitmq-3.10-definitions.json")
REAL_EXPORT = Path(__file__).with_name("rabbitmq-3.10.8-export.json")


def rabbitmq_310() -> dict:
    return json.loads(FIXTURE.read_text())


def apply_all(machine: md.MetadataMachine, commands: list) -> md.MetadataMachine:
    for command in commands:
        reply, _ = machine.apply(None, command)  # type: ignore[arg-type]
        assert type(reply) is not Rejected, (command, reply)
    return machine


def imported(document: Any, onto: md.MetadataMachine | None = None) -> md.MetadataMachine:
    machine = onto or md.MetadataMachine()
    return apply_all(machine, defs.import_commands(document, onto))


def picture(m: md.MetadataMachine) -> dict:
    """What definitions carry, comparable: users, vhosts with their permissions, limits,
    policies, exchanges, (non-exclusive) queues and bindings."""
    return {
        "users": {u.name: (u.password_hash, u.hashing_algorithm, sorted(u.tags), u.limits) for u in m.users.values()},
        "vhosts": {
            name: {
                "permissions": {u: (p.configure, p.write, p.read) for u, p in v.permissions.items()},
                "topic": {u: {x: (t.write, t.read) for x, t in by.items()} for u, by in v.topic_permissions.items()},
                "limits": v.limits,
                "policies": {p.name: (p.pattern, p.definition, p.priority, p.apply_to) for p in v.policies.values()},
                "exchanges": {
                    x.name: (x.type, x.durable, x.auto_delete, x.internal, x.arguments)
                    for x in v.exchanges.values()
                    if not x.builtin
                },
                "queues": {
                    q.name: (q.durable, q.auto_delete, q.arguments)
                    for q in v.queues.values()
                    if q.exclusive_owner is None
                },
                "bindings": sorted(
                    json.dumps(b, sort_keys=True)
                    for b in m.bindings(name)
                    if b[1] == "exchange" or v.queues[b[2]].exclusive_owner is None
                ),
            }
            for name, v in m.vhosts.items()
        },
    }


def roundtrip(m: md.MetadataMachine) -> md.MetadataMachine:
    document = json.loads(json.dumps(defs.export_definitions(m, "test")))  # through JSON, as on the wire
    return imported(document)


# ---------------------------------------------------------------------------- RabbitMQ 3.10


def test_a_rabbitmq_310_export_imports() -> None:
    m = imported(rabbitmq_310())
    assert set(m.vhosts) == {"/", "orders"}
    assert m.users["orders-app"].password_matches("orders-secret")
    assert m.users["watcher"].password_matches("watcher-pass") and m.users["watcher"].tags == [
        "monitoring",
        "management",
    ]
    assert m.users["guest"].password_matches("guest")
    assert m.users["orders-app"].limits == {"max-connections": 20}
    assert m.vhosts["orders"].limits == {"max-queues": 100, "max-connections": 200}
    assert m.permission("orders", "orders-app").allows("write", "orders.events")
    assert not m.permission("orders", "watcher").allows("configure", "orders.x")
    assert m.vhosts["orders"].topic_permissions["orders-app"]["orders.events"].write == "^order\\."
    created = m.queue("orders", "orders.created")
    assert created is not None and created.arguments["x-queue-type"] == "quorum" and created.durable
    assert m.exchange("orders", "orders.events").type == "topic"
    assert m.exchange("orders", "orders.audit-fanout").internal
    # topic -> queue, topic -> fanout -> queue (e2e), topic -> headers -> queue (binding arguments)
    assert sorted(m.route("orders", "orders.events", "order.created", {"region": "eu"})) == [
        "orders.audit",
        "orders.created",
        "orders.eu",
    ]
    assert m.route("orders", "orders.events", "order.cancelled", {"region": "us"}) == ["orders.audit"]
    assert m.route("/", "amq.topic", "tasks.urgent", None) == ["tasks"]
    assert m.policy_for("orders", "orders.dead").definition["overflow"] == "reject-publish"
    assert m.effective_arguments("/", "tasks")["x-message-ttl"] == 86400000
    # skipped as RabbitMQ skips them: the server-named queue (and so its binding)
    assert "amq.gen-JzTY20BRgKO-HjmUJj0wLg" not in m.vhosts["/"].queues
    # and what it exports imports again to the same
    assert picture(roundtrip(m)) == picture(m)


def test_a_real_rabbitmq_3_10_8_export_imports() -> None:
    # `rabbitmqctl export_definitions` of a RabbitMQ 3.10.8 node (scripts/bench_brokers) after
    # rabbitmqctl add_vhost/add_user/set_permissions/set_topic_permissions/set_policy/
    # set_vhost_limits and pika declares: its vhosts[].limits are [name, value] pairs.
    m = imported(json.loads(REAL_EXPORT.read_text()))
    assert set(m.vhosts) == {"/", "shop"} and m.vhosts["shop"].limits == {"max-queues": 100}
    assert m.users["app"].password_matches("app-pass") and m.users["app"].tags == ["monitoring"]
    assert m.permission("shop", "app") == access.Permission("^app\\.", ".*", ".*")
    assert m.vhosts["shop"].topic_permissions["app"]["amq.topic"].write == "^orders\\."
    assert m.queue("shop", "app.orders").arguments == {"x-delivery-limit": 5, "x-queue-type": "quorum"}
    assert m.route("shop", "app.events", "orders.1", None) == ["app.orders"]
    assert m.route("shop", "app.events", "routed.x", None) == ["app.audit"]  # e2e, then its alternate exchange
    assert m.policy_for("shop", "app.audit").definition == {"max-length": 1000, "message-ttl": 60000}
    assert picture(roundtrip(m)) == picture(m)


def test_importing_the_same_file_twice_changes_nothing() -> None:
    m = imported(rabbitmq_310())
    before = picture(m)
    imported(rabbitmq_310(), onto=m)
    assert picture(m) == before


# ------------------------------------------------------------------------- export's shape


def test_export_leaves_out_what_rabbitmq_leaves_out() -> None:
    m = imported(rabbitmq_310())
    apply_all(
        m,
        [
            md.DeclareQueue("/", "mine", False, False, True, False, {}, "conn-1"),  # exclusive
            md.Bind("/", "amq.direct", "mine", False, "k", {}, "conn-1"),
        ],
    )
    doc = defs.export_definitions(m, "9.9")
    assert doc["rabbit_version"] == doc["rabbitmq_version"] == defs.RABBITMQ_FORMAT_VERSION
    assert (doc["product_name"], doc["product_version"]) == ("MaxQ-Raft", "9.9")
    assert {q["name"] for q in doc["queues"] if q["vhost"] == "/"} == {"tasks", "cache-refresh"}  # transient too
    assert not [x for x in doc["exchanges"] if x["name"] == "" or x["name"].startswith("amq.")]
    assert not [b for b in doc["bindings"] if b["destination"] == "mine"]
    assert {"source": "amq.topic", "vhost": "/", "destination": "tasks", "destination_type": "queue"}.items() <= next(
        b for b in doc["bindings"] if b["source"] == "amq.topic"
    ).items()
    assert doc["parameters"] == [
        {
            "vhost": "orders",
            "component": "vhost-limits",
            "name": "limits",
            "value": {"max-queues": 100, "max-connections": 200},
        }
    ]
    for key, fields in {
        "users": {"name", "password_hash", "hashing_algorithm", "tags", "limits"},
        "vhosts": {"name"},
        "permissions": {"user", "vhost", "configure", "write", "read"},
        "topic_permissions": {"user", "vhost", "exchange", "write", "read"},
        "policies": {"vhost", "name", "pattern", "apply-to", "definition", "priority"},
        "queues": {"name", "vhost", "durable", "auto_delete", "arguments"},
        "exchanges": {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"},
        "bindings": {"source", "vhost", "destination", "destination_type", "routing_key", "arguments"},
    }.items():
        assert doc[key] and all(set(item) == fields for item in doc[key]), key


def test_per_vhost_export_and_import() -> None:
    m = imported(rabbitmq_310())
    doc = defs.export_vhost_definitions(m, "orders", "1")
    assert set(doc) == {
        "rabbit_version",
        "rabbitmq_version",
        "product_name",
        "product_version",
        "parameters",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    }
    assert all("vhost" not in item for key in ("queues", "exchanges", "bindings") for item in doc[key])
    assert {q["name"] for q in doc["queues"]} == {"orders.created", "orders.audit", "orders.dead", "orders.eu"}
    # into another vhost: everything lands there, whatever the items say
    target = apply_all(md.MetadataMachine(), [md.PutVhost("copy")])
    apply_all(target, defs.import_commands(json.loads(json.dumps(doc)), target, vhost="copy"))
    assert picture(target)["vhosts"]["copy"]["queues"] == picture(m)["vhosts"]["orders"]["queues"]
    assert picture(target)["vhosts"]["copy"]["bindings"] == picture(m)["vhosts"]["orders"]["bindings"]
    assert target.vhosts["copy"].limits == m.vhosts["orders"].limits
    with pytest.raises(KeyError):
        defs.export_vhost_definitions(m, "nope", "1")


# ------------------------------------------------------------------------------- leniency


def test_older_and_newer_shapes_import() -> None:
    doc = {
        "rabbit_version": "3.5.7",  # before 3.6: a hash without an algorithm is MD5
        "users": [
            {
                "name": "old",
                "password_hash": access.hash_password("pw", algorithm=access.MD5),
                "tags": "administrator,management",
            },
            {"name": "clear", "password": "s3cret", "tags": ""},
        ],
        "vhosts": [{"name": "v", "description": "", "tags": [], "metadata": {}, "limits": []}],
        "queues": [
            {"name": "q", "vhost": "v", "type": "quorum", "durable": True, "auto_delete": False, "arguments": []}
        ],
        "exchanges": [
            {"name": "", "vhost": "v", "type": "direct"},
            {"name": "amq.direct", "vhost": "v", "type": "direct"},
        ],
        "bindings": [{"source": "", "vhost": "v", "destination": "q", "destination_type": "queue", "routing_key": "q"}],
        "shovels": "keys nobody here knows are ignored",
    }
    m = imported(doc)
    assert m.users["old"].hashing_algorithm == access.MD5 and m.users["old"].password_matches("pw")
    assert m.users["old"].tags == ["administrator", "management"]
    assert m.users["clear"].password_matches("s3cret") and "s3cret" not in m.users["clear"].password_hash
    assert m.queue("v", "q").arguments == {"x-queue-type": "quorum"}


# -------------------------------------------------------------------------------- refusals


def _with(change) -> dict:
    doc = rabbitmq_310()
    change(doc)
    return doc


BAD = {
    "not an object": ([], "a definitions document is a JSON object"),
    "a category not a list": (_with(lambda d: d.update(queues={})), "'queues' must be an array"),
    "an item not an object": (_with(lambda d: d["vhosts"].append("x")), "vhosts[2]: an item must be a JSON object"),
    "a bad queue argument": (
        _with(lambda d: d["queues"][2]["arguments"].update({"x-max-length": -1})),
        "queues[2] (queue 'orders.dead' in vhost 'orders'): invalid arg 'x-max-length'",
    ),
    "a stream": (
        _with(lambda d: d["queues"][0]["arguments"].update({"x-queue-type": "stream"})),
        "'stream' is not supported",
    ),
    "a policy key we lack": (
        _with(lambda d: d["policies"][0]["definition"].update({"ha-mode": "all"})),
        "policies[0] (policy 'orders-bounded' in vhost 'orders'): Validation failed",
    ),
    "a bad hash": (_with(lambda d: d["users"][1].update(password_hash="nope")), "users[1] (user 'orders-app')"),
    "a bad pattern": (
        _with(lambda d: d["permissions"][2].update(read="(")),
        "permissions[2] (permissions of user 'orders-app' in vhost 'orders')",
    ),
    "a shovel": (
        _with(lambda d: d["parameters"].append({"vhost": "/", "component": "shovel", "name": "s", "value": {}})),
        "parameters[1] (parameter 'shovel' in vhost '/'): runtime parameters of component 'shovel'",
    ),
    "a binding to nothing": (
        _with(lambda d: d["bindings"][0].update(destination="missing")),
        "bindings[0] (binding of queue 'missing' to exchange 'orders.events' in vhost 'orders'): no queue 'missing'",
    ),
    "an unknown exchange type": (
        _with(lambda d: d["exchanges"][0].update(type="x-consistent-hash")),
        "exchanges[0] (exchange 'orders.events' in vhost 'orders'): unknown exchange type",
    ),
    "a permission in a vhost not there": (
        _with(lambda d: d["permissions"][0].update(vhost="elsewhere")),
        "permissions[0] (permissions of user 'guest' in vhost 'elsewhere'): no vhost 'elsewhere'",
    ),
    "durable not a boolean": (
        _with(lambda d: d["queues"][1].update(durable="yes")),
        "queues[1]: 'durable' must be true or false",
    ),
    "over max-queues": (
        _with(lambda d: d["parameters"][0]["value"].update({"max-queues": 2})),
        "queues[2] (queue 'orders.dead' in vhost 'orders'): cannot declare queue 'orders.dead': queue limit",
    ),
    "an unstorable value": (
        _with(lambda d: d["exchanges"][0]["arguments"].update({"huge": 1 << 70})),
        "exchanges[0] (exchange 'orders.events' in vhost 'orders'): Validation failed",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_document_is_refused_naming_its_first_bad_item(case: str) -> None:
    document, text = BAD[case]
    with pytest.raises(defs.DefinitionsError) as refused:
        defs.import_commands(copy.deepcopy(document))
    assert text in str(refused.value)


def test_a_queue_inequivalent_to_one_there_is_refused_before_anything_is_applied() -> None:
    m = imported(rabbitmq_310())
    apply_all(m, [md.DeclareQueue("/", "work", False, True, False, False, {"x-max-length": 5}, "")])
    before = picture(m)
    doc = _with(
        lambda d: d["queues"].append(
            {"name": "work", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {"x-max-length": 6}}
        )
    )
    with pytest.raises(
        defs.DefinitionsError, match=r"queues\[7\] \(queue 'work' in vhost '/'\): inequivalent arg 'x-max-length'"
    ):
        defs.import_commands(doc, m)
    assert picture(m) == before  # only read
    # On a fresh machine the same document is fine: it is the existing queue that differs.
    imported(doc)


def test_the_dry_run_sees_the_current_state() -> None:
    m = apply_all(md.MetadataMachine(), [md.DeleteUser("guest"), md.PutVhost("v")])
    doc = {
        "vhosts": [{"name": "v"}],
        "permissions": [{"user": "guest", "vhost": "v", "configure": "", "write": "", "read": ""}],
    }
    with pytest.raises(defs.DefinitionsError, match="no user 'guest'"):
        defs.import_commands(doc, m)
    defs.import_commands(doc)  # a fresh machine has guest


# ------------------------------------------------------------------------------ round trip

names = st.text(alphabet="abcdefgh.-_", min_size=1, max_size=8).filter(lambda n: not n.startswith("amq."))
queue_arguments = st.fixed_dictionaries(
    {},
    optional={
        "x-message-ttl": st.integers(0, 10**6),
        "x-max-length": st.integers(0, 1000),
        "x-queue-type": st.sampled_from(["classic", "quorum"]),
        "x-single-active-consumer": st.booleans(),
        "x-max-priority": st.integers(1, 10),
    },
)


@st.composite
def machines(draw) -> md.MetadataMachine:
    m = md.MetadataMachine()
    vhosts = ["/", *draw(st.lists(names, max_size=2, unique=True))]
    users = draw(st.lists(names, max_size=3, unique=True))
    commands: list = []
    for user in users:
        tags = draw(st.lists(st.sampled_from(access.TAGS), max_size=2, unique=True))
        commands.append(md.PutUser(user, access.hash_password(user, salt=b"salt"), access.SHA256, tags))
        if draw(st.booleans()):
            commands.append(md.SetLimits("user", user, {"max-channels": draw(st.integers(0, 100))}))
    for vhost in vhosts:
        commands.append(md.PutVhost(vhost))
        for user in users:
            if draw(st.booleans()):
                commands.append(md.SetPermissions(vhost, user, ".*", draw(st.sampled_from(["", "^a"])), ".*"))
            if draw(st.booleans()):
                commands.append(md.SetTopicPermissions(vhost, user, draw(names), "^x", ".*"))
        if draw(st.booleans()):
            commands.append(md.SetLimits("vhost", vhost, {"max-connections": draw(st.integers(0, 100))}))
        exchanges = draw(st.lists(names, max_size=3, unique=True))
        for name in exchanges:
            kind = draw(st.sampled_from(["direct", "fanout", "topic", "headers"]))
            commands.append(
                md.DeclareExchange(vhost, name, kind, False, draw(st.booleans()), False, draw(st.booleans()), {})
            )
        queues = draw(st.lists(names, max_size=3, unique=True))
        for name in queues:
            exclusive = draw(st.booleans())
            commands.append(
                md.DeclareQueue(
                    vhost, name, False, draw(st.booleans()), exclusive, draw(st.booleans()), draw(queue_arguments), "c1"
                )
            )
        if draw(st.booleans()):
            commands.append(
                md.SetPolicy(
                    vhost, draw(names), "^a", {"max-length": draw(st.integers(0, 9))}, draw(st.integers(0, 5)), "queues"
                )
            )
        sources = exchanges + ["amq.topic", "amq.fanout"]
        for _ in range(draw(st.integers(0, 4))):
            to_exchange = bool(exchanges) and draw(st.booleans())
            if not queues and not to_exchange:
                continue
            destination = draw(st.sampled_from(exchanges if to_exchange else queues))
            commands.append(
                md.Bind(vhost, draw(st.sampled_from(sources)), destination, to_exchange, draw(names), {}, "c1")
            )
    for command in commands:
        m.apply(None, command)  # type: ignore[arg-type]  # (a refusal, e.g. a headers binding's key, is fine)
    return m


@settings(max_examples=60, deadline=None)
@given(machines())
def test_export_then_import_gives_the_same_machine(m: md.MetadataMachine) -> None:
    copy_ = roundtrip(m)
    assert picture(copy_) == picture(m)
    # and importing it again onto the copy (declares, binds, users: all already there) changes nothing
    imported(json.loads(json.dumps(defs.export_definitions(m, "t"))), onto=copy_)
    assert picture(copy_) == picture(m)
