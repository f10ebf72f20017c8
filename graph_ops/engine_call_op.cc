// sok1x's TensorFlow kernel (DESIGN D1): the op Sok1xEngineCall, on CPU and GPU, hands sok1x's
// engine TensorFlow's own input buffers and, on GPU, the op's CUDA stream, through ONE callback
// into Python, and makes the engine's results the op's outputs. Glue only: addresses, shapes,
// dtypes, the stream, allocation. What the engine does with them lives in
// sok1x/engine/kernel_calls.py, which also reads and writes the records below.
//
// Built against the installed TensorFlow with its own flags (graph_ops/op_library.py):
//   g++ -shared -fPIC engine_call_op.cc $(TF compile flags) $(TF link flags)
// SOK1X_WITH_GPU_STREAM=1 (TensorFlow's stream_executor headers found) adds the GPU stream.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#if defined(SOK1X_WITH_GPU_STREAM)
#if __has_include("tensorflow/stream_executor/stream.h")
#include "tensorflow/stream_executor/stream.h"  // TensorFlow 1.15 to 2.5
#include "tensorflow/stream_executor/stream_executor_internal.h"
#else
#include "xla/stream_executor/stream.h"  // later TensorFlows
#include "xla/stream_executor/stream_executor_internal.h"
#endif
#endif

namespace sok1x {
namespace {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr int kAbiVersion = 1;
constexpr int kMaxDims = 8;

// One tensor, as Python reads and writes it (struct "=QQqqq8q", 104 bytes).
struct TensorRecord {
  uint64_t data;  // the first element's address (0 when empty)
  uint64_t keep;  // outputs: Python's lending number (0: written by sok1x_allocate_output)
  int64_t code;   // DLPack's type code: 0 int, 1 uint, 2 float, 6 bool
  int64_t bits;
  int64_t ndim;
  int64_t dims[kMaxDims];
};

// One call of the op (struct "=qqQQqQqQqQq", 88 bytes).
struct CallRecord {
  int64_t function;    // the Python function's number (the op's attr)
  int64_t on_gpu;      // 1 in the GPU kernel
  uint64_t stream;     // the op's CUstream on GPU, else 0
  uint64_t context;    // the OpKernelContext, for sok1x_retain_input
  int64_t num_inputs;  // device inputs, then host inputs
  uint64_t inputs;     // TensorRecord[num_inputs]
  int64_t num_outputs;  // device outputs, then host outputs
  uint64_t outputs;    // TensorRecord[num_outputs], written by Python
  int64_t error_code;  // a tensorflow::error::Code, written by Python on failure
  uint64_t error;      // char[error_capacity]: the message, written by Python
  int64_t error_capacity;
};

typedef int64_t (*CallFunction)(CallRecord*);
typedef void (*ReleaseFunction)(uint64_t keep);

std::atomic<CallFunction> g_call{nullptr};
std::atomic<ReleaseFunction> g_release{nullptr};

// An output's memory lent by the engine: TensorFlow reads it in place and, when it drops the
// last reference, the engine gets it back (never after sok1x_set_callbacks(null, null), which
// Python calls at exit: then it is left to the process's end).
class LentBuffer : public tensorflow::TensorBuffer {
 public:
  LentBuffer(void* data, size_t size, uint64_t keep)
      : tensorflow::TensorBuffer(data), size_(size), keep_(keep) {}
  ~LentBuffer() override {
    ReleaseFunction release = g_release.load();
    if (release != nullptr) release(keep_);
  }
  size_t size() const override { return size_; }
  tensorflow::TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("sok1x");
  }
  bool OwnsMemory() const override { return false; }

