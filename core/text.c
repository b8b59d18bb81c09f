/* Untrusted text: the rule every string on the wire follows (well-formed UTF-8 without NUL or
 * control characters) and a way to show any text in one log line without letting it forge
 * another. proto/ applies the rule when it packs and unpacks messages; whoever logs text that
 * came from a peer, a file or a flag escapes it here. */
#include "fl_core.h"

#include <stdio.h>
#include <string.h>

/* Length of the UTF-8 sequence starting at s[0..n) and its code point, or 0 when it is not
 * well-formed: a stray continuation byte, a sequence cut short, an overlong form, a UTF-16
 * surrogate or a code point past U+10FFFF (RFC 3629, as protobuf's own decoders require). */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t v;
    uint32_t min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        v = c & 0x1fu;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        v = c & 0x0fu;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        v = c & 0x07u;
        min = 0x10000;
    } else {
        return 0; /* 0x80..0xc1 (continuation, overlong 2-byte lead) or 0xf5..0xff */
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3fu);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

static bool is_control(uint32_t cp)
{
    return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f);
}

size_t fl_text_scan(const void *text, size_t len, const char **why)
{
    const unsigned char *s = text;
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        size_t n = utf8_next(s + i, len - i, &cp);
        if (n == 0) {
            if (why != NULL)
                *why = "bytes that are not UTF-8";
            return i;
        }
        if (cp == 0 || is_control(cp)) {
            if (why != NULL)
                *why = cp == 0 ? "a NUL byte" : "a control character";
            return i;
        }
        i += n;
    }
    if (why != NULL)
        *why = NULL;
    return len;
}

const char *fl_text_escape(const char *text, char *out, size_t cap)
{
    if (cap == 0)
        return out;
    const unsigned char *s = (const unsigned char *)text;
    size_t len = strlen(text);
    size_t o = 0;
    size_t i = 0;
    while (i < len) {
        uint32_t cp = 0;
        size_t n = utf8_next(s + i, len - i, &cp);
        char esc[8];
        const char *piece;
        size_t plen;
        if (n != 0 && !is_control(cp)) {
            piece = (const char *)s + i; /* a whole character, as it is */
            plen = n;
        } else if (n == 1 && (cp == '\n' || cp == '\r' || cp == '\t')) {
            snprintf(esc, sizeof esc, "\\%c", cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
            piece = esc;
            plen = 2;
        } else {
            /* A control character (C1 ones are two bytes: both escaped) or a byte that starts
             * no well-formed character: each byte as \xNN. */
            size_t nb = n != 0 ? n : 1;
            if (o + 4 * nb >= cap)
                break;
            for (size_t k = 0; k < nb; k++) {
                snprintf(out + o, cap - o, "\\x%02x", s[i + k]);
                o += 4;
            }
            i += nb;
            continue;
        }
        if (o + plen >= cap)
            break; /* only whole characters and whole escapes */
        memcpy(out + o, piece, plen);
        o += plen;
        i += n;
    }
    out[o] = '\0';
    return out;
}

size_t fl_text_cut(const char *text, size_t max)
{
    size_t len = strnlen(text, max);
    if (len < max)
        return len;
    /* Back off over the continuation bytes of a character the cut would split. */
    const unsigned char *s = (const unsigned char *)text;
    size_t i = len;
    while (i > 0 && (s[i] & 0xc0) == 0x80 && len - i < 3)
        i--;
    return (s[i] & 0xc0) == 0x80 ? len : i;
}
