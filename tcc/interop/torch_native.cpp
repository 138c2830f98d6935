// The eager path of tcc.torch operators in C++ (built by tcc/interop/torch_native.py with
// torch.utils.cpp_extension against the installed PyTorch).
//
// TorchOp.__call__ hands each call to `call(op, args)`. For a signature that the Python path has
// run before (the same input dtypes and shapes, scalar types, no keyword parameters), it checks
// the tensors, allocates the results with at::empty and calls the tcc kernel's entry point,
// `int32_t kernel(void **args)` (the address tcc's ctypes call uses), or, for CUDA tensors,
// launches the CUDA plan's kernels on PyTorch's current stream. It returns None for every
// call it does not take (another signature, a tensor that is not a plain contiguous one there,
// anything watching torch's dispatcher): the Python path then runs the checked call, which raises
// tcc's errors naming the argument, and teaches this one its signature.
// A call that records a graph (grad mode on, a tensor argument requiring a gradient) is taken too
// once the op has a backward (learn_backward): the kernel runs as for any call, then
// torch_autograd.cpp attaches the graph node, whose backward is the op's Python one.
// From Python, each input's checks alone cost ~450 ns; here they cost a few nanoseconds.

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <Python.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torch_autograd.h"

namespace {

using tcc_torch::Backward;

using Kernel = int32_t (*)(void **);

struct Input {  // a tensor argument
  Py_ssize_t pos;  // in the call's arguments
  int slot;        // in the kernel's argument array
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
};

enum class Cell { f32, f64, i8, i32, i64, boolean, pointer };

struct Scalar {  // a runtime scalar argument: a Python float, int or bool, exactly as first seen
  Py_ssize_t pos;
  int slot;
  PyTypeObject *kind;
  Cell cell;
};

struct Result {
  int slot;
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  int64_t nbytes;
};

struct Signature {
  Kernel kernel;
  std::string name;  // the kernel's, for errors
  Py_ssize_t nargs;
  std::vector<Input> inputs;
  std::vector<Scalar> scalars;
  std::vector<Result> results;
  bool release_gil;  // enough work that other Python threads should run meanwhile
};

constexpr size_t kMaxSignatures = 16;
constexpr int64_t kReleaseGilBytes = 1 << 20;
constexpr int kMaxSlots = 64;

// ---- CUDA: the kernels of tcc's CUDA plan (tcc/runtime/cuda.py), launched with cuLaunchKernel
// (its address from tcc's driver) on PyTorch's current stream of the tensors' device.

using LaunchFn = int (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

struct Kernel1D {  // a CUfunction and its launch shape
  void *fn;
  unsigned grid, block, shared;
};

struct Launch {
  Kernel1D kernel;
  bool has_fallback;  // the kernel assumes 16-byte aligned pointers: else run the fallback
  Kernel1D fallback;
  std::vector<int> values;  // per parameter: its value's index (arguments, then results)
  std::vector<Cell> cells;  // per parameter: how it is passed
};

struct CudaInput {
  Py_ssize_t pos;
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
};

struct CudaSignature {
  std::string name;
  Py_ssize_t nargs;
  int device;
  std::vector<CudaInput> inputs;
  std::vector<std::pair<Py_ssize_t, PyTypeObject *>> scalars;  // (position, Python type)
  std::vector<Result> results;  // slot unused
  std::vector<Launch> launches;
};

struct Op {  // one TorchOp's signatures, most recently learned first, and its backward
  std::vector<std::shared_ptr<const Signature>> signatures;
  std::vector<std::shared_ptr<const CudaSignature>> cuda;
  std::shared_ptr<const Backward> backward;  // null: calls that record a graph are Python's
};

enum class Ran { declined, done, failed };  // failed: a Python exception is set

LaunchFn cu_launch = nullptr;  // cuLaunchKernel, set by setup_cuda()
PyObject *raw_stream = nullptr;  // torch's current raw stream of a device: f(device) -> int

PyObject *on_failure = nullptr;  // tcc's raise_out_of_memory(kernel name), set by setup()

void free_op(PyObject *capsule) {
  delete static_cast<Op *>(PyCapsule_GetPointer(capsule, "tcc.torch_native.Op"));
}

Op *op_of(PyObject *capsule) {
  return static_cast<Op *>(PyCapsule_GetPointer(capsule, "tcc.torch_native.Op"));
}

// Whether anything watches torch's dispatcher, so that a call must go through it: torch-function
// modes, torch-dispatch modes, functorch transforms, the JIT tracer, the profiler (any
// RecordFunction callback). functorch includes its front key in the thread's dispatch keys while
// a transform is active (its own header needs a JSON library that torch does not ship).
bool dispatcher_watched() {
  return at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
         c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         torch::jit::tracer::isTracing() || at::hasCallbacks();
}

// grad_mode: whether a tensor requiring a gradient declines the call (a graph that is not recorded
// here); false when the call records its graph here, or grad mode is off.
bool take_input(PyObject *obj, const Input &in, void **slots, bool grad_mode) {
  if (!THPVariable_CheckExact(obj)) {  // torch.Tensor or nn.Parameter, no subclass
    return false;
  }
  const at::Tensor &t = THPVariable_Unpack(obj);
  if (t.scalar_type() != in.dtype || !t.is_cpu() || t.layout() != at::kStrided || !t.sizes().equals(in.sizes) ||
      !t.is_contiguous() || t.is_neg() || t._is_zerotensor() || (grad_mode && t.requires_grad()) ||
      t._fw_grad(0).defined()) {  // a dual tensor (forward AD): its tangent needs the dispatcher
    return false;
  }
  slots[in.slot] = const_cast<void *>(t.const_data_ptr());
  return true;
}

// The scalar's value in its cell (what the kernel's argument slot points to); false when the
// Python value is not of the signature's type or out of the cell's range.
union CellValue {
  float f32;
  double f64;
  int8_t i8;
  int32_t i32;
  int64_t i64;
  bool boolean;
};

bool take_scalar(PyObject *value, const Scalar &s, CellValue *cell) {
  if (Py_TYPE(value) != s.kind) {
    return false;
  }
  if (s.cell == Cell::f32 || s.cell == Cell::f64) {
    double v = PyFloat_AsDouble(value);  // a float, or an int given where the op takes a float
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    if (s.cell == Cell::f32) {
      cell->f32 = static_cast<float>(v);
    } else {
      cell->f64 = v;
    }
    return true;
  }
  if (s.cell == Cell::boolean) {
    int truth = PyObject_IsTrue(value);
    if (truth < 0) {
      PyErr_Clear();
      return false;
    }
    cell->boolean = truth != 0;
    return true;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  if (s.cell == Cell::i8 && (v < INT8_MIN || v > INT8_MAX)) {
    return false;
  }
  if (s.cell == Cell::i32 && (v < INT32_MIN || v > INT32_MAX)) {
    return false;
  }
  if (s.cell == Cell::i8) {
    cell->i8 = static_cast<int8_t>(v);
  } else if (s.cell == Cell::i32) {
    cell->i32 = static_cast<int32_t>(v);
  } else {
    cell->i64 = static_cast<int64_t>(v);
  }
  return true;
}

// The results as Python: one tensor, or a tuple of them.
PyObject *wrap(std::vector<at::Tensor> &&outs) {
  if (outs.size() == 1) {
    return THPVariable_Wrap(std::move(outs[0]));
  }
  PyObject *tuple = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (tuple == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), THPVariable_Wrap(std::move(outs[i])));
  }
  return tuple;
}

// NULL with tcc's exception set: on_failure(kernel name) raises it.
PyObject *fail(const Signature &sig) {
  PyObject *returned = PyObject_CallFunction(on_failure, "s", sig.name.c_str());
  if (returned != nullptr) {
    Py_DECREF(returned);
    PyErr_Format(PyExc_RuntimeError, "tcc kernel %s failed", sig.name.c_str());
  }
  return nullptr;
}

// The call's results in `outs`, unless this signature does not take the call (declined) or it
// failed (a Python exception set). grad_mode: as take_input's.
Ran run(const Signature &sig, PyObject *const *args, bool grad_mode, std::vector<at::Tensor> *outs) {
  void *slots[kMaxSlots];
  CellValue cells[kMaxSlots];
  for (const Input &in : sig.inputs) {
    if (!take_input(args[in.pos], in, slots, grad_mode)) {
      return Ran::declined;
    }
  }
  for (size_t i = 0; i < sig.scalars.size(); ++i) {
    const Scalar &s = sig.scalars[i];
    if (!take_scalar(args[s.pos], s, &cells[i])) {
      return Ran::declined;
    }
    slots[s.slot] = &cells[i];
  }
  outs->reserve(sig.results.size());
  try {
    for (const Result &r : sig.results) {
      outs->push_back(at::empty(r.sizes, at::TensorOptions().dtype(r.dtype)));
      slots[r.slot] = outs->back().mutable_data_ptr();
    }
  } catch (const std::exception &exc) {
    PyErr_SetString(PyExc_MemoryError, exc.what());
    return Ran::failed;
  }
  int32_t status;
  if (sig.release_gil) {
    PyThreadState *state = PyEval_SaveThread();
    status = sig.kernel(slots);
    PyEval_RestoreThread(state);
  } else {
    status = sig.kernel(slots);
  }
  if (status != 0) {
    fail(sig);
    return Ran::failed;
  }
  return Ran::done;
}

// A scalar argument's value as a kernel parameter of kind ``cell``; false when out of its range.
bool scalar_cell(PyObject *value, Cell cell, CellValue *out) {
  Scalar s{0, 0, Py_TYPE(value), cell};
  return take_scalar(value, s, out);
}

// The call's results on the GPU in `outs`, as run's.
Ran run_cuda(const CudaSignature &sig, PyObject *const *args, bool grad_mode, std::vector<at::Tensor> *outs) {
  std::vector<uint64_t> pointers(sig.nargs + sig.results.size(), 0);
  for (const CudaInput &in : sig.inputs) {
    PyObject *obj = args[in.pos];
    if (!THPVariable_CheckExact(obj)) {
      return Ran::declined;
    }
    const at::Tensor &t = THPVariable_Unpack(obj);
    if (t.scalar_type() != in.dtype || !t.is_cuda() || t.get_device() != sig.device ||
        t.layout() != at::kStrided || !t.sizes().equals(in.sizes) || !t.is_contiguous() || t.is_neg() ||
        t._is_zerotensor() || (grad_mode && t.requires_grad()) || t._fw_grad(0).defined()) {
      return Ran::declined;
    }
    pointers[in.pos] = reinterpret_cast<uint64_t>(t.const_data_ptr());
  }
  for (const auto &[pos, kind] : sig.scalars) {
    if (Py_TYPE(args[pos]) != kind) {
      return Ran::declined;
    }
  }
  // every parameter's value first (a scalar out of range declines before anything is allocated)
  std::vector<std::vector<CellValue>> cells(sig.launches.size());
  for (size_t k = 0; k < sig.launches.size(); ++k) {
    const Launch &launch = sig.launches[k];
    cells[k].resize(launch.cells.size());
    for (size_t i = 0; i < launch.cells.size(); ++i) {
      int v = launch.values[i];
      if (launch.cells[i] != Cell::pointer &&
          (v >= sig.nargs || !scalar_cell(args[v], launch.cells[i], &cells[k][i]))) {
        return Ran::declined;
      }
    }
  }
  PyObject *stream_obj = PyObject_CallFunction(raw_stream, "i", sig.device);
  if (stream_obj == nullptr) {
    return Ran::failed;
  }
  void *stream = PyLong_AsVoidPtr(stream_obj);
  Py_DECREF(stream_obj);
  if (PyErr_Occurred()) {
    return Ran::failed;
  }
  outs->reserve(sig.results.size());
  try {
    auto options = at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(sig.device)));
    for (size_t r = 0; r < sig.results.size(); ++r) {
      outs->push_back(at::empty(sig.results[r].sizes, options.dtype(sig.results[r].dtype)));
      pointers[sig.nargs + r] = reinterpret_cast<uint64_t>(outs->back().mutable_data_ptr());
    }
  } catch (const std::exception &exc) {
    PyErr_SetString(PyExc_MemoryError, exc.what());
    return Ran::failed;
  }
  for (size_t k = 0; k < sig.launches.size(); ++k) {
    const Launch &launch = sig.launches[k];
    std::vector<void *> params(launch.cells.size());
    bool aligned = true;
    for (size_t i = 0; i < launch.cells.size(); ++i) {
      if (launch.cells[i] == Cell::pointer) {
        uint64_t p = pointers[launch.values[i]];
        aligned = aligned && p % 16 == 0;
        cells[k][i].i64 = static_cast<int64_t>(p);
      }
      params[i] = &cells[k][i];
    }
    const Kernel1D &kernel = launch.has_fallback && !aligned ? launch.fallback : launch.kernel;
    int err = cu_launch(kernel.fn, kernel.grid, 1, 1, kernel.block, 1, 1, kernel.shared, stream, params.data(),
                        nullptr);
    if (err != 0) {
      if (k == 0) {  // nothing queued yet: the Python path makes the context current, or says why
        outs->clear();
        return Ran::declined;
      }
      PyErr_Format(PyExc_RuntimeError, "op %s: launching its kernel %zu failed (CUresult %d)", sig.name.c_str(),
                   k, err);
      return Ran::failed;
    }
  }
  return Ran::done;
}

