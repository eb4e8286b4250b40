"""Grant policy of the link arbiter (horovod_prio.arbiter.core), no network."""
import pytest

from horovod_prio.arbiter.core import Arbiter

pytestmark = pytest.mark.timeout(20)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def mk(credit=100, lease=10.0, K=0, order="chunk", **kw):
    """Arbiter on a fake clock; "chunk" order unless a test asks for "burst" (the default
    of the service, tested in the burst tests below)."""
    clock = Clock()
    kw["order"] = order
    return Arbiter(credit_bytes=credit, lease_seconds=lease, starvation_bound=K, clock=clock, **kw), clock


def names(grants):
    return [(r.job.job_id, r.chunk) for r in grants]


def test_grant_order_across_jobs_by_priority():
    a, _ = mk(credit=100)
    A, B, C = (a.register(j, "L") for j in "ABC")
    assert names(a.request(A, 1, 0, 100, "a0")) == [("A", "a0")]    # link free: at once
    assert a.request(B, 1, 1, 100, "b-low") == []
    assert a.request(C, 1, 9, 100, "c-high") == []
    assert a.request(A, 2, 5, 100, "a-mid") == []
    assert names(a.complete(A, 1)) == [("C", "c-high")]
    assert names(a.complete(C, 1)) == [("A", "a-mid")]
    assert names(a.complete(A, 2)) == [("B", "b-low")]
    st = a.stats()["L"]
    assert st["grants"] == 4 and st["waits"] == 3 and st["immediate_grants"] == 1
    assert st["grants_per_job"] == {"A": 2, "B": 1, "C": 1}
    assert st["connected_jobs"] == 3


def test_negative_and_huge_priorities_share_one_scale():
    a, _ = mk(credit=1)
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 0, 1, "hold")
    a.request(A, 2, -5, 1, "neg")
    a.request(B, 1, 2 ** 62, 1, "huge")
    a.request(B, 2, 3, 1, "mid")
    order = []
    tok = {("A", "hold"): 1}
    last = ("A", 1)
    for _ in range(3):
        job = A if last[0] == "A" else B
        g = a.complete(job, last[1])
        assert len(g) == 1
        order.append(g[0].chunk)
        last = (g[0].job.job_id, g[0].token)
    assert order == ["huge", "mid", "neg"]
    del tok


def test_credit_limits_outstanding_bytes():
    a, _ = mk(credit=250)
    A, B = a.register("A", "L"), a.register("B", "L")
    assert len(a.request(A, 1, 5, 100, "a1")) == 1
    assert len(a.request(B, 1, 5, 100, "b1")) == 1
    assert a.request(A, 2, 5, 100, "a2") == []          # 300 > 250
    assert a.links["L"].outstanding_bytes == 200
    assert names(a.complete(B, 1)) == [("A", "a2")]
    assert a.links["L"].outstanding_bytes == 200


def test_oversized_request_granted_alone():
    a, _ = mk(credit=100)
    A, B = a.register("A", "L"), a.register("B", "L")
    assert len(a.request(A, 1, 5, 10, "small")) == 1
    assert a.request(B, 1, 9, 1000, "big") == []          # something outstanding
    assert a.request(A, 2, 1, 10, "small2") == []         # strict order: no overtaking the head
    assert names(a.complete(A, 1)) == [("B", "big")]      # alone, 10x the credit
    assert a.links["L"].outstanding_bytes == 1000
    assert names(a.complete(B, 1)) == [("A", "small2")]


def test_links_are_independent():
    a, _ = mk(credit=100, link_credits={"fat": 1000})
    A, B = a.register("A", "thin"), a.register("B", "fat")
    assert len(a.request(A, 1, 0, 100, "x")) == 1
    assert a.request(A, 2, 0, 100, "y") == []
    for t in range(1, 11):
        assert len(a.request(B, t, 0, 100, "z%d" % t)) == 1
    assert a.request(B, 11, 0, 100, "z11") == []


def test_equal_priorities_in_arrival_order():
    a, _ = mk(credit=1)
    jobs = [a.register("J%d" % i, "L") for i in range(4)]
    a.request(jobs[0], 100, 0, 1, "hold")
    arrivals = [(jobs[3], "3a"), (jobs[1], "1a"), (jobs[2], "2a"), (jobs[1], "1b"), (jobs[0], "0a")]
    for tok, (j, c) in enumerate(arrivals, start=1):
        assert a.request(j, tok, 7, 1, c) == []
    got, cur = [], (jobs[0], 100)
    for _ in arrivals:
        g = a.complete(*cur)
        assert len(g) == 1
        got.append(g[0].chunk)
        cur = (g[0].job, g[0].token)
    assert got == ["3a", "1a", "2a", "1b", "0a"]


def test_starvation_bound_grants_passed_over_request_next():
    K = 3
    a, _ = mk(credit=1, K=K)
    low, high = a.register("low", "L"), a.register("high", "L")
    a.request(high, 1, 50, 1, "h1")                 # holds the link
    a.request(low, 1, 0, 1, "starving")
    tok = 2
    a.request(high, tok, 50, 1, "h%d" % tok)
    cur = (high, 1)
    order = []
    for _ in range(K + 2):
        tok += 1
        a.request(high, tok, 50, 1, "h%d" % tok)     # always a later, more urgent request waiting
        g = a.complete(*cur)
        assert len(g) == 1
        order.append(g[0].chunk)
        cur = (g[0].job, g[0].token)
    # passed over K times (h2, h3, h4), then granted regardless of priority
    assert order[:K] == ["h2", "h3", "h4"]
    assert order[K] == "starving"
    assert a.stats()["L"]["starvation_grants"] == 1
    assert order[K + 1] == "h5"


