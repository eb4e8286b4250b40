// horovod_prio release scheduler (see scheduler.h).
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

void Scheduler::SetGrantCallbacks(RequestCb request, TicketCb complete,
                                  TicketCb cancel) {
  std::lock_guard<std::mutex> lk(mu_);
  request_cb_ = std::move(request);
  complete_cb_ = std::move(complete);
  cancel_cb_ = std::move(cancel);
}

void Scheduler::RecordLocked(const char* kind, uint64_t ticket, const Chunk& c) {
  if (!tracing_) return;
  if (events_.size() >= max_events_) {
    ++st_.dropped_events;
    return;
  }
  Event e;
  e.kind = kind;
  e.name = c.name;
  e.ticket = ticket;
  e.priority = c.priority;
  e.bytes = c.bytes;
  e.t_us = NowUs();
  e.queued = static_cast<int64_t>(waiting_.size());
  e.inflight_bytes = inflight_bytes_;
  const bool picked = e.kind == "request" || e.kind == "release";
  e.waiting = picked ? c.waiting : -1;
  e.waiting_max_priority = picked ? c.waiting_max : INT64_MIN;
  events_.push_back(std::move(e));
}

void Scheduler::AddInflightLocked(int64_t bytes) {
  inflight_bytes_ += bytes;
  st_.max_inflight_bytes = std::max(st_.max_inflight_bytes, inflight_bytes_);
}

void Scheduler::ReleaseLocked(uint64_t ticket, Chunk* c, Pending* p) {
  c->state = kInFlightState;
  inflight_by_name_[c->name].push_back(ticket);
  ++inflight_chunks_;
  ++st_.released;
  RecordLocked("release", ticket, *c);
  if (c->release) {
    p->push_back(std::move(c->release));
    c->release = nullptr;
  } else {
    released_out_.push_back(ticket);
  }
}

void Scheduler::PumpLocked(Pending* p) {
  while (!waiting_.empty()) {
    auto it = waiting_.begin();
    const uint64_t ticket = it->second;
    Chunk& c = chunks_.at(ticket);
    if (hold_) {
      // Strict priority: if the best waiting chunk does not fit, stop.
      const bool fits = inflight_bytes_ == 0 ||
                        (credit_bytes_ == kUnlimited
                             ? true
                             : inflight_bytes_ <= credit_bytes_ - c.bytes);
      if (!fits) break;
    }
    if (tracing_) {
      // The waiting set this choice was made from, scanned independently of
      // the order the map keeps, so the trace lets tests check the rule.
      int64_t wmax = INT64_MIN;
      for (const auto& kv : waiting_) {
        wmax = std::max(wmax, chunks_.at(kv.second).priority);
      }
      c.waiting = static_cast<int64_t>(waiting_.size());
      c.waiting_max = wmax;
    }
    waiting_.erase(it);
    AddInflightLocked(c.bytes);
    if (hold_ && external_) {
      c.state = kRequestedState;
      c.external = true;
      requested_.push_back(ticket);
      RecordLocked("request", ticket, c);
      if (request_cb_) {
        RequestCb cb = request_cb_;
        std::string name = c.name;
        const int64_t prio = c.priority, bytes = c.bytes;
        p->push_back([cb, ticket, name, prio, bytes]() { cb(ticket, name, prio, bytes); });
      } else {
        requests_out_.push_back(Request{ticket, c.name, c.priority, c.bytes});
      }
    } else {
      ReleaseLocked(ticket, &c, p);
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
  const uint64_t ticket = next_ticket_++;
  Chunk& c = chunks_[ticket];
  c.name = name;
  c.priority = priority;
  c.bytes = bytes;
  c.release = std::move(release);
  c.state = kWaitingState;
  waiting_.emplace(Key{-priority, ticket}, ticket);
  RecordLocked("ready", ticket, c);
  Pending p;
  PumpLocked(&p);
  Deliver(&lk, &p);
  return ticket;
}

std::vector<uint64_t> Scheduler::TakeReleased() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<uint64_t> out;
  out.swap(released_out_);
  return out;
}

std::vector<Scheduler::Request> Scheduler::TakeRequests() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Request> out;
  out.swap(requests_out_);
  return out;
}

