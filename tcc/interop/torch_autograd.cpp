// The graph of an eager tcc.torch call served in C++ (see torch_autograd.h): what
// torch.autograd.Function.apply records for TorchOp's Python path (_Graph), built here, without
// the Python Function's own cost (its context object, its argument and output processing: most
// of a call that records a graph). The backward stays Python's: the node calls the op's
// TorchOp._native_backward, which runs the derived gradient ops, themselves tcc.torch ops, so
// that with create_graph=True their calls record the graph of the double backward.

#include "torch_autograd.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <mutex>
#include <utility>

namespace tcc_torch {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::Variable;
using torch::autograd::variable_list;

long long graphs_recorded = 0;

Backward::Backward(PyObject *fn, std::string name, Py_ssize_t nargs, std::vector<Py_ssize_t> tensors)
    : fn(Py_NewRef(fn)), name(std::move(name)), nargs(nargs), tensors(std::move(tensors)) {
  for (Py_ssize_t pos = 0, k = 0; pos < nargs; ++pos) {
    if (k < static_cast<Py_ssize_t>(this->tensors.size()) && this->tensors[k] == pos) {
      ++k;
    } else {
      scalars.push_back(pos);
    }
  }
}

Backward::~Backward() {
  if (Py_IsInitialized()) {  // the last node may go on an autograd thread, without the GIL
    pybind11::gil_scoped_acquire gil;
    Py_DECREF(fn);
  }
}

namespace {

// A call's backward: the saved arguments, and the op's Python function that computes the
// gradients from them and the upstream gradients.
class TccBackward : public Node {
 public:
  TccBackward(std::shared_ptr<const Backward> backward, PyObject *const *args) : backward_(std::move(backward)) {
    saved_.reserve(backward_->tensors.size());
    for (Py_ssize_t pos : backward_->scalars) {
      scalars_.push_back(Py_NewRef(args[pos]));
    }
  }

  ~TccBackward() override {
    if (!scalars_.empty() && Py_IsInitialized()) {
      pybind11::gil_scoped_acquire gil;
      for (PyObject *s : scalars_) {
        Py_DECREF(s);
      }
    }
  }

  std::string name() const override {
    return backward_->name;
  }

  // After a backward without retain_graph: the saved tensors go (a second backward then raises
  // torch's "backward through the graph a second time" from SavedVariable::unpack).
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable &s : saved_) {
      s.reset_data();
    }
  }

  variable_list apply(variable_list &&grads) override;

  std::vector<SavedVariable> saved_;  // per tensor parameter

 private:
  THPObjectPtr arguments();
  variable_list unpack(PyObject *returned) const;

  std::shared_ptr<const Backward> backward_;
  std::vector<PyObject *> scalars_;  // strong references, per runtime scalar
};

[[noreturn]] void throw_python_error() {
  python_error err;
  err.persist();
  throw std::move(err);
}

// The call's arguments again: the saved tensors and the scalars, in their positions.
THPObjectPtr TccBackward::arguments() {
  THPObjectPtr args(PyTuple_New(backward_->nargs));
  if (!args) {
    throw_python_error();
  }
  std::vector<Variable> tensors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const SavedVariable &s : saved_) {
      tensors.push_back(s.unpack());
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyObject *t = THPVariable_Wrap(std::move(tensors[i]));
    if (t == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(args.get(), backward_->tensors[i], t);
  }
  for (size_t i = 0; i < scalars_.size(); ++i) {
    PyTuple_SET_ITEM(args.get(), backward_->scalars[i], Py_NewRef(scalars_[i]));
  }
  return args;
}

// The gradients of the tensor parameters from what the Python function returned (one per
// parameter; None: no gradient). The engine checks their shapes and dtypes against the inputs'.
variable_list TccBackward::unpack(PyObject *returned) const {
  if (!PyTuple_Check(returned) || PyTuple_GET_SIZE(returned) != backward_->nargs) {
    PyErr_Format(PyExc_TypeError, "%s: the backward returned %R, not one gradient per parameter",
                 backward_->name.c_str(), returned);
    throw_python_error();
  }
  variable_list grads;
  grads.reserve(backward_->tensors.size());
  for (Py_ssize_t pos : backward_->tensors) {
    PyObject *g = PyTuple_GET_ITEM(returned, pos);
    if (g == Py_None) {
      grads.emplace_back();
    } else if (THPVariable_Check(g)) {
      grads.push_back(THPVariable_Unpack(g));
    } else {
      PyErr_Format(PyExc_TypeError, "%s: a gradient is %R, not a tensor", backward_->name.c_str(), g);
      throw_python_error();
    }
  }
  return grads;
}

variable_list TccBackward::apply(variable_list &&grads) {
  pybind11::gil_scoped_acquire gil;  // the engine calls this without the GIL, maybe on its thread
  THPObjectPtr args = arguments();
  THPObjectPtr upstream(PyTuple_New(static_cast<Py_ssize_t>(grads.size())));
  THPObjectPtr needs(PyTuple_New(backward_->nargs));
  if (!upstream || !needs) {
    throw_python_error();
  }
  for (size_t i = 0; i < grads.size(); ++i) {  // an undefined gradient (unused result): None
    PyObject *g = grads[i].defined() ? THPVariable_Wrap(std::move(grads[i])) : Py_NewRef(Py_None);
    if (g == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(upstream.get(), static_cast<Py_ssize_t>(i), g);
  }
  for (Py_ssize_t pos : backward_->scalars) {
    PyTuple_SET_ITEM(needs.get(), pos, Py_NewRef(Py_False));
  }
  for (size_t i = 0; i < backward_->tensors.size(); ++i) {  // what this backward pass asks for
    PyTuple_SET_ITEM(needs.get(), backward_->tensors[i], PyBool_FromLong(task_should_compute_output(i)));
  }
  THPObjectPtr returned(PyObject_CallFunctionObjArgs(backward_->fn, args.get(), upstream.get(), needs.get(), nullptr));
  if (!returned) {
    throw_python_error();
  }
  return unpack(returned.get());
}

}  // namespace

bool records_graph(const Backward &backward, PyObject *const *args, Py_ssize_t nargs, bool *takes) {
  *takes = nargs == backward.nargs;
  if (!*takes || !at::GradMode::is_enabled()) {
    return false;
  }
  bool graph = false;
  for (Py_ssize_t pos : backward.tensors) {
    if (!THPVariable_CheckExact(args[pos])) {  // a subclass: the dispatcher's
      *takes = false;
      return false;
    }
    graph = graph || THPVariable_Unpack(args[pos]).requires_grad();
  }
  return graph;
}

void record(const std::shared_ptr<const Backward> &backward, PyObject *const *args, std::vector<at::Tensor> &outs) {
  auto node = c10::make_intrusive<TccBackward>(backward, args);
  torch::autograd::edge_list edges;
  edges.reserve(backward->tensors.size());
  for (Py_ssize_t pos : backward->tensors) {
    const at::Tensor &t = THPVariable_Unpack(args[pos]);
    edges.push_back(torch::autograd::impl::gradient_edge(t));
    node->saved_.emplace_back(t, false);
  }
  node->set_next_edges(std::move(edges));
  for (at::Tensor &out : outs) {
    if (torch::autograd::isDifferentiableType(out.scalar_type())) {
      torch::autograd::create_gradient_edge(out, node);
    } else {
      node->add_input_metadata(Node::undefined_input());
    }
  }
  ++graphs_recorded;
}

}  // namespace tcc_torch
