// horovod_prio release scheduler core: pure C++17, no TensorFlow / Horovod types.
//
// Chunks are Submit()ted with a name, a priority and a size in bytes, together
// with a release callback.  In hold mode the scheduler keeps them waiting and
// releases the highest priority first (ties: the one submitted first) while
// the bytes released-but-not-Complete()d ("in flight") stay within
// credit_bytes.  A chunk is always released when nothing is in flight, even if
// it is larger than the credit.  Strict priority: when the best waiting chunk
// does not fit, nothing behind it is released.  In pass-through mode
// (hold=false) every chunk is released at once (its bytes are still tracked as
// in flight until Complete()).
//
// Callbacks (release, request_cb, complete_cb) are never invoked while the
// scheduler mutex is held.  Release callbacks are dispatched in release order:
// the first thread that finds undelivered callbacks delivers them (including
// ones queued by other threads meanwhile) until none is left, so a callback
// that re-enters Submit/Complete/Grant is fine and never recurses.
// Callbacks must not block.
//
// External grant mode (hook for a cross-job arbiter): when on, a chunk that
// passes the local rule is "requested": its bytes are reserved (count as in
// flight), request_cb(name, priority, bytes) is called, and the release
// callback runs only when Grant(name) is called (from any thread).  Complete()
// of a chunk that went through a request also calls complete_cb(name), after
// the request_cb calls of the chunks that this completion lets pass.
#ifndef HOROVOD_PRIO_CC_SCHEDULER_H_
#define HOROVOD_PRIO_CC_SCHEDULER_H_

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
// the local rule, waiting for Grant), "release", "done" (Complete of a known
// chunk), "cancel" (Cancel of a waiting/requested chunk).  queued = chunks waiting (not yet released or requested) right after
// the event; inflight_bytes = bytes released or requested and not completed,
// right after the event.  waiting_max_priority is meaningful for "request" and
// "release": the max priority among the chunks that were waiting when the
// local rule let this one go (including itself); for a granted chunk it is the
// value from its request time.  It is INT64_MIN for other kinds.
struct Event {
  std::string kind;
  std::string name;
  int64_t priority = 0;
  int64_t bytes = 0;
  int64_t t_us = 0;  // std::chrono::system_clock, microseconds since epoch
  int64_t queued = 0;
  int64_t inflight_bytes = 0;
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
  int64_t cancelled = 0;         // waiting/requested chunks withdrawn by Cancel
  int64_t abandoned = 0;         // in-flight chunks dropped by AbandonInflight
};

class Scheduler {
 public:
  using Release = std::function<void()>;
  using RequestCb = void (*)(const char* name, int64_t priority, int64_t bytes);
  using CompleteCb = void (*)(const char* name);

  static constexpr size_t kDefaultMaxEvents = 1000000;

  // Process-wide instance used by the TF ops and the C API.
  static Scheduler& Get();

  // Independent instances are allowed (unit tests).
  Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // credit_bytes must be >= 0 (0: one chunk in flight at a time); throws
  // std::invalid_argument otherwise.  Turning hold off (or raising the credit)
  // releases what now may go.
  void Configure(int64_t credit_bytes, bool hold);
  void SetTracing(bool on);
  void SetMaxEvents(size_t max_events);

  // Returns a ticket for Cancel().  The release callback may already have run
  // (on this thread) when Submit returns.
  uint64_t Submit(const std::string& name, int64_t priority, int64_t bytes,
                  Release release);
  void Complete(const std::string& name);

  // Withdraws a chunk that is still waiting (or requested, not yet granted):
  // its release callback will never run and its reserved bytes are freed.
  // Returns false if it was already released (or the ticket is unknown).
  // Used when a TF step is aborted while its chunks are held.
  bool Cancel(uint64_t ticket);

  // Forgets every released-but-not-completed chunk (e.g. after a failed step
  // whose Done ops will never run), so in-flight bytes drop to 0; later
  // Complete()s of those names count as unknown.  Returns how many.
  int64_t AbandonInflight();

  // External grant mode.  Turning it off releases requested-but-ungranted
  // chunks at once (as if granted).
  void SetExternalGrant(bool on);
  void SetGrantCallbacks(RequestCb request_cb, CompleteCb complete_cb);
  // Returns false (and counts an unknown grant) if no chunk of that name is
  // waiting for a grant.  With duplicate names the oldest request is granted.
  bool Grant(const std::string& name);

  std::vector<Event> DrainEvents();
  Stats GetStats();

  // Back to the freshly constructed state (defaults: credit 0, hold off,
  // tracing off, external grant off, no callbacks, counters and events
  // cleared, in-flight bookkeeping forgotten).  Refuses and returns false if a
  // chunk is waiting or requested (its callback would be lost).
  bool Reset();

 private:
  struct Waiting {
    std::string name;
    int64_t priority;
    int64_t bytes;
    Release release;
  };
  struct Requested {
    uint64_t seq;
    std::string name;
    int64_t priority;
    int64_t bytes;
    int64_t waiting_max_priority;
    Release release;
  };
  struct InFlight {
    int64_t priority;
    int64_t bytes;
    bool external;
  };
  // Callbacks (release, request_cb, complete_cb) collected under the lock,
  // in the order they were generated; delivered after it is dropped.
  using Pending = std::vector<std::function<void()>>;
  // Waiting order: priority descending, then submission order.
  using Key = std::pair<int64_t /*-priority*/, uint64_t /*seq*/>;

  void PumpLocked(Pending* p);
  void ReleaseLocked(const std::string& name, int64_t priority, int64_t bytes,
                     int64_t waiting_max, bool external, Release release,
                     Pending* p);
  void AddInflightLocked(int64_t bytes);
  void RecordLocked(const char* kind, const std::string& name, int64_t priority,
                    int64_t bytes, int64_t waiting_max);
  void Deliver(std::unique_lock<std::mutex>* lk, Pending* p);

  std::mutex mu_;
  int64_t credit_bytes_ = 0;
  bool hold_ = false;
  bool tracing_ = false;
  bool external_ = false;
  RequestCb request_cb_ = nullptr;
  CompleteCb complete_cb_ = nullptr;
  size_t max_events_ = kDefaultMaxEvents;

  uint64_t next_seq_ = 0;
  std::map<Key, Waiting> waiting_;
  std::deque<Requested> requested_;
  std::unordered_map<std::string, std::deque<InFlight>> inflight_;
  int64_t inflight_bytes_ = 0;
  int64_t inflight_chunks_ = 0;

  // Ordered delivery of callbacks (see the file comment).
  std::deque<std::function<void()>> to_deliver_;
  bool delivering_ = false;

  std::deque<Event> events_;
  Stats st_;
};

}  // namespace horovod_prio

#endif  // HOROVOD_PRIO_CC_SCHEDULER_H_
