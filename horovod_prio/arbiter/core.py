"""Grant policy of the link arbiter (no I/O, no threads; pure Python).

Per link, the arbiter grants the most urgent pending request across all jobs
while the granted-but-unfinished bytes on that link stay within the link's
credit. Urgency compares, in this order:

1. the job's **class** (``job_class``, an integer given at registration;
   ``HOROVOD_PRIO_JOB_PRIORITY`` on the job side): every request of a higher
   class outranks every request of a lower class;
2. within a class, the ``order``:

   * ``"burst"`` (the default): a job's *burst* is the stretch during which it
     has requests pending or granted on the link (in training: one step's
     gradient chunks). A request ranks by its burst's priority -- the highest
     priority the job has requested in that burst, and at least the highest it
     requested in its previous burst -- then by which burst started first, then
     by its own priority, then by arrival. A step's chunks come output side
     first (lowest priority) and input side last (highest, the one the boost
     raises), so without the previous burst's level a boosted job would rank
     low for most of its backward pass and could not overlap its
     communication with it; a boost lowered by a decay counts from the burst
     after. A data-parallel
     step ends only when its last chunk is reduced, so every chunk of a burst
     blocks the job as long as its most urgent one: comparing bursts lets a
     boosted job (the monitor's raise) win the link for its whole step, and
     lets jobs of equal priority take turns instead of interleaving chunk by
     chunk.

     A request may carry the job's training *step* (a positive tag; 0 =
     untagged). Then a burst is the job's step: it does not end at a gap
     inside the step (the backward pass produced nothing for a moment and the
     job's chunks drained), only when a request of another step finds the job
     idle. Without the tag, jobs whose backward passes leave gaps take turns
     *within* a step (the job whose burst ended loses its place to the other
     job's burst for the rest of its step), which keeps identical jobs in
     phase: both wait for each other's tails every step. With it, the job
     whose step started first keeps the link for its whole step (its gaps
     still go to the others: a burst never holds the link idle), so the jobs
     drift out of phase and one computes while the other sends.
   * ``"chunk"``: the request's own priority; equal priorities in arrival order.

   Larger ``priority`` = more urgent, on the one scale of the gates
   (base + boost x step).

A request larger than the credit is granted alone once nothing is
outstanding. Strict order: if the head does not fit, nothing behind it is
granted either (small low-priority chunks never overtake a big urgent one).

Classes are strict in the queue and on the link: a request is granted only
while no job of a higher class has a request pending *or a grant
outstanding* on the link. So no lower-class chunk is granted beside a
higher class's chunk in flight, even while that job's next chunk is not ready
yet (lower-class grants already made run on); the lower classes run on the
link the higher classes leave: their compute phases and the moments of their
backward passes when they hold no grant. A higher-class job that holds a
grant for long (a stalled allreduce whose lease its client keeps renewing)
keeps the lower classes off the link that long; their clients' ``max_wait``
(10 s by default) then releases their chunks without a grant.

Class reserve (``class_reserve``; the core's default 0 = off, the service's
:data:`DEFAULT_CLASS_RESERVE`): while a job of a higher
class is connected to the link, the lower classes' grants together hold at
most ``credit - int(credit * class_reserve)`` bytes (one request at a time if
it is larger), so a higher-class job's next burst finds that share of the
credit free instead of waiting for the lower classes' grants to finish. It
costs the lower classes link time (fewer of their chunks in flight); with one
class on the link it does nothing.

Starvation bound ``K`` (per job, within a class): a job with pending requests
is *passed over* each time a request of another job of its class is granted;
once passed over ``K`` times since its own last grant (or since its requests
started waiting), its next request (in its own order) is granted next,
regardless of priority and burst (the job passed over longest first; still
subject to the credit), and its count starts again. So every job of a class
gets at least one of every ``K + 1`` grants while it waits. ``K = 0``
disables the bound. Counting per job, not per request, matters: a per-request
count reaches ``K`` for a job's whole backlog at once and hands it the link
for a whole step, undoing both the burst order and the boost. The bound acts
within a class only: classes stay strict (above).

Leases: a grant not completed within ``lease_seconds`` expires; its bytes
return to the link (counted in ``expired_leases``); :meth:`Arbiter.renew`
restarts a grant's lease (the client renews grants it still holds).
:meth:`Arbiter.drop` removes a disconnected job's grants and pending
requests.

State stays bounded however many jobs come and go: a link keeps the grant
count of at most ``max_departed_jobs`` job ids that left it (besides the
connected ones; oldest departure forgotten first), and at most
``max_idle_links`` links without any job are kept (so their counters stay
readable after a run); older idle links are forgotten (``pruned_links``).

Cost per grant is O(log n) in the pending requests of the link (a request
that arrives while nothing waits on its link and fits is granted without
entering any queue: the common case of a link with headroom):

* "chunk": one heap of (class, priority, arrival);
* "burst": per job a heap of its pending requests (priority, arrival) and per
  link a heap of jobs keyed (class, burst priority, burst start) -- a job's
  key changes only when it requests, so its entry is re-pushed then and stale
  entries are skipped (and compacted when they outnumber the live ones);
* starvation: per class (a *lane*) a count of its grants; a job's pass count
  is that count minus the count at its last grant (or when it started
  waiting), so the most passed-over job is the one with the smallest
  reference: a heap of jobs keyed by it (lazy, like the job heap).

Every mutating call returns the list of :class:`Request` objects granted as
a consequence (possibly other jobs' requests); the caller sends the GRANTs.
"""
import heapq
import time
from collections import OrderedDict

