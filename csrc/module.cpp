// The Python module ddpd._C. Importing it loads the shared library, whose static
// initialisers register the torch.ops.ddpd operators; the module itself only says
// whether the CUDA kernels were compiled in.
#include <Python.h>

#ifndef DDPD_WITH_CUDA
#define DDPD_WITH_CUDA 0
#endif

#define DDPD_CONCAT_(a, b) a##b
#define DDPD_CONCAT(a, b) DDPD_CONCAT_(a, b)
#define DDPD_STR_(a) #a
#define DDPD_STR(a) DDPD_STR_(a)

static PyModuleDef ddpd_module = {
    PyModuleDef_HEAD_INIT, DDPD_STR(TORCH_EXTENSION_NAME),
    "ddpd C++/CUDA operators, registered as torch.ops.ddpd.*", -1, nullptr};

PyMODINIT_FUNC DDPD_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* module = PyModule_Create(&ddpd_module);
  if (module != nullptr && PyModule_AddIntConstant(module, "with_cuda", DDPD_WITH_CUDA) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
