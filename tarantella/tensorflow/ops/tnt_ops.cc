// Tarantella's TensorFlow ops: a collective as two compiled ops instead of
// tf.numpy_function calls (builder: tarantella/tensorflow/ops/build.py).
//
//   token = TntCollectiveStart(inputs, scale)   submits one request per input
//   outputs = TntCollectiveWait(tokens)         completes when they all have
//
// Start is a synchronous kernel that returns at once: it allocates each output,
// hands the input and output buffers to the core (tnt_*_async) and keeps both
// alive in the token (a variant tensor, see Requests). Wait is an AsyncOpKernel: it queues the
// token to a completion thread (one per wait in flight) and returns, so no
// inter-op thread blocks on communication; that thread calls done() when the
// core has finished. Both ops
// are stateful, so automatic control dependencies keep them in program order
// on every rank; because Start returns at once, the buckets of a step are all
// in flight together (a single async op per bucket would be chained to the
// previous bucket's completion instead).
//
// The core is the cffi extension tarantella/_core.abi3.so that Python already
// loaded: tnt_tfop_bind() finds it with dlopen(RTLD_NOLOAD), so every call goes
// to the same context (rank, transport, engine thread) as the Python API. The
// ops have CPU kernels only: on a GPU machine TensorFlow copies GPU tensors to
// the host and back around them (untested on a GPU).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tarantella.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_encode_decode.h"
#include "tensorflow/core/framework/variant_tensor_data.h"

