"""`maxq-server`: run one node (a one-member cluster unless peers are given).

Theory of operation: parse settings, lock the data folder so two nodes never share it, then run
the trio shell: an AMQP listener whose handler wraps each connection in a `Session`, the HTTP
admin API, and a signal receiver. SIGTERM/SIGINT close every connection with 320
CONNECTION_FORCED (as RabbitMQ does on shutdown), wait briefly for them to go, and exit 0.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path

import trio

from ..amqp import spec
from ..config import Settings, SettingsError, load_settings
from ..http.admin import serve_admin
from .broker import Broker
from .session import Session

log = logging.getLogger("maxq.server")

SHUTDOWN_GRACE_S = 3.0


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


async def handle_connection(broker: Broker, settings: Settings, stream: trio.SocketStream) -> None:
    try:
        peer_host = stream.socket.getpeername()[0]
    except OSError:
        return
    session = Session(broker, stream, peer_host, settings)
    try:
        await session.run()
    except Exception:  # one connection's bug must never take the node down
        log.exception("connection %s from %s failed", session.id, peer_host)


async def serve(settings: Settings, task_status=trio.TASK_STATUS_IGNORED) -> None:
    broker = Broker(settings.node_id)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(settings.amqp_port, host=settings.amqp_host)
            nursery.start_soon(partial(trio.serve_listeners, partial(handle_connection, broker, settings), listeners))
            amqp_addr = listeners[0].socket.getsockname()
            http_addr = None
            if settings.http_port:
                http_addr = await nursery.start(serve_admin, broker, settings)
            log.info("maxq-server ready: node %s accepting AMQP 0-9-1 on %s:%s%s, data in %s",
                     settings.node_id, amqp_addr[0], amqp_addr[1],
                     f", HTTP admin on {http_addr[0]}:{http_addr[1]}" if http_addr else "", os.path.abspath(settings.data_dir))
            task_status.started((amqp_addr, http_addr, broker))
            async for signum in signals:
                log.info("received %s, shutting down", signal.Signals(signum).name)
                break
            for session in list(broker.sessions.values()):
                session.conn.close(spec.CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'",
                                   now=trio.current_time())
                session.wake()
            with trio.move_on_after(SHUTDOWN_GRACE_S):
                while broker.sessions:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    log.info("maxq-server stopped")


def main(argv: list[str] | None = None) -> int:
    try:
        settings, _args = load_settings(argv)
        lock = lock_data_dir(settings.data_dir)
    except SettingsError as exc:
        print(f"maxq-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trio.run(serve, settings)
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        lock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