// The results of a call that ran as Python: with their graph when `backward` is not null.
PyObject *finish(const std::shared_ptr<const Backward> &backward, PyObject *const *args,
                 std::vector<at::Tensor> &&outs) {
  HANDLE_TH_ERRORS
  if (backward != nullptr) {
    tcc_torch::record(backward, args, outs);
  }
  return wrap(std::move(outs));
  END_HANDLE_TH_ERRORS
}

// call(op, args): the results, or None for the Python path.
PyObject *call(PyObject *, PyObject *const *argv, Py_ssize_t argc) {
  if (argc != 2 || !PyTuple_CheckExact(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "call(op, args: tuple)");
    return nullptr;
  }
  Op *op = op_of(argv[0]);
  if (op == nullptr) {
    return nullptr;
  }
  if ((op->signatures.empty() && op->cuda.empty()) || dispatcher_watched()) {
    Py_RETURN_NONE;
  }
  PyObject *tuple = argv[1];
  Py_ssize_t nargs = PyTuple_GET_SIZE(tuple);
  PyObject *const *args = &PyTuple_GET_ITEM(tuple, 0);
  auto backward = op->backward;  // copies (shared): learn() may replace them while a kernel runs unlocked
  bool graph = false;
  if (backward != nullptr) {
    bool takes;
    graph = tcc_torch::records_graph(*backward, args, nargs, &takes);
    if (!takes) {
      Py_RETURN_NONE;
    }
    if (!graph) {
      backward = nullptr;
    }
  }
  bool grad_mode = !graph && at::GradMode::is_enabled();  // a tensor requiring a gradient declines
  std::vector<at::Tensor> outs;
  auto signatures = op->signatures;
  for (const auto &sig : signatures) {
    if (sig->nargs != nargs) {
      continue;
    }
    Ran ran = run(*sig, args, grad_mode, &outs);
    if (ran != Ran::declined) {
      return ran == Ran::failed ? nullptr : finish(backward, args, std::move(outs));
    }
  }
  if (cu_launch == nullptr) {
    Py_RETURN_NONE;
  }
  auto cuda = op->cuda;
  for (const auto &sig : cuda) {
    if (sig->nargs != nargs) {
      continue;
    }
    Ran ran = run_cuda(*sig, args, grad_mode, &outs);
    if (ran != Ran::declined) {
      return ran == Ran::failed ? nullptr : finish(backward, args, std::move(outs));
    }
  }
  Py_RETURN_NONE;
}