namespace tnt_tf {
using namespace tensorflow;

// ---- the core's entry points, resolved once in the loaded extension --------

struct CoreApi {
  // the _layout forms: every request carries its tensor's tnt_shape_layout,
  // as the NumPy API's does, so that a rank on these ops and one on the
  // numpy_function ops (TNT_TF_OPS=numpy) submit alike
  decltype(&tnt_allreduce_layout_async) allreduce_async;
  decltype(&tnt_broadcast_layout_async) broadcast_async;
  decltype(&tnt_allgather_into_layout_async) allgather_async;
  decltype(&tnt_shape_layout) shape_layout;
  decltype(&tnt_empty_rows_layout) empty_rows_layout;
  decltype(&tnt_test) test;
  decltype(&tnt_wait) wait;
  decltype(&tnt_result_count) result_count;
  decltype(&tnt_result_copy) result_copy;
  decltype(&tnt_release) release;
  decltype(&tnt_last_error) last_error;
  decltype(&tnt_last_error_rank) last_error_rank;
  decltype(&tnt_strerror) strerror;
  decltype(&tnt_sequence_counter) sequence_counter;
  decltype(&tnt_name_in_flight) name_in_flight;
};
std::atomic<const CoreApi *> g_api{nullptr};

// The layout of the shape of `t` from dimension `from` on (allreduce and
// broadcast: 0; allgather: 1, its rows): tnt_shape_layout, 0 below 2 dimensions.
std::vector<int64_t> DimsFrom(const Tensor &t, int from) {
  std::vector<int64_t> dims;
  for (int d = from; d < t.dims(); ++d) dims.push_back(t.dim_size(d));
  return dims;
}

uint64_t ShapeLayout(const CoreApi &api, const Tensor &t, int from) {
  if (t.dims() - from < 2) return 0;
  const std::vector<int64_t> dims = DimsFrom(t, from);
  return api.shape_layout(static_cast<int>(dims.size()), dims.data());
}

// The slice of a completion thread's wait (the core bounds the wait itself),
// and the longest a blocking wait holds TensorFlow's thread.
constexpr double kLongSliceS = 1.0;

const char *CodeName(tnt_result_t code) {
  switch (code) {
    case TNT_ERR_INVALID_ARGUMENT: return "TNT_ERR_INVALID_ARGUMENT";
    case TNT_ERR_INVALID_USAGE: return "TNT_ERR_INVALID_USAGE";
    case TNT_ERR_MISMATCH: return "TNT_ERR_MISMATCH";
    case TNT_ERR_PEER_LOST: return "TNT_ERR_PEER_LOST";
    case TNT_ERR_TIMEOUT: return "TNT_ERR_TIMEOUT";
    case TNT_ERR_SYSTEM: return "TNT_ERR_SYSTEM";
    default: return "TNT_ERR_INTERNAL";
  }
}

// "Tarantella <what>: <the core's message> (<what to do>) [TNT_ERR_<code>, rank <r>]":
// the bracket lets Python raise the TarantellaError itself (ops.tarantella_error).
Status CoreError(const CoreApi &api, tnt_result_t code, const std::string &what) {
  std::string msg = "Tarantella " + what + ": " + api.last_error() + " (" + api.strerror(code) + ") [" +
                    CodeName(code);
  int rank = api.last_error_rank();
  if ((code == TNT_ERR_PEER_LOST || code == TNT_ERR_TIMEOUT) && rank >= 0) msg += ", rank " + std::to_string(rank);
  msg += "]";
  switch (code) {
    case TNT_ERR_INVALID_ARGUMENT: return errors::InvalidArgument(msg);
    case TNT_ERR_INVALID_USAGE:
    case TNT_ERR_MISMATCH: return errors::FailedPrecondition(msg);
    // not Unavailable/Aborted: TensorFlow turns those into InternalError
    // anyway when a non-communication op returns them
    case TNT_ERR_PEER_LOST: return errors::Internal(msg);
    case TNT_ERR_TIMEOUT: return errors::DeadlineExceeded(msg);
    default: return errors::Internal(msg);
  }
}

bool CoreDtype(DataType dt, tnt_dtype_t *out) {
  switch (dt) {
    case DT_HALF: *out = TNT_FLOAT16; return true;
    case DT_BFLOAT16: *out = TNT_BFLOAT16; return true;
    case DT_FLOAT: *out = TNT_FLOAT32; return true;
    case DT_DOUBLE: *out = TNT_FLOAT64; return true;
    case DT_INT32: *out = TNT_INT32; return true;
    case DT_INT64: *out = TNT_INT64; return true;
    default: return false;
  }
}

// ---- requests in flight, between Start and Wait ----------------------------

// One request of a structure (StartOp::ComputeStructure): a flat buffer of one dtype.
struct Flat {
  std::string name;
  Tensor in, out;  // out: an allreduce's or broadcast's result (an allreduce's is `in` itself)
  tnt_dtype_t dt = TNT_FLOAT32;
  uint64_t layout = 0;
};

struct Pending {
  std::string kind;
  std::vector<tnt_handle_t> handles;
  std::vector<Tensor> inputs;   // kept alive: the core reads them until completion
  std::vector<Tensor> outputs;  // allreduce/broadcast: written by the core
  std::vector<Tensor> row_counts;  // allgather: per input, its row count where its rows have no elements
  // A structure (a nested list/tuple/dict of tensors, the leaves in flatten's order): its requests
  // are flat buffers, one per dtype (allgather: after one of the leaves' row counts); `later`, all
  // but the first, are submitted by the Wait once the first has completed (Completer::Progress),
  // as the NumPy API's _structure_collective does: the first carries the structure's digest and
  // fails with a MismatchError on every rank where the ranks' structures differ.
  bool structure = false;
  std::vector<TensorShape> leaf_shapes;
  std::vector<DataType> leaf_dtypes;
  std::vector<int> leaf_groups;  // the dtype group (data request) of each leaf
  std::vector<Flat> later;
  bool unnamed = false;  // `later` named after an unnamed first request: wait for an earlier one in flight
  int reduce_op = 0, root = 0;
  double scale = 1.0;
};

// Submits one request of a structure (1-d: an allgather's rows are its elements). The name of an
// unnamed call comes back every `window` calls, and the call of that name may still be in flight:
// waited for, and submitted again, as StartOp does for one tensor.
tnt_result_t SubmitFlat(const CoreApi &api, const Pending &p, const Flat &f, tnt_handle_t *h) {
  const char *name = f.name.c_str();
  const int64_t n = f.in.NumElements();
  for (bool again = p.unnamed;; again = false) {
    tnt_result_t r;
    if (p.kind == "allgather") {
      r = api.allgather_async(name, f.in.data(), n, 1, f.dt, nullptr, 0, f.layout, h);
    } else if (p.kind == "allreduce") {
      r = api.allreduce_async(name, f.in.data(), f.out.data(), n, f.dt, static_cast<tnt_reduce_op_t>(p.reduce_op),
                              p.scale, f.layout, h);
    } else {
      r = api.broadcast_async(name, f.in.data(), f.out.data(), n, f.dt, p.root, f.layout, h);
    }
    if (!(r == TNT_ERR_INVALID_USAGE && again && api.name_in_flight(name))) return r;
    while (api.name_in_flight(name)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// An allgather of rows of no elements (a (5, 0) tensor): their data is no bytes, which cannot say
// how many rows each rank has, and the result had no rows at all ((0, 0), where eager mode gave
// (10, 0) on 2 ranks). Each rank sends its row count instead, as one row of 8 bytes in the
// tensor's dtype, under tnt_empty_rows_layout of its rows' shape, as the NumPy API does.
constexpr int64_t kRowCountBytes = 8;

int64_t RowElems(const Tensor &t) {
  int64_t row = 1;
  for (int d = 1; d < t.dims(); ++d) row *= t.dim_size(d);
  return row;
}

uint64_t EmptyRowsLayout(const CoreApi &api, const Tensor &t) {
  const std::vector<int64_t> dims = DimsFrom(t, 1);
  return api.empty_rows_layout(static_cast<int>(dims.size()), dims.data());
}

// The requests of a Start, from Start to the Wait that takes them. The token Start outputs is a
// variant tensor holding them: when it goes without a Wait having taken them (an op between the
// two failed, so TensorFlow dropped the rest of the step; a Start that failed half-way through
// its list; a Wait pruned), they are handed to a completion thread, which releases them once the
// core has finished with their buffers (orphans, below). An int64 token into a registry kept
// them there for good: handles, inputs and outputs leaked at every such failure.
struct Requests {
  std::mutex mu;
  bool taken = false;  // by a Wait
  Pending pending;
  ~Requests();  // orphans what no Wait took (defined after the Completer)
};

std::atomic<int64_t> g_unwaited{0};  // Requests of submitted requests that no Wait has taken yet
std::atomic<int64_t> g_orphans{0};   // orphaned requests whose core requests are still in flight

struct Token {
  std::shared_ptr<Requests> requests;
  std::string TypeName() const { return "TntCollectiveToken"; }
  void Encode(VariantTensorData *data) const { data->set_type_name(TypeName()); }
  bool Decode(const VariantTensorData &data) { return false; }  // a token lives in its process only
  std::string DebugString() const { return "TntCollectiveToken"; }
};

// ---- the completion threads ------------------------------------------------

struct Job {
  Pending pending;
  OpKernelContext *ctx = nullptr;  // nullptr: an orphan, completed only to be released
  AsyncOpKernel::DoneCallback done;
  size_t next = 0;  // handles before it have completed
  tnt_result_t failed = TNT_SUCCESS;
  std::string error;
};

std::atomic<bool> g_blocking{false};  // a wait blocks in a TensorFlow thread (Completer::Submit)

class Completer {
 public:
  static Completer &Get() {
    static Completer *c = new Completer();  // never destroyed: the threads outlive static destructors
    return *c;
  }
  // Finishes `job` at once when its requests are already complete (small
  // ones on one rank often are), or, with `block`, waits for them here;
  // else hands it to a completion thread.
  //
  // A blocking wait holds one of TensorFlow's inter-op threads, and the
  // requests it waits for may need an inter-op thread on another rank to be
  // started at all. Python threads that each train a model of their own run
  // their steps at once: when their blocking waits held every inter-op thread
  // of rank 0 for requests whose Start ops rank 1 had not run yet, while rank
  // 1's did the same the other way round, no rank went on (a hang until
  // TNT_TIMEOUT_S, measured: 4 threads on 2 ranks of 2 inter-op threads). So
  // only one wait of the process blocks at a time (the others hand off at
  // once), and it hands off too after one long slice: a stall is bounded
  // even where the inter-op pool has a single thread.
  // Requests no Wait will take: released once complete, without blocking the caller (a
  // tensor's destructor, in whichever thread drops it).
  void Orphan(Pending pending) {
    if (pending.handles.empty()) return;
    auto *job = new Job();
    job->pending = std::move(pending);
    job->pending.later.clear();  // a structure's later requests: never submitted, as no one takes them
    g_orphans.fetch_add(1);
    Submit(job, false);
  }

  void Submit(Job *job, bool block) {
    const CoreApi &api = *g_api.load();
    bool expected = false;
    if (block && g_blocking.compare_exchange_strong(expected, true)) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(kLongSliceS);
      for (;;) {
        const double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
        if (Progress(api, job, left > 0 ? left : 0) || left <= 0) break;
      }
      g_blocking.store(false);
    } else {
      Progress(api, job, 0);
    }
    if (job->next == job->pending.handles.size()) return Finish(api, job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(job);
      if (idle_ < jobs_.size()) {  // every thread waits for a job of its own: one more
        ++idle_;  // counted from now, so that a burst of jobs starts one thread each
        std::thread([this] { Run(); }).detach();
      }
    }
    cv_.notify_one();
  }

 private:
  Completer() = default;  // threads start on demand (Submit)

  // Advances `job` past its completed handles; true when none is in flight.
  // `slice_s` > 0: wait that long for the first one still in flight.
  static bool Progress(const CoreApi &api, Job *job, double slice_s) {
    for (;;) {
      if (!Advance(api, job, slice_s)) return false;
      Pending &p = job->pending;
      if (p.later.empty() || job->failed != TNT_SUCCESS) return true;
      // a structure whose first request has completed on every rank (its digest agreed): the rest
      std::vector<Flat> later = std::move(p.later);
      p.later.clear();
      for (Flat &f : later) {
        tnt_handle_t h = 0;
        const tnt_result_t r = SubmitFlat(api, p, f, &h);
        if (r != TNT_SUCCESS) {
          job->failed = r;
          job->error = std::string(CoreError(api, r, p.kind + " of " + f.name).message());
          return true;
        }
        p.handles.push_back(h);
        p.inputs.push_back(f.in);
        p.outputs.push_back(f.out);
      }
    }
  }

  static bool Advance(const CoreApi &api, Job *job, double slice_s) {
    while (job->next < job->pending.handles.size()) {
      tnt_handle_t h = job->pending.handles[job->next];
      tnt_result_t r = slice_s > 0 ? api.wait(h, slice_s) : api.test(h);
      if (r == TNT_ERR_TIMEOUT || r == TNT_IN_PROGRESS) {
        r = api.test(h);  // our slice ended, or the core's own deadline failed it
        if (r == TNT_IN_PROGRESS) return false;
      }
      if (r != TNT_SUCCESS && job->failed == TNT_SUCCESS) {
        job->failed = r;
        job->error = std::string(CoreError(api, r, job->pending.kind).message());
      }
      job->next++;
      slice_s = 0;
    }
    return true;
  }

  static void Finish(const CoreApi &api, Job *job) {
    Pending &p = job->pending;
    OpKernelContext *ctx = job->ctx;
    if (ctx == nullptr) {  // an orphan: its buffers go with the job, once the core is done with them
      for (tnt_handle_t h : p.handles) api.release(h);
      delete job;
      g_orphans.fetch_sub(1);
      return;
    }
    Status status;
    if (job->failed != TNT_SUCCESS) {
      status = Status(CoreError(api, job->failed, p.kind).code(), job->error);
    } else if (p.structure) {
      status = p.kind == "allgather" ? SplitGathered(api, p, ctx) : SplitFlats(p, ctx);
    } else if (p.kind == "allgather") {
      for (size_t i = 0; i < p.handles.size() && status.ok(); ++i) {
        int64_t count = 0;
        tnt_result_t r = api.result_count(p.handles[i], &count);
        if (r != TNT_SUCCESS) { status = CoreError(api, r, p.kind); break; }
        const TensorShape &in = p.inputs[i].shape();
        const int64_t row = RowElems(p.inputs[i]);
        int64_t rows = row ? count / row : 0;
        if (!row) {  // every rank's row count, each in kRowCountBytes of the tensor's dtype
          std::vector<int64_t> counts(count * DataTypeSize(p.inputs[i].dtype()) / kRowCountBytes);
          r = counts.empty() ? TNT_SUCCESS : api.result_copy(p.handles[i], counts.data());
          if (r != TNT_SUCCESS) { status = CoreError(api, r, p.kind); break; }
          for (int64_t c : counts) rows += c;
        }
        TensorShape shape;
        shape.AddDim(rows);
        for (int d = 1; d < in.dims(); ++d) shape.AddDim(in.dim_size(d));
        Tensor *out = nullptr;
        status = ctx->allocate_output(static_cast<int>(i), shape, &out);
        if (status.ok() && row && count > 0) {
          r = api.result_copy(p.handles[i], out->data());
          if (r != TNT_SUCCESS) status = CoreError(api, r, p.kind);
        }
      }
    } else {
      for (size_t i = 0; i < p.outputs.size(); ++i) ctx->set_output(static_cast<int>(i), p.outputs[i]);
    }
    for (tnt_handle_t h : p.handles) api.release(h);
    if (!status.ok()) ctx->SetStatus(status);
    auto done = std::move(job->done);
    delete job;
    done();
  }

  // A structure's allreduce or broadcast: each leaf's values out of its dtype's flat result, in order.
  static Status SplitFlats(const Pending &p, OpKernelContext *ctx) {
    std::vector<size_t> offset(p.outputs.size(), 0);
    for (size_t i = 0; i < p.leaf_shapes.size(); ++i) {
      const int g = p.leaf_groups[i];
      if (g < 0 || static_cast<size_t>(g) >= p.outputs.size())
        return errors::Internal("TntCollectiveWait: a leaf of a request that was not made");
      Tensor *out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(i), p.leaf_shapes[i], &out));
      const auto dst = out->tensor_data();
      const auto src = p.outputs[g].tensor_data();
      if (offset[g] + dst.size() > src.size()) return errors::Internal("TntCollectiveWait: a structure's result is short");
      if (dst.size()) std::memcpy(const_cast<char *>(dst.data()), src.data() + offset[g], dst.size());
      offset[g] += dst.size();
    }
    return Status();
  }

  // A structure's allgather: the first request gathered every rank's row count of each leaf, the
  // others each dtype's leaves, flat, rank after rank (each rank's leaves of the dtype in order):
  // each leaf's rows of every rank, concatenated in rank order, as _allgather_structure does.
  static Status SplitGathered(const CoreApi &api, const Pending &p, OpKernelContext *ctx) {
    const size_t leaves = p.leaf_shapes.size();
    int64_t count = 0;
    tnt_result_t r = api.result_count(p.handles[0], &count);
    if (r != TNT_SUCCESS) return CoreError(api, r, p.kind);
    if (leaves == 0 || count % static_cast<int64_t>(leaves))
      return errors::Internal("TntCollectiveWait: ", count, " row counts for ", leaves, " leaves");
    std::vector<int64_t> rows(count);
    if (count && (r = api.result_copy(p.handles[0], rows.data())) != TNT_SUCCESS) return CoreError(api, r, p.kind);
    const int64_t ranks = count / static_cast<int64_t>(leaves);
    std::vector<int64_t> row_elems(leaves, 1);
    std::vector<Tensor *> outs(leaves, nullptr);
    for (size_t i = 0; i < leaves; ++i) {
      const TensorShape &s = p.leaf_shapes[i];
      int64_t total = 0;
      for (int64_t q = 0; q < ranks; ++q) total += rows[q * leaves + i];
      TensorShape shape;
      shape.AddDim(total);
      for (int d = 1; d < s.dims(); ++d) {
        shape.AddDim(s.dim_size(d));
        row_elems[i] *= s.dim_size(d);
      }
      TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(i), shape, &outs[i]));
    }
    const int groups = static_cast<int>(p.handles.size()) - 1;
    for (int g = 0; g < groups; ++g) {
      tnt_handle_t h = p.handles[g + 1];
      if ((r = api.result_count(h, &count)) != TNT_SUCCESS) return CoreError(api, r, p.kind);
      DataType dt = DT_INVALID;
      for (size_t i = 0; i < leaves; ++i)
        if (p.leaf_groups[i] == g) dt = p.leaf_dtypes[i];
      if (dt == DT_INVALID) return errors::Internal("TntCollectiveWait: a request of no leaf");
      Tensor flat(dt, TensorShape({count}));
      if (count && (r = api.result_copy(h, flat.data())) != TNT_SUCCESS) return CoreError(api, r, p.kind);
      const size_t item = DataTypeSize(dt);
      const char *src = flat.tensor_data().data();
      size_t offset = 0;
      std::vector<size_t> written(leaves, 0);
      for (int64_t q = 0; q < ranks; ++q) {
        for (size_t i = 0; i < leaves; ++i) {
          if (p.leaf_groups[i] != g) continue;
          const size_t n = static_cast<size_t>(rows[q * leaves + i] * row_elems[i]) * item;
          const auto dst = outs[i]->tensor_data();
          if (offset + n > flat.tensor_data().size() || written[i] + n > dst.size())
            return errors::Internal("TntCollectiveWait: the gathered rows of a structure do not add up");
          if (n) std::memcpy(const_cast<char *>(dst.data()) + written[i], src + offset, n);
          offset += n;
          written[i] += n;
        }
      }
    }
    return Status();
  }

  // One completion thread per job in flight, each waiting on its own job's
  // requests (the core bounds every wait). A single thread served them all,
  // blocking for 1 s slices on the oldest while it was alone: a job queued
  // meanwhile waited for the slice to end, though its requests had completed,
  // so while one tf.function's collective waited for a late peer, every op of
  // another that waited on the thread took up to 1 s (measured: 4 steps of a
  // 4-float allreduce in 3 s, 1383 without the pending one). Threads are
  // never ended: as many as the most waits ever in flight at once.
  void Run() {
    for (;;) {
      Job *job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        job = jobs_.front();
        jobs_.pop_front();
        --idle_;
      }
      const CoreApi &api = *g_api.load();
      while (!Progress(api, job, kLongSliceS)) {
      }
      Finish(api, job);
      std::lock_guard<std::mutex> lock(mu_);
      ++idle_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job *> jobs_;
  size_t idle_ = 0;  // threads waiting for a job, or started for one
};

