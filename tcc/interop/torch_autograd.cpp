// The graph of an eager tcc.torch call served in C++ (see torch_autograd.h): what
// torch.autograd.Function.apply records for TorchOp's Python path (_Graph), built here, without
// the Python Function's own cost (its context object, its argument and output processing: most
// of a call that records a graph). The backward stays Python's: the node calls the op's
// TorchOp._native_backward, which runs the derived gradient ops, themselves tcc.torch ops, so
// that with create_graph=True their calls record the graph of the double backward.

#include "torch_autograd.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
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

[[noreturn]] void throw_python_error() {
  python_error err;
  err.persist();
  throw std::move(err);
}

// A runtime scalar as an IValue (a double, an int64 or a bool: no Python object to release
// without the GIL, and what compiled autograd lifts into its graph's inputs), and back.
c10::IValue scalar_value(PyObject *value) {
  if (PyBool_Check(value)) {
    return c10::IValue(value == Py_True);
  }
  if (PyLong_CheckExact(value)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
      return c10::IValue(static_cast<int64_t>(v));
    }
    PyErr_Clear();  // an int beyond int64 given for a float parameter: its float value
  }
  double v = PyFloat_AsDouble(value);
  if (v == -1.0 && PyErr_Occurred()) {
    throw_python_error();
  }
  return c10::IValue(v);
}

PyObject *scalar_object(const c10::IValue &value) {
  if (value.isBool()) {
    return PyBool_FromLong(value.toBool());
  }
  if (value.isInt()) {
    return PyLong_FromLongLong(value.toInt());
  }
  return PyFloat_FromDouble(value.toDouble());
}

// The call's arguments again, in their positions: tensors and scalars (as Python objects).
THPObjectPtr arguments(const Backward &backward, std::vector<Variable> &&tensors, const std::vector<c10::IValue> &scalars) {
  THPObjectPtr args(PyTuple_New(backward.nargs));
  if (!args) {
    throw_python_error();
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyObject *t = THPVariable_Wrap(std::move(tensors[i]));
    if (t == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(args.get(), backward.tensors[i], t);
  }
  for (size_t i = 0; i < scalars.size(); ++i) {
    PyObject *s = scalar_object(scalars[i]);
    if (s == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(args.get(), backward.scalars[i], s);
  }
  return args;
}

// The gradients of the tensor parameters from what the Python function returned (one per
// parameter; None: no gradient). The engine checks their shapes and dtypes against the inputs'.
variable_list unpack(const Backward &backward, PyObject *returned) {
  if (!PyTuple_Check(returned) || PyTuple_GET_SIZE(returned) != backward.nargs) {
    PyErr_Format(PyExc_TypeError, "%s: the backward returned %R, not one gradient per parameter",
                 backward.name.c_str(), returned);
    throw_python_error();
  }
  variable_list grads;
  grads.reserve(backward.tensors.size());
  for (Py_ssize_t pos : backward.tensors) {
    PyObject *g = PyTuple_GET_ITEM(returned, pos);
    if (g == Py_None) {
      grads.emplace_back();
    } else if (THPVariable_Check(g)) {
      grads.push_back(THPVariable_Unpack(g));
    } else {
      PyErr_Format(PyExc_TypeError, "%s: a gradient is %R, not a tensor", backward.name.c_str(), g);
      throw_python_error();
    }
  }
  return grads;
}

// The backward: the op's Python function on the call's arguments, the upstream gradients
// (None where autograd has none: an unused result) and which gradients to compute (per tensor
// parameter). Takes the GIL: the engine calls nodes without it, maybe on its own thread.
variable_list run_backward(const Backward &backward, std::vector<Variable> &&tensors,
                           const std::vector<c10::IValue> &scalars, const variable_list &grads,
                           const std::vector<bool> &needs) {
  pybind11::gil_scoped_acquire gil;
  THPObjectPtr args = arguments(backward, std::move(tensors), scalars);
  THPObjectPtr upstream(PyTuple_New(static_cast<Py_ssize_t>(grads.size())));
  THPObjectPtr asked(PyTuple_New(backward.nargs));
  if (!upstream || !asked) {
    throw_python_error();
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    PyObject *g = grads[i].defined() ? THPVariable_Wrap(grads[i]) : Py_NewRef(Py_None);
    if (g == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(upstream.get(), static_cast<Py_ssize_t>(i), g);
  }
  for (Py_ssize_t pos : backward.scalars) {
    PyTuple_SET_ITEM(asked.get(), pos, Py_NewRef(Py_False));
  }
  for (size_t i = 0; i < backward.tensors.size(); ++i) {
    PyTuple_SET_ITEM(asked.get(), backward.tensors[i], PyBool_FromLong(needs[i]));
  }
  THPObjectPtr returned(PyObject_CallFunctionObjArgs(backward.fn, args.get(), upstream.get(), asked.get(), nullptr));
  if (!returned) {
    throw_python_error();
  }
  return unpack(backward, returned.get());
}

// A call's backward node: the saved arguments, and the op's Python backward.
class TccBackward : public Node {
 public:
  explicit TccBackward(std::shared_ptr<const Backward> backward) : backward_(std::move(backward)) {}

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

  variable_list apply(variable_list &&grads) override {
    std::vector<Variable> tensors;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const SavedVariable &s : saved_) {
        tensors.push_back(s.unpack());
      }
    }
    std::vector<bool> needs;  // what this backward pass asks for
    for (size_t i = 0; i < saved_.size(); ++i) {
      needs.push_back(task_should_compute_output(i));
    }
    return run_backward(*backward_, std::move(tensors), scalars_, grads, needs);
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs &args) const override;
  variable_list apply_with_saved(const variable_list &grads, torch::dynamo::autograd::SwapSavedVariables &saved) override;

  std::vector<SavedVariable> saved_;  // per tensor parameter
  std::vector<c10::IValue> scalars_;  // per runtime scalar

 private:
  std::shared_ptr<const Backward> backward_;
};

// Compiled autograd (torch._dynamo.compiled_autograd) calls the backward as an opaque function
// of its graph, as for a C++ autograd::Function that is not traceable: the node's identity, its
// saved tensors and scalars are its cache key and inputs.
void TccBackward::compiled_args(torch::dynamo::autograd::CompiledNodeArgs &args) const {
  args.collect(backward_->name);
  args.collect(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(backward_.get())));
  args.collect(saved_, false);
  for (const c10::IValue &s : scalars_) {
    args.collect(s);
  }
}

