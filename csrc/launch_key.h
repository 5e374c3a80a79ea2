// ddpd._C.launch_key: the classes of a Triton launch's runtime arguments, the cache key of
// ddpd/ops/_dispatch.py launch() (csrc/launch_key.cpp).
#pragma once
#include <Python.h>

namespace ddpd {

// launch_key(args: tuple) -> bytes, or None for an argument it does not classify.
PyObject* launch_key(PyObject* self, PyObject* args);

}  // namespace ddpd
