// The tables that tcc.torch's C++ eager path keeps per op: torch_learn.cpp fills them from what
// the Python path learned (tcc/interop/torch.py), torch_native.cpp serves calls with them.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torch_autograd.h"

namespace tcc_torch {

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

struct Guard {  // the op's index checks (tcc/runtime/cpu_guard.py): a kernel counting indices out of range
  Kernel kernel = nullptr;  // none: the op reads no index from data
  int nslots = 0;
  std::vector<std::pair<int, int>> copies;  // (its slot, the op's kernel's slot): the tensors and scalars read
  int result = 0;  // its slot of the count
};

struct Signature {
  Kernel kernel;
  std::string name;  // the kernel's, for errors
  Py_ssize_t nargs;
  std::vector<Input> inputs;
  std::vector<Scalar> scalars;
  std::vector<Result> results;
  bool release_gil;  // enough work that other Python threads should run meanwhile
  Guard guard;
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

Op *op_of(PyObject *capsule);  // NULL with a Python exception set: not an op

// The module functions that fill the tables (torch_learn.cpp; their docs there).
PyObject *new_op(PyObject *, PyObject *);
PyObject *learn(PyObject *, PyObject *args);
PyObject *learn_cuda(PyObject *, PyObject *args);
PyObject *learn_backward(PyObject *, PyObject *args);
PyObject *forget(PyObject *, PyObject *capsule);

}  // namespace tcc_torch
