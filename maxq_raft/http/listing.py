"""RabbitMQ's list parameters on every list the management API answers: sort, sort_reverse,
columns, and pagination with a name filter (`?page=&page_size=&name=&use_regex=`).

Theory of operation: a pure function from a list of JSON objects and the query string to what
RabbitMQ 3.10 answers (read side by side from its plugin): without `page`, the list, sorted by
`sort` (a dotted path into each object) when given, each object cut to `columns` (dotted paths,
comma-separated) when given; with `page`, an object with the page's `items` and the counts
(`filtered_count`, `item_count`, `page`, `page_count`, `page_size`, `total_count`), after the
`name` filter (a case-insensitive substring, or with `use_regex=true` a regular expression,
matched with RE2 as policy patterns are, so no filter can make the event loop backtrack). Bad
parameters are a 400 with RabbitMQ's error words; nothing else changes. A single object's GET
takes `columns` too (`shape_one`).
"""

from __future__ import annotations

from typing import Any

from ..machines.policy_pattern import PatternError, compile_pattern
from .requests import HttpError

PAGE_SIZE_DEFAULT = 100
PAGE_SIZE_MAX = 500  # RabbitMQ's
LIST_PARAMETERS = frozenset(("sort", "sort_reverse", "columns", "page", "page_size", "name", "use_regex"))


def _one(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


_MISSING = object()


def _path(item: Any, dotted: str) -> Any:
    """The value at a dotted path, or _MISSING where an object along it lacks the key."""
    for part in dotted.split("."):
        if not isinstance(item, dict) or part not in item:
            return _MISSING
        item = item[part]
    return item


def _sort_key(value: Any) -> tuple[int, Any]:
    # Missing first, then numbers, then text, then anything else by its text: never a TypeError.
    if value is None or value is _MISSING:
        return (0, 0)
    if isinstance(value, bool | int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, str(value))


def _columns(item: Any, columns: list[str]) -> Any:
    if not isinstance(item, dict):
        return item
    out: dict[str, Any] = {}
    for dotted in columns:
        value = _path(item, dotted)
        if value is _MISSING:
            continue
        target = out
        parts = dotted.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return out


def _page_numbers(query: dict[str, list[str]]) -> tuple[int, int]:
    page_text, size_text = _one(query, "page"), _one(query, "page_size")
    if not (page_text or "").isdigit() or (size_text is not None and not size_text.isdigit()):
        raise HttpError("400 Bad Request", "bad_request", reason="Pagination parameters are invalid")
    page, size = int(page_text or "0"), int(size_text) if size_text is not None else PAGE_SIZE_DEFAULT
    if page < 1 or not 1 <= size <= PAGE_SIZE_MAX:
        shown = size_text if size_text is not None else "undefined"
        raise HttpError(
            "400 Bad Request",
            "invalid_pagination_parameters",
            reason=f"Invalid pagination parameters: page number {page}, page size {shown}",
        )
    return page, size


def _named(items: list, query: dict[str, list[str]]) -> list:
    name = _one(query, "name")
    if not name:
        return items
    if _one(query, "use_regex") == "true":
        try:
            pattern = compile_pattern(name)
        except PatternError:
            raise HttpError("400 Bad Request", "bad_request", reason="Pagination parameters are invalid") from None
        return [item for item in items if isinstance(_path(item, "name"), str) and pattern.matches(item["name"])]
    wanted = name.lower()
    return [item for item in items if isinstance(_path(item, "name"), str) and wanted in item["name"].lower()]


def shape_one(item: dict, query: dict[str, list[str]]) -> dict:
    """One object (GET /api/queues/{vhost}/{name}, ...) cut to `columns`, as RabbitMQ does."""
    columns = [c for c in (_one(query, "columns") or "").split(",") if c]
    return _columns(item, columns) if columns else item


def shape(items: list, query: dict[str, list[str]]) -> list | dict:
    """`items` as RabbitMQ answers a list with these query parameters."""
    sort = _one(query, "sort")
    if sort:
        items = sorted(
            items, key=lambda item: _sort_key(_path(item, sort)), reverse=_one(query, "sort_reverse") == "true"
        )
    elif _one(query, "sort_reverse") == "true":
        items = list(reversed(items))
    columns = [c for c in (_one(query, "columns") or "").split(",") if c]
    if "page" not in query:
        return [_columns(item, columns) for item in items] if columns else items
    page, size = _page_numbers(query)
    filtered = _named(items, query)
    page_count = (len(filtered) + size - 1) // size
    if page_count and page > page_count:
        raise HttpError(
            "400 Bad Request",
            "page_out_of_range",
            reason=f"Page out of range, page: {page} page size: {size}, len: {len(filtered)}",
        )
    chosen = filtered[(page - 1) * size : page * size]
    return {
        "filtered_count": len(filtered),
        "item_count": len(chosen),
        "items": [_columns(item, columns) for item in chosen] if columns else chosen,
        "page": page,
        "page_count": page_count,
        "page_size": size,
        "total_count": len(items),
    }
