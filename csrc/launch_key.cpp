// The classes of a Triton launch's runtime arguments, two bytes each, for the cache of
// compiled kernels in ddpd/ops/_dispatch.py launch(). Triton specialises a kernel on each
// argument: a tensor on its dtype and its pointer's 16-byte alignment, an int on its type
// (int32, int64, uint64 by range), equality to 1 (compiled in as a constant) and
// divisibility by 16; floats, bools and None by type alone. These classes are at least as
// fine (a pointer's low four bits, not only whether they are zero), so two launches with
// equal keys take the same compiled kernel. In C because the same loop in Python costs a
// launch far more (docs/performance.md).
#include "launch_key.h"

#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <string>

namespace ddpd {
namespace {

enum Kind : char { kNone = 1, kBool, kFloat, kInt32, kInt64, kUInt64, kTensor = 0x40 };

// An int's flags: equal to 1, divisible by 16.
char int_flags(bool one, bool divisible) { return static_cast<char>(one | (divisible << 1)); }

// The two bytes of one argument, or false when it is none of the classified kinds (an int
// beyond uint64, a tensor without storage, any other object).
bool classify(PyObject* a, char* out) {
  if (a == Py_None) {
    out[0] = kNone;
  } else if (PyBool_Check(a)) {
    out[0] = kBool;
  } else if (PyFloat_CheckExact(a)) {
    out[0] = kFloat;
  } else if (PyLong_CheckExact(a)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
    if (overflow == 0) {
      out[0] = v >= INT32_MIN && v <= INT32_MAX ? kInt32 : kInt64;
      out[1] = int_flags(v == 1, (v & 15) == 0);
    } else {
      if (overflow < 0) return false;
      const unsigned long long u = PyLong_AsUnsignedLongLong(a);
      if (PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      out[0] = kUInt64;
      out[1] = int_flags(false, (u & 15) == 0);
    }
  } else if (THPVariable_Check(a)) {
    const at::Tensor& t = THPVariable_Unpack(a);
    if (!t.has_storage()) return false;  // fake, meta-less wrappers: Triton's own launch decides
    out[0] = static_cast<char>(kTensor + static_cast<int>(t.scalar_type()));
    out[1] = static_cast<char>(reinterpret_cast<std::uintptr_t>(t.data_ptr()) & 15);
  } else {
    return false;
  }
  return true;
}

}  // namespace

PyObject* launch_key(PyObject* /*self*/, PyObject* args) {
  if (!PyTuple_Check(args)) {
    PyErr_SetString(PyExc_TypeError, "launch_key expects a tuple of launch arguments");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  std::string key(static_cast<size_t>(2 * n), '\0');
  try {
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!classify(PyTuple_GET_ITEM(args, i), &key[2 * i])) Py_RETURN_NONE;
    }
  } catch (const std::exception&) {  // a tensor whose pointer cannot be read
    Py_RETURN_NONE;
  }
  return PyBytes_FromStringAndSize(key.data(), static_cast<Py_ssize_t>(key.size()));
}

}  // namespace ddpd
