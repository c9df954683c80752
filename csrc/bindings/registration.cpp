// The pygpt operator library: schemas of every op, and the Python module whose import loads this
// shared object so that the registrations below run. The module also chooses the CPU kernels'
// ISA (dispatch/cpu_dispatch.h) at import, so a bad PYGPT_CPU_ISA fails the import with its
// message, and lets Python query and switch it.
#include <Python.h>
#include <torch/library.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch/cpu_dispatch.h"

namespace {

PyObject* string_list(const std::vector<std::string>& names) {
  PyObject* list = PyList_New(0);
  for (const auto& name : names) {
    PyObject* item = PyUnicode_FromString(name.c_str());
    PyList_Append(list, item);
    Py_DECREF(item);
  }
  return list;
}

PyObject* cpu_isa(PyObject*, PyObject*) {
  return PyUnicode_FromString(pygpt::cpu::kernel_table().isa);
}

PyObject* built_cpu_isas(PyObject*, PyObject*) { return string_list(pygpt::cpu::built_isas()); }

PyObject* supported_cpu_isas(PyObject*, PyObject*) {
  return string_list(pygpt::cpu::supported_isas());
}

PyObject* use_cpu_isa(PyObject*, PyObject* args) {
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  try {
    pygpt::cpu::use_isa(name);
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"cpu_isa", cpu_isa, METH_NOARGS, "The ISA the CPU kernels run with."},
    {"built_cpu_isas", built_cpu_isas, METH_NOARGS, "The ISAs compiled in, best first."},
    {"supported_cpu_isas", supported_cpu_isas, METH_NOARGS,
     "The compiled ISAs this CPU runs, best first."},
    {"use_cpu_isa", use_cpu_isa, METH_VARARGS, "Runs the CPU kernels with the named ISA."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C",
                               "pygpt kernels; importing registers torch.ops.pygpt", -1, methods};
  try {
    pygpt::cpu::kernel_table();  // PYGPT_CPU_ISA is read here, once
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
  return PyModule_Create(&module);
}

TORCH_LIBRARY(pygpt, m) {
  // Returns (out, lse); lse is the log-sum-exp of each scaled, biased, masked score row. The
  // lengths are the real queries and keys of each batch row of a right-padded batch (None: all).
  // rel_bias (H, 2R + 1) and alibi_slopes (H,) add a bias of the key - query distance to the
  // scores (common/attention_shape.h's AttentionBias).
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal=True, float? scale=None,"
        " Tensor? q_lengths=None, Tensor? kv_lengths=None, Tensor? rel_bias=None,"
        " Tensor? alibi_slopes=None) -> (Tensor, Tensor)");
  // Returns (grad_q, grad_k, grad_v, grad_rel_bias, grad_alibi_slopes); the gradient of a bias
  // input not given is an empty tensor.
  m.def("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
        " bool causal, float? scale, Tensor? q_lengths=None, Tensor? kv_lengths=None,"
        " Tensor? rel_bias=None, Tensor? alibi_slopes=None)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Returns (y, mean, rstd).
  m.def("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05)"
        " -> (Tensor, Tensor, Tensor)");
  // Returns (grad_x, grad_weight, grad_bias); a gradient not asked for is an empty tensor.
  m.def("layer_norm_backward(Tensor grad_y, Tensor x, Tensor? weight, Tensor mean, Tensor rstd,"
        " bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)");
  // Returns (mean loss, lse per row); label_smoothing as in F.cross_entropy.
  m.def("cross_entropy(Tensor logits, Tensor targets, int ignore_index=-100,"
        " float label_smoothing=0.0) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor targets, Tensor lse,"
        " int ignore_index, float label_smoothing=0.0) -> Tensor");
  // Rotary position embedding of x (B, H, T, D) by the angles in the rows `positions` of the
  // cos / sin tables (max_pos, rotary_dim / 2); inverse rotates back (its own backward).
  m.def("rotary(Tensor x, Tensor cos, Tensor sin, Tensor positions, bool inverse=False)"
        " -> Tensor");
  // gelu(x + bias) over x's last dimension, bias (C,); exact (erf) GELU.
  m.def("bias_gelu(Tensor x, Tensor bias) -> Tensor");
  // Returns (grad_x, grad_bias); grad_bias is an empty tensor when not asked for.
  m.def("bias_gelu_backward(Tensor grad_y, Tensor x, Tensor bias, bool bias_grad)"
        " -> (Tensor, Tensor)");
  // Returns (sum = x + residual, y = layer_norm(sum), mean, rstd).
  m.def("add_layer_norm(Tensor x, Tensor residual, Tensor? weight=None, Tensor? bias=None,"
        " float eps=1e-05) -> (Tensor, Tensor, Tensor, Tensor)");
  // Returns (grad of x and of residual, grad_weight, grad_bias): the layer norm's backward
  // through y plus grad_sum (None: sum has no other use); a gradient not asked for is empty.
  m.def("add_layer_norm_backward(Tensor grad_y, Tensor? grad_sum, Tensor sum, Tensor? weight,"
        " Tensor mean, Tensor rstd, bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)");
}
