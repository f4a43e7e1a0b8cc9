"""The admin API's definitions routes: RabbitMQ management's paths, shapes and status codes.

    GET  /api/definitions           every vhost's definitions, users and permissions
    GET  /api/definitions/{vhost}   one vhost's (400 "vhost_not_found" without it, as RabbitMQ)
    POST /api/definitions           import a document: 204 No Content once all of it is applied
    POST /api/definitions/{vhost}   import a vhost's document into that vhost (404 without it)

An import is checked whole first (definitions.import_steps: every item, then a dry run on a
replica of the current state), so a refused document (400, naming its first bad item) proposes
nothing. The commands are then committed one by one, in order, each waited for. If the cluster
stops committing midway (503, 504), or the state changed under the import since the dry run
(400, 404), the answer says which item stopped it and how many commands were applied before it:
those stay applied, as after RabbitMQ's failed imports; importing the same document again once
the cluster is back completes it (every command is idempotent or replaces what is there).

The body of a POST may be up to admin.DEFINITIONS_MAX_BYTES, read within
admin.DEFINITIONS_READ_TIMEOUT_S; every other route keeps the small limit.
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..machines import metadata as md
from . import definitions
from .requests import HttpError, Reply, Request, commit


def get_all(broker: Any, request: Request) -> dict:
    return definitions.export_definitions(broker.meta, __version__)


def get_vhost(broker: Any, request: Request) -> dict:
    name = request.params["name"]
    if name not in broker.meta.vhosts:
        raise HttpError("400 Bad Request", "vhost_not_found")  # RabbitMQ's answer here (not 404)
    return definitions.export_vhost_definitions(broker.meta, name, __version__)


async def post(broker: Any, request: Request) -> Reply:
    vhost = request.params.get("name")
    if vhost is not None and vhost not in broker.meta.vhosts:
        raise HttpError("404 Not Found", "vhost_not_found")
    document = request.json()
    try:
        steps = definitions.import_steps(document, broker.meta, vhost)
    except definitions.DefinitionsError as exc:
        raise HttpError("400 Bad Request", str(exc), applied=0) from None
    if request.caller is not None:
        steps = with_makers_permissions(steps, broker.meta, request.caller.name)
    await apply(broker, steps)
    return Reply("204 No Content")


def with_makers_permissions(steps: list[definitions.Step], meta: Any, user: str) -> list[definitions.Step]:
    """As RabbitMQ's import (checked side by side): a vhost the import creates gives the
    importing user every permission in it, right after it is made, so that a permission the
    document itself sets for that user, later in the order, still wins."""
    out: list[definitions.Step] = []
    for step in steps:
        out.append(step)
        command = step.command
        if type(command) is md.PutVhost and command.name not in meta.vhosts:
            out.append(definitions.Step(step.where, md.SetPermissions(command.name, user, ".*", ".*", ".*")))
    return out


async def apply(broker: Any, steps: list[definitions.Step]) -> None:
    """Commit the steps in order; a failure names the item and how many were applied before it."""
    total = len(steps)
    for done, step in enumerate(steps):
        try:
            await commit(broker, step.command)
        except HttpError as exc:
            maybe = " (this last one may still be applied)" if exc.status.startswith("504") else ""
            raise HttpError(
                exc.status,
                f"import stopped at {step.where}: {exc}; {done} of {total} commands were applied before it{maybe}. "
                "Importing the same document again completes it.",
                applied=done,
                total=total,
                item=step.where,
            ) from None