Requests::~Requests() {
  if (taken || pending.handles.empty()) return;
  g_unwaited.fetch_sub(1);
  if (g_api.load() != nullptr) Completer::Get().Orphan(std::move(pending));
}

// ---- the ops ---------------------------------------------------------------

REGISTER_OP("TntCollectiveStart")
    .Input("inputs: T")
    .Input("scale: double")
    .Output("token: variant")
    .Attr("T: list({half, bfloat16, float, double, int32, int64}) >= 1")
    .Attr("kind: {'allreduce', 'broadcast', 'allgather'}")
    .Attr("names: list(string)")
    .Attr("reduce_op: int = 0")
    .Attr("root: int = 0")
    .Attr("unnamed: bool = false")
    .Attr("window: int = 60")
    .Attr("layout: int = 0")
    .Attr("leaf_groups: list(int) = []")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Submits one Tarantella collective request per input; `scale` is this "
         "rank's prescale (allreduce). The token goes to TntCollectiveWait. `unnamed`: one "
         "input, named when the op runs '<kind>.<k mod window><names[0]>', k the next number "
         "of the core's counter '<kind><names[0]>' (the sequence's, shared with Python). "
         "`leaf_groups` (not empty): the inputs are the leaves of a structure, sent as the NumPy "
         "API sends one: leaf i in the flat request of dtype group leaf_groups[i] (allgather: "
         "after one of the leaves' row counts), each carrying `layout` (allgather: the first "
         "only), named names[0] and names[r] (unnamed: the name made, then it + names[r]).");

