/*
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
 * Part of `_compaction.c` (see its comment for how the cleaner uses the map).
 */

#ifndef ODRADEK_OFFSET_MAP_H
#define ODRADEK_OFFSET_MAP_H

#include "_compaction.h"

#include <string.h>
#include <sys/mman.h>

#define SLOT_SIZE 24

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

#endif
