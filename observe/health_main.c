/* flodl-health: a container health check with no shell. GETs a URL of a flodl metrics endpoint
 * (default http://127.0.0.1:9100/healthz) and exits 0 on a 200 answer, 1 on anything else
 * (another status, no answer, a timeout), 2 on bad arguments; one line on stderr says why.
 *   flodl-health [--timeout-ms N] [URL | PORT]
 * The endpoints are observe/http.c (the metrics port) and observe/healthz.c (--health-port,
 * the one a probe should read); this only reads their status line. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static const char usage[] =
    "usage: flodl-health [--timeout-ms N] [URL | PORT]\n"
    "GETs URL (default http://127.0.0.1:9100/healthz; a bare PORT means\n"
    "http://127.0.0.1:PORT/healthz) and exits 0 on HTTP 200, 1 otherwise, 2 on bad arguments.\n"
    "Point it at the --health-port of flodl-ps or flodl-worker: idle or slow clients\n"
    "cannot starve that listener as they can the metrics port.\n";

/* Splits http://HOST[:PORT][/PATH] into its parts (port 80 and / when absent). */
static int parse_url(const char *url, char *host, size_t hcap, char *port, size_t pcap,
                     const char **path)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) == 0)
        p += 7;
    const char *slash = strchr(p, '/');
    *path = slash ? slash : "/";
    size_t hostlen = slash ? (size_t)(slash - p) : strlen(p);
    const char *colon = memchr(p, ':', hostlen);
    size_t namelen = colon ? (size_t)(colon - p) : hostlen;
    if (namelen == 0 || namelen >= hcap)
        return -1;
    memcpy(host, p, namelen);
    host[namelen] = '\0';
    if (colon) {
        size_t portlen = hostlen - namelen - 1;
        if (portlen == 0 || portlen >= pcap)
            return -1;
        memcpy(port, colon + 1, portlen);
        port[portlen] = '\0';
    } else {
        snprintf(port, pcap, "80");
    }
    return 0;
}

int main(int argc, char **argv)
{
    long timeout_ms = 3000;
    const char *arg = "http://127.0.0.1:9100/healthz";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc) {
            char *end = NULL;
            timeout_ms = strtol(argv[++i], &end, 10);
            if (*end != '\0' || timeout_ms <= 0) {
                fputs(usage, stderr);
                return 2;
            }
        } else if (argv[i][0] != '-') {
            arg = argv[i];
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    char url[512];
    if (strspn(arg, "0123456789") == strlen(arg))
        snprintf(url, sizeof url, "http://127.0.0.1:%s/healthz", arg);
    else
        snprintf(url, sizeof url, "%s", arg);
    char host[256];
    char port[16];
    const char *path = NULL;
    if (parse_url(url, host, sizeof host, port, sizeof port, &path) != 0) {
        fprintf(stderr, "flodl-health: cannot parse %s\n", url);
        return 2;
    }

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        fprintf(stderr, "flodl-health: %s: %s\n", url, gai_strerror(gai));
        return 1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    /* On Linux SO_SNDTIMEO bounds connect() too, so one deadline covers every step. */
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "flodl-health: %s: connect: %s\n", url, strerror(errno));
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return 1;
    }
    freeaddrinfo(ai);
    char req[800];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
    if (n < 0 || (size_t)n >= sizeof req || write(fd, req, (size_t)n) != (ssize_t)n) {
        fprintf(stderr, "flodl-health: %s: send: %s\n", url, strerror(errno));
        close(fd);
        return 1;
    }
    char line[128];
    size_t got = 0;
    while (got < sizeof line - 1) {
        ssize_t r = read(fd, line + got, sizeof line - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        if (memchr(line, '\n', got))
            break;
    }
    close(fd);
    line[got] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    int status = 0;
    if (sscanf(line, "HTTP/%*d.%*d %d", &status) != 1) {
        fprintf(stderr, "flodl-health: %s: no HTTP answer\n", url);
        return 1;
    }
    if (status != 200) {
        fprintf(stderr, "flodl-health: %s: %s\n", url, line);
        return 1;
    }
    return 0;
}
