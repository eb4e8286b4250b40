// TensorFlow kernels of horovod_prio (the only C++ that knows TensorFlow):
//   HvdPrioAllreduce (AsyncOpKernel) holds a chunk until the scheduler releases it,
//                    then runs Horovod's own allreduce kernel on it from the
//                    releasing thread and completes the chunk in Horovod's callback.
//   HvdPrioGate      (AsyncOpKernel) holds a chunk until the scheduler releases it.
//   HvdPrioDone      (OpKernel)      tells the scheduler the chunk's allreduce ended.
//   HvdPrioStepBegin (OpKernel)      a step starts: time stamp, priority vector out.
//   HvdPrioStepEnd   (OpKernel)      the step's last gradient is reduced: time stamp.
// The scheduler is the process-wide horovod_prio::Scheduler of
// libhvdprio_scheduler.so (this library links to it).  The step clock lives
// here; its extern "C" API (hvdprio_tf_*) is used by horovod_prio/tensorflow
// through ctypes on this very shared object.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/public/version.h"

namespace horovod_prio {
namespace {

// ---------------------------------------------------------------------------
// Step clock: one slot per monitored optimizer/tape.  StepBegin/StepEnd
// stamp a steady clock; the runtime's monitor thread waits for finished
// steps and sets the priority vector the next steps' gates use.
struct Slot {
  std::vector<int32_t> priorities;
  bool begun = false;
  double begin_s = 0;
  std::deque<std::pair<double, double>> finished;  // (begin, end), seconds
  int64_t dropped = 0;
};

// Process-wide on purpose: the kernels are created by TensorFlow's executor
// (no handle of ours reaches them), and a StepBegin/StepEnd op names its slot
// by an integer attr, so the slots must live where every kernel instance finds
// them. The runtime owns which slots exist (one per monitor) through the C
// functions below.
std::mutex g_clock_mu;
std::condition_variable g_clock_cv;
std::vector<Slot> g_slots;
std::atomic<int64_t> g_steps_begun{0};  // StepBegin runs of every slot (the arbiter's step tag)
constexpr size_t kMaxFinished = 4096;

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace
}  // namespace horovod_prio

namespace tensorflow {
namespace {

using horovod_prio::CancelResult;
using horovod_prio::Scheduler;

REGISTER_OP("HvdPrioGate")
    .Input("tensor: T")
    .Input("priority: int32")
    .Output("output: T")
    .Attr("T: type")
    .Attr("chunk_name: string")
    .Attr("abandon_on_cancel: bool = true")
    .Attr("nbytes: int = -1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->input(0));
      return Status();
    })
    .Doc(R"doc(
Holds `tensor` until the horovod_prio scheduler releases chunk `chunk_name`
(priority `priority`, size = `nbytes`, or the tensor's bytes if -1: a
collective whose other members send parts of their own asks for all of
them), then forwards it unchanged.  With
`abandon_on_cancel` (gates built in a graph, whose Done runs in the same step)
a chunk still in flight when the step is cancelled is abandoned.
)doc");

REGISTER_OP("HvdPrioAllreduce")
    .Input("tensor: T")
    .Input("priority: int32")
    .Output("output: T")
    .Attr("T: {uint8, int8, int32, int64, half, float, double}")
    .Attr("chunk_name: string")
    .Attr("abandon_on_cancel: bool = true")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->input(0));
      return Status();
    })
    .Doc(R"doc(
HvdPrioGate + HorovodAllreduce + HvdPrioDone in one op.  Holds `tensor` until
the horovod_prio scheduler releases chunk `chunk_name`, then runs Horovod's own
`HorovodAllreduce` kernel (tensor name: this node's name without its scope when
it starts with `chunk_name`, else `chunk_name`; the given reduce_op,
scale factors and process set; same arithmetic) from the thread that
released it, and completes the chunk in Horovod's callback.  Neither the
release nor the completion waits for a free TensorFlow inter-op thread.
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

REGISTER_OP("HvdPrioStepBegin")
    .Output("priorities: int32")
    .Attr("slot: int >= 0")
    .Attr("num_groups: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &n));
      c->set_output(0, c->Vector(n));
      return Status();
    })
    .Doc(R"doc(
A training step of monitor `slot` starts: records the time and returns the
priority vector its gates use (set by the monitor from earlier steps).
)doc");

