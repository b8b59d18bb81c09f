/* Endpoints: parsing, the local address of the route to a host (what a rank advertises to its
 * peers when no --host is given), and rewriting a wildcard bind into a dialable address. */
#include "fl_tp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

bool fl_tp_is_ip_literal(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

int fl_tp_endpoint_parse(const char *endpoint, fl_tp_endpoint_t *out)
{
    memset(out, 0, sizeof *out);
    if (endpoint == NULL || endpoint[0] == '\0')
        return fl_fail(FL_EINVAL, "endpoint is empty");
    if (strlen(endpoint) >= FL_ENDPOINT_MAX)
        return fl_fail(FL_EINVAL, "endpoint '%.40s...' is longer than %d bytes", endpoint,
                       FL_ENDPOINT_MAX - 1);
    const char *rest;
    if (strncmp(endpoint, "ipc://", 6) == 0) {
        rest = endpoint + 6;
        if (rest[0] == '\0')
            return fl_fail(FL_EINVAL, "endpoint '%s' has no path", endpoint);
        out->scheme = FL_TP_IPC;
        snprintf(out->host, sizeof out->host, "%s", rest);
        return FL_OK;
    }
    if (strncmp(endpoint, "inproc://", 9) == 0) {
        rest = endpoint + 9;
        if (rest[0] == '\0')
            return fl_fail(FL_EINVAL, "endpoint '%s' has no name", endpoint);
        out->scheme = FL_TP_INPROC;
        snprintf(out->host, sizeof out->host, "%s", rest);
        return FL_OK;
    }
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return fl_fail(FL_EINVAL,
                       "endpoint '%s': expected tcp://host:port, ipc://path or "
                       "inproc://name",
                       endpoint);
    rest = endpoint + 6;
    const char *colon;
    size_t hostlen;
    if (rest[0] == '[') {
        const char *close = strchr(rest, ']');
        if (close == NULL || close[1] != ':')
            return fl_fail(FL_EINVAL, "endpoint '%s': bad IPv6 address, expected [addr]:port",
                           endpoint);
        hostlen = (size_t)(close - rest - 1);
        memcpy(out->host, rest + 1, hostlen);
        colon = close + 1;
    } else {
        colon = strrchr(rest, ':');
        if (colon == NULL)
            return fl_fail(FL_EINVAL, "endpoint '%s' has no port (tcp://host:port)", endpoint);
        hostlen = (size_t)(colon - rest);
        memcpy(out->host, rest, hostlen);
    }
    out->host[hostlen] = '\0';
    if (hostlen == 0)
        return fl_fail(FL_EINVAL, "endpoint '%s' has no host", endpoint);
    const char *port = colon + 1;
    char *end = NULL;
    errno = 0;
    long p = strtol(port, &end, 10);
    if (strcmp(port, "*") == 0) {
        p = 0;
    } else if (errno != 0 || end == port || *end != '\0' || p < 0 || p > 65535) {
        return fl_fail(FL_EINVAL, "endpoint '%s': port '%s' is not 0..65535", endpoint, port);
    }
    out->scheme = FL_TP_TCP;
    out->port = (int)p;
    return FL_OK;
}

int fl_tp_local_addr_towards(const char *endpoint, char *out, size_t cap)
{
    fl_tp_endpoint_t ep;
    int rc = fl_tp_endpoint_parse(endpoint, &ep);
    if (rc != FL_OK)
        return rc;
    if (ep.scheme != FL_TP_TCP) {
        snprintf(out, cap, "127.0.0.1");
        return FL_OK;
    }
    struct addrinfo hints;
    struct addrinfo *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    char port[16];
    snprintf(port, sizeof port, "%d", ep.port ? ep.port : 9);
    int gai = getaddrinfo(ep.host, port, &hints, &res);
    if (gai != 0)
        return fl_fail(FL_EINVAL, "cannot resolve host '%s' of %s: %s", ep.host, endpoint,
                       gai_strerror(gai));
    rc = fl_fail(FL_EIO, "no route to %s", endpoint);
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        /* A connected UDP socket makes the kernel choose the source address of the route
         * without sending anything. */
        int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
        if (fd < 0)
            continue;
        struct sockaddr_storage local;
        socklen_t len = sizeof local;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&local, &len) == 0) {
            const void *addr = local.ss_family == AF_INET
                                   ? (const void *)&((struct sockaddr_in *)&local)->sin_addr
                                   : (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr;
            if (inet_ntop(local.ss_family, addr, out, (socklen_t)cap) != NULL) {
                close(fd);
                rc = FL_OK;
                break;
            }
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

int fl_tp_endpoint_advertise(const char *bound, const char *host, char *out, size_t cap)
{
    fl_tp_endpoint_t ep;
    int rc = fl_tp_endpoint_parse(bound, &ep);
    if (rc != FL_OK)
        return rc;
    int n;
    if (ep.scheme != FL_TP_TCP)
        n = snprintf(out, cap, "%s", bound);
    else if (strchr(host, ':') != NULL)
        n = snprintf(out, cap, "tcp://[%s]:%d", host, ep.port);
    else
        n = snprintf(out, cap, "tcp://%s:%d", host, ep.port);
    if (n < 0 || (size_t)n >= cap)
        return fl_fail(FL_EINVAL, "advertised endpoint for host '%s' is too long", host);
    return FL_OK;
}
