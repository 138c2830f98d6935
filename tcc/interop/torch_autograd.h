// The graph that an eager tcc.torch call records when it is served in C++ (torch_autograd.cpp),
// shared with the call itself (torch_native.cpp): both are compiled into one extension.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

namespace tcc_torch {

// What an op's graph nodes need to run its backward: the Python function that computes the
// gradients (TorchOp._native_backward(args, upstream, needs) -> one gradient or None per
// parameter) and which of the op's parameters are tensors (the others are runtime scalars).
struct Backward {
  PyObject *fn;  // a strong reference, released under the GIL
  std::string name;  // the nodes' name (grad_fn.name())
  Py_ssize_t nargs;
  std::vector<Py_ssize_t> tensors;  // positions of the tensor parameters: the node's next edges
  std::vector<Py_ssize_t> scalars;  // positions of the runtime scalars
  Backward(PyObject *fn, std::string name, Py_ssize_t nargs, std::vector<Py_ssize_t> tensors);
  Backward(const Backward &) = delete;
  Backward &operator=(const Backward &) = delete;
  ~Backward();
};

// Whether a call of an op with this backward records a graph: grad mode is on and a tensor
// argument requires a gradient. `takes` is false when the call's arguments are not plain tensors
// where the op has tensor parameters (the Python path then raises its error, or dispatches a
// subclass).
bool records_graph(const Backward &backward, PyObject *const *args, Py_ssize_t nargs, bool *takes);

// Attach the graph to the results of a call that ran its kernel: one node whose next edges are
// the tensor arguments' and whose inputs are the results (integer ones not differentiable). The
// node saves the tensor arguments (as autograd.Function.save_for_backward does) and the scalars.
// Throws what torch throws (saved-tensor hooks run here).
void record(const std::shared_ptr<const Backward> &backward, PyObject *const *args,
            std::vector<at::Tensor> &outs);

// How many calls recorded their graph here (for tests: which path ran).
extern long long graphs_recorded;

}  // namespace tcc_torch
