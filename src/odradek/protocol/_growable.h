/*
 * The growth rule of the byte buffers that the native modules append to: `_arrow.c` (Arrow column
 * buffers) and `_encoder.c` (record batches). Room is made by doubling the capacity, starting
 * from a size each caller picks, until what is asked for fits: appends cost amortized O(1) and a
 * buffer is at most twice what it holds. `static inline`, touches no Python object, so callers
 * may run it with the GIL released.
 */

#ifndef ODRADEK_GROWABLE_H
#define ODRADEK_GROWABLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Room for `extra` bytes after the `len` held in `*data` (capacity `*cap`, 0 for none yet; the
 * first allocation is `initial` bytes or a doubling of it). Returns 0, or -1 when memory runs out:
 * then `*data` and `*cap` are unchanged. */
static inline int grow_reserve(uint8_t **data, size_t *cap, size_t len, size_t extra,
                               size_t initial) {
    if (len + extra <= *cap)
        return 0;
    size_t new_cap = *cap ? *cap : initial;
    while (new_cap < len + extra)
        new_cap *= 2;
    uint8_t *grown = realloc(*data, new_cap);
    if (grown == NULL)
        return -1;
    *data = grown;
    *cap = new_cap;
    return 0;
}

#endif
