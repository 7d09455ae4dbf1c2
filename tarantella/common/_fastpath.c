/* _fastpath.c - tnt.allreduce's common call, from Python straight into the core.
 *
 * A plain `tnt.allreduce(x)` used to run about sixty lines of Python around one
 * call into the core. In a loop on more ranks than cores each rank's turn starts
 * with cold caches, and that Python cost more than the collective: a 4-byte
 * allreduce took 55-80 us on 4 ranks on 2 cores, against 30-38 us for the bare
 * cffi call (9-10 us against 4.7 on 2 ranks). Here the common call (one NumPy
 * array of a dtype the core knows, op "sum" or "average", a float prescale, no
 * name or a short one, `out` like the array or none) is checked and driven in C.
 *
 * Anything else returns NotImplemented, before any side effect, and the
 * caller (collectives.allreduce) takes the general Python path, which gives
 * every error message. So this file decides only "is it the common call":
 * never what a wrong argument means.
 *
 * State shared with the Python path (the unnamed-call counter and names, the
 * requests still in flight, the dtype codes) is the Python objects themselves,
 * handed over by bind(): a rank whose calls take either path names them alike.
 *
 * A plain CPython extension, not part of the cffi module: cffi functions take C
 * types only, and this one takes Python objects. It reaches the core through
 * the address of tnt_allreduce that cffi gives (bind()), so it calls the one
 * core this process has loaded.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "tarantella.h"

#if PY_VERSION_HEX < 0x030A0000 /* Python 3.9 */
static inline PyObject *Py_NewRef(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#endif

typedef tnt_result_t (*allreduce_fn)(const char *, const void *, void *, int64_t, tnt_dtype_t, tnt_reduce_op_t,
                                     double, double, tnt_handle_t *);

/* Set by bind(); owned references. */
static allreduce_fn core_allreduce;
static PyObject *core_module;   /* tarantella.common.core: its `_running` is True while the core runs here */
static PyObject *ndarray_type;  /* numpy.ndarray: subclasses take the general path */
static PyObject *np_empty;      /* numpy.empty, for small results */
static PyObject *result_like;   /* collectives._result_like, for large (aligned, pooled) results */
static PyObject *dtype_codes;   /* {numpy dtype: tnt_dtype_t}, filled by the general path */
static PyObject *op_codes;      /* {"sum": ..., "average": ...} */
static PyObject *unnamed_counter; /* the itertools.count of unnamed allreduces */
static PyObject *unnamed_names; /* tuple of the names unnamed calls cycle through (bytes) */
static PyObject *in_flight;     /* {name: handle} of unnamed requests still in flight */
static PyObject *orphans;       /* list of dropped, unfinished requests to reap */
static PyObject *settle_before; /* collectives._settle_before(name, unnamed): reap those, wait for the name's last use */
static PyObject *finish_slow;   /* collectives._finish_in_progress(handle, name, unnamed, array, out) */
static PyObject *check;         /* core.check(result): raises the error of a result code */
static PyObject *thread_name;   /* request_names.unnamed_allreduce_name(): this thread's next name */
static Py_ssize_t small_bytes;  /* results below this are plain numpy.empty arrays, */
static Py_ssize_t pooled_bytes; /* from this on they come from result_pool (collectives._result_like), */
static Py_ssize_t align;        /* and in between they are aligned to this many bytes here */
static double wait_slice_s;     /* how long one call waits before handing over to the Python wait */
static unsigned long main_thread; /* its unnamed calls are numbered here; other threads' by thread_name */

static PyObject *str_running, *str_dtype, *str_shape, *str_uint8;

/* The objects bind() takes, in its order. */
static PyObject **const bound[] = {&core_module, &ndarray_type, &np_empty, &result_like, &dtype_codes, &op_codes,
                                   &unnamed_counter, &unnamed_names, &in_flight, &orphans, &settle_before,
                                   &finish_slow, &check, &thread_name};
#define N_BOUND ((int)(sizeof bound / sizeof bound[0]))

static void forget_binding(void) {
  core_allreduce = NULL;
  for (int i = 0; i < N_BOUND; i++) Py_CLEAR(*bound[i]);
}

/* bind(address, core_module, ndarray, empty, result_like, dtype_codes, op_codes, counter, names,
 *      in_flight, orphans, settle_before, finish_slow, check, thread_name, small_bytes, pooled_bytes, align,
 *      wait_slice_s, main_thread) */
static PyObject *bind(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long address;
  PyObject *o[N_BOUND];
  Py_ssize_t small, pooled, alignment;
  double slice;
  unsigned long long main_ident;
  if (!PyArg_ParseTuple(args, "KOOOOO!O!OO!O!O!OOOOnnndK", &address, &o[0], &o[1], &o[2], &o[3], &PyDict_Type,
                        &o[4], &PyDict_Type, &o[5], &o[6], &PyTuple_Type, &o[7], &PyDict_Type, &o[8], &PyList_Type,
                        &o[9], &o[10], &o[11], &o[12], &o[13], &small, &pooled, &alignment, &slice, &main_ident))
    return NULL;
  if (!address || PyTuple_GET_SIZE(o[7]) == 0 || alignment < 1 || (alignment & (alignment - 1))) {
    PyErr_SetString(PyExc_ValueError,
                    "bind() needs the core's tnt_allreduce, at least one unnamed name and a power-of-two alignment");
    return NULL;
  }
  forget_binding();
  for (int i = 0; i < N_BOUND; i++) *bound[i] = Py_NewRef(o[i]);
  small_bytes = small;
  pooled_bytes = pooled;
  align = alignment;
  wait_slice_s = slice;
  main_thread = (unsigned long)main_ident;
  core_allreduce = (allreduce_fn)(uintptr_t)address;
  Py_RETURN_NONE;
}

/* The small integer behind a dict value (a code), or -1 when absent. */
static long code_in(PyObject *dict, PyObject *key) {
  PyObject *v = PyDict_GetItemWithError(dict, key); /* borrowed */
  if (v == NULL) {
    PyErr_Clear(); /* an unhashable key is simply not the common call */
    return -1;
  }
  return PyLong_AsLong(v);
}

static int same_shape(const Py_buffer *a, const Py_buffer *b) {
  if (a->ndim != b->ndim || a->itemsize != b->itemsize) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* out shares bytes with the input without being it: no collective can do that
 * (each reads the input after writing parts of the result); the general path
 * refuses it with the error. */
static int overlaps_partly(const Py_buffer *in, const Py_buffer *out) {
  const char *a = in->buf, *b = out->buf;
  return a != b && a < b + out->len && b < a + in->len;
}

/* numpy.ndarray(shape, dtype, buffer=raw, offset=o), o the first aligned byte
 * of raw: collectives.aligned_empty without its Python (2-4 us of a 64 KiB
 * allreduce's 12). */
static PyObject *aligned_in(PyObject *raw, PyObject *shape, PyObject *dtype) {
  Py_buffer view;
  if (PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE) != 0) return NULL;
  PyObject *offset = PyLong_FromSsize_t((Py_ssize_t)(-(uintptr_t)view.buf & (uintptr_t)(align - 1)));
  PyBuffer_Release(&view);
  if (offset == NULL) return NULL;
  PyObject *args[4] = {shape, dtype, raw, offset};
  PyObject *out = PyObject_Vectorcall(ndarray_type, args, 4, NULL);
  Py_DECREF(offset);
  return out;
}

/* Results below pooled_bytes handed out before, kept for reuse: one whose
 * only reference is this list (the caller dropped it, as `y = tnt.allreduce(x)`
 * in a loop drops the previous y) is handed out again instead of a new array.
 * On 4 ranks on 2 cores a 4-byte plain call took 14.6 us against 12.9 with
 * out=, where numpy.empty and the old result's deallocation start each turn on
 * a cold core; reused, 10.5 against 10.2 (docs/benchmarks.md). Taken only
 * while its dtype is still the input's (an array's dtype can be reassigned)
 * and it is writable, C-contiguous and shaped alike. A weak reference to a
 * dropped result stays alive and sees the next result that reuses it. */
#define RECYCLED 4
static PyObject *recycled[RECYCLED]; /* owned; NULL: empty */
static int recycled_next;           /* where the next new one goes */

static PyObject *reuse_result(PyObject *dtype, const Py_buffer *in) {
  for (int i = 0; i < RECYCLED; i++) {
    PyObject *a = recycled[i];
    if (a == NULL || Py_REFCNT(a) != 1) continue;
    PyObject *d = PyObject_GetAttr(a, str_dtype);
    int same = d == dtype;
    Py_XDECREF(d);
    Py_buffer b;
    if (!same || PyObject_GetBuffer(a, &b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      continue;
    }
    same = same_shape(in, &b);
    PyBuffer_Release(&b);
    if (same) return Py_NewRef(a);
  }
  return NULL;
}

static void keep_result(PyObject *a) {
  Py_XSETREF(recycled[recycled_next], Py_NewRef(a));
  recycled_next = (recycled_next + 1) % RECYCLED;
}

/* A fresh result of the array's dtype and shape: numpy.empty when small,
 * aligned when larger (TensorFlow aliases an aligned array instead of copying
 * it), from result_pool when larger still (the Python path's; its cost is
 * nothing beside the copy of 1 MiB). */
static PyObject *fresh_result(PyObject *array, PyObject *dtype, const Py_buffer *in) {
  const Py_ssize_t nbytes = in->len;
  if (nbytes >= pooled_bytes) return PyObject_CallOneArg(result_like, array);
  PyObject *again = reuse_result(dtype, in);
  if (again != NULL) return again;
  PyObject *shape = PyObject_GetAttr(array, str_shape), *out = NULL;
  if (shape == NULL) return NULL;
  if (nbytes < small_bytes) {
    PyObject *args[2] = {shape, dtype};
    out = PyObject_Vectorcall(np_empty, args, 2, NULL);
  } else {
    PyObject *size = PyLong_FromSsize_t(nbytes + align), *raw = NULL;
    if (size != NULL) {
      PyObject *args[2] = {size, str_uint8};
      raw = PyObject_Vectorcall(np_empty, args, 2, NULL);
      Py_DECREF(size);
    }
    if (raw != NULL) {
      out = aligned_in(raw, shape, dtype);
      Py_DECREF(raw);
    }
  }
  Py_DECREF(shape);
  if (out != NULL) keep_result(out);
  return out;
}

/* The name of this call: the caller's (checked: 1-255 bytes, no NUL), or the
 * next unnamed one of the calling thread's sequence. NULL, without an
 * exception, when not the common call. */
static const char *call_name(PyObject *name, PyObject **name_bytes, int *unnamed) {
  if (name == Py_None && PyThread_get_thread_ident() != main_thread) {
    /* another thread's own sequence (request_names.py): made in Python, a
     * refusal (two threads of one name, a pool's thread) raised from there */
    *name_bytes = PyObject_CallNoArgs(thread_name);
    if (*name_bytes == NULL) return NULL;
    if (!PyBytes_Check(*name_bytes)) {
      Py_CLEAR(*name_bytes);
      PyErr_SetString(PyExc_TypeError, "the thread's unnamed name is not bytes");
      return NULL;
    }
    *unnamed = 1;
    return PyBytes_AS_STRING(*name_bytes);
  }
  if (name == Py_None) {
    PyObject *k = PyIter_Next(unnamed_counter);
    if (k == NULL) return NULL;
    Py_ssize_t i = PyLong_AsSsize_t(k) % PyTuple_GET_SIZE(unnamed_names);
    Py_DECREF(k);
    *name_bytes = Py_NewRef(PyTuple_GET_ITEM(unnamed_names, i));
    *unnamed = 1;
    return PyBytes_AS_STRING(*name_bytes);
  }
  if (!PyUnicode_CheckExact(name)) return NULL;
  Py_ssize_t len;
  const char *utf8 = PyUnicode_AsUTF8AndSize(name, &len);
  if (utf8 == NULL) {
    PyErr_Clear();
    return NULL;
  }
  if (len < 1 || len > 255 || strlen(utf8) != (size_t)len) return NULL;
  *unnamed = 0;
  return utf8; /* lives as long as `name` */
}

/* allreduce(array, op, name, prescale, out): the result array, or NotImplemented
 * when this is not the common call (nothing done yet, the Python path takes it). */
static PyObject *allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "allreduce(array, op, name, prescale, out) takes 5 arguments");
    return NULL;
  }
  PyObject *array = args[0], *op = args[1], *name = args[2], *prescale = args[3], *out = args[4];
  if (core_allreduce == NULL || Py_TYPE(array) != (PyTypeObject *)ndarray_type || !PyFloat_CheckExact(prescale) ||
      !PyUnicode_CheckExact(op))
    Py_RETURN_NOTIMPLEMENTED;
  /* the core runs in this process (not shut down, not a fork() child) */
  PyObject *running = PyObject_GetAttr(core_module, str_running);
  if (running == NULL) return NULL;
  int up = running == Py_True;
  Py_DECREF(running);
  if (!up) Py_RETURN_NOTIMPLEMENTED;

  long opcode = code_in(op_codes, op);
  PyObject *dtype = PyObject_GetAttr(array, str_dtype);
  if (dtype == NULL) return NULL;
  long dt = code_in(dtype_codes, dtype);
  if (opcode < 0 || dt < 0) {
    Py_DECREF(dtype);
    Py_RETURN_NOTIMPLEMENTED;
  }

  Py_buffer in, res;
  if (PyObject_GetBuffer(array, &in, PyBUF_C_CONTIGUOUS) != 0) { /* not C-contiguous: the general path says so */
    PyErr_Clear();
    Py_DECREF(dtype);
    Py_RETURN_NOTIMPLEMENTED;
  }
  PyObject *result = NULL;
  if (out == Py_None) {
    result = fresh_result(array, dtype, &in);
  } else if (Py_TYPE(out) == (PyTypeObject *)ndarray_type) {
    PyObject *out_dtype = PyObject_GetAttr(out, str_dtype);
    int same = out_dtype == NULL ? -1 : PyObject_RichCompareBool(out_dtype, dtype, Py_EQ);
    Py_XDECREF(out_dtype);
    if (same < 0) {
      Py_DECREF(dtype);
      PyBuffer_Release(&in);
      return NULL;
    }
    if (same) result = Py_NewRef(out);
  }
  Py_DECREF(dtype);
  if (result == NULL) {
    PyBuffer_Release(&in);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (PyObject_GetBuffer(result, &res, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0 || !same_shape(&in, &res) ||
      overlaps_partly(&in, &res)) {
    if (PyErr_Occurred()) PyErr_Clear(); /* read-only, not C-contiguous, overlapping: the general path says so */
    else PyBuffer_Release(&res);
    PyBuffer_Release(&in);
    Py_DECREF(result);
    Py_RETURN_NOTIMPLEMENTED;
  }

  PyObject *name_bytes = NULL;
  int unnamed = 0;
  const char *cname = call_name(name, &name_bytes, &unnamed);
  if (cname == NULL) {
    PyBuffer_Release(&in), PyBuffer_Release(&res);
    Py_DECREF(result);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  /* rare: dropped requests to reap, or this unnamed name's last use still in flight */
  int settle = PyList_GET_SIZE(orphans) > 0;
  if (!settle && unnamed && PyDict_GET_SIZE(in_flight)) settle = PyDict_Contains(in_flight, name_bytes);
  if (settle) {
    PyObject *none = settle < 0 ? NULL
                                : PyObject_CallFunctionObjArgs(settle_before, name_bytes ? name_bytes : name,
                                                               unnamed ? Py_True : Py_False, NULL);
    if (none == NULL) {
      PyBuffer_Release(&in), PyBuffer_Release(&res);
      Py_DECREF(result);
      Py_XDECREF(name_bytes);
      return NULL;
    }
    Py_DECREF(none);
  }
  const int64_t count = in.itemsize ? in.len / in.itemsize : 0;
  const double scale = PyFloat_AS_DOUBLE(prescale);
  tnt_handle_t handle = 0;
  tnt_result_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = core_allreduce(cname, in.buf, res.buf, count, (tnt_dtype_t)dt, (tnt_reduce_op_t)opcode, scale, wait_slice_s,
                      &handle);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&in), PyBuffer_Release(&res);
  if (rc == TNT_SUCCESS) {
    Py_XDECREF(name_bytes);
    return result;
  }
  PyObject *next = NULL;
  if (rc == TNT_IN_PROGRESS) { /* a slow peer: the Python wait, interruptible, takes over */
    if (name_bytes == NULL) name_bytes = PyBytes_FromString(cname);
    if (name_bytes != NULL)
      next = PyObject_CallFunction(finish_slow, "LOOOO", (long long)handle, name_bytes, unnamed ? Py_True : Py_False,
                                   array, result);
  } else {
    next = PyObject_CallFunction(check, "i", (int)rc); /* raises */
    if (next != NULL) { /* check() raised nothing: a code it does not know */
      Py_DECREF(next);
      next = NULL;
      PyErr_Format(PyExc_RuntimeError, "the core returned %d", (int)rc);
    }
  }
  Py_XDECREF(name_bytes);
  Py_DECREF(result);
  return next;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Connect the fast path to the running core and the Python path's state."},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(array, op, name, prescale, out): the result, or NotImplemented when not the common call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tarantella._fastpath",
                                    "tnt.allreduce's common call in C (see _fastpath.c).", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
  str_running = PyUnicode_InternFromString("_running");
  str_dtype = PyUnicode_InternFromString("dtype");
  str_shape = PyUnicode_InternFromString("shape");
  str_uint8 = PyUnicode_InternFromString("uint8");
  if (!str_running || !str_dtype || !str_shape || !str_uint8) return NULL;
  return PyModule_Create(&module);
}
