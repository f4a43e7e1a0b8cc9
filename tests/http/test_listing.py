"""listing.shape: RabbitMQ's sort, columns and pagination over a list, as its plugin answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.http.listing import PAGE_SIZE_MAX, shape, shape_one
from maxq_raft.http.requests import HttpError

ITEMS = [
    {"name": "orders", "vhost": "/", "durable": True, "message_stats": {"publish": 5}},
    {"name": "bq1", "vhost": "/", "durable": False, "message_stats": {"publish": 9}},
    {"name": "aliveness-test", "vhost": "/", "durable": False},
]


def q(**params: str) -> dict[str, list[str]]:
    return {key: [value] for key, value in params.items()}


def test_one_object_takes_columns_too():
    assert shape_one(ITEMS[0], q(columns="name,message_stats.publish,nope")) == {
        "name": "orders",
        "message_stats": {"publish": 5},
    }
    assert shape_one(ITEMS[0], q(columns="")) == ITEMS[0]


def test_sort_columns_and_reverse_as_rabbitmq():
    assert shape(ITEMS, q(columns="name,durable", sort="name", sort_reverse="true")) == [
        {"name": "orders", "durable": True},
        {"name": "bq1", "durable": False},
        {"name": "aliveness-test", "durable": False},
    ]
    by_publish = shape(ITEMS, q(sort="message_stats.publish", columns="name,message_stats.publish"))
    assert by_publish == [
        {"name": "aliveness-test"},
        {"name": "orders", "message_stats": {"publish": 5}},
        {
            "name": "bq1",
            "message_stats": {"publish": 9},
        },
    ]
    assert shape(ITEMS, q(sort="nope")) == ITEMS  # an unknown key sorts nothing (stable)


def test_pages_and_name_filters():
    page = shape(ITEMS, q(page="1", page_size="2", sort="name"))
    assert {k: v for k, v in page.items() if k != "items"} == {
        "filtered_count": 3,
        "item_count": 2,
        "page": 1,
        "page_count": 2,
        "page_size": 2,
        "total_count": 3,
    }
    assert [i["name"] for i in page["items"]] == ["aliveness-test", "bq1"]
    assert [i["name"] for i in shape(ITEMS, q(page="1", name="BQ"))["items"]] == ["bq1"]  # any case
    assert [i["name"] for i in shape(ITEMS, q(page="1", name="^o", use_regex="true"))["items"]] == ["orders"]
    empty = shape(ITEMS, q(page="1", name="zzz"))
    assert (empty["items"], empty["page_count"], empty["filtered_count"]) == ([], 0, 0)


@pytest.mark.parametrize(
    "params, error, reason",
    [
        ({"page": "5", "page_size": "1"}, "page_out_of_range", "Page out of range, page: 5 page size: 1, len: 3"),
        (
            {"page": "0"},
            "invalid_pagination_parameters",
            "Invalid pagination parameters: page number 0, page size undefined",
        ),
        ({"page": "1", "page_size": "1000"}, "invalid_pagination_parameters", "page number 1, page size 1000"),
        ({"page": "x"}, "bad_request", "Pagination parameters are invalid"),
        ({"page": "1", "name": "(", "use_regex": "true"}, "bad_request", "Pagination parameters are invalid"),
        ({"page": "1", "name": "(a)\\1", "use_regex": "true"}, "bad_request", "Pagination parameters are invalid"),
    ],
)
def test_bad_parameters_are_rabbitmqs_400s(params, error, reason):
    with pytest.raises(HttpError) as refused:
        shape(ITEMS, q(**params))
    assert refused.value.status.startswith("400") and str(refused.value) == error
    assert reason in refused.value.extra["reason"]


@given(
    st.lists(st.integers(0, 50), max_size=40),
    st.integers(1, PAGE_SIZE_MAX),
    st.integers(1, 10),
)
def test_pages_partition_the_filtered_list(values, size, page):
    items = [{"name": f"q{v}", "n": v} for v in values]
    try:
        answer = shape(items, q(page=str(page), page_size=str(size), sort="n"))
    except HttpError as exc:
        assert str(exc) == "page_out_of_range" and page > -(-len(items) // size)
        return
    ordered = sorted(items, key=lambda i: i["n"])
    assert answer["items"] == ordered[(page - 1) * size : page * size]
    assert answer["total_count"] == answer["filtered_count"] == len(items)
    assert answer["page_count"] == -(-len(items) // size)
