// Native job-side client of the link arbiter (see arbiter_client.h; the
// behaviour is horovod_prio/arbiter/client.py's, message for message).
#include "arbiter_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace horovod_prio {

namespace {

constexpr char kMagic[4] = {'H', 'P', 'A', '2'};
constexpr size_t kNonce = 32;
constexpr size_t kMacLen = 32;
constexpr size_t kMaxFrame = 64 * 1024;
constexpr size_t kMaxName = 256;
constexpr size_t kMaxOutbuf = 1 << 20;
constexpr size_t kRecvSize = 65536;
constexpr size_t kRecentKeys = 4096;

enum : uint8_t {
  T_REGISTER = 0x01, T_REQUEST = 0x02, T_COMPLETE = 0x03, T_PING = 0x04, T_CANCEL = 0x06,
  T_RENEW = 0x07, T_REGISTERED = 0x81, T_GRANT = 0x82, T_QUEUED = 0x83, T_PONG = 0x84,
  T_STATS_REPLY = 0x85, T_ERROR = 0x86
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void PutU16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v >> 8));
  s->push_back(static_cast<char>(v));
}
void PutU32(uint8_t* p, uint32_t v) {
  p[0] = v >> 24;
  p[1] = v >> 16;
  p[2] = v >> 8;
  p[3] = v;
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<uint8_t>(v);
    v >>= 8;
  }
}
void PutU64(std::string* s, uint64_t v) {
  uint8_t b[8];
  PutU64(b, v);
  s->append(reinterpret_cast<char*>(b), 8);
}
uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | p[3];
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}

std::string Fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// label + MAGIC + cn + sn, keyed with the secret (the three handshake values)
void HsValue(const HmacSha256& secret, const char* label, const uint8_t* cn, const uint8_t* sn,
             uint8_t out[kMacLen]) {
  uint8_t ctx[3 + 4 + 2 * kNonce];
  std::memcpy(ctx, label, 3);
  std::memcpy(ctx + 3, kMagic, 4);
  std::memcpy(ctx + 7, cn, kNonce);
  std::memcpy(ctx + 7 + kNonce, sn, kNonce);
  secret.Mac(ctx, sizeof ctx, nullptr, 0, out);
}

}  // namespace

const char* ArbiterClient::CounterNames() {
  return "requests,grants,arbiter_grants,fallback_grants,wait_seconds_total,wait_seconds_max,"
         "outages,reconnects,max_wait_cancels,cancels,renewals,ignored_grants,pending,"
         "outstanding,refused_requests,sessions";
}

std::shared_ptr<ArbiterClient> ArbiterClient::Start(Options opt, GrantSink grant, LogSink log,
                                                    Scheduler* scheduler) {
  std::shared_ptr<ArbiterClient> c(
      new ArbiterClient(std::move(opt), std::move(grant), std::move(log), scheduler));
  {
    std::lock_guard<std::mutex> lk(c->mu_);
    c->Connect(Now());
  }
  c->FlushLogs();
  // The thread keeps the client alive until it ends.
  std::shared_ptr<ArbiterClient> self = c;
  c->thread_ = std::thread([self]() { self->Run(); });
  return c;
}

ArbiterClient::ArbiterClient(Options opt, GrantSink grant, LogSink log, Scheduler* scheduler)
    : opt_(std::move(opt)), grant_(std::move(grant)), log_(std::move(log)), sched_(scheduler) {
  backoff_ = opt_.backoff_initial;
  int p[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, p) == 0) {
    wake_r_ = p[0];
    wake_w_ = p[1];
  }
}

ArbiterClient::~ArbiterClient() {
  if (thread_.joinable()) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();   // the I/O thread held the last reference
    } else {
      thread_.join();
    }
  }
  if (fd_ >= 0) ::close(fd_);
  if (wake_r_ >= 0) ::close(wake_r_);
  if (wake_w_ >= 0) ::close(wake_w_);
}

std::string ArbiterClient::Addr() const { return Fmt("%s:%d", opt_.host.c_str(), opt_.port); }

// ================================================================ API

