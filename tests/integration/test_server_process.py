"""The `maxq-server` process: entry points, the ready line, signals, settings and their sources,
and clean refusals (bad settings, busy ports, a data folder in use). Every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import PROTOCOL_HEADER, FrameReader, encode_method_frame

from ..conftest import free_port

READY_TIMEOUT_S = 15.0
EXIT_TIMEOUT_S = 10.0
MAXQ_SERVER = str(Path(sys.executable).parent / "maxq-server")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXQ_")}
    env.update(extra)
    return env


class Server:
    """A server process started by a test; killed at the end if still running."""

    def __init__(self, command: list[str], tmp_path: Path, env: dict | None = None) -> None:
        self.log_path = tmp_path / f"server-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        # cwd outside the repo: the repo root must not be on sys.path (docs/design.md §1).
        self.proc = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(tmp_path),
            env=env if env is not None else clean_env(),
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.text().splitlines():
                if "maxq-server ready" in line:
                    return line
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"not ready after {READY_TIMEOUT_S}s:\n{self.text()}")

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(EXIT_TIMEOUT_S)
        self._log.close()


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []

    def start(args: list[str], env: dict | None = None, module: bool = False) -> Server:
        command = [sys.executable, "-m", "maxq_raft", *args] if module else [MAXQ_SERVER, *args]
        server = Server(command, tmp_path, env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def run_server(args: list[str], tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a server that is expected to refuse to start."""
    return subprocess.run(
        [MAXQ_SERVER, *args],
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S,
        cwd=str(tmp_path),
        env=env if env is not None else clean_env(),
    )


def ports_args(tmp_path: Path, name: str = "data") -> tuple[int, list[str]]:
    port = free_port()
    return port, [
        "--data-dir",
        str(tmp_path / name),
        "--amqp-port",
        str(port),
        "--http-port",
        str(free_port()),
        "--prometheus-port",
        "0",
    ]


def raw_open(port: int) -> tuple[socket.socket, FrameReader]:
    """A raw client with an open connection (heartbeats off)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    reader = FrameReader(0)
    sock.sendall(PROTOCOL_HEADER)
    sock.sendall(
        encode_method_frame(
            0,
            spec.ConnectionStartOk(
                client_properties={}, mechanism="PLAIN", response=b"\x00guest\x00guest", locale="en_US"
            ),
        )
    )
    sock.sendall(encode_method_frame(0, spec.ConnectionTuneOk(channel_max=10, frame_max=131072, heartbeat=0)))
    sock.sendall(encode_method_frame(0, spec.ConnectionOpen(virtual_host="/")))
    methods = read_methods(sock, reader, until=spec.ConnectionOpenOk)
    assert isinstance(methods[-1], spec.ConnectionOpenOk), methods
    return sock, reader


def offered_tune(port: int) -> spec.ConnectionTune:
    """The connection.tune the server offers a client that logs in."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(PROTOCOL_HEADER)
        sock.sendall(
            encode_method_frame(
                0,
                spec.ConnectionStartOk(
                    client_properties={}, mechanism="PLAIN", response=b"\x00guest\x00guest", locale="en_US"
                ),
            )
        )
        methods = read_methods(sock, FrameReader(0), until=spec.ConnectionTune)
    assert isinstance(methods[-1], spec.ConnectionTune), methods
    return methods[-1]


def read_methods(sock: socket.socket, reader: FrameReader, until, timeout_s: float = 5.0) -> list:
    deadline = time.monotonic() + timeout_s
    methods: list = []
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        if not data:
            break
        reader.feed(data)
        for frame_type, _channel, payload in reader.read_frames():
            if frame_type == spec.FRAME_METHOD:
                methods.append(spec.decode_method(payload))
                if isinstance(methods[-1], until):
                    return methods
    return methods


# ---------------------------------------------------------------------- entry points, signals


@pytest.mark.parametrize("module, signum", [(False, signal.SIGTERM), (True, signal.SIGINT)])
def test_entry_point_starts_and_signal_closes_clients_with_320(servers, tmp_path, module, signum):
    port, args = ports_args(tmp_path)
    server = servers(args, module=module)
    ready = server.wait_ready()
    assert f"accepting AMQP 0-9-1 on 127.0.0.1:{port}" in ready
    # One raw client that answers the close, and one pika client.
    sock, reader = raw_open(port)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=port, connection_attempts=1, socket_timeout=5))
    try:
        connection.channel()
        sent_at = time.monotonic()
        server.proc.send_signal(signum)
        [close] = read_methods(sock, reader, until=spec.ConnectionClose)
        assert close.reply_code == spec.CONNECTION_FORCED
        assert close.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        sock.sendall(encode_method_frame(0, spec.ConnectionCloseOk()))
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.2)
        assert info.value.reply_code == 320
        assert server.wait_exit() == 0
        assert time.monotonic() - sent_at < 3.0, "clients answered; the server must not wait out its grace"
    finally:
        sock.close()
        if connection.is_open:
            connection.close()
    text = server.text()
    assert f"received {signal.Signals(signum).name}, shutting down" in text and "maxq-server stopped" in text
    assert "Traceback" not in text


def test_shutdown_does_not_wait_forever_for_a_silent_client(servers, tmp_path):
    port, args = ports_args(tmp_path)
    server = servers(args)
    server.wait_ready()
    sock, _reader = raw_open(port)  # never answers the close
    half_open = socket.create_connection(("127.0.0.1", port), timeout=5)  # never sends the header
    try:
        sent_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait_exit() == 0
        assert time.monotonic() - sent_at < 6.0
    finally:
        sock.close()
        half_open.close()
    assert "Traceback" not in server.text()


