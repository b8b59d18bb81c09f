/* Settings every rank of a job must share, as the ranks declare them at registration: a list
 * of "name=value" pairs separated by ';' ("lr=0.05;batch=64;topk=0.01"). A rank builds it with
 * fl_settings_add; the coordinator compares two ranks' lists with fl_settings_differ and names
 * the first setting on which they disagree, with both values in words. */
#include "fl_core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
           ch == '.';
}

static bool value_char(char ch)
{
    return ch >= 0x20 && ch < 0x7f && ch != ';';
}

int fl_settings_add(char *buf, size_t cap, const char *name, const char *fmt, ...)
{
    char value[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    if (name[0] == '\0')
        return fl_fail(FL_EINVAL, "settings: an empty setting name");
    for (const char *p = name; *p; p++)
        if (!name_char(*p))
            return fl_fail(FL_EINVAL, "settings: name '%s' has a character outside a-z 0-9 _ - .",
                           name);
    /* A value keeps its words: a separator or a control character becomes a space or ','. */
    for (char *p = value; *p; p++)
        if (!value_char(*p))
            *p = *p == ';' ? ',' : ' ';
    size_t used = strnlen(buf, cap);
    int n = snprintf(buf + used, cap - used, "%s%s=%s", used ? ";" : "", name, value);
    if (n < 0 || (size_t)n >= cap - used) {
        buf[used] = '\0';
        return fl_fail(FL_EINVAL, "settings: '%s' does not fit in %zu bytes", name, cap - 1);
    }
    return FL_OK;
}

int fl_settings_check(const char *s, size_t max)
{
    size_t len = strnlen(s, max);
    if (len >= max)
        return fl_fail(FL_EINVAL, "settings: longer than %zu bytes", max - 1);
    const char *p = s;
    while (*p) {
        const char *q = p;
        while (name_char(*q))
            q++;
        if (q == p || *q != '=')
            return fl_fail(FL_EINVAL, "settings: '%.40s' is not name=value (name: a-z 0-9 _ - .)",
                           p);
        q++;
        while (value_char(*q))
            q++;
        if (*q != '\0' && *q != ';')
            return fl_fail(FL_EINVAL, "settings: a control character in '%.40s'", p);
        if (*q == ';' && q[1] == '\0')
            return fl_fail(FL_EINVAL, "settings: '%.40s' ends with ';'", p);
        p = *q == ';' ? q + 1 : q;
    }
    return FL_OK;
}

/* The value of `name` in list s, as a pointer into s and a length; false when absent. */
static bool find(const char *s, const char *name, size_t nlen, const char **val, size_t *vlen)
{
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq != NULL && (size_t)(eq - p) == nlen && memcmp(p, name, nlen) == 0) {
            *val = eq + 1;
            *vlen = len - nlen - 1;
            return true;
        }
        p = end ? end + 1 : p + len;
    }
    return false;
}

static void copy_span(char *out, size_t cap, const char *p, size_t n)
{
    snprintf(out, cap, "%.*s", (int)n, p);
}

/* The first name of a whose value in b differs (or is absent). */
static bool first_diff(const char *a, const char *b, char *name, size_t ncap, char *va, char *vb,
                       size_t vcap, bool a_first)
{
    const char *p = a;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t nlen = eq ? (size_t)(eq - p) : len;
        const char *v = eq ? eq + 1 : p + len;
        size_t vl = eq ? len - nlen - 1 : 0;
        const char *w;
        size_t wl;
        bool has = find(b, p, nlen, &w, &wl);
        if (!has || wl != vl || memcmp(v, w, vl) != 0) {
            copy_span(name, ncap, p, nlen);
            copy_span(a_first ? va : vb, vcap, v, vl);
            if (has)
                copy_span(a_first ? vb : va, vcap, w, wl);
            else
                snprintf(a_first ? vb : va, vcap, "(not set)");
            return true;
        }
        p = end ? end + 1 : p + len;
    }
    return false;
}

bool fl_settings_differ(const char *a, const char *b, char *name, size_t ncap, char *va, char *vb,
                        size_t vcap)
{
    return first_diff(a, b, name, ncap, va, vb, vcap, true) ||
           first_diff(b, a, name, ncap, va, vb, vcap, false);
}
