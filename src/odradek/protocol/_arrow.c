/*
 * odradek.protocol._arrow: the records of one RecordBatch v2 appended to Arrow column buffers.
 *
 * A visitor over the shared record walker (`_walker.h`, whose rules `_records.c` documents): each
 * record in an offset range becomes one row of growable buffers laid out as Arrow wants them,
 * so a reader hands them to `pyarrow.Array.from_buffers` without a Python object per record:
 *
 *   key, value        binary: int32 offsets (rows + 1), data bytes, validity bits (1 = present)
 *   offset, timestamp int64 values (timestamps in microseconds, Spark's unit)
 *   timestampType     int32 values: 0 CreateTime, 1 LogAppendTime (the Java client's ids)
 *   headers           list<struct<key: string, value: binary>>: int32 list offsets, list validity
 *                     (null when a record has no header, as Spark's Kafka source), and for the
 *                     struct's children int32 offsets, data and (value) validity bits
 *
 * `Columns` is a Python object owning the buffers; `append(records, count, base_offset,
 * base_timestamp, log_append_time, max_timestamp, from_offset, until_offset)` appends the rows of
 * one decompressed records section whose offsets lie in [from_offset, until_offset), and
 * `take()` hands the buffers over without copying them, as `Buffer` objects (read-only, exposing
 * the buffer protocol, freeing the memory when the last reference goes: `pyarrow.py_buffer`
 * keeps one), and starts again with buffers half as large again as the ones just taken, so that
 * a reader's next chunk of similar size grows no buffer (each growth is a realloc and a copy).
 * The memory of a Buffer whose last reference goes is kept for later chunks (`pool_put`): fresh
 * pages are slow to fault in on these machines. Offsets that do not fit Arrow's int32 (a chunk
 * over 2 GiB) are refused: readers take a chunk well below that.
 *
 * Thread safety: a Columns belongs to one thread; the walk runs with the GIL released and touches
 * only the buffers and the exported records buffer.
 */

#include "_walker.h"
#include "_growable.h"

#include <stdlib.h>

typedef struct {
    uint8_t *data;
    size_t len, cap;
    size_t hint; /* the length last taken: what the next chunk probably needs */
} buf_t;

static inline int buf_reserve(buf_t *b, size_t extra) {
    return grow_reserve(&b->data, &b->cap, b->len, extra, 4096);
}

