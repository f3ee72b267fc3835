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
 *     records;
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

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MIN_RECORD_SIZE 7 /* length, attributes, ts delta, offset delta, key, value, header count */
#define INDEX_FIELDS 9
#define OUTSIDE_LIMIT 1000 /* records outside the timestamp bounds that `scan` lists */

typedef struct {
    int32_t offset_delta;
    int64_t timestamp;
    Py_ssize_t start;       /* where the length varint starts */
    Py_ssize_t key_pos;     /* where the key bytes start (after the length varint) */
    int32_t key_len;        /* -1: null */
    Py_ssize_t value_pos;
    int32_t value_len;
    Py_ssize_t headers_pos; /* the first header's key length varint */
    int32_t header_count;
    Py_ssize_t end;         /* one past the record's last byte */
} rec_t;

typedef struct {
    char message[200];
    Py_ssize_t index;
    Py_ssize_t position;
} walk_error_t;

/* Called once per record; returns 0 to go on, 1 to stop there (done), -1 to stop with the
 * error filled in. */
typedef int (*visit_fn)(void *ctx, Py_ssize_t index, const rec_t *rec, walk_error_t *err);

enum { VARINT_OK = 0, VARINT_TRUNCATED, VARINT_TOO_LONG, VARINT_RANGE };

static const char *varint_problem(int code) {
    switch (code) {
    case VARINT_TRUNCATED:
        return "is cut short";
    case VARINT_TOO_LONG:
        return "is too long";
    default:
        return "does not fit its type";
    }
}

static inline int read_varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int32_t *out) {
    uint32_t raw = 0;
    Py_ssize_t i = *pos;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (i >= end)
            return VARINT_TRUNCATED;
        uint8_t b = p[i++];
        if (shift == 28) {
            if (b & 0x80)
                return VARINT_TOO_LONG;
            if (b > 0x0F)
                return VARINT_RANGE;
        }
        raw |= (uint32_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pos = i;
            *out = (int32_t)((raw >> 1) ^ (0u - (raw & 1u)));
            return VARINT_OK;
        }
    }
    return VARINT_TOO_LONG; /* not reached */
}

static inline int read_varlong(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int64_t *out) {
    uint64_t raw = 0;
    Py_ssize_t i = *pos;
    for (int shift = 0; shift <= 63; shift += 7) {
        if (i >= end)
            return VARINT_TRUNCATED;
        uint8_t b = p[i++];
        if (shift == 63) {
            if (b & 0x80)
                return VARINT_TOO_LONG;
            if (b > 0x01)
                return VARINT_RANGE;
        }
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pos = i;
            *out = (int64_t)((raw >> 1) ^ (0ull - (raw & 1ull)));
            return VARINT_OK;
        }
    }
    return VARINT_TOO_LONG; /* not reached */
}

/* Whether p[0:n] is UTF-8 as RFC 3629 defines it (what Python's strict decoder accepts). */
static int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t b = p[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int extra;
        uint8_t low = 0x80, high = 0xBF; /* allowed range of the first continuation byte */
        if (b >= 0xC2 && b <= 0xDF) {
            extra = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            extra = 2;
            if (b == 0xE0)
                low = 0xA0; /* no overlong forms */
            else if (b == 0xED)
                high = 0x9F; /* no surrogates */
        } else if (b >= 0xF0 && b <= 0xF4) {
            extra = 3;
            if (b == 0xF0)
                low = 0x90;
            else if (b == 0xF4)
                high = 0x8F; /* nothing above U+10FFFF */
        } else {
            return 0;
        }
        if (n - i <= extra)
            return 0;
        if (p[i + 1] < low || p[i + 1] > high)
            return 0;
        for (int k = 2; k <= extra; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
        i += extra + 1;
    }
    return 1;
}

#define FAIL(...)                                                                    \
    do {                                                                             \
        err->index = index;                                                          \
        err->position = pos;                                                         \
        snprintf(err->message, sizeof(err->message), __VA_ARGS__);                   \
        return -1;                                                                   \
    } while (0)

