// horovod_prio release scheduler: pure C++17, no TensorFlow / Horovod types.
//
// The release rule. Chunks are Submit()ted with a name, a priority and a size
// in bytes; Submit returns a ticket that names this one submission from then
// on.  In hold mode the scheduler keeps chunks waiting and releases the
// highest priority first (ties: the one submitted first) while the bytes
// released-but-not-completed ("in flight") stay within credit_bytes.  A chunk
// is always released when nothing is in flight, even if it is larger than the
// credit.  Strict priority: when the best waiting chunk does not fit, nothing
// behind it is released.  In pass-through mode (hold=false) every chunk is
// released at once (its bytes are still tracked as in flight until it
// completes).
//
// How a release is delivered: a chunk submitted with a Release callback has
// it called; a chunk submitted without one has its ticket queued for
// TakeReleased() (polling callers such as the simulator).  Callbacks (release,
// request, complete, cancel) are never invoked while the scheduler mutex is
// held.  They are delivered in the order they were generated: the first
// thread that finds undelivered callbacks delivers them (including ones
// queued by other threads meanwhile) until none is left, so a callback that
// re-enters the scheduler is fine and never recurses.  Callbacks must not
// block.
//
// External grant mode (hook for a cross-job arbiter): when on (and hold is
// on), a chunk that passes the local rule is "requested": its bytes are
// reserved (they count as in flight), the request callback is called with its
// ticket (or, without a callback, the request is queued for TakeRequests()),
// and the chunk is released only when Grant(ticket) is called.  Complete() of
// a granted chunk calls the complete callback *after* the request callbacks of
// the chunks this completion lets pass, so an arbiter sees the job's next
// request while the freed bytes still count.  Cancel() of a requested chunk
// calls the cancel callback, so the arbiter can withdraw the request at once.
//
// Failure paths: Cancel(ticket) withdraws a waiting or requested chunk, and
// abandons an in-flight one (its bytes are freed and a later Complete of it
// is ignored): a failed training step releases everything it held.
#ifndef HOROVOD_PRIO_SCHEDULER_SCHEDULER_H_
#define HOROVOD_PRIO_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace horovod_prio {

// One trace record.  kind: "ready" (Submit), "request" (external mode: passed
// the local rule, waiting for Grant), "release", "done" (Complete of an
// in-flight chunk), "cancel" (a waiting/requested chunk withdrawn),
// "abandon" (an in-flight chunk dropped after a failure).  queued = chunks
// waiting (not yet released or requested) right after the event;
// inflight_bytes = bytes released or requested and not completed, right after
// the event.  For "request" and "release" (of a chunk that was not requested
// first), waiting = how many chunks were waiting just before the local rule
// let this one go (itself included) and waiting_max_priority = the highest
// priority among them, found by scanning them (not read from the chunk
// released): a test can compare it with the released priority.  For a granted
// chunk both are the values of its request.  Other kinds: waiting = -1,
// waiting_max_priority = INT64_MIN.
struct Event {
  std::string kind;
  std::string name;
  uint64_t ticket = 0;
  int64_t priority = 0;
  int64_t bytes = 0;
  int64_t t_us = 0;  // std::chrono::system_clock, microseconds since epoch
  int64_t queued = 0;
  int64_t inflight_bytes = 0;
  int64_t waiting = -1;
  int64_t waiting_max_priority = INT64_MIN;
};

struct Stats {
  int64_t submitted = 0;
  int64_t released = 0;
  int64_t completed = 0;
  int64_t max_inflight_bytes = 0;
  int64_t queued = 0;            // waiting now
  int64_t inflight_bytes = 0;    // now (includes requested-not-granted)
  int64_t inflight_chunks = 0;   // now (released, not completed)
  int64_t unknown_completions = 0;
  int64_t dropped_events = 0;
  int64_t credit_bytes = 0;
  int64_t hold = 0;
  int64_t external_grant = 0;
  int64_t requested = 0;         // waiting for Grant now
  int64_t unknown_grants = 0;
  int64_t tracing = 0;
  int64_t cancelled = 0;         // waiting/requested chunks withdrawn
  int64_t abandoned = 0;         // in-flight chunks dropped after a failure
};

// What Cancel() found.
enum class CancelResult { kUnknown = 0, kWaiting = 1, kRequested = 2, kInFlight = 3 };

class Scheduler {
 public:
  using Release = std::function<void()>;
  // External grant hooks (called outside the lock, in generation order).
  using RequestCb = std::function<void(uint64_t ticket, const std::string& name,
                                       int64_t priority, int64_t bytes)>;
  using TicketCb = std::function<void(uint64_t ticket)>;

  // No byte limit: every chunk may be in flight at once (the priority order
  // then only decides among chunks ready at the same time).
  static constexpr int64_t kUnlimited = INT64_MAX;
  static constexpr size_t kDefaultMaxEvents = 1000000;