REGISTER_OP("HvdPrioStepEnd")
    .Attr("slot: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) { return Status(); })
    .Doc(R"doc(
The step of monitor `slot` has its gradients reduced (run it after them with
control dependencies): records the time and wakes the monitor.
)doc");

// A chunk held by the scheduler until it releases it: the part HvdPrioGate
// and HvdPrioAllreduce share.  done() runs exactly once: after Released()
// (the kernel decides when), or, if the step is aborted while the chunk is
// held, from the cancellation callback with a Cancelled status.
//
// With abandon_on_cancel the cancellation callback stays registered after
// the release: if the step fails after this chunk was released (its
// allreduce errors, a rank dies, another op fails), the executor cancels the
// step and the callback abandons the chunk, so its bytes do not stay "in
// flight" for ever and the next step has the full credit.  When the step
// ends normally the callback runs as the step's cancellation manager is
// destroyed and finds the chunk completed (nothing to do).  Without it (an
// eager gate: its Done is another op, run after this op's manager is gone)
// the callback is deregistered at the release.
struct HeldChunk : std::enable_shared_from_this<HeldChunk> {
  using DoneCallback = AsyncOpKernel::DoneCallback;
  std::mutex mu;
  bool submitted = false;
  bool cancel_requested = false;
  uint64_t ticket = 0;
  std::atomic<int> phase{0};  // 0 held, 1 released, 2 done() called or due
  DoneCallback done;
  std::string what;  // "HvdPrioGate(<chunk>)" / "HvdPrioAllreduce(<chunk>)"
  std::string name;
  OpKernelContext* ctx = nullptr;
  CancellationManager* cm = nullptr;  // set: deregister at the release
  CancellationToken token = 0;

  virtual ~HeldChunk() = default;
  // The scheduler released the chunk (once; any thread, maybe inside Submit).
  virtual void Released() = 0;

  // Registers the cancellation callback and submits; ctx may be gone on return.
  void Hold(OpKernelContext* c, DoneCallback d, bool abandon_on_cancel, int64_t priority,
            int64_t bytes) {
    done = std::move(d);
    ctx = c;
    auto self = shared_from_this();
    CancellationManager* m = c->cancellation_manager();
    if (m != nullptr) {
      const CancellationToken t = m->get_cancellation_token();
      if (!abandon_on_cancel) {
        cm = m;
        token = t;
      }
      if (!m->RegisterCallback(t, [self]() { self->OnCancel(); })) {
        // the step is already being cancelled
        c->SetStatus(errors::Cancelled(what, ": step cancelled"));
        Finish();
        return;
      }
    }
    const uint64_t tk = Scheduler::Get().Submit(name, priority, bytes, [self]() {
      int held = 0;
      if (!self->phase.compare_exchange_strong(held, 1)) return;
      if (self->cm != nullptr) self->cm->TryDeregisterCallback(self->token);
      self->Released();
    });
    bool cancel_now;
    {
      std::lock_guard<std::mutex> l(mu);
      submitted = true;
      ticket = tk;
      cancel_now = cancel_requested;
    }
    if (cancel_now) CancelTicket();
  }

  void OnCancel() {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!submitted) {  // Submit() has not returned yet: it will cancel
        cancel_requested = true;
        return;
      }
    }
    CancelTicket();
  }

  void CancelTicket() {
    const CancelResult r = Scheduler::Get().Cancel(ticket);
    // A waiting/requested chunk was withdrawn: fail the step.  An in-flight
    // one was abandoned (its bytes freed): the kernel finishes as released.
    if (r != CancelResult::kWaiting && r != CancelResult::kRequested) return;
    int held = 0;
    if (!phase.compare_exchange_strong(held, 2)) return;
    ctx->SetStatus(errors::Cancelled(what, ": step cancelled while the chunk was held by "
                                     "the scheduler"));
    Finish();
  }

  void Finish() {
    ctx = nullptr;
    DoneCallback d = std::move(done);
    d();
  }
};

// What HvdPrioGate and HvdPrioAllreduce share: the chunk's attributes, its
// priority input, how a HeldChunk is handed to the scheduler, and that the
// kernel is cheap to start.
class HeldChunkKernel : public AsyncOpKernel {
 public:
  HeldChunkKernel(OpKernelConstruction* c, const char* op) : AsyncOpKernel(c), op_(op) {
    OP_REQUIRES_OK(c, c->GetAttr("chunk_name", &chunk_name_));
    OP_REQUIRES_OK(c, c->GetAttr("abandon_on_cancel", &abandon_on_cancel_));
    OP_REQUIRES(c, !chunk_name_.empty(),
                errors::InvalidArgument(op, ": chunk_name must be non-empty"));
  }

  // Cheap to start (it submits the chunk and returns; the data moves later),
  // so the executor runs it inline as soon as its input exists instead of
  // queueing it on the inter-op pool, where with one inter-op thread it would
  // wait for the rest of the backward pass (docs/bench.md).
  bool IsExpensive() override { return false; }

