/* A model's shapes as the members of a job compare them at the rendezvous: the tensors of the
 * flat parameter vector in order, an entry "name[d0,d1];" each (";" ends an entry: wire text has no
 * line breaks). The signature hashes the whole text; the wire carries it cut to whole entries,
 * enough to name the first tensor that differs. Pure text work: the worker describes its model
 * here, the parameter server its --init file, and the coordinator compares them. */
#include "fl_core.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUT_LINE "...;"

void fl_model_shapes_init(fl_model_shapes_t *s)
{
    memset(s, 0, sizeof *s);
}

void fl_model_shapes_deinit(fl_model_shapes_t *s)
{
    if (s == NULL)
        return;
    free(s->text);
    memset(s, 0, sizeof *s);
}

int fl_model_shapes_add(fl_model_shapes_t *s, const char *name, size_t ndim, const uint64_t *shape)
{
    size_t need = s->len + strlen(name) + 4 + ndim * 22;
    if (need > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < need)
            cap *= 2;
        char *t = realloc(s->text, cap);
        if (t == NULL)
            return fl_fail(FL_ENOMEM, "model shapes: out of memory for %zu bytes", cap);
        s->text = t;
        s->cap = cap;
    }
    int n = snprintf(s->text + s->len, s->cap - s->len, "%s[", name);
    for (size_t d = 0; d < ndim; d++)
        n += snprintf(s->text + s->len + (size_t)n, s->cap - s->len - (size_t)n, "%s%" PRIu64,
                      d ? "," : "", shape[d]);
    n += snprintf(s->text + s->len + (size_t)n, s->cap - s->len - (size_t)n, "];");
    s->len += (size_t)n;
    s->ntensors++;
    return FL_OK;
}

const char *fl_model_shapes_text(const fl_model_shapes_t *s)
{
    return s->text != NULL ? s->text : "";
}

uint64_t fl_model_shapes_signature(const char *text)
{
    /* FNV-1a over a tag and the text. */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *c = "flodl.shapes.v1\n"; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ULL;
    for (const char *c = text; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ULL;
    return h ? h : 1;
}

void fl_model_shapes_cut(const char *text, char *out, size_t cap)
{
    size_t len = strlen(text);
    if (len < cap) {
        memcpy(out, text, len + 1);
        return;
    }
    /* Whole lines that leave room for the cut line. */
    size_t keep = 0;
    for (size_t i = 0; i < len && i + sizeof CUT_LINE <= cap - 1; i++)
        if (text[i] == ';')
            keep = i + 1;
    memcpy(out, text, keep);
    memcpy(out + keep, CUT_LINE, sizeof CUT_LINE);
}

/* Line i of text (0-based): its start and length without the newline; false past the end. */
static bool line_at(const char *text, size_t i, const char **start, size_t *len)
{
    const char *p = text;
    for (size_t k = 0; k < i && *p; k++) {
        const char *nl = strchr(p, ';');
        p = nl ? nl + 1 : p + strlen(p);
    }
    if (*p == '\0')
        return false;
    const char *nl = strchr(p, ';');
    *start = p;
    *len = nl ? (size_t)(nl - p) : strlen(p);
    return true;
}

/* Splits a line "name[dims]" at its last '['. */
static void split(const char *line, size_t len, char *name, size_t ncap, char *shape, size_t scap)
{
    size_t at = len;
    for (size_t i = 0; i < len; i++)
        if (line[i] == '[')
            at = i;
    snprintf(name, ncap, "%.*s", (int)at, line);
    snprintf(shape, scap, "%.*s", (int)(len - at), line + at);
}

void fl_model_shapes_diff(const char *a, const char *who_a, const char *b, const char *who_b,
                          char *out, size_t cap)
{
    static const char cut[] = "...";
    for (size_t i = 0;; i++) {
        const char *la = NULL, *lb = NULL;
        size_t na = 0, nb = 0;
        bool ha = line_at(a, i, &la, &na);
        bool hb = line_at(b, i, &lb, &nb);
        bool cut_a = ha && na == strlen(cut) && memcmp(la, cut, na) == 0;
        bool cut_b = hb && nb == strlen(cut) && memcmp(lb, cut, nb) == 0;
        if (cut_a || cut_b) {
            snprintf(out, cap,
                     "their first %zu tensors agree; they differ beyond (not "
                     "described)",
                     i);
            return;
        }
        if (!ha && !hb) {
            snprintf(out, cap,
                     "the same %zu tensors described %s and %s, yet other "
                     "signatures",
                     i, who_a, who_b);
            return;
        }
        if (ha && hb && na == nb && memcmp(la, lb, na) == 0)
            continue;
        char name_a[160] = "", shape_a[160] = "", name_b[160] = "", shape_b[160] = "";
        if (ha)
            split(la, na, name_a, sizeof name_a, shape_a, sizeof shape_a);
        if (hb)
            split(lb, nb, name_b, sizeof name_b, shape_b, sizeof shape_b);
        if (!ha || !hb) {
            snprintf(out, cap, "%zu tensors %s, more %s (the next is '%s' %s)", i,
                     ha ? who_b : who_a, ha ? who_a : who_b, ha ? name_a : name_b,
                     ha ? shape_a : shape_b);
        } else if (strcmp(name_a, name_b) == 0) {
            snprintf(out, cap, "tensor '%s' is %s %s, %s %s", name_a, shape_a, who_a, shape_b,
                     who_b);
        } else {
            snprintf(out, cap, "tensor %zu is '%s' %s %s, '%s' %s %s", i, name_a, shape_a, who_a,
                     name_b, shape_b, who_b);
        }
        return;
    }
}