def test_without_starvation_bound_low_priority_waits():
    a, _ = mk(credit=1, K=0)
    low, high = a.register("low", "L"), a.register("high", "L")
    a.request(high, 1, 50, 1, "h1")
    a.request(low, 1, 0, 1, "low")
    cur = (high, 1)
    for tok in range(2, 30):
        a.request(high, tok, 50, 1, "h")
        g = a.complete(*cur)
        assert g[0].chunk == "h"
        cur = (high, tok)
    assert a.is_pending(low, 1)


def test_starvation_only_counts_later_arrivals():
    # FIFO among equal priority never counts as "passed over"
    a, _ = mk(credit=1, K=1)
    A = a.register("A", "L")
    a.request(A, 1, 5, 1, "x1")
    for t in range(2, 6):
        a.request(A, t, 5, 1, "x%d" % t)
    got = []
    cur = 1
    for _ in range(4):
        g = a.complete(A, cur)
        got.append(g[0].chunk)
        cur = g[0].token
    assert got == ["x2", "x3", "x4", "x5"]
    assert a.stats()["L"]["starvation_grants"] == 0


def test_lease_expiry_returns_bytes_and_is_counted():
    a, clock = mk(credit=100, lease=2.0)
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 5, 100, "a1")
    assert a.request(B, 1, 1, 100, "b1") == []
    assert a.next_expiry() == clock.t + 2.0
    clock.t += 1.0
    assert a.expire() == []
    clock.t += 1.5
    assert names(a.expire()) == [("B", "b1")]
    st = a.stats()["L"]
    assert st["expired_leases"] == 1 and st["outstanding_bytes"] == 100
    assert a.complete(A, 1) is None                 # late completion of the expired grant: ignored
    assert a.links["L"].outstanding_bytes == 100
    assert st["wait_seconds_max"] == pytest.approx(2.5)


def test_drop_frees_grants_and_pending():
    a, _ = mk(credit=100)
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 5, 100, "a1")
    a.request(A, 2, 9, 100, "a2")
    a.request(B, 1, 1, 100, "b1")
    assert names(a.drop(A)) == [("B", "b1")]
    st = a.stats()["L"]
    assert st["connected_jobs"] == 1 and st["pending"] == 0 and st["dropped"] == 2
    assert a.next_expiry() is not None
    a.complete(B, 1)
    assert a.next_expiry() is None


def test_cancel_of_pending_request():
    a, _ = mk(credit=1)
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 5, 1, "a1")
    a.request(B, 1, 9, 1, "b1")
    a.request(B, 2, 1, 1, "b2")
    assert a.cancel(B, 1) == []
    assert names(a.complete(A, 1)) == [("B", "b2")]
    assert a.stats()["L"]["cancelled"] == 1


def test_bad_requests_raise():
    a, _ = mk()
    A = a.register("A", "L")
    a.request(A, 1, 0, 1)
    with pytest.raises(ValueError, match="duplicate token"):
        a.request(A, 1, 0, 1)
    b = Arbiter(credit_bytes=1, max_pending_per_job=2)
    B = b.register("B", "L")
    b.request(B, 1, 0, 1)
    b.request(B, 2, 0, 1)
    with pytest.raises(ValueError, match="too many"):
        b.request(B, 3, 0, 1)
    for kw, msg in ((dict(credit_bytes=0), "credit_bytes"), (dict(lease_seconds=0), "lease_seconds"),
                    (dict(starvation_bound=-1), "starvation_bound"), (dict(order="fifo"), "order"),
                    (dict(class_reserve=1.0), "class_reserve"), (dict(class_reserve=-0.1), "class_reserve")):
        with pytest.raises(ValueError, match=msg):
            Arbiter(**kw)


def test_burst_is_the_default_order():
    assert Arbiter().order == "burst"


def test_burst_order_equal_priorities_take_turns():
    """Two jobs with equal priorities: with order="burst" the job whose burst
    started first keeps the link until its burst ends; "chunk" interleaves."""
    for order, want in (("burst", ["a2", "a3", "b1", "b2"]), ("chunk", ["b1", "a2", "b2", "a3"])):
        a, _ = mk(credit=100, order=order)
        A, B = a.register("A", "L"), a.register("B", "L")
        jobs = {"A": A, "B": B}
        assert names(a.request(A, 1, 5, 100, "a1")) == [("A", "a1")]
        assert a.request(B, 1, 5, 100, "b1") == []
        assert a.request(A, 2, 5, 100, "a2") == []
        assert a.request(B, 2, 5, 100, "b2") == []
        assert a.request(A, 3, 5, 100, "a3") == []
        got, last = [], ("A", 1)
        for _ in range(4):
            (r,) = a.complete(jobs[last[0]], last[1])
            got.append(r.chunk)
            last = (r.job.job_id, r.token)
        assert got == want, order


