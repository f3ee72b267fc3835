/*
 * CRC32C (Castagnoli), as a RecordBatch v2 header's crc field: SSE4.2 when the CPU has it,
 * slicing-by-8 tables otherwise. Shared by `_compaction.c` (rewritten batches) and `_encoder.c`
 * (batches built from Arrow columns). Everything is `static`: each module that includes the
 * header gets its own copy, and must call `crc32c_setup()` once (its module exec) before
 * `crc32c()`. No function touches a Python object: callers may hold or release the GIL.
 */

#ifndef ODRADEK_CRC32C_H
#define ODRADEK_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c_soft(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        word ^= crc;
        crc = crc_table[7][word & 0xFF] ^ crc_table[6][(word >> 8) & 0xFF] ^
              crc_table[5][(word >> 16) & 0xFF] ^ crc_table[4][(word >> 24) & 0xFF] ^
              crc_table[3][(word >> 32) & 0xFF] ^ crc_table[2][(word >> 40) & 0xFF] ^
              crc_table[1][(word >> 48) & 0xFF] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p,
                                                             size_t n) {
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

static int use_hw_crc = 0;

static uint32_t crc32c(const uint8_t *p, size_t n) {
#ifdef HAVE_HW_CRC
    if (use_hw_crc)
        return crc32c_hw(0, p, n);
#endif
    return crc32c_soft(0, p, n);
}

static void crc32c_setup(void) {
    crc_init();
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

#endif
