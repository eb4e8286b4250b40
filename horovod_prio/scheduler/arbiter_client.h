// Native job-side client of the link arbiter: C++17, no TensorFlow/Horovod types.
//
// The same client as horovod_prio/arbiter/client.py (that module's docstring
// is the specification; this is a port of its state machine, deadlines and
// messages), speaking protocol 2 of horovod_prio/arbiter/protocol.py with
// HMAC-SHA256 computed here (sha256.h).  What it adds: it can be attached to
// a Scheduler, so that in external-grant mode the scheduler's request,
// complete and cancel hooks call it directly (the request frame is sealed and
// sent, non-blocking, from the thread that passed the chunk through the local
// rule) and its I/O thread releases a granted chunk with Scheduler::Grant:
// no Python on the grant path.
//
// Requests are named by the caller's key (the scheduler's ticket), which is
// also the wire token.  Exactly once: only the I/O thread delivers a grant
// (the arbiter's GRANT in the current session, or a local fallback grant),
// and only for a request that is still waiting and not cancelled; falling
// back closes the connection first, so no GRANT of an old session can arrive
// after a local grant.
//
//   CONNECTING --connected--> HANDSHAKE --REGISTERED--> READY
//       ^                         |                       |
//       +------- BACKOFF <--------+-------- failure ------+
//   any state --Close()--> CLOSED
#ifndef HOROVOD_PRIO_SCHEDULER_ARBITER_CLIENT_H_
#define HOROVOD_PRIO_SCHEDULER_ARBITER_CLIENT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scheduler.h"
#include "sha256.h"

namespace horovod_prio {

class ArbiterClient : public std::enable_shared_from_this<ArbiterClient> {
 public:
  enum State { kConnecting = 0, kHandshake = 1, kReady = 2, kBackoff = 3, kClosed = 4 };
  // Log levels, as Python's logging module numbers them.
  enum Level { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };
  // Request() results.
  enum RequestResult { kOk = 0, kClosedErr = 1, kDuplicate = 2, kLabelTooLong = 3 };

  struct Options {
    std::string host;
    int port = 0;
    std::string link, job_id;
    std::string secret;             // bytes, already stripped and non-empty
    int32_t job_class = 0;
    double timeout = 0.05;          // a REQUEST/PING must be answered within it
    double max_wait = 10.0;         // then a waiting request is granted locally
    double idle_heartbeat = 1.0;
    double handshake_timeout = -1;  // < 0: max(1, 4 * timeout)
    double backoff_initial = 0.05;
    double backoff_max = 2.0;
    // The I/O thread's own scheduling priority (HOROVOD_PRIO_ARBITER_IO_PRIORITY),
    // applied when it starts; a refusal is one warning.
    int io_policy = kIoDefault;     // kIoDefault, kIoRealtime (SCHED_FIFO io_value), kIoNice
    int io_value = 0;
  };
  enum IoPolicy { kIoDefault = 0, kIoRealtime = 1, kIoNice = 2 };

  using GrantSink = std::function<void(uint64_t key)>;
  using LogSink = std::function<void(int level, const std::string& msg)>;
  using StepsFn = int64_t (*)(void);

  // Counter names, in the order Counters() fills them.
  static const char* CounterNames();
  static constexpr int kNumCounters = 16;

  // Starts the I/O thread.  `grant` receives every grant (from the I/O
  // thread, never under the client's lock); `log` every message (logger
  // horovod_prio.arbiter; stderr when null).  With `scheduler`, grants go to
  // scheduler->Grant(key) instead and Attach() can hook the client in.
  static std::shared_ptr<ArbiterClient> Start(Options opt, GrantSink grant, LogSink log,
                                              Scheduler* scheduler);
  ~ArbiterClient();

  // Never blocks: sends the request (or queues it for the I/O thread) and
  // returns; the grant follows once through the sink.
  RequestResult Request(uint64_t key, int64_t priority, uint64_t nbytes, const std::string& label,
                        uint64_t step);
  bool Complete(uint64_t key);
  // No grant of `key` is delivered or starts after Cancel returned (waits for
  // one being delivered right now, unless called from that delivery).
  bool Cancel(uint64_t key);
  // Stops the I/O thread (waiting requests are granted locally first); waits
  // for it at most `timeout` seconds.
  void Close(double timeout);

  // External-grant hooks of the scheduler given to Start(): requests,
  // completions and cancels go straight to this client; a request the client
  // refuses (a label > 256 bytes) is granted locally at once, with a warning.
  void Attach();
  // The job's step of every request (the burst tag); null: untagged.
  void SetSteps(StepsFn fn) { steps_.store(fn); }

  State state() const { return state_.load(); }
  bool attached_scheduler() const { return sched_ != nullptr; }
  // kNumCounters values, see CounterNames().
  void Counters(double* out);

 private:
  enum ReqState { kHeld = 0, kSent = 1, kQueued = 2, kGranted = 3 };
  struct Req {
    uint64_t key;
    std::string label;
    int64_t priority;
    uint64_t nbytes, step;
    double t;
    ReqState state = kHeld;
    uint64_t session = 0;
    bool local = false, cancelled = false, delivered = false;
  };
  using ReqPtr = std::shared_ptr<Req>;