# ----------------------------------------------------------------------------- settings


def test_settings_from_file_env_and_command_line(servers, tmp_path):
    file_port, env_port, cli_port = free_port(), free_port(), free_port()
    config = tmp_path / "maxq.toml"
    config.write_text(
        f'amqp_port = {file_port}\nhttp_port = 0\nnode_id = "from-file"\ndata-dir = "{tmp_path / "d1"}"\n'
        f'heartbeat_s = 7\nlog_level = "debug"\n'
    )
    # The file alone.
    server = servers(["--config", str(config)])
    line = server.wait_ready()
    assert f"node from-file accepting AMQP 0-9-1 on 127.0.0.1:{file_port}" in line and "HTTP admin" not in line
    assert str(tmp_path / "d1") in line
    assert offered_tune(file_port).heartbeat == 7  # the file's heartbeat_s
    sock, _reader = raw_open(file_port)  # logged at debug level only
    sock.close()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    assert "DEBUG maxq.session" in server.text()  # the file's log_level
    # Environment over the file (MAXQ_CONFIG names the file, too).
    env = clean_env(MAXQ_CONFIG=str(config), MAXQ_AMQP_PORT=str(env_port), MAXQ_NODE_ID="from-env")
    server = servers([], env=env)
    assert f"node from-env accepting AMQP 0-9-1 on 127.0.0.1:{env_port}" in server.wait_ready()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    # The command line over both.
    server = servers(
        ["--config", str(config), "--amqp-port", str(cli_port), "--data-dir", str(tmp_path / "d2")], env=env
    )
    line = server.wait_ready()
    assert f"node from-env accepting AMQP 0-9-1 on 127.0.0.1:{cli_port}" in line and str(tmp_path / "d2") in line
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0


@pytest.mark.parametrize(
    "args, env, config, message",
    [
        (["--amqp-port", "abc"], {}, None, "--amqp-port: amqp_port must be an integer, got 'abc'"),
        (["--amqp-port", "70000"], {}, None, "amqp_port must be a port number 0-65535, got 70000"),
        (["--heartbeat-s", "-1"], {}, None, "heartbeat_s must not be negative"),
        (["--heartbeat-s", "70000"], {}, None, "heartbeat_s must be at most 65535"),
        (["--frame-max", "100"], {}, None, "frame_max must be at least 4096"),
        (["--handshake-timeout-s", "0"], {}, None, "handshake_timeout_s must be a positive number"),
        (["--log-level", "loud"], {}, None, "log_level must be debug, info, warning or error"),
        ([], {"MAXQ_HTTP_PORT": "x"}, None, "environment MAXQ_HTTP_PORT: http_port must be an integer"),
        ([], {}, "bogus = 1\n", "unknown setting 'bogus'"),
        ([], {}, 'amqp_port = "5672"\nheartbeat_s = true\n', "heartbeat_s must be an integer, got True"),
        ([], {}, "amqp_port = [\n", "config file"),
        (["--config", "/nonexistent/maxq.toml"], {}, None, "config file /nonexistent/maxq.toml does not exist"),
        (["--no-such-option"], {}, None, "unrecognized arguments: --no-such-option"),
    ],
)
def test_bad_settings_exit_non_zero_with_a_clear_message(tmp_path, args, env, config, message):
    if config is not None:
        path = tmp_path / "bad.toml"
        path.write_text(config)
        args = [*args, "--config", str(path)]
    result = run_server(["--data-dir", str(tmp_path / "data"), "--http-port", "0", *args], tmp_path, clean_env(**env))
    assert result.returncode == 2, result
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("which", ["amqp", "http", "prometheus"])
def test_port_in_use_exits_non_zero(tmp_path, which):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    try:
        amqp_port = busy_port if which == "amqp" else free_port()
        http_port = busy_port if which == "http" else free_port()
        prometheus_port = busy_port if which == "prometheus" else free_port()
        result = run_server(
            [
                "--data-dir",
                str(tmp_path / "data"),
                "--amqp-port",
                str(amqp_port),
                "--http-port",
                str(http_port),
                "--prometheus-port",
                str(prometheus_port),
            ],
            tmp_path,
        )
    finally:
        busy.close()
    assert result.returncode == 1, result
    what = {"amqp": "AMQP", "http": "HTTP", "prometheus": "Prometheus"}[which]
    assert (
        f"maxq-server: cannot listen for {what} on 127.0.0.1:{busy_port}: the port is in use by another process"
        in result.stderr
    )
    assert "Traceback" not in result.stderr + result.stdout


def test_second_server_on_the_same_data_dir_refuses(servers, tmp_path):
    _port, args = ports_args(tmp_path, "shared")
    first = servers(args)
    first.wait_ready()
    _port2, args2 = ports_args(tmp_path, "shared")
    result = run_server(args2, tmp_path)
    assert result.returncode == 2, result
    assert f"data folder {tmp_path / 'shared'} is in use by another maxq-server" in result.stderr
    assert "Traceback" not in result.stderr
    assert first.proc.poll() is None  # the first one is unharmed
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait_exit() == 0
    # Once the first is gone, the folder is free again.
    second = servers(args2)
    second.wait_ready()