ALWAYS_INLINE int buf_put(buf_t *b, const void *src, size_t n) {
    if (buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* A validity bitmap of `bits` bits. */
ALWAYS_INLINE int bit_put(buf_t *b, size_t bits, int set) {
    if ((bits & 7) == 0) {
        uint8_t zero = 0;
        if (buf_put(b, &zero, 1) < 0)
            return -1;
    }
    if (set)
        b->data[bits >> 3] |= (uint8_t)(1u << (bits & 7));
    return 0;
}

typedef struct {
    buf_t offsets, data, validity;
    Py_ssize_t nulls;
} binary_t;

ALWAYS_INLINE int binary_put(binary_t *c, size_t row, const uint8_t *p, int32_t len) {
    if (bit_put(&c->validity, row, len >= 0) < 0)
        return -1;
    if (len < 0)
        c->nulls++;
    else if (buf_put(&c->data, p, (size_t)len) < 0)
        return -1;
    if (c->data.len > INT32_MAX)
        return -2;
    int32_t end = (int32_t)c->data.len;
    return buf_put(&c->offsets, &end, 4);
}

typedef struct {
    PyObject_HEAD
    size_t rows;
    binary_t key, value;
    buf_t offset, timestamp, timestamp_type;
    /* headers */
    size_t header_rows;         /* headers in all rows */
    buf_t list_offsets, list_validity;
    Py_ssize_t list_nulls;
    binary_t header_key, header_value;
} columns_t;

typedef struct {
    columns_t *c;
    const uint8_t *p;
    int64_t base_offset, from_offset, until_offset;
    int log_append_time;
    int64_t max_timestamp;
    int with_headers;
} visit_ctx_t;

static int binary_init(binary_t *c) {
    int32_t zero = 0;
    return buf_put(&c->offsets, &zero, 4);
}

ALWAYS_INLINE int arrow_visit(void *ctx_, Py_ssize_t index, const rec_t *rec, walk_error_t *err) {
    visit_ctx_t *ctx = (visit_ctx_t *)ctx_;
    columns_t *c = ctx->c;
    const uint8_t *p = ctx->p;
    int64_t offset = ctx->base_offset + rec->offset_delta;
    Py_ssize_t pos = rec->start;
    if (offset < ctx->from_offset)
        return 0;
    if (offset >= ctx->until_offset)
        return 1; /* offsets only increase within a batch */
    int rc;
    if ((rc = binary_put(&c->key, c->rows, p + rec->key_pos, rec->key_len)) < 0 ||
        (rc = binary_put(&c->value, c->rows, p + rec->value_pos, rec->value_len)) < 0)
        goto fail;
    int64_t millis = ctx->log_append_time ? ctx->max_timestamp : rec->timestamp;
    /* Spark's timestamps are microseconds; wrapping as pyarrow's unchecked multiply did. */
    int64_t timestamp = (int64_t)((uint64_t)millis * 1000u);
    int32_t timestamp_type = ctx->log_append_time;
    if (buf_put(&c->offset, &offset, 8) < 0 || buf_put(&c->timestamp, &timestamp, 8) < 0 ||
        buf_put(&c->timestamp_type, &timestamp_type, 4) < 0) {
        rc = -1;
        goto fail;
    }
    if (ctx->with_headers) {
        /* The walk checked every header's lengths against the record: read them again. */
        Py_ssize_t hp = rec->headers_pos;
        for (int32_t h = 0; h < rec->header_count; h++) {
            int32_t key_len = 0, value_len = 0;
            read_varint(p, rec->end, &hp, &key_len);
            if ((rc = binary_put(&c->header_key, c->header_rows, p + hp, key_len)) < 0)
                goto fail;
            hp += key_len;
            read_varint(p, rec->end, &hp, &value_len);
            if ((rc = binary_put(&c->header_value, c->header_rows, p + hp, value_len)) < 0)
                goto fail;
            if (value_len > 0)
                hp += value_len;
            c->header_rows++;
        }
        if (c->header_rows > INT32_MAX) {
            rc = -2;
            goto fail;
        }
        int32_t end = (int32_t)c->header_rows;
        if (bit_put(&c->list_validity, c->rows, rec->header_count > 0) < 0 ||
            buf_put(&c->list_offsets, &end, 4) < 0) {
            rc = -1;
            goto fail;
        }
        if (rec->header_count == 0)
            c->list_nulls++;
    }
    c->rows++;
    return 0;
fail:
    FAIL(rc == -2 ? "record %zd: the chunk outgrows Arrow's 2 GiB of int32 offsets"
                  : "record %zd: out of memory for its columns",
         index);
}

static PyObject *InvalidRecordsError;
static PyObject *BufferType;

/* Memory of taken buffers, kept when their last reference goes for the next chunks' columns.
 * A chunk's value column is ~10 MB: freed, glibc gives it back to the kernel, and the next chunk's
 * buffers are fresh pages, each faulted in and zeroed (a quarter of the decoder's time, measured
 * with perf). Blocks of at least POOL_MIN_BYTES are kept, at most POOL_SLOTS of them and
 * POOL_MAX_BYTES in all (a reader holds one chunk being filled and one being handed to Spark);
 * the rest are freed. Only touched with the GIL held (a Buffer's dealloc, `columns_reset`). */
#define POOL_SLOTS 32
#define POOL_MIN_BYTES ((size_t)64 << 10)
#define POOL_MAX_BYTES ((size_t)96 << 20)

static struct {
    uint8_t *data;
    size_t cap;
} pool[POOL_SLOTS];
static size_t pool_count, pool_bytes;

static void pool_put(uint8_t *data, size_t cap) {
    if (data == NULL)
        return;
    if (cap < POOL_MIN_BYTES || pool_count == POOL_SLOTS || cap > POOL_MAX_BYTES - pool_bytes) {
        free(data);
        return;
    }
    pool[pool_count].data = data;
    pool[pool_count].cap = cap;
    pool_count++;
    pool_bytes += cap;
}

/* The smallest kept block of `want` bytes or more (and at most 4 times that), or NULL. */
static uint8_t *pool_take(size_t want, size_t *cap) {
    size_t best = pool_count;
    for (size_t i = 0; i < pool_count; i++)
        if (pool[i].cap >= want && pool[i].cap / 4 <= want &&
            (best == pool_count || pool[i].cap < pool[best].cap))
            best = i;
    if (best == pool_count)
        return NULL;
    uint8_t *data = pool[best].data;
    *cap = pool[best].cap;
    pool_bytes -= *cap;
    pool[best] = pool[--pool_count];
    return data;
}

/* A taken buffer: owns `data` (malloc'd, `cap` bytes), exposes its first `len` read-only, and
 * gives it to the pool on dealloc. */
typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t len;
    size_t cap;
} owned_t;

static int owned_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    owned_t *o = (owned_t *)self;
    static uint8_t empty[1];
    return PyBuffer_FillInfo(view, self, o->data ? o->data : empty, o->len, 1, flags);
}

static void owned_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    pool_put(((owned_t *)self)->data, ((owned_t *)self)->cap);
    type->tp_free(self);
    Py_DECREF(type);
}