PENDING, GRANTED, DONE = 0, 1, 2

# The service's default class reserve: the lower classes may hold an eighth of
# the credit (1 MiB of 8 MiB) while a higher class is connected. Measured with
# niced lower classes on shared CPUs (results/findings/2026-12-07-classes-*.md).
DEFAULT_CLASS_RESERVE = 0.875


class Job:
    """One registered connection (rank 0 of one job on one link)."""

    __slots__ = ("job_id", "link", "job_class", "reqs", "grants", "peer", "burst_priority",
                 "burst_requested", "burst_seq", "burst_step", "heap", "npending", "hver",
                 "served_at", "sver", "__weakref__")

    def __init__(self, job_id, link, peer=None, job_class=0):
        self.job_id = job_id
        self.link = link
        self.job_class = job_class
        self.reqs = {}          # token -> Request (pending or granted)
        self.grants = 0
        self.peer = peer        # opaque: the server's connection object
        self.burst_priority = None  # the current burst's rank (None: never requested)
        self.burst_requested = None  # max priority requested in the current (or last) burst
        self.burst_seq = 0          # when the current burst started (link-wide counter)
        self.burst_step = 0         # the step tag of the current (or last) burst (0: none)
        self.heap = []          # burst order: (-priority, seq, Request) of pending, lazy deletion
        self.npending = 0
        self.hver = 0           # version of the job's live entry in the link's job heap
        self.served_at = 0      # its lane's grant count at its last grant / when it began waiting
        self.sver = 0           # its live entry in the lane's starvation heap (tie-break order)


class Request:
    __slots__ = ("job", "token", "chunk", "priority", "nbytes", "seq", "t_arrival",
                 "state", "deadline")

    def __init__(self, job, token, chunk, priority, nbytes, seq, now):
        self.job = job
        self.token = token
        self.chunk = chunk
        self.priority = priority
        self.nbytes = nbytes
        self.seq = seq
        self.t_arrival = now
        self.state = PENDING
        self.deadline = None

    def __repr__(self):
        return "Request(%s/%s prio=%d bytes=%d)" % (self.job.job_id, self.chunk, self.priority, self.nbytes)


class Lane:
    """One class on one link: its pending count, its grant count and the
    starvation heap of its waiting jobs: (served_at, sver, Job), lazy."""

    __slots__ = ("npending", "grants", "starve")

    def __init__(self):
        self.npending = 0
        self.grants = 0
        self.starve = []


