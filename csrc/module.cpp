// The Python module ddpd._C. Importing it loads the shared library, whose static
// initialisers register the torch.ops.ddpd operators; the module itself says whether
// the CUDA kernels were compiled in and holds launch_key (csrc/launch_key.cpp).
#include <Python.h>

#include "launch_key.h"

#ifndef DDPD_WITH_CUDA
#define DDPD_WITH_CUDA 0
#endif

#define DDPD_CONCAT_(a, b) a##b
#define DDPD_CONCAT(a, b) DDPD_CONCAT_(a, b)
#define DDPD_STR_(a) #a
#define DDPD_STR(a) DDPD_STR_(a)

static PyMethodDef ddpd_methods[] = {
    {"launch_key", ddpd::launch_key, METH_O,
     "launch_key(args: tuple) -> bytes | None: the classes of a Triton launch's runtime arguments"},
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef ddpd_module = {
    PyModuleDef_HEAD_INIT, DDPD_STR(TORCH_EXTENSION_NAME),
    "ddpd C++/CUDA operators, registered as torch.ops.ddpd.*", -1, ddpd_methods};

PyMODINIT_FUNC DDPD_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* module = PyModule_Create(&ddpd_module);
  if (module != nullptr && PyModule_AddIntConstant(module, "with_cuda", DDPD_WITH_CUDA) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
