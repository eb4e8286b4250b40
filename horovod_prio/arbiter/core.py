"""Grant policy of the link arbiter (no I/O, no threads; pure Python).

Per link, the arbiter grants the most urgent pending request across all jobs
(larger ``priority`` = more urgent) while the granted-but-unfinished bytes on
that link stay within the link's credit. Two orders:

* ``order="chunk"``: strictly by the request's own priority; equal priorities
  in arrival order.
* ``order="burst"`` (the default): a job's *burst* is the stretch during
  which it has requests pending or granted on the link (in training: one
  step's gradient chunks). A request ranks by its burst's priority -- the
  highest priority the job has requested in that burst -- then by which
  burst started first, then by its own priority, then by arrival. The step of a data-parallel job ends
  only when its last chunk is reduced, so every chunk of a burst blocks the
  job as long as its most urgent one; comparing bursts makes a boosted job
  (the monitor's raise) win the link for its whole step, and lets jobs with
  equal priorities take turns instead of interleaving chunk by chunk (which
  stretches every job's step). Priorities stay on the one scale of the gates
  (base + boost x step); within a job the order is the job's own.

A request larger than the credit is granted alone once nothing is
outstanding. Strict order: if the head does not fit, nothing behind it is
granted either (small low-priority chunks never overtake a big urgent one).

Starvation bound ``K``: a pending request is *passed over* each time a request
that arrived after it is granted; once passed over ``K`` times it is granted
next regardless of priority (oldest such request first; still subject to the
credit). ``K = 0`` disables the bound.

Leases: a grant not completed within ``lease_seconds`` expires; its bytes
return to the link (counted in ``expired_leases``). :meth:`Arbiter.drop`
removes a disconnected job's grants and pending requests.

Every mutating call returns the list of :class:`Request` objects granted as
a consequence (possibly other jobs' requests); the caller sends the GRANTs.
"""
import heapq
import time
from collections import OrderedDict

PENDING, GRANTED, DONE = 0, 1, 2


class Job:
    """One registered connection (rank 0 of one job on one link)."""

    __slots__ = ("job_id", "link", "reqs", "grants", "peer", "burst_priority", "burst_seq",
                 "__weakref__")

    def __init__(self, job_id, link, peer=None):
        self.job_id = job_id
        self.link = link
        self.reqs = {}          # token -> Request (pending or granted)
        self.grants = 0
        self.peer = peer        # opaque: the server's connection object
        self.burst_priority = None  # max priority requested in the current burst (None: idle)
        self.burst_seq = 0          # when the current burst started (link-wide counter)


class Request:
    __slots__ = ("job", "token", "chunk", "priority", "nbytes", "seq", "t_arrival",
                 "passed", "state", "deadline")

    def __init__(self, job, token, chunk, priority, nbytes, seq, now):
        self.job = job
        self.token = token
        self.chunk = chunk
        self.priority = priority
        self.nbytes = nbytes
        self.seq = seq
        self.t_arrival = now
        self.passed = 0
        self.state = PENDING
        self.deadline = None

    def __repr__(self):
        return "Request(%s/%s prio=%d bytes=%d)" % (self.job.job_id, self.chunk, self.priority, self.nbytes)


class Link:
    def __init__(self, name, credit):
        self.name = name
        self.credit = credit
        self.outstanding_bytes = 0
        self.outstanding = 0
        self.pending = {}       # seq -> Request, arrival order
        self.heap = []          # (-priority, seq, Request), lazy deletion
        self.starving = []      # (seq, Request), lazy deletion
        self.jobs = set()
        self.c = {"grants": 0, "immediate_grants": 0, "waits": 0, "wait_seconds_total": 0.0,
                  "wait_seconds_max": 0.0, "expired_leases": 0, "starvation_grants": 0,
                  "completions": 0, "cancelled": 0, "dropped": 0}
        self.per_job = {}       # job_id -> grants
        self.bursts = 0         # bursts started (counted in both orders)

    def stats(self):
        d = dict(self.c)
        d.update(connected_jobs=len(self.jobs), pending=len(self.pending),
                 outstanding_grants=self.outstanding, outstanding_bytes=self.outstanding_bytes,
                 credit_bytes=self.credit, grants_per_job=dict(self.per_job), bursts=self.bursts)
        return d


