"""The scheduler's C API through its TF-free Python handle (no TensorFlow):
several independent instances, the polling calls the simulator uses, ticket-
named grants and cancels, errors on bad input."""
import pytest

from horovod_prio.scheduler import STATS_FIELDS, UNLIMITED, Scheduler

pytestmark = pytest.mark.scheduler_lib


def test_instances_are_independent():
    a, b = Scheduler(), Scheduler()
    a.configure(10, True)
    b.configure(10, True)
    ta = a.submit("x", 0, 10)
    a.submit("y", 0, 10)
    assert a.take_released() == [ta]
    tb = b.submit("x", 0, 10)
    assert b.take_released() == [tb]  # b's credit is its own
    assert a.stats()["queued"] == 1 and b.stats()["queued"] == 0
    assert set(a.stats()) == set(STATS_FIELDS)


def test_polling_release_order_and_credit():
    s = Scheduler()
    s.configure(100, True)
    first = s.submit("first", 0, 60)
    waits = [s.submit("w%d" % p, p, 60) for p in (1, 5, 3)]
    assert s.take_released() == [first]
    order = []
    nxt = first
    for _ in range(3):
        assert s.complete_ticket(nxt)
        released = s.take_released()
        assert len(released) == 1
        nxt = released[0]
        order.append(nxt)
    assert order == [waits[1], waits[2], waits[0]]  # priorities 5, 3, 1
    assert s.stats()["max_inflight_bytes"] <= 100


def test_submit_notify_writes_the_ticket_when_released():
    """A pushed release: the ticket lands on the fd when the chunk is released,
    also when that happens inside submit (pass-through), before the ticket was
    returned; nothing is written while the chunk waits."""
    import os
    import select
    import struct
    r, w = os.pipe()
    try:
        s = Scheduler()
        s.configure(100, True)
        blocker = s.submit("blocker", 9, 100)
        assert s.take_released() == [blocker]
        held = s.submit_notify("held", 1, 50, w)
        assert select.select([r], [], [], 0.2)[0] == []     # waiting: no notice
        assert s.complete_ticket(blocker)
        assert select.select([r], [], [], 5)[0] == [r]
        assert struct.unpack("=Q", os.read(r, 8))[0] == held
        assert s.take_released() == []                        # pushed, not polled
        s.configure(0, False)                                  # pass-through: released in submit
        now = s.submit_notify("now", 1, 10, w)
        assert select.select([r], [], [], 5)[0] == [r]
        assert struct.unpack("=Q", os.read(r, 8))[0] == now
        with pytest.raises(ValueError, match="fd"):
            s.submit_notify("x", 1, 1, -1)
    finally:
        os.close(r)
        os.close(w)


def test_unlimited_credit_releases_everything_at_once():
    s = Scheduler()
    s.configure(UNLIMITED, True)
    ts = [s.submit("c%d" % i, i, 1 << 28) for i in range(8)]
    assert sorted(s.take_released()) == ts
    assert s.stats()["inflight_bytes"] == 8 << 28


def test_external_grants_by_ticket_and_cancel_callbacks():
    s = Scheduler()
    s.configure(100, True)
    calls = []
    s.set_grant_callbacks(request=lambda t, n, p, b: calls.append(("request", t, n, p, b)),
                          complete=lambda t: calls.append(("complete", t)),
                          cancel=lambda t: calls.append(("cancel", t)))
    s.set_external_grant(True)
    old = s.submit("g", 7, 10)
    assert calls == [("request", old, "g", 7, 10)]
    assert s.cancel(old) == "requested"
    assert calls[-1] == ("cancel", old)
    new = s.submit("g", 7, 10)
    assert not s.grant(old)           # a late grant of the withdrawn request
    assert s.take_released() == []    # ... released nothing
    assert s.grant(new)
    assert s.take_released() == [new]
    assert s.complete("g")
    assert calls[-1] == ("complete", new)
    assert s.stats()["unknown_grants"] == 1


def test_polling_requests_without_callbacks():
    s = Scheduler()
    s.configure(100, True)
    s.set_external_grant(True)
    t = s.submit("a", 2, 30)
    assert s.take_requests() == [(t, 2, 30)]
    assert s.take_released() == []
    assert s.grant(t) and s.take_released() == [t]


def test_abandon_frees_the_credit():
    s = Scheduler()
    s.configure(10, True)
    a = s.submit("a", 0, 10)
    b = s.submit("b", 0, 10)
    assert s.take_released() == [a]
    assert s.cancel(a) == "inflight"       # its step failed after the release
    assert s.take_released() == [b]
    assert s.cancel(a) == "unknown"
    assert not s.complete_ticket(a)
    st = s.stats()
    assert st["abandoned"] == 1 and st["inflight_bytes"] == 10


@pytest.mark.parametrize("call, match", [
    (lambda s: s.configure(-1, True), "credit_bytes"),
    (lambda s: s.configure(10, 1), "hold"),
    (lambda s: s.submit("", 0, 1), "name"),
    (lambda s: s.submit("x", 0, -1), "nbytes"),
    (lambda s: s.submit("x", 1.5, 1), "priority"),
    (lambda s: s.grant(0), "ticket"),
    (lambda s: s.set_max_events(-1), "set_max_events"),
])
def test_bad_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(Scheduler())


def test_reset_refuses_while_chunks_wait():
    s = Scheduler()
    s.configure(0, True)
    s.submit("a", 0, 1)
    s.submit("b", 0, 1)
    with pytest.raises(RuntimeError, match="waiting"):
        s.reset()


def test_trace_events_carry_tickets_and_the_waiting_set():
    s = Scheduler()
    s.configure(0, True)
    s.set_tracing(True)
    a = s.submit("a", 0, 1)
    s.submit("b", 1, 1)
    s.submit("c", 9, 1)
    s.complete_ticket(a)
    rel = [e for e in s.drain_events() if e["kind"] == "release"]
    assert [e["name"] for e in rel] == ["a", "c"]
    assert rel[0]["ticket"] == a
    assert (rel[1]["waiting"], rel[1]["waiting_max_priority"]) == (2, 9)