PyObject *new_op(PyObject *, PyObject *) {
  return PyCapsule_New(new Op(), "tcc.torch_native.Op", free_op);
}

bool read_sizes(PyObject *seq, std::vector<int64_t> *sizes, int64_t *count) {
  PyObject *fast = PySequence_Fast(seq, "sizes must be a sequence");
  if (fast == nullptr) {
    return false;
  }
  *count = 1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    sizes->push_back(d);
    *count *= d;
  }
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

bool read_dtype(PyObject *obj, at::ScalarType *dtype) {
  if (!THPDtype_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "expected a torch.dtype");
    return false;
  }
  *dtype = reinterpret_cast<THPDtype *>(obj)->scalar_type;
  return true;
}

// learn(op, kernel_address, name, nargs, nslots, inputs, scalars, results): a signature, tried first
// from now on. inputs: (position, slot, torch dtype, sizes); scalars: (position, slot, Python
// type, cell code 0-5 as Cell); results: (slot, torch dtype, sizes).
PyObject *learn(PyObject *, PyObject *args) {
  PyObject *capsule, *inputs, *scalars, *results;
  unsigned long long address;
  const char *name;
  Py_ssize_t nargs;
  int nslots;
  if (!PyArg_ParseTuple(args, "OKsniO!O!O!", &capsule, &address, &name, &nargs, &nslots, &PyList_Type, &inputs,
                        &PyList_Type, &scalars, &PyList_Type, &results)) {
    return nullptr;
  }
  Op *op = op_of(capsule);
  if (op == nullptr) {
    return nullptr;
  }
  if (nslots > kMaxSlots || PyList_GET_SIZE(scalars) > kMaxSlots) {
    Py_RETURN_FALSE;  // the Python path keeps such calls
  }
  auto sig = std::make_shared<Signature>();
  sig->kernel = reinterpret_cast<Kernel>(static_cast<uintptr_t>(address));
  sig->name = name;
  sig->nargs = nargs;
  int64_t bytes = 0;
  auto fits = [&](Py_ssize_t pos, int slot) { return 0 <= pos && pos < nargs && 0 <= slot && slot < nslots; };
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(inputs); ++i) {
    Input in;
    PyObject *dtype, *sizes;
    int64_t count;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(inputs, i), "niOO", &in.pos, &in.slot, &dtype, &sizes) ||
        !read_dtype(dtype, &in.dtype) || !read_sizes(sizes, &in.sizes, &count)) {
      return nullptr;
    }
    if (!fits(in.pos, in.slot)) {
      Py_RETURN_FALSE;
    }
    bytes += count * static_cast<int64_t>(c10::elementSize(in.dtype));
    sig->inputs.push_back(std::move(in));
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(scalars); ++i) {
    Scalar s;
    PyObject *kind;
    int cell;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(scalars, i), "niO!i", &s.pos, &s.slot, &PyType_Type, &kind, &cell)) {
      return nullptr;
    }
    if (!fits(s.pos, s.slot) || cell < 0 || cell >= static_cast<int>(Cell::pointer)) {
      Py_RETURN_FALSE;
    }
    s.kind = reinterpret_cast<PyTypeObject *>(kind);
    s.cell = static_cast<Cell>(cell);
    sig->scalars.push_back(s);
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(results); ++i) {
    Result r;
    PyObject *dtype, *sizes;
    int64_t count;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(results, i), "iOO", &r.slot, &dtype, &sizes) ||
        !read_dtype(dtype, &r.dtype) || !read_sizes(sizes, &r.sizes, &count)) {
      return nullptr;
    }
    if (!fits(0, r.slot)) {
      Py_RETURN_FALSE;
    }
    r.nbytes = count * static_cast<int64_t>(c10::elementSize(r.dtype));
    bytes += r.nbytes;
    sig->results.push_back(std::move(r));
  }
  sig->release_gil = bytes >= kReleaseGilBytes;
  auto signatures = op->signatures;
  signatures.insert(signatures.begin(), std::move(sig));
  if (signatures.size() > kMaxSignatures) {
    signatures.pop_back();
  }
  op->signatures = std::move(signatures);  // replaced whole: a running call holds its own copy
  Py_RETURN_TRUE;
}