 protected:
  // The scalar priority input; false: the op failed and done() has run.
  bool ReadPriority(OpKernelContext* ctx, const DoneCallback& done, int64_t* priority) {
    const Tensor& prio = ctx->input(1);
    if (!TensorShapeUtils::IsScalar(prio.shape())) {
      ctx->CtxFailure(__FILE__, __LINE__,
                      errors::InvalidArgument(op_, "(", chunk_name_,
                                              "): priority must be a scalar, got shape ",
                                              prio.shape().DebugString()));
      done();
      return false;
    }
    *priority = prio.scalar<int32>()();
    return true;
  }

  // Names `st` after this op's chunk and submits it (ctx may be gone on return).
  // `nbytes` >= 0: the chunk's size instead of the tensor's bytes.
  void Hold(OpKernelContext* ctx, DoneCallback done, std::shared_ptr<HeldChunk> st,
            int64_t priority, int64_t nbytes = -1) {
    st->what = op_ + "(" + chunk_name_ + ")";
    st->name = chunk_name_;
    const int64_t bytes =
        nbytes >= 0 ? nbytes : static_cast<int64_t>(ctx->input(0).TotalBytes());
    st->Hold(ctx, std::move(done), abandon_on_cancel_, priority, bytes);
  }

  const std::string op_;
  std::string chunk_name_;
  bool abandon_on_cancel_ = true;
};

class HvdPrioGateOp : public HeldChunkKernel {
 public:
  explicit HvdPrioGateOp(OpKernelConstruction* c) : HeldChunkKernel(c, "HvdPrioGate") {
    if (!c->status().ok()) return;
    OP_REQUIRES_OK(c, c->GetAttr("nbytes", &nbytes_));
    OP_REQUIRES(c, nbytes_ >= -1,
                errors::InvalidArgument("HvdPrioGate(", chunk_name_, "): nbytes must be >= 0 "
                                        "(or -1: the tensor's bytes), got ", nbytes_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int64_t priority;
    if (!ReadPriority(ctx, done, &priority)) return;
    // The output is the input buffer (no copy).  Setting it now, on the TF
    // thread, is invisible downstream until done() runs.
    ctx->set_output(0, ctx->input(0));
    // Released: done() at once (from whichever thread released the chunk:
    // this one if it may go at once, a HvdPrioDone kernel, a Grant() caller).
    Hold(ctx, std::move(done), std::make_shared<Gate>(), priority, nbytes_);
  }

 private:
  int64_t nbytes_ = -1;
  struct Gate : HeldChunk {
    void Released() override { Finish(); }
  };
};

// The gate and the allreduce in one kernel.  Why: a chunk released from
// another thread (a grant from the arbiter, the completion of another chunk)
// hands its successors to TensorFlow's inter-op pool from outside; a pool
// thread busy with the backward pass runs them only when its chain of ready
// ops ends, so with one inter-op thread a granted chunk reached Horovod (and
// its HvdPrioDone ran) only after the whole backward pass.  Here the releasing
// thread calls Horovod's kernel itself and Horovod's callback completes the
// chunk in the scheduler, so credit and grants follow the link, not the
// executor.  The inner kernel gets this op's context: same input 0 (the
// tensor), same output 0, and a NodeDef named `chunk_name`, so Horovod sees
// exactly the tensor, name and attributes hvd.allreduce would give it.
class HvdPrioAllreduceOp : public HeldChunkKernel {
 public:
  explicit HvdPrioAllreduceOp(OpKernelConstruction* c)
      : HeldChunkKernel(c, "HvdPrioAllreduce") {
    if (!c->status().ok()) return;
    DataType dtype;
    int64_t reduce_op, process_set_id;
    float prescale, postscale;
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype));
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id));
    // Horovod's tensor name, as its own op with ignore_name_scope would take
    // it: this node's name without its scope.  The binding names the node
    // after the chunk, so that is the chunk name, or the chunk name with
    // TensorFlow's "_N" suffix when one graph holds the chunk twice (two
    // collectives that must not share a name).  Otherwise (eager) the chunk name.
    std::string node = c->def().name();
    const size_t slash = node.rfind('/');
    if (slash != std::string::npos) node = node.substr(slash + 1);
    inner_def_.set_name(node.compare(0, chunk_name_.size(), chunk_name_) == 0 ? node
                                                                                : chunk_name_);
    inner_def_.set_op("HorovodAllreduce");
    inner_def_.add_input("tensor");  // only validated (the kernel reads input 0 of our context)
    AddNodeAttr("T", dtype, &inner_def_);
    AddNodeAttr("reduce_op", reduce_op, &inner_def_);
    AddNodeAttr("prescale_factor", prescale, &inner_def_);
    AddNodeAttr("postscale_factor", postscale, &inner_def_);
    AddNodeAttr("ignore_name_scope", true, &inner_def_);
    AddNodeAttr("process_set_id", process_set_id, &inner_def_);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int64_t priority;
    if (!ReadPriority(ctx, done, &priority)) return;
    AsyncOpKernel* inner = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, InnerKernel(ctx, &inner), done);
    // Released: Horovod's kernel runs; done() from Horovod's callback once the
    // chunk was reduced (or failed).  A chunk abandoned in flight still ends there.
    auto st = std::make_shared<Allreduce>();
    st->inner = inner;
    Hold(ctx, std::move(done), st, priority);
  }

 private:
  Status InnerKernel(OpKernelContext* ctx, AsyncOpKernel** out) {
    std::lock_guard<std::mutex> l(inner_mu_);
    if (!inner_) {
      Status s;
      inner_ = CreateOpKernel(DeviceType(DEVICE_CPU), ctx->device(),
                              ctx->device()->GetAllocator(AllocatorAttributes()), inner_def_,
                              TF_GRAPH_DEF_VERSION, &s);
      if (!s.ok() || !inner_) {
        inner_.reset();
        return errors::FailedPrecondition(
            "HvdPrioAllreduce(", chunk_name_, "): cannot create Horovod's HorovodAllreduce "
            "kernel (is horovod.tensorflow's op library loaded?): ", s.ToString());
      }
      if (inner_->AsAsync() == nullptr) {
        inner_.reset();
        return errors::Internal("HvdPrioAllreduce(", chunk_name_,
                                "): HorovodAllreduce is not an asynchronous kernel");
      }
    }
    *out = inner_->AsAsync();
    return Status();
  }

  struct Allreduce : HeldChunk {
    AsyncOpKernel* inner = nullptr;

    void Released() override {
      auto self = std::static_pointer_cast<Allreduce>(shared_from_this());
      inner->ComputeAsync(ctx, [self]() { self->Reduced(); });
    }

    // Horovod's callback (its background thread), or the inner kernel
    // failing before it enqueued: the status is already on ctx.
    void Reduced() {
      uint64_t t;
      {
        std::lock_guard<std::mutex> l(mu);
        t = ticket;
      }
      // Submit() has returned by now unless the release ran inside it and the
      // inner kernel failed synchronously; complete by name then.
      if (t != 0) {
        Scheduler::Get().CompleteTicket(t);
      } else {
        Scheduler::Get().Complete(name);
      }
      phase.store(2);
      Finish();
    }
  };

  NodeDef inner_def_;
  std::mutex inner_mu_;
  std::unique_ptr<OpKernel> inner_;
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