def test_burst_order_a_boosted_burst_wins_with_all_its_chunks():
    """Job A's burst holds a boosted chunk (priority 9): all of A's chunks, even
    its priority-0 ones, go before B's priority-5 chunks; inside A the order is
    A's own (priority, then arrival)."""
    a, _ = mk(credit=100, order="burst")
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(B, 1, 5, 100, "b-hold")                      # granted: the link is busy
    a.request(B, 2, 5, 100, "b2")
    a.request(A, 1, 0, 100, "a-low")
    a.request(A, 2, 9, 100, "a-boosted")
    a.request(A, 3, 1, 100, "a-mid")
    order, last = [], (B, 1)
    for _ in range(4):
        (r,) = a.complete(*last)
        order.append(r.chunk)
        last = (r.job, r.token)
    assert order == ["a-boosted", "a-mid", "a-low", "b2"]


def test_burst_ends_when_the_job_has_nothing_left_on_the_link():
    """A's burst ends when its last grant completes: its next request starts a
    new burst behind B's, which started meanwhile."""
    a, _ = mk(credit=100, order="burst")
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 5, 100, "a1")
    a.request(B, 1, 5, 100, "b1")           # waits: B's burst starts now
    assert names(a.complete(A, 1)) == [("B", "b1")]
    a.request(A, 2, 5, 100, "a2")           # A's new burst (after B's)
    a.request(B, 2, 5, 100, "b2")           # still B's first burst
    assert names(a.complete(B, 1)) == [("B", "b2")]
    assert names(a.complete(B, 2)) == [("A", "a2")]
    assert a.stats()["L"]["bursts"] == 3     # A, B, A again


def test_a_step_tagged_burst_goes_on_across_a_gap_in_its_step():
    """As above, but A's requests say their training step: A's burst drains in
    a gap of its step (B gets the link meanwhile: nothing is held idle), and
    A's next chunk of the same step resumes A's burst, ahead of B's; a chunk of
    A's next step starts a new burst behind B's."""
    for a_next_step, want in ((1, ["a2", "b2"]), (2, ["b2", "a2"])):
        a, _ = mk(credit=100, order="burst")
        A, B = a.register("A", "L"), a.register("B", "L")
        a.request(A, 1, 5, 100, "a1", step=1)
        a.request(B, 1, 5, 100, "b1", step=7)
        assert names(a.complete(A, 1)) == [("B", "b1")]    # A's gap: B is served
        a.request(A, 2, 5, 100, "a2", step=a_next_step)
        a.request(B, 2, 5, 100, "b2", step=7)
        (r,) = a.complete(B, 1)
        (r2,) = a.complete(r.job, r.token)
        assert [r.chunk, r2.chunk] == want, a_next_step
        assert a.stats()["L"]["bursts"] == (2 if a_next_step == 1 else 3)


def test_burst_order_keeps_the_starvation_bound():
    a, _ = mk(credit=100, K=2, order="burst")
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 9, 100, "a1")
    a.request(B, 1, 0, 100, "b-starved")
    for t in range(2, 5):
        a.request(A, t, 9, 100, "a%d" % t)
    got, last = [], 1
    for _ in range(3):
        (r,) = a.complete(A if got == [] or got[-1] != "b-starved" else B, last)
        got.append(r.chunk)
        last = r.token
        if r.chunk == "b-starved":
            break
    assert got == ["a2", "a3", "b-starved"]     # passed over twice, then granted
    assert a.stats()["L"]["starvation_grants"] == 1


@pytest.mark.parametrize("order", ["chunk", "burst"])
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_invariants(seed, order):
    """Randomised: credit respected, nothing grantable left waiting, and with
    K = 0 every grant is the most urgent pending request -- order "chunk":
    (priority, then arrival); order "burst": (the job's burst priority =
    max(requested in the burst, requested in its previous burst), burst start,
    priority, arrival), computed here by an independent model."""
    import random
    rng = random.Random(seed)
    K = rng.choice([0, 0, 2, 5])
    credit = rng.choice([100, 250, 1000])
    a, clock = mk(credit=credit, lease=5.0, K=K, order=order)
    jobs = [a.register("J%d" % i, "L") for i in range(3)]
    granted = {}                     # (job, token) -> nbytes
    pending = {}                     # (job, token) -> (priority, seq)
    burst = {}                       # job -> [start, max priority] while it has live requests
    asked = {}                       # job -> max priority requested in its current/last burst
    seq = [0]
    tok = [0]

    def urgency(key, ps):
        if order == "chunk":
            return (ps[0], -ps[1])
        start, top = burst[key[0]]
        return (top, -start, ps[0], -ps[1])

    def end_idle_bursts():
        live = {k[0] for k in pending} | {k[0] for k in granted}
        for job in list(burst):
            if job not in live:
                del burst[job]

    def apply(grants, before_pending):
        for r in grants:
            key = (r.job.job_id, r.token)
            assert key in pending
            if K == 0:
                best = max(before_pending, key=lambda k: urgency(k, before_pending[k]))
                assert urgency(key, pending[key]) == urgency(best, before_pending[best]), \
                    "granted %r but %r was more urgent" % (key, best)
            before_pending.pop(key)
            del pending[key]
            granted[key] = r.nbytes

    for _ in range(400):
        op = rng.random()
        if op < 0.5 or not granted:
            j = rng.choice(jobs)
            tok[0] += 1
            seq[0] += 1
            prio, nbytes = rng.randint(-3, 3), rng.choice([0, 10, 60, 100, 300])
            if j.job_id in burst:
                burst[j.job_id][1] = max(burst[j.job_id][1], prio)
                asked[j.job_id] = max(asked[j.job_id], prio)
            else:
                last = asked.get(j.job_id)
                burst[j.job_id] = [seq[0], prio if last is None else max(prio, last)]
                asked[j.job_id] = prio
            pending[(j.job_id, tok[0])] = (prio, seq[0])
            apply(a.request(j, tok[0], prio, nbytes, "c"), dict(pending))
        elif op < 0.9:
            key = rng.choice(sorted(granted))
            job = next(j for j in jobs if j.job_id == key[0])
            del granted[key]
            end_idle_bursts()
            apply(a.complete(job, key[1]), dict(pending))
        elif op < 0.95:
            clock.t += 6.0               # every current grant expires
            expired = list(granted)
            granted.clear()
            end_idle_bursts()
            out = a.expire()
            apply(out, dict(pending))
            assert a.stats()["L"]["expired_leases"] >= len(expired)
        else:
            j = rng.choice(jobs)
            before = len(pending)
            for key in [k for k in pending if k[0] == j.job_id]:
                del pending[key]
            for key in [k for k in granted if k[0] == j.job_id]:
                del granted[key]
            burst.pop(j.job_id, None)
            asked.pop(j.job_id, None)        # re-registered below: a new job
            apply(a.drop(j), dict(pending))
            assert len(pending) <= before
            jobs[jobs.index(j)] = a.register(j.job_id, "L")
        ln = a.links["L"]
        assert ln.outstanding_bytes == sum(granted.values())
        assert ln.outstanding == len(granted)
        if sum(1 for n in granted.values() if n) > 1:       # an oversized grant goes alone
            assert ln.outstanding_bytes <= credit
        if pending:
            assert ln.outstanding_bytes > 0, "requests wait although no bytes are outstanding"
            head = a.head("L")
            assert ln.outstanding_bytes + head.nbytes > credit, "a grantable request is waiting"


