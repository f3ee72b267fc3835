/*
 * Kafka's Utils.murmur2 (MurmurHash2, 32 bits, seed 0x9747b28c), in Java's int arithmetic: the
 * hash of the default partitioner (toPositive(murmur2(key)) % partitions) that `_encoder.c` uses
 * to place keyed rows, so that they land where the Java client and librdkafka's
 * `murmur2_random` partitioner would put them. `static`, touches no Python object.
 */

#ifndef ODRADEK_MURMUR2_H
#define ODRADEK_MURMUR2_H

#include <stddef.h>
#include <stdint.h>

static int32_t murmur2(const uint8_t *data, size_t length) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    size_t quads = length / 4;
    for (size_t i = 0; i < quads; i++) {
        const uint8_t *q = data + 4 * i;
        uint32_t k = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                     (uint32_t)q[3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const uint8_t *tail = data + 4 * quads;
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)tail[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

#endif