bool read_kernel(PyObject *obj, Kernel1D *kernel) {
  unsigned long long fn;
  if (!PyArg_ParseTuple(obj, "KIII", &fn, &kernel->grid, &kernel->block, &kernel->shared)) {
    return false;
  }
  kernel->fn = reinterpret_cast<void *>(static_cast<uintptr_t>(fn));
  return true;
}

// learn_cuda(op, name, nargs, device, inputs, scalars, results, launches): a CUDA signature.
// inputs: (position, torch dtype, sizes); scalars: (position, Python type); results: (torch
// dtype, sizes); launches: ((fn, grid, block, shared), fallback or None, [(value index, cell)]).
PyObject *learn_cuda(PyObject *, PyObject *args) {
  PyObject *capsule, *inputs, *scalars, *results, *launches;
  const char *name;
  Py_ssize_t nargs;
  int device;
  if (!PyArg_ParseTuple(args, "OsniO!O!O!O!", &capsule, &name, &nargs, &device, &PyList_Type, &inputs,
                        &PyList_Type, &scalars, &PyList_Type, &results, &PyList_Type, &launches)) {
    return nullptr;
  }
  Op *op = op_of(capsule);
  if (op == nullptr) {
    return nullptr;
  }
  auto sig = std::make_shared<CudaSignature>();
  sig->name = name;
  sig->nargs = nargs;
  sig->device = device;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(inputs); ++i) {
    CudaInput in;
    PyObject *dtype, *sizes;
    int64_t count;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(inputs, i), "nOO", &in.pos, &dtype, &sizes) ||
        !read_dtype(dtype, &in.dtype) || !read_sizes(sizes, &in.sizes, &count)) {
      return nullptr;
    }
    sig->inputs.push_back(std::move(in));
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(scalars); ++i) {
    Py_ssize_t pos;
    PyObject *kind;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(scalars, i), "nO!", &pos, &PyType_Type, &kind)) {
      return nullptr;
    }
    sig->scalars.emplace_back(pos, reinterpret_cast<PyTypeObject *>(kind));
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(results); ++i) {
    Result r{0, at::ScalarType::Float, {}, 0};
    PyObject *dtype, *sizes;
    int64_t count;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(results, i), "OO", &dtype, &sizes) || !read_dtype(dtype, &r.dtype) ||
        !read_sizes(sizes, &r.sizes, &count)) {
      return nullptr;
    }
    sig->results.push_back(std::move(r));
  }
  Py_ssize_t nvalues = nargs + static_cast<Py_ssize_t>(sig->results.size());
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(launches); ++i) {
    Launch launch{};
    PyObject *kernel, *fallback, *params;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(launches, i), "OOO!", &kernel, &fallback, &PyList_Type, &params) ||
        !read_kernel(kernel, &launch.kernel)) {
      return nullptr;
    }
    launch.has_fallback = fallback != Py_None;
    if (launch.has_fallback && !read_kernel(fallback, &launch.fallback)) {
      return nullptr;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(params); ++j) {
      int value, cell;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(params, j), "ii", &value, &cell)) {
        return nullptr;
      }
      if (value < 0 || value >= nvalues || cell < 0 || cell > static_cast<int>(Cell::pointer)) {
        Py_RETURN_FALSE;
      }
      launch.values.push_back(value);
      launch.cells.push_back(static_cast<Cell>(cell));
    }
    sig->launches.push_back(std::move(launch));
  }
  auto cuda = op->cuda;
  cuda.insert(cuda.begin(), std::move(sig));
  if (cuda.size() > kMaxSignatures) {
    cuda.pop_back();
  }
  op->cuda = std::move(cuda);
  Py_RETURN_TRUE;
}