REGISTER_OP("TntCollectiveWait")
    .Input("tokens: N * variant")
    .Attr("N: int >= 1")
    .Attr("block: bool = false")
    .Output("outputs: T")
    .Attr("T: list({half, bfloat16, float, double, int32, int64}) >= 1")
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnknownShape)
    .Doc("The results of the requests of TntCollectiveStart tokens, in order, once complete.");

class StartOp : public OpKernel {
 public:
  explicit StartOp(OpKernelConstruction *c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("kind", &kind_));
    OP_REQUIRES_OK(c, c->GetAttr("names", &names_));
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(c, c->GetAttr("root", &root_));
    OP_REQUIRES_OK(c, c->GetAttr("unnamed", &unnamed_));
    OP_REQUIRES_OK(c, c->GetAttr("window", &window_));
    int64_t layout = 0;
    OP_REQUIRES_OK(c, c->GetAttr("layout", &layout));
    layout_ = static_cast<uint64_t>(layout);  // a digest of 64 bits, passed as a signed attribute
    OP_REQUIRES_OK(c, c->GetAttr("leaf_groups", &leaf_groups_));
    OP_REQUIRES(c, !unnamed_ || ((names_.size() == 1 || !leaf_groups_.empty()) && window_ > 0),
                errors::InvalidArgument("TntCollectiveStart: an unnamed call takes one input, one suffix "
                                        "and a window of at least 1"));
  }

  // An unnamed call's name, made now (not at trace time) from the next number of its sequence's
  // counter in the core, the one Python's unnamed calls of that thread (or tf.data function) take
  // their numbers from (request_names.py): a traced call and an eager one then take one sequence
  // of numbers, in the order they run, as when the traced call came back into Python for its name.
  std::string UnnamedName(const CoreApi &api, Status *status) {
    int64_t *counter = counter_.load();
    if (counter == nullptr) {
      counter = api.sequence_counter((kind_ + names_[0]).c_str());  // never freed: kept for good
      if (counter == nullptr) {
        *status = errors::ResourceExhausted("Tarantella ", kind_, ": no memory for the count of unnamed calls");
        return "";
      }
      counter_.store(counter);
    }
    const int64_t k = __atomic_fetch_add(counter, 1, __ATOMIC_SEQ_CST);
    return kind_ + "." + std::to_string(k % window_) + names_[0];
  }

  void Compute(OpKernelContext *ctx) override {
    const CoreApi *api = g_api.load();
    OP_REQUIRES(ctx, api != nullptr,
                errors::FailedPrecondition("Tarantella's ops were loaded without binding them to the core: "
                                           "use tarantella.tensorflow.ops, not tf.load_op_library"));
    OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("inputs", &inputs));
    OP_REQUIRES(ctx, !leaf_groups_.empty() || static_cast<size_t>(inputs.size()) == names_.size(),
                errors::InvalidArgument("TntCollectiveStart: ", inputs.size(), " inputs but ", names_.size(),
                                        " names"));
    // scalar<double>() of another shape is a failed CHECK, which aborts the process (a
    // prescale of 2 or 0 elements did); Python refuses what it can see at trace time
    const Tensor &scale_in = ctx->input(inputs.size());
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(scale_in.shape()),
                errors::InvalidArgument("Tarantella allreduce: prescale must be a scalar. Received: a tensor of shape ",
                                        scale_in.shape().DebugString()));
    const double scale = scale_in.scalar<double>()();
    if (!leaf_groups_.empty()) return ComputeStructure(ctx, *api, inputs, scale);
    Pending p;
    p.kind = kind_;
    Status status;
    for (int i = 0; i < inputs.size() && status.ok(); ++i) {
      const Tensor &in = inputs[i];
      // No OP_REQUIRES in this loop: it returns at once, and `p` went with the requests
      // already submitted, whose buffers the core then read and wrote after they were freed
      // (an output that could not be allocated half-way through a list). A failure breaks
      // out instead, and they are registered below.
      tnt_dtype_t dt;
      if (!CoreDtype(in.dtype(), &dt)) {
        status = errors::InvalidArgument("Tarantella collectives do not take ", DataTypeString(in.dtype()));
        break;
      }
      tnt_handle_t h = 0;
      tnt_result_t r = TNT_SUCCESS;
      const std::string made = unnamed_ ? UnnamedName(*api, &status) : std::string();
      if (!status.ok()) break;
      const char *name = unnamed_ ? made.c_str() : names_[i].c_str();
      Tensor counts, out;  // an allgather's row count (rows of no elements), an allreduce's or broadcast's result
      bool allocated = false;
      // An unnamed name comes back every `window` calls: the call of that name `window` calls
      // earlier may still be in flight (an eager allreduce_async not waited for yet), and the core
      // refuses a name in flight. It is waited for, and the request submitted again, as the Python
      // API waits for it first (collectives._settle_before); only once refused, so that the
      // common call pays nothing.
      for (bool again = unnamed_;; again = false) {
        if (kind_ == "allgather") {
          const int64_t row = RowElems(in);
          if (row) {
            r = api->allgather_async(name, in.data(), in.NumElements(), row, dt, nullptr, 0,
                                     ShapeLayout(*api, in, 1), &h);
          } else {
            counts = Tensor(DT_INT64, TensorShape({1}));
            counts.flat<int64_t>()(0) = in.dim_size(0);  // rows of no elements: at least 2 dimensions
            const int64_t per_rank = kRowCountBytes / DataTypeSize(in.dtype());
            r = api->allgather_async(name, counts.data(), per_rank, per_rank, dt, nullptr, 0,
                                     EmptyRowsLayout(*api, in), &h);
          }
        } else {
          // An allreduce may run in place (the core allows in == out): when this
          // op holds the only reference to an input (a packed bucket, a
          // gradient nobody else reads), its buffer becomes the output, and a
          // fresh one (page faults included: ~1 ms per 10 MB here) is saved.
          if (!allocated) {  // once: a second try reuses it
            status = kind_ == "allreduce" ? ctx->forward_input_or_allocate_temp({i}, in.dtype(), in.shape(), &out)
                                          : ctx->allocate_temp(in.dtype(), in.shape(), &out);
            if (!status.ok()) break;
            allocated = true;
          }
          const uint64_t layout = ShapeLayout(*api, in, 0);
          r = kind_ == "allreduce"
                  ? api->allreduce_async(name, in.data(), out.data(), in.NumElements(), dt,
                                         static_cast<tnt_reduce_op_t>(reduce_op_), scale, layout, &h)
                  : api->broadcast_async(name, in.data(), out.data(), in.NumElements(), dt, root_, layout, &h);
        }
        if (!(r == TNT_ERR_INVALID_USAGE && again && api->name_in_flight(name))) break;
        // the earlier call depends only on calls before it, which every rank made: it ends (or
        // the core fails it within TNT_TIMEOUT_S), and name_in_flight is 0 once it has
        while (api->name_in_flight(name)) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (!status.ok()) break;
      if (r != TNT_SUCCESS) {
        status = CoreError(*api, r, kind_ + " of " + name);
        break;
      }
      if (kind_ == "allgather") {
        p.row_counts.push_back(counts);  // the core reads it until completion (empty: rows of elements)
      } else {
        p.outputs.push_back(out);
      }
      p.handles.push_back(h);
      p.inputs.push_back(in);
    }
    // After a failed submission, the requests already submitted go with `requests` when it goes
    // here: orphaned, released once the core is done with their buffers (~Requests).
    auto requests = std::make_shared<Requests>();
    if (!p.handles.empty()) g_unwaited.fetch_add(1);
    requests->pending = std::move(p);
    OP_REQUIRES_OK(ctx, status);
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<Variant>()() = Token{std::move(requests)};
  }

  // A structure's call (leaf_groups_): the leaves copied into one flat buffer per dtype group, and
  // the first request submitted now; the others wait in the token for the Wait (Pending::later).
  void ComputeStructure(OpKernelContext *ctx, const CoreApi &api, const OpInputList &inputs, double scale) {
    const bool gather = kind_ == "allgather";
    const int leaves = inputs.size();
    OP_REQUIRES(ctx, static_cast<int>(leaf_groups_.size()) == leaves && leaves > 0,
                errors::InvalidArgument("TntCollectiveStart: ", leaves, " leaves but ", leaf_groups_.size(),
                                        " groups"));
    int groups = 0;
    for (int g : leaf_groups_) groups = std::max(groups, g + 1);
    OP_REQUIRES(ctx, static_cast<int>(names_.size()) == groups + (gather ? 1 : 0),
                errors::InvalidArgument("TntCollectiveStart: ", names_.size(), " names for ", groups,
                                        " groups of a structure's ", kind_));
    std::vector<DataType> dtypes(groups, DT_INVALID);
    std::vector<int64_t> elems(groups, 0);
    Pending p;
    p.kind = kind_;
    p.structure = true;
    p.unnamed = unnamed_;
    p.reduce_op = reduce_op_;
    p.root = root_;
    p.scale = scale;
    p.leaf_groups = leaf_groups_;
    for (int i = 0; i < leaves; ++i) {
      const int g = leaf_groups_[i];
      tnt_dtype_t dt;
      OP_REQUIRES(ctx, g >= 0 && (dtypes[g] == DT_INVALID || dtypes[g] == inputs[i].dtype()),
                  errors::InvalidArgument("TntCollectiveStart: leaf ", i, " in group ", g, " of another dtype"));
      OP_REQUIRES(ctx, CoreDtype(inputs[i].dtype(), &dt),
                  errors::InvalidArgument("Tarantella collectives do not take ", DataTypeString(inputs[i].dtype())));
      dtypes[g] = inputs[i].dtype();
      elems[g] += inputs[i].NumElements();
      p.leaf_shapes.push_back(inputs[i].shape());
      p.leaf_dtypes.push_back(inputs[i].dtype());
    }
    for (int g = 0; g < groups; ++g)
      OP_REQUIRES(ctx, dtypes[g] != DT_INVALID, errors::InvalidArgument("TntCollectiveStart: group ", g, " is empty"));
    Status status;
    const std::string base = unnamed_ ? UnnamedName(api, &status) : names_[0];
    OP_REQUIRES_OK(ctx, status);
    std::vector<Flat> flats;
    if (gather) {  // each leaf's row count (a 0-d leaf is one row), under the structure's digest
      Flat f;
      f.name = base;
      f.in = Tensor(DT_INT64, TensorShape({leaves}));
      for (int i = 0; i < leaves; ++i)
        f.in.flat<int64_t>()(i) = inputs[i].dims() ? inputs[i].dim_size(0) : 1;
      f.dt = TNT_INT64;
      f.layout = layout_;
      flats.push_back(std::move(f));
    }
    for (int g = 0; g < groups; ++g) {
      Flat f;
      const int r = g + (gather ? 1 : 0);
      f.name = r == 0 ? base : unnamed_ ? base + names_[r] : names_[r];
      CoreDtype(dtypes[g], &f.dt);
      f.layout = gather ? 0 : layout_;  // an allgather's data: 1-d, as the NumPy API's (shape layout 0)
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtypes[g], TensorShape({elems[g]}), &f.in));
      size_t offset = 0;
      char *dst = const_cast<char *>(f.in.tensor_data().data());
      for (int i = 0; i < leaves; ++i) {
        if (leaf_groups_[i] != g) continue;
        const auto src = inputs[i].tensor_data();
        if (src.size()) std::memcpy(dst + offset, src.data(), src.size());
        offset += src.size();
      }
      if (kind_ == "allreduce") {
        f.out = f.in;  // in place: the core allows it, and the flat buffer is this op's own
      } else if (kind_ == "broadcast") {
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtypes[g], TensorShape({elems[g]}), &f.out));
      }
      flats.push_back(std::move(f));
    }
    tnt_handle_t h = 0;
    const tnt_result_t r = SubmitFlat(api, p, flats[0], &h);
    OP_REQUIRES(ctx, r == TNT_SUCCESS, CoreError(api, r, kind_ + " of " + flats[0].name));
    p.handles.push_back(h);
    p.inputs.push_back(flats[0].in);
    p.outputs.push_back(flats[0].out);
    p.later.assign(std::make_move_iterator(flats.begin() + 1), std::make_move_iterator(flats.end()));
    auto requests = std::make_shared<Requests>();
    g_unwaited.fetch_add(1);
    requests->pending = std::move(p);
    Tensor *out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<Variant>()() = Token{std::move(requests)};
  }

 private:
  std::string kind_;
  std::vector<std::string> names_;  // unnamed: one, the suffix of the sequence's names
  int reduce_op_ = 0, root_ = 0;
  bool unnamed_ = false;
  int64_t window_ = 60;
  uint64_t layout_ = 0;            // not 0: the layout of every request (a structure's digest)
  std::vector<int> leaf_groups_;  // not empty: a structure (ComputeStructure)
  std::atomic<int64_t *> counter_{nullptr};
};

