"""`ChannelState`, the pure per-channel bookkeeping, without sockets.

The example tests pin RabbitMQ's behaviour one rule at a time (rabbit_channel: collect_acks,
basic.recover, confirm.select / tx.select, tx.commit / tx.rollback; the texts are the ones the
integration tests see as "PRECONDITION_FAILED - ..."). The stateful test drives the state with
random sequences of deliveries (some no-ack, some held), ack / nack / reject with and without
`multiple` (tags outstanding, settled, never issued, 0), recover, flow, qos, confirm and tx
methods, and checks each answer against `Model`, a literal transcription of collect_acks over a
list, and after every step: `check_invariants()`, and that every delivered entry was handed to
the shell for settling at most once and is in exactly one place (outstanding, settled in the
open transaction, or handed out).
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from maxq_raft.amqp import spec
from maxq_raft.server.channel_state import ChannelState
from maxq_raft.server.errors import ChannelError, HardError

ACK, REQUEUE, DISCARD = "ack", "requeue", "discard"  # the shell passes queue command types; any value will do


def snapshot(state: ChannelState) -> tuple:
    """Everything the state holds, comparable: a refused method must leave all of it as it was."""
    return (
        state.next_delivery_tag,
        list(state.unacked.items()),
        state.prefetch_count,
        state.prefetch_count_global,
        list(state.held),
        state.holding,
        state.confirm,
        state.publish_seq,
        state.confirmed_upto,
        state.tx,
        list(state.tx_publishes),
        [(k, list(t)) for k, t in state.tx_settles],
    )


def refused(state: ChannelState, call, *args) -> ChannelError:
    before = snapshot(state)
    with pytest.raises(ChannelError) as info:
        call(*args)
    assert snapshot(state) == before
    state.check_invariants()
    return info.value


def delivered(state: ChannelState, n: int) -> list[int]:
    return [state.deliver(f"m{i}") for i in range(n)]


# ------------------------------------------------------------------ delivery tags


def test_tags_start_at_one_and_count_every_delivery_also_no_ack_ones():
    state = ChannelState()
    assert [state.deliver("a"), state.deliver(None), state.deliver("c")] == [1, 2, 3]
    assert state.unacked == {1: "a", 3: "c"}  # a no-ack delivery is never outstanding
    state.check_invariants()


def test_single_ack_takes_one_entry():
    state = ChannelState()
    delivered(state, 3)
    assert state.settle(ACK, 2, False) == ["m1"]
    assert list(state.unacked) == [1, 3]


@pytest.mark.parametrize("kind", [ACK, REQUEUE, DISCARD])
def test_a_tag_settled_twice_is_unknown(kind):
    state = ChannelState()
    delivered(state, 2)
    state.settle(kind, 1, False)
    err = refused(state, state.settle, ACK, 1, False)
    assert (err.reply_code, err.reply_text) == (spec.PRECONDITION_FAILED, "unknown delivery tag 1")
    assert not isinstance(err, HardError)  # a channel error: only the channel closes


@pytest.mark.parametrize("tag, multiple", [(7, False), (7, True), (0, False), (2, False), (2, True)])
def test_unknown_tags_are_precondition_failed(tag, multiple):
    state = ChannelState()
    state.deliver("m0")
    state.deliver(None)  # tag 2: no-ack, so never ackable
    state.deliver("m2")
    err = refused(state, state.settle, ACK, tag, multiple)
    assert (err.reply_code, err.reply_text) == (406, f"unknown delivery tag {tag}")


def test_multiple_takes_every_outstanding_tag_up_to_the_named_one():
    state = ChannelState()
    delivered(state, 6)
    state.settle(ACK, 2, False)
    assert state.settle(REQUEUE, 4, True) == ["m0", "m2", "m3"]
    assert list(state.unacked) == [5, 6]


def test_multiple_up_to_a_tag_already_settled_is_refused_and_takes_nothing():
    # collect_acks walks the whole queue looking for the tag and fails at its end.
    state = ChannelState()
    delivered(state, 4)
    state.settle(ACK, 3, False)
    err = refused(state, state.settle, ACK, 3, True)
    assert err.reply_text == "unknown delivery tag 3"
    assert list(state.unacked) == [1, 2, 4]


def test_tag_zero_with_multiple_takes_everything_and_is_fine_with_nothing():
    state = ChannelState()
    delivered(state, 3)
    assert state.settle(DISCARD, 0, True) == ["m0", "m1", "m2"]
    assert state.unacked == {}
    assert state.settle(ACK, 0, True) == []


def test_recover_requeues_everything_outstanding_and_tags_go_on():
    state = ChannelState()
    delivered(state, 3)
    state.settle(ACK, 2, False)
    assert state.recover(True) == ["m0", "m2"]
    assert state.unacked == {}
    assert state.deliver("again") == 4  # the redelivery gets a new tag
    err = refused(state, state.recover, False)
    assert isinstance(err, HardError) and (err.reply_code, err.reply_text) == (spec.NOT_IMPLEMENTED, "requeue=false")


# ------------------------------------------------------------------------ confirms


def test_confirm_numbering_starts_at_one_and_multiple_covers_the_gap():
    state = ChannelState()
    state.confirm_select()
    state.confirm_select()  # again: fine, as RabbitMQ
    assert [state.next_publish_seq() for _ in range(5)] == [1, 2, 3, 4, 5]
    assert state.confirm_through(1) is False  # just seq 1
    assert state.confirm_through(4) is True  # 2, 3 and 4
    assert state.confirm_through(5) is False
    state.check_invariants()


def test_confirm_and_tx_exclude_each_other():
    state = ChannelState()
    state.confirm_select()
    err = refused(state, state.tx_select)
    assert (err.reply_code, err.reply_text) == (406, "cannot switch from confirm to tx mode")
    state = ChannelState()
    state.tx_select()
    state.tx_select()
    err = refused(state, state.confirm_select)
    assert (err.reply_code, err.reply_text) == (406, "cannot switch from tx to confirm mode")


# ----------------------------------------------------------------------------- tx


@pytest.mark.parametrize("method", ["tx_commit", "tx_rollback"])
def test_commit_or_rollback_without_select_is_refused(method):
    state = ChannelState()
    err = refused(state, getattr(state, method))
    assert (err.reply_code, err.reply_text) == (406, "channel is not transactional")


def test_tx_commit_hands_over_publishes_then_settles_in_order():
    state = ChannelState()
    delivered(state, 5)
    state.tx_select()
    state.buffer_publish("p1")
    assert state.settle(ACK, 2, True) == []  # buffered
    state.buffer_publish("p2")
    assert state.settle(REQUEUE, 4, False) == []
    err = refused(state, state.settle, ACK, 1, False)  # already settled in the transaction
    assert err.reply_text == "unknown delivery tag 1"
    assert state.tx_commit() == (["p1", "p2"], [(ACK, ["m0", "m1"]), (REQUEUE, ["m3"])])
    assert list(state.unacked) == [3, 5]
    assert state.tx and state.tx_commit() == ([], [])  # still transactional, nothing left


def test_tx_rollback_drops_publishes_and_puts_settled_tags_back_in_order():
    state = ChannelState()
    delivered(state, 5)
    state.tx_select()
    state.buffer_publish("p1")
    state.settle(ACK, 4, False)
    state.settle(DISCARD, 2, True)
    state.tx_rollback()
    assert state.tx_publishes == []
    assert list(state.unacked.items()) == [(1, "m0"), (2, "m1"), (3, "m2"), (4, "m3"), (5, "m4")]
    assert state.settle(ACK, 4, True) == []  # settleable again (and buffered again)
    assert state.tx_commit() == ([], [(ACK, ["m0", "m1", "m2", "m3"])])


def test_recover_inside_a_transaction_leaves_its_settles_alone():
    state = ChannelState()
    delivered(state, 3)
    state.tx_select()
    state.settle(ACK, 1, False)
    assert state.recover(True) == ["m1", "m2"]
    state.tx_rollback()
    assert list(state.unacked) == [1]


def test_close_forgets_everything():
    state = ChannelState()
    delivered(state, 2)
    state.tx_select()
    state.settle(ACK, 1, False)
    state.buffer_publish("p")
    state.hold("item")
    state.close()
    assert (state.unacked, list(state.held), state.tx_publishes, state.tx_settles) == ({}, [], [], [])
    state.check_invariants()


# ------------------------------------------------------------------ held deliveries


def test_channel_wide_prefetch_holds_and_acks_release_in_order():
    state = ChannelState()
    state.qos(0, 2, True)
    assert state.consumer_prefetch_count() == 2
    state.deliver("m0")
    assert not state.holding
    state.deliver("m1")
    assert state.holding  # at the limit
    state.hold("i2")
    state.hold("i3")
    assert state.next_released() is None
    state.settle(ACK, 1, False)
    assert state.next_released() == "i2"
    state.deliver("m2")
    assert state.next_released() is None and state.holding
    state.settle(ACK, 0, True)
    assert state.next_released() == "i3"
    assert not state.holding
    state.check_invariants()


def test_a_rollback_can_bring_the_channel_back_to_its_limit():
    # Found by the model test (a mutation that skipped the recomputation in tx_rollback).
    state = ChannelState()
    state.tx_select()
    state.deliver("m0")
    state.qos(0, 1, True)
    assert state.holding
    state.settle(ACK, 1, False)
    assert not state.holding  # room, until the transaction is rolled back
    state.tx_rollback()
    assert state.holding
    state.check_invariants()


def test_no_ack_deliveries_count_against_no_limit_but_wait_their_turn():
    state = ChannelState()
    state.qos(0, 1, True)
    for _ in range(3):
        state.deliver(None)
    assert not state.holding
    state.deliver("m")
    assert state.holding


def test_take_held_of_one_consumer():
    state = ChannelState()
    state.qos(0, 1, True)
    state.deliver("m0")  # at the limit: later deliveries are held
    for item in [("c1", 1), ("c2", 2), ("c1", 3)]:
        state.hold(item)
    assert state.take_held(lambda item: item[0] == "c1") == [("c1", 1), ("c1", 3)]
    assert list(state.held) == [("c2", 2)]
    assert state.take_held() == [("c2", 2)]
    state.settle(ACK, 1, False)
    assert not state.holding


def test_per_consumer_qos_and_prefetch_size():
    state = ChannelState()
    state.qos(0, 5, False)
    state.qos(0, 9, True)
    assert state.consumer_prefetch_count() == 5  # the per-consumer limit wins when both are set
    err = refused(state, state.qos, 10, 0, False)
    assert isinstance(err, HardError) and (err.reply_code, err.reply_text) == (540, "prefetch_size!=0 (10)")


# ------------------------------------------------------------- against a model


class Model:
    """The rules as RabbitMQ writes them, naively: outstanding deliveries as a list in tag order,
    settled as rabbit_channel:collect_acks walks it."""

    def __init__(self) -> None:
        self.next_tag = 1
        self.outstanding: list[tuple[int, str]] = []
        self.tx: bool = False
        self.confirm = False
        self.tx_settles: list[tuple[str, list[tuple[int, str]]]] = []
        self.tx_publishes: list[str] = []
        self.publish_seq = 0
        self.confirmed_upto = 0
        self.limit = 0
        self.held: list = []

    def collect(self, tag: int, multiple: bool) -> list[tuple[int, str]]:
        """collect_acks(Q, DeliveryTag, Multiple): raises like precondition_failed."""
        if multiple and tag == 0:
            taken, self.outstanding = self.outstanding, []
            return taken
        taken, prefix = [], []
        for i, (current, entry) in enumerate(self.outstanding):
            if current == tag:
                self.outstanding = prefix + self.outstanding[i + 1 :]
                return taken + [(current, entry)]
            (taken if multiple else prefix).append((current, entry))
        raise ChannelError(406, f"unknown delivery tag {tag}")

    def must_hold(self) -> bool:
        return bool(self.held) or bool(self.limit and len(self.outstanding) >= self.limit)


class ChannelStateModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ChannelState()
        self.model = Model()
        self.entries = 0
        self.handed_out: dict[str, int] = {}  # entry -> times given to the shell to settle
        self.delivered_entries: list[str] = []
        self.no_ack_tags: list[int] = []
        self.closed = False

    # ---- what the shell does with answers

    def hand_out(self, entries: list[str]) -> None:
        for entry in entries:
            self.handed_out[entry] = self.handed_out.get(entry, 0) + 1

    def write(self, no_ack: bool) -> None:
        """A delivery written now (the shell checked `holding`)."""
        if no_ack:
            tag = self.state.deliver(None)
            self.no_ack_tags.append(tag)
        else:
            entry = f"m{self.entries}"
            self.entries += 1
            tag = self.state.deliver(entry)
            self.delivered_entries.append(entry)
            self.model.outstanding.append((tag, entry))
        assert tag == self.model.next_tag
        self.model.next_tag += 1

    def expect_refusal(self, call, args, expected: ChannelError) -> None:
        before = snapshot(self.state)
        with pytest.raises(ChannelError) as info:
            call(*args)
        assert type(info.value) is type(expected)
        assert (info.value.reply_code, info.value.reply_text) == (expected.reply_code, expected.reply_text)
        assert snapshot(self.state) == before, "a refused method changed the state"

    # ---- rules

    @rule(no_ack=st.booleans())
    def deliver(self, no_ack):
        assert self.state.holding == self.model.must_hold()
        if self.state.holding:
            item = ("item", len(self.model.held), no_ack)
            self.state.hold(item)
            self.model.held.append(item)
        else:
            self.write(no_ack)

    @rule()
    def release(self):
        while (item := self.state.next_released()) is not None:
            assert self.model.held
            assert not (self.model.limit and len(self.model.outstanding) >= self.model.limit)
            assert item == self.model.held.pop(0)
            self.write(item[2])
        assert not self.model.held or (self.model.limit and len(self.model.outstanding) >= self.model.limit)

    @rule(
        kind=st.sampled_from([ACK, REQUEUE, DISCARD]),
        multiple=st.booleans(),
        data=st.data(),
        pick=st.sampled_from(["outstanding", "outstanding", "outstanding", "settled", "zero", "future", "no-ack"]),
    )
    def settle(self, kind, multiple, pick, data):
        model = self.model
        if pick == "outstanding" and model.outstanding:
            tag = data.draw(st.sampled_from([tag for tag, _ in model.outstanding]))
        elif pick == "settled" and model.next_tag > 1:
            tag = data.draw(st.integers(1, model.next_tag - 1))  # maybe still outstanding: the model decides
        elif pick == "no-ack" and self.no_ack_tags:
            tag = data.draw(st.sampled_from(self.no_ack_tags))
        elif pick == "future":
            tag = model.next_tag + data.draw(st.integers(0, 3))
        else:
            tag = 0
        before = list(model.outstanding)
        try:
            taken = model.collect(tag, multiple)
        except ChannelError as expected:
            self.expect_refusal(self.state.settle, (kind, tag, multiple), expected)
            return
        answer = self.state.settle(kind, tag, multiple)
        assert [entry for _t, entry in taken] == [entry for t, entry in before if (t, entry) in taken]  # tag order
        if model.tx:
            assert answer == []
            model.tx_settles.append((kind, taken))
        else:
            assert answer == [entry for _t, entry in taken]
            self.hand_out(answer)

    @rule(requeue=st.booleans())
    def recover(self, requeue):
        if not requeue:
            self.expect_refusal(self.state.recover, (False,), HardError(540, "requeue=false"))
            return
        answer = self.state.recover(True)
        assert answer == [entry for _t, entry in self.model.outstanding]
        self.model.outstanding = []
        self.hand_out(answer)

    @rule(count=st.integers(0, 4), global_=st.booleans())
    def qos(self, count, global_):
        self.state.qos(0, count, global_)
        if global_:
            self.model.limit = count

    @rule()
    def confirm_select(self):
        if self.model.tx:
            self.expect_refusal(
                self.state.confirm_select, (), ChannelError(406, "cannot switch from tx to confirm mode")
            )
            return
        self.state.confirm_select()
        self.model.confirm = True

    @rule()
    def tx_select(self):
        if self.model.confirm:
            self.expect_refusal(self.state.tx_select, (), ChannelError(406, "cannot switch from confirm to tx mode"))
            return
        self.state.tx_select()
        self.model.tx = True

    @rule()
    def publish(self):
        """What channel.publish does: buffer in a transaction, number in confirm mode."""
        model = self.model
        if self.state.tx:
            assert model.tx
            publish = f"p{len(model.tx_publishes)}"
            self.state.buffer_publish(publish)
            model.tx_publishes.append(publish)
        elif self.state.confirm:
            assert model.confirm
            model.publish_seq += 1
            assert self.state.next_publish_seq() == model.publish_seq
        else:
            assert not model.tx and not model.confirm

    @precondition(lambda self: self.model.publish_seq > self.model.confirmed_upto)
    @rule(data=st.data())
    def confirm(self, data):
        model = self.model
        last_seq = data.draw(st.integers(model.confirmed_upto + 1, model.publish_seq))
        assert self.state.confirm_through(last_seq) == (last_seq - model.confirmed_upto > 1)
        model.confirmed_upto = last_seq

    @rule()
    def tx_commit(self):
        model = self.model
        if not model.tx:
            self.expect_refusal(self.state.tx_commit, (), ChannelError(406, "channel is not transactional"))
            return
        publishes, settles = self.state.tx_commit()
        assert publishes == model.tx_publishes
        assert settles == [(kind, [entry for _t, entry in taken]) for kind, taken in model.tx_settles]
        for _kind, entries in settles:
            self.hand_out(entries)
        model.tx_publishes, model.tx_settles = [], []

    @rule()
    def tx_rollback(self):
        model = self.model
        if not model.tx:
            self.expect_refusal(self.state.tx_rollback, (), ChannelError(406, "channel is not transactional"))
            return
        self.state.tx_rollback()
        for _kind, taken in model.tx_settles:
            model.outstanding.extend(taken)
        model.outstanding.sort()
        model.tx_publishes, model.tx_settles = [], []

    @rule(which=st.integers(0, 2))
    def take_held(self, which):
        """A consumer goes: its held deliveries (here: those whose index is `which` mod 3) leave."""

        def select(item):
            return item[1] % 3 == which

        taken = self.state.take_held(select)
        assert taken == [item for item in self.model.held if select(item)]
        self.model.held = [item for item in self.model.held if not select(item)]

    # ---- after every step

    @invariant()
    def agrees(self):
        state, model = self.state, self.model
        state.check_invariants()
        assert list(state.unacked.items()) == model.outstanding
        assert state.next_delivery_tag == model.next_tag
        assert list(state.held) == model.held
        assert state.holding == model.must_hold()
        assert (state.tx, state.confirm, state.publish_seq, state.confirmed_upto) == (
            model.tx,
            model.confirm,
            model.publish_seq,
            model.confirmed_upto,
        )

    @invariant()
    def each_delivery_settled_at_most_once_and_in_one_place(self):
        assert all(count == 1 for count in self.handed_out.values()), self.handed_out
        outstanding = [entry for _t, entry in self.model.outstanding]
        in_tx = [entry for _k, taken in self.model.tx_settles for _t, entry in taken]
        places = outstanding + in_tx + list(self.handed_out)
        assert sorted(places) == sorted(self.delivered_entries)


ChannelStateModel.TestCase.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
TestChannelStateModel = ChannelStateModel.TestCase
