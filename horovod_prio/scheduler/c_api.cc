// C API of the horovod_prio release scheduler (see c_api.h).
#include "c_api.h"

#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "scheduler.h"

using horovod_prio::Scheduler;

struct hvdprio_scheduler {
  explicit hvdprio_scheduler(Scheduler* sched, bool own) : s(sched), owned(own) {}
  Scheduler* s;
  bool owned;
  std::mutex drain_mu;
  std::string drain_text;  // drained from the scheduler, not yet handed out
  std::mutex out_mu;       // taken from the scheduler, not yet handed out:
  std::deque<uint64_t> released;
  std::deque<Scheduler::Request> requests;
};

namespace {

void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(ch));
        }
    }
  }
  out->push_back('"');
}

}  // namespace

extern "C" {

int hvdprio_api_version(void) { return 2; }

hvdprio_scheduler* hvdprio_global(void) {
  // Leaked on purpose, like Scheduler::Get().
  static hvdprio_scheduler* g = new hvdprio_scheduler(&Scheduler::Get(), false);
  return g;
}

hvdprio_scheduler* hvdprio_new(void) {
  return new hvdprio_scheduler(new Scheduler(), true);
}

void hvdprio_free(hvdprio_scheduler* h) {
  if (h == nullptr || !h->owned) return;
  delete h->s;
  delete h;
}

int hvdprio_configure(hvdprio_scheduler* h, int64_t credit_bytes, int hold) {
  try {
    h->s->Configure(credit_bytes, hold != 0);
    return 0;
  } catch (const std::invalid_argument&) {
    return -1;
  }
}

void hvdprio_set_tracing(hvdprio_scheduler* h, int on) { h->s->SetTracing(on != 0); }

void hvdprio_set_max_events(hvdprio_scheduler* h, int64_t max_events) {
  h->s->SetMaxEvents(max_events < 0 ? 0 : static_cast<size_t>(max_events));
}

uint64_t hvdprio_submit(hvdprio_scheduler* h, const char* name, int64_t priority,
                        int64_t bytes) {
  if (name == nullptr || bytes < 0) return 0;
  return h->s->Submit(name, priority, bytes);
}

int64_t hvdprio_take_released(hvdprio_scheduler* h, uint64_t* out, int64_t n) {
  std::lock_guard<std::mutex> lk(h->out_mu);
  for (uint64_t t : h->s->TakeReleased()) h->released.push_back(t);
  int64_t k = 0;
  for (; k < n && !h->released.empty(); ++k) {
    out[k] = h->released.front();
    h->released.pop_front();
  }
  return k;
}

int64_t hvdprio_take_requests(hvdprio_scheduler* h, uint64_t* tickets,
                              int64_t* priorities, int64_t* bytes, int64_t n) {
  std::lock_guard<std::mutex> lk(h->out_mu);
  for (auto& r : h->s->TakeRequests()) h->requests.push_back(std::move(r));
  int64_t k = 0;
  for (; k < n && !h->requests.empty(); ++k) {
    const Scheduler::Request& r = h->requests.front();
    tickets[k] = r.ticket;
    priorities[k] = r.priority;
    bytes[k] = r.bytes;
    h->requests.pop_front();
  }
  return k;
}

int hvdprio_complete(hvdprio_scheduler* h, const char* name) {
  if (name == nullptr) return 0;
  return h->s->Complete(name) ? 1 : 0;
}

int hvdprio_complete_ticket(hvdprio_scheduler* h, uint64_t ticket) {
  return h->s->CompleteTicket(ticket) ? 1 : 0;
}

int hvdprio_cancel(hvdprio_scheduler* h, uint64_t ticket) {
  return static_cast<int>(h->s->Cancel(ticket));
}

int64_t hvdprio_abandon_inflight(hvdprio_scheduler* h) { return h->s->AbandonInflight(); }

void hvdprio_set_external_grant(hvdprio_scheduler* h, int on) {
  h->s->SetExternalGrant(on != 0);
}

void hvdprio_set_grant_callbacks(hvdprio_scheduler* h, hvdprio_request_cb request,
                                 hvdprio_ticket_cb complete, hvdprio_ticket_cb cancel) {
  Scheduler::RequestCb req;
  Scheduler::TicketCb com, can;
  if (request != nullptr) {
    req = [request](uint64_t t, const std::string& name, int64_t p, int64_t b) {
      request(t, name.c_str(), p, b);
    };
  }
  if (complete != nullptr) com = [complete](uint64_t t) { complete(t); };
  if (cancel != nullptr) can = [cancel](uint64_t t) { cancel(t); };
  h->s->SetGrantCallbacks(std::move(req), std::move(com), std::move(can));
}

int hvdprio_grant(hvdprio_scheduler* h, uint64_t ticket) { return h->s->Grant(ticket) ? 1 : 0; }

int64_t hvdprio_drain_events(hvdprio_scheduler* h, char* buf, int64_t cap) {
  std::vector<horovod_prio::Event> ev = h->s->DrainEvents();
  std::lock_guard<std::mutex> lk(h->drain_mu);
  std::string& text = h->drain_text;
  for (const auto& e : ev) {
    text.append("{\"kind\":");
    AppendJsonString(&text, e.kind);
    text.append(",\"name\":");
    AppendJsonString(&text, e.name);
    text.append(",\"ticket\":" + std::to_string(e.ticket));
    text.append(",\"priority\":" + std::to_string(e.priority));
    text.append(",\"bytes\":" + std::to_string(e.bytes));
    text.append(",\"t_us\":" + std::to_string(e.t_us));
    text.append(",\"queued\":" + std::to_string(e.queued));
    text.append(",\"inflight_bytes\":" + std::to_string(e.inflight_bytes));
    if (e.kind == "release" || e.kind == "request") {
      text.append(",\"waiting\":" + std::to_string(e.waiting));
      text.append(",\"waiting_max_priority\":" + std::to_string(e.waiting_max_priority));
    }
    text.append("}\n");
  }
  const int64_t len = static_cast<int64_t>(text.size());
  if (buf == nullptr || cap < len + 1) return -(len + 1);
  std::memcpy(buf, text.data(), text.size());
  buf[len] = '\0';
  text.clear();
  return len;
}

const char* hvdprio_stats_fields(void) {
  return "submitted,released,completed,max_inflight_bytes,queued,inflight_bytes,"
         "inflight_chunks,unknown_completions,dropped_events,credit_bytes,hold,"
         "external_grant,requested,unknown_grants,tracing,cancelled,abandoned";
}

int hvdprio_stats(hvdprio_scheduler* h, int64_t* out, int n) {
  const horovod_prio::Stats s = h->s->GetStats();
  const int64_t v[] = {s.submitted,      s.released,        s.completed,
                       s.max_inflight_bytes, s.queued,    s.inflight_bytes,
                       s.inflight_chunks, s.unknown_completions, s.dropped_events,
                       s.credit_bytes,   s.hold,            s.external_grant,
                       s.requested,      s.unknown_grants,  s.tracing,
                       s.cancelled,      s.abandoned};
  const int N = static_cast<int>(sizeof(v) / sizeof(v[0]));
  for (int i = 0; i < n && i < N && out != nullptr; ++i) out[i] = v[i];
  return N;
}

int hvdprio_reset(hvdprio_scheduler* h) {
  if (!h->s->Reset()) return 0;
  {
    std::lock_guard<std::mutex> lk(h->drain_mu);
    h->drain_text.clear();
  }
  std::lock_guard<std::mutex> lk(h->out_mu);
  h->released.clear();
  h->requests.clear();
  return 1;
}

}  // extern "C"