static Py_ssize_t owned_length(PyObject *self) { return ((owned_t *)self)->len; }

static PyType_Slot owned_slots[] = {
    {Py_tp_doc, "Bytes taken from Columns: read-only, through the buffer protocol."},
    {Py_tp_dealloc, owned_dealloc},
    {Py_bf_getbuffer, owned_getbuffer},
    {Py_sq_length, owned_length},
    {0, NULL},
};

static PyType_Spec owned_spec = {
    "odradek.protocol._arrow.Buffer", sizeof(owned_t), 0, Py_TPFLAGS_DEFAULT, owned_slots,
};

/* Every buffer of a columns_t, as an initializer for `buf_t *all[]`: the one list that freeing
 * and reserving walk, so that a new buffer is added in one place. */
#define COLUMNS_BUFFERS(c)                                                                     \
    {&(c)->key.offsets,        &(c)->key.data,           &(c)->key.validity,                  \
     &(c)->value.offsets,      &(c)->value.data,         &(c)->value.validity,                \
     &(c)->offset,             &(c)->timestamp,          &(c)->timestamp_type,                \
     &(c)->list_offsets,       &(c)->list_validity,                                           \
     &(c)->header_key.offsets, &(c)->header_key.data,    &(c)->header_key.validity,           \
     &(c)->header_value.offsets, &(c)->header_value.data, &(c)->header_value.validity}

/* Move `b`'s memory into a new Buffer; `b` is left empty, remembering the length as its hint. */
static PyObject *owned_of(buf_t *b) {
    owned_t *o = PyObject_New(owned_t, (PyTypeObject *)BufferType);
    if (o == NULL)
        return NULL;
    o->data = b->data;
    o->len = (Py_ssize_t)b->len;
    o->cap = b->cap;
    b->hint = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

static void columns_free_buffers(columns_t *c) {
    buf_t *all[] = COLUMNS_BUFFERS(c);
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        pool_put(all[i]->data, all[i]->cap);
        all[i]->data = NULL;
        all[i]->len = all[i]->cap = 0;
    }
    c->rows = c->header_rows = 0;
    c->key.nulls = c->value.nulls = c->list_nulls = 0;
    c->header_key.nulls = c->header_value.nulls = 0;
}

/* The largest length taken from each buffer (in `COLUMNS_BUFFERS` order) by any Columns of this
 * process: a new Columns (a new task's reader) starts with room for the chunks its predecessors
 * took, rather than growing from nothing through a dozen reallocs into fresh pages. GIL held. */
#define COLUMNS_BUFFER_COUNT 17
static size_t seen_hint[COLUMNS_BUFFER_COUNT];

/* Room for half as much again as the largest chunk held in each buffer (nothing before the first
 * take in the process): a chunk ends after the fetch response that takes it past its size, so the
 * next may be somewhat larger, and a growth in the middle of a walk copies the buffer. Kept
 * blocks come first. */
static int columns_reserve(columns_t *c) {
    buf_t *all[] = COLUMNS_BUFFERS(c);
    _Static_assert(sizeof(all) / sizeof(all[0]) == COLUMNS_BUFFER_COUNT, "one hint per buffer");
    for (size_t i = 0; i < COLUMNS_BUFFER_COUNT; i++) {
        buf_t *b = all[i];
        if (b->hint > seen_hint[i])
            seen_hint[i] = b->hint;
        size_t hint = seen_hint[i];
        size_t want = hint + hint / 2;
        if (hint == 0 || want <= b->cap)
            continue;
        size_t cap = 0;
        uint8_t *data = b->data == NULL ? pool_take(want, &cap) : NULL;
        if (data == NULL) {
            data = realloc(b->data, want);
            if (data == NULL)
                return -1;
            cap = want;
        }
        b->data = data;
        b->cap = cap;
    }
    return 0;
}

