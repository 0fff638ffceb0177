/* The hot path's trace record, packed in one C call (slime_actors/traces/writer.py's rec_py is its
 * fallback).
 *
 * rec(ev, t, header, body)       -> msgpack of [ev, t, header, body, len(body), nil, nil, nil]
 * rec(ev, t, header, body, dur)  -> msgpack of [ev, t, header, body, len(body), nil, nil, nil, dur]
 *
 * byte for byte what msgpack.Packer(use_bin_type=True).pack of that tuple gives (tests/test_fastrec.py checks it):
 * ev a str of < 32 ASCII characters (fixstr), header and body bytes or any other contiguous buffer (bin 8/16/32),
 * t and dur ints in [0, 2**64) (the smallest unsigned encoding).  Anything else raises TypeError or ValueError.
 * It saves the tuple and msgpack's generic dispatch: ~56 ns a record against ~238 ns on the project VM
 * (docs/performance.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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

static PyObject *rec(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "rec(ev, t, header, body[, dur]) takes 4 or 5 arguments");
        return NULL;
    }
    PyObject *ev = args[0];
    if (!PyUnicode_CheckExact(ev) || !PyUnicode_IS_ASCII(ev) || PyUnicode_GET_LENGTH(ev) >= 32) {
        PyErr_SetString(PyExc_TypeError, "ev must be an ASCII str of fewer than 32 characters");
        return NULL;
    }
    unsigned long long t, dur = 0;
    if (get_uint(args[1], "t", &t) < 0) return NULL;
    if (nargs == 5 && get_uint(args[4], "dur", &dur) < 0) return NULL;
    Py_buffer h, b;
    if (get_buffer(args[2], "header", &h) < 0) return NULL;
    if (get_buffer(args[3], "body", &b) < 0) {
        PyBuffer_Release(&h);
        return NULL;
    }
    PyObject *out = NULL;
    if (h.len > 0xffffffffLL || b.len > 0xffffffffLL) {
        PyErr_SetString(PyExc_ValueError, "header or body over 4 GiB");
        goto done;
    }
    Py_ssize_t ne = PyUnicode_GET_LENGTH(ev);
    Py_ssize_t size = 1 + 1 + ne + uint_size(t) + bin_size(h.len) + bin_size(b.len)
                      + uint_size((unsigned long long)b.len) + 3 + (nargs == 5 ? uint_size(dur) : 0);
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) goto done;
    char *p = PyBytes_AS_STRING(out);
    *p++ = (char)(0x90 | (nargs == 5 ? 9 : 8));
    *p++ = (char)(0xa0 | ne);
    memcpy(p, PyUnicode_DATA(ev), (size_t)ne);
    p += ne;
    p = put_uint(p, t);
    p = put_bin(p, (const char *)h.buf, h.len);
    p = put_bin(p, (const char *)b.buf, b.len);
    p = put_uint(p, (unsigned long long)b.len);
    *p++ = (char)0xc0;
    *p++ = (char)0xc0;
    *p++ = (char)0xc0;
    if (nargs == 5) put_uint(p, dur);
done:
    PyBuffer_Release(&h);
    PyBuffer_Release(&b);
    return out;
}

static PyMethodDef methods[] = {
    {"rec", (PyCFunction)(void (*)(void))rec, METH_FASTCALL,
     "rec(ev, t, header, body[, dur]) -> bytes: a trace record packed as msgpack (see the module's source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastrec", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastrec(void) { return PyModule_Create(&module); }