class Model:
    """Independent, deliberately naive model of the documented grant rules (O(n)
    per step): class first, strictly; then "chunk": (priority, arrival) or
    "burst": (burst priority = max(requested in the burst, requested in the
    job's previous burst), burst start, priority, arrival), a burst starting
    when an idle job requests, unless the request carries the step tag of the
    job's last burst (then that burst goes on); within the
    highest pending class, a job passed over by K grants to other jobs of its
    class since its last grant (or since it began waiting) has its own next
    request granted next (the longest passed over first; ties: marked first);
    strict credit; no grant while a higher class holds a grant; while a job of a
    higher class is connected, the lower classes' grants hold at most
    credit - int(credit * reserve) bytes (any one request when they hold none);
    leases."""

    def __init__(self, credit, K, order, lease, reserve=0.0):
        self.credit, self.K, self.order, self.lease = credit, K, order, lease
        self.reserve = reserve
        self.connected = set()
        self.pending = []           # dicts, arrival order
        self.granted = {}           # (job, token) -> [nbytes, deadline]
        self.bursts = {}            # job -> [start, top priority]
        self.requested = {}         # job -> max priority requested in its current/last burst
        self.steps = {}             # job -> step tag of its current/last burst
        self.nbursts = 0
        self.seq = 0
        self.classes = {}
        self.class_grants = {}      # class -> grants
        self.marks = {}             # job -> (class grants when marked, mark order)
        self.nmarks = 0

    def rank(self, p):
        cls = self.classes[p["job"]]
        if self.order == "chunk":
            return (cls, p["prio"], -p["seq"])
        start, top = self.bursts[p["job"]]
        return (cls, top, -start, p["prio"], -p["seq"])

    def live(self, job):
        return any(p["job"] == job for p in self.pending) or any(k[0] == job for k in self.granted)

    def request(self, job, tok, prio, nbytes, now, step=0):
        if not self.live(job) and not (step and step == self.steps.get(job)):
            self.nbursts += 1
            last = self.requested.get(job)
            self.bursts[job] = [self.nbursts, prio if last is None else max(prio, last)]
            self.requested[job] = prio
            self.steps[job] = step
        else:                       # busy, or back within its burst's step: the burst goes on
            if step:
                self.steps[job] = step
            self.bursts[job][1] = max(self.bursts[job][1], prio)
            self.requested[job] = max(self.requested[job], prio)
        self.seq += 1
        if not any(p["job"] == job for p in self.pending):
            self._mark(job)
        self.pending.append(dict(job=job, tok=tok, prio=prio, nbytes=nbytes, seq=self.seq))
        return self.schedule(now)

    def _mark(self, job):
        self.nmarks += 1
        self.marks[job] = (self.class_grants.get(self.classes[job], 0), self.nmarks)

    def own_rank(self, p):
        return (p["prio"], -p["seq"])

    def complete(self, job, tok, now):
        if (job, tok) in self.granted:
            del self.granted[(job, tok)]
        else:
            left = [p for p in self.pending if (p["job"], p["tok"]) != (job, tok)]
            if len(left) == len(self.pending):
                return None
            self.pending = left
        return self.schedule(now)

    def renew(self, job, tok, now):
        if (job, tok) not in self.granted:
            return False
        self.granted[(job, tok)][1] = now + self.lease
        return True

    def expire(self, now):
        gone = [k for k, (_, d) in self.granted.items() if d <= now]
        for k in gone:
            del self.granted[k]
        return self.schedule(now) if gone else []

    def drop(self, job, now):
        self.connected.discard(job)
        self.requested.pop(job, None)           # a re-registered job starts afresh
        self.steps.pop(job, None)
        self.bursts.pop(job, None)
        self.pending = [p for p in self.pending if p["job"] != job]
        self.granted = {k: v for k, v in self.granted.items() if k[0] != job}
        return self.schedule(now)

    def schedule(self, now):
        out = []
        while self.pending:
            top = max(self.classes[p["job"]] for p in self.pending)
            waiting = sorted({p["job"] for p in self.pending if self.classes[p["job"]] == top},
                             key=lambda j: self.marks[j])
            starved = waiting[0] if self.K and waiting and \
                self.class_grants.get(top, 0) - self.marks[waiting[0]][0] >= self.K else None
            if starved is not None:
                r = max((p for p in self.pending if p["job"] == starved), key=self.own_rank)
            else:
                r = max(self.pending, key=self.rank)
            outstanding = sum(n for n, _ in self.granted.values())
            if outstanding and outstanding + r["nbytes"] > self.credit:
                break
            if any(self.classes[j] > self.classes[r["job"]] for j, _ in self.granted):
                break
            top_conn = max(self.classes[j] for j in self.connected)
            if self.classes[r["job"]] < top_conn:
                low = sum(n for (j, _), (n, _) in self.granted.items()
                          if self.classes[j] < top_conn)
                if low and low + r["nbytes"] > self.credit - int(self.credit * self.reserve):
                    break
            self.pending.remove(r)
            cls = self.classes[r["job"]]
            self.class_grants[cls] = self.class_grants.get(cls, 0) + 1
            if self.K and any(p["job"] == r["job"] for p in self.pending):
                self._mark(r["job"])
            self.granted[(r["job"], r["tok"])] = [r["nbytes"], now + self.lease]
            out.append((r["job"], r["tok"]))
        return out


