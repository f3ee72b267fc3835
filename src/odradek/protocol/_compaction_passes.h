/*
 * The two passes of `_compaction.c` over a buffer of batches (its comment states the rules): the
 * map pass puts each record's key and offset into the OffsetMap, the filter pass copies the
 * batches keeping the records still latest for their key, rewriting a batch that lost records or
 * gets its delete horizon. With them: the caller's decisions, varint writers, and the cursor
 * (pass_t) that reads one complete batch header at a time. No function here touches a Python
 * object except parse_decisions: the passes run with the GIL released.
 */

#ifndef ODRADEK_COMPACTION_PASSES_H
#define ODRADEK_COMPACTION_PASSES_H

#include "_compaction.h"
#include "_walker.h"
#include "_offset_map.h"
#include "_index_builder.h"

#include <stdlib.h>
#include <string.h>

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

#endif
