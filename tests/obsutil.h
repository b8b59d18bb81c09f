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

/* GET path from 127.0.0.1:port with one deadline of timeout_ms for every step: the status
 * (-1: no answer in time), and in *ms the time from connect to the answer's end. */
int fl_test_http_probe(int port, const char *path, int timeout_ms, double *ms);

/* Hostile HTTP clients: n connections to 127.0.0.1:port from address src (127.0.0.x), the
 * first half idle (connected, silent), the others slow (a byte of a request whose headers
 * never end, every 500 ms); each opened again 100 ms after the server closes it. A thread
 * of its own until fl_test_hold_stop. NULL when it cannot start. */
typedef struct fl_test_hold fl_test_hold_t;
fl_test_hold_t *fl_test_hold_start(const char *src, int port, int n);
/* Connections established at this moment. */
int fl_test_hold_open(fl_test_hold_t *h);
/* Stops the thread and closes everything; the connections opened and those the server
 * closed in *opened and *closed (either may be NULL). NULL-safe. */
void fl_test_hold_stop(fl_test_hold_t *h, long *opened, long *closed);

#endif