// setup_cuda(cuLaunchKernel's address, raw_stream): enables the CUDA signatures.
PyObject *setup_cuda(PyObject *, PyObject *args) {
  unsigned long long address;
  PyObject *stream;
  if (!PyArg_ParseTuple(args, "KO", &address, &stream)) {
    return nullptr;
  }
  Py_XSETREF(raw_stream, Py_NewRef(stream));
  cu_launch = reinterpret_cast<LaunchFn>(static_cast<uintptr_t>(address));
  Py_RETURN_NONE;
}

// learn_backward(op, fn, name, nargs, tensor positions): from now on a call that records a graph
// is taken too, its node's backward fn(args, upstream, needs) (TorchOp._native_backward).
PyObject *learn_backward(PyObject *, PyObject *args) {
  PyObject *capsule, *fn, *positions;
  const char *name;
  Py_ssize_t nargs;
  if (!PyArg_ParseTuple(args, "OOsnO!", &capsule, &fn, &name, &nargs, &PyList_Type, &positions)) {
    return nullptr;
  }
  Op *op = op_of(capsule);
  if (op == nullptr) {
    return nullptr;
  }
  std::vector<Py_ssize_t> tensors;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(positions); ++i) {
    Py_ssize_t pos = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
    if (pos == -1 && PyErr_Occurred()) {
      return nullptr;
    }
    if (pos < 0 || pos >= nargs || (!tensors.empty() && pos <= tensors.back())) {
      PyErr_SetString(PyExc_ValueError, "tensor positions: increasing, below nargs");
      return nullptr;
    }
    tensors.push_back(pos);
  }
  op->backward = std::make_shared<const Backward>(fn, name, nargs, std::move(tensors));
  Py_RETURN_NONE;
}