ArbiterClient::RequestResult ArbiterClient::Request(uint64_t key, int64_t priority,
                                                    uint64_t nbytes, const std::string& label,
                                                    uint64_t step) {
  if (label.size() > kMaxName) return kLabelTooLong;
  const double now = Now();
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (close_requested_) return kClosedErr;
    if (reqs_.count(key)) return kDuplicate;
    ReqPtr r = std::make_shared<Req>();
    r->key = key;
    r->label = label;
    r->priority = priority;
    r->nbytes = nbytes;
    r->step = step;
    r->t = now;
    reqs_[key] = r;
    waiting_.put(key, r);
    recent_.erase(key);
    c_requests_ += 1;
    const State st = state_.load();
    if (st == kReady) {
      SendRequest(r, now);
    } else if (!(hold_first_ && (st == kConnecting || st == kHandshake))) {
      GrantReq(r, now, /*local=*/true);
    }
    wake = NeedsIo();
  }
  if (wake) Wake();
  return kOk;
}

bool ArbiterClient::Complete(uint64_t key) {
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = reqs_.find(key);
    if (it == reqs_.end() || !it->second->delivered) return false;
    Forget(it->second, T_COMPLETE);
    wake = NeedsIo();
  }
  if (wake) Wake();
  return true;
}

bool ArbiterClient::Cancel(uint64_t key) {
  bool wake;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = reqs_.find(key);
    if (it == reqs_.end()) return false;
    ReqPtr r = it->second;
    r->cancelled = true;
    if (delivering_ == r && std::this_thread::get_id() != io_id_) {
      // its grant is being delivered: let that return, so none runs after us
      delivered_cv_.wait(lk, [&] { return delivering_ != r; });
      auto again = reqs_.find(key);
      if (again == reqs_.end() || again->second != r) return false;
    }
    c_cancels_ += 1;
    Forget(r, T_CANCEL);
    wake = NeedsIo();
  }
  if (wake) Wake();
  return true;
}

void ArbiterClient::Close(double timeout) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (close_requested_) return;
    close_requested_ = true;
  }
  Wake();
  if (std::this_thread::get_id() == io_id_) return;
  std::unique_lock<std::mutex> lk(mu_);
  const bool done = exited_cv_.wait_for(lk, std::chrono::duration<double>(timeout),
                                        [&] { return exited_; });
  lk.unlock();
  if (done && thread_.joinable()) thread_.join();
}

void ArbiterClient::Attach() {
  if (sched_ == nullptr) return;
  std::weak_ptr<ArbiterClient> weak = shared_from_this();
  Scheduler* sched = sched_;
  auto request = [weak, sched](uint64_t ticket, const std::string& name, int64_t priority,
                               int64_t bytes) {
    std::shared_ptr<ArbiterClient> c = weak.lock();
    if (!c) {
      sched->Grant(ticket);
      return;
    }
    StepsFn steps = c->steps_.load();
    const int64_t step = steps != nullptr ? steps() : 0;
    const RequestResult r = c->Request(ticket, priority, bytes < 0 ? 0 : static_cast<uint64_t>(bytes),
                                       name, step > 0 ? static_cast<uint64_t>(step) : 0);
    if (r == kOk) return;
    {
      std::lock_guard<std::mutex> lk(c->mu_);
      c->c_refused_ += 1;
      const char* why = r == kLabelTooLong ? "its name is longer than 256 bytes"
                        : r == kDuplicate  ? "its ticket is already pending or granted"
                                           : "the client is closed";
      if (r != kClosedErr || !c->close_requested_) {
        c->Log(c->refused_warned_ ? kDebug : kWarning,
               Fmt("horovod_prio: arbiter client request(%s) failed (%s); the chunk is granted "
                   "locally%s", name.substr(0, 64).c_str(), why,
                   c->refused_warned_ ? "" : " (further failures are logged at debug level)"));
        c->refused_warned_ = true;
      }
    }
    c->FlushLogs();
    sched->Grant(ticket);   // nested grant: the scheduler queues its release behind this callback
  };
  auto complete = [weak](uint64_t ticket) {
    if (auto c = weak.lock()) c->Complete(ticket);
  };
  auto cancel = [weak](uint64_t ticket) {
    if (auto c = weak.lock()) c->Cancel(ticket);
  };
  sched_->SetGrantCallbacks(request, complete, cancel);
}

void ArbiterClient::Counters(double* out) {
  std::lock_guard<std::mutex> lk(mu_);
  const double v[kNumCounters] = {
      c_requests_, c_grants_, c_arbiter_grants_, c_fallback_grants_, c_wait_total_, c_wait_max_,
      c_outages_, c_reconnects_, c_max_wait_cancels_, c_cancels_, c_renewals_,
      c_ignored_grants_, static_cast<double>(waiting_.size()),
      static_cast<double>(Outstanding()), c_refused_, static_cast<double>(session_no_)};
  std::memcpy(out, v, sizeof v);
}