@pytest.mark.parametrize("order", ["chunk", "burst"])
@pytest.mark.parametrize("seed", range(12))
def test_grant_sequence_equals_the_naive_model(seed, order):
    """The O(log n) structures of core.Arbiter grant exactly what the naive
    model grants, call by call: classes and their reserve, starvation bound,
    cancels, renewals, lease expiry and drops included; step-tagged requests
    on odd seeds."""
    import random
    rng = random.Random(seed)
    K = rng.choice([0, 1, 2, 3, 8])
    credit = rng.choice([1, 100, 250])
    reserve = rng.choice([0.0, 0.5, 0.75])
    lease = 5.0
    a, clock = mk(credit=credit, lease=lease, K=K, order=order, class_reserve=reserve)
    m = Model(credit, K, order, lease, reserve)
    names = ["J%d" % i for i in range(rng.randint(1, 5))]
    tagged = seed % 2 == 1                      # odd seeds: requests carry step tags
    job_step = {n: 1 if tagged else 0 for n in names}
    jobs = {}
    for n in names:
        m.classes[n] = rng.choice([0, 0, 1, 2])
        m.connected.add(n)
        jobs[n] = a.register(n, "L", job_class=m.classes[n])
    tok = 0
    live = []                                   # (job, token) requested and not finished

    def got(grants):
        return [(r.job.job_id, r.token) for r in grants]

    for step in range(600):
        op = rng.random()
        if op < 0.5 or not live:
            n = rng.choice(names)
            tok += 1
            prio, nbytes = rng.randint(-3, 3), rng.choice([0, 1, 10, 60, 100, 300])
            if tagged and rng.random() < 0.15:
                job_step[n] += 1                # the job's next training step
            live.append((n, tok))
            want = m.request(n, tok, prio, nbytes, clock.t, job_step[n])
            assert got(a.request(jobs[n], tok, prio, nbytes, "c", job_step[n])) == want, step
        elif op < 0.8:
            n, t = rng.choice(live)             # completes a grant or cancels a pending one
            live.remove((n, t))
            want = m.complete(n, t, clock.t)
            res = a.complete(jobs[n], t)
            assert (None if res is None else got(res)) == want, step
        elif op < 0.87:
            n, t = rng.choice(live)
            assert a.renew(jobs[n], t) == m.renew(n, t, clock.t)
        elif op < 0.95:
            clock.t += rng.choice([0.5, 2.0, 6.0])
            want = m.expire(clock.t)
            assert sorted(got(a.expire())) == sorted(want), step
        else:
            n = rng.choice(names)
            assert got(a.drop(jobs[n])) == m.drop(n, clock.t), step
            m.classes[n] = rng.choice([0, 1, 2])
            m.connected.add(n)
            jobs[n] = a.register(n, "L", job_class=m.classes[n])
        ln = a.links["L"]
        assert ln.npending == len(m.pending)
        assert ln.outstanding_bytes == sum(n for n, _ in m.granted.values())


def test_job_class_outranks_priority_and_bursts_in_both_orders():
    for order in ("chunk", "burst"):
        a, _ = mk(credit=100, order=order)
        low = a.register("low", "L")                # class 0
        high = a.register("high", "L", job_class=2)
        mid = a.register("mid", "L", None, 1)       # positional peer still works
        a.request(low, 1, 0, 100, "hold")
        a.request(low, 2, 50, 100, "low-urgent")    # urgent chunk, early burst, lowest class
        a.request(mid, 1, 1, 100, "mid")
        a.request(high, 1, -5, 100, "high-lazy")
        got, cur = [], (low, 1)
        for _ in range(3):
            (r,) = a.complete(*cur)
            got.append(r.chunk)
            cur = (r.job, r.token)
        assert got == ["high-lazy", "mid", "low-urgent"], order
        assert a.stats()["L"]["job_classes"] == {"low": 0, "high": 2, "mid": 1}


