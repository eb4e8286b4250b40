// horovod_prio release scheduler core (see scheduler.h).
#include "scheduler.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace horovod_prio {

namespace {
int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Scheduler& Scheduler::Get() {
  // Leaked on purpose: TF kernels may still call in during static destruction.
  static Scheduler* instance = new Scheduler();
  return *instance;
}

Scheduler::Scheduler() = default;

void Scheduler::Configure(int64_t credit_bytes, bool hold) {
  if (credit_bytes < 0) {
    throw std::invalid_argument("credit_bytes must be >= 0, got " +
                                std::to_string(credit_bytes));
  }
  std::unique_lock<std::mutex> lk(mu_);
  credit_bytes_ = credit_bytes;
  hold_ = hold;
  Pending p;
  PumpLocked(&p);
  Deliver(&lk, &p);
}

void Scheduler::SetTracing(bool on) {
  std::lock_guard<std::mutex> lk(mu_);
  tracing_ = on;
}

void Scheduler::SetMaxEvents(size_t max_events) {
  std::lock_guard<std::mutex> lk(mu_);
  max_events_ = max_events;
}

void Scheduler::SetGrantCallbacks(RequestCb request_cb, CompleteCb complete_cb) {
  std::lock_guard<std::mutex> lk(mu_);
  request_cb_ = request_cb;
  complete_cb_ = complete_cb;
}

void Scheduler::RecordLocked(const char* kind, const std::string& name,
                             int64_t priority, int64_t bytes,
                             int64_t waiting_max) {
  if (!tracing_) return;
  if (events_.size() >= max_events_) {
    ++st_.dropped_events;
    return;
  }
  Event e;
  e.kind = kind;
  e.name = name;
  e.priority = priority;
  e.bytes = bytes;
  e.t_us = NowUs();
  e.queued = static_cast<int64_t>(waiting_.size());
  e.inflight_bytes = inflight_bytes_;
  e.waiting_max_priority = waiting_max;
  events_.push_back(std::move(e));
}

void Scheduler::AddInflightLocked(int64_t bytes) {
  inflight_bytes_ += bytes;
  st_.max_inflight_bytes = std::max(st_.max_inflight_bytes, inflight_bytes_);
}

void Scheduler::ReleaseLocked(const std::string& name, int64_t priority,
                              int64_t bytes, int64_t waiting_max, bool external,
                              Release release, Pending* p) {
  inflight_[name].push_back(InFlight{priority, bytes, external});
  ++inflight_chunks_;
  ++st_.released;
  RecordLocked("release", name, priority, bytes, waiting_max);
  if (release) p->push_back(std::move(release));
}

void Scheduler::PumpLocked(Pending* p) {
  while (!waiting_.empty()) {
    auto it = waiting_.begin();
    const int64_t bytes = it->second.bytes;
    if (hold_) {
      // Strict priority: if the best waiting chunk does not fit, stop.
      const bool fits =
          inflight_bytes_ == 0 || inflight_bytes_ + bytes <= credit_bytes_;
      if (!fits) break;
    }
    const uint64_t seq = it->first.second;
    const int64_t waiting_max = -it->first.first;  // begin() holds the max
    Waiting w = std::move(it->second);
    waiting_.erase(it);
    AddInflightLocked(bytes);
    if (hold_ && external_) {
      RecordLocked("request", w.name, w.priority, bytes, waiting_max);
      requested_.push_back(Requested{seq, w.name, w.priority, bytes,
                                     waiting_max, std::move(w.release)});
      if (request_cb_) {
        RequestCb cb = request_cb_;
        std::string name = w.name;
        int64_t prio = w.priority;
        p->push_back([cb, name, prio, bytes]() { cb(name.c_str(), prio, bytes); });
      }
    } else {
      ReleaseLocked(w.name, w.priority, bytes, waiting_max, false,
                    std::move(w.release), p);
    }
  }
}

void Scheduler::Deliver(std::unique_lock<std::mutex>* lk, Pending* p) {
  for (auto& f : *p) to_deliver_.push_back(std::move(f));
  p->clear();
  if (delivering_) return;  // the delivering thread will run ours too
  delivering_ = true;
  while (!to_deliver_.empty()) {
    std::function<void()> f = std::move(to_deliver_.front());
    to_deliver_.pop_front();
    lk->unlock();
    try {
      f();
    } catch (...) {
      lk->lock();
      delivering_ = false;
      throw;
    }
    lk->lock();
  }
  delivering_ = false;
}

uint64_t Scheduler::Submit(const std::string& name, int64_t priority,
                           int64_t bytes, Release release) {
  if (bytes < 0) {
    throw std::invalid_argument("bytes must be >= 0, got " +
                                std::to_string(bytes) + " for chunk " + name);
  }
  std::unique_lock<std::mutex> lk(mu_);
  ++st_.submitted;
  const uint64_t seq = next_seq_++;
  waiting_.emplace(Key{-priority, seq},
                   Waiting{name, priority, bytes, std::move(release)});
  RecordLocked("ready", name, priority, bytes, INT64_MIN);
  Pending p;
  PumpLocked(&p);
  Deliver(&lk, &p);
  return seq;
}

bool Scheduler::Cancel(uint64_t ticket) {
  std::unique_lock<std::mutex> lk(mu_);
  Pending p;
  auto w = std::find_if(waiting_.begin(), waiting_.end(),
                        [&](const auto& kv) { return kv.first.second == ticket; });
  if (w != waiting_.end()) {
    Waiting c = std::move(w->second);
    waiting_.erase(w);
    ++st_.cancelled;
    RecordLocked("cancel", c.name, c.priority, c.bytes, INT64_MIN);
    // The callback is dropped after the lock is released (it may own state).
    p.push_back([drop = std::move(c.release)]() {});
  } else {
    auto r = std::find_if(requested_.begin(), requested_.end(),
                          [&](const Requested& x) { return x.seq == ticket; });
    if (r == requested_.end()) return false;
    Requested c = std::move(*r);
    requested_.erase(r);
    inflight_bytes_ -= c.bytes;
    ++st_.cancelled;
    RecordLocked("cancel", c.name, c.priority, c.bytes, INT64_MIN);
    p.push_back([drop = std::move(c.release)]() {});
  }
  // Removing a chunk can unblock others (it may have been the strict head).
  PumpLocked(&p);
  Deliver(&lk, &p);
  return true;
}

int64_t Scheduler::AbandonInflight() {
  std::unique_lock<std::mutex> lk(mu_);
  int64_t n = 0;
  for (auto& kv : inflight_) {
    for (const InFlight& f : kv.second) {
      inflight_bytes_ -= f.bytes;
      ++n;
    }
  }
  inflight_.clear();
  inflight_chunks_ = 0;
  st_.abandoned += n;
  Pending p;
  PumpLocked(&p);
  Deliver(&lk, &p);
  return n;
}

void Scheduler::Complete(const std::string& name) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = inflight_.find(name);
  if (it == inflight_.end() || it->second.empty()) {
    ++st_.unknown_completions;
    return;
  }
  InFlight f = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) inflight_.erase(it);
  inflight_bytes_ -= f.bytes;
  --inflight_chunks_;
  ++st_.completed;
  RecordLocked("done", name, f.priority, f.bytes, INT64_MIN);
  Pending p;
  // The requests this completion makes possible are delivered BEFORE its
  // complete_cb: an arbiter then sees the job's next request while the freed
  // bytes are still counted, so the job keeps its turn on the link instead of
  // the freed credit going to another job in the gap between the two messages.
  PumpLocked(&p);
  if (f.external && complete_cb_) {
    CompleteCb cb = complete_cb_;
    p.push_back([cb, name]() { cb(name.c_str()); });
  }
  Deliver(&lk, &p);
}

