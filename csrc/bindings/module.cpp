// The Python module pygpt._C, whose import loads this shared object so that the ops'
// registrations run, and the pygpt operator library itself: TORCH_LIBRARY below claims the
// namespace, and each op's own file (attention.cpp, layer_norm.cpp, ...) adds its schemas to it
// with TORCH_LIBRARY_FRAGMENT. The module also chooses the CPU kernels' ISA
// (dispatch/cpu_dispatch.h) at import, so a bad PYGPT_CPU_ISA fails the import with its message,
// and lets Python query and switch it.
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

TORCH_LIBRARY(pygpt, m) {}  // the schemas: each op adds its own, in its own file
