/*
 * odradek.protocol._records: a native walker over the records section of a RecordBatch v2.
 *
 * The broker stores batches as producers send them, so before it appends one it must know that
 * every consumer will be able to parse what it stores. Checking that in Python costs a few
 * microseconds per record; this walker does it in one pass over the (decompressed) records
 * section without touching a Python object per record, with the GIL released.
 *
 * Layout of one record (all varints zig-zag encoded, as protobuf's sint32/sint64):
 *
 *     length            varint   bytes of everything below
 *     attributes        int8     unused in v2
 *     timestampDelta    varlong  added to the batch's baseTimestamp
 *     offsetDelta       varint   added to the batch's baseOffset
 *     keyLength         varint   -1 = null key
 *     key               bytes
 *     valueLength       varint   -1 = null value
 *     value             bytes
 *     headerCount       varint
 *     headers           headerCount x (keyLength varint >= 0, key, valueLength varint >= -1, value)
 *
 * The rules, each refused with `InvalidRecordsError(message, record index, byte position)`:
 *
 *   - exactly `records_count` records, and not one byte after the last;
 *   - a varint has at most 5 bytes and a varlong at most 10, and their value fits 32 (64) bits:
 *     Kafka's reader stops at the same lengths; the range rule is stricter than Kafka's (which
 *     silently drops the excess bits) because librdkafka keeps them, so the two would disagree
 *     about such a record;
 *   - a record's length covers exactly its fields, and no field runs past the record;
 *   - header keys are valid UTF-8 (RFC 3629: no overlong forms, no surrogates): a header key is
 *     a string in Kafka's clients, and confluent-kafka's Python consumer fails on a record whose
 *     key is not UTF-8 (Kafka's own broker stores them; Java's consumer replaces the bad bytes);
 *   - key and value lengths are >= -1 and header value lengths too; header key lengths are >= 0.
 *     Kafka's own reader takes any negative key or value length as null, but librdkafka treats
 *     only -1 as null and fails on the rest, so they are refused here;
 *   - record i has offsetDelta i: every producer writes consecutive deltas, and a consumer
 *     positions itself by them, so a batch with other deltas makes consumers skip or repeat
 *     records. Batches read back from the log (`index(..., stored=True)`, `find_timestamp`) may
 *     have been thinned by compaction, which keeps each record's offset: there the deltas need
 *     only be >= 0 and increase (see `_walker.h`);
 *   - the header count is >= 0 and could fit in what is left of the record.
 *
 * A prefix walk (`prefix=True`) checks the first bytes of a records section whose end has not been
 * produced (a decompression stopped at its limit): it stops without error at the first record that
 * is not wholly within the bytes given, and refuses only what is wrong in the bytes it has, so that
 * a decompression bomb of garbage is refused as malformed, as Kafka's streaming reader refuses it.
 *
 * One walker serves every purpose through a visitor called once per record with the record's
 * layout (`rec_t`): `scan` (validation: timestamps' minimum and maximum, and which records fall
 * outside given bounds), `index` (the position of every field, for readers that build columns or
 * key maps without decoding records in Python) and `find_timestamp` (ListOffsets: the first record
 * at or after a timestamp, which stops the walk there). Compaction's key map and an Arrow reader
 * are further visitors over the same walk.
 *
 * Thread safety: the walk touches no Python object, so the GIL is released around it; the buffer
 * stays exported (a bytearray cannot be resized meanwhile) and every read is bounds-checked
 * against the length taken at the start.
 */

#include "_walker.h"

#define INDEX_FIELDS 9
#define OUTSIDE_LIMIT 1000 /* records outside the timestamp bounds that `scan` lists */

/* ---------------------------------------------------------------------------------------- */
/* scan: validation                                                                          */

typedef struct {
    int64_t min_timestamp, max_timestamp;
    Py_ssize_t seen;
    int check_bounds;
    int64_t lower, upper;
    Py_ssize_t outside_index[OUTSIDE_LIMIT]; /* the first records outside [lower, upper] */
    int64_t outside_timestamp[OUTSIDE_LIMIT];
    Py_ssize_t outside_count;
    int require_keys;
    Py_ssize_t keyless_index[OUTSIDE_LIMIT]; /* the first records without a key */
    Py_ssize_t keyless_count;                /* all of them */
} scan_ctx_t;