PyObject *recorded(PyObject *, PyObject *) {
  return PyLong_FromLongLong(tcc_torch::recorded);
}

PyObject *forget(PyObject *, PyObject *capsule) {
  Op *op = op_of(capsule);
  if (op == nullptr) {
    return nullptr;
  }
  op->signatures = {};
  op->cuda = {};
  Py_RETURN_NONE;
}

// setup(on_failure): called with the kernel's name when a kernel reports failure; it raises.
PyObject *setup(PyObject *, PyObject *fn) {
  Py_XSETREF(on_failure, Py_NewRef(fn));
  Py_RETURN_NONE;
}

PyObject *watched(PyObject *, PyObject *) {
  return PyBool_FromLong(dispatcher_watched());
}

PyMethodDef methods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL,
     "call(op, args): the results, or None for the Python path"},
    {"new_op", new_op, METH_NOARGS, "a new op's signature table"},
    {"learn", learn, METH_VARARGS, "learn(op, address, name, nargs, nslots, inputs, scalars, results)"},
    {"learn_cuda", learn_cuda, METH_VARARGS, "learn_cuda(op, name, nargs, device, inputs, scalars, results, launches)"},
    {"setup_cuda", setup_cuda, METH_VARARGS, "setup_cuda(cuLaunchKernel address, raw_stream)"},
    {"learn_backward", learn_backward, METH_VARARGS, "learn_backward(op, fn, name, nargs, tensor positions)"},
    {"recorded", recorded, METH_NOARGS, "how many calls recorded their graph in C++"},
    {"forget", forget, METH_O, "forget(op): drop its signatures"},
    {"setup", setup, METH_O, "setup(on_failure)"},
    {"watched", watched, METH_NOARGS, "whether anything watches torch's dispatcher"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "tcc_torch_native", nullptr, -1, methods};

}  // namespace

#define TCC_CONCAT(a, b) a##b
#define TCC_INIT(name) TCC_CONCAT(PyInit_, name)

PyMODINIT_FUNC TCC_INIT(TORCH_EXTENSION_NAME)(void) {
  return PyModule_Create(&module);
}
