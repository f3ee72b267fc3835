/*
 * IndexBuilder: the sparse offset and time index entries of a segment being written, with the
 * same rule as `LogSegment._index_batch` (an entry once more than index.interval.bytes were
 * written since the previous one), kept as the big-endian bytes of the index files.
 *
 * Part of `_compaction.c`: the filter pass adds each batch it writes.
 */

#ifndef ODRADEK_INDEX_BUILDER_H
#define ODRADEK_INDEX_BUILDER_H

#include "_compaction.h"

#include <stdlib.h>

/* ---------------------------------------------------------------------------------------- */
/* IndexBuilder                                                                              */

typedef struct {
    PyObject_HEAD
    int64_t base_offset;
    int64_t index_interval;
    int64_t max_offset_entries;
    int64_t max_time_entries;
    int64_t position;        /* bytes of the segment so far */
    int64_t bytes_since;     /* since the last index entry */
    int64_t max_timestamp;
    int64_t offset_of_max;
    int64_t next_offset;
    int64_t last_time_entry; /* timestamp of the last time index entry, -1: none */
    uint8_t *offsets;        /* offset index file bytes */
    size_t offsets_len, offsets_cap;
    uint8_t *times;          /* time index file bytes */
    size_t times_len, times_cap;
    int busy;
    int failed;              /* an allocation failed: the builder must not be used */
} IndexBuilder;

static int grow(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap : 1024;
    while (cap2 < need)
        cap2 *= 2;
    uint8_t *bigger = realloc(*buf, cap2);
    if (bigger == NULL)
        return -1;
    *buf = bigger;
    *cap = cap2;
    return 0;
}

static void time_entry(IndexBuilder *b, int force) {
    if (b->max_timestamp < 0 || (b->last_time_entry >= 0 && b->max_timestamp <= b->last_time_entry))
        return;
    if (!force && (int64_t)(b->times_len / 12) >= b->max_time_entries)
        return;
    if (grow(&b->times, &b->times_cap, b->times_len + 12) < 0) {
        b->failed = 1;
        return;
    }
    put64(b->times + b->times_len, (uint64_t)b->max_timestamp);
    put32(b->times + b->times_len + 8, (uint32_t)(b->offset_of_max - b->base_offset));
    b->times_len += 12;
    b->last_time_entry = b->max_timestamp;
}

/* Mirrors LogSegment._index_batch: the entry, when one is due, is the batch being added. */
static void index_add(IndexBuilder *b, int64_t last_offset, int64_t size, int64_t max_timestamp) {
    if (max_timestamp > b->max_timestamp) {
        b->max_timestamp = max_timestamp;
        b->offset_of_max = last_offset;
    }
    if (b->bytes_since > b->index_interval) {
        if ((int64_t)(b->offsets_len / 8) < b->max_offset_entries) {
            if (grow(&b->offsets, &b->offsets_cap, b->offsets_len + 8) < 0) {
                b->failed = 1;
                return;
            }
            put32(b->offsets + b->offsets_len, (uint32_t)(last_offset - b->base_offset));
            put32(b->offsets + b->offsets_len + 4, (uint32_t)b->position);
            b->offsets_len += 8;
        }
        time_entry(b, 0);
        b->bytes_since = 0;
    }
    b->bytes_since += size;
    b->position += size;
    b->next_offset = last_offset + 1;
}

static PyObject *IndexBuilder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"base_offset", "index_interval_bytes", "max_offset_entries",
                             "max_time_entries", NULL};
    long long base_offset, interval, max_offset_entries, max_time_entries;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLLL:IndexBuilder", kwlist, &base_offset,
                                     &interval, &max_offset_entries, &max_time_entries))
        return NULL;
    IndexBuilder *b = (IndexBuilder *)type->tp_alloc(type, 0);
    if (b == NULL)
        return NULL;
    b->base_offset = base_offset;
    b->index_interval = interval;
    b->max_offset_entries = max_offset_entries;
    b->max_time_entries = max_time_entries;
    b->max_timestamp = -1;
    b->offset_of_max = base_offset;
    b->next_offset = base_offset;
    b->last_time_entry = -1;
    return (PyObject *)b;
}

static void IndexBuilder_dealloc(IndexBuilder *b) {
    free(b->offsets);
    free(b->times);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int builder_ok(IndexBuilder *b) {
    if (b->failed) {
        PyErr_NoMemory();
        return 0;
    }
    return 1;
}

static PyObject *IndexBuilder_add(IndexBuilder *b, PyObject *args) {
    long long last_offset, size, max_timestamp;
    if (!PyArg_ParseTuple(args, "LLL:add", &last_offset, &size, &max_timestamp))
        return NULL;
    if (acquire(&b->busy) < 0)
        return NULL;
    index_add(b, last_offset, size, max_timestamp);
    b->busy = 0;
    if (!builder_ok(b))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *IndexBuilder_finish(IndexBuilder *b, PyObject *noargs) {
    (void)noargs;
    if (acquire(&b->busy) < 0)
        return NULL;
    time_entry(b, 1); /* the final entry: the segment's largest timestamp */
    b->busy = 0;
    if (!builder_ok(b))
        return NULL;
    return Py_BuildValue("(y#y#)", b->offsets ? (const char *)b->offsets : "",
                         (Py_ssize_t)b->offsets_len, b->times ? (const char *)b->times : "",
                         (Py_ssize_t)b->times_len);
}

#define BUILDER_GETTER(name)                                                               \
    static PyObject *IndexBuilder_get_##name(IndexBuilder *b, void *closure) {             \
        (void)closure;                                                                     \
        return PyLong_FromLongLong((long long)b->name);                                    \
    }
BUILDER_GETTER(position)
BUILDER_GETTER(next_offset)
BUILDER_GETTER(max_timestamp)
BUILDER_GETTER(offset_of_max)

static PyGetSetDef IndexBuilder_getset[] = {
    {"position", (getter)IndexBuilder_get_position, NULL, "Bytes of the segment so far.", NULL},
    {"next_offset", (getter)IndexBuilder_get_next_offset, NULL,
     "The offset after the last batch added.", NULL},
    {"max_timestamp", (getter)IndexBuilder_get_max_timestamp, NULL,
     "The largest batch maxTimestamp added (-1: none).", NULL},
    {"offset_of_max_timestamp", (getter)IndexBuilder_get_offset_of_max, NULL,
     "The last offset of the batch where max_timestamp was reached.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef IndexBuilder_methods[] = {
    {"add", (PyCFunction)IndexBuilder_add, METH_VARARGS,
     "add(last_offset, size, max_timestamp): a batch written at `position`."},
    {"finish", (PyCFunction)IndexBuilder_finish, METH_NOARGS,
     "finish() -> (offset index bytes, time index bytes), with the final time index entry."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IndexBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "odradek.protocol._compaction.IndexBuilder",
    .tp_basicsize = sizeof(IndexBuilder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "IndexBuilder(base_offset, index_interval_bytes, max_offset_entries, "
              "max_time_entries): a segment's sparse index entries as they are written.",
    .tp_new = IndexBuilder_new,
    .tp_dealloc = (destructor)IndexBuilder_dealloc,
    .tp_methods = IndexBuilder_methods,
    .tp_getset = IndexBuilder_getset,
};

#endif
