/*
 * odradek.protocol._encoder: Arrow columns into RecordBatch v2 batches, one per partition, with
 * no Python object per record (the write half of `_arrow.c`; the Python side is
 * odradek.spark.produce).
 *
 * `Accumulator(partitions, batch_bytes, sticky, codec, compress)` owns one growing batch per
 * partition of one topic. `append(rows, key, value, headers, partition, timestamp_ms)` takes
 * the buffers of one Arrow record batch and appends each row as a record to the batch of its
 * partition:
 *
 *   - the row's `partition` column when it is given and not null (it must lie in
 *     [0, partitions): otherwise nothing of the call is appended and ValueError names the row);
 *   - else, for a non-null key, Kafka's default partitioner: toPositive(murmur2(key)) %
 *     partitions, with `murmur2` as Kafka's `Utils.murmur2` (seed 0x9747b28c) and toPositive
 *     clearing the sign bit -- the partition the Java client (so Spark's Kafka sink) and
 *     librdkafka's `murmur2_random` partitioner choose;
 *   - else (no key) the sticky partition: all keyless rows go to one partition until its batch
 *     is sealed, then to the next one in turn (the Java client's sticky partitioner does the
 *     same with a random next partition).
 *
 * A batch is sealed once its records reach `batch_bytes` (so a batch stays near that size, below
 * a broker's message.max.bytes, whatever the size of the Arrow batches), or by `seal_all()`.
 * `take()` returns the sealed batches as [(partition, records_count, batch bytes)], ready for a
 * Produce request: base offset 0, CreateTime, no producer id, the CRC32C filled in. With a codec
 * (1 gzip, 2 snappy, 3 lz4, 4 zstd) the records section is handed to `compress(view)` (the
 * project's codecs, one call per batch) and the result framed. Records hold the call's
 * `timestamp_ms` (a delta from the batch's first record), offset deltas 0, 1, ...
 *
 * Column arguments, as pyarrow gives its buffers (offsets int32, validity bitmaps LSB first):
 *
 *   key, value   None (every row null) or (validity or None, offsets, data or None, offset)
 *   headers      None or (validity or None, list offsets, offset, key column, value column):
 *                list offsets index the key and value columns, themselves as above
 *   partition    None or (validity or None, int32 values, offset)
 *
 * Buffers are checked against the offsets they must hold before the walk; the records of a row
 * are the bytes the columns hold (header keys are taken as given: Arrow strings are UTF-8).
 *
 * Thread safety: an Accumulator belongs to one thread; `append` runs with the GIL released and
 * touches only the accumulator and the callers' buffers, which it holds while it runs.
 */

#include "_arrow_buffers.h"
#include "_crc32c.h"
#include "_big_endian.h"
#include "_growable.h"
#include "_murmur2.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#define BATCH_HEADER_SIZE 61

typedef struct {
    uint8_t *data;
    size_t len, cap;
} buf_t;

static inline int buf_reserve(buf_t *b, size_t extra) {
    return grow_reserve(&b->data, &b->cap, b->len, extra, 65536);
}

