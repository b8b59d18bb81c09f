/* Helpers of the suites that scrape a metrics endpoint (see obsutil.h). */
#include "obsutil.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int fl_test_http_get(int port, const char *path, char **body)
{
    *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        code = -1;
    char *sep = strstr(buf, "\r\n\r\n");
    *body = strdup(sep ? sep + 4 : "");
    free(buf);
    return code;
}

static bool name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

bool fl_test_exposition_valid(const char *text, char *err, size_t cap)
{
    char typed[256][128];
    bool histo[256];
    int ntyped = 0;
    int lineno = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        if (nl == NULL) {
            snprintf(err, cap, "the text does not end with a newline");
            return false;
        }
        char line[1024];
        size_t l = (size_t)(nl - p) < sizeof line - 1 ? (size_t)(nl - p) : sizeof line - 1;
        memcpy(line, p, l);
        line[l] = '\0';
        p = nl + 1;
        lineno++;
        if (strncmp(line, "# HELP ", 7) == 0)
            continue;
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128], kind[32];
            if (sscanf(line + 7, "%127s %31s", name, kind) != 2 ||
                (strcmp(kind, "counter") && strcmp(kind, "gauge") && strcmp(kind, "histogram"))) {
                snprintf(err, cap, "line %d: bad TYPE: %s", lineno, line);
                return false;
            }
            if (ntyped < 256) {
                histo[ntyped] = strcmp(kind, "histogram") == 0;
                snprintf(typed[ntyped++], sizeof typed[0], "%s", name);
            }
            continue;
        }
        const char *c = line;
        if (!name_char(*c, true)) {
            snprintf(err, cap, "line %d: not a series: %s", lineno, line);
            return false;
        }
        while (name_char(*c, false))
            c++;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(c - line), line);
        if (*c == '{') {
            const char *close = strchr(c, '}');
            if (close == NULL) {
                snprintf(err, cap, "line %d: unclosed labels: %s", lineno, line);
                return false;
            }
            c = close + 1;
        }
        if (*c != ' ') {
            snprintf(err, cap, "line %d: no value: %s", lineno, line);
            return false;
        }
        char *end = NULL;
        strtod(c + 1, &end);
        if (end == c + 1 || *end != '\0') {
            snprintf(err, cap, "line %d: bad value: %s", lineno, line);
            return false;
        }
        bool ok = false;
        for (int i = 0; i < ntyped && !ok; i++) {
            size_t tl = strlen(typed[i]);
            /* A histogram's series are its name with _bucket (and an le label), _sum, _count. */
            ok = histo[i]
                     ? strncmp(name, typed[i], tl) == 0 &&
                           (strcmp(name + tl, "_sum") == 0 || strcmp(name + tl, "_count") == 0 ||
                            (strcmp(name + tl, "_bucket") == 0 && strstr(line, "le=\"")))
                     : strcmp(typed[i], name) == 0;
        }
        if (!ok) {
            snprintf(err, cap, "line %d: %s has no # TYPE before it", lineno, name);
            return false;
        }
    }
    return true;
}

double fl_test_metric_value(const char *text, const char *series)
{
    size_t sl = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, sl) == 0 && p[sl] == ' ')
            return strtod(p + sl + 1, NULL);
    }
    return NAN;
}

int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        n += strncmp(p, prefix, pl) == 0;
    return n;
}