#define VARINT(reader, limit, target, what)                                          \
    do {                                                                             \
        int _code = reader(p, (limit), &pos, (target));                              \
        if (_code != VARINT_OK)                                                      \
            FAIL("record %zd: the %s varint %s", index, (what), varint_problem(_code)); \
    } while (0)

/* Walk `count` records in p[0:n]; call `visit` on each. 0 on success, -1 with `err` filled.
 * With `prefix`, p[0:n] is only the start of the records: stop quietly where they are cut. */
static int walk(const uint8_t *p, Py_ssize_t n, int64_t count, int64_t base_timestamp,
                int prefix, visit_fn visit, void *ctx, walk_error_t *err) {
    Py_ssize_t pos = 0;
    Py_ssize_t index = -1;
    if (count < 0)
        FAIL("recordsCount %lld is negative", (long long)count);
    if (!prefix && count > n / MIN_RECORD_SIZE)
        FAIL("recordsCount %lld cannot fit in %zd bytes of records", (long long)count, n);
    for (index = 0; index < count; index++) {
        rec_t rec;
        int32_t length;
        rec.start = pos;
        if (prefix) {
            Py_ssize_t probe = pos;
            if (pos >= n || read_varint(p, n, &probe, &length) == VARINT_TRUNCATED)
                return 0;
        }
        VARINT(read_varint, n, &length, "length");
        if (length < 0)
            FAIL("record %zd has a negative length %d", index, (int)length);
        if (length > n - pos) {
            if (prefix)
                return 0;
            FAIL("record %zd has length %d but only %zd bytes of records remain", index,
                 (int)length, n - pos);
        }
        Py_ssize_t end = pos + length;
        rec.end = end;
        if (pos >= end)
            FAIL("record %zd has no attributes byte", index);
        pos++; /* attributes: unused in v2 */
        int64_t timestamp_delta;
        VARINT(read_varlong, end, &timestamp_delta, "timestampDelta");
        rec.timestamp = (int64_t)((uint64_t)base_timestamp + (uint64_t)timestamp_delta);
        VARINT(read_varint, end, &rec.offset_delta, "offsetDelta");
        if (rec.offset_delta != index)
            FAIL("record %zd has offsetDelta %d (records must have consecutive offset deltas)",
                 index, (int)rec.offset_delta);
        VARINT(read_varint, end, &rec.key_len, "key length");
        if (rec.key_len < -1)
            FAIL("record %zd has key length %d", index, (int)rec.key_len);
        rec.key_pos = pos;
        if (rec.key_len > end - pos)
            FAIL("record %zd: its key of %d bytes runs past the record", index, (int)rec.key_len);
        if (rec.key_len > 0)
            pos += rec.key_len;
        VARINT(read_varint, end, &rec.value_len, "value length");
        if (rec.value_len < -1)
            FAIL("record %zd has value length %d", index, (int)rec.value_len);
        rec.value_pos = pos;
        if (rec.value_len > end - pos)
            FAIL("record %zd: its value of %d bytes runs past the record", index,
                 (int)rec.value_len);
        if (rec.value_len > 0)
            pos += rec.value_len;
        VARINT(read_varint, end, &rec.header_count, "header count");
        if (rec.header_count < 0)
            FAIL("record %zd has header count %d", index, (int)rec.header_count);
        if (rec.header_count > (end - pos) / 2)
            FAIL("record %zd: %d headers cannot fit in the %zd bytes left of the record", index,
                 (int)rec.header_count, end - pos);
        rec.headers_pos = pos;
        for (int32_t h = 0; h < rec.header_count; h++) {
            int32_t key_len, value_len;
            VARINT(read_varint, end, &key_len, "header key length");
            if (key_len < 0)
                FAIL("record %zd: header %d has key length %d (header keys cannot be null)",
                     index, (int)h, (int)key_len);
            if (key_len > end - pos)
                FAIL("record %zd: header %d's key runs past the record", index, (int)h);
            if (!utf8_valid(p + pos, key_len))
                FAIL("record %zd: header %d's key is not UTF-8", index, (int)h);
            pos += key_len;
            VARINT(read_varint, end, &value_len, "header value length");
            if (value_len < -1)
                FAIL("record %zd: header %d has value length %d", index, (int)h, (int)value_len);
            if (value_len > end - pos)
                FAIL("record %zd: header %d's value runs past the record", index, (int)h);
            if (value_len > 0)
                pos += value_len;
        }
        if (pos != end)
            FAIL("record %zd has length %d but its fields take %zd bytes", index, (int)length,
                 pos - (end - length));
        if (visit != NULL) {
            int verdict = visit(ctx, index, &rec, err);
            if (verdict < 0)
                return -1;
            if (verdict > 0)
                return 0; /* the visitor has what it wanted */
        }
    }
    if (pos != n) {
        index = count;
        FAIL("%zd bytes follow the last of the %lld records", n - pos, (long long)count);
    }
    return 0;
}

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