class Link:
    def __init__(self, name, credit, max_departed, class_reserve=0.0):
        self.name = name
        self.credit = credit
        # bytes the lower classes may hold while a higher class is connected
        self.low_cap = credit - int(credit * class_reserve)
        self.classes = {}               # job class -> connected jobs of that class
        self.top = None                 # the highest connected class
        self.class_bytes = {}           # job class -> its granted-but-unfinished bytes
        self.class_grants = {}          # job class -> its outstanding grants (both: no zero entries)
        self.outstanding_bytes = 0
        self.outstanding = 0
        self.lanes = {}                 # job class -> Lane
        self.npending = 0
        self.heap = []          # chunk order: (-class, -priority, seq, Request), lazy deletion
        self.jheap = []         # burst order: ((-class, -burst prio, burst seq), ver, Job), lazy
        self.jobs = set()
        self.connected_ids = {}     # job_id -> connections with that id
        self.per_job = {}           # job_id -> grants (connected and recently departed ids)
        self.departed = OrderedDict()   # job_ids that left, oldest first (bounded)
        self.max_departed = max_departed
        self.c = {"grants": 0, "immediate_grants": 0, "waits": 0, "wait_seconds_total": 0.0,
                  "wait_seconds_max": 0.0, "expired_leases": 0, "starvation_grants": 0,
                  "completions": 0, "cancelled": 0, "dropped": 0, "renewals": 0}
        self.bursts = 0         # bursts started (counted in both orders)

    def join(self, job):
        self.jobs.add(job)
        self.classes[job.job_class] = self.classes.get(job.job_class, 0) + 1
        self.top = max(self.classes)
        self.connected_ids[job.job_id] = self.connected_ids.get(job.job_id, 0) + 1
        self.departed.pop(job.job_id, None)

    def leave(self, job):
        self.jobs.discard(job)
        n = self.classes[job.job_class] - 1
        if n:
            self.classes[job.job_class] = n
        else:
            del self.classes[job.job_class]
        self.top = max(self.classes) if self.classes else None
        jid = job.job_id
        n = self.connected_ids[jid] - 1
        if n:
            self.connected_ids[jid] = n
            return
        del self.connected_ids[jid]
        self.departed[jid] = None
        while len(self.departed) > self.max_departed:
            old, _ = self.departed.popitem(last=False)
            self.per_job.pop(old, None)

    def stats(self):
        d = dict(self.c)
        d.update(connected_jobs=len(self.jobs), pending=self.npending,
                 outstanding_grants=self.outstanding, outstanding_bytes=self.outstanding_bytes,
                 credit_bytes=self.credit, lower_class_cap_bytes=self.low_cap,
                 grants_per_job=dict(self.per_job),
                 job_classes={j.job_id: j.job_class for j in self.jobs},
                 job_steps={j.job_id: j.burst_step for j in self.jobs}, bursts=self.bursts)
        return d


def _job_key(job):
    return (-job.job_class, -job.burst_priority, job.burst_seq)


def _lazy_top(heap, live, nlive):
    """The top of a heap with lazy deletion: stale entries (``live(entry)``
    false) are popped off the top; when the heap holds more than ``2 * nlive
    + 64`` entries (``nlive``: about how many are live), the stale ones are
    dropped all at once, so it never grows past a multiple of its live
    entries. The top entry stays the same."""
    top = heap[0]
    if live(top):
        if len(heap) <= 2 * nlive + 64:
            return top
    else:
        heapq.heappop(heap)
        while not live(heap[0]):
            heapq.heappop(heap)
    if len(heap) > 2 * nlive + 64:
        heap[:] = [e for e in heap if live(e)]
        heapq.heapify(heap)
    return heap[0]


def _pending_request(entry):
    """A chunk-order or job heap entry whose request (its last item) still waits."""
    return entry[-1].state == PENDING


def _waiting_job(entry):
    """A starvation-heap entry ``(served_at, sver, job)``: the job's live
    entry and it has requests pending."""
    return entry[1] == entry[2].sver and entry[2].npending


def _queued_job(entry):
    """A link's job-heap entry ``(key, hver, job)``: the job's live entry and
    it has requests pending."""
    return entry[1] == entry[2].hver and entry[2].npending