// The packed arguments: the saved tensors, the scalars, then which gradients to compute.
variable_list TccBackward::apply_with_saved(const variable_list &grads,
                                            torch::dynamo::autograd::SwapSavedVariables &saved) {
  saved.before(saved_);
  saved.before(scalars_);
  std::vector<c10::IValue> packed;
  std::vector<at::TypePtr> schema;
  for (const SavedVariable &s : saved_) {
    packed.emplace_back(s.unpack());
    schema.push_back(at::TensorType::get());
  }
  for (const c10::IValue &s : scalars_) {
    packed.push_back(s);
    schema.push_back(s.type());
  }
  std::vector<bool> needs;
  for (size_t i = 0; i < saved_.size(); ++i) {
    needs.push_back(task_should_compute_output(i));
  }
  packed.emplace_back(needs);
  schema.push_back(c10::ListType::create(c10::BoolType::get()));
  auto backward = backward_;  // the bound function keeps it
  auto functional = [backward](const variable_list &inputs, const std::vector<c10::IValue> &args) {
    size_t ntensors = backward->tensors.size(), nscalars = backward->scalars.size();
    std::vector<Variable> tensors;
    for (size_t i = 0; i < ntensors; ++i) {
      tensors.push_back(args[i].toTensor());
    }
    std::vector<c10::IValue> scalars(args.begin() + ntensors, args.begin() + ntensors + nscalars);
    return run_backward(*backward, std::move(tensors), scalars, inputs, args[ntensors + nscalars].to<std::vector<bool>>());
  };
  const auto &py = torch::dynamo::autograd::getPyCompilerInterface();
  auto metadata = torch::dynamo::autograd::IValuePacker<std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
      torch::dynamo::autograd::get_input_metadata(next_edges()));
  std::string fn_name = py->bind_function(saved.get_py_compiler(), backward_->name, functional, schema,
                                          /*is_custom_function=*/true, /*is_traceable=*/false);
  variable_list results = py->call_function(saved.get_py_compiler(), "apply_functional", fn_name, grads, packed,
                                            metadata);
  saved.after(saved_);
  saved.after(scalars_);
  return results;
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

// Graph nodes are held by std::shared_ptr up to PyTorch 2.11 and by c10::intrusive_ptr after:
// a new node in whichever pointer an Edge holds.
template <typename Ptr> struct NewNode;
template <typename T> struct NewNode<std::shared_ptr<T>> {
  template <typename N, typename... Args> static std::shared_ptr<N> make(Args &&...args) {
    return std::make_shared<N>(std::forward<Args>(args)...);
  }
};
template <typename T, typename Null> struct NewNode<c10::intrusive_ptr<T, Null>> {
  template <typename N, typename... Args> static c10::intrusive_ptr<N> make(Args &&...args) {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  }
};

void record(const std::shared_ptr<const Backward> &backward, PyObject *const *args, std::vector<at::Tensor> &outs) {
  auto node = NewNode<decltype(torch::autograd::Edge::function)>::make<TccBackward>(backward);
  torch::autograd::edge_list edges;
  edges.reserve(backward->tensors.size());
  node->saved_.reserve(backward->tensors.size());
  for (Py_ssize_t pos : backward->tensors) {
    const at::Tensor &t = THPVariable_Unpack(args[pos]);
    edges.push_back(torch::autograd::impl::gradient_edge(t));
    node->saved_.emplace_back(t, false);
  }
  for (Py_ssize_t pos : backward->scalars) {
    node->scalars_.push_back(scalar_value(args[pos]));
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