// ================================================================ bookkeeping (locked)

void ArbiterClient::Log(int level, std::string msg) { logs_.emplace_back(level, std::move(msg)); }

void ArbiterClient::FlushLogs() {
  std::vector<std::pair<int, std::string>> logs;
  {
    std::lock_guard<std::mutex> lk(mu_);
    logs.swap(logs_);
  }
  for (auto& l : logs) {
    if (log_) {
      log_(l.first, l.second);
    } else if (l.first >= kWarning) {
      std::fprintf(stderr, "horovod_prio.arbiter %s: %s\n",
                   l.first >= kError ? "ERROR" : "WARNING", l.second.c_str());
    }
  }
}

void ArbiterClient::Wake() {
  if (wake_w_ < 0) return;
  const char b = 0;
  ssize_t k = ::send(wake_w_, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)k;
}

bool ArbiterClient::NeedsIo() const {
  return !due_.empty() || (fd_ >= 0 && (!outbuf_.empty() || t_error_set_));
}

void ArbiterClient::SendSealed(const uint8_t* payload, size_t n) {
  // frame = u32 length + payload + HMAC(session, "C" + seq + payload)
  uint8_t stack[512];
  std::vector<uint8_t> heap;
  uint8_t* out = stack;
  if (4 + n + kMacLen > sizeof stack) {
    heap.resize(4 + n + kMacLen);
    out = heap.data();
  }
  uint8_t pre[9];
  pre[0] = 'C';
  PutU64(pre + 1, tx_seq_++);
  PutU32(out, static_cast<uint32_t>(n + kMacLen));
  std::memcpy(out + 4, payload, n);
  session_.Mac(pre, sizeof pre, payload, n, out + 4 + n);
  TWrite(out, 4 + n + kMacLen);
}

void ArbiterClient::SendToken(uint8_t kind, uint64_t token) {
  uint8_t p[9];
  p[0] = kind;
  PutU64(p + 1, token);
  SendSealed(p, sizeof p);
}

void ArbiterClient::SendRequest(const ReqPtr& r, double now) {
  r->state = kSent;
  r->session = session_no_;
  unacked_.put(r->key, now + opt_.timeout);
  // REQUEST 0x02 u64 token, i64 priority, u64 nbytes, str16 chunk_id [, u64 step]
  std::string p;
  p.reserve(27 + r->label.size() + 8);
  p.push_back(static_cast<char>(T_REQUEST));
  PutU64(&p, r->key);
  PutU64(&p, static_cast<uint64_t>(r->priority));
  PutU64(&p, r->nbytes);
  PutU16(&p, static_cast<uint16_t>(r->label.size()));
  p += r->label;
  if (r->step) PutU64(&p, r->step);
  SendSealed(reinterpret_cast<const uint8_t*>(p.data()), p.size());
}

void ArbiterClient::GrantReq(const ReqPtr& r, double now, bool local) {
  waiting_.erase(r->key);
  unacked_.erase(r->key);
  r->state = kGranted;
  r->local = local;
  if (local) {
    r->session = 0;
  } else if (lease_ > 0) {
    held_.put(r->key, now + lease_ / 3);
  }
  due_.push_back(r);
}

void ArbiterClient::Forget(ReqPtr r, uint8_t kind) {
  reqs_.erase(r->key);
  waiting_.erase(r->key);
  recent_.put(r->key, 0);
  if (recent_.size() > kRecentKeys) recent_.erase(recent_.front().first);
  if (r->state == kGranted && Outstanding() == 0) own_clear_t_ = Now();
  unacked_.erase(r->key);
  held_.erase(r->key);
  if (state_.load() == kReady && r->session == session_no_ && r->state != kHeld) {
    SendToken(kind, r->key);
  }
}

// ================================================================ transport (locked)

void ArbiterClient::TFail(const std::string& why) {
  if (!t_error_set_) {
    t_error_set_ = true;
    t_error_ = why;
  }
}