// `block`: wait in the calling TensorFlow thread instead of handing off to the
// completion thread. For a wait that ends a step (the gradients), where that
// thread has nothing else to run: on an oversubscribed host the hand-off to a
// sleeping thread and back cost milliseconds per step (docs/benchmarks.md).
class WaitOp : public AsyncOpKernel {
 public:
  explicit WaitOp(OpKernelConstruction *c) : AsyncOpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("block", &block_)); }

  // One wait for several tokens (the buckets of a step): one hand-off to the
  // completion thread instead of one per bucket.
  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    auto *job = new Job();
    std::string problem;
    Pending &all = job->pending;
    {
      for (int i = 0; i < ctx->num_inputs(); ++i) {
        const Token *token = ctx->input(i).scalar<Variant>()().get<Token>();
        std::shared_ptr<Requests> requests = token ? token->requests : nullptr;
        if (requests == nullptr) {
          problem = "input " + std::to_string(i) + " is not a TntCollectiveStart token";
          continue;
        }
        std::lock_guard<std::mutex> lock(requests->mu);
        if (requests->taken) {
          problem = "a token waited for twice";
          continue;
        }
        requests->taken = true;
        if (!requests->pending.handles.empty()) g_unwaited.fetch_sub(1);
        Pending p = std::move(requests->pending);
        if (p.structure) {  // a structure's token comes alone: its outputs are its leaves
          if (ctx->num_inputs() != 1) problem = "a structure's token with others";
          for (tnt_handle_t h : all.handles) p.handles.push_back(h);  // none, unless a problem: released
          all = std::move(p);
          continue;
        }
        if (all.structure) {
          problem = "a structure's token with others";
          all.handles.insert(all.handles.end(), p.handles.begin(), p.handles.end());
          continue;
        }
        if (!all.kind.empty() && all.kind != p.kind) problem = "tokens of " + all.kind + " and " + p.kind;
        all.kind = p.kind;
        all.handles.insert(all.handles.end(), p.handles.begin(), p.handles.end());
        all.inputs.insert(all.inputs.end(), p.inputs.begin(), p.inputs.end());
        all.outputs.insert(all.outputs.end(), p.outputs.begin(), p.outputs.end());
        // the row counts too, which the core reads until completion: left behind, they were freed
        // here, and an allgather of rows of no elements whose peers came later sent whatever lay
        // there as its row count ((22948089398, 0, 2) where (5, 0, 2) was due, now and then)
        all.row_counts.insert(all.row_counts.end(), p.row_counts.begin(), p.row_counts.end());
      }
    }
    const size_t results = all.structure ? all.leaf_shapes.size() : all.handles.size();
    if (problem.empty() && static_cast<int>(results) != num_outputs())
      problem = std::to_string(num_outputs()) + " outputs for " + std::to_string(results) + " results";
    if (!problem.empty()) {
      // a bug of the Python side; the handles found are still completed and released
      job->failed = TNT_ERR_INTERNAL;
      job->error = "TntCollectiveWait: " + problem;
    }
    job->ctx = ctx;
    job->done = std::move(done);
    Completer::Get().Submit(job, block_);
  }

 private:
  bool block_ = false;
};

