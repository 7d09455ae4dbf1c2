/* _fastpath.c - the common calls of tnt.allreduce, tnt.broadcast and
 * tnt.allgather, from Python straight into the core.
 *
 * A plain `tnt.allreduce(x)` used to run about sixty lines of Python around one
 * call into the core. In a loop on more ranks than cores each rank's turn starts
 * with cold caches, and that Python cost more than the collective: a 4-byte
 * allreduce took 55-80 us on 4 ranks on 2 cores, against 30-38 us for the bare
 * cffi call (9-10 us against 4.7 on 2 ranks). Here the common call (one NumPy
 * array of a dtype the core knows, op "sum" or "average", a float prescale, no
 * name or a short one, `out` like the array or none) is checked and driven in C;
 * a broadcast's likewise (an int root in range instead of op and prescale; a
 * 4-byte broadcast took 13.2 us on 2 ranks through Python, 3.3 us here), and an
 * allgather's (a small one 13.4 against 4.5 us).
 *
 * Anything else returns NotImplemented, before any side effect, and the caller
 * (collectives.allreduce, .broadcast, .allgather) takes the general Python
 * path, which gives every error message. So this file decides only "is it the
 * common call": never what a wrong argument means.
 *
 * State shared with the Python path (the unnamed-call counters and names, the
 * requests still in flight, the dtype codes) is the Python objects themselves,
 * handed over by bind(), bind_broadcast() and bind_allgather(): a rank whose
 * calls take either path names them alike.
 *
 * A plain CPython extension, not part of the cffi module: cffi functions take C
 * types only, and this one takes Python objects. It reaches the core through
 * the addresses of the core's functions that cffi gives, so it calls the one
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

/* The core's _layout forms (tnt_allreduce_layout, ...): every call carries its
 * array's shape layout (tnt_shape_layout), 0 for one of at most 1 dimension. */
typedef tnt_result_t (*allreduce_fn)(const char *, const void *, void *, int64_t, tnt_dtype_t, tnt_reduce_op_t,
                                     double, uint64_t, double, tnt_handle_t *);
typedef tnt_result_t (*broadcast_fn)(const char *, const void *, void *, int64_t, tnt_dtype_t, int, uint64_t, double,
                                     tnt_handle_t *);
typedef int (*size_fn)(void);
typedef uint64_t (*shape_layout_fn)(int, const int64_t *);

/* A kind of collective's unnamed calls: each kind numbers its own. */
typedef struct {
  PyObject *counter;     /* the itertools.count of the main thread's unnamed calls */
  PyObject *names;       /* tuple of the names they cycle through (bytes) */
  PyObject *thread_name; /* request_names: another thread's next name of this kind */
} unnamed_t;

/* Set by bind(); owned references. */
static allreduce_fn core_allreduce;
static unnamed_t allreduces; /* request_names.unnamed_window("allreduce"), unnamed_name("allreduce") */
static PyObject *core_module;   /* tarantella.common.core: its `_running` is True while the core runs here */
static PyObject *ndarray_type;  /* numpy.ndarray: subclasses take the general path */
static PyObject *np_empty;      /* numpy.empty, for small results */
static PyObject *aligned_empty; /* collectives.aligned_empty(shape, dtype, pooled), for pooled results */
static PyObject *dtype_codes;   /* {numpy dtype: tnt_dtype_t}, filled by the general path */
static PyObject *op_codes;      /* {"sum": ..., "average": ...} */
static PyObject *in_flight;     /* {name: handle} of unnamed requests still in flight */
static PyObject *orphans;       /* list of dropped, unfinished requests to reap */
static PyObject *settle_before; /* collectives._settle_before(name, unnamed): reap those, wait for the name's last use */
static PyObject *finish_slow;   /* collectives._finish_in_progress(handle, name, unnamed, array, out) */
static PyObject *check;         /* core.check(result): raises the error of a result code */
static Py_ssize_t small_bytes;  /* results below this are plain numpy.empty arrays, */
static Py_ssize_t pooled_bytes; /* from this on they come from result_pool (aligned_empty, pooled), */
static Py_ssize_t align;        /* and in between they are aligned to this many bytes here */
static double wait_slice_s;     /* how long one call waits before handing over to the Python wait */
static unsigned long main_thread; /* its unnamed calls are numbered here; other threads' by thread_name */
static shape_layout_fn core_shape_layout; /* tnt_shape_layout: the one definition of a shape's layout */

