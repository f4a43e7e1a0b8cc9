"""One read of the replication engine's status for an admin request, bounded in time.

`ReplicationNode.status()` runs in the engine's hub thread and blocks (at most 5 s by itself), so
it is called from a worker thread, never trio's, and given up on after STATUS_TIMEOUT_S: the
request answers 503 rather than hang.
"""

from __future__ import annotations

from typing import Any

import trio

from .requests import HttpError

STATUS_TIMEOUT_S = 10.0  # node.status() gives up after 5 s itself


async def engine_status(broker: Any) -> dict[str, dict]:
    """{group name: that group's status} from this node's replication engine."""
    node = broker.log.replication_node
    try:
        with trio.fail_after(STATUS_TIMEOUT_S):
            return await trio.to_thread.run_sync(node.status)
    except (TimeoutError, trio.TooSlowError) as exc:
        raise HttpError("503 Service Unavailable", f"the replication engine did not answer: {exc}") from None