void ArbiterClient::TWrite(const uint8_t* data, size_t n) {
  if (fd_ < 0 || t_error_set_) return;
  if (outbuf_.empty()) {
    ssize_t k = ::send(fd_, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        TFail(Fmt("send failed: %s", std::strerror(errno)));
        return;
      }
      k = 0;
    }
    if (static_cast<size_t>(k) == n) return;
    data += k;
    n -= static_cast<size_t>(k);
  }
  outbuf_.append(reinterpret_cast<const char*>(data), n);
  if (outbuf_.size() > kMaxOutbuf) {
    TFail(Fmt("peer does not read (%zu bytes unsent)", outbuf_.size()));
  }
}

void ArbiterClient::TFlush() {
  if (fd_ < 0 || outbuf_.empty() || t_error_set_) return;
  ssize_t k = ::send(fd_, outbuf_.data(), outbuf_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      TFail(Fmt("send failed: %s", std::strerror(errno)));
    }
    return;
  }
  outbuf_.erase(0, static_cast<size_t>(k));
}

void ArbiterClient::TRead(std::vector<std::string>* bodies) {
  if (fd_ < 0 || t_error_set_) return;
  char buf[kRecvSize];
  ssize_t k = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  if (k < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      TFail(Fmt("connection error: %s", std::strerror(errno)));
    }
    return;
  }
  if (k == 0) {
    TFail("closed by peer");
    return;
  }
  inbuf_.append(buf, static_cast<size_t>(k));
  size_t pos = 0;
  while (inbuf_.size() - pos >= 4) {
    const uint32_t len = GetU32(reinterpret_cast<const uint8_t*>(inbuf_.data() + pos));
    if (len == 0 || len > kMaxFrame) {
      throw ProtocolError(Fmt("bad frame length %u (allowed 1..%zu)", len, kMaxFrame));
    }
    if (inbuf_.size() - pos - 4 < len) break;
    bodies->emplace_back(inbuf_, pos + 4, len);
    pos += 4 + len;
  }
  if (pos) inbuf_.erase(0, pos);
}

// ================================================================ I/O thread

void ArbiterClient::ApplyIoPriority() {
  // As horovod_prio/arbiter/placement.py's apply_io_priority, message for message.
  const bool rt = opt_.io_policy == kIoRealtime;
  const int n = opt_.io_value;
  const std::string what =
      Fmt("HOROVOD_PRIO_ARBITER_IO_PRIORITY=%s=%d", rt ? "realtime" : "nice", n);
  int rc;
  if (rt) {
    sched_param sp{};
    sp.sched_priority = n;
    rc = sched_setscheduler(0, SCHED_FIFO, &sp);   // 0: the calling thread (Linux)
  } else {
    rc = setpriority(PRIO_PROCESS, 0, n);           // per thread on Linux
  }
  const int e = errno;
  std::lock_guard<std::mutex> lk(mu_);
  if (rc == 0) {
    Log(kInfo, Fmt("arbiter client %s: I/O thread %s", opt_.job_id.c_str(),
                   rt ? Fmt("scheduled SCHED_FIFO at priority %d", n).c_str()
                      : Fmt("at nice %d", n).c_str()));
    return;
  }
  std::string why;
  if (e == EPERM || e == EACCES) {
    why = rt ? Fmt("not permitted: SCHED_FIFO needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at "
                   "least %d (systemd: AmbientCapabilities=CAP_SYS_NICE or LimitRTPRIO=%d; "
                   "docker: --cap-add SYS_NICE)", n, n)
             : Fmt("not permitted: a nice value below the current one needs root, CAP_SYS_NICE "
                   "or RLIMIT_NICE (systemd: Nice=%d or AmbientCapabilities=CAP_SYS_NICE)", n);
  } else {
    why = Fmt("%s: %s", rt ? "cannot set SCHED_FIFO" : "cannot set it", std::strerror(e));
  }
  Log(kWarning, Fmt("arbiter client %s: %s: %s; its I/O thread keeps the default priority",
                    opt_.job_id.c_str(), what.c_str(), why.c_str()));
}

void ArbiterClient::Run() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    io_id_ = std::this_thread::get_id();
  }
  if (opt_.io_policy != kIoDefault) {
    ApplyIoPriority();
    FlushLogs();
  }
  while (LoopOnce()) {
  }
  std::lock_guard<std::mutex> lk(mu_);
  exited_ = true;
  exited_cv_.notify_all();
}