static PyObject *str_running, *str_dtype, *str_uint8, *str_base;

/* Set by bind_broadcast(); owned references. */
static broadcast_fn core_broadcast;
static size_fn core_size;
static unnamed_t broadcasts;

/* Set by bind_allgather(); owned references. */
typedef tnt_result_t (*allgather_fn)(const char *, const void *, int64_t, int64_t, tnt_dtype_t, void *, int64_t,
                                     uint64_t, double, tnt_handle_t *);
typedef tnt_result_t (*result_count_fn)(tnt_handle_t, int64_t *);
typedef tnt_result_t (*release_fn)(tnt_handle_t);
static allgather_fn core_allgather;
static result_count_fn core_result_count;
static release_fn core_release;
static unnamed_t allgathers;
static PyObject *gather_uneven; /* collectives._gather_uneven(handle, array, guess): the result, handle released */
static PyObject *gather_slow;   /* collectives._finish_gather_in_progress(handle, name, unnamed, array, guess) */
static Py_ssize_t gather_pooled_bytes; /* pooled_bytes of allgather results (collectives._gather_result) */

/* The objects bind() takes, in its order. */
static PyObject **const bound[] = {&core_module, &ndarray_type, &np_empty, &aligned_empty, &dtype_codes, &op_codes,
                                   &allreduces.counter, &allreduces.names, &in_flight, &orphans, &settle_before,
                                   &finish_slow, &check, &allreduces.thread_name};
#define N_BOUND ((int)(sizeof bound / sizeof bound[0]))

static void forget_binding(void) {
  core_allreduce = NULL;
  for (int i = 0; i < N_BOUND; i++) Py_CLEAR(*bound[i]);
}

/* bind_broadcast(tnt_broadcast, tnt_size, counter, names, thread_name), after bind(). */
static PyObject *bind_broadcast(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long address, size_address;
  PyObject *counter, *names, *name_fn;
  if (!PyArg_ParseTuple(args, "KKOO!O", &address, &size_address, &counter, &PyTuple_Type, &names, &name_fn))
    return NULL;
  if (!address || !size_address || PyTuple_GET_SIZE(names) == 0) {
    PyErr_SetString(PyExc_ValueError, "bind_broadcast() needs tnt_broadcast, tnt_size and at least one name");
    return NULL;
  }
  Py_XSETREF(broadcasts.counter, Py_NewRef(counter));
  Py_XSETREF(broadcasts.names, Py_NewRef(names));
  Py_XSETREF(broadcasts.thread_name, Py_NewRef(name_fn));
  core_size = (size_fn)(uintptr_t)size_address;
  core_broadcast = (broadcast_fn)(uintptr_t)address;
  Py_RETURN_NONE;
}

/* bind(address, core_module, ndarray, empty, aligned_empty, dtype_codes, op_codes, counter, names,
 *      in_flight, orphans, settle_before, finish_slow, check, thread_name, small_bytes, pooled_bytes, align,
 *      wait_slice_s, main_thread, shape_layout_address): `address` is tnt_allreduce_layout's */
