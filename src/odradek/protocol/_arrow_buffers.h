/*
 * The buffers of Arrow columns as `_encoder.c` reads them, borrowed from the Python objects
 * pyarrow hands over (`pa.Array.buffers()`), checked once against the rows they must hold:
 *
 *   bincol_t   binary or string: validity bits (LSB first) or none, int32 offsets, data
 *   headers_t  list<struct<key: string, value: binary>>: list validity, list offsets (which
 *              index the key and value columns), and those two columns as bincol_t
 *   intcol_t   int32 values with validity bits or none
 *
 * Each `*_parse` fills its struct from a tuple (see `_encoder.c`'s module comment) or leaves it
 * absent for None, and raises ValueError (returning -1) when a buffer is shorter than its
 * offsets say; `*_release` gives the buffers back. Reading (`bincol_get`, `bit_set`) needs no
 * Python object, so it may run with the GIL released while the buffers are held.
 */

#ifndef ODRADEK_ARROW_BUFFERS_H
#define ODRADEK_ARROW_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int present;
    Py_buffer validity, offsets, data;
    int has_validity, has_data;
    Py_ssize_t offset;
} bincol_t;

static inline int bit_set(const Py_buffer *b, Py_ssize_t i) {
    return (((const uint8_t *)b->buf)[i >> 3] >> (i & 7)) & 1;
}

/* The bytes of row i (offset applied): length -1 for null. */
static inline int32_t bincol_get(const bincol_t *c, Py_ssize_t i, const uint8_t **p) {
    if (!c->present)
        return -1;
    Py_ssize_t row = c->offset + i;
    if (c->has_validity && !bit_set(&c->validity, row))
        return -1;
    const int32_t *offsets = (const int32_t *)c->offsets.buf;
    *p = c->has_data ? (const uint8_t *)c->data.buf + offsets[row] : (const uint8_t *)"";
    return offsets[row + 1] - offsets[row];
}

static void bincol_release(bincol_t *c) {
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    if (c->present)
        PyBuffer_Release(&c->offsets);
    if (c->has_data)
        PyBuffer_Release(&c->data);
    c->present = c->has_validity = c->has_data = 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int *has) {
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    *has = 1;
    return 0;
}

/* Parse a column tuple for `rows` rows; checks that the buffers hold what the offsets say. */
static int bincol_parse(PyObject *spec, Py_ssize_t rows, bincol_t *c, const char *name) {
    memset(c, 0, sizeof(*c));
    if (spec == Py_None)
        return 0;
    PyObject *validity, *offsets, *data;
    if (!PyArg_ParseTuple(spec, "OOOn", &validity, &offsets, &data, &c->offset))
        return -1;
    int has_offsets = 0;
    if (get_buffer(validity, &c->validity, &c->has_validity) < 0 ||
        get_buffer(offsets, &c->offsets, &has_offsets) < 0 ||
        get_buffer(data, &c->data, &c->has_data) < 0)
        goto fail;
    c->present = has_offsets;
    if (!has_offsets) {
        PyErr_Format(PyExc_ValueError, "%s: no offsets buffer", name);
        goto fail;
    }
    if (c->offset < 0 || c->offsets.len < (c->offset + rows + 1) * 4 ||
        (c->has_validity && c->validity.len * 8 < c->offset + rows)) {
        PyErr_Format(PyExc_ValueError, "%s: buffers shorter than %zd rows", name, rows);
        goto fail;
    }
    const int32_t *o = (const int32_t *)c->offsets.buf;
    Py_ssize_t data_len = c->has_data ? c->data.len : 0;
    for (Py_ssize_t i = c->offset; i < c->offset + rows; i++)
        if (o[i] < 0 || o[i + 1] < o[i] || o[i + 1] > data_len) {
            PyErr_Format(PyExc_ValueError, "%s: row %zd's offsets are outside its data", name,
                         i - c->offset);
            goto fail;
        }
    return 0;
fail:
    c->present = c->present || has_offsets;
    bincol_release(c);
    return -1;
}

typedef struct {
    int present, has_validity;
    Py_buffer validity, offsets;
    Py_ssize_t offset;
    bincol_t key, value;
} headers_t;

static void headers_release(headers_t *h) {
    if (h->has_validity)
        PyBuffer_Release(&h->validity);
    if (h->present)
        PyBuffer_Release(&h->offsets);
    bincol_release(&h->key);
    bincol_release(&h->value);
    h->present = h->has_validity = 0;
}

static int headers_parse(PyObject *spec, Py_ssize_t rows, headers_t *h) {
    memset(h, 0, sizeof(*h));
    if (spec == Py_None)
        return 0;
    PyObject *validity, *offsets, *key, *value;
    if (!PyArg_ParseTuple(spec, "OOnOO", &validity, &offsets, &h->offset, &key, &value))
        return -1;
    int has_offsets = 0;
    if (get_buffer(validity, &h->validity, &h->has_validity) < 0 ||
        get_buffer(offsets, &h->offsets, &has_offsets) < 0)
        goto fail;
    h->present = has_offsets;
    if (!has_offsets || h->offset < 0 || h->offsets.len < (h->offset + rows + 1) * 4 ||
        (h->has_validity && h->validity.len * 8 < h->offset + rows)) {
        PyErr_SetString(PyExc_ValueError, "headers: buffers shorter than the rows");
        goto fail;
    }
    const int32_t *o = (const int32_t *)h->offsets.buf;
    Py_ssize_t entries = o[h->offset + rows];
    for (Py_ssize_t i = h->offset; i < h->offset + rows; i++)
        if (o[i] < 0 || o[i + 1] < o[i]) {
            PyErr_Format(PyExc_ValueError, "headers: row %zd's list offsets", i - h->offset);
            goto fail;
        }
    /* The entries' columns are parsed for every entry up to the last one a row uses. */
    if (bincol_parse(key, entries, &h->key, "header keys") < 0 ||
        bincol_parse(value, entries, &h->value, "header values") < 0)
        goto fail;
    if (!h->key.present) {
        PyErr_SetString(PyExc_ValueError, "headers: keys may not be null");
        goto fail;
    }
    return 0;
fail:
    h->present = h->present || has_offsets;
    headers_release(h);
    return -1;
}

typedef struct {
    int present, has_validity;
    Py_buffer validity, values;
    Py_ssize_t offset;
} intcol_t;

static void intcol_release(intcol_t *c) {
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    if (c->present)
        PyBuffer_Release(&c->values);
    c->present = c->has_validity = 0;
}

static int intcol_parse(PyObject *spec, Py_ssize_t rows, intcol_t *c) {
    memset(c, 0, sizeof(*c));
    if (spec == Py_None)
        return 0;
    PyObject *validity, *values;
    if (!PyArg_ParseTuple(spec, "OOn", &validity, &values, &c->offset))
        return -1;
    if (get_buffer(validity, &c->validity, &c->has_validity) < 0 ||
        get_buffer(values, &c->values, &c->present) < 0)
        goto fail;
    if (!c->present || c->offset < 0 || c->values.len < (c->offset + rows) * 4 ||
        (c->has_validity && c->validity.len * 8 < c->offset + rows)) {
        PyErr_SetString(PyExc_ValueError, "partition: buffers shorter than the rows");
        goto fail;
    }
    return 0;
fail:
    intcol_release(c);
    return -1;
}

#endif