/* Zig-zag varints (Kafka's ByteUtils.writeVarint / writeVarlong): same bytes for both. */
static inline size_t varint_size(int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    size_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *p, int64_t value) {
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (z >= 0x80) {
        *p++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* Accumulator                                                                               */

typedef struct {
    buf_t buf; /* BATCH_HEADER_SIZE bytes left for the header, then the records */
    int32_t count;
    int64_t base_timestamp, max_timestamp;
} batch_t;

typedef struct {
    int32_t partition;
    batch_t batch;
} sealed_t;

typedef struct {
    PyObject_HEAD
    int32_t partitions;
    size_t batch_bytes;
    int32_t sticky;
    int codec;
    PyObject *compress;
    batch_t *open;                 /* one per partition */
    sealed_t *sealed;
    size_t sealed_len, sealed_cap;
    buf_t *spare;                  /* emptied buffers, reused (fresh large allocations are slow) */
    size_t spare_len, spare_cap;
} acc_t;

static void batch_start(acc_t *a, batch_t *b) {
    memset(b, 0, sizeof(*b));
    if (a->spare_len > 0)
        b->buf = a->spare[--a->spare_len];
    b->buf.len = BATCH_HEADER_SIZE;
}

static int batch_ensure(acc_t *a, batch_t *b) {
    if (b->buf.len == 0) {
        batch_start(a, b);
        return buf_reserve(&b->buf, BATCH_HEADER_SIZE);
    }
    return 0;
}

static int seal(acc_t *a, int32_t partition) {
    batch_t *b = &a->open[partition];
    if (b->count == 0)
        return 0;
    if (a->sealed_len == a->sealed_cap) {
        size_t cap = a->sealed_cap ? a->sealed_cap * 2 : 16;
        sealed_t *s = realloc(a->sealed, cap * sizeof(*s));
        if (s == NULL)
            return -1;
        a->sealed = s;
        a->sealed_cap = cap;
    }
    a->sealed[a->sealed_len].partition = partition;
    a->sealed[a->sealed_len].batch = *b;
    a->sealed_len++;
    memset(b, 0, sizeof(*b));
    if (partition == a->sticky)
        a->sticky = (a->sticky + 1) % a->partitions;
    return 0;
}

static void give_back(acc_t *a, buf_t *buf) {
    if (a->spare_len == a->spare_cap) {
        size_t cap = a->spare_cap ? a->spare_cap * 2 : 8;
        buf_t *s = realloc(a->spare, cap * sizeof(*s));
        if (s == NULL) {
            free(buf->data);
            return;
        }
        a->spare = s;
        a->spare_cap = cap;
    }
    buf->len = 0;
    a->spare[a->spare_len++] = *buf;
}

/* Append one record; -1 out of memory. */
static int put_record(acc_t *a, int32_t partition, int64_t timestamp, const uint8_t *key,
                      int32_t key_len, const uint8_t *value, int32_t value_len,
                      const headers_t *h, Py_ssize_t row) {
    batch_t *b = &a->open[partition];
    if (batch_ensure(a, b) < 0)
        return -1;
    if (b->count == 0)
        b->base_timestamp = b->max_timestamp = timestamp;
    if (timestamp > b->max_timestamp)
        b->max_timestamp = timestamp;
    int64_t ts_delta = timestamp - b->base_timestamp;
    size_t size = 1 + varint_size(ts_delta) + varint_size(b->count) + varint_size(key_len) +
                  (key_len > 0 ? (size_t)key_len : 0) + varint_size(value_len) +
                  (value_len > 0 ? (size_t)value_len : 0);
    int32_t first = 0, last = 0;
    if (h->present && !(h->has_validity && !bit_set(&h->validity, h->offset + row))) {
        const int32_t *o = (const int32_t *)h->offsets.buf;
        first = o[h->offset + row];
        last = o[h->offset + row + 1];
    }
    size += varint_size(last - first);
    for (int32_t e = first; e < last; e++) {
        const uint8_t *p;
        int32_t k = bincol_get(&h->key, e, &p), v = bincol_get(&h->value, e, &p);
        if (k < 0)
            k = 0; /* refused before the walk: see append */
        size += varint_size(k) + (size_t)k + varint_size(v) + (v > 0 ? (size_t)v : 0);
    }
    if (buf_reserve(&b->buf, size + 5) < 0)
        return -1;
    uint8_t *p = b->buf.data + b->buf.len;
    p = put_varint(p, (int64_t)size);
    *p++ = 0; /* record attributes: unused */
    p = put_varint(p, ts_delta);
    p = put_varint(p, b->count);
    p = put_varint(p, key_len);
    if (key_len > 0) {
        memcpy(p, key, (size_t)key_len);
        p += key_len;
    }
    p = put_varint(p, value_len);
    if (value_len > 0) {
        memcpy(p, value, (size_t)value_len);
        p += value_len;
    }
    p = put_varint(p, last - first);
    for (int32_t e = first; e < last; e++) {
        const uint8_t *kp = NULL, *vp = NULL;
        int32_t k = bincol_get(&h->key, e, &kp), v = bincol_get(&h->value, e, &vp);
        if (k < 0)
            k = 0; /* refused before the walk: see append_rows */
        p = put_varint(p, k);
        if (k > 0) {
            memcpy(p, kp, (size_t)k);
            p += k;
        }
        p = put_varint(p, v);
        if (v > 0) {
            memcpy(p, vp, (size_t)v);
            p += v;
        }
    }
    b->buf.len = (size_t)(p - b->buf.data);
    b->count++;
    if (b->buf.len >= a->batch_bytes || b->count == INT32_MAX)
        return seal(a, partition);
    return 0;
}

typedef struct {
    acc_t *a;
    Py_ssize_t rows;
    bincol_t *key, *value;
    headers_t *headers;
    intcol_t *partition;
    int64_t timestamp;
    Py_ssize_t bad_row;   /* a partition out of range, or a null header key */
    int32_t bad_value;
} append_ctx_t;

/* 0 done, 1 a bad row (nothing appended), -1 out of memory (rows before it appended). */
static int append_rows(append_ctx_t *x) {
    acc_t *a = x->a;
    intcol_t *pc = x->partition;
    const int32_t *pv = pc->present ? (const int32_t *)pc->values.buf + pc->offset : NULL;
    for (Py_ssize_t i = 0; i < x->rows; i++) {
        int valid = pv != NULL && !(pc->has_validity && !bit_set(&pc->validity, pc->offset + i));
        if (valid && (pv[i] < 0 || pv[i] >= a->partitions)) {
            x->bad_row = i;
            x->bad_value = pv[i];
            return 1;
        }
    }
    headers_t *h = x->headers;
    if (h->present && h->key.has_validity) {
        const int32_t *o = (const int32_t *)h->offsets.buf;
        for (int32_t e = o[h->offset]; e < o[h->offset + x->rows]; e++)
            if (!bit_set(&h->key.validity, h->key.offset + e)) {
                x->bad_row = -1;
                return 1;
            }
    }
    for (Py_ssize_t i = 0; i < x->rows; i++) {
        const uint8_t *key = NULL, *value = NULL;
        int32_t key_len = bincol_get(x->key, i, &key);
        int32_t value_len = bincol_get(x->value, i, &value);
        int32_t partition;
        if (pv != NULL && !(pc->has_validity && !bit_set(&pc->validity, pc->offset + i)))
            partition = pv[i];
        else if (key_len >= 0)
            partition = (int32_t)(((uint32_t)murmur2(key, (size_t)key_len) & 0x7fffffffu) %
                                  (uint32_t)a->partitions);
        else
            partition = a->sticky;
        if (put_record(a, partition, x->timestamp, key, key_len, value, value_len, h, i) < 0)
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(append_doc,
"append(rows, key, value, headers, partition, timestamp_ms) -> batches sealed so far\n\n"
"Append the rows of one Arrow record batch (column arguments: see the module). A partition\n"
"outside [0, partitions) or a null header key raises ValueError and appends nothing.");

static PyObject *acc_append(PyObject *self, PyObject *args) {
    acc_t *a = (acc_t *)self;
    Py_ssize_t rows;
    PyObject *key_spec, *value_spec, *headers_spec, *partition_spec;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "nOOOOL:append", &rows, &key_spec, &value_spec, &headers_spec,
                          &partition_spec, &timestamp))
        return NULL;
    if (rows < 0)
        return PyErr_Format(PyExc_ValueError, "rows must be >= 0");
    bincol_t key, value;
    headers_t headers;
    intcol_t partition;
    memset(&value, 0, sizeof(value));
    memset(&headers, 0, sizeof(headers));
    memset(&partition, 0, sizeof(partition));
    if (bincol_parse(key_spec, rows, &key, "key") < 0)
        return NULL;
    PyObject *result = NULL;
    if (bincol_parse(value_spec, rows, &value, "value") < 0 ||
        headers_parse(headers_spec, rows, &headers) < 0 ||
        intcol_parse(partition_spec, rows, &partition) < 0)
        goto done;
    append_ctx_t x = {a, rows, &key, &value, &headers, &partition, timestamp, 0, 0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = append_rows(&x);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        PyErr_NoMemory();
    else if (rc > 0 && x.bad_row < 0)
        PyErr_SetString(PyExc_ValueError, "a header has a null key");
    else if (rc > 0)
        PyErr_Format(PyExc_ValueError, "row %zd: partition %d is not in [0, %d)", x.bad_row,
                     x.bad_value, a->partitions);
    else
        result = PyLong_FromSize_t(a->sealed_len);
done:
    bincol_release(&key);
    bincol_release(&value);
    headers_release(&headers);
    intcol_release(&partition);
    return result;
}

static PyObject *acc_seal_all(PyObject *self, PyObject *unused) {
    acc_t *a = (acc_t *)self;
    (void)unused;
    int32_t sticky = a->sticky;
    for (int32_t p = 0; p < a->partitions; p++)
        if (seal(a, p) < 0)
            return PyErr_NoMemory();
    a->sticky = sticky; /* sealing everything is no reason to move on */
    return PyLong_FromSize_t(a->sealed_len);
}

/* The batch framed: header + payload (the records, or `compressed` when not NULL). */
static PyObject *frame(const acc_t *a, const batch_t *b, const uint8_t *compressed,
                       Py_ssize_t compressed_len) {
    Py_ssize_t payload = compressed ? compressed_len : (Py_ssize_t)b->buf.len - BATCH_HEADER_SIZE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, BATCH_HEADER_SIZE + payload);
    if (out == NULL)
        return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    memcpy(p + BATCH_HEADER_SIZE, compressed ? compressed : b->buf.data + BATCH_HEADER_SIZE,
           (size_t)payload);
    put64(p, 0);                                            /* base offset: the leader's */
    put32(p + 8, (uint32_t)(BATCH_HEADER_SIZE + payload - 12));
    put32(p + 12, (uint32_t)-1);                            /* partition leader epoch */
    p[16] = 2;                                              /* magic */
    put16(p + 21, (uint16_t)(compressed ? a->codec : 0));  /* attributes: CreateTime */
    put32(p + 23, (uint32_t)(b->count - 1));
    put64(p + 27, (uint64_t)b->base_timestamp);
    put64(p + 35, (uint64_t)b->max_timestamp);
    put64(p + 43, (uint64_t)-1);                            /* producer id */
    put16(p + 51, (uint16_t)-1);                            /* producer epoch */
    put32(p + 53, (uint32_t)-1);                            /* base sequence */
    put32(p + 57, (uint32_t)b->count);
    put32(p + 17, crc32c(p + 21, (size_t)(BATCH_HEADER_SIZE + payload - 21)));
    return out;
}

static PyObject *framed(acc_t *a, batch_t *b) {
    if (a->codec == 0)
        return frame(a, b, NULL, 0);
    PyObject *view = PyMemoryView_FromMemory((char *)b->buf.data + BATCH_HEADER_SIZE,
                                             (Py_ssize_t)b->buf.len - BATCH_HEADER_SIZE,
                                             PyBUF_READ);
    if (view == NULL)
        return NULL;
    PyObject *compressed = PyObject_CallOneArg(a->compress, view);
    PyObject *released = PyObject_CallMethod(view, "release", NULL);
    Py_XDECREF(released);
    Py_DECREF(view);
    if (compressed == NULL)
        return NULL;
    if (released == NULL) { /* compress kept an export of the view: refuse, it would dangle */
        Py_DECREF(compressed);
        return NULL;
    }
    Py_buffer out;
    if (PyObject_GetBuffer(compressed, &out, PyBUF_SIMPLE) < 0) {
        Py_DECREF(compressed);
        return NULL;
    }
    PyObject *result = frame(a, b, out.buf, out.len);
    PyBuffer_Release(&out);
    Py_DECREF(compressed);
    return result;
}

PyDoc_STRVAR(take_doc,
"take() -> [(partition, records_count, batch)]\n\n"
"The sealed batches, oldest first, framed (and compressed with the codec); they leave the\n"
"accumulator.");

static PyObject *acc_take(PyObject *self, PyObject *unused) {
    acc_t *a = (acc_t *)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    size_t done = 0;
    for (; done < a->sealed_len; done++) {
        sealed_t *s = &a->sealed[done];
        PyObject *batch = framed(a, &s->batch);
        PyObject *item = batch ? Py_BuildValue("(iiN)", s->partition, s->batch.count, batch) : NULL;
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            list = NULL;
            break;
        }
        Py_DECREF(item);
        give_back(a, &s->batch.buf);
    }
    /* On an error the batches not framed stay sealed for the next call. */
    memmove(a->sealed, a->sealed + done, (a->sealed_len - done) * sizeof(*a->sealed));
    a->sealed_len -= done;
    return list;
}

static int acc_init(PyObject *self, PyObject *args, PyObject *kwds) {
    acc_t *a = (acc_t *)self;
    static char *names[] = {"partitions", "batch_bytes", "sticky", "codec", "compress", NULL};
    int partitions, sticky, codec = 0;
    Py_ssize_t batch_bytes;
    PyObject *compress = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ini|iO:Accumulator", names, &partitions,
                                     &batch_bytes, &sticky, &codec, &compress))
        return -1;
    if (partitions <= 0 || batch_bytes <= 0 || sticky < 0 || sticky >= partitions ||
        codec < 0 || codec > 4 || (codec != 0 && !PyCallable_Check(compress))) {
        PyErr_SetString(PyExc_ValueError,
                        "Accumulator: partitions > 0, batch_bytes > 0, 0 <= sticky < partitions, "
                        "codec 0-4 (with a compress callable)");
        return -1;
    }
    if (a->open != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Accumulator already initialised");
        return -1;
    }
    a->open = calloc((size_t)partitions, sizeof(batch_t));
    if (a->open == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    a->partitions = partitions;
    a->batch_bytes = (size_t)batch_bytes;
    a->sticky = sticky;
    a->codec = codec;
    Py_INCREF(compress);
    a->compress = compress;
    return 0;
}