static PyObject *bind(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long address, shape_layout_address;
  PyObject *o[N_BOUND];
  Py_ssize_t small, pooled, alignment;
  double slice;
  unsigned long long main_ident;
  if (!PyArg_ParseTuple(args, "KOOOOO!O!OO!O!O!OOOOnnndKK", &address, &o[0], &o[1], &o[2], &o[3], &PyDict_Type,
                        &o[4], &PyDict_Type, &o[5], &o[6], &PyTuple_Type, &o[7], &PyDict_Type, &o[8], &PyList_Type,
                        &o[9], &o[10], &o[11], &o[12], &o[13], &small, &pooled, &alignment, &slice, &main_ident,
                        &shape_layout_address))
    return NULL;
  if (!address || !shape_layout_address || PyTuple_GET_SIZE(o[7]) == 0 || alignment < 1 ||
      (alignment & (alignment - 1))) {
    PyErr_SetString(PyExc_ValueError, "bind() needs the core's tnt_allreduce_layout and tnt_shape_layout, at least "
                                      "one unnamed name and a power-of-two alignment");
    return NULL;
  }
  forget_binding();
  for (int i = 0; i < N_BOUND; i++) *bound[i] = Py_NewRef(o[i]);
  small_bytes = small;
  pooled_bytes = pooled;
  align = alignment;
  wait_slice_s = slice;
  main_thread = (unsigned long)main_ident;
  core_shape_layout = (shape_layout_fn)(uintptr_t)shape_layout_address;
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

static int has_dims(const Py_buffer *b, int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize) {
  if (b->ndim != ndim || b->itemsize != itemsize) return 0;
  for (int i = 0; i < ndim; i++)
    if (b->shape[i] != shape[i]) return 0;
  return 1;
}

static int same_shape(const Py_buffer *a, const Py_buffer *b) { return has_dims(b, a->ndim, a->shape, a->itemsize); }

#define LAYOUT_MAX_DIMS 64 /* numpy's limit (NPY_MAXDIMS in NumPy 2); more: the general path */

/* The layout of `ndim` dimensions `shape` (collectives._shape_layout): 0 below
 * 2 dimensions, with no call (a gradient's 1-d array costs nothing more);
 * else the core's tnt_shape_layout. */
static uint64_t shape_layout(int ndim, const Py_ssize_t *shape) {
  if (ndim < 2) return 0;
  int64_t dims[LAYOUT_MAX_DIMS];
  for (int i = 0; i < ndim; i++) dims[i] = (int64_t)shape[i];
  return core_shape_layout(ndim, dims);
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

/* Results below pooled_bytes handed out before, kept for reuse: one that
 * nothing but this list reaches (the caller dropped it, as `y = tnt.allreduce(x)`
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

/* Nothing but this list reaches `a`: neither a reference to it nor a view of
 * it. An aligned result is itself a view of its raw block (aligned_in), and
 * NumPy makes that block, not the result, the base of every view of the
 * result (`y.reshape(...)`, `y[:4]`): so the block must have no reference but
 * the result's. 1, or 0 (no exception left). */
static int unreachable(PyObject *a) {
  if (Py_REFCNT(a) != 1) return 0;
  PyObject *base = PyObject_GetAttr(a, str_base);
  if (base == NULL) {
    PyErr_Clear();
    return 0;
  }
  const int alone = base == Py_None || Py_REFCNT(base) == 2; /* the result's reference and this one */
  Py_DECREF(base);
  return alone;
}

static PyObject *reuse_result(PyObject *dtype, int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize) {
  for (int i = 0; i < RECYCLED; i++) {
    PyObject *a = recycled[i];
    if (a == NULL || !unreachable(a)) continue;
    PyObject *d = PyObject_GetAttr(a, str_dtype);
    int same = d == dtype;
    Py_XDECREF(d);
    Py_buffer b;
    if (!same || PyObject_GetBuffer(a, &b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      continue;
    }
    same = has_dims(&b, ndim, shape, itemsize);
    PyBuffer_Release(&b);
    if (same) return Py_NewRef(a);
  }
  return NULL;
}

static void keep_result(PyObject *a) {
  Py_XSETREF(recycled[recycled_next], Py_NewRef(a));
  recycled_next = (recycled_next + 1) % RECYCLED;
}

/* A new result of shape `dims` (a tuple), kept for reuse: numpy.empty when
 * small, 64-byte aligned from small_bytes (TensorFlow aliases an aligned array
 * instead of copying it). */
static PyObject *new_result(PyObject *dims, PyObject *dtype, Py_ssize_t nbytes) {
  PyObject *out = NULL;
  if (nbytes < small_bytes) {
    PyObject *args[2] = {dims, dtype};
    out = PyObject_Vectorcall(np_empty, args, 2, NULL);
  } else {
    PyObject *size = PyLong_FromSsize_t(nbytes + align), *raw = NULL;
    if (size != NULL) {
      PyObject *args[2] = {size, str_uint8};
      raw = PyObject_Vectorcall(np_empty, args, 2, NULL);
      Py_DECREF(size);
    }
    if (raw != NULL) {
      out = aligned_in(raw, dims, dtype);
      Py_DECREF(raw);
    }
  }
  if (out != NULL) keep_result(out);
  return out;
}

/* A fresh result of `ndim` dims `shape`: one handed out before and free again,
 * or new_result; from `pooled_from` bytes on, aligned in result_pool's memory
 * (the Python path's: its cost is nothing beside the bytes). */
static PyObject *fresh_result(PyObject *dtype, int ndim, const Py_ssize_t *shape, Py_ssize_t itemsize,
                              Py_ssize_t pooled_from) {
  Py_ssize_t nbytes = itemsize;
  for (int i = 0; i < ndim; i++) nbytes *= shape[i];
  if (nbytes < pooled_from) {
    PyObject *again = reuse_result(dtype, ndim, shape, itemsize);
    if (again != NULL) return again;
  }
  PyObject *dims = PyTuple_New(ndim);
  if (dims == NULL) return NULL;
  for (int i = 0; i < ndim; i++) {
    PyObject *d = PyLong_FromSsize_t(shape[i]);
    if (d == NULL) {
      Py_DECREF(dims);
      return NULL;
    }
    PyTuple_SET_ITEM(dims, i, d);
  }
  PyObject *out = nbytes >= pooled_from ? PyObject_CallFunctionObjArgs(aligned_empty, dims, dtype, Py_True, NULL)
                                        : new_result(dims, dtype, nbytes);
  Py_DECREF(dims);
  return out;
}

/* The name of this call: the caller's (checked: 1-255 bytes, no NUL), or the
 * next unnamed one of the calling thread's sequence. NULL, without an
 * exception, when not the common call. */
static const char *call_name(const unnamed_t *kind, PyObject *name, PyObject **name_bytes, int *unnamed) {
  if (name == Py_None && PyThread_get_thread_ident() != main_thread) {
    /* another thread's own sequence (request_names.py): made in Python, a
     * refusal (two threads of one name, a pool's thread) raised from there */
    *name_bytes = PyObject_CallNoArgs(kind->thread_name);
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
    PyObject *k = PyIter_Next(kind->counter);
    if (k == NULL) return NULL;
    Py_ssize_t i = PyLong_AsSsize_t(k) % PyTuple_GET_SIZE(kind->names);
    Py_DECREF(k);
    *name_bytes = Py_NewRef(PyTuple_GET_ITEM(kind->names, i));
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

/* One call in flight through the fast path: its buffers, result and name. */
typedef struct {
  Py_buffer in, res;
  PyObject *result;     /* owned: the array returned on success */
  PyObject *name_bytes; /* owned; NULL for a caller's name, which `cname` points into */
  const char *cname;
  int unnamed;
} call_t;

/* The core runs in this process (not shut down, not a fork() child): 1, 0, or -1 (raised). */
static int core_running(void) {
  PyObject *running = PyObject_GetAttr(core_module, str_running);
  if (running == NULL) return -1;
  int up = running == Py_True;
  Py_DECREF(running);
  return up;
}

static void drop_call(call_t *c) {
  PyBuffer_Release(&c->in), PyBuffer_Release(&c->res);
  Py_CLEAR(c->result);
  Py_CLEAR(c->name_bytes);
}

static int claim_call(const unnamed_t *kind, PyObject *name, call_t *c, int like_input);

/* What every kind's common call checks and prepares once its own arguments
 * are known to be common: `array` (an exact ndarray of `dtype`) C-contiguous,
 * `out` none (a fresh result) or an ndarray of the same dtype and shape, not
 * partly overlapping the input, the call's name, and the reaping of earlier
 * unnamed requests. 1: ready, `c` filled; 0: not the common call, nothing
 * held; -1: an error raised, nothing held. */
static int begin_call(const unnamed_t *kind, PyObject *array, PyObject *dtype, PyObject *name, PyObject *out,
                      call_t *c) {
  memset(c, 0, sizeof *c);
  if (PyObject_GetBuffer(array, &c->in, PyBUF_C_CONTIGUOUS) != 0) { /* not C-contiguous: the general path says so */
    PyErr_Clear();
    return 0;
  }
  if (c->in.ndim > LAYOUT_MAX_DIMS) { /* more dimensions than shape_layout takes: the general path */
    PyBuffer_Release(&c->in);
    return 0;
  }
  if (out == Py_None) {
    c->result = fresh_result(dtype, c->in.ndim, c->in.shape, c->in.itemsize, pooled_bytes);
  } else if (Py_TYPE(out) == (PyTypeObject *)ndarray_type) {
    PyObject *out_dtype = PyObject_GetAttr(out, str_dtype);
    int same = out_dtype == NULL ? -1 : PyObject_RichCompareBool(out_dtype, dtype, Py_EQ);
    Py_XDECREF(out_dtype);
    if (same < 0) {
      PyBuffer_Release(&c->in);
      return -1;
    }
    if (same) c->result = Py_NewRef(out);
  }
  if (c->result == NULL) {
    PyBuffer_Release(&c->in);
    return PyErr_Occurred() ? -1 : 0;
  }
  return claim_call(kind, name, c, 1);
}

/* begin_call's second half, once c->in and c->result are held: the result's
 * buffer (writable, C-contiguous, shaped like the input when `like_input`,
 * not partly overlapping it), the call's name and the reaping of earlier
 * unnamed requests. Returns as begin_call; on 0 or -1 `c` is released. */
static int claim_call(const unnamed_t *kind, PyObject *name, call_t *c, int like_input) {
  if (PyObject_GetBuffer(c->result, &c->res, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0 ||
      (like_input && !same_shape(&c->in, &c->res)) || overlaps_partly(&c->in, &c->res)) {
    if (PyErr_Occurred()) PyErr_Clear(); /* read-only, not C-contiguous, overlapping: the general path says so */
    else PyBuffer_Release(&c->res);
    PyBuffer_Release(&c->in);
    Py_CLEAR(c->result);
    return 0;
  }
  c->cname = call_name(kind, name, &c->name_bytes, &c->unnamed);
  if (c->cname == NULL) {
    int raised = PyErr_Occurred() != NULL;
    drop_call(c);
    return raised ? -1 : 0;
  }
  /* rare: dropped requests to reap, or this unnamed name's last use still in flight */
  int settle = PyList_GET_SIZE(orphans) > 0;
  if (!settle && c->unnamed && PyDict_GET_SIZE(in_flight)) settle = PyDict_Contains(in_flight, c->name_bytes);
  if (settle) {
    PyObject *none = settle < 0 ? NULL
                                : PyObject_CallFunctionObjArgs(settle_before, c->name_bytes ? c->name_bytes : name,
                                                               c->unnamed ? Py_True : Py_False, NULL);
    if (none == NULL) {
      drop_call(c);
      return -1;
    }
    Py_DECREF(none);
  }
  return 1;
}

/* The Python that takes over a request the core still holds (finish_slow,
 * gather_uneven, gather_slow) returned `next`; NULL: it raised. A signal's
 * exception (Ctrl+C during the first slice of a wait for a slow peer) is
 * raised as that Python is entered, before a Handle owns the request: the core
 * then wrote the result into `result` after it was freed, and read `array`,
 * whose memory other arrays had taken (crashes, or another array overwritten
 * by the sum). So the request goes to the orphans with both, as a dropped
 * Handle's does, and an unnamed one (`unnamed_name`, else NULL) to the
 * unnamed requests in flight (collectives._orphan_raised). Returns `next`. */
static PyObject *orphan_if_raised(PyObject *next, tnt_handle_t handle, PyObject *array, PyObject *result,
                                  PyObject *unnamed_name) {
  if (next != NULL) return next;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *number = PyLong_FromLongLong((long long)handle);
  PyObject *entry = number ? Py_BuildValue("O(OO)", number, array, result) : NULL;
  if (entry == NULL || PyList_Append(orphans, entry) != 0 ||
      (unnamed_name != NULL && PyDict_SetDefault(in_flight, unnamed_name, number) == NULL))
    PyErr_Clear(); /* the error already raised wins */
  Py_XDECREF(entry);
  Py_XDECREF(number);
  PyErr_Restore(type, value, tb);
  return NULL;
}

/* The call's end once the core returned `rc`: the result, the Python wait
 * for a slow peer (IN_PROGRESS), or the error raised. Releases `c`. */
static PyObject *end_call(call_t *c, tnt_result_t rc, tnt_handle_t handle, PyObject *array) {
  PyBuffer_Release(&c->in), PyBuffer_Release(&c->res);
  if (rc == TNT_SUCCESS) {
    Py_CLEAR(c->name_bytes);
    return c->result; /* the caller's reference */
  }
  PyObject *next = NULL;
  if (rc == TNT_IN_PROGRESS) { /* a slow peer: the Python wait, interruptible, takes over */
    if (c->name_bytes == NULL) c->name_bytes = PyBytes_FromString(c->cname);
    if (c->name_bytes != NULL)
      next = PyObject_CallFunction(finish_slow, "LOOOO", (long long)handle, c->name_bytes,
                                   c->unnamed ? Py_True : Py_False, array, c->result);
    next = orphan_if_raised(next, handle, array, c->result, c->unnamed ? c->name_bytes : NULL);
  } else {
    next = PyObject_CallFunction(check, "i", (int)rc); /* raises */
    if (next != NULL) { /* check() raised nothing: a code it does not know */
      Py_DECREF(next);
      next = NULL;
      PyErr_Format(PyExc_RuntimeError, "the core returned %d", (int)rc);
    }
  }
  Py_CLEAR(c->name_bytes);
  Py_CLEAR(c->result);
  return next;
}

/* The dtype code of an exact ndarray (its dtype, owned, in *dtype), or -1
 * when not the common call (*dtype NULL); -2 with an error raised. */
static long array_code(PyObject *array, PyObject **dtype) {
  *dtype = NULL;
  if (Py_TYPE(array) != (PyTypeObject *)ndarray_type) return -1;
  *dtype = PyObject_GetAttr(array, str_dtype);
  if (*dtype == NULL) return -2;
  long dt = code_in(dtype_codes, *dtype);
  if (dt < 0) Py_CLEAR(*dtype);
  return dt;
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
  if (core_allreduce == NULL || !PyFloat_CheckExact(prescale) || !PyUnicode_CheckExact(op))
    Py_RETURN_NOTIMPLEMENTED;
  int up = core_running();
  if (up <= 0) return up < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  long opcode = code_in(op_codes, op);
  PyObject *dtype;
  long dt = array_code(array, &dtype);
  if (dt == -2) return NULL;
  if (opcode < 0 || dt < 0) {
    Py_XDECREF(dtype);
    Py_RETURN_NOTIMPLEMENTED;
  }
  call_t c;
  int ready = begin_call(&allreduces, array, dtype, name, out, &c);
  Py_DECREF(dtype);
  if (ready <= 0) return ready < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  const int64_t count = c.in.itemsize ? c.in.len / c.in.itemsize : 0;
  const double scale = PyFloat_AS_DOUBLE(prescale);
  const uint64_t layout = shape_layout(c.in.ndim, c.in.shape);
  tnt_handle_t handle = 0;
  tnt_result_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = core_allreduce(c.cname, c.in.buf, c.res.buf, count, (tnt_dtype_t)dt, (tnt_reduce_op_t)opcode, scale, layout,
                      wait_slice_s, &handle);
  Py_END_ALLOW_THREADS
  return end_call(&c, rc, handle, array);
}

/* broadcast(array, root, name, out): root's array in a result (or `out`), or
 * NotImplemented when not the common call (the general path checks `root`
 * and says what is wrong). */
static PyObject *broadcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "broadcast(array, root, name, out) takes 4 arguments");
    return NULL;
  }
  PyObject *array = args[0], *root = args[1], *name = args[2], *out = args[3];
  if (core_broadcast == NULL || core_allreduce == NULL || !PyLong_CheckExact(root)) Py_RETURN_NOTIMPLEMENTED;
  int up = core_running();
  if (up <= 0) return up < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  int overflow = 0;
  long r = PyLong_AsLongAndOverflow(root, &overflow);
  if (overflow || r < 0 || r >= core_size()) Py_RETURN_NOTIMPLEMENTED;
  PyObject *dtype;
  long dt = array_code(array, &dtype);
  if (dt == -2) return NULL;
  if (dt < 0) Py_RETURN_NOTIMPLEMENTED;
  call_t c;
  int ready = begin_call(&broadcasts, array, dtype, name, out, &c);
  Py_DECREF(dtype);
  if (ready <= 0) return ready < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  const int64_t count = c.in.itemsize ? c.in.len / c.in.itemsize : 0;
  const uint64_t layout = shape_layout(c.in.ndim, c.in.shape);
  tnt_handle_t handle = 0;
  tnt_result_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = core_broadcast(c.cname, c.in.buf, c.res.buf, count, (tnt_dtype_t)dt, (int)r, layout, wait_slice_s, &handle);
  Py_END_ALLOW_THREADS
  return end_call(&c, rc, handle, array);
}

/* bind_allgather(tnt_allgather_into, tnt_result_count, tnt_release, counter, names, thread_name,
 *                gather_uneven, gather_slow, gather_pooled_bytes), after bind_broadcast(). */
static PyObject *bind_allgather(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long address, count_address, release_address;
  PyObject *counter, *names, *name_fn, *uneven, *slow;
  Py_ssize_t pooled;
  if (!PyArg_ParseTuple(args, "KKKOO!OOOn", &address, &count_address, &release_address, &counter, &PyTuple_Type,
                        &names, &name_fn, &uneven, &slow, &pooled))
    return NULL;
  if (!address || !count_address || !release_address || PyTuple_GET_SIZE(names) == 0) {
    PyErr_SetString(PyExc_ValueError, "bind_allgather() needs the core's functions and at least one name");
    return NULL;
  }
  Py_XSETREF(allgathers.counter, Py_NewRef(counter));
  Py_XSETREF(allgathers.names, Py_NewRef(names));
  Py_XSETREF(allgathers.thread_name, Py_NewRef(name_fn));
  Py_XSETREF(gather_uneven, Py_NewRef(uneven));
  Py_XSETREF(gather_slow, Py_NewRef(slow));
  gather_pooled_bytes = pooled;
  core_result_count = (result_count_fn)(uintptr_t)count_address;
  core_release = (release_fn)(uintptr_t)release_address;
  core_allgather = (allgather_fn)(uintptr_t)address;
  Py_RETURN_NONE;
}

#define GATHER_MAX_DIMS 32 /* numpy's own limit is 64; more takes the general path */

/* allgather(array, name): every rank's rows in rank order, or NotImplemented
 * when not the common call (an array of a known dtype with at least one row).
 * The result is made for as many rows on every rank, as the general path's
 * (numpy.empty, aligned from small_bytes, from result_pool from
 * gather_pooled_bytes); ranks that give other row counts get the core's
 * result copied out by the general path's code (gather_uneven). 4 ranks on 2
 * cores, 16 KB each: 41 us here against 98 us through the general path. */
static PyObject *allgather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "allgather(array, name) takes 2 arguments");
    return NULL;
  }
  PyObject *array = args[0], *name = args[1];
  if (core_allgather == NULL || core_allreduce == NULL) Py_RETURN_NOTIMPLEMENTED;
  int up = core_running();
  if (up <= 0) return up < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  PyObject *dtype;
  long dt = array_code(array, &dtype);
  if (dt == -2) return NULL;
  if (dt < 0) Py_RETURN_NOTIMPLEMENTED;
  call_t c;
  memset(&c, 0, sizeof c);
  if (PyObject_GetBuffer(array, &c.in, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    Py_DECREF(dtype);
    Py_RETURN_NOTIMPLEMENTED;
  }
  const int size = core_size();
  if (c.in.ndim < 1 || c.in.ndim > GATHER_MAX_DIMS || c.in.len == 0 || size < 1 ||
      c.in.len > PY_SSIZE_T_MAX / size) {
    PyBuffer_Release(&c.in);
    Py_DECREF(dtype);
    Py_RETURN_NOTIMPLEMENTED;
  }
  Py_ssize_t dims[GATHER_MAX_DIMS];
  memcpy(dims, c.in.shape, sizeof *dims * (size_t)c.in.ndim);
  dims[0] *= size;
  c.result = fresh_result(dtype, c.in.ndim, dims, c.in.itemsize, gather_pooled_bytes);
  Py_DECREF(dtype);
  if (c.result == NULL) {
    PyBuffer_Release(&c.in);
    return NULL;
  }
  int ready = claim_call(&allgathers, name, &c, 0);
  if (ready <= 0) return ready < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  const int64_t count = c.in.len / c.in.itemsize, rows = c.in.shape[0];
  const int64_t row_elems = rows ? count / rows : 0, out_count = c.res.len / c.res.itemsize;
  const uint64_t layout = shape_layout(c.in.ndim - 1, c.in.shape + 1); /* its rows' shape */
  tnt_handle_t handle = 0;
  tnt_result_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = core_allgather(c.cname, c.in.buf, count, row_elems, (tnt_dtype_t)dt, c.res.buf, out_count, layout,
                      wait_slice_s, &handle);
  Py_END_ALLOW_THREADS
  if (rc != TNT_SUCCESS && rc != TNT_IN_PROGRESS) return end_call(&c, rc, handle, array);
  PyBuffer_Release(&c.in), PyBuffer_Release(&c.res);
  if (c.name_bytes == NULL) c.name_bytes = PyBytes_FromString(c.cname);
  PyObject *next = NULL;
  int64_t got = -1;
  if (rc == TNT_SUCCESS && core_result_count(handle, &got) == TNT_SUCCESS && got == out_count) {
    core_release(handle); /* the result is in c.result already */
    Py_CLEAR(c.name_bytes);
    return c.result;
  }
  if (rc == TNT_SUCCESS) /* other ranks gave other row counts: copied out of the handle */
    next = PyObject_CallFunction(gather_uneven, "LOO", (long long)handle, array, c.result);
  else if (c.name_bytes != NULL) /* a slow peer: the Python wait, interruptible, takes over */
    next = PyObject_CallFunction(gather_slow, "LOOOO", (long long)handle, c.name_bytes,
                                 c.unnamed ? Py_True : Py_False, array, c.result);
  next = orphan_if_raised(next, handle, array, c.result, c.unnamed ? c.name_bytes : NULL);
  Py_CLEAR(c.name_bytes);
  Py_CLEAR(c.result);
  return next;
}

/* Counter(address): an iterator over 0, 1, 2, ... like itertools.count, whose count is the int64
 * at `address`, a counter of the core (tnt_sequence_counter) that the compiled TensorFlow ops take
 * numbers from too: each next() is one atomic fetch-and-add, so a number is never taken twice,
 * whichever thread or op takes it, with the GIL or without. */
typedef struct {
  PyObject_HEAD int64_t *count;
} counter_object;

static PyObject *counter_next(counter_object *self) {
  return PyLong_FromLongLong(__atomic_fetch_add(self->count, 1, __ATOMIC_SEQ_CST));
}

static PyObject *counter_repr(counter_object *self) {
  return PyUnicode_FromFormat("Counter(%lld)", (long long)__atomic_load_n(self->count, __ATOMIC_SEQ_CST));
}

static PyObject *counter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  unsigned long long address;
  if (!PyArg_ParseTuple(args, "K", &address)) return NULL;
  if (!address || address % sizeof(int64_t)) {
    PyErr_SetString(PyExc_ValueError, "Counter needs the address of an aligned int64 (tnt_sequence_counter)");
    return NULL;
  }
  counter_object *self = (counter_object *)type->tp_alloc(type, 0);
  if (self) self->count = (int64_t *)(uintptr_t)address;
  return (PyObject *)self;
}