static int scan_visit(void *ctx_, Py_ssize_t index, const rec_t *rec, walk_error_t *err) {
    scan_ctx_t *ctx = (scan_ctx_t *)ctx_;
    (void)err;
    int64_t ts = rec->timestamp;
    ctx->seen++;
    if (ts < ctx->min_timestamp)
        ctx->min_timestamp = ts;
    if (ts > ctx->max_timestamp)
        ctx->max_timestamp = ts;
    if (ctx->require_keys && rec->key_len < 0) {
        /* Kafka reports a record's missing key instead of its timestamp. */
        if (ctx->keyless_count < OUTSIDE_LIMIT)
            ctx->keyless_index[ctx->keyless_count] = index;
        ctx->keyless_count++;
        return 0;
    }
    /* -1 is "no timestamp": Kafka exempts it from the bounds. */
    if (ctx->check_bounds && ts != -1 && (ts < ctx->lower || ts > ctx->upper) &&
        ctx->outside_count < OUTSIDE_LIMIT) {
        ctx->outside_index[ctx->outside_count] = index;
        ctx->outside_timestamp[ctx->outside_count] = ts;
        ctx->outside_count++;
    }
    return 0;
}

static PyObject *InvalidRecordsError;

PyDoc_STRVAR(scan_doc,
"scan(records, records_count, base_timestamp, lower=None, upper=None, prefix=False,\n"
"     require_keys=False) -> (min_timestamp, max_timestamp, outside, keyless, keyless_count)\n\n"
"Validate the records section `records` (decompressed) of a batch declaring `records_count`\n"
"records and `base_timestamp`. Returns the smallest and largest record timestamp (-1, -1 when\n"
"there are no records) and, when `lower`/`upper` are given, the first 1000 records whose\n"
"timestamp (other than -1) lies outside [lower, upper], as a tuple of (index, timestamp).\n"
"Raises InvalidRecordsError(message, record index, byte position) on the first malformation.\n"
"With prefix=True, `records` is only the start of the section (see the module comment).\n"
"With require_keys=True (a compacted topic) records without a key are listed instead: the\n"
"first 1000 indexes in `keyless`, all of them counted in `keyless_count`; their timestamps\n"
"are not checked against the bounds.");

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_timestamp;
    PyObject *lower_obj = Py_None, *upper_obj = Py_None;
    int prefix = 0, require_keys = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LL|OOpp:scan", &view, &count, &base_timestamp, &lower_obj,
                          &upper_obj, &prefix, &require_keys))
        return NULL;
    scan_ctx_t ctx; /* 24 KB: on the stack */
    memset(&ctx, 0, sizeof(ctx));
    ctx.require_keys = require_keys;
    ctx.min_timestamp = INT64_MAX;
    ctx.max_timestamp = INT64_MIN;
    ctx.lower = INT64_MIN;
    ctx.upper = INT64_MAX;
    if (lower_obj != Py_None || upper_obj != Py_None) {
        ctx.check_bounds = 1;
        if (lower_obj != Py_None)
            ctx.lower = PyLong_AsLongLong(lower_obj);
        if (upper_obj != Py_None)
            ctx.upper = PyLong_AsLongLong(upper_obj);
        if (PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    walk_error_t err;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, prefix, 1,
                  scan_visit, &ctx, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0)
        return raise_walk_error(InvalidRecordsError, &err);
    PyObject *outside = PyTuple_New(ctx.outside_count);
    if (outside == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < ctx.outside_count; i++) {
        PyObject *item =
            Py_BuildValue("(nL)", ctx.outside_index[i], (long long)ctx.outside_timestamp[i]);
        if (item == NULL) {
            Py_DECREF(outside);
            return NULL;
        }
        PyTuple_SET_ITEM(outside, i, item);
    }
    if (ctx.seen == 0) {
        ctx.min_timestamp = -1;
        ctx.max_timestamp = -1;
    }
    Py_ssize_t listed = ctx.keyless_count < OUTSIDE_LIMIT ? ctx.keyless_count : OUTSIDE_LIMIT;
    PyObject *keyless = PyTuple_New(listed);
    if (keyless == NULL) {
        Py_DECREF(outside);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < listed; i++) {
        PyObject *item = PyLong_FromSsize_t(ctx.keyless_index[i]);
        if (item == NULL) {
            Py_DECREF(outside);
            Py_DECREF(keyless);
            return NULL;
        }
        PyTuple_SET_ITEM(keyless, i, item);
    }
    return Py_BuildValue("(LLNNn)", (long long)ctx.min_timestamp, (long long)ctx.max_timestamp,
                         outside, keyless, ctx.keyless_count);
}

/* ---------------------------------------------------------------------------------------- */
/* index: every record's layout                                                              */

