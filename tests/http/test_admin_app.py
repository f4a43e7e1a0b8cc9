"""The admin app served by hypercorn in this process, on a real socket bound to port 0: a handler
that raises is answered 500 with a JSON body and a log line, and the server (and the connection)
go on serving. The broker here is a stand-in whose every attribute raises: the failure under test."""

from __future__ import annotations

import http.client
import json
import logging

import pytest
import trio

from maxq_raft.http.admin_app import open_admin_listeners, serve_admin

TIMEOUT_S = 10.0


class BrokenBroker:
    """Any use of it fails, as a bug in a view would."""

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"broken: {name}")


class Settings:
    http_port = 0  # a free port, chosen by the kernel
    http_host = "127.0.0.1"


def _two_requests(port: int) -> list[tuple[int, dict, str | None]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    answers = []
    try:
        for _ in range(2):
            connection.request("GET", "/api/overview", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
            response = connection.getresponse()
            answers.append((response.status, json.loads(response.read()), response.getheader("connection")))
    finally:
        connection.close()
    return answers


def test_a_failing_handler_is_a_500_with_json_and_the_server_lives_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="maxq.http")

    async def scenario() -> list[tuple[int, dict, str | None]]:
        sockets = await open_admin_listeners(Settings())
        async with trio.open_nursery() as nursery:
            host, port = (await nursery.start(serve_admin, BrokenBroker(), sockets))[:2]
            assert host == "127.0.0.1" and port > 0
            with trio.fail_after(TIMEOUT_S * 2):
                answers = await trio.to_thread.run_sync(_two_requests, port)
            nursery.cancel_scope.cancel()
        assert all(sock.fileno() == -1 for sock in sockets)  # closed when the server stopped
        return answers

    answers = trio.run(scenario)
    expected = (500, {"error": "internal error (see the node's log)"}, None)
    assert answers == [expected, expected]  # one connection, kept: the second request was served on it
    assert [r.getMessage() for r in caplog.records] == ["admin request GET /api/overview failed"] * 2
    assert all(r.exc_info is not None and "broken: meta" in str(r.exc_info[1]) for r in caplog.records)
