// The eager path of tcc.torch operators in C++ (built by tcc/interop/torch_native.py with
// torch.utils.cpp_extension against the installed PyTorch).
//
// TorchOp.__call__ hands each call to `call(op, args)`. For a signature that the Python path has
// run before (the same input dtypes and shapes, scalar types, no keyword parameters), it checks
// the tensors, allocates the results with at::empty and calls the tcc kernel's entry point,
// `int32_t kernel(void **args)` (the address tcc's ctypes call uses), or, for CUDA tensors,
// launches the CUDA plan's kernels on PyTorch's current stream. A CPU signature whose op reads
// indices from data first calls its guard kernel (tcc/runtime/cpu_guard.py), and declines the call
// when an index is out of range. It returns None for every
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
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torch_native.h"

namespace {

using namespace tcc_torch;  // NOLINT(google-build-using-namespace): the tables, in this file's terms

enum class Ran { declined, done, failed };  // failed: a Python exception is set

LaunchFn cu_launch = nullptr;  // cuLaunchKernel, set by setup_cuda()
PyObject *raw_stream = nullptr;  // torch's current raw stream of a device: f(device) -> int

PyObject *on_failure = nullptr;  // tcc's raise_out_of_memory(kernel name), set by setup()

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

// Whether the guard counts no index out of range, given the op's kernel's slots (inputs and
// scalar cells set).
bool in_range(const Guard &guard, void *const *slots) {
  void *mine[kMaxSlots];
  int64_t count = -1;
  for (const auto &[slot, source] : guard.copies) {
    mine[slot] = slots[source];
  }
  mine[guard.result] = &count;
  return guard.kernel(mine) == 0 && count == 0;
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
  if (sig.guard.kernel != nullptr && !in_range(sig.guard, slots)) {
    return Ran::declined;  // an index out of range: the Python path raises tcc's error naming it
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

PyObject *recorded(PyObject *, PyObject *) {
  return PyLong_FromLongLong(graphs_recorded);
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
    {"learn", learn, METH_VARARGS, "learn(op, address, name, nargs, nslots, inputs, scalars, results[, guard])"},
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
