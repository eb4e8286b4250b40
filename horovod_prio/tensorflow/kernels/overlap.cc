// Barrier crossing ("overlap") kernels of horovod_prio: the next step's
// forward pass starts on the layers that are already reduced and updated.
//
// One *channel* per overlapped optimizer identity.  A training call (one
// tf.function call of the step) *posts* its gradient chunks and the values it
// read (iterations, hyperparameters, priorities) into the channel and returns
// at once; a background tf.function per step *takes* them, allreduces,
// applies the update layer by layer and marks each layer applied; the next
// training call waits, per layer, before its first read of that layer's
// variables until the previous steps applied that layer.
//
//   training call (graph of the step)        background call (one per step)
//   HvdPrioOverlapBegin -> ticket (first)    HvdPrioOverlapTakeBegin -> ticket
//   HvdPrioOverlapWait(task)  per layer      HvdPrioOverlapTake(ticket, slot)
//   HvdPrioOverlapPost(ticket, x, slot)      ... gate/allreduce/done/apply ...
//                                            HvdPrioOverlapLayerDone(ticket, task)
//                                            HvdPrioOverlapFinish(ticket)
//
// A *step* (ticket) is begun by one training call and sealed when that call
// ends (the call's CancellationManager runs our callback when it is
// destroyed or cancelled; the next Begin and a flush seal it too).  A sealed
// step with no post is dropped (e.g. a backward_passes_per_step call that
// only accumulated); a sealed step with some but not all of its posts (the
// call failed mid-way) cannot be applied consistently on every rank: the
// channel fails with that message, and every wait/take/flush on it raises.
//
// No kernel here blocks a TensorFlow thread: Wait, TakeBegin and Take are
// AsyncOpKernels completed by whichever thread changes the state (a Post, a
// LayerDone, a seal, a failure, a close) or by the call's cancellation.
// Callbacks run outside the lock.
//
// extern "C" hvdprio_overlap_* functions (ctypes, horovod_prio/tensorflow/
// overlapped.py) create channels, flush, fail, close, read counters and drain
// trace events (system clock, microseconds: the scheduler's clock).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace horovod_prio {
namespace overlap {

using tensorflow::Status;
using tensorflow::Tensor;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Step {
  int64_t ticket = 0;
  std::vector<Tensor> slots;
  std::vector<char> filled;   // 0 empty, 1 posted, 2 taken
  std::vector<char> applied;  // per task
  int nposted = 0;
  int nchunks = 0;  // posts to the chunk slots (slot >= the channel's nmeta)
  bool sealed = false;
  bool taken = false;  // handed to a background call by TakeBegin
  int64_t begin_us = 0;
};

// A pending request of an async kernel; `complete` runs exactly once, outside
// the lock, with the status (and, for takes, the tensor / ticket).
struct Request {
  uint64_t id = 0;
  enum Kind { kWait, kTakeBegin, kTake } kind = kWait;
  int task = 0;          // kWait
  int64_t bound = 0;     // kWait: steps with ticket <= bound must have applied `task`
  int64_t start_us = 0;  // kWait
  bool blocked = false;  // kWait: not satisfied when it started
  int64_t ticket = 0;    // kTake
  int slot = 0;          // kTake
  std::function<void(const Status&, const Tensor*, int64_t)> complete;
};

struct Channel {
  std::string name;
  int ntasks = 0;
  int nslots = 0;
  int nmeta = 0;  // slots 0..nmeta-1 hold the step's values (iterations, ...), the rest chunks
  std::deque<std::shared_ptr<Step>> live;  // begun, not finished nor dropped; ascending tickets
  int64_t last_ticket = 0;
  bool closed = false;
  std::string error;  // non-empty: failed
  std::vector<Request> requests;
  // counters
  int64_t begun = 0, started = 0, finished = 0, dropped = 0, posts = 0, takes = 0, waits = 0,
          waits_blocked = 0, layers_applied = 0;
};

// Process-wide on purpose: the channel kernels are created by TensorFlow's
// executor in two different function calls (the training call posts, the
// background call takes) and name their channel by an integer attr, so the
// channels must live where both find them. The TF binding's overlap state
// creates and closes them through the C functions below.
std::mutex g_mu;
std::condition_variable g_cv;  // flushers
std::vector<std::unique_ptr<Channel>> g_channels;
std::atomic<uint64_t> g_next_request{1};
bool g_tracing = false;
std::vector<std::string> g_events;
size_t g_max_events = 1000000;
int64_t g_dropped_events = 0;

// --- helpers (all with g_mu held) ----------------------------------------------
Channel* Find(int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(g_channels.size())) return nullptr;
  return g_channels[id].get();
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

void Event(const Channel& ch, const char* kind, int64_t ticket, int64_t t_us,
           const std::string& extra = "") {
  if (!g_tracing) return;
  if (g_events.size() >= g_max_events) {
    ++g_dropped_events;
    return;
  }
  std::ostringstream o;
  o << "{\"kind\":\"" << kind << "\",\"channel\":\"" << Escape(ch.name) << "\",\"ticket\":" << ticket
    << ",\"t_us\":" << t_us << extra << "}";
  g_events.push_back(o.str());
}

std::shared_ptr<Step> FindStep(Channel* ch, int64_t ticket) {
  for (auto& s : ch->live) {
    if (s->ticket == ticket) return s;
  }
  return nullptr;
}

Status ChannelError(const Channel& ch) {
  if (!ch.error.empty()) {
    return tensorflow::errors::Aborted("horovod_prio overlap ", ch.name, ": ", ch.error);
  }
  return tensorflow::errors::Cancelled("horovod_prio overlap ", ch.name,
                                       ": the channel is closed (interpreter exit)");
}

void Fail(Channel* ch, const std::string& msg) {
  if (ch->error.empty()) ch->error = msg;
  Event(*ch, "failed", 0, NowUs(), ",\"message\":\"" + Escape(msg) + "\"");
}

// Seals step s (its training call ended): dropped if it posted no gradient
// chunk (e.g. it failed before backprop, or it only accumulated), the
// channel fails if it posted only part of its slots.
void Seal(Channel* ch, const std::shared_ptr<Step>& s) {
  if (s->sealed) return;
  s->sealed = true;
  if (s->nchunks == 0) {
    ch->live.erase(std::remove(ch->live.begin(), ch->live.end(), s), ch->live.end());
    ++ch->dropped;
    Event(*ch, "drop", s->ticket, NowUs());
  } else if (s->nposted < ch->nslots) {
    std::ostringstream o;
    o << "training step " << s->ticket << " ended after posting only " << s->nposted << " of "
      << ch->nslots << " values (the step failed part-way); its update cannot be applied "
      << "consistently on every rank, so the overlapped optimizer stops here";
    Fail(ch, o.str());
  } else {
    Event(*ch, "sealed", s->ticket, NowUs());
  }
}

void SealAll(Channel* ch) {
  std::vector<std::shared_ptr<Step>> open;
  for (auto& s : ch->live) {
    if (!s->sealed) open.push_back(s);
  }
  for (auto& s : open) Seal(ch, s);
}

bool WaitSatisfied(const Channel& ch, const Request& r) {
  for (const auto& s : ch.live) {
    if (s->ticket > r.bound) break;
    // An unsealed step belongs to the call that is running now (an earlier
    // call's step is sealed when that call ends, at the latest by this call's
    // Begin): the wait's own step, whether its Begin ran before it or not.
    // Begin runs first in a call (no inputs), so its chunks can be posted while
    // the backward pass still runs.
    if (!s->sealed) continue;
    // A step without chunks never blocks: its call has ended without posting
    // a gradient, and it will be dropped.
    if (s->nchunks > 0 && !s->applied[r.task]) return false;
  }
  return true;
}

// Moves every request that can complete now into `ready` (closures to run
// outside the lock).
void Collect(Channel* ch, std::vector<std::function<void()>>* ready) {
  const bool dead = ch->closed || !ch->error.empty();
  const Status dead_status = dead ? ChannelError(*ch) : Status();
  std::vector<Request> keep;
  keep.reserve(ch->requests.size());
  for (auto& r : ch->requests) {
    if (dead) {
      auto fn = std::move(r.complete);
      ready->push_back([fn, dead_status]() { fn(dead_status, nullptr, 0); });
      continue;
    }
    switch (r.kind) {
      case Request::kWait: {
        if (!WaitSatisfied(*ch, r)) break;
        const int64_t now = NowUs();
        std::ostringstream o;
        o << ",\"task\":" << r.task << ",\"begin_us\":" << r.start_us
          << ",\"dur_us\":" << (now - r.start_us)
          << ",\"blocked\":" << (r.blocked ? "true" : "false");
        Event(*ch, "wait", r.bound + 1, now, o.str());
        auto fn = std::move(r.complete);
        ready->push_back([fn]() { fn(Status(), nullptr, 0); });
        continue;
      }
      case Request::kTakeBegin: {
        std::shared_ptr<Step> pick;
        for (auto& s : ch->live) {
          if (!s->taken && s->nchunks > 0) {
            pick = s;
            break;
          }
        }
        if (!pick) break;
        pick->taken = true;
        Event(*ch, "take_begin", pick->ticket, NowUs());
        auto fn = std::move(r.complete);
        const int64_t t = pick->ticket;
        ready->push_back([fn, t]() { fn(Status(), nullptr, t); });
        continue;
      }
      case Request::kTake: {
        auto s = FindStep(ch, r.ticket);
        if (!s) {
          auto fn = std::move(r.complete);
          Status st = tensorflow::errors::Aborted("horovod_prio overlap ", ch->name, ": step ",
                                                  r.ticket, " is gone");
          ready->push_back([fn, st]() { fn(st, nullptr, 0); });
          continue;
        }
        if (s->filled[r.slot] != 1) break;
        s->filled[r.slot] = 2;
        ++ch->takes;
        auto t = std::make_shared<Tensor>(std::move(s->slots[r.slot]));
        s->slots[r.slot] = Tensor();
        auto fn = std::move(r.complete);
        ready->push_back([fn, t]() { fn(Status(), t.get(), 0); });
        continue;
      }
    }
    keep.push_back(std::move(r));
  }
  ch->requests.swap(keep);
}

void Run(std::vector<std::function<void()>>* ready) {
  for (auto& f : *ready) f();
  ready->clear();
}

// Runs fn(ch) with g_mu held on channel `id` (InvalidArgument if there is no
// such channel), then, outside the lock, whatever became ready; returns fn's
// status.  Every state change of a channel goes through here or Enqueue.
template <typename Fn>
Status Mutate(int64_t id, Fn&& fn) {
  std::vector<std::function<void()>> ready;
  Status err;
  {
    std::lock_guard<std::mutex> l(g_mu);
    Channel* ch = Find(id);
    if (ch == nullptr) {
      return tensorflow::errors::InvalidArgument("horovod_prio overlap: no channel ", id);
    }
    err = fn(ch);
    Collect(ch, &ready);
  }
  Run(&ready);
  return err;
}

// Input 0 of kernel `op`: a step's ticket, which must be a scalar.
Status ReadTicket(tensorflow::OpKernelContext* ctx, const char* op, int64_t* ticket) {
  const Tensor& t = ctx->input(0);
  if (!tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return tensorflow::errors::InvalidArgument(op, ": ticket must be a scalar, got shape ",
                                               t.shape().DebugString());
  }
  *ticket = t.scalar<int64_t>()();
  return Status();
}

// Live step `ticket` of ch (FailedPrecondition if it is not live).
Status LiveStep(Channel* ch, int64_t ticket, std::shared_ptr<Step>* s) {
  *s = FindStep(ch, ticket);
  if (*s) return Status();
  return tensorflow::errors::FailedPrecondition("horovod_prio overlap ", ch->name, ": step ",
                                                ticket, " is not live");
}

// InvalidArgument unless 0 <= index < count (`what`: "task" or "slot").
Status CheckIndex(const Channel& ch, const char* what, int64_t index, int count) {
  if (index < count) return Status();
  return tensorflow::errors::InvalidArgument("horovod_prio overlap ", ch.name, ": no ", what, " ",
                                             index, " (the channel has ", count, ")");
}

// Removes pending request `id` (cancellation); returns its completion or null.
std::function<void(const Status&, const Tensor*, int64_t)> Withdraw(int64_t channel,
                                                                    uint64_t id) {
  std::lock_guard<std::mutex> l(g_mu);
  Channel* ch = Find(channel);
  if (ch == nullptr) return nullptr;
  for (auto it = ch->requests.begin(); it != ch->requests.end(); ++it) {
    if (it->id == id) {
      auto fn = std::move(it->complete);
      ch->requests.erase(it);
      return fn;
    }
  }
  return nullptr;
}

// Registers request `r` (with its cancellation) for an async kernel.  The
// completion sets the kernel's status/outputs and calls done exactly once.
void Enqueue(tensorflow::OpKernelContext* ctx, int64_t channel, Request r,
             tensorflow::AsyncOpKernel::DoneCallback done,
             std::function<void(tensorflow::OpKernelContext*, const Tensor*, int64_t)> on_ok) {
  using tensorflow::CancellationManager;
  using tensorflow::CancellationToken;
  struct Shared {
    std::atomic<bool> finished{false};
    std::atomic<bool> cancel_requested{false};
    CancellationManager* cm = nullptr;
    CancellationToken token = 0;
  };
  auto sh = std::make_shared<Shared>();
  const uint64_t id = g_next_request.fetch_add(1);
  r.id = id;
  r.complete = [ctx, done, on_ok, sh](const Status& st, const Tensor* t, int64_t v) {
    if (sh->finished.exchange(true)) return;
    if (sh->cm != nullptr) sh->cm->TryDeregisterCallback(sh->token);  // non-blocking
    if (st.ok()) {
      on_ok(ctx, t, v);
    } else {
      ctx->SetStatus(st);
    }
    done();
  };
  auto cancelled = []() {
    return tensorflow::errors::Cancelled("horovod_prio overlap: the call was cancelled");
  };
  // The cancellation callback is registered outside g_mu (a cancellation may
  // be running callbacks that take it); a cancellation that comes before the
  // request is queued is noticed right after queuing.
  CancellationManager* cm = ctx->cancellation_manager();
  if (cm != nullptr) {
    sh->cm = cm;
    sh->token = cm->get_cancellation_token();
    const bool ok = cm->RegisterCallback(sh->token, [channel, id, sh, cancelled]() {
      sh->cancel_requested = true;
      auto fn = Withdraw(channel, id);
      if (fn) fn(cancelled(), nullptr, 0);
    });
    if (!ok) {
      sh->cm = nullptr;
      r.complete(cancelled(), nullptr, 0);
      return;
    }
  }
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> l(g_mu);
    Channel* ch = Find(channel);
    if (ch == nullptr) {
      auto fn = std::move(r.complete);
      ready.push_back([fn, channel]() {
        fn(tensorflow::errors::InvalidArgument("horovod_prio overlap: no channel ", channel),
           nullptr, 0);
      });
    } else {
      ch->requests.push_back(std::move(r));
      Collect(ch, &ready);
    }
  }
  Run(&ready);
  if (sh->cancel_requested) {
    auto fn = Withdraw(channel, id);
    if (fn) fn(cancelled(), nullptr, 0);
  }
}

}  // namespace overlap
}  // namespace horovod_prio