bool ArbiterClient::LoopOnce() {
  std::vector<ReqPtr> due;
  double wait = 0;
  int fd;
  short events = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const double now = Now();
    if (close_requested_) {
      ShutDown(now);
    } else {
      wait = std::max(0.0, std::min(Timers(now), now + 0.5) - now);
    }
    due.swap(due_);
    fd = fd_;
    if (fd >= 0) {
      events = POLLIN;
      if ((!outbuf_.empty() && !t_error_set_) || state_.load() == kConnecting) events |= POLLOUT;
    }
  }
  FlushLogs();
  if (!due.empty()) Deliver(&due);
  if (state_.load() == kClosed) return false;
  if (!due.empty()) return true;   // deadlines may have passed while delivering
  struct pollfd pf[2];
  int n = 0;
  pf[n++] = {wake_r_, POLLIN, 0};
  if (fd >= 0) pf[n++] = {fd, events, 0};
  const int ms = static_cast<int>(std::ceil(wait * 1000.0));
  int rc = ::poll(pf, static_cast<nfds_t>(n), ms);
  if (rc < 0 && errno != EINTR) {
    std::lock_guard<std::mutex> lk(mu_);
    Log(kError, Fmt("arbiter client %s: poll failed: %s", opt_.job_id.c_str(),
                    std::strerror(errno)));
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (rc > 0 && (pf[0].revents & POLLIN)) {
      char b[256];
      while (::recv(wake_r_, b, sizeof b, MSG_DONTWAIT) > 0) {
      }
    }
    if (rc > 0 && n == 2 && fd_ == fd && fd >= 0 && pf[1].revents) {
      const short re = pf[1].revents;
      OnIo((re & (POLLIN | POLLERR | POLLHUP)) != 0, (re & (POLLOUT | POLLERR | POLLHUP)) != 0,
           Now());
    }
    // grants that just arrived go out in this turn: a grant's round trip ends at its delivery
    due.swap(due_);
  }
  FlushLogs();
  if (!due.empty()) Deliver(&due);
  return true;
}

void ArbiterClient::Deliver(std::vector<ReqPtr>* due) {
  for (const ReqPtr& r : *due) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (r->cancelled) continue;
      r->delivered = true;
      delivering_ = r;
      c_grants_ += 1;
      (r->local ? c_fallback_grants_ : c_arbiter_grants_) += 1;
      const double w = Now() - r->t;
      c_wait_total_ += w;
      c_wait_max_ = std::max(c_wait_max_, w);
    }
    if (sched_ != nullptr) {
      sched_->Grant(r->key);   // false if withdrawn meanwhile: nothing to do
    } else if (grant_) {
      grant_(r->key);
    }
    std::lock_guard<std::mutex> lk(mu_);
    delivering_.reset();
    delivered_cv_.notify_all();
  }
  due->clear();
}

double ArbiterClient::Timers(double now) {
  State st = state_.load();
  if (fd_ >= 0 && t_error_set_) {
    Fail(t_error_, now);
    st = state_.load();
  }
  if (st == kBackoff) {
    if (now < reconnect_at_) return reconnect_at_;
    Connect(now);
    st = state_.load();
    if (st == kBackoff) return reconnect_at_;
  }
  if (st == kConnecting || st == kHandshake) {
    double nxt = deadline_;
    const double hs_timeout =
        opt_.handshake_timeout >= 0 ? opt_.handshake_timeout : std::max(1.0, 4 * opt_.timeout);
    if (now >= nxt) {
      Fail(Fmt("no handshake within %.3fs", hs_timeout), now);
      return reconnect_at_;
    }
    if (hold_first_ && !waiting_.empty()) {
      const double t_req = waiting_.front().second->t + opt_.timeout;
      if (t_req <= now) {
        Fail(Fmt("not connected within %.3fs of a request", opt_.timeout), now);
        return reconnect_at_;
      }
      nxt = std::min(nxt, t_req);
    }
    return nxt;
  }
  if (st != kReady) return now + 0.5;
  // READY.  A late answer may be sitting unread (this thread was busy or
  // descheduled): read before judging.
  if ((!unacked_.empty() && unacked_.front().second <= now) ||
      (ping_pending_ && now - ping_sent_ > opt_.timeout)) {
    OnIo(true, false, now);
    if (state_.load() != kReady) return reconnect_at_;
  }
  double nxt;
  if (!unacked_.empty()) {
    const double d = unacked_.front().second;
    if (d <= now) {
      Fail(Fmt("no reply to a request within %.3fs", opt_.timeout), now);
      return reconnect_at_;
    }
    nxt = d;
  } else {
    nxt = now + 3600.0;
  }
  // while requests wait, a PING must be answered within `timeout`; while
  // idle within max(timeout, idle_heartbeat) (a new request has its own ack deadline)
  const bool busy = !waiting_.empty();
  const double limit = busy ? opt_.timeout : std::max(opt_.timeout, opt_.idle_heartbeat);
  if (ping_pending_) {
    if (now - ping_sent_ > limit) {
      Fail(Fmt("no heartbeat reply within %.3fs", limit), now);
      return reconnect_at_;
    }
    nxt = std::min(nxt, ping_sent_ + limit);
  } else {
    const double t_ping = last_ping_ + (busy ? opt_.timeout / 2 : opt_.idle_heartbeat);
    if (t_ping <= now) {
      ping_nonce_ += 1;
      ping_pending_ = true;
      ping_sent_ = last_ping_ = now;
      SendToken(T_PING, ping_nonce_);
      nxt = std::min(nxt, now + limit);
    } else {
      nxt = std::min(nxt, t_ping);
    }
  }
  // max_wait: a request waits on the arbiter only while none of this job's
  // own grants is outstanding (else it may wait on this job: a late rank
  // holds the job's granted chunks, and with them the link's credit)
  while (!waiting_.empty() && Outstanding() == 0) {
    ReqPtr r = waiting_.front().second;
    const double due = std::max(r->t, own_clear_t_) + opt_.max_wait;
    if (due > now) {
      nxt = std::min(nxt, due);
      break;
    }
    MaxWait(r, now);
  }
  while (!held_.empty()) {
    const uint64_t key = held_.front().first;
    const double d = held_.front().second;
    if (d > now) {
      nxt = std::min(nxt, d);
      break;
    }
    SendToken(T_RENEW, key);
    c_renewals_ += 1;
    held_.put(key, now + lease_ / 3);   // to the end
  }
  return nxt;
}