 private:
  size_t size_;
  uint64_t keep_;
};

bool CodeOf(DataType type, int64_t* code, int64_t* bits) {
  switch (type) {
    case tensorflow::DT_FLOAT: *code = 2; *bits = 32; return true;
    case tensorflow::DT_DOUBLE: *code = 2; *bits = 64; return true;
    case tensorflow::DT_HALF: *code = 2; *bits = 16; return true;
    case tensorflow::DT_INT8: *code = 0; *bits = 8; return true;
    case tensorflow::DT_INT16: *code = 0; *bits = 16; return true;
    case tensorflow::DT_INT32: *code = 0; *bits = 32; return true;
    case tensorflow::DT_INT64: *code = 0; *bits = 64; return true;
    case tensorflow::DT_UINT8: *code = 1; *bits = 8; return true;
    case tensorflow::DT_UINT16: *code = 1; *bits = 16; return true;
    case tensorflow::DT_UINT32: *code = 1; *bits = 32; return true;
    case tensorflow::DT_UINT64: *code = 1; *bits = 64; return true;
    case tensorflow::DT_BOOL: *code = 6; *bits = 8; return true;
    default: return false;
  }
}

// The engine's error as TensorFlow's (Python maps exceptions to codes as py_func does).
Status ErrorOf(int64_t code, const char* message) {
  switch (code) {
    case 3: return tensorflow::errors::InvalidArgument(message);
    case 8: return tensorflow::errors::ResourceExhausted(message);
    case 9: return tensorflow::errors::FailedPrecondition(message);
    case 11: return tensorflow::errors::OutOfRange(message);
    case 12: return tensorflow::errors::Unimplemented(message);
    case 13: return tensorflow::errors::Internal(message);
    default: return tensorflow::errors::Unknown(message);
  }
}

void* StreamOf(OpKernelContext* ctx) {
#if defined(SOK1X_WITH_GPU_STREAM)
  auto* device_context = ctx->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) return nullptr;
  void** member = device_context->stream()->implementation()->GpuStreamMemberHack();
  return member == nullptr ? nullptr : *member;
#else
  return nullptr;
#endif
}

class EngineCallOp : public OpKernel {
 public:
  explicit EngineCallOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("function", &function_));
    on_gpu_ = ctx->device_type() == tensorflow::DeviceType(tensorflow::DEVICE_GPU);
  }

  void Compute(OpKernelContext* ctx) override {
    CallFunction call = g_call.load();
    OP_REQUIRES(ctx, call != nullptr,
                tensorflow::errors::FailedPrecondition(
                    "sok1x's engine is not attached to its TensorFlow kernels (the op library "
                    "was loaded without sok1x, or Python is exiting)"));
    const int num_inputs = ctx->num_inputs();
    const int num_outputs = ctx->num_outputs();
    std::vector<TensorRecord> inputs(num_inputs);
    for (int i = 0; i < num_inputs; ++i) {
      const Tensor& tensor = ctx->input(i);
      TensorRecord& record = inputs[i];
      std::memset(&record, 0, sizeof(record));
      OP_REQUIRES(ctx, CodeOf(tensor.dtype(), &record.code, &record.bits),
                  tensorflow::errors::InvalidArgument(
                      "sok1x's op ", name(), " got input ", i, " of type ",
                      tensorflow::DataTypeString(tensor.dtype()), ", which it does not take"));
      OP_REQUIRES(ctx, tensor.dims() <= kMaxDims,
                  tensorflow::errors::InvalidArgument("sok1x's op ", name(), ": input ", i,
                                                      " has more than ", kMaxDims, " dims"));
      record.ndim = tensor.dims();
      for (int d = 0; d < tensor.dims(); ++d) record.dims[d] = tensor.dim_size(d);
      if (tensor.NumElements() > 0) {
        record.data = reinterpret_cast<uint64_t>(tensor.tensor_data().data());
      }
    }
    std::vector<TensorRecord> outputs(num_outputs);
    std::memset(outputs.data(), 0, sizeof(TensorRecord) * num_outputs);
    std::string message(4096, '\0');
    CallRecord record;
    record.function = function_;
    record.on_gpu = on_gpu_ ? 1 : 0;
    record.stream = reinterpret_cast<uint64_t>(on_gpu_ ? StreamOf(ctx) : nullptr);
    record.context = reinterpret_cast<uint64_t>(ctx);
    record.num_inputs = num_inputs;
    record.inputs = reinterpret_cast<uint64_t>(inputs.data());
    record.num_outputs = num_outputs;
    record.outputs = reinterpret_cast<uint64_t>(outputs.data());
    record.error_code = 0;
    record.error = reinterpret_cast<uint64_t>(&message[0]);
    record.error_capacity = static_cast<int64_t>(message.size());
    if (call(&record) != 0) {
      ReleaseLent(outputs, 0);
      ctx->SetStatus(ErrorOf(record.error_code, message.c_str()));
      return;
    }
    for (int i = 0; i < num_outputs; ++i) {
      Status status = SetOutput(ctx, i, outputs[i]);
      if (!status.ok()) {
        ReleaseLent(outputs, i + 1);
        ctx->SetStatus(status);
        return;
      }
    }
  }

 private:
  Status SetOutput(OpKernelContext* ctx, int index, const TensorRecord& record) {
    const DataType type = ctx->expected_output_dtype(index);
    int64_t code = -1, bits = -1;
    if (!CodeOf(type, &code, &bits) || code != record.code || bits != record.bits) {
      if (record.keep != 0) ReleaseOne(record.keep);
      return tensorflow::errors::Internal("sok1x's op ", name(), ": output ", index,
                                          " came back of another type than ",
                                          tensorflow::DataTypeString(type));
    }
    TensorShape shape;
    for (int d = 0; d < record.ndim && d < kMaxDims; ++d) shape.AddDim(record.dims[d]);
    const size_t nbytes = static_cast<size_t>(shape.num_elements()) * (bits / 8);
    if (record.keep != 0) {
      // The engine's memory becomes the output; its alignment is the engine's promise.
      LentBuffer* buffer = new LentBuffer(reinterpret_cast<void*>(record.data), nbytes,
                                          record.keep);
      Tensor tensor(type, shape, buffer);
      // TensorFlow 2.x's constructor takes a reference of its own, 1.15's takes ours.
      if (!buffer->RefCountIsOne()) buffer->Unref();
      ctx->set_output(index, tensor);
      return Status();
    }
    // Host bytes Python already copied into an output it had TensorFlow allocate.
    if (ctx->mutable_output(index) == nullptr) {
      return tensorflow::errors::Internal("sok1x's op ", name(), ": output ", index,
                                          " was neither lent nor written");
    }
    return Status();
  }

  static void ReleaseOne(uint64_t keep) {
    ReleaseFunction release = g_release.load();
    if (release != nullptr) release(keep);
  }

  static void ReleaseLent(const std::vector<TensorRecord>& outputs, size_t from) {
    for (size_t i = from; i < outputs.size(); ++i) {
      if (outputs[i].keep != 0) ReleaseOne(outputs[i].keep);
    }
  }

  tensorflow::int64 function_ = 0;
  bool on_gpu_ = false;
};

}  // namespace
}  // namespace sok1x

