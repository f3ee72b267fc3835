/*
 * odradek.protocol._compaction: the per-record work of the log cleaner, in C, with the GIL
 * released (the Python side is odradek.protocol.compaction and odradek.log.cleaner).
 *
 * Compaction looks at every record of the part of a log it cleans, twice: once to learn the last
 * offset of every key (the offset map), once to copy the records that are still the latest for
 * their key into new batches. Doing either in Python costs microseconds per record and holds the
 * GIL, which the broker's event loop needs; here a whole read buffer of batches is handled per
 * call, no Python object is made per record (or per batch), and the GIL is released throughout.
 *
 * OffsetMap: key -> last offset, in a fixed memory budget (Kafka's SkimpyOffsetMap). Each slot is
 * 24 bytes: a 128-bit SipHash-2-4 digest of the key (keyed with 16 random bytes chosen when the
 * map is made, so that nobody can craft keys whose digests collide; Kafka stores MD5 digests) and
 * the offset plus one (0 marks an empty slot). Open addressing with linear probing over
 * `capacity` slots, at most `load_factor` of them used: a map that reaches that is "full" and the
 * cleaner cleans only up to where it got. The slots live in an anonymous memory map: pages never
 * touched cost nothing, and `clear` hands the touched ones back to the kernel (which also zeroes
 * them), so a broker whose maps are idle does not keep them resident. Two different keys with the
 * same digest would make the cleaner drop one of them; with 128 bits that takes about 2^64 keys.
 *
 * IndexBuilder: the sparse offset and time index entries of a segment being written, with the
 * same rule as `LogSegment._index_batch` (an entry once more than index.interval.bytes were
 * written since the previous one), kept as the big-endian bytes of the index files.
 *
 * filter_batches: copies the batches of a buffer into an output buffer, keeping only the records
 * Kafka's cleaner keeps (Cleaner.shouldRetainRecord):
 *
 *   - a record past the map's latest offset (not yet mapped: the next cleaning's business);
 *   - else a record with a key, whose offset is >= the map's offset for that key, and that has a
 *     value or is a tombstone still within its delete horizon (below);
 *   - every record of a control batch (transaction markers);
 *   - records without a key are removed (Kafka counts them as invalid).
 *
 * A batch all of whose records stay, and that needs no delete horizon, is copied byte for byte.
 * Otherwise a new batch is written with the same base offset, lastOffsetDelta (so producer
 * sequences stay right), partition leader epoch, producer id, epoch and base sequence,
 * attributes, baseTimestamp and records (each byte for byte: offset deltas and timestamps are
 * kept), with recordsCount, batchLength, maxTimestamp (the largest kept record timestamp;
 * LogAppendTime batches keep theirs) and the CRC32C recomputed. A batch left with no record is
 * dropped, unless its decision says RETAIN_EMPTY (then only its header stays: Kafka keeps the
 * last batch of each live producer that way).
 *
 * Delete horizon (KIP-534, Kafka 3.1+): the first time a batch holding a tombstone is cleaned,
 * the cleaner sets attribute bit 6 and stores `now + delete.retention.ms` in baseTimestamp; the
 * records' timestamp deltas are rewritten against it, so every record keeps its timestamp. A
 * tombstone is removed once a cleaning runs at or after its batch's horizon.
 *
 * Decisions (the hook for transactions): an optional buffer of native int64 pairs (batch base
 * offset, action bits), sorted by offset, computed by the caller from batch headers: RETAIN_EMPTY
 * (1) keeps the batch even with no record left; DISCARD_RECORDS (2) removes all of its records
 * (aborted transactional data, a marker that may go); SET_HORIZON (4) gives the batch a delete
 * horizon even without a tombstone (a marker of an empty transaction). The offset map skips the
 * records of a DISCARD_RECORDS batch.
 *
 * Compressed batches are not handled here (their codecs are in Python's cramjam): both passes
 * stop at one and report it; the caller decompresses it and calls `map_records` or
 * `filter_records` on the records, which do the same per-record work on a records section.
 *
 * Threads: an OffsetMap or IndexBuilder is used by one cleaner thread at a time; each call that
 * releases the GIL marks the objects it uses busy, and a second thread calling meanwhile gets
 * RuntimeError rather than a corrupted map.
 */

#include "_walker.h"
#include "_crc32c.h"
#include "_big_endian.h"

#include <sys/mman.h>
#include <stdlib.h>

#define BATCH_HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define MIN_BATCH_LENGTH (BATCH_HEADER_SIZE - LOG_OVERHEAD)
#define SLOT_SIZE 24

#define ATTR_COMPRESSION 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_CONTROL 0x20
#define ATTR_DELETE_HORIZON 0x40

#define RETAIN_EMPTY 1
#define DISCARD_RECORDS 2
#define SET_HORIZON 4

/* Results of a pass over a buffer of batches. */
enum { PASS_DONE = 0, PASS_MAP_FULL = 1, PASS_COMPRESSED = 2, PASS_OUTPUT_FULL = 3 };

static PyObject *InvalidRecordsError;

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

