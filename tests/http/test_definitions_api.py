"""The definitions routes' import loop (http/definitions_api.py) against a stand-in broker: the
commands go in order, each through `commit`; a cluster that stops committing midway is reported
with the item that stopped the import and how many commands were applied before it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from maxq_raft.http import definitions, definitions_api
from maxq_raft.http.requests import HttpError, Reply, Request
from maxq_raft.machines import metadata as md
from maxq_raft.server.confirms import Unavailable

FIXTURE = Path(__file__).with_name("rabbitmq-3.10-definitions.json")


class StandIn:
    """A single node's metadata machine; from the `fail_at`-th command on, the cluster is gone."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.meta = md.MetadataMachine()
        self.fail_at = fail_at
        self.calls = 0

    def meta_call(self, command, then) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls > self.fail_at:
            then(Unavailable("not leader"))
            return
        then(self.meta.apply(None, command)[0])

    declare_queue = meta_call  # (the queue machine is no business of this test)


def post(broker: StandIn, document: object, vhost: str | None = None) -> Reply:
    request = Request("POST", "/api/definitions", {}, json.dumps(document).encode())
    if vhost is not None:
        request.params = {"name": vhost}
    return trio.run(definitions_api.post, broker, request)


def test_an_import_applies_every_command_in_order_and_answers_204() -> None:
    broker = StandIn()
    document = json.loads(FIXTURE.read_text())
    assert post(broker, document).status == "204 No Content"
    assert broker.calls == len(definitions.import_commands(document))
    assert broker.meta.queue("orders", "orders.created") is not None


def test_a_cluster_that_stops_committing_midway_is_reported_with_what_was_applied() -> None:
    broker = StandIn(fail_at=7)
    with pytest.raises(HttpError) as stopped:
        post(broker, json.loads(FIXTURE.read_text()))
    error = stopped.value
    assert error.status.startswith("503")
    assert error.extra["applied"] == 7 and error.extra["total"] > 7
    assert error.extra["item"].startswith("permissions[")
    assert "7 of" in str(error) and "commands were applied before it" in str(error)


def test_a_refused_document_proposes_nothing() -> None:
    broker = StandIn()
    with pytest.raises(HttpError) as refused:
        post(broker, {"vhosts": [{"name": "v"}], "queues": [{"name": "q", "vhost": "nowhere"}]})
    assert refused.value.status.startswith("400") and "queues[0]" in str(refused.value)
    assert broker.calls == 0
    with pytest.raises(HttpError) as missing:
        post(broker, {}, vhost="nowhere")
    assert missing.value.status.startswith("404")
