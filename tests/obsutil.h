/* Helpers of the suites that scrape a metrics endpoint. */
#ifndef FL_TEST_OBSUTIL_H
#define FL_TEST_OBSUTIL_H

#include <stdbool.h>
#include <stddef.h>

/* GET path from 127.0.0.1:port (HTTP/1.0, 5 s deadline): the status code (-1 when no answer),
 * the body in *body (malloc'd, NUL-terminated; the caller frees it). */
int fl_test_http_get(int port, const char *path, char **body);

/* True when every line of text is a # HELP / # TYPE comment or `name{labels} value` with a
 * valid name, labels and a number, and every series has a # TYPE before it; else why in err. */
bool fl_test_exposition_valid(const char *text, char *err, size_t cap);

/* The value of the series whose line starts with `series ` (name, or name{labels}); NaN when
 * absent. */
double fl_test_metric_value(const char *text, const char *series);

/* Lines of text that start with prefix. */
int count_lines(const char *text, const char *prefix);

#endif
