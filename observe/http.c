/* The HTTP endpoint: libmicrohttpd with its own polling thread, GET only. /metrics answers the
 * registry's exposition text, /healthz 200 "ok" or 503 with the reason, anything else 404. A
 * /healthz that no client can starve is healthz.c's listener. */
#include "fl_obs.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One address holds at most PER_ADDR_LIMIT of the CONN_LIMIT connections (a scraper needs
 * one), so idle clients from one address leave the rest to the others. Clients that spread
 * over many addresses can still fill it: probes belong on healthz.c's listener. */
#define CONN_LIMIT 64
#define PER_ADDR_LIMIT 8
#define IDLE_S 5 /* a connection without traffic this long is closed */

struct fl_obs_http {
    struct MHD_Daemon *d;
    fl_obs_t *o;
    fl_obs_health_fn health;
    void *ud;
    int port;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, char *body, size_t len,
                             const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result text_reply(struct MHD_Connection *c, unsigned code, const char *s)
{
    char *body = strdup(s);
    if (body == NULL)
        return MHD_NO;
    return reply(c, code, body, strlen(body), "text/plain; charset=utf-8");
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state)
{
    (void)version;
    (void)upload;
    fl_obs_http_t *h = cls;
    if (*state == NULL) {
        /* First call for this request: headers only; answer on the next. */
        static int marker;
        *state = &marker;
        return MHD_YES;
    }
    if (*upload_size != 0) {
        *upload_size = 0; /* a body we do not want: drop it */
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return text_reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics or /healthz\n");
    if (strcmp(url, "/metrics") == 0) {
        size_t len = 0;
        char *body = fl_obs_render(h->o, &len);
        if (body == NULL)
            return text_reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        return reply(c, MHD_HTTP_OK, body, len, "text/plain; version=0.0.4; charset=utf-8");
    }
    if (strcmp(url, "/healthz") == 0) {
        char why[512] = "";
        bool ok = h->health == NULL || h->health(h->ud, why, sizeof why);
        char line[600];
        snprintf(line, sizeof line, "%s\n", ok ? "ok" : why[0] ? why : "unhealthy");
        return text_reply(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, line);
    }
    return text_reply(c, MHD_HTTP_NOT_FOUND, "not found: GET /metrics or /healthz\n");
}

int fl_obs_http_start(fl_obs_t *o, const char *bind_addr, int port, fl_obs_health_fn health,
                      void *ud, fl_obs_http_t **out)
{
    *out = NULL;
    if (port < 0 || port > 65535)
        return fl_fail(FL_EINVAL, "--metrics-port: %d is not a port", port);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    const char *addr = bind_addr ? bind_addr : "0.0.0.0";
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return fl_fail(FL_EINVAL, "metrics: '%s' is not an IPv4 address", addr);
    fl_obs_http_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return fl_fail(FL_ENOMEM, "metrics: out of memory");
    h->o = o;
    h->health = health;
    h->ud = ud;
    h->d =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL, NULL,
                         handle, h, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)IDLE_S, MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_LIMIT,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PER_ADDR_LIMIT,
                         MHD_OPTION_END);
    if (h->d == NULL) {
        free(h);
        return fl_fail(FL_EIO, "metrics: cannot serve HTTP on %s:%d (port taken?)", addr, port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info != NULL ? info->port : port;
    *out = h;
    return FL_OK;
}

int fl_obs_http_port(const fl_obs_http_t *h)
{
    return h->port;
}

void fl_obs_http_stop(fl_obs_http_t **ph)
{
    if (ph == NULL || *ph == NULL)
        return;
    MHD_stop_daemon((*ph)->d);
    free(*ph);
    *ph = NULL;
}
