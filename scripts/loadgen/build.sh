#!/bin/sh
# Build the load generator from Debian 12 packages only:
#   apt-get install -y gcc librabbitmq-dev
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
# the binary goes to scripts/loadgen/bin (git-ignored), or to $BENCH_BIN, or to a temp folder
# where that one is read-only
BIN=${BENCH_BIN:-$HERE/bin}
if ! mkdir -p "$BIN" 2>/dev/null || [ ! -w "$BIN" ]; then
  BIN=${TMPDIR:-/tmp}/bench-bin; mkdir -p "$BIN"
fi
CFLAGS=${CFLAGS:-"-O2 -g -Wall -Wextra -Wno-unused-parameter"}
if [ ! -f /usr/include/amqp.h ]; then
  echo "librabbitmq-dev missing: apt-get install -y librabbitmq-dev" >&2
  exit 1
fi
cc $CFLAGS -o "$BIN/amqpload" "$HERE/amqpload.c" -lrabbitmq -lpthread
echo "built: $BIN/amqpload"