void ArbiterClient::MaxWait(const ReqPtr& r, double now) {
  c_max_wait_cancels_ += 1;
  if (!maxwait_warned_) {
    maxwait_warned_ = true;
    Log(kWarning, Fmt("arbiter client %s: chunk %llu (%s) waited more than %.3fs for link %s; "
                      "granting it locally (further cases logged at debug level)",
                      opt_.job_id.c_str(), static_cast<unsigned long long>(r->key),
                      r->label.c_str(), opt_.max_wait, opt_.link.c_str()));
  } else {
    Log(kDebug, Fmt("arbiter client %s: max_wait exceeded for %llu", opt_.job_id.c_str(),
                    static_cast<unsigned long long>(r->key)));
  }
  if (r->state != kHeld) SendToken(T_CANCEL, r->key);
  GrantReq(r, now, /*local=*/true);
}

// ---------------------------------------------------------------- transitions

void ArbiterClient::Connect(double now) {
  state_.store(kConnecting);
  const double hs_timeout =
      opt_.handshake_timeout >= 0 ? opt_.handshake_timeout : std::max(1.0, 4 * opt_.timeout);
  deadline_ = now + hs_timeout;
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* ai = nullptr;
  const std::string port = std::to_string(opt_.port);
  const int gai = getaddrinfo(opt_.host.c_str(), port.c_str(), &hints, &ai);
  if (gai != 0 || ai == nullptr) {
    Fail(Fmt("cannot resolve/create a socket for %s: %s", Addr().c_str(), gai_strerror(gai)), now);
    return;
  }
  const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int e = errno;
    freeaddrinfo(ai);
    Fail(Fmt("cannot resolve/create a socket for %s: %s", Addr().c_str(), std::strerror(e)), now);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fd_ = fd;
  inbuf_.clear();
  outbuf_.clear();
  t_error_set_ = false;
  t_error_.clear();
  const int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  const int e = errno;
  freeaddrinfo(ai);
  if (rc != 0 && e != EINPROGRESS && e != EINTR) {
    Fail(Fmt("connect to %s failed: %s", Addr().c_str(), std::strerror(e)), now);
  }
}

void ArbiterClient::DropConnection() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  inbuf_.clear();
  outbuf_.clear();
  t_error_set_ = false;
  hs_active_ = hs_has_session_ = hs_done_ = false;
  have_session_ = false;
  ping_pending_ = false;
  unacked_.clear();
  held_.clear();   // the arbiter released this session's grants with the connection
}