def test_classes_are_strict_the_lower_class_runs_on_the_leftover_link():
    """While the class-2 job has a request pending, no class-0 request is
    granted, however often it is passed over; as soon as the class-2 job has
    nothing pending the class-0 job gets the link; within a class the
    starvation bound still holds."""
    K = 3
    for order in ("chunk", "burst"):
        a, _ = mk(credit=1, K=K, order=order)
        high = a.register("high", "L", job_class=2)
        low = a.register("low", "L")
        low2 = a.register("low2", "L")
        a.request(high, 1, 0, 1, "h")
        for t in range(1, 4):
            a.request(low, t, 9, 1, "l%d" % t)
        a.request(low2, 1, -5, 1, "starved")       # lower priority, same class
        tok, cur, granted = 1, (high, 1), []
        for _ in range(4 * (K + 1)):
            tok += 1
            a.request(high, tok, 0, 1, "h")         # the high class always has one waiting
            (r,) = a.complete(*cur)
            granted.append(r.job.job_id)
            cur = (r.job, r.token)
        assert set(granted) == {"high"}, (order, granted)
        (r,) = a.complete(*cur)                     # the high class is idle now
        rest = [r.chunk]
        while True:
            got = a.complete(r.job, r.token)
            if not got:
                break
            (r,) = got
            rest.append(r.chunk)
        # the leftover link goes to class 0: its burst/priority order, and the
        # low-priority request of low2 goes once passed over K times
        assert sorted(rest) == ["l1", "l2", "l3", "starved"], (order, rest)
        assert rest.index("starved") <= K, (order, rest)


def test_classes_are_strict_on_the_link_no_lower_grant_beside_a_higher_one():
    """While the class-1 job holds a grant (its next chunk not requested yet),
    the class-0 job is not granted into the free credit; when the class-1 job
    holds nothing, it is. Within a class the credit is shared as before."""
    for order in ("chunk", "burst"):
        a, _ = mk(credit=100, order=order)
        high = a.register("high", "L", job_class=1)
        low = a.register("low", "L")
        peer = a.register("peer", "L", job_class=1)
        assert [r.token for r in a.request(high, 1, 0, 25, "h")] == [1]
        assert a.request(low, 1, 9, 25, "l") == []              # 75 bytes free, held back
        assert [r.token for r in a.request(peer, 1, 0, 25, "p")] == [1]   # same class: shares
        assert a.complete(high, 1) == []                        # peer still holds one
        assert names(a.complete(peer, 1)) == [("low", "l")]
        assert names(a.request(high, 2, 0, 25, "h2")) == [("high", "h2")]   # granted beside it


def test_class_reserve_keeps_part_of_the_credit_for_a_connected_higher_class():
    """A class-1 job is connected but computing (nothing requested): the
    class-0 job's grants stop at half the credit, so the class-1 job's next
    burst is granted at once; without a higher class, or with the reserve
    off, the class-0 job fills the credit."""
    for order in ("chunk", "burst"):
        a, _ = mk(credit=100, order=order, class_reserve=0.5)
        high = a.register("high", "L", job_class=1)
        low = a.register("low", "L")
        got = [r.token for t in range(1, 5) for r in a.request(low, t, 0, 25, "l")]
        assert got == [1, 2], order                 # 50 bytes: the lower classes' cap
        assert names(a.request(high, 1, 0, 25, "h")) == [("high", "h")]   # at once
        assert a.stats()["L"]["lower_class_cap_bytes"] == 50
        assert a.links["L"].outstanding_bytes == 75  # room for one more in the credit,
        assert a.complete(high, 1) == [] and a.is_pending(low, 3)   # not in the lower cap
        assert [r.token for r in a.complete(low, 1)] == [3]
        # no higher class left: the whole credit
        assert [r.token for r in a.drop(high)] == [4]
        assert [r.token for r in a.request(low, 5, 0, 25, "l")] == [5]
        assert a.links["L"].outstanding_bytes == 100

        for reserve, classes in ((0.0, (1, 0)), (0.5, (0, 0))):
            b, _ = mk(credit=100, order=order, class_reserve=reserve)
            b.register("other", "L", job_class=classes[0])
            low = b.register("low", "L", job_class=classes[1])
            got = [r.token for t in range(1, 6) for r in b.request(low, t, 0, 25, "l")]
            assert got == [1, 2, 3, 4], (order, reserve, classes)


def test_class_reserve_grants_a_larger_lower_class_request_alone():
    """A lower-class request above the lower classes' cap is granted when they
    hold nothing (the class-0 job progresses), never beside another one."""
    a, _ = mk(credit=100, class_reserve=0.75)     # cap 25 bytes
    a.register("high", "L", job_class=1)
    low = a.register("low", "L")
    assert [r.token for r in a.request(low, 1, 0, 60, "big")] == [1]
    assert a.request(low, 2, 0, 10, "small") == []
    assert [r.token for r in a.complete(low, 1)] == [2]


def test_renew_keeps_a_grant_past_its_lease():
    a, clock = mk(credit=100, lease=2.0)
    A, B = a.register("A", "L"), a.register("B", "L")
    a.request(A, 1, 5, 100, "slow-allreduce")
    assert a.request(B, 1, 1, 100, "b") == []
    for _ in range(5):                          # 7.5 s, far past the 2 s lease
        clock.t += 1.5
        assert a.renew(A, 1) is True
        assert a.expire() == []
    assert a.links["L"].outstanding_bytes == 100 and a.is_pending(B, 1)
    assert a.stats()["L"]["renewals"] == 5 and a.stats()["L"]["expired_leases"] == 0
    clock.t += 2.0                              # no renewal: now it expires
    assert names(a.expire()) == [("B", "b")]
    assert a.renew(A, 1) is False               # expired
    assert a.renew(B, 99) is False              # unknown
    a.request(B, 2, 1, 100, "c")
    assert a.renew(B, 2) is False               # pending, not granted