class HvdPrioStepBeginOp : public OpKernel {
 public:
  explicit HvdPrioStepBeginOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("slot", &slot_));
    OP_REQUIRES_OK(c, c->GetAttr("num_groups", &num_groups_));
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_groups_}), &out));
    auto v = out->flat<int32>();
    std::lock_guard<std::mutex> lk(horovod_prio::g_clock_mu);
    auto& slots = horovod_prio::g_slots;
    OP_REQUIRES(ctx, slot_ < static_cast<int64_t>(slots.size()) &&
                         static_cast<int64_t>(slots[slot_].priorities.size()) == num_groups_,
                errors::FailedPrecondition("HvdPrioStepBegin: monitor slot ", slot_,
                                           " with ", num_groups_, " groups was not created"));
    horovod_prio::Slot& s = slots[slot_];
    for (int64_t i = 0; i < num_groups_; ++i) v(i) = s.priorities[i];
    s.begun = true;
    s.begin_s = horovod_prio::SteadySeconds();
    horovod_prio::g_steps_begun.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  int64_t slot_;
  int64_t num_groups_;
};

class HvdPrioStepEndOp : public OpKernel {
 public:
  explicit HvdPrioStepEndOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("slot", &slot_));
  }

  void Compute(OpKernelContext* ctx) override {
    const double now = horovod_prio::SteadySeconds();
    {
      std::lock_guard<std::mutex> lk(horovod_prio::g_clock_mu);
      auto& slots = horovod_prio::g_slots;
      OP_REQUIRES(ctx, slot_ < static_cast<int64_t>(slots.size()),
                  errors::FailedPrecondition("HvdPrioStepEnd: no monitor slot ", slot_));
      horovod_prio::Slot& s = slots[slot_];
      if (!s.begun) return;  // (a step whose begin was not seen)
      s.begun = false;
      if (s.finished.size() >= horovod_prio::kMaxFinished) {
        s.finished.pop_front();
        ++s.dropped;
      }
      s.finished.emplace_back(s.begin_s, now);
    }
    horovod_prio::g_clock_cv.notify_all();
  }

 private:
  int64_t slot_;
};

