// TensorFlow wrapper of the horovod_prio release scheduler:
//   HvdPrioGate  (AsyncOpKernel) holds a chunk until the scheduler releases it.
//   HvdPrioDone  (OpKernel)      tells the scheduler the chunk's allreduce ended.
// plus an extern "C" API used by horovod_prio/cc/__init__.py through ctypes on
// the very same shared object (one process-wide Scheduler::Get()).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "scheduler.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace {

using horovod_prio::Scheduler;

REGISTER_OP("HvdPrioGate")
    .Input("tensor: T")
    .Input("priority: int32")
    .Output("output: T")
    .Attr("T: type")
    .Attr("chunk_name: string")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->input(0));
      return Status();
    })
    .Doc(R"doc(
Holds `tensor` until the horovod_prio scheduler releases chunk `chunk_name`
(priority `priority`, size = tensor bytes), then forwards it unchanged.
)doc");

REGISTER_OP("HvdPrioDone")
    .Input("tensor: T")
    .Output("output: T")
    .Attr("T: type")
    .Attr("chunk_name: string")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return Status();
    })
    .Doc(R"doc(
Marks chunk `chunk_name` as finished (frees its in-flight bytes in the
horovod_prio scheduler) and forwards `tensor` unchanged.
)doc");

class HvdPrioGateOp : public AsyncOpKernel {
 public:
  explicit HvdPrioGateOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("chunk_name", &chunk_name_));
    OP_REQUIRES(c, !chunk_name_.empty(),
                errors::InvalidArgument("HvdPrioGate: chunk_name must be non-empty"));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& prio = ctx->input(1);
    OP_REQUIRES_ASYNC(
        ctx, TensorShapeUtils::IsScalar(prio.shape()),
        errors::InvalidArgument("HvdPrioGate(", chunk_name_,
                                "): priority must be a scalar, got shape ",
                                prio.shape().DebugString()),
        done);
    const int64_t priority = prio.scalar<int32>()();
    const int64_t bytes = static_cast<int64_t>(ctx->input(0).TotalBytes());
    // The output is the input buffer (no copy).  Setting it now, on the TF
    // thread, is invisible downstream until done() runs.
    ctx->set_output(0, ctx->input(0));

    // done() runs exactly once: from whichever thread releases the chunk
    // (this one if it may go at once, a HvdPrioDone kernel, a Grant() caller)
    // or, if the step is aborted while the chunk is held, from the
    // cancellation callback with a Cancelled status.
    auto st = std::make_shared<GateState>();
    st->done = std::move(done);
    st->name = chunk_name_;
    st->ctx = ctx;
    st->cm = ctx->cancellation_manager();
    if (st->cm != nullptr) {
      st->token = st->cm->get_cancellation_token();
      const bool registered = st->cm->RegisterCallback(st->token, [st]() {
        uint64_t ticket;
        {
          std::lock_guard<std::mutex> l(st->mu);
          if (!st->submitted) {  // Submit() has not returned yet
            st->cancel_requested = true;
            return;
          }
          ticket = st->ticket;
        }
        if (Scheduler::Get().Cancel(ticket)) st->Finish(/*cancelled=*/true, false);
      });
      if (!registered) {  // the step is already being cancelled
        ctx->SetStatus(errors::Cancelled("HvdPrioGate(", chunk_name_,
                                         "): step cancelled"));
        st->done();
        return;
      }
    }
    const std::string name = chunk_name_;
    const uint64_t ticket = Scheduler::Get().Submit(
        name, priority, bytes, [st]() { st->Finish(false, true); });
    // From here on ctx may be gone (released and done() already ran).
    bool cancel_now;
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->submitted = true;
      st->ticket = ticket;
      cancel_now = st->cancel_requested;
    }
    if (cancel_now && Scheduler::Get().Cancel(ticket)) st->Finish(true, false);
  }

 private:
  struct GateState {
    std::mutex mu;
    bool submitted = false;
    bool cancel_requested = false;
    uint64_t ticket = 0;
    std::atomic<bool> finished{false};
    DoneCallback done;
    std::string name;
    OpKernelContext* ctx = nullptr;
    CancellationManager* cm = nullptr;
    CancellationToken token = 0;

    // released: the scheduler let the chunk go; else it was withdrawn.
    void Finish(bool cancelled, bool released) {
      if (finished.exchange(true)) return;
      if (released && cm != nullptr) {
        // Non-blocking; fails harmlessly if cancellation is under way (its
        // callback will find the chunk already released and do nothing).
        cm->TryDeregisterCallback(token);
      }
      if (cancelled) {
        ctx->SetStatus(errors::Cancelled("HvdPrioGate(", name,
                                         "): step cancelled while the chunk was "
                                         "held by the scheduler"));
      }
      DoneCallback d = std::move(done);
      d();
    }
  };

  std::string chunk_name_;
};