  // Process-wide instance used by the TensorFlow kernels.
  static Scheduler& Get();

  Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // credit_bytes must be >= 0 (0: one chunk in flight at a time; kUnlimited:
  // no limit); throws std::invalid_argument otherwise.  Turning hold off (or
  // raising the credit) releases what now may go.
  void Configure(int64_t credit_bytes, bool hold);
  void SetTracing(bool on);
  void SetMaxEvents(size_t max_events);

  // Returns the chunk's ticket (never 0).  With a release callback, it may
  // already have run (on this thread) when Submit returns; without one, the
  // ticket is queued for TakeReleased().
  uint64_t Submit(const std::string& name, int64_t priority, int64_t bytes,
                  Release release = nullptr);
  // Tickets released since the last call (chunks submitted without a callback).
  std::vector<uint64_t> TakeReleased();

  // The chunk's collective finished: frees its bytes.  By name, the oldest
  // in-flight chunk of that name completes (the TF kernels only know names);
  // by ticket, that one.  Returns false (and counts an unknown completion) if
  // no such chunk is in flight, e.g. it was abandoned.
  bool Complete(const std::string& name);
  bool CompleteTicket(uint64_t ticket);

  // Withdraws a waiting or requested chunk (its release never happens) or
  // abandons an in-flight one; see CancelResult.  Unknown (or completed)
  // tickets change nothing.
  CancelResult Cancel(uint64_t ticket);

  // Abandons every in-flight chunk; returns how many.
  int64_t AbandonInflight();

  // External grant mode.  Turning it off releases requested-but-ungranted
  // chunks at once (as if granted).
  void SetExternalGrant(bool on);
  // request: a chunk asks for the link.  complete: a granted chunk's
  // collective finished.  cancel: a requested chunk was withdrawn, or a
  // granted one abandoned.  Any may be null; without a request callback
  // requests are queued for TakeRequests().
  void SetGrantCallbacks(RequestCb request, TicketCb complete, TicketCb cancel);
  struct Request {
    uint64_t ticket;
    std::string name;
    int64_t priority;
    int64_t bytes;
  };
  std::vector<Request> TakeRequests();
  // Releases requested chunk `ticket`.  Returns false (and counts an unknown
  // grant) if it is not waiting for a grant (never requested, cancelled,
  // already granted): a late grant can never release another chunk.
  bool Grant(uint64_t ticket);

  std::vector<Event> DrainEvents();
  Stats GetStats();

  // Back to the freshly constructed state (credit 0, hold off, tracing off,
  // external grant off, no callbacks, counters and events cleared, in-flight
  // bookkeeping forgotten).  Refuses and returns false if a chunk is waiting
  // or requested (its release would be lost).
  bool Reset();

 private:
  enum State { kWaitingState, kRequestedState, kInFlightState };
  struct Chunk {
    std::string name;
    int64_t priority;
    int64_t bytes;
    Release release;
    State state;
    bool external = false;       // went through a request
    int64_t waiting = -1;        // see Event
    int64_t waiting_max = INT64_MIN;
  };
  using Pending = std::vector<std::function<void()>>;
  // Waiting order: priority descending, then submission order (= ticket).
  using Key = std::pair<int64_t /*-priority*/, uint64_t /*ticket*/>;

  void PumpLocked(Pending* p);
  void ReleaseLocked(uint64_t ticket, Chunk* c, Pending* p);
  void FinishInFlightLocked(uint64_t ticket, bool done, Pending* p);
  void AddInflightLocked(int64_t bytes);
  void RecordLocked(const char* kind, uint64_t ticket, const Chunk& c);
  void Deliver(std::unique_lock<std::mutex>* lk, Pending* p);

  std::mutex mu_;
  int64_t credit_bytes_ = 0;
  bool hold_ = false;
  bool tracing_ = false;
  bool external_ = false;
  RequestCb request_cb_;
  TicketCb complete_cb_;
  TicketCb cancel_cb_;
  size_t max_events_ = kDefaultMaxEvents;

  uint64_t next_ticket_ = 1;
  std::unordered_map<uint64_t, Chunk> chunks_;  // every chunk not finished
  std::map<Key, uint64_t> waiting_;
  std::deque<uint64_t> requested_;              // request order
  // In-flight tickets per name, oldest first (Complete by name).
  std::unordered_map<std::string, std::deque<uint64_t>> inflight_by_name_;
  int64_t inflight_bytes_ = 0;
  int64_t inflight_chunks_ = 0;
  std::vector<uint64_t> released_out_;          // for TakeReleased
  std::vector<Request> requests_out_;           // for TakeRequests

  // Ordered delivery of callbacks (see the file comment).
  std::deque<std::function<void()>> to_deliver_;
  bool delivering_ = false;

  std::deque<Event> events_;
  Stats st_;
};

}  // namespace horovod_prio

#endif  // HOROVOD_PRIO_SCHEDULER_SCHEDULER_H_
