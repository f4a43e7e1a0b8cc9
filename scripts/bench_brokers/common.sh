# Shared settings for the broker start/stop scripts (sourced, not executed).
# Port plan (all on 127.0.0.1):
#   5690        RabbitMQ single node   bench0@localhost  (dist 25690)
#   5691-5693   RabbitMQ 3-node cluster bench1..3@localhost (dist 25691-25693)
#   5694        garagemq                (admin 25694)
#   5695        free (a null broker in the first version of these scripts)
#   5696-5699   free (e.g. the project's own broker)
#   25699       our own epmd;  35690-35699 rabbitmqctl (CLI) distribution ports
# Runtime state (data dirs, logs, pid files): /tmp/bench-* (override BENCH_TMP).
BENCH_TMP=${BENCH_TMP:-/tmp/bench-brokers}
STATE_DIR="$BENCH_TMP/state"
mkdir -p "$STATE_DIR"
RMQ_BIN=${RMQ_BIN:-/usr/lib/rabbitmq/bin}
export ERL_EPMD_PORT=25699
export ERL_EPMD_ADDRESS=127.0.0.1
export RABBITMQ_CTL_DIST_PORT_MIN=35690
export RABBITMQ_CTL_DIST_PORT_MAX=35699
# private HOME => private .erlang.cookie, shared by our nodes and our rabbitmqctl only
export HOME="$BENCH_TMP/home"
mkdir -p "$HOME"
if [ ! -f "$HOME/.erlang.cookie" ]; then
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$HOME/.erlang.cookie"
  chmod 400 "$HOME/.erlang.cookie"
fi

pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# start our own epmd on 25699 (shared by all our nodes); records its pid
ensure_epmd() {
  if [ -f "$STATE_DIR/epmd.pid" ] && pid_alive "$(cat "$STATE_DIR/epmd.pid")"; then return 0; fi
  setsid epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 >"$BENCH_TMP/epmd.log" 2>&1 < /dev/null &
  echo $! > "$STATE_DIR/epmd.pid"
  sleep 0.5
  echo "epmd pid $(cat "$STATE_DIR/epmd.pid") port $ERL_EPMD_PORT" >&2
}
# stop epmd only when none of our rabbit nodes is left
maybe_stop_epmd() {
  for f in "$STATE_DIR"/rabbit-node*.pid; do
    [ -f "$f" ] && pid_alive "$(cat "$f")" && return 0
  done
  if [ -f "$STATE_DIR/epmd.pid" ]; then
    p=$(cat "$STATE_DIR/epmd.pid")
    pid_alive "$p" && kill "$p" && echo "stopped epmd pid $p" >&2
    rm -f "$STATE_DIR/epmd.pid"
  fi
}

# rabbit_env IDX  -> exports the per-node RabbitMQ variables for node IDX (0..3)
rabbit_env() {
  i=$1
  export RABBITMQ_NODENAME="bench$i@localhost"
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$((5690 + i))
  export RABBITMQ_DIST_PORT=$((25690 + i))
  NODE_DIR="$BENCH_TMP/rabbit$i"
  export RABBITMQ_MNESIA_BASE="$NODE_DIR/mnesia"
  export RABBITMQ_LOG_BASE="$NODE_DIR/log"
  export RABBITMQ_CONFIG_FILE="$NODE_DIR/rabbitmq.conf"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$NODE_DIR/advanced.config"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$NODE_DIR/enabled_plugins"
  export RABBITMQ_PLUGINS_EXPAND_DIR="$NODE_DIR/plugins-expand"
  export RABBITMQ_PID_FILE="$NODE_DIR/beam.pid"
  export RABBITMQ_CONF_ENV_FILE="$NODE_DIR/rabbitmq-env.conf"
  # keep Erlang distribution on loopback; callers may append e.g. "+sbwt none"
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} ${RABBIT_ERL_ARGS:-}"
}
