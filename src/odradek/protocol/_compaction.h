/*
 * What the parts of `_compaction.c` share: the RecordBatch v2 header fields the cleaner reads and
 * rewrites, the attribute bits it looks at, the decision bits and pass results of that module's
 * comment, and the guard that lets one cleaner thread at a time use an OffsetMap or IndexBuilder.
 */

#ifndef ODRADEK_COMPACTION_H
#define ODRADEK_COMPACTION_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_crc32c.h"
#include "_big_endian.h"

#define BATCH_HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define MIN_BATCH_LENGTH (BATCH_HEADER_SIZE - LOG_OVERHEAD)

#define ATTR_COMPRESSION 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_CONTROL 0x20
#define ATTR_DELETE_HORIZON 0x40

#define RETAIN_EMPTY 1
#define DISCARD_RECORDS 2
#define SET_HORIZON 4

/* Results of a pass over a buffer of batches. */
enum { PASS_DONE = 0, PASS_MAP_FULL = 1, PASS_COMPRESSED = 2, PASS_OUTPUT_FULL = 3 };

/* ---------------------------------------------------------------------------------------- */
/* Big-endian fields                                                                         */

typedef struct {
    int64_t base_offset;
    int32_t batch_length;
    uint8_t magic;
    uint16_t attributes;
    int32_t last_offset_delta;
    int64_t base_timestamp;
    int64_t max_timestamp;
    int32_t records_count;
} header_t;

static inline void read_batch_header(const uint8_t *p, header_t *h) {
    h->base_offset = (int64_t)get64(p);
    h->batch_length = (int32_t)get32(p + 8);
    h->magic = p[16];
    h->attributes = get16(p + 21);
    h->last_offset_delta = (int32_t)get32(p + 23);
    h->base_timestamp = (int64_t)get64(p + 27);
    h->max_timestamp = (int64_t)get64(p + 35);
    h->records_count = (int32_t)get32(p + 57);
}

static void finish_header(uint8_t *batch, Py_ssize_t size, uint16_t attributes,
                          int64_t base_timestamp, int64_t max_timestamp, int32_t count) {
    put32(batch + 8, (uint32_t)(size - LOG_OVERHEAD));
    put16(batch + 21, attributes);
    put64(batch + 27, (uint64_t)base_timestamp);
    put64(batch + 35, (uint64_t)max_timestamp);
    put32(batch + 57, (uint32_t)count);
    put32(batch + 17, crc32c(batch + 21, (size_t)(size - 21)));
}

/* Mark an object busy for a call that releases the GIL: RuntimeError when it already is. */
static int acquire(int *busy) {
    if (*busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a cleaner object is in use by another thread (one thread at a time)");
        return -1;
    }
    *busy = 1;
    return 0;
}

#endif