void Scheduler::FinishInFlightLocked(uint64_t ticket, bool done, Pending* p) {
  auto it = chunks_.find(ticket);
  Chunk& c = it->second;
  auto nit = inflight_by_name_.find(c.name);
  auto& dq = nit->second;
  dq.erase(std::find(dq.begin(), dq.end(), ticket));
  if (dq.empty()) inflight_by_name_.erase(nit);
  inflight_bytes_ -= c.bytes;
  --inflight_chunks_;
  if (done) {
    ++st_.completed;
  } else {
    ++st_.abandoned;
  }
  RecordLocked(done ? "done" : "abandon", ticket, c);
  const bool external = c.external;
  chunks_.erase(it);
  // The requests this completion makes possible are delivered BEFORE its
  // complete callback: an arbiter then sees the job's next request while the
  // freed bytes are still counted, so the job keeps its turn on the link
  // instead of the freed credit going to another job in the gap between the
  // two messages.
  PumpLocked(p);
  if (external) {
    TicketCb cb = done ? complete_cb_ : cancel_cb_;
    if (cb) p->push_back([cb, ticket]() { cb(ticket); });
  }
}

bool Scheduler::Complete(const std::string& name) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = inflight_by_name_.find(name);
  if (it == inflight_by_name_.end()) {
    ++st_.unknown_completions;
    return false;
  }
  Pending p;
  FinishInFlightLocked(it->second.front(), /*done=*/true, &p);
  Deliver(&lk, &p);
  return true;
}

bool Scheduler::CompleteTicket(uint64_t ticket) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = chunks_.find(ticket);
  if (it == chunks_.end() || it->second.state != kInFlightState) {
    ++st_.unknown_completions;
    return false;
  }
  Pending p;
  FinishInFlightLocked(ticket, /*done=*/true, &p);
  Deliver(&lk, &p);
  return true;
}

CancelResult Scheduler::Cancel(uint64_t ticket) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = chunks_.find(ticket);
  if (it == chunks_.end()) return CancelResult::kUnknown;
  Chunk& c = it->second;
  Pending p;
  CancelResult result;
  if (c.state == kInFlightState) {
    FinishInFlightLocked(ticket, /*done=*/false, &p);
    result = CancelResult::kInFlight;
  } else {
    if (c.state == kWaitingState) {
      waiting_.erase(Key{-c.priority, ticket});
      result = CancelResult::kWaiting;
    } else {
      requested_.erase(std::find(requested_.begin(), requested_.end(), ticket));
      inflight_bytes_ -= c.bytes;
      if (cancel_cb_) {
        TicketCb cb = cancel_cb_;
        p.push_back([cb, ticket]() { cb(ticket); });
      }
      result = CancelResult::kRequested;
    }
    ++st_.cancelled;
    RecordLocked("cancel", ticket, c);
    // The callback is dropped after the lock is released (it may own state).
    p.push_back([drop = std::move(c.release)]() {});
    chunks_.erase(it);
    // Removing a chunk can unblock others (it may have been the strict head).
    PumpLocked(&p);
  }
  Deliver(&lk, &p);
  return result;
}

int64_t Scheduler::AbandonInflight() {
  std::unique_lock<std::mutex> lk(mu_);
  std::vector<uint64_t> tickets;
  for (const auto& kv : inflight_by_name_) {
    tickets.insert(tickets.end(), kv.second.begin(), kv.second.end());
  }
  std::sort(tickets.begin(), tickets.end());
  Pending p;
  for (uint64_t t : tickets) FinishInFlightLocked(t, /*done=*/false, &p);
  Deliver(&lk, &p);
  return static_cast<int64_t>(tickets.size());
}

void Scheduler::SetExternalGrant(bool on) {
  std::unique_lock<std::mutex> lk(mu_);
  external_ = on;
  Pending p;
  if (!on) {
    // Nobody will grant these any more: release them now, in request order.
    while (!requested_.empty()) {
      const uint64_t ticket = requested_.front();
      requested_.pop_front();
      ReleaseLocked(ticket, &chunks_.at(ticket), &p);
    }
    requests_out_.clear();
  }
  PumpLocked(&p);
  Deliver(&lk, &p);
}

bool Scheduler::Grant(uint64_t ticket) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = chunks_.find(ticket);
  if (it == chunks_.end() || it->second.state != kRequestedState) {
    ++st_.unknown_grants;
    return false;
  }
  requested_.erase(std::find(requested_.begin(), requested_.end(), ticket));
  Pending p;
  // Bytes were reserved at request time.
  ReleaseLocked(ticket, &it->second, &p);
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
  cancel_cb_ = nullptr;
  max_events_ = kDefaultMaxEvents;
  // next_ticket_ keeps counting: a late Grant/Cancel of a ticket from before
  // the reset must never reach a new chunk.
  chunks_.clear();
  inflight_by_name_.clear();
  inflight_bytes_ = 0;
  inflight_chunks_ = 0;
  released_out_.clear();
  requests_out_.clear();
  events_.clear();
  st_ = Stats();
  return true;
}

}  // namespace horovod_prio