  // Insertion-ordered map key -> V (Python's OrderedDict, the few calls used).
  template <typename V>
  class Ordered {
   public:
    bool empty() const { return items_.empty(); }
    size_t size() const { return items_.size(); }
    void put(uint64_t k, V v) {
      erase(k);
      items_.emplace_back(k, std::move(v));
      index_[k] = std::prev(items_.end());
    }
    V* get(uint64_t k) {
      auto it = index_.find(k);
      return it == index_.end() ? nullptr : &it->second->second;
    }
    bool erase(uint64_t k) {
      auto it = index_.find(k);
      if (it == index_.end()) return false;
      items_.erase(it->second);
      index_.erase(it);
      return true;
    }
    std::pair<uint64_t, V>& front() { return items_.front(); }
    void clear() {
      items_.clear();
      index_.clear();
    }
    std::list<std::pair<uint64_t, V>>& items() { return items_; }

   private:
    std::list<std::pair<uint64_t, V>> items_;
    std::unordered_map<uint64_t, typename std::list<std::pair<uint64_t, V>>::iterator> index_;
  };

  class ProtocolError {
   public:
    ProtocolError(std::string m, bool auth = false) : msg(std::move(m)), is_auth(auth) {}
    std::string msg;
    bool is_auth;
  };

  ArbiterClient(Options opt, GrantSink grant, LogSink log, Scheduler* scheduler);

  // --- bookkeeping (locked)
  void Log(int level, std::string msg);   // queued; emitted by FlushLogs outside the lock
  void FlushLogs();
  void Wake();
  size_t Outstanding() const { return reqs_.size() - waiting_.size(); }
  bool NeedsIo() const;
  void SendSealed(const uint8_t* payload, size_t n);
  void SendToken(uint8_t kind, uint64_t token);
  void SendRequest(const ReqPtr& r, double now);
  void GrantReq(const ReqPtr& r, double now, bool local);
  void Forget(ReqPtr r, uint8_t kind);  // by value: it erases the map entry
  // --- I/O thread
  void Run();
  void ApplyIoPriority();
  bool LoopOnce();
  void Deliver(std::vector<ReqPtr>* due);
  double Timers(double now);
  void MaxWait(const ReqPtr& r, double now);
  void Connect(double now);
  void DropConnection();
  void Fail(const std::string& why, double now);
  void Ready(double lease, double now);
  void ShutDown(double now);
  void OnIo(bool readable, bool writable, double now);
  void OnFrame(const uint8_t* body, size_t n, double now);
  // --- transport (locked)
  void TWrite(const uint8_t* data, size_t n);
  void TFlush();
  void TFail(const std::string& why);
  void TRead(std::vector<std::string>* bodies);  // may throw ProtocolError
  std::string Addr() const;

  const Options opt_;
  GrantSink grant_;
  LogSink log_;
  Scheduler* const sched_;
  std::atomic<StepsFn> steps_{nullptr};

  std::mutex mu_;
  std::condition_variable delivered_cv_, exited_cv_;
  std::thread thread_;
  std::thread::id io_id_;
  bool exited_ = false;
  ReqPtr delivering_;
  bool close_requested_ = false;
  std::atomic<State> state_{kConnecting};
  bool hold_first_ = true;
  double backoff_;
  // transport (fd >= 0 while CONNECTING/HANDSHAKE/READY)
  int fd_ = -1;
  std::string inbuf_, outbuf_;
  bool t_error_set_ = false;
  std::string t_error_;
  // handshake / session
  bool hs_active_ = false, hs_has_session_ = false, hs_done_ = false;
  uint8_t cn_[32], srv_proof_[32];
  HmacSha256 session_;
  bool have_session_ = false;
  uint64_t tx_seq_ = 0, rx_seq_ = 0;
  uint64_t session_no_ = 0;
  double lease_ = 0, deadline_ = 0, reconnect_at_ = 0;
  bool ping_pending_ = false;
  double ping_sent_ = 0, last_ping_ = 0;
  uint64_t ping_nonce_ = 0;
  bool outage_warned_ = false, maxwait_warned_ = false, refused_warned_ = false,
       unknown_grant_warned_ = false;
  std::unordered_map<uint64_t, ReqPtr> reqs_;
  Ordered<ReqPtr> waiting_;
  Ordered<double> unacked_;   // ack deadline, send order
  Ordered<double> held_;      // renewal due, arbiter grants held
  Ordered<char> recent_;      // keys forgotten lately (a GRANT for one is a late grant, not a lie)
  std::vector<ReqPtr> due_;
  double own_clear_t_ = 0;
  std::vector<std::pair<int, std::string>> logs_;
  // counters
  double c_requests_ = 0, c_grants_ = 0, c_arbiter_grants_ = 0, c_fallback_grants_ = 0,
         c_wait_total_ = 0, c_wait_max_ = 0, c_outages_ = 0, c_reconnects_ = 0,
         c_max_wait_cancels_ = 0, c_cancels_ = 0, c_renewals_ = 0, c_ignored_grants_ = 0,
         c_refused_ = 0;
  int wake_r_ = -1, wake_w_ = -1;
};

}  // namespace horovod_prio

#endif  // HOROVOD_PRIO_SCHEDULER_ARBITER_CLIENT_H_
