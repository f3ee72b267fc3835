/*
 * The walker over the records section of a RecordBatch v2, shared by the native modules
 * `_records.c` (validation, layouts, ListOffsets) and `_compaction.c` (the log cleaner's offset
 * map and record filter). The record layout and the rules a walk enforces are documented at the
 * top of `_records.c`.
 *
 * A walk runs in one of two modes. `consecutive` (what a producer's batch must satisfy): record i
 * has offsetDelta i. Stored (`consecutive` = 0: a batch read back from the log, which compaction
 * may have thinned): offset deltas are >= 0 and strictly increasing, so records keep their
 * original offsets after their neighbours were removed.
 *
 * Everything here is `static inline`: each module that includes the header gets its own copy and
 * the compiler may fold the visitor into the walk. No function but `raise_walk_error` touches a
 * Python object, so callers release the GIL around a walk, and take it back to raise.
 */

#ifndef ODRADEK_WALKER_H
#define ODRADEK_WALKER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* For the per-record helpers and `walk`, so that a constant visitor is folded into the loop. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define MIN_RECORD_SIZE 7 /* length, attributes, ts delta, offset delta, key, value, header count */

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
static inline int utf8_valid(const uint8_t *p, Py_ssize_t n) {
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
ALWAYS_INLINE int walk(const uint8_t *p, Py_ssize_t n, int64_t count, int64_t base_timestamp,
                       int prefix, int consecutive, visit_fn visit, void *ctx,
                       walk_error_t *err) {
    Py_ssize_t pos = 0;
    Py_ssize_t index = -1;
    int32_t previous_delta = -1;
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
        if (consecutive ? rec.offset_delta != index
                        : (rec.offset_delta < 0 || rec.offset_delta <= previous_delta))
            FAIL("record %zd has offsetDelta %d (records must have %s offset deltas)", index,
                 (int)rec.offset_delta, consecutive ? "consecutive" : "increasing");
        previous_delta = rec.offset_delta;
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

/* After a failed walk, with the GIL held: raise `error_type(message, record index, byte
 * position)` -- each module's InvalidRecordsError -- and return NULL. */
static inline PyObject *raise_walk_error(PyObject *error_type, const walk_error_t *err) {
    PyObject *args = Py_BuildValue("(snn)", err->message, err->index, err->position);
    if (args != NULL) {
        PyErr_SetObject(error_type, args);
        Py_DECREF(args);
    }
    return NULL;
}

#endif /* ODRADEK_WALKER_H */