namespace tensorflow {
namespace {

namespace ov = horovod_prio::overlap;

REGISTER_OP("HvdPrioOverlapBegin")
    .Output("ticket: int64")
    .Attr("channel: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return Status();
    })
    .Doc(R"doc(
A training call of overlap channel `channel` starts posting: returns the
step's ticket.  Give it no inputs, so it runs first in its call; the call's
HvdPrioOverlapWait ops never wait for the call's own (unsealed) step.  The step
is sealed when the call ends.
)doc");

REGISTER_OP("HvdPrioOverlapPost")
    .Input("ticket: int64")
    .Input("tensor: T")
    .Attr("T: type")
    .Attr("channel: int >= 0")
    .Attr("slot: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) { return Status(); })
    .Doc(R"doc(
Hands `tensor` (slot `slot` of step `ticket`) to the background call of the
channel and returns at once.
)doc");

REGISTER_OP("HvdPrioOverlapWait")
    .Attr("channel: int >= 0")
    .Attr("task: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) { return Status(); })
    .Doc(R"doc(
Completes once every step of an earlier call (begun before it started) has
applied layer (task) `task` of the channel: make the layer's variable reads
depend on it.
)doc");

REGISTER_OP("HvdPrioOverlapTakeBegin")
    .Output("ticket: int64")
    .Attr("channel: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return Status();
    })
    .Doc(R"doc(
Background side: the ticket of the oldest step not yet taken that has posted
something (waits for one).
)doc");

REGISTER_OP("HvdPrioOverlapTake")
    .Input("ticket: int64")
    .Output("tensor: T")
    .Attr("T: type")
    .Attr("shape: shape")
    .Attr("channel: int >= 0")
    .Attr("slot: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return Status();
    })
    .Doc(R"doc(
Background side: the value posted in slot `slot` of step `ticket` (waits for it).
)doc");

REGISTER_OP("HvdPrioOverlapLayerDone")
    .Input("ticket: int64")
    .Attr("channel: int >= 0")
    .Attr("task: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) { return Status(); })
    .Doc(R"doc(
Background side: step `ticket` applied its update of layer `task` (run it
after the layer's update ops).
)doc");

REGISTER_OP("HvdPrioOverlapFinish")
    .Input("ticket: int64")
    .Attr("channel: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) { return Status(); })
    .Doc(R"doc(
Background side: step `ticket` is completely applied.
)doc");

class OverlapBeginOp : public OpKernel {
 public:
  explicit OverlapBeginOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t ticket = 0;
    OP_REQUIRES_OK(ctx, ov::Mutate(channel_, [&ticket](ov::Channel* ch) -> Status {
      // An earlier call's step must have been sealed when that call ended:
      // this call's waits skip unsealed steps as their own (WaitSatisfied), so
      // a step left open would let them read stale weights.  Never silently:
      // fail the channel.
      bool late = false;
      for (const auto& s : ch->live) late = late || !s->sealed;
      ov::SealAll(ch);
      if (late && ch->error.empty() && !ch->closed) {
        ov::Fail(ch, "a training call ended without sealing its step (its cancellation "
                     "manager did not run the seal callback); the next call's per-layer "
                     "waits cannot be trusted");
      }
      if (ch->closed || !ch->error.empty()) return ov::ChannelError(*ch);
      auto s = std::make_shared<ov::Step>();
      s->ticket = ticket = ++ch->last_ticket;
      s->slots.resize(ch->nslots);
      s->filled.assign(ch->nslots, 0);
      s->applied.assign(ch->ntasks, 0);
      s->begin_us = ov::NowUs();
      ch->live.push_back(s);
      ++ch->begun;
      ov::Event(*ch, "begin", ticket, s->begin_us);
      return Status();
    }));
    // Seal the step when this call ends (the call's cancellation manager runs
    // still-registered callbacks when it is cancelled or destroyed).
    CancellationManager* cm = ctx->cancellation_manager();
    if (cm != nullptr) {
      const int64_t channel = channel_;
      const CancellationToken token = cm->get_cancellation_token();
      cm->RegisterCallback(token, [channel, ticket]() { SealStep(channel, ticket); });
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = ticket;
  }

  static void SealStep(int64_t channel, int64_t ticket) {
    ov::Mutate(channel, [ticket](ov::Channel* ch) -> Status {
      auto s = ov::FindStep(ch, ticket);
      if (s) ov::Seal(ch, s);
      return Status();
    }).IgnoreError();  // the channel is gone: nothing to seal
    ov::g_cv.notify_all();
  }

 private:
  int64_t channel_;
};

class OverlapPostOp : public OpKernel {
 public:
  explicit OverlapPostOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(c, c->GetAttr("slot", &slot_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t ticket = 0;
    OP_REQUIRES_OK(ctx, ov::ReadTicket(ctx, "HvdPrioOverlapPost", &ticket));
    const int64_t slot = slot_;
    OP_REQUIRES_OK(ctx, ov::Mutate(channel_, [ctx, ticket, slot](ov::Channel* ch) -> Status {
      TF_RETURN_IF_ERROR(ov::CheckIndex(*ch, "slot", slot, ch->nslots));
      if (ch->closed || !ch->error.empty()) return ov::ChannelError(*ch);
      auto s = ov::FindStep(ch, ticket);
      if (!s || s->sealed) {
        return errors::FailedPrecondition("horovod_prio overlap ", ch->name, ": post to step ",
                                          ticket, " after its call ended");
      }
      if (s->filled[slot] != 0) {
        return errors::FailedPrecondition("horovod_prio overlap ", ch->name, ": slot ", slot,
                                          " of step ", ticket, " posted twice");
      }
      s->slots[slot] = ctx->input(1);  // shares the buffer (refcounted, immutable)
      s->filled[slot] = 1;
      if (slot >= ch->nmeta && s->nchunks++ == 0) ++ch->started;
      ++s->nposted;
      ++ch->posts;
      ov::Event(*ch, "post", ticket, ov::NowUs(), ",\"slot\":" + std::to_string(slot));
      return Status();
    }));
  }

 private:
  int64_t channel_;
  int64_t slot_;
};

class OverlapWaitOp : public AsyncOpKernel {
 public:
  explicit OverlapWaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(c, c->GetAttr("task", &task_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ov::Request r;
    r.kind = ov::Request::kWait;
    r.task = static_cast<int>(task_);
    r.start_us = ov::NowUs();
    {
      std::lock_guard<std::mutex> l(ov::g_mu);
      ov::Channel* ch = ov::Find(channel_);
      OP_REQUIRES_ASYNC(ctx, ch != nullptr,
                        errors::InvalidArgument("horovod_prio overlap: no channel ", channel_),
                        done);
      OP_REQUIRES_OK_ASYNC(ctx, ov::CheckIndex(*ch, "task", task_, ch->ntasks), done);
      r.bound = ch->last_ticket;
      ++ch->waits;
      r.blocked = !ov::WaitSatisfied(*ch, r) && ch->error.empty() && !ch->closed;
      if (r.blocked) ++ch->waits_blocked;
    }
    ov::Enqueue(ctx, channel_, std::move(r), std::move(done),
                [](OpKernelContext*, const Tensor*, int64_t) {});
  }

 private:
  int64_t channel_;
  int64_t task_;
};

class OverlapTakeBeginOp : public AsyncOpKernel {
 public:
  explicit OverlapTakeBeginOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    ov::Request r;
    r.kind = ov::Request::kTakeBegin;
    ov::Enqueue(ctx, channel_, std::move(r), std::move(done),
                [out](OpKernelContext*, const Tensor*, int64_t ticket) {
                  out->scalar<int64_t>()() = ticket;
                });
  }

 private:
  int64_t channel_;
};

class OverlapTakeOp : public AsyncOpKernel {
 public:
  explicit OverlapTakeOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(c, c->GetAttr("slot", &slot_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("shape", &shape_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ov::Request r;
    r.kind = ov::Request::kTake;
    OP_REQUIRES_OK_ASYNC(ctx, ov::ReadTicket(ctx, "HvdPrioOverlapTake", &r.ticket), done);
    r.slot = static_cast<int>(slot_);
    const DataType dtype = dtype_;
    const PartialTensorShape shape = shape_;
    const int64_t slot = slot_;
    ov::Enqueue(ctx, channel_, std::move(r), std::move(done),
                [dtype, shape, slot](OpKernelContext* c, const Tensor* v, int64_t) {
                  if (v->dtype() != dtype || !shape.IsCompatibleWith(v->shape())) {
                    c->SetStatus(errors::InvalidArgument(
                        "HvdPrioOverlapTake: slot ", slot, " holds ", DataTypeString(v->dtype()),
                        v->shape().DebugString(), ", expected ", DataTypeString(dtype),
                        shape.DebugString()));
                    return;
                  }
                  c->set_output(0, *v);
                });
  }

 private:
  int64_t channel_;
  int64_t slot_;
  DataType dtype_;
  PartialTensorShape shape_;
};

class OverlapLayerDoneOp : public OpKernel {
 public:
  explicit OverlapLayerDoneOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
    OP_REQUIRES_OK(c, c->GetAttr("task", &task_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t ticket = 0;
    OP_REQUIRES_OK(ctx, ov::ReadTicket(ctx, "HvdPrioOverlapLayerDone", &ticket));
    const int64_t task = task_;
    OP_REQUIRES_OK(ctx, ov::Mutate(channel_, [ticket, task](ov::Channel* ch) -> Status {
      TF_RETURN_IF_ERROR(ov::CheckIndex(*ch, "task", task, ch->ntasks));
      std::shared_ptr<ov::Step> s;
      TF_RETURN_IF_ERROR(ov::LiveStep(ch, ticket, &s));
      if (!s->applied[task]) {
        s->applied[task] = 1;
        ++ch->layers_applied;
        ov::Event(*ch, "apply", ticket, ov::NowUs(), ",\"task\":" + std::to_string(task));
      }
      return Status();
    }));
  }

 private:
  int64_t channel_;
  int64_t task_;
};

class OverlapFinishOp : public OpKernel {
 public:
  explicit OverlapFinishOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("channel", &channel_));
  }

  void Compute(OpKernelContext* ctx) override {
    int64_t ticket = 0;
    OP_REQUIRES_OK(ctx, ov::ReadTicket(ctx, "HvdPrioOverlapFinish", &ticket));
    const Status err = ov::Mutate(channel_, [ticket](ov::Channel* ch) -> Status {
      std::shared_ptr<ov::Step> s;
      TF_RETURN_IF_ERROR(ov::LiveStep(ch, ticket, &s));
      if (std::count(s->filled.begin(), s->filled.end(), 2) != ch->nslots) {
        return errors::FailedPrecondition("horovod_prio overlap ", ch->name, ": step ", ticket,
                                          " finished before all its values were taken");
      }
      std::fill(s->applied.begin(), s->applied.end(), 1);
      ch->live.erase(std::remove(ch->live.begin(), ch->live.end(), s), ch->live.end());
      ++ch->finished;
      ov::Event(*ch, "finish", ticket, ov::NowUs(), ",\"begin_us\":" + std::to_string(s->begin_us));
      return Status();
    });
    ov::g_cv.notify_all();
    OP_REQUIRES_OK(ctx, err);
  }

 private:
  int64_t channel_;
};

REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapBegin").Device(DEVICE_CPU), OverlapBeginOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapPost").Device(DEVICE_CPU), OverlapPostOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapWait").Device(DEVICE_CPU), OverlapWaitOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapTakeBegin").Device(DEVICE_CPU), OverlapTakeBeginOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapTake").Device(DEVICE_CPU), OverlapTakeOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapLayerDone").Device(DEVICE_CPU), OverlapLayerDoneOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioOverlapFinish").Device(DEVICE_CPU), OverlapFinishOp);

}  // namespace
}  // namespace tensorflow

extern "C" {

namespace ov = horovod_prio::overlap;

// New channel `name` with `ntasks` layers and `nslots` posted values per
// step, the first `nmeta` of them the step's values, the rest gradient
// chunks; returns its id (>= 0) or -1 on bad arguments.
int64_t hvdprio_overlap_new(const char* name, int64_t ntasks, int64_t nslots, int64_t nmeta) {
  if (name == nullptr || ntasks < 1 || nmeta < 0 || nslots <= nmeta) return -1;
  std::lock_guard<std::mutex> l(ov::g_mu);
  auto ch = std::make_unique<ov::Channel>();
  ch->name = name;
  ch->ntasks = static_cast<int>(ntasks);
  ch->nslots = static_cast<int>(nslots);
  ch->nmeta = static_cast<int>(nmeta);
  ov::g_channels.push_back(std::move(ch));
  return static_cast<int64_t>(ov::g_channels.size()) - 1;
}

// Seals the channel's open steps (call it between training calls) and waits
// up to timeout_s (< 0: forever) until every step that posted is applied.
// 0: all applied; 1: timed out; -1: the channel failed or is closed; -2: no channel.
int hvdprio_overlap_flush(int64_t channel, double timeout_s) {
  std::vector<std::function<void()>> ready;
  std::unique_lock<std::mutex> l(ov::g_mu);
  ov::Channel* ch = ov::Find(channel);
  if (ch == nullptr) return -2;
  ov::SealAll(ch);
  ov::Collect(ch, &ready);
  if (!ready.empty()) {
    l.unlock();
    ov::Run(&ready);
    l.lock();
  }
  auto idle = [ch]() {
    if (ch->closed || !ch->error.empty()) return true;
    for (const auto& s : ch->live) {
      if (s->nchunks > 0) return false;
    }
    return true;
  };
  if (timeout_s < 0) {
    ov::g_cv.wait(l, idle);
  } else if (!ov::g_cv.wait_for(l, std::chrono::duration<double>(timeout_s), idle)) {
    return 1;
  }
  if (!ch->error.empty() || ch->closed) {
    // Closed with nothing pending counts as flushed.
    bool pending = false;
    for (const auto& s : ch->live) pending = pending || s->nchunks > 0;
    if (!ch->error.empty() || pending) return -1;
  }
  return 0;
}

// Fails the channel with `msg` (the first failure wins); wakes everything.
void hvdprio_overlap_fail(int64_t channel, const char* msg) {
  ov::Mutate(channel, [msg](ov::Channel* ch) -> tensorflow::Status {
    ov::Fail(ch, msg ? msg : "failed");
    return tensorflow::Status();
  }).IgnoreError();  // no such channel: nothing to fail
  ov::g_cv.notify_all();
}

// Closes the channel: pending and later kernels get Cancelled (the background
// loop ends).  Idempotent.
void hvdprio_overlap_close(int64_t channel) {
  ov::Mutate(channel, [](ov::Channel* ch) -> tensorflow::Status {
    if (!ch->closed) ov::Event(*ch, "closed", 0, ov::NowUs());
    ch->closed = true;
    return tensorflow::Status();
  }).IgnoreError();  // no such channel: nothing to close
  ov::g_cv.notify_all();
}

// 0 open, 1 closed, 2 failed, -1 no channel.
int hvdprio_overlap_state(int64_t channel) {
  std::lock_guard<std::mutex> l(ov::g_mu);
  ov::Channel* ch = ov::Find(channel);
  if (ch == nullptr) return -1;
  if (!ch->error.empty()) return 2;
  return ch->closed ? 1 : 0;
}

// Copies the failure message (NUL-terminated, truncated to cap); returns its length.
int64_t hvdprio_overlap_error(int64_t channel, char* buf, int64_t cap) {
  std::lock_guard<std::mutex> l(ov::g_mu);
  ov::Channel* ch = ov::Find(channel);
  if (ch == nullptr || cap <= 0) return 0;
  const std::string& e = ch->error;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(e.size()), cap - 1);
  std::memcpy(buf, e.data(), n);
  buf[n] = '\0';
  return static_cast<int64_t>(e.size());
}

const char* hvdprio_overlap_stats_fields(void) {
  return "begun,started,finished,dropped,live,posts,takes,waits,waits_blocked,layers_applied,"
         "pending_requests";
}

// Counters in the order of hvdprio_overlap_stats_fields; returns 0 (-1: no channel).
int hvdprio_overlap_stats(int64_t channel, int64_t* out, int n) {
  std::lock_guard<std::mutex> l(ov::g_mu);
  ov::Channel* ch = ov::Find(channel);
  if (ch == nullptr) return -1;
  const int64_t v[] = {ch->begun, ch->started, ch->finished, ch->dropped,
                       static_cast<int64_t>(ch->live.size()), ch->posts, ch->takes, ch->waits,
                       ch->waits_blocked, ch->layers_applied,
                       static_cast<int64_t>(ch->requests.size())};
  for (int i = 0; i < n && i < static_cast<int>(sizeof(v) / sizeof(v[0])); ++i) out[i] = v[i];
  return 0;
}

void hvdprio_overlap_set_tracing(int on) {
  std::lock_guard<std::mutex> l(ov::g_mu);
  ov::g_tracing = on != 0;
}

// Moves recorded events (JSON lines) into buf; returns the bytes written, or
// -(needed) if the first event does not fit.  Events that do not fit stay.
int64_t hvdprio_overlap_drain_events(char* buf, int64_t cap) {
  std::lock_guard<std::mutex> l(ov::g_mu);
  int64_t used = 0;
  size_t k = 0;
  for (; k < ov::g_events.size(); ++k) {
    const std::string& e = ov::g_events[k];
    const int64_t need = static_cast<int64_t>(e.size()) + 1;
    if (used + need > cap) {
      if (k == 0) return -need;
      break;
    }
    std::memcpy(buf + used, e.data(), e.size());
    buf[used + e.size()] = '\n';
    used += need;
  }
  ov::g_events.erase(ov::g_events.begin(), ov::g_events.begin() + k);
  return used;
}

}  // extern "C"