static int columns_reset(columns_t *c) {
    columns_free_buffers(c);
    int32_t zero = 0;
    if (columns_reserve(c) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (binary_init(&c->key) < 0 || binary_init(&c->value) < 0 ||
        binary_init(&c->header_key) < 0 || binary_init(&c->header_value) < 0 ||
        buf_put(&c->list_offsets, &zero, 4) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int columns_init(PyObject *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, ":Columns") || (kwds && PyDict_Size(kwds)))
        return PyErr_Format(PyExc_TypeError, "Columns() takes no arguments"), -1;
    return columns_reset((columns_t *)self);
}

static void columns_dealloc(PyObject *self) {
    columns_free_buffers((columns_t *)self);
    Py_TYPE(self)->tp_free(self);
}

PyDoc_STRVAR(append_doc,
"append(records, records_count, base_offset, base_timestamp, log_append_time, max_timestamp,\n"
"       from_offset, until_offset, headers) -> rows appended\n\n"
"Append the records of one decompressed records section whose offsets are in\n"
"[from_offset, until_offset); with log_append_time every row takes max_timestamp. With\n"
"headers=False the headers columns stay empty. Malformed records raise InvalidRecordsError and\n"
"leave the rows appended so far from this section in place: call take() and drop them.");

static PyObject *columns_append(PyObject *self, PyObject *args) {
    columns_t *c = (columns_t *)self;
    Py_buffer view;
    long long count, base_offset, base_timestamp, max_timestamp, from_offset, until_offset;
    int log_append_time, with_headers;
    if (!PyArg_ParseTuple(args, "y*LLLpLLLp:append", &view, &count, &base_offset,
                          &base_timestamp, &log_append_time, &max_timestamp, &from_offset,
                          &until_offset, &with_headers))
        return NULL;
    visit_ctx_t ctx = {c,           (const uint8_t *)view.buf, base_offset, from_offset,
                       until_offset, log_append_time,          max_timestamp, with_headers};
    size_t before = c->rows;
    walk_error_t err;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, 0, arrow_visit,
                  &ctx, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0)
        return raise_walk_error(InvalidRecordsError, &err);
    return PyLong_FromSize_t(c->rows - before);
}

static PyObject *binary_tuple(binary_t *b) {
    return Py_BuildValue("(NNNn)", owned_of(&b->offsets), owned_of(&b->data),
                         owned_of(&b->validity), b->nulls);
}

PyDoc_STRVAR(take_doc,
"take() -> (rows, key, value, offset, timestamp, timestamp_type, headers)\n\n"
"The buffers appended so far (Buffer objects, handed over without a copy), and start empty.\n"
"key and value are (offsets, data, validity, null count); offset and timestamp (us) buffers of\n"
"native int64, timestamp_type of int32\n"
"(0 CreateTime, 1 LogAppendTime); headers is (list offsets, list\n"
"validity, list null count, header count, key (offsets, data, validity, nulls), value (...)).");

static PyObject *columns_take(PyObject *self, PyObject *unused) {
    columns_t *c = (columns_t *)self;
    (void)unused;
    PyObject *result = Py_BuildValue(
        "(nNNNNN(NNnnNN))", (Py_ssize_t)c->rows, binary_tuple(&c->key), binary_tuple(&c->value),
        owned_of(&c->offset), owned_of(&c->timestamp), owned_of(&c->timestamp_type),
        owned_of(&c->list_offsets), owned_of(&c->list_validity), c->list_nulls,
        (Py_ssize_t)c->header_rows,
        binary_tuple(&c->header_key), binary_tuple(&c->header_value));
    if (result == NULL)
        return NULL;
    if (columns_reset(c) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *columns_rows(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(((columns_t *)self)->rows);
}

static PyObject *columns_bytes(PyObject *self, void *closure) {
    columns_t *c = (columns_t *)self;
    (void)closure;
    return PyLong_FromSize_t(c->key.data.len + c->value.data.len + c->header_key.data.len +
                             c->header_value.data.len);
}

static PyMethodDef columns_methods[] = {
    {"append", columns_append, METH_VARARGS, append_doc},
    {"take", columns_take, METH_NOARGS, take_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef columns_getset[] = {
    {"rows", columns_rows, NULL, "rows appended since the last take()", NULL},
    {"data_bytes", columns_bytes, NULL, "key, value and header bytes held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot columns_slots[] = {
    {Py_tp_doc, "Growable Arrow buffers for the rows of record batches (see the module)."},
    {Py_tp_init, columns_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, columns_dealloc},
    {Py_tp_methods, columns_methods},
    {Py_tp_getset, columns_getset},
    {0, NULL},
};

static PyType_Spec columns_spec = {
    "odradek.protocol._arrow.Columns", sizeof(columns_t), 0, Py_TPFLAGS_DEFAULT, columns_slots,
};

static int exec_module(PyObject *module) {
    PyObject *records = PyImport_ImportModule("odradek.protocol._records");
    if (records == NULL)
        return -1;
    InvalidRecordsError = PyObject_GetAttrString(records, "InvalidRecordsError");
    Py_DECREF(records);
    if (InvalidRecordsError == NULL)
        return -1;
    BufferType = PyType_FromSpec(&owned_spec);
    if (BufferType == NULL || PyModule_AddObjectRef(module, "Buffer", BufferType) < 0)
        return -1;
    PyObject *type = PyType_FromSpec(&columns_spec);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Columns", type);
    Py_DECREF(type);
    return rc;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "odradek.protocol._arrow",
    "Records of RecordBatch v2 into Arrow column buffers (see odradek.spark.decode).",
    0,
    NULL,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__arrow(void) { return PyModuleDef_Init(&module_def); }