void ArbiterClient::Fail(const std::string& why, double now) {
  const State st = state_.load();
  if ((st == kClosed || st == kBackoff) && fd_ < 0) return;
  const bool was_ready = st == kReady;
  DropConnection();
  state_.store(kBackoff);
  hold_first_ = false;
  if (!outage_warned_) {
    outage_warned_ = true;
    c_outages_ += 1;
    Log(kWarning, Fmt("arbiter %s unavailable for job %s on link %s (%s); granting chunks "
                      "locally and reconnecting in the background",
                      Addr().c_str(), opt_.job_id.c_str(), opt_.link.c_str(), why.c_str()));
  } else {
    Log(kDebug, Fmt("arbiter client %s: %s", opt_.job_id.c_str(), why.c_str()));
  }
  while (!waiting_.empty()) {
    ReqPtr r = waiting_.front().second;
    GrantReq(r, now, /*local=*/true);
  }
  if (was_ready) backoff_ = opt_.backoff_initial;
  reconnect_at_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, opt_.backoff_max);
}

void ArbiterClient::Ready(double lease, double now) {
  state_.store(kReady);
  session_no_ += 1;
  lease_ = lease;
  backoff_ = opt_.backoff_initial;
  last_ping_ = now;
  ping_pending_ = false;
  if (!hold_first_) {
    c_reconnects_ += 1;
    Log(kInfo, Fmt("arbiter %s reachable again; job %s on link %s uses it for new chunks",
                   Addr().c_str(), opt_.job_id.c_str(), opt_.link.c_str()));
  }
  hold_first_ = false;
  outage_warned_ = false;
  for (auto& kv : waiting_.items()) {
    if (kv.second->state == kHeld) SendRequest(kv.second, now);
  }
}

void ArbiterClient::ShutDown(double now) {
  DropConnection();
  while (!waiting_.empty()) {
    ReqPtr r = waiting_.front().second;
    GrantReq(r, now, /*local=*/true);
  }
  state_.store(kClosed);
}

// ---------------------------------------------------------------- socket events

void ArbiterClient::OnIo(bool readable, bool writable, double now) {
  const int fd = fd_;
  if (fd < 0) return;
  if (state_.load() == kConnecting) {
    if (!writable) return;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
      Fail(Fmt("connect failed: %s", std::strerror(err)), now);
      return;
    }
    state_.store(kHandshake);
    hs_active_ = true;
    hs_has_session_ = hs_done_ = false;
    if (getrandom(cn_, kNonce, 0) != static_cast<ssize_t>(kNonce)) {
      Fail("no random bytes for the handshake nonce", now);
      return;
    }
    uint8_t hello[4 + 4 + kNonce];
    PutU32(hello, 4 + kNonce);
    std::memcpy(hello + 4, kMagic, 4);
    std::memcpy(hello + 8, cn_, kNonce);
    TWrite(hello, sizeof hello);
  }
  if (writable) TFlush();
  if (readable) {
    try {
      std::vector<std::string> bodies;
      TRead(&bodies);
      for (const std::string& b : bodies) {
        OnFrame(reinterpret_cast<const uint8_t*>(b.data()), b.size(), now);
        if (fd_ != fd) return;
      }
    } catch (const ProtocolError& e) {
      Fail(e.is_auth ? e.msg : "protocol error: " + e.msg, now);
      return;
    }
  }
  if (fd_ == fd && t_error_set_) {
    std::string why;
    if (state_.load() == kHandshake && hs_active_ && hs_has_session_) {
      why = "arbiter closed the connection during authentication (wrong secret?)";
    } else {
      why = "arbiter: " + t_error_;
    }
    Fail(why, now);
  }
}

