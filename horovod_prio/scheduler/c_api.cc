// C API of the horovod_prio release scheduler (see c_api.h).
#include "c_api.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "arbiter_client.h"
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

int hvdprio_api_version(void) { return 3; }

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

uint64_t hvdprio_submit_notify(hvdprio_scheduler* h, const char* name, int64_t priority,
                               int64_t bytes, int fd) {
  if (name == nullptr || bytes < 0 || fd < 0) return 0;
  // The release may run inside Submit, before its ticket is known: then the
  // notice is written once Submit returned.
  struct Notice {
    std::mutex mu;
    uint64_t ticket = 0;
    bool released = false;
  };
  auto notice = std::make_shared<Notice>();
  auto write_ticket = [fd](uint64_t t) {
    ssize_t k = ::write(fd, &t, sizeof t);
    (void)k;
  };
  const uint64_t ticket = h->s->Submit(name, priority, bytes, [notice, write_ticket]() {
    std::lock_guard<std::mutex> lk(notice->mu);
    if (notice->ticket != 0) {
      write_ticket(notice->ticket);
    } else {
      notice->released = true;
    }
  });
  std::lock_guard<std::mutex> lk(notice->mu);
  notice->ticket = ticket;
  if (notice->released) write_ticket(ticket);
  return ticket;
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

// ---------------------------------------------------------------- arbiter client

struct hvdprio_arbiter {
  std::shared_ptr<horovod_prio::ArbiterClient> c;
};

const char* hvdprio_arbiter_counter_fields(void) {
  return horovod_prio::ArbiterClient::CounterNames();
}

hvdprio_arbiter* hvdprio_arbiter_new(const char* host, int port, const char* link,
                                     const char* job_id, const char* secret,
                                     int64_t secret_len, int32_t job_class,
                                     const double* timing, int n_timing,
                                     hvdprio_scheduler* sched, hvdprio_grant_cb grant,
                                     hvdprio_log_cb log, int io_policy, int io_value) {
  using horovod_prio::ArbiterClient;
  if (host == nullptr || link == nullptr || job_id == nullptr || secret == nullptr ||
      secret_len <= 0 || port <= 0 || port > 65535 || timing == nullptr || n_timing != 6 ||
      (sched == nullptr && grant == nullptr)) {
    return nullptr;
  }
  ArbiterClient::Options o;
  o.host = host;
  o.port = port;
  o.link = link;
  o.job_id = job_id;
  o.secret.assign(secret, static_cast<size_t>(secret_len));
  o.job_class = job_class;
  o.timeout = timing[0];
  o.max_wait = timing[1];
  o.idle_heartbeat = timing[2];
  o.handshake_timeout = timing[3];
  o.backoff_initial = timing[4];
  o.backoff_max = timing[5];
  if (!(o.timeout > 0) || !(o.max_wait > 0)) return nullptr;
  if (io_policy == ArbiterClient::kIoRealtime ? !(io_value >= 1 && io_value <= 99)
      : io_policy == ArbiterClient::kIoNice   ? !(io_value >= -20 && io_value <= 19)
                                              : io_policy != ArbiterClient::kIoDefault) {
    return nullptr;
  }
  o.io_policy = io_policy;
  o.io_value = io_value;
  ArbiterClient::GrantSink gs;
  if (grant != nullptr) gs = [grant](uint64_t k) { grant(k); };
  ArbiterClient::LogSink ls;
  if (log != nullptr) ls = [log](int level, const std::string& m) { log(level, m.c_str()); };
  auto* a = new hvdprio_arbiter;
  a->c = ArbiterClient::Start(std::move(o), std::move(gs), std::move(ls),
                              sched != nullptr ? sched->s : nullptr);
  return a;
}

int hvdprio_arbiter_request(hvdprio_arbiter* a, uint64_t key, int64_t priority,
                            uint64_t nbytes, const char* label, int64_t label_len,
                            uint64_t step) {
  std::string l;
  if (label != nullptr && label_len > 0) l.assign(label, static_cast<size_t>(label_len));
  return static_cast<int>(a->c->Request(key, priority, nbytes, l, step));
}

int hvdprio_arbiter_complete(hvdprio_arbiter* a, uint64_t key) {
  return a->c->Complete(key) ? 1 : 0;
}

int hvdprio_arbiter_cancel(hvdprio_arbiter* a, uint64_t key) { return a->c->Cancel(key) ? 1 : 0; }

int hvdprio_arbiter_attach(hvdprio_arbiter* a) {
  if (!a->c->attached_scheduler()) return -1;
  a->c->Attach();
  return 0;
}

void hvdprio_arbiter_set_steps(hvdprio_arbiter* a, hvdprio_steps_cb steps) {
  a->c->SetSteps(steps);
}

int hvdprio_arbiter_state(hvdprio_arbiter* a) { return static_cast<int>(a->c->state()); }

int hvdprio_arbiter_counters(hvdprio_arbiter* a, double* out, int n) {
  double v[horovod_prio::ArbiterClient::kNumCounters];
  a->c->Counters(v);
  for (int i = 0; i < n && i < horovod_prio::ArbiterClient::kNumCounters && out; ++i) {
    out[i] = v[i];
  }
  return horovod_prio::ArbiterClient::kNumCounters;
}

void hvdprio_arbiter_close(hvdprio_arbiter* a, double timeout) { a->c->Close(timeout); }

void hvdprio_arbiter_free(hvdprio_arbiter* a) {
  if (a == nullptr) return;
  a->c->Close(5.0);
  delete a;
}

void hvdprio_hmac_sha256(const char* key, int64_t key_len, const char* msg, int64_t msg_len,
                         unsigned char* out) {
  horovod_prio::HmacSha256 h(key, static_cast<size_t>(key_len));
  h.Mac(msg, static_cast<size_t>(msg_len), nullptr, 0, out);
}

}  // extern "C"
