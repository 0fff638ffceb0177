/* The hot path's trace record, packed in one C call (slime_actors/traces/writer.py's rec_py and PyRecorder are
 * the fallback).
 *
 * rec(ev, t, header, body)        -> msgpack of [ev, t, header, body, len(body), nil, nil, nil]
 * rec(ev, t, header, body, dur)   -> msgpack of [ev, t, header, body, len(body), nil, nil, nil, dur]
 * rec(ev, t, header, body, None)  -> the same with dur = now - t, read here from time.time_ns's clock
 *                                    (CLOCK_REALTIME; 0 if it stepped back): a record of something that ends now,
 *                                    for one clock read and one call fewer on the event loop
 *
 * byte for byte what msgpack.Packer(use_bin_type=True).pack of that tuple gives (tests/test_fastrec.py checks it):
 * ev a str of < 32 ASCII characters (fixstr), header and body bytes or any other contiguous buffer (bin 8/16/32),
 * t and dur ints in [0, 2**64) (the smallest unsigned encoding).  Anything else raises TypeError or ValueError.
 * It saves the tuple and msgpack's generic dispatch: ~56 ns a record against ~238 ns on the project VM
 * (docs/performance.md).
 *
 * Recorder() is a trace writer's queue: r.rec(...) packs the same bytes straight onto the end of one growing
 * buffer (no bytes object, no queue entry per record), r.put(item) queues anything else -- in order: the records
 * packed before it are cut off into one bytes item first -- and r.take() -> (items, nrecords) hands everything
 * queued so far to the writer thread and starts afresh. Each call runs under the GIL and calls no Python code
 * while the buffer is being changed, so the event loop thread and the writer thread may call them at any time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <time.h>

static Py_ssize_t uint_size(unsigned long long v) {
    if (v < 128) return 1;
    if (v < 256) return 2;
    if (v < 65536) return 3;
    if (v < 4294967296ULL) return 5;
    return 9;
}

static char *put_uint(char *p, unsigned long long v) {
    if (v < 128) {
        *p++ = (char)v;
    } else if (v < 256) {
        *p++ = (char)0xcc;
        *p++ = (char)v;
    } else if (v < 65536) {
        *p++ = (char)0xcd;
        *p++ = (char)(v >> 8);
        *p++ = (char)v;
    } else if (v < 4294967296ULL) {
        *p++ = (char)0xce;
        for (int s = 24; s >= 0; s -= 8) *p++ = (char)(v >> s);
    } else {
        *p++ = (char)0xcf;
        for (int s = 56; s >= 0; s -= 8) *p++ = (char)(v >> s);
    }
    return p;
}

static Py_ssize_t bin_size(Py_ssize_t n) {
    return n + (n < 256 ? 2 : n < 65536 ? 3 : 5);
}

static char *put_bin(char *p, const char *data, Py_ssize_t n) {
    if (n < 256) {
        *p++ = (char)0xc4;
        *p++ = (char)n;
    } else if (n < 65536) {
        *p++ = (char)0xc5;
        *p++ = (char)(n >> 8);
        *p++ = (char)n;
    } else {
        *p++ = (char)0xc6;
        for (int s = 24; s >= 0; s -= 8) *p++ = (char)((unsigned long long)n >> s);
    }
    memcpy(p, data, (size_t)n);
    return p + n;
}

static int get_uint(PyObject *o, const char *what, unsigned long long *out) {
    if (!PyLong_CheckExact(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", what);
        return -1;
    }
    *out = v;
    return 0;
}

static int get_buffer(PyObject *o, const char *what, Py_buffer *view) {
    if (PyObject_GetBuffer(o, view, PyBUF_SIMPLE) < 0) {  /* bytes, or any contiguous buffer */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be bytes-like, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    return 0;
}