class HvdPrioDoneOp : public OpKernel {
 public:
  explicit HvdPrioDoneOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("chunk_name", &chunk_name_));
    OP_REQUIRES(c, !chunk_name_.empty(),
                errors::InvalidArgument("HvdPrioDone: chunk_name must be non-empty"));
  }

  void Compute(OpKernelContext* ctx) override {
    Scheduler::Get().Complete(chunk_name_);
    ctx->set_output(0, ctx->input(0));
  }

 private:
  std::string chunk_name_;
};

// No type constraint: the kernels never touch the data, so any T works.
REGISTER_KERNEL_BUILDER(Name("HvdPrioGate").Device(DEVICE_CPU), HvdPrioGateOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioDone").Device(DEVICE_CPU), HvdPrioDoneOp);
// GPU tensors are forwarded in place (priority read on the host).  Untested
// here (tensorflow-cpu), but needs no CUDA code.
REGISTER_KERNEL_BUILDER(Name("HvdPrioGate").Device(DEVICE_GPU).HostMemory("priority"),
                        HvdPrioGateOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioDone").Device(DEVICE_GPU), HvdPrioDoneOp);

// ---------------------------------------------------------------------------
// extern "C" API helpers.

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

// Text drained from the scheduler but not yet handed to a caller.
std::mutex g_drain_mu;
std::string g_drain_text;

}  // namespace
}  // namespace tensorflow

using horovod_prio::Scheduler;

extern "C" {

// Returns 0 on success, -1 if credit < 0 (nothing changed).
int hvdprio_configure(int64_t credit_bytes, int hold) {
  try {
    Scheduler::Get().Configure(credit_bytes, hold != 0);
    return 0;
  } catch (const std::invalid_argument&) {
    return -1;
  }
}

void hvdprio_set_tracing(int on) { Scheduler::Get().SetTracing(on != 0); }

void hvdprio_set_max_events(int64_t max_events) {
  Scheduler::Get().SetMaxEvents(max_events < 0 ? 0 : static_cast<size_t>(max_events));
}

// Moves the recorded events into a pending JSON-lines text (one object per
// line: kind, name, priority, bytes, t_us, queued, inflight_bytes and, for
// "request"/"release", waiting_max_priority).  If buf != NULL and cap is at
// least the text length + 1, copies the text with a terminating NUL into buf,
// clears it and returns its length (>= 0).  Otherwise returns -(length + 1),
// i.e. minus the capacity needed, and keeps the text for the next call
// (nothing is lost; a later call may need more room if new events arrived).
int64_t hvdprio_drain_events(char* buf, int64_t cap) {
  std::vector<horovod_prio::Event> ev = Scheduler::Get().DrainEvents();
  std::lock_guard<std::mutex> lk(tensorflow::g_drain_mu);
  std::string& text = tensorflow::g_drain_text;
  for (const auto& e : ev) {
    text.append("{\"kind\":");
    tensorflow::AppendJsonString(&text, e.kind);
    text.append(",\"name\":");
    tensorflow::AppendJsonString(&text, e.name);
    text.append(",\"priority\":" + std::to_string(e.priority));
    text.append(",\"bytes\":" + std::to_string(e.bytes));
    text.append(",\"t_us\":" + std::to_string(e.t_us));
    text.append(",\"queued\":" + std::to_string(e.queued));
    text.append(",\"inflight_bytes\":" + std::to_string(e.inflight_bytes));
    if (e.kind == "release" || e.kind == "request") {  // not ready/done/cancel
      text.append(",\"waiting_max_priority\":" +
                  std::to_string(e.waiting_max_priority));
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

// Comma-separated names of the values hvdprio_stats() writes, in order.
const char* hvdprio_stats_fields() {
  return "submitted,released,completed,max_inflight_bytes,queued,inflight_bytes,"
         "inflight_chunks,unknown_completions,dropped_events,credit_bytes,hold,"
         "external_grant,requested,unknown_grants,tracing,cancelled,abandoned";
}

// Writes min(n, N) values into out (order: hvdprio_stats_fields()); returns N.
int hvdprio_stats(int64_t* out, int n) {
  const horovod_prio::Stats s = Scheduler::Get().GetStats();
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

// Drops in-flight bookkeeping of chunks whose Done will never run (after a
// failed step); returns how many.
int64_t hvdprio_abandon_inflight() { return Scheduler::Get().AbandonInflight(); }

// Returns 1 on success, 0 if refused because chunks are waiting/requested.
int hvdprio_reset() {
  if (!Scheduler::Get().Reset()) return 0;
  std::lock_guard<std::mutex> lk(tensorflow::g_drain_mu);
  tensorflow::g_drain_text.clear();
  return 1;
}

// External grant mode (cross-job arbiter hook).
void hvdprio_set_external_grant(int on) { Scheduler::Get().SetExternalGrant(on != 0); }

void hvdprio_set_grant_callbacks(Scheduler::RequestCb request_cb,
                                 Scheduler::CompleteCb complete_cb) {
  Scheduler::Get().SetGrantCallbacks(request_cb, complete_cb);
}

// Returns 1 if a requested chunk of that name was released, 0 otherwise.
int hvdprio_grant(const char* name) {
  if (name == nullptr) return 0;
  return Scheduler::Get().Grant(name) ? 1 : 0;
}

}  // extern "C"