void ArbiterClient::OnFrame(const uint8_t* body, size_t n, double now) {
  if (state_.load() == kHandshake) {
    if (!hs_has_session_) {   // CHALLENGE: prove, then register (pipelined)
      if (n != 4 + kNonce || std::memcmp(body, kMagic, 4) != 0) {
        throw ProtocolError("bad CHALLENGE from arbiter (not protocol 'HPA2'?)");
      }
      HmacSha256 secret(opt_.secret.data(), opt_.secret.size());
      const uint8_t* sn = body + 4;
      uint8_t cli[kMacLen], key[kMacLen];
      HsValue(secret, "cli", cn_, sn, cli);
      HsValue(secret, "srv", cn_, sn, srv_proof_);
      HsValue(secret, "key", cn_, sn, key);
      session_.SetKey(key, sizeof key);
      have_session_ = true;
      tx_seq_ = rx_seq_ = 0;
      hs_has_session_ = true;
      uint8_t proof[4 + kMacLen];
      PutU32(proof, kMacLen);
      std::memcpy(proof + 4, cli, kMacLen);
      TWrite(proof, sizeof proof);
      // REGISTER 0x01 str16 job_id, str16 link, i32 job_class
      std::string p;
      p.push_back(static_cast<char>(T_REGISTER));
      PutU16(&p, static_cast<uint16_t>(opt_.job_id.size()));
      p += opt_.job_id;
      PutU16(&p, static_cast<uint16_t>(opt_.link.size()));
      p += opt_.link;
      uint8_t jc[4];
      PutU32(jc, static_cast<uint32_t>(opt_.job_class));
      p.append(reinterpret_cast<char*>(jc), 4);
      SendSealed(reinterpret_cast<const uint8_t*>(p.data()), p.size());
      return;
    }
    if (!hs_done_) {   // VERDICT: the arbiter proves in turn
      if (n == 1 && body[0] == 0x01) {
        throw ProtocolError(
            "authentication failed: the arbiter rejected our proof (wrong secret?)", true);
      }
      if (n != 1 + kMacLen || body[0] != 0x00) throw ProtocolError("bad VERDICT from arbiter");
      if (!HmacSha256::Equal(body + 1, srv_proof_)) {
        throw ProtocolError("arbiter failed authentication (wrong secret?)", true);
      }
      hs_done_ = true;
      return;
    }
  }
  if (!have_session_) throw ProtocolError("frame before the handshake");
  // open: payload + HMAC(session, "S" + seq + payload)
  if (n <= kMacLen) throw ProtocolError(Fmt("frame too short for a MAC (%zu bytes)", n));
  const size_t pn = n - kMacLen;
  uint8_t pre[9], mac[kMacLen];
  pre[0] = 'S';
  PutU64(pre + 1, rx_seq_);
  session_.Mac(pre, sizeof pre, body, pn, mac);
  if (!HmacSha256::Equal(mac, body + pn)) {
    throw ProtocolError("bad frame MAC (forged, altered or replayed frame)");
  }
  rx_seq_ += 1;
  const uint8_t kind = body[0];
  if (kind == T_GRANT || kind == T_QUEUED) {
    if (pn != 9) throw ProtocolError(Fmt("bad length %zu for a token frame", pn));
    const uint64_t key = GetU64(body + 1);
    unacked_.erase(key);
    ReqPtr* rp = waiting_.get(key);
    if (rp == nullptr || (*rp)->session != session_no_) {
      if (kind == T_GRANT) {   // withdrawn, or granted locally (max_wait) meanwhile
        c_ignored_grants_ += 1;
        if (rp == nullptr && !reqs_.count(key) && !recent_.get(key)) {
          // never requested by this job: a confused or lying arbiter
          Log(unknown_grant_warned_ ? kDebug : kWarning,
              Fmt("arbiter client %s: the arbiter granted token %llu, which this job never "
                  "requested; ignored%s", opt_.job_id.c_str(),
                  static_cast<unsigned long long>(key),
                  unknown_grant_warned_ ? "" : " (further cases logged at debug level)"));
          unknown_grant_warned_ = true;
        } else {
          Log(kDebug, Fmt("arbiter client %s: late GRANT for %llu ignored (no longer waiting)",
                          opt_.job_id.c_str(), static_cast<unsigned long long>(key)));
        }
      }
      return;
    }
    ReqPtr r = *rp;
    if (kind == T_GRANT) {
      GrantReq(r, now, /*local=*/false);
    } else if (r->state == kSent) {
      r->state = kQueued;
    }
  } else if (kind == T_PONG) {
    ping_pending_ = false;
  } else if (kind == T_REGISTERED) {
    if (state_.load() != kHandshake) throw ProtocolError("unexpected REGISTERED");
    if (pn != 5) throw ProtocolError(Fmt("bad length %zu of REGISTERED", pn));
    Ready(GetU32(body + 1) / 1000.0, now);
  } else if (kind == T_ERROR) {
    throw ProtocolError("arbiter error: " +
                        std::string(reinterpret_cast<const char*>(body + 1), pn - 1));
  } else if (kind != T_STATS_REPLY) {
    throw ProtocolError(Fmt("unknown message type 0x%02x from arbiter", kind));
  }
}

}  // namespace horovod_prio