void Scheduler::SetExternalGrant(bool on) {
  std::unique_lock<std::mutex> lk(mu_);
  external_ = on;
  Pending p;
  if (!on) {
    // Nobody will grant these any more: release them now, in request order.
    while (!requested_.empty()) {
      Requested r = std::move(requested_.front());
      requested_.pop_front();
      ReleaseLocked(r.name, r.priority, r.bytes, r.waiting_max_priority, true,
                    std::move(r.release), &p);
    }
  }
  PumpLocked(&p);
  Deliver(&lk, &p);
}

bool Scheduler::Grant(const std::string& name) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = std::find_if(requested_.begin(), requested_.end(),
                         [&](const Requested& r) { return r.name == name; });
  if (it == requested_.end()) {
    ++st_.unknown_grants;
    return false;
  }
  Requested r = std::move(*it);
  requested_.erase(it);
  Pending p;
  // Bytes were reserved at request time.
  ReleaseLocked(r.name, r.priority, r.bytes, r.waiting_max_priority, true,
                std::move(r.release), &p);
  Deliver(&lk, &p);
  return true;
}

std::vector<Event> Scheduler::DrainEvents() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Event> out(std::make_move_iterator(events_.begin()),
                         std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

Stats Scheduler::GetStats() {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = st_;
  s.queued = static_cast<int64_t>(waiting_.size());
  s.inflight_bytes = inflight_bytes_;
  s.inflight_chunks = inflight_chunks_;
  s.credit_bytes = credit_bytes_;
  s.hold = hold_ ? 1 : 0;
  s.external_grant = external_ ? 1 : 0;
  s.requested = static_cast<int64_t>(requested_.size());
  s.tracing = tracing_ ? 1 : 0;
  return s;
}

bool Scheduler::Reset() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!waiting_.empty() || !requested_.empty()) return false;
  credit_bytes_ = 0;
  hold_ = false;
  tracing_ = false;
  external_ = false;
  request_cb_ = nullptr;
  complete_cb_ = nullptr;
  max_events_ = kDefaultMaxEvents;
  next_seq_ = 0;
  inflight_.clear();
  inflight_bytes_ = 0;
  inflight_chunks_ = 0;
  events_.clear();
  st_ = Stats();
  return true;
}

}  // namespace horovod_prio