def test_state_of_departed_jobs_and_links_stays_bounded():
    """Jobs and links come and go: a link keeps the grant counts of its
    connected jobs and of the last max_departed_jobs ids that left; at most
    max_idle_links links without jobs are kept (readable after a run)."""
    a, _ = mk(credit=1000, max_departed_jobs=3, max_idle_links=2)
    keep = a.register("keeper", "L")
    a.request(keep, 1, 0, 100)
    for i in range(10):                             # churn of job ids on L
        j = a.register("job%d" % i, "L", job_class=i % 2)
        a.request(j, 1, 0, 1)
        a.drop(j)
    st = a.stats()["L"]
    assert st["grants_per_job"] == {"keeper": 1, "job7": 1, "job8": 1, "job9": 1}
    assert st["job_classes"] == {"keeper": 0} and st["connected_jobs"] == 1
    twin1, twin2 = a.register("twin", "L"), a.register("twin", "L")     # a job that reconnects
    a.complete(keep, 1)
    a.request(twin1, 1, 0, 1)
    a.drop(twin1)
    a.request(twin2, 1, 0, 1)
    assert a.stats()["L"]["grants_per_job"]["twin"] == 2     # one id, counted across connections
    back = a.register("back", "L")                  # leaves, comes back: connected again ...
    a.request(back, 1, 0, 1)
    a.drop(back)
    back = a.register("back", "L")
    for i in range(5):                              # ... so later departures never evict it
        a.drop(a.register("gone%d" % i, "L"))
    assert a.stats()["L"]["grants_per_job"]["back"] == 1
    for n in range(5):                              # links whose last job left
        j = a.register("j", "link%d" % n)
        a.request(j, 1, 0, 100)
        a.drop(j)
    assert sorted(a.links) == ["L", "link3", "link4"] and a.pruned_links == 3
    assert a.stats()["link4"]["grants_per_job"] == {"j": 1}    # still readable after the run
    assert a.stats()["link4"]["connected_jobs"] == 0
    j = a.register("again", "link4")                # an idle link comes back with its counters
    assert len(a.request(j, 1, 0, 100)) == 1 and a.stats()["link4"]["grants"] == 2
    for jb in (keep, twin2, back, j):
        a.drop(jb)
    a.drop(j)                                       # twice: harmless
    assert len(a.links) == 2 and a.next_expiry() is None
    j = a.register("new", "link0")                  # a pruned link comes back with its credit
    assert len(a.request(j, 1, 0, 100)) == 1 and a.stats()["link0"]["grants"] == 1


def test_frame_reader_splits_any_chunking():
    import random
    from horovod_prio.arbiter import protocol as P
    rng = random.Random(3)
    bodies = [bytes([i % 251]) * rng.randint(1, 300) for i in range(200)]
    stream = b"".join(P.frame(b) for b in bodies)
    for _ in range(20):
        rd, out, pos = P.FrameReader(), [], 0
        while pos < len(stream):
            n = rng.choice([1, 2, 3, 5, 40, 305, 1000, 5000])
            out += rd.feed(stream[pos:pos + n])
            pos += n
        assert out == bodies and rd.buffered == 0
    rd = P.FrameReader(max_frame=10)
    with pytest.raises(P.ProtocolError, match="bad frame length"):
        rd.feed(P.frame(b"x" * 11))
    with pytest.raises(P.ProtocolError, match="bad frame length"):
        P.FrameReader().feed(b"\0\0\0\0rest")


def test_a_boosted_jobs_next_burst_ranks_high_from_its_first_chunk():
    """A step's chunks come output side first (low priority) and the boosted
    input side last: the boosted job's new burst must outrank the other job's
    older burst from its first chunk on, or it could not overlap its
    communication with its backward pass. A lowered boost counts from the
    burst after the one that asked for less."""
    a, _ = mk(credit=1, K=0, order="burst")
    boosted, other = a.register("boosted", "L"), a.register("other", "L")
    blocker = a.register("blocker", "L")
    a.request(blocker, 1, 0, 1, "busy")                   # the link is taken
    a.request(boosted, 1, 0, 1, "b-out")                  # previous step: low ...
    a.request(boosted, 2, 7, 1, "b-in")                   # ... then its boosted input side
    (r,) = a.complete(blocker, 1)
    assert r.chunk == "b-in"
    (r,) = a.complete(boosted, 2)
    assert r.chunk == "b-out"
    assert a.complete(boosted, 1) == []                   # its burst ended
    a.request(blocker, 2, 0, 1, "busy")
    a.request(other, 1, 3, 1, "o1")                       # the other job's burst starts first
    a.request(boosted, 3, 0, 1, "b-out-next")             # the boosted job's next step: low chunk first
    (r,) = a.complete(blocker, 2)
    assert r.chunk == "b-out-next"                        # ranked at 7 (its last burst), not 0
    # the boost was lowered: this burst asks for at most 4 (still ranked 7 now) ...
    a.request(boosted, 4, 4, 1, "b-in-next")
    (r,) = a.complete(boosted, 3)
    assert r.chunk == "b-in-next"
    (r,) = a.complete(boosted, 4)                         # burst over: the other job's turn
    assert r.chunk == "o1"
    # ... so its next burst starts at 4, below the other job's 5
    a.request(other, 2, 5, 1, "o2")
    a.request(boosted, 5, 0, 1, "b3")
    (r,) = a.complete(other, 1)
    assert r.chunk == "o2"