static PyTypeObject counter_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarantella._fastpath.Counter",
    .tp_basicsize = sizeof(counter_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counter(address): 0, 1, 2, ... taken atomically from the core's counter at address.",
    .tp_new = counter_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)counter_next,
    .tp_repr = (reprfunc)counter_repr,
};

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Connect the fast path to the running core and the Python path's state."},
    {"bind_broadcast", bind_broadcast, METH_VARARGS, "Connect the broadcast's fast path (after bind())."},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(array, op, name, prescale, out): the result, or NotImplemented when not the common call."},
    {"bind_allgather", bind_allgather, METH_VARARGS, "Connect the allgather's fast path (after bind_broadcast())."},
    {"allgather", (PyCFunction)(void (*)(void))allgather, METH_FASTCALL,
     "allgather(array, name): the result, or NotImplemented when not the common call."},
    {"broadcast", (PyCFunction)(void (*)(void))broadcast, METH_FASTCALL,
     "broadcast(array, root, name, out): the result, or NotImplemented when not the common call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tarantella._fastpath",
                                    "The common calls of tnt.allreduce, broadcast and allgather in C (_fastpath.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
  str_running = PyUnicode_InternFromString("_running");
  str_dtype = PyUnicode_InternFromString("dtype");
  str_uint8 = PyUnicode_InternFromString("uint8");
  str_base = PyUnicode_InternFromString("base");
  if (!str_running || !str_dtype || !str_uint8 || !str_base) return NULL;
  if (PyType_Ready(&counter_type) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&counter_type);
  if (PyModule_AddObject(m, "Counter", (PyObject *)&counter_type) < 0) {
    Py_DECREF(&counter_type);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