/* Checks rec's arguments; on success h and b are held (release them) and *size is the record's length. */
static int rec_args(PyObject *const *args, Py_ssize_t nargs, unsigned long long *t, unsigned long long *dur,
                    Py_buffer *h, Py_buffer *b, Py_ssize_t *size) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "rec(ev, t, header, body[, dur]) takes 4 or 5 arguments");
        return -1;
    }
    PyObject *ev = args[0];
    if (!PyUnicode_CheckExact(ev) || !PyUnicode_IS_ASCII(ev) || PyUnicode_GET_LENGTH(ev) >= 32) {
        PyErr_SetString(PyExc_TypeError, "ev must be an ASCII str of fewer than 32 characters");
        return -1;
    }
    *dur = 0;
    if (get_uint(args[1], "t", t) < 0) return -1;
    if (nargs == 5 && args[4] == Py_None) { /* dur: from t until now, on time.time_ns's clock */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long now = (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
        *dur = now > *t ? now - *t : 0;
    } else if (nargs == 5 && get_uint(args[4], "dur", dur) < 0) return -1;
    if (get_buffer(args[2], "header", h) < 0) return -1;
    if (get_buffer(args[3], "body", b) < 0) {
        PyBuffer_Release(h);
        return -1;
    }
    if (h->len > 0xffffffffLL || b->len > 0xffffffffLL) {
        PyErr_SetString(PyExc_ValueError, "header or body over 4 GiB");
        PyBuffer_Release(h);
        PyBuffer_Release(b);
        return -1;
    }
    *size = 1 + 1 + PyUnicode_GET_LENGTH(ev) + uint_size(*t) + bin_size(h->len) + bin_size(b->len)
            + uint_size((unsigned long long)b->len) + 3 + (nargs == 5 ? uint_size(*dur) : 0);
    return 0;
}

/* Writes the record checked by rec_args at p (size bytes). */
static void rec_put(char *p, PyObject *const *args, Py_ssize_t nargs, unsigned long long t, unsigned long long dur,
                    const Py_buffer *h, const Py_buffer *b) {
    PyObject *ev = args[0];
    Py_ssize_t ne = PyUnicode_GET_LENGTH(ev);
    *p++ = (char)(0x90 | (nargs == 5 ? 9 : 8));
    *p++ = (char)(0xa0 | ne);
    memcpy(p, PyUnicode_DATA(ev), (size_t)ne);
    p += ne;
    p = put_uint(p, t);
    p = put_bin(p, (const char *)h->buf, h->len);
    p = put_bin(p, (const char *)b->buf, b->len);
    p = put_uint(p, (unsigned long long)b->len);
    *p++ = (char)0xc0;
    *p++ = (char)0xc0;
    *p++ = (char)0xc0;
    if (nargs == 5) put_uint(p, dur);
}

static PyObject *rec(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    unsigned long long t, dur;
    Py_buffer h, b;
    Py_ssize_t size;
    if (rec_args(args, nargs, &t, &dur, &h, &b, &size) < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out != NULL) rec_put(PyBytes_AS_STRING(out), args, nargs, t, dur, &h, &b);
    PyBuffer_Release(&h);
    PyBuffer_Release(&b);
    return out;
}

/* ---- Recorder ------------------------------------------------------------------------------------------------- */
#define BUF_START (64 * 1024)
#define BUF_KEEP (4 * 1024 * 1024) /* a buffer grown past this is given back when taken */

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len, cap;
    Py_ssize_t nbuf;   /* records packed in buf */
    PyObject *items;   /* list: what is queued ahead of buf */
    Py_ssize_t nitems; /* records in items (a cut-off buffer is one item of nbuf records) */
} Recorder;

/* Moves buf's records onto the end of items as one bytes item. */
static int cut(Recorder *r) {
    if (r->items == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Recorder has been cleared");
        return -1;
    }
    if (r->len == 0) return 0;
    PyObject *chunk = PyBytes_FromStringAndSize(r->buf, r->len);
    if (chunk == NULL) return -1;
    int rc = PyList_Append(r->items, chunk);
    Py_DECREF(chunk);
    if (rc < 0) return -1;
    r->nitems += r->nbuf;
    r->len = 0;
    r->nbuf = 0;
    return 0;
}

static PyObject *Recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Recorder() takes no arguments");
        return NULL;
    }
    Recorder *r = (Recorder *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    r->items = PyList_New(0);
    r->buf = PyMem_Malloc(BUF_START);
    if (r->items == NULL || r->buf == NULL) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    r->cap = BUF_START;
    return (PyObject *)r;
}

