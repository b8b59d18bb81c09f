/* CSV datasets: one sample per line, an integer label first, then float features, separated by
 * commas. An optional header line is skipped; everything else that is not a well-formed row is
 * refused with the file, line and column named, so a bad file never trains silently. */
#include "fl_data.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

/* Labels size the model's output layer: a stray huge value is a bad file, not 10^9 classes. */
#define MAX_LABEL 65535

typedef struct reader {
    const char *path;
    size_t line; /* 1-based number of the line being parsed */
    size_t cols; /* columns per row, set by the first data row */
    size_t n;    /* rows read */
    size_t cap;  /* rows allocated */
    float *x;
    int32_t *y;
    int max_label;
} reader_t;

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Trims field [b, e) in place and NUL-terminates it. */
static char *trim(char *b, char *e)
{
    while (b < e && is_space(*b))
        b++;
    while (e > b && is_space(e[-1]))
        e--;
    *e = '\0';
    return b;
}

/* Parses a whole field as a number; false when it is empty or has anything else in it. */
static bool parse_number(const char *s, double *v)
{
    if (*s == '\0')
        return false;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return *end == '\0';
}

static size_t count_cols(const char *s)
{
    size_t c = 1;
    for (; *s; s++)
        c += *s == ',';
    return c;
}

static int grow(reader_t *r)
{
    if (r->n < r->cap)
        return FL_OK;
    size_t cap = r->cap ? r->cap * 2 : 1024;
    float *x = realloc(r->x, cap * (r->cols - 1) * sizeof *x);
    if (x == NULL)
        return fl_fail(FL_ENOMEM, "%s: no memory for %zu rows", r->path, cap);
    r->x = x;
    int32_t *y = realloc(r->y, cap * sizeof *y);
    if (y == NULL)
        return fl_fail(FL_ENOMEM, "%s: no memory for %zu rows", r->path, cap);
    r->y = y;
    r->cap = cap;
    return FL_OK;
}

static int parse_label(reader_t *r, const char *f, int32_t *out)
{
    double v;
    if (!parse_number(f, &v))
        return fl_fail(FL_EPROTO, "%s: line %zu column 1: label \"%.40s\" is not a number", r->path,
                       r->line, f);
    if (v < 0)
        return fl_fail(FL_EPROTO, "%s: line %zu column 1: label %s is negative", r->path, r->line,
                       f);
    if (v != floor(v))
        return fl_fail(FL_EPROTO, "%s: line %zu column 1: label %s is not an integer", r->path,
                       r->line, f);
    if (v > MAX_LABEL)
        return fl_fail(FL_EPROTO, "%s: line %zu column 1: label %s is above the limit %d", r->path,
                       r->line, f, MAX_LABEL);
    *out = (int32_t)v;
    return FL_OK;
}

/* Parses one data row (s: the line without its newline, not blank). */
static int parse_row(reader_t *r, char *s)
{
    size_t cols = count_cols(s);
    if (r->cols == 0) {
        if (cols < 2)
            return fl_fail(FL_EPROTO, "%s: line %zu has a label and no features", r->path, r->line);
        r->cols = cols;
    } else if (cols != r->cols) {
        return fl_fail(FL_EPROTO, "%s: line %zu has %zu columns, earlier lines have %zu", r->path,
                       r->line, cols, r->cols);
    }
    int rc = grow(r);
    if (rc != FL_OK)
        return rc;
    float *x = r->x + r->n * (r->cols - 1);
    char *b = s;
    for (size_t c = 0; c < cols; c++) {
        char *e = strchr(b, ',');
        if (e == NULL)
            e = b + strlen(b);
        char *next = *e ? e + 1 : e;
        char *f = trim(b, e);
        b = next;
        if (c == 0) {
            rc = parse_label(r, f, &r->y[r->n]);
            if (rc != FL_OK)
                return rc;
            continue;
        }
        double v;
        if (*f == '\0')
            return fl_fail(FL_EPROTO, "%s: line %zu column %zu is empty", r->path, r->line, c + 1);
        if (!parse_number(f, &v))
            return fl_fail(FL_EPROTO, "%s: line %zu column %zu: \"%.40s\" is not a number", r->path,
                           r->line, c + 1, f);
        if (!isfinite(v))
            return fl_fail(FL_EPROTO, "%s: line %zu column %zu is %s", r->path, r->line, c + 1,
                           isnan(v) ? "nan" : "infinite");
        if (fabs(v) > FLT_MAX)
            return fl_fail(FL_EPROTO, "%s: line %zu column %zu: %s is out of float range", r->path,
                           r->line, c + 1, f);
        x[c - 1] = (float)v;
    }
    if (r->y[r->n] > r->max_label)
        r->max_label = r->y[r->n];
    r->n++;
    return FL_OK;
}

static bool is_blank(const char *s)
{
    while (*s && is_space(*s))
        s++;
    return *s == '\0';
}

/* A header is a first line whose first field is not a number. */
static bool is_header(const char *s)
{
    char first[64];
    size_t len = strcspn(s, ",");
    if (len >= sizeof first)
        return true;
    memcpy(first, s, len);
    double v;
    return !parse_number(trim(first, first + len), &v);
}

int fl_data_csv(const char *path, fl_dataset_t *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path, strerror(errno));
    reader_t r = {.path = path};
    char *line = NULL;
    size_t linecap = 0;
    size_t blank = 0; /* the first blank line, allowed only after the last row */
    int rc = FL_OK;
    while (rc == FL_OK) {
        errno = 0;
        if (getline(&line, &linecap, f) < 0) {
            if (ferror(f))
                rc = fl_fail(FL_EIO, "%s: read: %s", path, strerror(errno));
            break;
        }
        r.line++;
        if (is_blank(line)) {
            if (blank == 0)
                blank = r.line;
            continue;
        }
        if (blank != 0)
            rc = fl_fail(FL_EPROTO, "%s: line %zu is blank (only trailing blank lines may be)",
                         path, blank);
        else if (r.line == 1 && is_header(line))
            continue;
        else
            rc = parse_row(&r, line);
    }
    free(line);
    fclose(f);
    if (rc == FL_OK && r.n == 0)
        rc = fl_fail(FL_EPROTO, "%s: no data rows", path);
    if (rc != FL_OK) {
        free(r.x);
        free(r.y);
        return rc;
    }
    out->n = r.n;
    out->dim = r.cols - 1;
    out->classes = r.max_label + 1;
    out->x = r.x;
    out->y = r.y;
    snprintf(out->source, sizeof out->source, "%s", path);
    return FL_OK;
}