/* ---------------------------------------------------------------------------------------- */
/* SipHash-2-4 with a 128-bit output (Aumasson and Bernstein's reference algorithm)          */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                           \
    do {                                                                                   \
        v0 += v1;                                                                          \
        v1 = ROTL(v1, 13);                                                                 \
        v1 ^= v0;                                                                          \
        v0 = ROTL(v0, 32);                                                                 \
        v2 += v3;                                                                          \
        v3 = ROTL(v3, 16);                                                                 \
        v3 ^= v2;                                                                          \
        v0 += v3;                                                                          \
        v3 = ROTL(v3, 21);                                                                 \
        v3 ^= v0;                                                                          \
        v2 += v1;                                                                          \
        v1 = ROTL(v1, 17);                                                                 \
        v1 ^= v2;                                                                          \
        v2 = ROTL(v2, 32);                                                                 \
    } while (0)

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void siphash128(const uint64_t key[2], const uint8_t *in, size_t len,
                              uint64_t out[2]) {
    uint64_t v0 = 0x736f6d6570736575ULL ^ key[0];
    uint64_t v1 = 0x646f72616e646f6dULL ^ key[1] ^ 0xee;
    uint64_t v2 = 0x6c7967656e657261ULL ^ key[0];
    uint64_t v3 = 0x7465646279746573ULL ^ key[1];
    const uint8_t *end = in + (len - len % 8);
    uint64_t b = ((uint64_t)len) << 56;
    for (; in != end; in += 8) {
        uint64_t m = load_le64(in);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    switch (len & 7) {
    case 7: b |= ((uint64_t)in[6]) << 48; /* fall through */
    case 6: b |= ((uint64_t)in[5]) << 40; /* fall through */
    case 5: b |= ((uint64_t)in[4]) << 32; /* fall through */
    case 4: b |= ((uint64_t)in[3]) << 24; /* fall through */
    case 3: b |= ((uint64_t)in[2]) << 16; /* fall through */
    case 2: b |= ((uint64_t)in[1]) << 8;  /* fall through */
    case 1: b |= ((uint64_t)in[0]); break;
    case 0: break;
    }
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xee;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    out[0] = v0 ^ v1 ^ v2 ^ v3;
    v1 ^= 0xdd;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    out[1] = v0 ^ v1 ^ v2 ^ v3;
}

/* ---------------------------------------------------------------------------------------- */
/* OffsetMap                                                                                 */

typedef struct {
    uint64_t digest[2];
    int64_t offset_plus_one; /* 0: empty */
} slot_t;

typedef struct {
    PyObject_HEAD
    slot_t *slots;          /* `max_slots` slots, an anonymous memory map */
    size_t mapped_bytes;
    int64_t max_slots;
    int64_t capacity;       /* slots in use since the last clear (<= max_slots) */
    int64_t touched;        /* the largest capacity since the last clear, for clearing */
    int64_t size;
    int64_t max_size;       /* capacity * load_factor: the map is full beyond */
    double load_factor;
    int64_t latest_offset;  /* the last offset the map covers (-1: none) */
    int64_t last_put;       /* the offset of the last put (-1: none) */
    uint64_t key[2];
    int busy;
} OffsetMap;

static void map_set_capacity(OffsetMap *map, int64_t capacity) {
    if (capacity < 1)
        capacity = 1;
    if (capacity > map->max_slots)
        capacity = map->max_slots;
    map->capacity = capacity;
    map->max_size = (int64_t)((double)capacity * map->load_factor);
    if (map->max_size < 1)
        map->max_size = 1;
    if (map->max_size >= capacity)
        map->max_size = capacity - 1 > 0 ? capacity - 1 : 1;
    if (capacity > map->touched)
        map->touched = capacity;
}

static void map_clear(OffsetMap *map, int64_t capacity) {
    size_t bytes = (size_t)map->touched * SLOT_SIZE;
    if (bytes > 0) {
        if (bytes <= 256 * 1024) {
            memset(map->slots, 0, bytes);
        } else {
            size_t page = 4096;
            size_t rounded = (bytes + page - 1) / page * page;
            if (rounded > map->mapped_bytes)
                rounded = map->mapped_bytes;
            /* Anonymous private pages read back as zeros after MADV_DONTNEED. */
            if (madvise(map->slots, rounded, MADV_DONTNEED) != 0)
                memset(map->slots, 0, bytes);
        }
    }
    map->touched = 0;
    map->size = 0;
    map->latest_offset = -1;
    map->last_put = -1;
    map_set_capacity(map, capacity);
}

/* The slot holding `digest`, or the empty slot where it would go. */
static inline slot_t *map_find(const OffsetMap *map, const uint64_t digest[2]) {
    uint64_t capacity = (uint64_t)map->capacity;
    uint64_t i = digest[0] % capacity;
    for (;;) {
        slot_t *slot = &map->slots[i];
        if (slot->offset_plus_one == 0 ||
            (slot->digest[0] == digest[0] && slot->digest[1] == digest[1]))
            return slot;
        if (++i == capacity)
            i = 0;
    }
}

/* 0 on success, 1 when the key is new and the map is full (nothing stored). */
static inline int map_put(OffsetMap *map, const uint8_t *key, Py_ssize_t len, int64_t offset) {
    uint64_t digest[2];
    siphash128(map->key, key, (size_t)len, digest);
    slot_t *slot = map_find(map, digest);
    if (slot->offset_plus_one == 0) {
        if (map->size >= map->max_size)
            return 1;
        slot->digest[0] = digest[0];
        slot->digest[1] = digest[1];
        map->size++;
    }
    slot->offset_plus_one = offset + 1;
    map->last_put = offset;
    return 0;
}

static inline int64_t map_get(const OffsetMap *map, const uint8_t *key, Py_ssize_t len) {
    uint64_t digest[2];
    siphash128(map->key, key, (size_t)len, digest);
    return map_find(map, digest)->offset_plus_one - 1;
}

static int acquire(int *busy) {
    if (*busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a cleaner object is in use by another thread (one thread at a time)");
        return -1;
    }
    *busy = 1;
    return 0;
}

static PyObject *OffsetMap_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"memory", "load_factor", "seed", NULL};
    long long memory;
    double load_factor = 0.9;
    Py_buffer seed = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|dy*:OffsetMap", kwlist, &memory,
                                     &load_factor, &seed))
        return NULL;
    if (seed.buf != NULL && seed.len != 16) {
        PyBuffer_Release(&seed);
        PyErr_SetString(PyExc_ValueError, "seed must be 16 bytes");
        return NULL;
    }
    if (memory < 2 * SLOT_SIZE || !(load_factor > 0.0 && load_factor <= 1.0)) {
        if (seed.buf != NULL)
            PyBuffer_Release(&seed);
        PyErr_Format(PyExc_ValueError,
                     "an offset map needs at least %d bytes and a load factor in (0, 1]",
                     2 * SLOT_SIZE);
        return NULL;
    }
    OffsetMap *map = (OffsetMap *)type->tp_alloc(type, 0);
    if (map == NULL) {
        if (seed.buf != NULL)
            PyBuffer_Release(&seed);
        return NULL;
    }
    map->max_slots = memory / SLOT_SIZE;
    map->mapped_bytes = (size_t)map->max_slots * SLOT_SIZE;
    void *slots = mmap(NULL, map->mapped_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (slots == MAP_FAILED) {
        if (seed.buf != NULL)
            PyBuffer_Release(&seed);
        Py_DECREF(map);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    map->slots = (slot_t *)slots;
    map->load_factor = load_factor;
    if (seed.buf != NULL) {
        memcpy(map->key, seed.buf, 16);
        PyBuffer_Release(&seed);
    } else {
        PyObject *os = PyImport_ImportModule("os");
        PyObject *random = os == NULL ? NULL : PyObject_CallMethod(os, "urandom", "i", 16);
        Py_XDECREF(os);
        if (random == NULL) {
            Py_DECREF(map);
            return NULL;
        }
        memcpy(map->key, PyBytes_AS_STRING(random), 16);
        Py_DECREF(random);
    }
    map->touched = 0;
    map_clear(map, map->max_slots);
    return (PyObject *)map;
}

static void OffsetMap_dealloc(OffsetMap *map) {
    if (map->slots != NULL)
        munmap(map->slots, map->mapped_bytes);
    Py_TYPE(map)->tp_free((PyObject *)map);
}

static PyObject *OffsetMap_clear(OffsetMap *map, PyObject *args) {
    PyObject *capacity_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O:clear", &capacity_obj))
        return NULL;
    int64_t capacity = map->max_slots;
    if (capacity_obj != Py_None) {
        capacity = PyLong_AsLongLong(capacity_obj);
        if (capacity == -1 && PyErr_Occurred())
            return NULL;
    }
    if (acquire(&map->busy) < 0)
        return NULL;
    map_clear(map, capacity);
    map->busy = 0;
    Py_RETURN_NONE;
}

static PyObject *OffsetMap_put(OffsetMap *map, PyObject *args) {
    Py_buffer key;
    long long offset;
    if (!PyArg_ParseTuple(args, "y*L:put", &key, &offset))
        return NULL;
    if (map->busy) {
        PyBuffer_Release(&key);
        return acquire(&map->busy) < 0 ? NULL : NULL;
    }
    int full = map_put(map, key.buf, key.len, offset);
    PyBuffer_Release(&key);
    return PyBool_FromLong(!full);
}

static PyObject *OffsetMap_get(OffsetMap *map, PyObject *args) {
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*:get", &key))
        return NULL;
    if (map->busy) {
        PyBuffer_Release(&key);
        return acquire(&map->busy) < 0 ? NULL : NULL;
    }
    int64_t offset = map_get(map, key.buf, key.len);
    PyBuffer_Release(&key);
    return PyLong_FromLongLong(offset);
}

static PyObject *OffsetMap_get_latest(OffsetMap *map, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(map->latest_offset);
}

static int OffsetMap_set_latest(OffsetMap *map, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "latest_offset cannot be deleted");
        return -1;
    }
    long long offset = PyLong_AsLongLong(value);
    if (offset == -1 && PyErr_Occurred())
        return -1;
    map->latest_offset = offset;
    return 0;
}