static int Recorder_traverse(Recorder *r, visitproc visit, void *arg) {
    Py_VISIT(r->items);
    return 0;
}

static int Recorder_clear(Recorder *r) {
    Py_CLEAR(r->items);
    return 0;
}

static void Recorder_dealloc(Recorder *r) {
    PyObject_GC_UnTrack(r);
    Recorder_clear(r);
    PyMem_Free(r->buf);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Recorder_rec(Recorder *r, PyObject *const *args, Py_ssize_t nargs) {
    unsigned long long t, dur;
    Py_buffer h, b;
    Py_ssize_t size;
    if (rec_args(args, nargs, &t, &dur, &h, &b, &size) < 0) return NULL;
    if (r->len + size > r->cap) {
        Py_ssize_t cap = r->cap;
        while (r->len + size > cap) cap *= 2;
        char *buf = PyMem_Realloc(r->buf, (size_t)cap);
        if (buf == NULL) {
            PyBuffer_Release(&h);
            PyBuffer_Release(&b);
            return PyErr_NoMemory();
        }
        r->buf = buf;
        r->cap = cap;
    }
    rec_put(r->buf + r->len, args, nargs, t, dur, &h, &b);
    r->len += size;
    r->nbuf += 1;
    PyBuffer_Release(&h);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

static PyObject *Recorder_put(Recorder *r, PyObject *item) {
    if (cut(r) < 0 || PyList_Append(r->items, item) < 0) return NULL;
    r->nitems += 1;
    Py_RETURN_NONE;
}

static PyObject *Recorder_take(Recorder *r, PyObject *unused) {
    (void)unused;
    /* The list and the tuple first: their allocation may run the garbage collector, and so finalizers that record
     * something. From the cut on nothing can run Python code until the queue has been swapped. */
    PyObject *fresh = PyList_New(0);
    PyObject *out = fresh != NULL ? PyTuple_New(2) : NULL;
    PyObject *n = NULL;
    if (out == NULL || cut(r) < 0 || (n = PyLong_FromSsize_t(r->nitems)) == NULL) { /* nothing taken */
        Py_XDECREF(fresh);
        Py_XDECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, r->items);
    PyTuple_SET_ITEM(out, 1, n);
    r->items = fresh;
    r->nitems = 0;
    if (r->cap > BUF_KEEP) {
        char *buf = PyMem_Realloc(r->buf, BUF_START);
        if (buf != NULL) {
            r->buf = buf;
            r->cap = BUF_START;
        }
    }
    return out;
}

static PyObject *Recorder_pending(Recorder *r, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(r->nitems + r->nbuf);
}

static PyMethodDef Recorder_methods[] = {
    {"rec", (PyCFunction)(void (*)(void))Recorder_rec, METH_FASTCALL,
     "rec(ev, t, header, body[, dur or None]) -> None: pack a record (as _fastrec.rec does) onto the queue"},
    {"put", (PyCFunction)Recorder_put, METH_O, "put(item) -> None: queue any other item, after what is queued"},
    {"take", (PyCFunction)Recorder_take, METH_NOARGS,
     "take() -> (items, nrecords): everything queued, in order (packed records as bytes items), and the queue empty"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Recorder_getset[] = {
    {"pending", (getter)Recorder_pending, NULL, "records queued and not yet taken", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slime_actors.traces._fastrec.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A trace writer's queue of records (see the module's source)",
    .tp_new = Recorder_new,
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_traverse = (traverseproc)Recorder_traverse,
    .tp_clear = (inquiry)Recorder_clear,
    .tp_methods = Recorder_methods,
    .tp_getset = Recorder_getset,
};

static PyMethodDef methods[] = {
    {"rec", (PyCFunction)(void (*)(void))rec, METH_FASTCALL,
     "rec(ev, t, header, body[, dur or None]) -> bytes: a trace record packed as msgpack (see the module's source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastrec", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastrec(void) {
    if (PyType_Ready(&RecorderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
