// Plain C++ tests of the horovod_prio scheduler core (no TF, no gtest).
// Built and run by tests/scheduler/test_scheduler_core.py:
//   g++ -std=c++17 -pthread -I horovod_prio/scheduler tests/scheduler/cc/test_scheduler.cc
//       horovod_prio/scheduler/scheduler.cc -o test_scheduler && ./test_scheduler
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "scheduler.h"

using horovod_prio::Event;
using horovod_prio::Scheduler;
using horovod_prio::Stats;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                 \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

#define CHECK_EQ(a, b)                                                       \
  do {                                                                       \
    auto _a = (a);                                                           \
    auto _b = (b);                                                           \
    if (!(_a == _b)) {                                                       \
      std::fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s\n", __FILE__,    \
                   __LINE__, #a, #b);                                        \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

namespace {

// Records release order (single-threaded tests).
struct Log {
  std::vector<std::string> released;
  Scheduler::Release Cb(const std::string& name) {
    return [this, name]() { released.push_back(name); };
  }
  bool Has(const std::string& n) const {
    for (auto& r : released)
      if (r == n) return true;
    return false;
  }
};

// Replays a trace with an independent model of the waiting set (built from
// the ready/request/release/cancel events, not from the scheduler's fields)
// and checks the rule at every local decision: the chunk let go ("request" in
// external-grant mode, else "release") has the highest priority among the
// chunks waiting just before it, and the in-flight bytes respect the credit
// (a chunk larger than the credit only alone).  Also checks that the
// scheduler's own waiting/waiting_max_priority fields match the model.
void CheckTraceRule(const std::vector<Event>& ev, int64_t credit) {
  std::map<uint64_t, int64_t> waiting;  // ticket -> priority
  std::set<uint64_t> requested;
  int decisions = 0;
  for (const Event& e : ev) {
    if (e.kind == "ready") {
      waiting[e.ticket] = e.priority;
    } else if (e.kind == "cancel") {
      waiting.erase(e.ticket);
      requested.erase(e.ticket);
    } else if (e.kind == "request" ||
               (e.kind == "release" && requested.count(e.ticket) == 0)) {
      CHECK(waiting.count(e.ticket) == 1);
      int64_t wmax = INT64_MIN;
      for (const auto& kv : waiting) wmax = std::max(wmax, kv.second);
      CHECK_EQ(e.priority, wmax);
      CHECK_EQ(e.waiting_max_priority, wmax);
      CHECK_EQ(e.waiting, static_cast<int64_t>(waiting.size()));
      waiting.erase(e.ticket);
      if (e.kind == "request") requested.insert(e.ticket);
      CHECK(e.inflight_bytes <= credit || e.inflight_bytes == e.bytes);
      ++decisions;
    } else if (e.kind == "release") {  // a granted request
      requested.erase(e.ticket);
    }
  }
  CHECK(decisions > 0);  // an empty trace would prove nothing
}

void TestOrdering() {
  Scheduler s;
  s.Configure(0, true);  // one chunk in flight at a time
  s.SetTracing(true);
  Log log;
  s.Submit("a", 1, 10, log.Cb("a"));  // nothing in flight: released at once
  CHECK_EQ(log.released.size(), size_t(1));
  s.Submit("b", 1, 10, log.Cb("b"));
  s.Submit("c", 5, 10, log.Cb("c"));
  s.Submit("d", 5, 10, log.Cb("d"));
  s.Submit("e", 3, 10, log.Cb("e"));
  CHECK_EQ(log.released.size(), size_t(1));
  CHECK_EQ(s.GetStats().queued, int64_t(4));
  const char* expect[] = {"a", "c", "d", "e", "b"};
  for (int i = 0; i < 5; ++i) {
    CHECK_EQ(log.released.size(), size_t(i + 1));
    CHECK_EQ(log.released[i], std::string(expect[i]));
    s.Complete(expect[i]);
  }
  Stats st = s.GetStats();
  CHECK_EQ(st.submitted, int64_t(5));
  CHECK_EQ(st.released, int64_t(5));
  CHECK_EQ(st.completed, int64_t(5));
  CHECK_EQ(st.queued, int64_t(0));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
  CHECK_EQ(st.max_inflight_bytes, int64_t(10));
  auto ev = s.DrainEvents();
  CHECK_EQ(ev.size(), size_t(15));
  CheckTraceRule(ev, 0);
  CHECK(s.DrainEvents().empty());
  // release event fields
  int n_rel = 0;
  for (auto& e : ev) {
    if (e.kind == "release" && e.name == "c") {
      CHECK_EQ(e.queued, int64_t(3));
      CHECK_EQ(e.inflight_bytes, int64_t(10));
      CHECK_EQ(e.waiting_max_priority, int64_t(5));
      CHECK_EQ(e.waiting, int64_t(4));
      CHECK(e.t_us > 1600000000LL * 1000000LL);  // system_clock, microseconds
    }
    if (e.kind == "release") ++n_rel;
  }
  CHECK_EQ(n_rel, 5);
}

void TestCredit() {
  Scheduler s;
  const int64_t credit = 100;
  s.Configure(credit, true);
  s.SetTracing(true);
  std::mt19937 rng(1);
  std::deque<std::string> released;
  int64_t inflight = 0;
  std::map<std::string, int64_t> size;
  int64_t max_seen = 0;
  for (int i = 0; i < 200; ++i) {
    std::string n = "c" + std::to_string(i);
    int64_t b = 1 + rng() % 60;
    size[n] = b;
    s.Submit(n, rng() % 5, b, [&, n]() {
      released.push_back(n);
      inflight += size[n];
      CHECK(inflight <= credit || inflight == size[n]);
      max_seen = std::max(max_seen, inflight);
    });
    // complete roughly every other step
    if (rng() % 2 && !released.empty()) {
      std::string c = released.front();
      released.pop_front();
      inflight -= size[c];
      s.Complete(c);
    }
  }
  while (!released.empty()) {
    std::string c = released.front();
    released.pop_front();
    inflight -= size[c];
    s.Complete(c);
  }
  Stats st = s.GetStats();
  CHECK_EQ(st.submitted, int64_t(200));
  CHECK_EQ(st.released, int64_t(200));
  CHECK_EQ(st.completed, int64_t(200));
  CHECK(st.max_inflight_bytes <= credit);
  CHECK(max_seen > 60);  // several chunks really were in flight together
  CheckTraceRule(s.DrainEvents(), credit);
}

void TestOversizeAlone() {
  Scheduler s;
  s.Configure(10, true);
  Log log;
  s.Submit("big", 0, 1000, log.Cb("big"));
  CHECK(log.Has("big"));  // released although larger than the credit
  s.Submit("small", 9, 5, log.Cb("small"));
  CHECK(!log.Has("small"));  // 1000 in flight
  s.Complete("big");
  CHECK(log.Has("small"));
  s.Submit("big2", 0, 1000, log.Cb("big2"));
  CHECK(!log.Has("big2"));  // not alone
  s.Complete("small");
  CHECK(log.Has("big2"));
  CHECK_EQ(s.GetStats().max_inflight_bytes, int64_t(1000));
}

void TestStrictNoBypass() {
  Scheduler s;
  s.Configure(100, true);
  Log log;
  s.Submit("x", 0, 60, log.Cb("x"));
  CHECK(log.Has("x"));
  s.Submit("y", 10, 60, log.Cb("y"));  // 120 > 100: waits
  s.Submit("z", 1, 10, log.Cb("z"));   // would fit (70) but must not bypass y
  CHECK(!log.Has("y"));
  CHECK(!log.Has("z"));
  CHECK_EQ(s.GetStats().queued, int64_t(2));
  s.Complete("x");
  CHECK_EQ(log.released.size(), size_t(3));
  CHECK_EQ(log.released[1], std::string("y"));
  CHECK_EQ(log.released[2], std::string("z"));  // 70 <= 100
}

void TestPassThrough() {
  Scheduler s;
  s.Configure(0, false);
  s.SetTracing(true);
  Log log;
  for (int i = 0; i < 10; ++i) {
    std::string n = "p" + std::to_string(i);
    s.Submit(n, i, 1000, log.Cb(n));
    CHECK(log.Has(n));
  }
  Stats st = s.GetStats();
  CHECK_EQ(st.released, int64_t(10));
  CHECK_EQ(st.inflight_bytes, int64_t(10000));
  for (int i = 0; i < 10; ++i) s.Complete("p" + std::to_string(i));
  st = s.GetStats();
  CHECK_EQ(st.completed, int64_t(10));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
  CHECK_EQ(st.unknown_completions, int64_t(0));
  // Turning hold off releases everything waiting.
  s.Configure(0, true);
  s.Submit("h1", 0, 1, log.Cb("h1"));
  s.Submit("h2", 0, 1, log.Cb("h2"));
  CHECK(!log.Has("h2"));
  s.Configure(0, false);
  CHECK(log.Has("h2"));
}

void TestUnknownCompletion() {
  Scheduler s;
  s.Configure(10, true);
  Log log;
  s.Submit("a", 0, 10, log.Cb("a"));
  s.Complete("nope");
  s.Complete("nope");
  Stats st = s.GetStats();
  CHECK_EQ(st.unknown_completions, int64_t(2));
  CHECK_EQ(st.completed, int64_t(0));
  CHECK_EQ(st.inflight_bytes, int64_t(10));
  s.Complete("a");
  s.Complete("a");  // second time: unknown
  st = s.GetStats();
  CHECK_EQ(st.completed, int64_t(1));
  CHECK_EQ(st.unknown_completions, int64_t(3));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
}

void TestDuplicateNames() {
  // The same chunk name in two overlapping steps.
  Scheduler s;
  s.Configure(0, true);
  Log log;
  s.Submit("g", 0, 5, log.Cb("g1"));
  s.Submit("g", 0, 7, log.Cb("g2"));
  CHECK_EQ(log.released.size(), size_t(1));
  s.Complete("g");
  CHECK_EQ(log.released.size(), size_t(2));
  CHECK_EQ(s.GetStats().inflight_bytes, int64_t(7));
  s.Complete("g");
  CHECK_EQ(s.GetStats().inflight_bytes, int64_t(0));
}

void TestConfigErrorsAndReset() {
  Scheduler s;
  bool threw = false;
  try {
    s.Configure(-1, true);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  s.Configure(0, true);
  Log log;
  s.Submit("a", 0, 1, log.Cb("a"));
  s.Submit("b", 0, 1, log.Cb("b"));
  CHECK(!s.Reset());  // b is waiting
  s.Complete("a");
  CHECK(s.Reset());  // b in flight only: allowed, forgotten
  Stats st = s.GetStats();
  CHECK_EQ(st.submitted, int64_t(0));
  CHECK_EQ(st.hold, int64_t(0));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
  s.Complete("b");
  CHECK_EQ(s.GetStats().unknown_completions, int64_t(1));
}

void TestEventBound() {
  Scheduler s;
  s.SetTracing(true);
  s.SetMaxEvents(5);
  for (int i = 0; i < 10; ++i) s.Submit("x", 0, 1, nullptr);  // pass-through
  CHECK_EQ(s.DrainEvents().size(), size_t(5));
  CHECK_EQ(s.GetStats().dropped_events, int64_t(15));
}

void TestCallbackReentry() {
  // A release callback that completes its own chunk (like a TF executor that
  // runs the Done op inline) must neither deadlock nor recurse out of order.
  Scheduler s;
  s.Configure(0, true);
  std::vector<std::string> order;
  for (int i = 0; i < 5; ++i) {
    std::string n = "r" + std::to_string(i);
    // First submit is released at once inside Submit and completes itself,
    // so every later one is released at once too.
    s.Submit(n, i, 1, [&s, &order, n]() {
      order.push_back(n);
      (void)s.GetStats();  // takes the lock: proves we are outside it
      s.Complete(n);
    });
  }
  CHECK_EQ(order.size(), size_t(5));
  Stats st = s.GetStats();
  CHECK_EQ(st.completed, int64_t(5));
  CHECK_EQ(st.inflight_bytes, int64_t(0));

  // Held chunks released by one Complete chain through the callbacks in
  // release (priority) order.
  Scheduler s2;
  s2.Configure(0, true);
  std::vector<std::string> order2;
  s2.Submit("first", 0, 1, nullptr);
  for (int i = 0; i < 5; ++i) {
    std::string n = "q" + std::to_string(i);
    s2.Submit(n, i, 1, [&s2, &order2, n]() {
      order2.push_back(n);
      s2.Complete(n);
    });
  }
  CHECK(order2.empty());
  s2.Complete("first");
  CHECK_EQ(order2.size(), size_t(5));
  for (int i = 0; i < 5; ++i) CHECK_EQ(order2[i], "q" + std::to_string(4 - i));
}

// External grant mode.
std::mutex g_ext_mu;
std::vector<uint64_t> g_requests;
std::vector<std::string> g_ext_calls;  // "R:name" / "C:ticket" / "X:ticket" in call order
std::map<uint64_t, std::string> g_names;

void InstallRecorder(Scheduler* s) {
  s->SetGrantCallbacks(
      [](uint64_t t, const std::string& name, int64_t, int64_t) {
        std::lock_guard<std::mutex> l(g_ext_mu);
        g_requests.push_back(t);
        g_names[t] = name;
        g_ext_calls.push_back("R:" + name);
      },
      [](uint64_t t) {
        std::lock_guard<std::mutex> l(g_ext_mu);
        g_ext_calls.push_back("C:" + g_names[t]);
      },
      [](uint64_t t) {
        std::lock_guard<std::mutex> l(g_ext_mu);
        g_ext_calls.push_back("X:" + g_names[t]);
      });
}

void ResetRecorder() {
  std::lock_guard<std::mutex> l(g_ext_mu);
  g_requests.clear();
  g_ext_calls.clear();
  g_names.clear();
}

void TestExternalGrant() {
  ResetRecorder();
  Scheduler s;
  s.Configure(100, true);
  InstallRecorder(&s);
  s.SetExternalGrant(true);
  s.SetTracing(true);
  Log log;
  const uint64_t ta = s.Submit("a", 5, 60, log.Cb("a"));
  CHECK(log.released.empty());
  CHECK_EQ(g_requests.size(), size_t(1));
  CHECK_EQ(g_requests[0], ta);
  const uint64_t tb = s.Submit("b", 9, 60, log.Cb("b"));  // 120 > 100 (a reserved): waits
  CHECK_EQ(g_requests.size(), size_t(1));
  CHECK(!s.Grant(987654));
  CHECK(!s.Grant(tb));  // not requested yet: a grant cannot release it
  CHECK_EQ(s.GetStats().unknown_grants, int64_t(2));
  CHECK(s.Grant(ta));
  CHECK(log.Has("a"));
  CHECK(!s.Grant(ta));  // already granted
  s.Complete("a");
  CHECK_EQ(g_requests.size(), size_t(2));  // b requested now
  CHECK_EQ(g_requests[1], tb);
  // b's request went out before a's completion (the arbiter keeps the job's turn).
  CHECK_EQ(g_ext_calls.size(), size_t(3));
  CHECK_EQ(g_ext_calls[1], std::string("R:b"));
  CHECK_EQ(g_ext_calls[2], std::string("C:a"));
  // Grant from another thread.
  std::thread t([&]() { CHECK(s.Grant(tb)); });
  t.join();
  CHECK(log.Has("b"));
  s.Submit("c", 0, 1, log.Cb("c"));  // 61 <= 100: requested
  CHECK_EQ(g_requests.size(), size_t(3));
  s.SetExternalGrant(false);  // pending requests released
  CHECK(log.Has("c"));
  s.Complete("b");
  s.Complete("c");
  Stats st = s.GetStats();
  CHECK_EQ(st.released, int64_t(3));
  CHECK_EQ(st.completed, int64_t(3));
  CHECK_EQ(st.requested, int64_t(0));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
  auto ev = s.DrainEvents();
  int reqs = 0;
  for (auto& e : ev) reqs += e.kind == "request";
  CHECK_EQ(reqs, 3);
  CheckTraceRule(ev, 100);
}

void TestLateGrantNeverReachesAnotherChunk() {
  // Step k's chunk "g" is requested, then withdrawn (its step failed); step
  // k+1 submits "g" again.  The arbiter's late grant of the old request must
  // not release the new one; the withdrawal reached the arbiter at once.
  ResetRecorder();
  Scheduler s;
  s.Configure(100, true);
  InstallRecorder(&s);
  s.SetExternalGrant(true);
  Log log;
  const uint64_t old_t = s.Submit("g", 1, 10, log.Cb("old"));
  CHECK(s.Cancel(old_t) == horovod_prio::CancelResult::kRequested);
  CHECK_EQ(g_ext_calls.back(), std::string("X:g"));
  CHECK_EQ(s.GetStats().inflight_bytes, int64_t(0));
  const uint64_t new_t = s.Submit("g", 1, 10, log.Cb("new"));
  CHECK(!s.Grant(old_t));
  CHECK(!log.Has("new"));
  CHECK(!log.Has("old"));
  CHECK(s.Grant(new_t));
  CHECK(log.Has("new"));
  // Abandoning a granted chunk (its step failed after the release) tells the
  // arbiter too, so the link's credit is freed at once.
  CHECK(s.Cancel(new_t) == horovod_prio::CancelResult::kInFlight);
  CHECK_EQ(g_ext_calls.back(), std::string("X:g"));
  CHECK_EQ(s.GetStats().inflight_bytes, int64_t(0));
  CHECK_EQ(s.GetStats().abandoned, int64_t(1));
  CHECK(!s.Complete("g"));  // its Done never ran; a late one is ignored
}

void TestPolling() {
  // Without callbacks (the simulator's way): releases and requests queue.
  Scheduler s;
  s.Configure(10, true);
  const uint64_t a = s.Submit("a", 0, 10);
  const uint64_t b = s.Submit("b", 5, 10);
  const uint64_t c = s.Submit("c", 1, 10);
  std::vector<uint64_t> r = s.TakeReleased();
  CHECK_EQ(r.size(), size_t(1));
  CHECK_EQ(r[0], a);
  CHECK(s.TakeReleased().empty());
  CHECK(s.CompleteTicket(a));
  CHECK(!s.CompleteTicket(a));
  r = s.TakeReleased();
  CHECK_EQ(r.size(), size_t(1));
  CHECK_EQ(r[0], b);  // priority order
  s.SetExternalGrant(true);
  CHECK(s.CompleteTicket(b));
  auto reqs = s.TakeRequests();
  CHECK_EQ(reqs.size(), size_t(1));
  CHECK_EQ(reqs[0].ticket, c);
  CHECK_EQ(reqs[0].name, std::string("c"));
  CHECK(s.TakeReleased().empty());
  CHECK(s.Grant(c));
  r = s.TakeReleased();
  CHECK_EQ(r.size(), size_t(1));
  CHECK_EQ(r[0], c);
  // No byte limit: everything goes at once, still in priority order.
  Scheduler u;
  u.Configure(Scheduler::kUnlimited, true);
  u.Submit("x", 0, 1 << 30);
  u.Submit("y", 3, 1 << 30);
  CHECK_EQ(u.TakeReleased().size(), size_t(2));
  CHECK_EQ(u.GetStats().inflight_bytes, int64_t(2) << 30);
}

void TestCancelAndAbandon() {
  Scheduler s;
  s.Configure(100, true);
  s.SetTracing(true);
  Log log;
  s.Submit("x", 0, 60, log.Cb("x"));
  uint64_t ty = s.Submit("y", 10, 60, log.Cb("y"));  // strict head, waits
  s.Submit("z", 1, 10, log.Cb("z"));                 // blocked behind y
  CHECK(!log.Has("z"));
  CHECK(s.Cancel(ty) == horovod_prio::CancelResult::kWaiting);  // z may go now (70 <= 100)
  CHECK(!log.Has("y"));
  CHECK(log.Has("z"));
  CHECK(s.Cancel(ty) == horovod_prio::CancelResult::kUnknown);      // twice
  CHECK(s.Cancel(123456) == horovod_prio::CancelResult::kUnknown);  // unknown
  Stats st = s.GetStats();
  CHECK_EQ(st.cancelled, int64_t(1));
  CHECK_EQ(st.queued, int64_t(0));
  CHECK_EQ(st.inflight_bytes, int64_t(70));
  // A step died: x and z will never complete.
  uint64_t tw = s.Submit("w", 0, 50, log.Cb("w"));
  CHECK(!log.Has("w"));
  CHECK_EQ(s.AbandonInflight(), int64_t(2));
  CHECK(log.Has("w"));
  CHECK(!s.Complete("x"));  // late: unknown
  // Cancel of a released chunk abandons it.
  CHECK(s.Cancel(tw) == horovod_prio::CancelResult::kInFlight);
  CHECK(!s.Complete("w"));
  st = s.GetStats();
  CHECK_EQ(st.abandoned, int64_t(3));
  CHECK_EQ(st.unknown_completions, int64_t(2));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
  CHECK_EQ(st.inflight_chunks, int64_t(0));
  // Cancel of a requested (external) chunk frees its reservation.
  s.SetExternalGrant(true);
  uint64_t ta = s.Submit("a", 0, 90, log.Cb("a"));
  uint64_t tb = s.Submit("b", 0, 90, log.Cb("b"));
  CHECK_EQ(s.GetStats().requested, int64_t(1));
  CHECK(s.Cancel(ta) == horovod_prio::CancelResult::kRequested);
  CHECK_EQ(s.GetStats().requested, int64_t(1));  // b requested now
  CHECK(s.Grant(tb));
  CHECK(log.Has("b"));
  CHECK(!log.Has("a"));
  s.Complete("b");
  CHECK_EQ(s.GetStats().inflight_bytes, int64_t(0));
  int cancels = 0, abandons = 0;
  auto ev = s.DrainEvents();
  for (auto& e : ev) {
    cancels += e.kind == "cancel";
    abandons += e.kind == "abandon";
  }
  CHECK_EQ(cancels, 2);
  CHECK_EQ(abandons, 3);
  CheckTraceRule(ev, 100);
}

void TestStress() {
  Scheduler s;
  const int64_t credit = 1000;
  s.Configure(credit, true);
  s.SetTracing(true);
  const int kSubmitters = 4, kPerThread = 2000, kCompleters = 3;
  const int kTotal = kSubmitters * kPerThread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> to_complete;
  std::vector<std::atomic<int>> release_count(kTotal);
  for (auto& c : release_count) c = 0;
  std::atomic<int> completed{0};

  auto release_cb = [&](int id, const std::string& name, bool inline_complete) {
    return [&, id, name, inline_complete]() {
      release_count[id]++;
      if (inline_complete) {
        s.Complete(name);
        completed++;
      } else {
        std::lock_guard<std::mutex> l(mu);
        to_complete.push_back(name);
        cv.notify_one();
      }
    };
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kSubmitters; ++t) {
    threads.emplace_back([&, t]() {
      std::mt19937 rng(100 + t);
      for (int i = 0; i < kPerThread; ++i) {
        int id = t * kPerThread + i;
        std::string name = "s" + std::to_string(id);
        int64_t bytes = rng() % 1500;  // some larger than the credit
        bool inline_complete = rng() % 8 == 0;
        s.Submit(name, rng() % 10, bytes, release_cb(id, name, inline_complete));
        if (rng() % 16 == 0) std::this_thread::yield();
      }
    });
  }
  for (int t = 0; t < kCompleters; ++t) {
    threads.emplace_back([&]() {
      std::mt19937 rng(7);
      while (completed.load() < kTotal) {
        std::string n;
        {
          std::unique_lock<std::mutex> l(mu);
          if (!cv.wait_for(l, std::chrono::milliseconds(5),
                           [&] { return !to_complete.empty(); }))
            continue;
          // complete in a random-ish order
          size_t k = rng() % to_complete.size();
          n = to_complete[k];
          to_complete.erase(to_complete.begin() + k);
        }
        s.Complete(n);
        completed++;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kTotal; ++i) CHECK_EQ(release_count[i].load(), 1);
  Stats st = s.GetStats();
  CHECK_EQ(st.submitted, int64_t(kTotal));
  CHECK_EQ(st.released, int64_t(kTotal));
  CHECK_EQ(st.completed, int64_t(kTotal));
  CHECK_EQ(st.queued, int64_t(0));
  CHECK_EQ(st.inflight_bytes, int64_t(0));
  CHECK_EQ(st.inflight_chunks, int64_t(0));
  CHECK_EQ(st.unknown_completions, int64_t(0));
  CHECK(st.max_inflight_bytes <= 1500);
  auto ev = s.DrainEvents();
  CHECK_EQ(ev.size(), size_t(3 * kTotal));
  CheckTraceRule(ev, credit);
}

}  // namespace

int main() {
  struct {
    const char* name;
    void (*fn)();
  } tests[] = {
      {"ordering", TestOrdering},
      {"credit", TestCredit},
      {"oversize_alone", TestOversizeAlone},
      {"strict_no_bypass", TestStrictNoBypass},
      {"pass_through", TestPassThrough},
      {"unknown_completion", TestUnknownCompletion},
      {"duplicate_names", TestDuplicateNames},
      {"config_errors_and_reset", TestConfigErrorsAndReset},
      {"event_bound", TestEventBound},
      {"callback_reentry", TestCallbackReentry},
      {"external_grant", TestExternalGrant},
      {"late_grant", TestLateGrantNeverReachesAnotherChunk},
      {"polling", TestPolling},
      {"cancel_and_abandon", TestCancelAndAbandon},
      {"stress", TestStress},
  };
  for (auto& t : tests) {
    t.fn();
    std::printf("PASS %s\n", t.name);
  }
  std::printf("ALL PASSED\n");
  return 0;
}