REGISTER_OP("Sok1xEngineCall")
    .Input("device_inputs: Tin")
    .Input("host_inputs: Thost")
    .Output("device_outputs: Tout")
    .Output("host_outputs: Thost_out")
    .Attr("Tin: list(type) >= 0")
    .Attr("Thost: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("Thost_out: list(type) >= 0")
    .Attr("function: int")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnknownShape)
    .Doc("A call into sok1x's engine: sok1x/engine/kernel_calls.py runs `function`.");

REGISTER_KERNEL_BUILDER(Name("Sok1xEngineCall").Device(tensorflow::DEVICE_CPU),
                        sok1x::EngineCallOp);
REGISTER_KERNEL_BUILDER(Name("Sok1xEngineCall")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("host_inputs")
                            .HostMemory("host_outputs"),
                        sok1x::EngineCallOp);

extern "C" {

int sok1x_abi_version() { return sok1x::kAbiVersion; }

int sok1x_has_gpu_stream() {
#if defined(SOK1X_WITH_GPU_STREAM)
  return 1;
#else
  return 0;
#endif
}

// Python's two functions (both null: detached, as at exit).
void sok1x_set_callbacks(sok1x::CallFunction call, sok1x::ReleaseFunction release) {
  sok1x::g_call.store(call);
  sok1x::g_release.store(release);
}

// Allocates output `index` of the call in progress ([ndim] dims; host memory where the output is
// a host one, or on a CPU) for Python to write into before it returns; returns its address
// (null for no elements, or on failure: *failed = 1).
void* sok1x_allocate_output(sok1x::CallRecord* call, int64_t index, int64_t ndim,
                            const int64_t* dims, int64_t* failed) {
  auto* ctx = reinterpret_cast<tensorflow::OpKernelContext*>(call->context);
  *failed = 1;
  if (index < 0 || index >= ctx->num_outputs() || ndim < 0 || ndim > sok1x::kMaxDims) {
    return nullptr;
  }
  tensorflow::TensorShape shape;
  for (int64_t d = 0; d < ndim; ++d) shape.AddDim(dims[d]);
  tensorflow::Tensor* tensor = nullptr;
  if (!ctx->allocate_output(static_cast<int>(index), shape, &tensor).ok()) return nullptr;
  *failed = 0;
  return tensor->NumElements() ? const_cast<char*>(tensor->tensor_data().data()) : nullptr;
}

// A reference to input `index` of the call in progress, for an engine that keeps a view of it
// past the call; sok1x_release_input drops it.
void* sok1x_retain_input(sok1x::CallRecord* call, int64_t index) {
  auto* ctx = reinterpret_cast<tensorflow::OpKernelContext*>(call->context);
  if (index < 0 || index >= ctx->num_inputs()) return nullptr;
  return new tensorflow::Tensor(ctx->input(static_cast<int>(index)));
}

void sok1x_release_input(void* handle) { delete reinterpret_cast<tensorflow::Tensor*>(handle); }

}  // extern "C"
