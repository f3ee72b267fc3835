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
 * OffsetMap: key -> last offset, in a fixed memory budget (Kafka's SkimpyOffsetMap), keyed by
 * a 128-bit SipHash-2-4 digest of the key (`_offset_map.h` describes its slots and memory).
 *
 * IndexBuilder: the sparse offset and time index entries of a segment being written
 * (`_index_builder.h`).
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
 *
 * The code: this file holds the Python entry points and the module's tables; the map and
 * filter passes (with the decisions and the batch cursor) are in `_compaction_passes.h`, the
 * two types in `_offset_map.h` and `_index_builder.h`, and what they all share (the batch header
 * fields and bits, the busy guard) in `_compaction.h`. They are compiled as this one unit:
 * everything is `static`.
 */

#include "_compaction.h"
#include "_offset_map.h"
#include "_index_builder.h"
#include "_compaction_passes.h"

#include <stdlib.h>

static PyObject *InvalidRecordsError;

/* ---------------------------------------------------------------------------------------- */
/* Python entry points                                                                       */

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
        return raise_walk_error(InvalidRecordsError, &pass.err);
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
    if (result != 0)
        return raise_walk_error(InvalidRecordsError, &err);
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
        raise_walk_error(InvalidRecordsError, &pass.err);
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
        raise_walk_error(InvalidRecordsError, &err);
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