class Arbiter:
    """The grant policy; see the module docstring."""

    ORDERS = ("burst", "chunk")

    def __init__(self, credit_bytes=8 << 20, lease_seconds=10.0, starvation_bound=8,
                 link_credits=None, clock=time.monotonic, max_pending_per_job=1 << 16,
                 order="burst", max_departed_jobs=256, max_idle_links=64, class_reserve=0.0):
        if order not in self.ORDERS:
            raise ValueError("order must be one of %s, got %r" % ("/".join(self.ORDERS), order))
        if credit_bytes < 1:
            raise ValueError("credit_bytes must be >= 1, got %r" % (credit_bytes,))
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be > 0, got %r" % (lease_seconds,))
        if starvation_bound < 0:
            raise ValueError("starvation_bound must be >= 0, got %r" % (starvation_bound,))
        if not 0 <= class_reserve < 1:
            raise ValueError("class_reserve must be in [0, 1), got %r" % (class_reserve,))
        self.class_reserve = float(class_reserve)
        self.credit_bytes = int(credit_bytes)
        self.lease_seconds = float(lease_seconds)
        self.starvation_bound = int(starvation_bound)
        self.link_credits = dict(link_credits or {})
        self.clock = clock
        self.order = order
        self.max_pending_per_job = max_pending_per_job
        self.max_departed_jobs = max_departed_jobs
        self.max_idle_links = max_idle_links
        self.links = {}
        self._idle = OrderedDict()      # names of links without jobs, oldest first
        self.pruned_links = 0
        self._leases = OrderedDict()    # Request -> None, by deadline (grant or last renewal)
        self._seq = 0
        self._sseq = 0

    # ------------------------------------------------------------ jobs
    def register(self, job_id, link, peer=None, job_class=0):
        ln = self.links.get(link)
        if ln is None:
            ln = self.links[link] = Link(link, self.link_credits.get(link, self.credit_bytes),
                                         self.max_departed_jobs, self.class_reserve)
        self._idle.pop(link, None)
        job = Job(job_id, link, peer, job_class)
        ln.join(job)
        return job

    def drop(self, job):
        """Forget a disconnected job: its pending requests and grants."""
        ln = self.links.get(job.link)
        if ln is None or job not in ln.jobs:
            return []
        ln.leave(job)
        for r in list(job.reqs.values()):
            self._remove(ln, r)
            ln.c["dropped"] += 1
        job.reqs.clear()
        job.heap = []
        if ln.jobs:
            return self._schedule(ln, self.clock())
        self._idle[ln.name] = None          # nothing pending or granted is left on it
        while len(self._idle) > self.max_idle_links:
            name, _ = self._idle.popitem(last=False)
            del self.links[name]
            self.pruned_links += 1
        return []

    # ------------------------------------------------------------ requests
    def request(self, job, token, priority, nbytes, chunk="", step=0):
        """Add a request; returns the grants it triggers (``[]`` = it waits).
        ``step``: the job's training step (> 0), 0 if the job does not say."""
        if token in job.reqs:
            raise ValueError("duplicate token %d" % token)
        if len(job.reqs) >= self.max_pending_per_job:
            raise ValueError("too many outstanding requests (%d)" % len(job.reqs))
        ln = self.links[job.link]
        now = self.clock()
        self._seq += 1
        r = Request(job, token, chunk, priority, nbytes, self._seq, now)
        rekey = job.npending == 0
        if not job.reqs and not (step and step == job.burst_step):
            ln.bursts += 1                      # idle, and not its burst's step -> a new burst
            job.burst_seq = ln.bursts
            last = job.burst_requested          # what its previous burst asked for
            job.burst_requested = priority
            job.burst_priority = priority if last is None else max(priority, last)
            job.burst_step = step
            rekey = True
        else:                                   # busy, or back within its burst's step
            if step:
                job.burst_step = step
            if priority > job.burst_requested:
                job.burst_requested = priority
            if priority > job.burst_priority:
                job.burst_priority = priority
                rekey = True
        job.reqs[token] = r
        if not ln.npending and self._fits(ln, job.job_class, nbytes):
            # nothing waits on the link and it fits: granted now, as _schedule would
            # (its lane would be created and dropped in this call; no heap entry needed)
            self._grant(ln, r, now, False)
            ln.c["immediate_grants"] += 1
            return [r]
        job.npending += 1
        ln.npending += 1
        lane = ln.lanes.get(job.job_class)
        if lane is None:
            lane = ln.lanes[job.job_class] = Lane()
        lane.npending += 1
        if job.npending == 1:                   # it starts waiting: count passes from now
            self._mark_served(lane, job)
        if self.order == "chunk":
            heapq.heappush(ln.heap, (-job.job_class, -priority, r.seq, r))
        else:
            heapq.heappush(job.heap, (-priority, r.seq, r))
            if rekey:
                job.hver += 1
                heapq.heappush(ln.jheap, (_job_key(job), job.hver, job))
        out = self._schedule(ln, now)
        if r.state == PENDING:
            ln.c["waits"] += 1
        else:
            ln.c["immediate_grants"] += 1
        return out

    def complete(self, job, token):
        """A granted chunk finished, or the client withdrew a pending request
        (``cancel``). Returns the grants it triggers, ``None`` if unknown
        (expired lease, late message)."""
        r = job.reqs.pop(token, None)
        if r is None:
            return None
        ln = self.links[job.link]
        ln.c["completions" if r.state == GRANTED else "cancelled"] += 1
        self._remove(ln, r)
        return self._schedule(ln, self.clock()) if ln.npending else []

    cancel = complete

    def renew(self, job, token):
        """Restart the lease of a grant the job still holds. False if ``token``
        is not granted (pending, completed, expired or unknown)."""
        r = job.reqs.get(token)
        if r is None or r.state != GRANTED:
            return False
        r.deadline = self.clock() + self.lease_seconds
        self._leases.move_to_end(r)
        self.links[job.link].c["renewals"] += 1
        return True

    def higher_class_connected(self, link, job_class):
        """Whether a job of a class above ``job_class`` is connected to ``link``
        (what the class reserve acts on, and what a watcher is told)."""
        ln = self.links.get(link)
        return ln is not None and ln.top is not None and ln.top > job_class

    def is_pending(self, job, token):
        r = job.reqs.get(token)
        return r is not None and r.state == PENDING

    def head(self, link):
        """The request that would be granted next on ``link`` (None if none)."""
        ln = self.links.get(link)
        return self._pick(ln)[0] if ln is not None else None

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
    def _unlink(self, ln, r):
        """Take a pending request off its lane's count (a job left with nothing
        pending drops out of the starvation heap lazily)."""
        lane = ln.lanes[r.job.job_class]
        lane.npending -= 1
        if not lane.npending:
            del ln.lanes[r.job.job_class]
        ln.npending -= 1
        r.job.npending -= 1

    def _remove(self, ln, r):
        if r.state == PENDING:
            self._unlink(ln, r)
        elif r.state == GRANTED:
            ln.outstanding_bytes -= r.nbytes
            cls = r.job.job_class
            n = ln.class_grants[cls] - 1
            if n:
                ln.class_grants[cls] = n
                ln.class_bytes[cls] -= r.nbytes
            else:
                del ln.class_grants[cls]
                del ln.class_bytes[cls]
            ln.outstanding -= 1
            self._leases.pop(r, None)
        r.state = DONE

    def _pick(self, ln):
        """``(request, starved)``: the next request to grant, or ``(None, False)``."""
        K = self.starvation_bound
        if not ln.npending:
            return None, False
        if K:
            lane = ln.lanes[max(ln.lanes)]      # the highest class with pending requests
            served_at, _, job = _lazy_top(lane.starve, _waiting_job, len(ln.jobs))
            if lane.grants - served_at >= K:
                return self._best_of(job), True
        if self.order == "chunk":
            return _lazy_top(ln.heap, _pending_request, ln.npending)[-1], False
        _, _, job = _lazy_top(ln.jheap, _queued_job, len(ln.jobs))
        return self._best_of(job), False

    def _mark_served(self, lane, job):
        """Start the job's pass count now (ties: who was marked first)."""
        self._sseq += 1
        job.served_at, job.sver = lane.grants, self._sseq
        heapq.heappush(lane.starve, (job.served_at, job.sver, job))

    def _best_of(self, job):
        """The job's own next request: by priority, then arrival."""
        if self.order == "chunk":
            return min((r for r in job.reqs.values() if r.state == PENDING),
                       key=lambda r: (-r.priority, r.seq))
        return _lazy_top(job.heap, _pending_request, job.npending)[-1]

    @staticmethod
    def _fits(ln, cls, nbytes):
        """Whether a request of class ``cls`` for ``nbytes`` may be granted on the
        link now: the credit, strict classes on the link, the class reserve."""
        if ln.outstanding_bytes and ln.outstanding_bytes + nbytes > ln.credit:
            return False
        if ln.class_grants and cls < max(ln.class_grants):
            return False                        # a higher class holds a grant: strict on the link
        if cls < ln.top and ln.low_cap < ln.credit:     # the class reserve
            low = sum(b for c, b in ln.class_bytes.items() if c < ln.top)
            if low and low + nbytes > ln.low_cap:
                return False
        return True

    def _schedule(self, ln, now):
        out = []
        K = self.starvation_bound
        while ln.npending:
            r, starved = self._pick(ln)
            job = r.job
            cls = job.job_class
            if not self._fits(ln, cls, r.nbytes):
                break
            lane = ln.lanes[cls]
            lane.grants += 1                    # every other waiting job of the class is passed over
            self._unlink(ln, r)
            if K and job.npending:              # its count starts again
                self._mark_served(lane, job)
            self._grant(ln, r, now, starved)
            out.append(r)
        return out

    def _grant(self, ln, r, now, starved):
        """Grant request ``r`` (taken off its queue already, or never queued):
        onto the link, its lease started, counted."""
        cls = r.job.job_class
        r.state = GRANTED
        r.deadline = now + self.lease_seconds
        self._leases[r] = None
        ln.outstanding_bytes += r.nbytes
        ln.class_bytes[cls] = ln.class_bytes.get(cls, 0) + r.nbytes
        ln.class_grants[cls] = ln.class_grants.get(cls, 0) + 1
        ln.outstanding += 1
        c = ln.c
        c["grants"] += 1
        if starved:
            c["starvation_grants"] += 1
        w = now - r.t_arrival
        c["wait_seconds_total"] += w
        if w > c["wait_seconds_max"]:
            c["wait_seconds_max"] = w
        r.job.grants += 1
        ln.per_job[r.job.job_id] = ln.per_job.get(r.job.job_id, 0) + 1

    def stats(self):
        return {name: ln.stats() for name, ln in sorted(self.links.items())}