static void acc_dealloc(PyObject *self) {
    acc_t *a = (acc_t *)self;
    if (a->open != NULL)
        for (int32_t p = 0; p < a->partitions; p++)
            free(a->open[p].buf.data);
    for (size_t i = 0; i < a->sealed_len; i++)
        free(a->sealed[i].batch.buf.data);
    for (size_t i = 0; i < a->spare_len; i++)
        free(a->spare[i].data);
    free(a->open);
    free(a->sealed);
    free(a->spare);
    Py_XDECREF(a->compress);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *acc_sticky(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(((acc_t *)self)->sticky);
}

static PyObject *acc_pending(PyObject *self, void *closure) {
    acc_t *a = (acc_t *)self;
    (void)closure;
    size_t rows = 0;
    for (int32_t p = 0; p < a->partitions; p++)
        rows += (size_t)a->open[p].count;
    for (size_t i = 0; i < a->sealed_len; i++)
        rows += (size_t)a->sealed[i].batch.count;
    return PyLong_FromSize_t(rows);
}

static PyMethodDef acc_methods[] = {
    {"append", acc_append, METH_VARARGS, append_doc},
    {"seal_all", acc_seal_all, METH_NOARGS, "Seal every partition's open batch; -> sealed count."},
    {"take", acc_take, METH_NOARGS, take_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef acc_getset[] = {
    {"sticky", acc_sticky, NULL, "the partition keyless rows go to now", NULL},
    {"pending", acc_pending, NULL, "records appended and not yet taken", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot acc_slots[] = {
    {Py_tp_doc, "Per-partition RecordBatch v2 batches built from Arrow columns (see the module)."},
    {Py_tp_init, acc_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, acc_dealloc},
    {Py_tp_methods, acc_methods},
    {Py_tp_getset, acc_getset},
    {0, NULL},
};

static PyType_Spec acc_spec = {
    "odradek.protocol._encoder.Accumulator", sizeof(acc_t), 0, Py_TPFLAGS_DEFAULT, acc_slots,
};

static PyObject *murmur2_py(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:murmur2", &data))
        return NULL;
    int32_t h = murmur2((const uint8_t *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromLong(h);
}

static PyMethodDef module_methods[] = {
    {"murmur2", murmur2_py, METH_VARARGS,
     "murmur2(data) -> int: Kafka's Utils.murmur2, as a signed 32-bit int like Java's."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    crc32c_setup();
    PyObject *type = PyType_FromSpec(&acc_spec);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Accumulator", type);
    Py_DECREF(type);
    return rc;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "odradek.protocol._encoder",
    "Arrow columns into RecordBatch v2 batches per partition (see odradek.spark.produce).",
    0,
    module_methods,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__encoder(void) { return PyModuleDef_Init(&module_def); }