// No type constraint: the kernels never touch the data, so any T works.
REGISTER_KERNEL_BUILDER(Name("HvdPrioGate").Device(DEVICE_CPU), HvdPrioGateOp);
// CPU only: the inner kernel is Horovod's CPU HorovodAllreduce.
REGISTER_KERNEL_BUILDER(Name("HvdPrioAllreduce").Device(DEVICE_CPU), HvdPrioAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioDone").Device(DEVICE_CPU), HvdPrioDoneOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioStepBegin").Device(DEVICE_CPU), HvdPrioStepBeginOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioStepEnd").Device(DEVICE_CPU), HvdPrioStepEndOp);
// GPU tensors are forwarded in place (priority read on the host).  Untested
// here (tensorflow-cpu), but needs no CUDA code.
REGISTER_KERNEL_BUILDER(Name("HvdPrioGate").Device(DEVICE_GPU).HostMemory("priority"),
                        HvdPrioGateOp);
REGISTER_KERNEL_BUILDER(Name("HvdPrioDone").Device(DEVICE_GPU), HvdPrioDoneOp);

}  // namespace
}  // namespace tensorflow

extern "C" {

// Creates a monitor slot whose vector starts as `priorities` (n values);
// returns its index.
int64_t hvdprio_tf_slot_new(const int32_t* priorities, int64_t n) {
  std::lock_guard<std::mutex> lk(horovod_prio::g_clock_mu);
  horovod_prio::Slot s;
  s.priorities.assign(priorities, priorities + n);
  horovod_prio::g_slots.push_back(std::move(s));
  return static_cast<int64_t>(horovod_prio::g_slots.size()) - 1;
}

// Sets the vector the next StepBegin of `slot` returns.  0 ok, -1 bad slot/size.
int hvdprio_tf_set_priorities(int64_t slot, const int32_t* priorities, int64_t n) {
  std::lock_guard<std::mutex> lk(horovod_prio::g_clock_mu);
  auto& slots = horovod_prio::g_slots;
  if (slot < 0 || slot >= static_cast<int64_t>(slots.size()) ||
      static_cast<int64_t>(slots[slot].priorities.size()) != n) {
    return -1;
  }
  std::copy(priorities, priorities + n, slots[slot].priorities.begin());
  return 0;
}

// Waits up to timeout_s until some slot has finished steps (or a wake);
// returns 1 if one has, else 0.
int hvdprio_tf_wait(double timeout_s) {
  std::unique_lock<std::mutex> lk(horovod_prio::g_clock_mu);
  auto any = []() {
    for (const auto& s : horovod_prio::g_slots) {
      if (!s.finished.empty()) return true;
    }
    return false;
  };
  if (timeout_s > 0 && !any()) {
    horovod_prio::g_clock_cv.wait_for(lk, std::chrono::duration<double>(timeout_s));
  }
  return any() ? 1 : 0;
}

// Moves up to `max` finished steps of `slot` into out as (begin, end) pairs
// of steady-clock seconds, oldest first; returns how many (-1: bad slot).
// *dropped gets the steps lost to the bound of the queue since the last call.
int64_t hvdprio_tf_take_steps(int64_t slot, double* out, int64_t max, int64_t* dropped) {
  std::lock_guard<std::mutex> lk(horovod_prio::g_clock_mu);
  auto& slots = horovod_prio::g_slots;
  if (slot < 0 || slot >= static_cast<int64_t>(slots.size())) return -1;
  horovod_prio::Slot& s = slots[slot];
  int64_t k = 0;
  for (; k < max && !s.finished.empty(); ++k) {
    out[2 * k] = s.finished.front().first;
    out[2 * k + 1] = s.finished.front().second;
    s.finished.pop_front();
  }
  if (dropped != nullptr) {
    *dropped = s.dropped;
    s.dropped = 0;
  }
  return k;
}

// How many steps have begun in this process (all slots); 0 before the first.
int64_t hvdprio_tf_steps_begun(void) {
  return horovod_prio::g_steps_begun.load(std::memory_order_relaxed);
}

// Wakes every waiter (shutdown).
void hvdprio_tf_wake(void) { horovod_prio::g_clock_cv.notify_all(); }

}  // extern "C"
