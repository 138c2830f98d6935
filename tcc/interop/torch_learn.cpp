// What tcc.torch's C++ eager path learns from the Python path (tcc/interop/torch.py): an op's
// signatures (the kernel or the CUDA launches that served an input signature there) and its
// backward, read from Python values into the tables of torch_native.h.

#include <Python.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/Dtype.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "torch_native.h"

namespace tcc_torch {

namespace {

void free_op(PyObject *capsule) {
  delete static_cast<Op *>(PyCapsule_GetPointer(capsule, "tcc.torch_native.Op"));
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

bool read_kernel(PyObject *obj, Kernel1D *kernel) {
  unsigned long long fn;
  if (!PyArg_ParseTuple(obj, "KIII", &fn, &kernel->grid, &kernel->block, &kernel->shared)) {
    return false;
  }
  kernel->fn = reinterpret_cast<void *>(static_cast<uintptr_t>(fn));
  return true;
}

// The index checks of a signature, (address, nslots, [(its slot, the kernel's slot)], count slot):
// 1 read, 0 out of the slots' range (not learned), -1 a Python error set.
int read_guard(PyObject *given, int kernel_slots, Guard *guard) {
  unsigned long long address;
  PyObject *copies;
  if (!PyArg_ParseTuple(given, "KiO!i", &address, &guard->nslots, &PyList_Type, &copies, &guard->result)) {
    return -1;
  }
  if (guard->nslots > kMaxSlots || guard->result < 0 || guard->result >= guard->nslots) {
    return 0;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(copies); ++i) {
    int slot, source;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(copies, i), "ii", &slot, &source)) {
      return -1;
    }
    if (slot < 0 || slot >= guard->nslots || source < 0 || source >= kernel_slots) {
      return 0;
    }
    guard->copies.emplace_back(slot, source);
  }
  guard->kernel = reinterpret_cast<Kernel>(static_cast<uintptr_t>(address));
  return 1;
}

}  // namespace

Op *op_of(PyObject *capsule) {
  return static_cast<Op *>(PyCapsule_GetPointer(capsule, "tcc.torch_native.Op"));
}

PyObject *new_op(PyObject *, PyObject *) {
  return PyCapsule_New(new Op(), "tcc.torch_native.Op", free_op);
}

// learn(op, kernel_address, name, nargs, nslots, inputs, scalars, results[, guard]): a signature, tried first
// from now on. inputs: (position, slot, torch dtype, sizes); scalars: (position, slot, Python
// type, cell code 0-5 as Cell); results: (slot, torch dtype, sizes).
PyObject *learn(PyObject *, PyObject *args) {
  PyObject *capsule, *inputs, *scalars, *results, *guard = Py_None;
  unsigned long long address;
  const char *name;
  Py_ssize_t nargs;
  int nslots;
  if (!PyArg_ParseTuple(args, "OKsniO!O!O!|O", &capsule, &address, &name, &nargs, &nslots, &PyList_Type, &inputs,
                        &PyList_Type, &scalars, &PyList_Type, &results, &guard)) {
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
  if (guard != Py_None) {
    int known = read_guard(guard, nslots, &sig->guard);
    if (known < 0) {
      return nullptr;
    }
    if (known == 0) {
      Py_RETURN_FALSE;  // the Python path keeps such calls
    }
  }
  auto signatures = op->signatures;
  signatures.insert(signatures.begin(), std::move(sig));
  if (signatures.size() > kMaxSignatures) {
    signatures.pop_back();
  }
  op->signatures = std::move(signatures);  // replaced whole: a running call holds its own copy
  Py_RETURN_TRUE;
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

PyObject *forget(PyObject *, PyObject *capsule) {
  Op *op = op_of(capsule);
  if (op == nullptr) {
    return nullptr;
  }
  op->signatures = {};
  op->cuda = {};
  Py_RETURN_NONE;
}

}  // namespace tcc_torch