REGISTER_KERNEL_BUILDER(Name("TntCollectiveStart").Device(DEVICE_CPU), StartOp);
REGISTER_KERNEL_BUILDER(Name("TntCollectiveWait").Device(DEVICE_CPU), WaitOp);

}  // namespace tnt_tf

// Requests submitted by a Start and not yet released: taken by no Wait yet, or orphaned and
// still in flight in the core (tests check that none is left behind).
extern "C" __attribute__((visibility("default"))) int64_t tnt_tfop_unreleased() {
  return tnt_tf::g_unwaited.load() + tnt_tf::g_orphans.load();
}

// Binds the ops to the core that Python loaded from `core_path` (which must
// already be loaded: RTLD_NOLOAD never loads a second copy). 0 on success,
// else -1 with a message in `err`.
extern "C" __attribute__((visibility("default"))) int tnt_tfop_bind(const char *core_path, char *err,
                                                                    size_t errlen) {
  void *lib = dlopen(core_path, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    snprintf(err, errlen, "the core %s is not loaded in this process: %s", core_path, dlerror());
    return -1;
  }
  auto *api = new tnt_tf::CoreApi();
  struct Entry { void **slot; const char *name; } entries[] = {
      {reinterpret_cast<void **>(&api->allreduce_async), "tnt_allreduce_layout_async"},
      {reinterpret_cast<void **>(&api->broadcast_async), "tnt_broadcast_layout_async"},
      {reinterpret_cast<void **>(&api->allgather_async), "tnt_allgather_into_layout_async"},
      {reinterpret_cast<void **>(&api->shape_layout), "tnt_shape_layout"},
      {reinterpret_cast<void **>(&api->empty_rows_layout), "tnt_empty_rows_layout"},
      {reinterpret_cast<void **>(&api->test), "tnt_test"},
      {reinterpret_cast<void **>(&api->wait), "tnt_wait"},
      {reinterpret_cast<void **>(&api->result_count), "tnt_result_count"},
      {reinterpret_cast<void **>(&api->result_copy), "tnt_result_copy"},
      {reinterpret_cast<void **>(&api->release), "tnt_release"},
      {reinterpret_cast<void **>(&api->last_error), "tnt_last_error"},
      {reinterpret_cast<void **>(&api->last_error_rank), "tnt_last_error_rank"},
      {reinterpret_cast<void **>(&api->strerror), "tnt_strerror"},
      {reinterpret_cast<void **>(&api->sequence_counter), "tnt_sequence_counter"},
      {reinterpret_cast<void **>(&api->name_in_flight), "tnt_name_in_flight"},
  };
  for (auto &e : entries) {
    *e.slot = dlsym(lib, e.name);
    if (*e.slot == nullptr) {
      snprintf(err, errlen, "the core %s does not export %s (an older core? reinstall Tarantella)", core_path,
               e.name);
      delete api;
      return -1;
    }
  }
  tnt_tf::g_api.store(api);  // the handle stays open: the core is never unloaded
  return 0;
}