typedef struct {
    int64_t *rows;
} index_ctx_t;

static int index_visit(void *ctx_, Py_ssize_t index, const rec_t *rec, walk_error_t *err) {
    int64_t *row = ((index_ctx_t *)ctx_)->rows + index * INDEX_FIELDS;
    (void)err;
    row[0] = rec->offset_delta;
    row[1] = rec->timestamp;
    row[2] = rec->key_pos;
    row[3] = rec->key_len;
    row[4] = rec->value_pos;
    row[5] = rec->value_len;
    row[6] = rec->headers_pos;
    row[7] = rec->header_count;
    row[8] = rec->end;
    return 0;
}

PyDoc_STRVAR(index_doc,
"index(records, records_count, base_timestamp, stored=False) -> bytes\n\n"
"Validate as `scan` does and return the layout of every record: records_count rows of nine\n"
"native-endian int64 (offset delta, timestamp, key position, key length (-1 = null), value\n"
"position, value length, position of the first header, header count, end of the record),\n"
"positions relative to the start of `records`. With stored=True the records come from the log,\n"
"where compaction may have removed some: offset deltas need only increase.");

static PyObject *index_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_timestamp;
    int stored = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LL|p:index", &view, &count, &base_timestamp, &stored))
        return NULL;
    walk_error_t err;
    /* Refuse impossible counts before allocating rows for them. */
    if (count < 0 || count > view.len / MIN_RECORD_SIZE) {
        walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, !stored, NULL, NULL,
             &err);
        PyBuffer_Release(&view);
        return raise_walk_error(InvalidRecordsError, &err);
    }
    PyObject *rows = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)count * INDEX_FIELDS * 8);
    if (rows == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    index_ctx_t ctx = {(int64_t *)PyBytes_AS_STRING(rows)};
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, !stored,
                  index_visit, &ctx, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0) {
        Py_DECREF(rows);
        return raise_walk_error(InvalidRecordsError, &err);
    }
    return rows;
}

/* ---------------------------------------------------------------------------------------- */
/* find_timestamp: ListOffsets by timestamp                                                  */

typedef struct {
    int64_t target;
    int64_t min_delta;
    int found;
    int64_t delta, timestamp;
} find_ctx_t;

static int find_visit(void *ctx_, Py_ssize_t index, const rec_t *rec, walk_error_t *err) {
    find_ctx_t *ctx = (find_ctx_t *)ctx_;
    (void)index;
    (void)err;
    if (rec->timestamp >= ctx->target && rec->offset_delta >= ctx->min_delta) {
        ctx->found = 1;
        ctx->delta = rec->offset_delta;
        ctx->timestamp = rec->timestamp;
        return 1;
    }
    return 0;
}

PyDoc_STRVAR(find_doc,
"find_timestamp(records, records_count, base_timestamp, target, min_delta)\n"
"    -> (offset_delta, timestamp) | None\n\n"
"The first record (in offset order) with timestamp >= target and offset delta >= min_delta.\n"
"Records are validated as far as the walk goes (InvalidRecordsError), as stored records: offset\n"
"deltas need only increase (compaction may have removed records).");

static PyObject *find_timestamp(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_timestamp, target, min_delta;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLLL:find_timestamp", &view, &count, &base_timestamp, &target,
                          &min_delta))
        return NULL;
    find_ctx_t ctx = {target, min_delta, 0, 0, 0};
    walk_error_t err;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, 0, find_visit,
                  &ctx, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0)
        return raise_walk_error(InvalidRecordsError, &err);
    if (!ctx.found)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)ctx.delta, (long long)ctx.timestamp);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"find_timestamp", find_timestamp, METH_VARARGS, find_doc},
    {"index", index_records, METH_VARARGS, index_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    InvalidRecordsError = PyErr_NewExceptionWithDoc(
        "odradek.protocol._records.InvalidRecordsError",
        "A malformed records section: args are (message, record index, byte position).",
        PyExc_ValueError, NULL);
    if (InvalidRecordsError == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "InvalidRecordsError", InvalidRecordsError) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "INDEX_FIELDS", INDEX_FIELDS) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "OUTSIDE_LIMIT", OUTSIDE_LIMIT) < 0)
        return -1;
    return PyModule_AddIntConstant(module, "MIN_RECORD_SIZE", MIN_RECORD_SIZE);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "odradek.protocol._records",
    "Native walker over RecordBatch v2 records (see odradek.protocol.records).",
    0,
    methods,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__records(void) { return PyModuleDef_Init(&module_def); }