class Arbiter:
    """The grant policy; see the module docstring."""

    ORDERS = ("burst", "chunk")

    def __init__(self, credit_bytes=16 << 20, lease_seconds=10.0, starvation_bound=8,
                 link_credits=None, clock=time.monotonic, max_pending_per_job=1 << 16,
                 order="burst"):
        if order not in self.ORDERS:
            raise ValueError("order must be one of %s, got %r" % ("/".join(self.ORDERS), order))
        if credit_bytes < 1:
            raise ValueError("credit_bytes must be >= 1, got %r" % (credit_bytes,))
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be > 0, got %r" % (lease_seconds,))
        if starvation_bound < 0:
            raise ValueError("starvation_bound must be >= 0, got %r" % (starvation_bound,))
        self.credit_bytes = int(credit_bytes)
        self.lease_seconds = float(lease_seconds)
        self.starvation_bound = int(starvation_bound)
        self.link_credits = dict(link_credits or {})
        self.clock = clock
        self.order = order
        self.max_pending_per_job = max_pending_per_job
        self.links = {}
        self._leases = OrderedDict()    # Request -> None, in grant order (deadlines ascend)
        self._seq = 0

    # ------------------------------------------------------------ jobs
    def register(self, job_id, link, peer=None):
        ln = self.links.get(link)
        if ln is None:
            ln = self.links[link] = Link(link, self.link_credits.get(link, self.credit_bytes))
        job = Job(job_id, link, peer)
        ln.jobs.add(job)
        return job

    def drop(self, job):
        """Forget a disconnected job: its pending requests and grants."""
        ln = self.links[job.link]
        ln.jobs.discard(job)
        for r in list(job.reqs.values()):
            self._remove(ln, r)
            ln.c["dropped"] += 1
        job.reqs.clear()
        return self._schedule(ln, self.clock())

    # ------------------------------------------------------------ requests
    def request(self, job, token, priority, nbytes, chunk=""):
        """Add a request; returns the grants it triggers (``[]`` = it waits)."""
        if token in job.reqs:
            raise ValueError("duplicate token %d" % token)
        if len(job.reqs) >= self.max_pending_per_job:
            raise ValueError("too many outstanding requests (%d)" % len(job.reqs))
        ln = self.links[job.link]
        now = self.clock()
        self._seq += 1
        r = Request(job, token, chunk, priority, nbytes, self._seq, now)
        if not job.reqs:                        # idle -> a new burst starts
            ln.bursts += 1
            job.burst_seq = ln.bursts
            job.burst_priority = priority
        elif priority > job.burst_priority:
            job.burst_priority = priority
        job.reqs[token] = r
        ln.pending[r.seq] = r
        if self.order == "chunk":
            heapq.heappush(ln.heap, (-priority, r.seq, r))
        out = self._schedule(ln, now)
        if r.state == PENDING:
            ln.c["waits"] += 1
        else:
            ln.c["immediate_grants"] += 1
        return out

    def complete(self, job, token):
        """A granted chunk finished (or the client cancelled a pending one)."""
        r = job.reqs.pop(token, None)
        if r is None:
            return None     # unknown: expired lease or late message
        ln = self.links[job.link]
        ln.c["completions" if r.state == GRANTED else "cancelled"] += 1
        self._remove(ln, r)
        return self._schedule(ln, self.clock())

    cancel = complete

    def is_pending(self, job, token):
        r = job.reqs.get(token)
        return r is not None and r.state == PENDING

    # ------------------------------------------------------------ leases
    def next_expiry(self):
        for r in self._leases:
            return r.deadline
        return None

    def expire(self, now=None):
        now = self.clock() if now is None else now
        out = []
        touched = set()
        while self._leases:
            r = next(iter(self._leases))
            if r.deadline > now:
                break
            ln = self.links[r.job.link]
            ln.c["expired_leases"] += 1
            r.job.reqs.pop(r.token, None)
            self._remove(ln, r)
            touched.add(ln)
        for ln in touched:
            out += self._schedule(ln, now)
        return out

    # ------------------------------------------------------------ internals
    def _remove(self, ln, r):
        if r.state == PENDING:
            del ln.pending[r.seq]
        elif r.state == GRANTED:
            ln.outstanding_bytes -= r.nbytes
            ln.outstanding -= 1
            self._leases.pop(r, None)
        r.state = DONE

    def _pick(self, ln):
        st = ln.starving
        while st:
            r = st[0][1]
            if r.state == PENDING:
                return r, st
            heapq.heappop(st)
        if self.order == "burst":
            # A linear scan: a job's requests change rank when its burst priority
            # rises, so no static heap key fits. Pending requests per link are a few
            # dozen in practice (each job asks only within its local credit); the
            # worst case is bounded by max_pending_per_job per connected job.
            best = bkey = None
            for r in ln.pending.values():
                j = r.job
                k = (-j.burst_priority, j.burst_seq, -r.priority, r.seq)
                if bkey is None or k < bkey:
                    best, bkey = r, k
            return best, None
        h = ln.heap
        while h:
            r = h[0][2]
            if r.state == PENDING:
                return r, h
            heapq.heappop(h)
        return None, None

    def _schedule(self, ln, now):
        out = []
        K = self.starvation_bound
        while True:
            r, src = self._pick(ln)
            if r is None:
                break
            if ln.outstanding_bytes and ln.outstanding_bytes + r.nbytes > ln.credit:
                break
            if src is not None:
                heapq.heappop(src)
            del ln.pending[r.seq]
            r.state = GRANTED
            r.deadline = now + self.lease_seconds
            self._leases[r] = None
            ln.outstanding_bytes += r.nbytes
            ln.outstanding += 1
            c = ln.c
            c["grants"] += 1
            if src is ln.starving:
                c["starvation_grants"] += 1
            w = now - r.t_arrival
            c["wait_seconds_total"] += w
            if w > c["wait_seconds_max"]:
                c["wait_seconds_max"] = w
            r.job.grants += 1
            ln.per_job[r.job.job_id] = ln.per_job.get(r.job.job_id, 0) + 1
            out.append(r)
            if K:
                seq = r.seq
                for older in ln.pending.values():
                    if older.seq > seq:
                        break
                    older.passed += 1
                    if older.passed == K:
                        heapq.heappush(ln.starving, (older.seq, older))
        return out

    def stats(self):
        return {name: ln.stats() for name, ln in sorted(self.links.items())}