static PyObject *raise_walk_error(const walk_error_t *err) {
    PyObject *args = Py_BuildValue("(snn)", err->message, err->index, err->position);
    if (args != NULL) {
        PyErr_SetObject(InvalidRecordsError, args);
        Py_DECREF(args);
    }
    return NULL;
}

PyDoc_STRVAR(scan_doc,
"scan(records, records_count, base_timestamp, lower=None, upper=None, prefix=False)\n"
"    -> (min_timestamp, max_timestamp, outside)\n\n"
"Validate the records section `records` (decompressed) of a batch declaring `records_count`\n"
"records and `base_timestamp`. Returns the smallest and largest record timestamp (-1, -1 when\n"
"there are no records) and, when `lower`/`upper` are given, the first 1000 records whose\n"
"timestamp (other than -1) lies outside [lower, upper], as a tuple of (index, timestamp).\n"
"Raises InvalidRecordsError(message, record index, byte position) on the first malformation.\n"
"With prefix=True, `records` is only the start of the section (see the module comment).");

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_timestamp;
    PyObject *lower_obj = Py_None, *upper_obj = Py_None;
    int prefix = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LL|OOp:scan", &view, &count, &base_timestamp, &lower_obj,
                          &upper_obj, &prefix))
        return NULL;
    scan_ctx_t ctx; /* 16 KB: on the stack */
    memset(&ctx, 0, sizeof(ctx));
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
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, prefix, scan_visit,
                  &ctx, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0)
        return raise_walk_error(&err);
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
    return Py_BuildValue("(LLN)", (long long)ctx.min_timestamp, (long long)ctx.max_timestamp,
                         outside);
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
"index(records, records_count, base_timestamp) -> bytes\n\n"
"Validate as `scan` does and return the layout of every record: records_count rows of nine\n"
"native-endian int64 (offset delta, timestamp, key position, key length (-1 = null), value\n"
"position, value length, position of the first header, header count, end of the record),\n"
"positions relative to the start of `records`.");

static PyObject *index_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long count, base_timestamp;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LL:index", &view, &count, &base_timestamp))
        return NULL;
    walk_error_t err;
    /* Refuse impossible counts before allocating rows for them. */
    if (count < 0 || count > view.len / MIN_RECORD_SIZE) {
        walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, NULL, NULL, &err);
        PyBuffer_Release(&view);
        return raise_walk_error(&err);
    }
    PyObject *rows = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)count * INDEX_FIELDS * 8);
    if (rows == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    index_ctx_t ctx = {(int64_t *)PyBytes_AS_STRING(rows)};
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, index_visit,
                  &ctx, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0) {
        Py_DECREF(rows);
        return raise_walk_error(&err);
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
"Records are validated as far as the walk goes (InvalidRecordsError).");

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
    result = walk((const uint8_t *)view.buf, view.len, count, base_timestamp, 0, find_visit, &ctx,
                  &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (result != 0)
        return raise_walk_error(&err);
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