@pytest.mark.parametrize("order", ["chunk", "burst"])
def test_lazy_heaps_stay_bounded_by_their_live_entries(order):
    """Requests of jobs that leave stay in the heaps as stale entries (lazy
    deletion); past about twice the live entries they are dropped at once, so
    a link that sees many short-lived jobs keeps heaps of its live size and
    still grants in order."""
    a, _ = mk(credit=1, order=order, K=2)
    keep = a.register("keep", "L")
    a.request(keep, 1, 0, 1, "held")          # granted: the link is full from now on
    a.request(keep, 2, 0, 1, "waits")
    for i in range(400):
        j = a.register("j%d" % i, "L")
        a.request(j, 1, 5, 1, "x")
        a.drop(j)
        assert a.head("L").chunk == "waits"
    ln = a.links["L"]
    heaps = [ln.heap, ln.jheap] + [lane.starve for lane in ln.lanes.values()]
    assert max(len(h) for h in heaps) <= 2 * len(ln.jobs) + 64 + 1
    assert names(a.complete(keep, 1)) == [("keep", "waits")]


def test_default_class_reserve_changes_nothing_on_a_one_class_link():
    """The service's default reserve acts only while a higher class is
    connected: with one class on the link (any class, jobs joining and
    leaving) it grants exactly what no reserve grants, call by call."""
    import random
    from horovod_prio.arbiter.core import DEFAULT_CLASS_RESERVE
    assert DEFAULT_CLASS_RESERVE == 0.875
    for seed in range(8):
        rng = random.Random(seed)
        cls = rng.choice([0, 0, 3, -2])
        arbs = [mk(credit=100, order=order, class_reserve=r)
                for r in (0.0, DEFAULT_CLASS_RESERVE) for order in ("chunk", "burst")][:4]
        pairs = [(arbs[0], arbs[2]), (arbs[1], arbs[3])]
        for (a, ca), (b, cb) in pairs:
            ja = {n: a.register(n, "L", job_class=cls) for n in ("A", "B", "C")}
            jb = {n: b.register(n, "L", job_class=cls) for n in ("A", "B", "C")}
            live, tok = [], 0
            for step in range(300):
                op = rng.random()
                if op < 0.55 or not live:
                    n, tok = rng.choice("ABC"), tok + 1
                    prio, nbytes = rng.randint(-2, 2), rng.choice([1, 10, 40, 100, 150])
                    live.append((n, tok))
                    assert names(a.request(ja[n], tok, prio, nbytes, str(tok))) == \
                        names(b.request(jb[n], tok, prio, nbytes, str(tok))), (seed, step)
                elif op < 0.95:
                    n, t = live.pop(rng.randrange(len(live)))
                    ga, gb = a.complete(ja[n], t), b.complete(jb[n], t)
                    assert (ga is None) == (gb is None)
                    assert names(ga or []) == names(gb or []), (seed, step)
                else:
                    n = rng.choice("ABC")
                    assert names(a.drop(ja[n])) == names(b.drop(jb[n])), (seed, step)
                    live = [x for x in live if x[0] != n]
                    ja[n] = a.register(n, "L", job_class=cls)
                    jb[n] = b.register(n, "L", job_class=cls)
            assert a.links["L"].c["grants"] == b.links["L"].c["grants"] > 20


def test_default_class_reserve_holds_the_lower_class_to_an_eighth_beside_a_higher_one():
    """The same reserve acts as soon as a higher class connects (8 MiB credit:
    the class-0 job holds 1 MiB, or one larger chunk alone) and stops when it
    leaves."""
    from horovod_prio.arbiter.core import DEFAULT_CLASS_RESERVE
    M = 1 << 20
    a, _ = mk(credit=8 * M, class_reserve=DEFAULT_CLASS_RESERVE)
    low = a.register("low", "L")
    high = a.register("high", "L", job_class=1)
    assert a.higher_class_connected("L", 0) and not a.higher_class_connected("L", 1)
    got = [r.token for t in range(1, 9) for r in a.request(low, t, 0, M // 2, "l")]
    assert got == [1, 2]                        # 1 MiB of 8
    assert [r.token for r in a.drop(high)] == [3, 4, 5, 6, 7, 8]    # gone: the whole credit
    assert not a.higher_class_connected("L", 0)
    assert not a.higher_class_connected("nowhere", 0)


def test_the_service_and_its_command_line_default_to_the_measured_reserve():
    from horovod_prio.arbiter.cli import build_parser
    from horovod_prio.arbiter.core import DEFAULT_CLASS_RESERVE
    from horovod_prio.arbiter.server import ArbiterServer
    p = build_parser()
    assert p.parse_args(["--bind", "127.0.0.1:0"]).class_reserve == DEFAULT_CLASS_RESERVE
    assert p.parse_args(["--bind", "127.0.0.1:0", "--class-reserve", "0"]).class_reserve == 0.0
    srv = ArbiterServer("127.0.0.1", 0, "s" * 32)
    assert srv.arbiter.class_reserve == DEFAULT_CLASS_RESERVE
    assert srv.arbiter.links == {} and Arbiter().class_reserve == 0.0   # the core: off