#define INT64_GETTER(name, expr)                                                           \
    static PyObject *OffsetMap_get_##name(OffsetMap *map, void *closure) {                 \
        (void)closure;                                                                     \
        return PyLong_FromLongLong((long long)(expr));                                     \
    }
INT64_GETTER(size, map->size)
INT64_GETTER(slots, map->max_slots)
INT64_GETTER(capacity, map->capacity)
INT64_GETTER(max_size, map->max_size)
INT64_GETTER(last_put, map->last_put)

static PyObject *OffsetMap_get_utilization(OffsetMap *map, void *closure) {
    (void)closure;
    return PyFloat_FromDouble((double)map->size / (double)map->capacity);
}

static PyGetSetDef OffsetMap_getset[] = {
    {"latest_offset", (getter)OffsetMap_get_latest, (setter)OffsetMap_set_latest,
     "The last offset the map covers (-1 when none): records after it are kept.", NULL},
    {"size", (getter)OffsetMap_get_size, NULL, "Keys in the map.", NULL},
    {"slots", (getter)OffsetMap_get_slots, NULL, "Slots the memory budget holds.", NULL},
    {"capacity", (getter)OffsetMap_get_capacity, NULL, "Slots in use since the last clear.",
     NULL},
    {"max_size", (getter)OffsetMap_get_max_size, NULL,
     "Keys the map takes before it is full (capacity x load factor).", NULL},
    {"last_put", (getter)OffsetMap_get_last_put, NULL,
     "The offset of the last key stored (-1: none since the last clear).", NULL},
    {"utilization", (getter)OffsetMap_get_utilization, NULL, "size / capacity.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef OffsetMap_methods[] = {
    {"clear", (PyCFunction)OffsetMap_clear, METH_VARARGS,
     "clear(capacity=None): empty the map and use `capacity` slots (at most `slots`)."},
    {"put", (PyCFunction)OffsetMap_put, METH_VARARGS,
     "put(key, offset) -> bool: store the key's offset; False if the key is new and the map full."},
    {"get", (PyCFunction)OffsetMap_get, METH_VARARGS,
     "get(key) -> int: the key's offset, or -1."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OffsetMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "odradek.protocol._compaction.OffsetMap",
    .tp_basicsize = sizeof(OffsetMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "OffsetMap(memory, load_factor=0.9, seed=None): key digest -> last offset.",
    .tp_new = OffsetMap_new,
    .tp_dealloc = (destructor)OffsetMap_dealloc,
    .tp_methods = OffsetMap_methods,
    .tp_getset = OffsetMap_getset,
};

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

/* ---------------------------------------------------------------------------------------- */
/* Decisions                                                                                 */

typedef struct {
    const int64_t *pairs; /* (base offset, action) */
    Py_ssize_t count;
} decisions_t;

static inline int64_t decision_for(const decisions_t *d, int64_t base_offset) {
    Py_ssize_t lo = 0, hi = d->count;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        int64_t key = d->pairs[2 * mid];
        if (key == base_offset)
            return d->pairs[2 * mid + 1];
        if (key < base_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static int parse_decisions(PyObject *obj, Py_buffer *view, decisions_t *d) {
    d->pairs = NULL;
    d->count = 0;
    view->buf = NULL;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % 16 != 0) {
        PyBuffer_Release(view);
        view->buf = NULL;
        PyErr_SetString(PyExc_ValueError, "decisions must be pairs of native int64");
        return -1;
    }
    d->pairs = (const int64_t *)view->buf;
    d->count = view->len / 16;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Varint writers and record skipping                                                        */

static inline int write_uvarint(uint8_t *p, uint64_t v) {
    int n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static inline int write_varlong(uint8_t *p, int64_t v) {
    return write_uvarint(p, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

static inline int write_varint(uint8_t *p, int32_t v) {
    return write_uvarint(p, (uint32_t)(((uint32_t)v << 1) ^ (uint32_t)(v >> 31)));
}

/* Past a varint the walker has already validated. */
static inline Py_ssize_t skip_varint(const uint8_t *p, Py_ssize_t i) {
    while (p[i] & 0x80)
        i++;
    return i + 1;
}

/* ---------------------------------------------------------------------------------------- */
/* The map pass                                                                              */

typedef struct {
    OffsetMap *map;
    const uint8_t *records;
    int64_t base_offset;
    int64_t start_offset;
    int64_t records_read;
    int full;
} map_ctx_t;

static int map_visit(void *ctx_, Py_ssize_t index, const rec_t *rec, walk_error_t *err) {
    map_ctx_t *ctx = (map_ctx_t *)ctx_;
    (void)index;
    (void)err;
    int64_t offset = ctx->base_offset + rec->offset_delta;
    if (rec->key_len >= 0 && offset >= ctx->start_offset) {
        if (map_put(ctx->map, ctx->records + rec->key_pos, rec->key_len, offset)) {
            ctx->full = 1;
            return 1;
        }
    }
    ctx->records_read++;
    return 0;
}

/* The map filled up part way: it covers what it holds. Kafka's rule is to cover up to the end of
 * the last batch mapped whole; when not even one batch was, the last key stored still makes
 * progress (records after it are kept, as unmapped). */
static void on_map_full(OffsetMap *map, int64_t start_offset) {
    if (map->latest_offset < start_offset && map->last_put >= start_offset)
        map->latest_offset = map->last_put;
}

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
    Py_ssize_t consumed;
    int status;
    int64_t records_read;
    int64_t records_kept;
    int64_t tombstones_kept;
    int64_t needed; /* bytes the next batch needs when a buffer is too small */
    walk_error_t err;
    int error;
} pass_t;

static void pass_fail(pass_t *pass, const char *what, const header_t *h, const walk_error_t *e) {
    pass->error = 1;
    pass->err.index = e == NULL ? -1 : e->index;
    pass->err.position = pass->consumed;
    if (e == NULL)
        snprintf(pass->err.message, sizeof(pass->err.message), "batch at offset %lld: %s",
                 (long long)h->base_offset, what);
    else
        snprintf(pass->err.message, sizeof(pass->err.message), "batch at offset %lld: %.160s",
                 (long long)h->base_offset, e->message);
}

/* The header of the batch at the pass's position: 0 when the whole batch is there, 1 when it is
 * not (stop: the caller reads more), -1 when it cannot be a batch (error filled in). */
static int next_batch(pass_t *pass, header_t *h) {
    Py_ssize_t left = pass->n - pass->consumed;
    if (left < BATCH_HEADER_SIZE) {
        pass->needed = BATCH_HEADER_SIZE;
        return 1;
    }
    read_batch_header(pass->p + pass->consumed, h);
    if (h->batch_length < MIN_BATCH_LENGTH) {
        pass_fail(pass, "batchLength is too small", h, NULL);
        return -1;
    }
    if ((Py_ssize_t)h->batch_length + LOG_OVERHEAD > left) {
        pass->needed = (int64_t)h->batch_length + LOG_OVERHEAD;
        return 1;
    }
    if (h->magic != 2) {
        pass_fail(pass, "magic is not 2 (only v2 batches can be cleaned)", h, NULL);
        return -1;
    }
    if (h->records_count < 0 || h->last_offset_delta < 0) {
        pass_fail(pass, "negative recordsCount or lastOffsetDelta", h, NULL);
        return -1;
    }
    return 0;
}

static void map_pass(pass_t *pass, OffsetMap *map, int64_t start_offset, const decisions_t *d) {
    header_t h;
    while (next_batch(pass, &h) == 0) {
        int64_t last_offset = h.base_offset + h.last_offset_delta;
        int64_t action = decision_for(d, h.base_offset);
        int walk_it = !(h.attributes & ATTR_CONTROL) && !(action & DISCARD_RECORDS) &&
                      last_offset >= start_offset;
        if (walk_it && (h.attributes & ATTR_COMPRESSION)) {
            pass->status = PASS_COMPRESSED;
            return;
        }
        if (walk_it) {
            const uint8_t *records = pass->p + pass->consumed + BATCH_HEADER_SIZE;
            Py_ssize_t length = (Py_ssize_t)h.batch_length + LOG_OVERHEAD - BATCH_HEADER_SIZE;
            map_ctx_t ctx = {map, records, h.base_offset, start_offset, 0, 0};
            walk_error_t err;
            if (walk(records, length, h.records_count, h.base_timestamp, 0, 0, map_visit, &ctx,
                     &err) != 0) {
                pass_fail(pass, NULL, &h, &err);
                return;
            }
            pass->records_read += ctx.records_read;
            if (ctx.full) {
                on_map_full(map, start_offset);
                pass->status = PASS_MAP_FULL;
                return;
            }
        } else {
            pass->records_read += h.records_count;
        }
        if (last_offset >= start_offset && last_offset > map->latest_offset)
            map->latest_offset = last_offset;
        pass->consumed += (Py_ssize_t)h.batch_length + LOG_OVERHEAD;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The filter pass                                                                           */

typedef struct {
    Py_ssize_t start;           /* the length varint */
    Py_ssize_t attributes;      /* the attributes byte */
    Py_ssize_t after_timestamp; /* the first byte after the timestampDelta varlong */
    Py_ssize_t end;
    int64_t timestamp;
} kept_t;

typedef struct {
    OffsetMap *map;
    const uint8_t *records;
    int64_t base_offset;
    int control;
    int retain_deletes;
    kept_t *kept;
    Py_ssize_t kept_count;
    Py_ssize_t kept_cap;
    int tombstone;
    int64_t tombstones; /* kept tombstones, over every batch */
    int64_t max_timestamp;
} filter_ctx_t;

static int filter_visit(void *ctx_, Py_ssize_t index, const rec_t *rec, walk_error_t *err) {
    filter_ctx_t *ctx = (filter_ctx_t *)ctx_;
    OffsetMap *map = ctx->map;
    (void)index;
    (void)err;
    int64_t offset = ctx->base_offset + rec->offset_delta;
    int keep;
    if (ctx->control || offset > map->latest_offset)
        keep = 1;
    else if (rec->key_len < 0)
        keep = 0; /* a record without a key cannot be compacted: Kafka drops it */
    else
        keep = offset >= map_get(map, ctx->records + rec->key_pos, rec->key_len) &&
               (rec->value_len >= 0 || ctx->retain_deletes);
    if (!keep)
        return 0;
    kept_t *k = &ctx->kept[ctx->kept_count++];
    k->start = rec->start;
    k->attributes = skip_varint(ctx->records, rec->start);
    k->after_timestamp = skip_varint(ctx->records, k->attributes + 1);
    k->end = rec->end;
    k->timestamp = rec->timestamp;
    if (rec->value_len < 0 && !ctx->control) {
        ctx->tombstone = 1;
        ctx->tombstones++;
    }
    if (rec->timestamp > ctx->max_timestamp)
        ctx->max_timestamp = rec->timestamp;
    return 0;
}

/* Write the kept records as a records section at `out`; returns its length. With `set_horizon`
 * the timestamp deltas are rewritten against `new_base` so that each record keeps its timestamp. */
static Py_ssize_t write_kept(uint8_t *out, const filter_ctx_t *ctx, int set_horizon,
                             int64_t new_base) {
    uint8_t *w = out;
    const uint8_t *records = ctx->records;
    for (Py_ssize_t i = 0; i < ctx->kept_count; i++) {
        const kept_t *k = &ctx->kept[i];
        if (!set_horizon) {
            memcpy(w, records + k->start, (size_t)(k->end - k->start));
            w += k->end - k->start;
            continue;
        }
        uint8_t delta[10];
        int delta_len =
            write_varlong(delta, (int64_t)((uint64_t)k->timestamp - (uint64_t)new_base));
        Py_ssize_t rest = k->end - k->after_timestamp;
        w += write_varint(w, (int32_t)(1 + delta_len + rest));
        *w++ = records[k->attributes];
        memcpy(w, delta, (size_t)delta_len);
        w += delta_len;
        memcpy(w, records + k->after_timestamp, (size_t)rest);
        w += rest;
    }
    return w - out;
}

/* The most a rewritten batch can grow per record: a timestamp delta from 1 to 10 bytes and a
 * record length varint from 1 to 5. */
#define GROWTH_PER_RECORD 13

static int ensure_kept(filter_ctx_t *ctx, Py_ssize_t count) {
    if (count <= ctx->kept_cap)
        return 0;
    kept_t *bigger = realloc(ctx->kept, (size_t)count * sizeof(kept_t));
    if (bigger == NULL)
        return -1;
    ctx->kept = bigger;
    ctx->kept_cap = count;
    return 0;
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

typedef struct {
    uint8_t *out;
    Py_ssize_t out_len;
    Py_ssize_t written;
    int64_t now_ms;
    int64_t horizon_ms;
    IndexBuilder *builder;
} output_t;

static void filter_pass(pass_t *pass, const decisions_t *d, output_t *o, filter_ctx_t *ctx) {
    header_t h;
    while (next_batch(pass, &h) == 0) {
        const uint8_t *batch = pass->p + pass->consumed;
        Py_ssize_t size = (Py_ssize_t)h.batch_length + LOG_OVERHEAD;
        int64_t last_offset = h.base_offset + h.last_offset_delta;
        int64_t action = decision_for(d, h.base_offset);
        int discard = (action & DISCARD_RECORDS) != 0;
        if (!discard && (h.attributes & ATTR_COMPRESSION)) {
            pass->status = PASS_COMPRESSED;
            return;
        }
        int64_t worst = size + (int64_t)GROWTH_PER_RECORD * h.records_count;
        if (worst > o->out_len - o->written) {
            pass->status = PASS_OUTPUT_FULL;
            pass->needed = worst;
            return;
        }
        ctx->kept_count = 0;
        ctx->tombstone = 0;
        ctx->max_timestamp = -1;
        if (!discard) {
            if (ensure_kept(ctx, h.records_count) < 0) {
                pass_fail(pass, "out of memory", &h, NULL);
                return;
            }
            ctx->records = batch + BATCH_HEADER_SIZE;
            ctx->base_offset = h.base_offset;
            ctx->control = (h.attributes & ATTR_CONTROL) != 0;
            ctx->retain_deletes =
                !(h.attributes & ATTR_DELETE_HORIZON) || o->now_ms < h.base_timestamp;
            walk_error_t err;
            if (walk(ctx->records, size - BATCH_HEADER_SIZE, h.records_count, h.base_timestamp, 0,
                     0, filter_visit, ctx, &err) != 0) {
                pass_fail(pass, NULL, &h, &err);
                return;
            }
        }
        pass->records_read += h.records_count;
        pass->records_kept += ctx->kept_count;
        int set_horizon = ctx->kept_count > 0 && !(h.attributes & ATTR_DELETE_HORIZON) &&
                          (ctx->tombstone || (action & SET_HORIZON));
        uint8_t *w = o->out + o->written;
        Py_ssize_t out_size = 0;
        int64_t out_max_timestamp = h.max_timestamp;
        if (ctx->kept_count == h.records_count && !set_horizon && !discard) {
            memcpy(w, batch, (size_t)size);
            out_size = size;
        } else if (ctx->kept_count > 0) {
            memcpy(w, batch, BATCH_HEADER_SIZE);
            int64_t base = set_horizon ? o->horizon_ms : h.base_timestamp;
            out_size = BATCH_HEADER_SIZE + write_kept(w + BATCH_HEADER_SIZE, ctx, set_horizon, base);
            if (!(h.attributes & ATTR_LOG_APPEND_TIME))
                out_max_timestamp = ctx->max_timestamp;
            finish_header(w, out_size,
                          (uint16_t)(h.attributes | (set_horizon ? ATTR_DELETE_HORIZON : 0)), base,
                          out_max_timestamp, (int32_t)ctx->kept_count);
        } else if (action & RETAIN_EMPTY) {
            /* Kafka's empty batch: the header alone, uncompressed, timestamps = maxTimestamp. */
            memcpy(w, batch, BATCH_HEADER_SIZE);
            out_size = BATCH_HEADER_SIZE;
            finish_header(w, out_size,
                          (uint16_t)(h.attributes & ~(ATTR_COMPRESSION | ATTR_DELETE_HORIZON)),
                          h.max_timestamp, h.max_timestamp, 0);
        }
        if (out_size > 0) {
            index_add(o->builder, last_offset, out_size, out_max_timestamp);
            if (o->builder->failed) {
                pass_fail(pass, "out of memory", &h, NULL);
                return;
            }
            o->written += out_size;
        }
        pass->consumed += size;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Python entry points                                                                       */

static PyObject *raise_pass_error(const pass_t *pass) {
    PyObject *args = Py_BuildValue("(snn)", pass->err.message, pass->err.index, pass->err.position);
    if (args != NULL) {
        PyErr_SetObject(InvalidRecordsError, args);
        Py_DECREF(args);
    }
    return NULL;
}

PyDoc_STRVAR(map_batches_doc,
"map_batches(map, batches, start_offset, decisions=None)\n"
"    -> (consumed, status, records_read, needed)\n\n"
"Add the keys of the records at offsets >= start_offset in the batches of `batches` to `map`,\n"
"batch by batch, and move map.latest_offset to each batch's last offset. Stops at the end of the\n"
"complete batches (status 0; `needed`: what the incomplete next batch needs), when the map is\n"
"full (1), or at a compressed batch (2: map its decompressed records with map_records).\n"
"`consumed` bytes were handled.");

static PyObject *map_batches(PyObject *self, PyObject *args) {
    OffsetMap *map;
    Py_buffer view;
    long long start_offset;
    PyObject *decisions_obj = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*L|O:map_batches", &OffsetMapType, &map, &view,
                          &start_offset, &decisions_obj))
        return NULL;
    Py_buffer decisions_view;
    decisions_t d;
    if (parse_decisions(decisions_obj, &decisions_view, &d) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (acquire(&map->busy) < 0) {
        PyBuffer_Release(&view);
        if (decisions_view.buf != NULL)
            PyBuffer_Release(&decisions_view);
        return NULL;
    }
    pass_t pass;
    memset(&pass, 0, sizeof(pass));
    pass.p = view.buf;
    pass.n = view.len;
    Py_BEGIN_ALLOW_THREADS
    map_pass(&pass, map, start_offset, &d);
    Py_END_ALLOW_THREADS
    map->busy = 0;
    PyBuffer_Release(&view);
    if (decisions_view.buf != NULL)
        PyBuffer_Release(&decisions_view);
    if (pass.error)
        return raise_pass_error(&pass);
    return Py_BuildValue("(niLL)", pass.consumed, pass.status, (long long)pass.records_read,
                         (long long)pass.needed);
}

PyDoc_STRVAR(map_records_doc,
"map_records(map, records, records_count, base_offset, base_timestamp, start_offset,\n"
"            last_offset) -> bool\n\n"
"map_batches for one (decompressed) records section: True when the map filled up part way;\n"
"otherwise map.latest_offset moves to `last_offset` (the batch's) if that is >= start_offset.");

static PyObject *map_records(PyObject *self, PyObject *args) {
    OffsetMap *map;
    Py_buffer view;
    long long count, base_offset, base_timestamp, start_offset, last_offset;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*LLLLL:map_records", &OffsetMapType, &map, &view, &count,
                          &base_offset, &base_timestamp, &start_offset, &last_offset))
        return NULL;
    if (acquire(&map->busy) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    map_ctx_t ctx = {map, view.buf, base_offset, start_offset, 0, 0};
    walk_error_t err;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = walk(view.buf, view.len, count, base_timestamp, 0, 0, map_visit, &ctx, &err);
    if (result == 0) {
        if (ctx.full)
            on_map_full(map, start_offset);
        else if (last_offset >= start_offset && last_offset > map->latest_offset)
            map->latest_offset = last_offset;
    }
    Py_END_ALLOW_THREADS
    map->busy = 0;
    PyBuffer_Release(&view);
    if (result != 0) {
        PyObject *e = Py_BuildValue("(snn)", err.message, err.index, err.position);
        if (e != NULL) {
            PyErr_SetObject(InvalidRecordsError, e);
            Py_DECREF(e);
        }
        return NULL;
    }
    return PyBool_FromLong(ctx.full);
}

PyDoc_STRVAR(filter_batches_doc,
"filter_batches(map, batches, out, out_offset, now_ms, horizon_ms, decisions, builder)\n"
"    -> (consumed, written, status, records_read, records_kept, tombstones_kept, needed)\n\n"
"Copy the batches of `batches` into the writable buffer `out` from `out_offset`, keeping the\n"
"records the cleaner keeps (module comment); each batch written is added to the IndexBuilder\n"
"`builder`. `horizon_ms` is the delete horizon given to batches that get one now (now_ms +\n"
"delete.retention.ms). Stops at the end of the complete batches (status 0), at a compressed batch\n"
"(2: filter_records), or when `out` has no room for the next batch (3: `needed` bytes free are\n"
"enough). `written` is the new end of the data in `out`.");

static PyObject *filter_batches(PyObject *self, PyObject *args) {
    OffsetMap *map;
    IndexBuilder *builder;
    Py_buffer view, out;
    Py_ssize_t out_offset;
    long long now_ms, horizon_ms;
    PyObject *decisions_obj;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*w*nLLOO!:filter_batches", &OffsetMapType, &map, &view, &out,
                          &out_offset, &now_ms, &horizon_ms, &decisions_obj, &IndexBuilderType,
                          &builder))
        return NULL;
    Py_buffer decisions_view;
    decisions_t d;
    PyObject *result = NULL;
    if (out_offset < 0 || out_offset > out.len) {
        PyErr_SetString(PyExc_ValueError, "out_offset lies outside the output buffer");
        goto release;
    }
    if (parse_decisions(decisions_obj, &decisions_view, &d) < 0)
        goto release;
    if (acquire(&map->busy) < 0)
        goto release_decisions;
    if (acquire(&builder->busy) < 0) {
        map->busy = 0;
        goto release_decisions;
    }
    pass_t pass;
    memset(&pass, 0, sizeof(pass));
    pass.p = view.buf;
    pass.n = view.len;
    output_t o = {out.buf, out.len, out_offset, now_ms, horizon_ms, builder};
    filter_ctx_t ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.map = map;
    Py_BEGIN_ALLOW_THREADS
    filter_pass(&pass, &d, &o, &ctx);
    Py_END_ALLOW_THREADS
    free(ctx.kept);
    map->busy = 0;
    builder->busy = 0;
    if (pass.error)
        raise_pass_error(&pass);
    else
        result = Py_BuildValue("(nniLLLL)", pass.consumed, o.written, pass.status,
                               (long long)pass.records_read, (long long)pass.records_kept,
                               (long long)ctx.tombstones, (long long)pass.needed);
release_decisions:
    if (decisions_view.buf != NULL)
        PyBuffer_Release(&decisions_view);
release:
    PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(filter_records_doc,
"filter_records(map, records, records_count, base_offset, base_timestamp, attributes, now_ms,\n"
"               horizon_ms, action)\n"
"    -> (kept, max_timestamp, set_horizon, records_or_None, tombstones_kept)\n\n"
"The filter of filter_batches for one (decompressed) records section: how many records stay,\n"
"their largest timestamp, whether the batch gets its delete horizon now, and the new records\n"
"section (deltas rewritten against horizon_ms when set_horizon), or None when the batch stays\n"
"as it is.");

static PyObject *filter_records(PyObject *self, PyObject *args) {
    OffsetMap *map;
    Py_buffer view;
    long long count, base_offset, base_timestamp, now_ms, horizon_ms, action;
    int attributes;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*LLLiLLL:filter_records", &OffsetMapType, &map, &view, &count,
                          &base_offset, &base_timestamp, &attributes, &now_ms, &horizon_ms,
                          &action))
        return NULL;
    if (count < 0 || count > view.len / MIN_RECORD_SIZE + 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(InvalidRecordsError, "recordsCount does not fit the records");
        return NULL;
    }
    if (acquire(&map->busy) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    filter_ctx_t ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.map = map;
    ctx.records = view.buf;
    ctx.base_offset = base_offset;
    ctx.control = (attributes & ATTR_CONTROL) != 0;
    ctx.retain_deletes = !(attributes & ATTR_DELETE_HORIZON) || now_ms < base_timestamp;
    ctx.max_timestamp = -1;
    PyObject *result = NULL;
    if (ensure_kept(&ctx, (Py_ssize_t)count) < 0) {
        map->busy = 0;
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    walk_error_t err;
    int walked;
    Py_BEGIN_ALLOW_THREADS
    walked = walk(view.buf, view.len, count, base_timestamp, 0, 0, filter_visit, &ctx, &err);
    Py_END_ALLOW_THREADS
    map->busy = 0;
    if (walked != 0) {
        PyObject *e = Py_BuildValue("(snn)", err.message, err.index, err.position);
        if (e != NULL) {
            PyErr_SetObject(InvalidRecordsError, e);
            Py_DECREF(e);
        }
        goto done;
    }
    int set_horizon = ctx.kept_count > 0 && !(attributes & ATTR_DELETE_HORIZON) &&
                      (ctx.tombstone || (action & SET_HORIZON));
    if (ctx.kept_count == count && !set_horizon) {
        result = Py_BuildValue("(nLOOL)", ctx.kept_count, (long long)ctx.max_timestamp, Py_False,
                               Py_None, (long long)ctx.tombstones);
        goto done;
    }
    PyObject *section = PyBytes_FromStringAndSize(
        NULL, view.len + (Py_ssize_t)GROWTH_PER_RECORD * ctx.kept_count);
    if (section == NULL)
        goto done;
    Py_ssize_t length;
    Py_BEGIN_ALLOW_THREADS
    length = write_kept((uint8_t *)PyBytes_AS_STRING(section), &ctx, set_horizon,
                        set_horizon ? horizon_ms : base_timestamp);
    Py_END_ALLOW_THREADS
    if (_PyBytes_Resize(&section, length) < 0)
        goto done;
    result = Py_BuildValue("(nLONL)", ctx.kept_count, (long long)ctx.max_timestamp,
                           set_horizon ? Py_True : Py_False, section, (long long)ctx.tombstones);
done:
    free(ctx.kept);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(finish_batch_doc,
"finish_batch(batch, attributes, base_timestamp, max_timestamp, records_count)\n\n"
"Set those header fields and batchLength (from len(batch)) of the batch in the writable buffer\n"
"`batch` and recompute its CRC32C.");

static PyObject *finish_batch(PyObject *self, PyObject *args) {
    Py_buffer batch;
    int attributes, count;
    long long base_timestamp, max_timestamp;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*iLLi:finish_batch", &batch, &attributes, &base_timestamp,
                          &max_timestamp, &count))
        return NULL;
    if (batch.len < BATCH_HEADER_SIZE) {
        PyBuffer_Release(&batch);
        PyErr_SetString(PyExc_ValueError, "shorter than a batch header");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    finish_header(batch.buf, batch.len, (uint16_t)attributes, base_timestamp, max_timestamp,
                  count);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&batch);
    Py_RETURN_NONE;
}

static PyObject *crc32c_py(PyObject *self, PyObject *args) {
    Py_buffer data;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:crc32c", &data))
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc32c(data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *siphash_py(PyObject *self, PyObject *args) {
    Py_buffer key, data;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*:siphash128", &key, &data))
        return NULL;
    if (key.len != 16) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "the key must be 16 bytes");
        return NULL;
    }
    uint64_t k[2] = {load_le64(key.buf), load_le64((const uint8_t *)key.buf + 8)};
    uint64_t out[2];
    siphash128(k, data.buf, (size_t)data.len, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    uint8_t digest[16];
    for (int i = 0; i < 8; i++) {
        digest[i] = (uint8_t)(out[0] >> (8 * i));
        digest[8 + i] = (uint8_t)(out[1] >> (8 * i));
    }
    return PyBytes_FromStringAndSize((const char *)digest, 16);
}

static PyMethodDef methods[] = {
    {"map_batches", map_batches, METH_VARARGS, map_batches_doc},
    {"map_records", map_records, METH_VARARGS, map_records_doc},
    {"filter_batches", filter_batches, METH_VARARGS, filter_batches_doc},
    {"filter_records", filter_records, METH_VARARGS, filter_records_doc},
    {"finish_batch", finish_batch, METH_VARARGS, finish_batch_doc},
    {"crc32c", crc32c_py, METH_VARARGS, "crc32c(data) -> int: CRC32C (Castagnoli)."},
    {"siphash128", siphash_py, METH_VARARGS,
     "siphash128(key16, data) -> bytes: SipHash-2-4 with 128-bit output, little-endian."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    crc32c_setup();
    InvalidRecordsError = PyErr_NewExceptionWithDoc(
        "odradek.protocol._compaction.InvalidRecordsError",
        "Batches the cleaner cannot read: args are (message, record index, byte position).",
        PyExc_ValueError, NULL);
    if (InvalidRecordsError == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "InvalidRecordsError", InvalidRecordsError) < 0)
        return -1;
    if (PyType_Ready(&OffsetMapType) < 0 || PyType_Ready(&IndexBuilderType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "OffsetMap", (PyObject *)&OffsetMapType) < 0 ||
        PyModule_AddObjectRef(module, "IndexBuilder", (PyObject *)&IndexBuilderType) < 0)
        return -1;
    struct {
        const char *name;
        long value;
    } constants[] = {
        {"RETAIN_EMPTY", RETAIN_EMPTY},     {"DISCARD_RECORDS", DISCARD_RECORDS},
        {"SET_HORIZON", SET_HORIZON},       {"PASS_DONE", PASS_DONE},
        {"PASS_MAP_FULL", PASS_MAP_FULL},   {"PASS_COMPRESSED", PASS_COMPRESSED},
        {"PASS_OUTPUT_FULL", PASS_OUTPUT_FULL}, {"SLOT_SIZE", SLOT_SIZE},
        {"GROWTH_PER_RECORD", GROWTH_PER_RECORD}, {"HW_CRC", use_hw_crc},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++)
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0)
            return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "odradek.protocol._compaction",
    "The log cleaner's per-record work (see odradek.protocol.compaction).",
    0,
    methods,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__compaction(void) { return PyModuleDef_Init(&module_def); }
