/* format_bytes.h - the saved format's bytes (docs/format.md) written by the tests
   themselves, not by kvcache.h: little-endian fields, section tags and the sections'
   XXH64 checksum (seed 0, as `xxhsum -H1`). A test that crafts or repairs a file with
   these checks the format as documented, and needs none of the library's private parts. */
#ifndef TK_FORMAT_BYTES_H
#define TK_FORMAT_BYTES_H
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define TK_FB_UNUSED __attribute__((unused))
#else
#define TK_FB_UNUSED
#endif

/* a section's tag: its four characters in file order */
#define TK_TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)

TK_FB_UNUSED static void tk_put32(unsigned char *p, uint32_t x) {
    int i;
    for (i = 0; i < 4; ++i) p[i] = (unsigned char)(x >> (8 * i));
}
TK_FB_UNUSED static void tk_put64(unsigned char *p, uint64_t x) {
    tk_put32(p, (uint32_t)x);
    tk_put32(p + 4, (uint32_t)(x >> 32));
}
TK_FB_UNUSED static uint32_t tk_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
TK_FB_UNUSED static uint64_t tk_le64(const unsigned char *p) { return tk_le32(p) | (uint64_t)tk_le32(p + 4) << 32; }

/* XXH64 as its specification gives it (xxhash.com, doc/xxhash_spec.md), one shot */
#define TK_XP1 0x9E3779B185EBCA87ull
#define TK_XP2 0xC2B2AE3D27D4EB4Full
#define TK_XP3 0x165667B19E3779F9ull
#define TK_XP4 0x85EBCA77C2B2AE63ull
#define TK_XP5 0x27D4EB2F165667C5ull
static uint64_t tk_rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }
static uint64_t tk_xxh_round(uint64_t acc, uint64_t lane) { return tk_rotl64(acc + lane * TK_XP2, 31) * TK_XP1; }
static uint64_t tk_xxh_merge(uint64_t h, uint64_t v) { return (h ^ tk_xxh_round(0, v)) * TK_XP1 + TK_XP4; }
TK_FB_UNUSED static uint64_t tk_xxh64(const unsigned char *p, size_t n) {
    const unsigned char *end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v[4];
        int i;
        v[0] = TK_XP1 + TK_XP2, v[1] = TK_XP2, v[2] = 0, v[3] = 0 - TK_XP1;
        for (; end - p >= 32; p += 32)
            for (i = 0; i < 4; ++i) v[i] = tk_xxh_round(v[i], tk_le64(p + 8 * i));
        h = tk_rotl64(v[0], 1) + tk_rotl64(v[1], 7) + tk_rotl64(v[2], 12) + tk_rotl64(v[3], 18);
        for (i = 0; i < 4; ++i) h = tk_xxh_merge(h, v[i]);
    } else {
        h = TK_XP5;
    }
    h += (uint64_t)n;
    for (; end - p >= 8; p += 8) h = tk_rotl64(h ^ tk_xxh_round(0, tk_le64(p)), 27) * TK_XP1 + TK_XP4;
    if (end - p >= 4) h = tk_rotl64(h ^ (uint64_t)tk_le32(p) * TK_XP1, 23) * TK_XP2 + TK_XP3, p += 4;
    for (; p < end; ++p) h = tk_rotl64(h ^ (uint64_t)*p * TK_XP5, 11) * TK_XP1;
    h ^= h >> 33, h *= TK_XP2, h ^= h >> 29, h *= TK_XP3;
    return h ^ h >> 32;
}

/* every complete section after the 16-byte header gets its checksum recomputed (tag,
   length, payload, then the XXH64 of those): a mutated file whose damage a checksum
   would hide reaches the checks behind it */
TK_FB_UNUSED static void tk_fix_checksums(uint8_t *d, size_t size) {
    size_t at = 16;
    while (size - at >= 16 && at <= size) {
        uint64_t len = tk_le64(d + at + 8);
        if (len > size - at - 16 || size - at - 16 - len < 8) return;
        tk_put64(d + at + 16 + (size_t)len, tk_xxh64(d + at, (size_t)(16 + len)));
        at += 16 + (size_t)len + 8;
    }
}
#endif
