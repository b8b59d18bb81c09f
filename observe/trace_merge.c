/* flodl-trace-merge's work: the ranks' --timeline files, whose times already share one origin
 * (Unix-epoch microseconds), into one trace that chrome://tracing or Perfetto loads whole. */
#include "fl_obs.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TRACE_BYTES ((long)1 << 30)

static char *slurp(const char *path, int *rc)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        *rc = fl_fail(FL_EINVAL, "%s: cannot read: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n <= MAX_TRACE_BYTES &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
        fclose(f);
        return buf;
    }
    free(buf);
    fclose(f);
    *rc = n > MAX_TRACE_BYTES ? fl_fail(FL_EINVAL, "%s: over 1 GiB, not a trace we wrote", path)
                              : fl_fail(FL_EIO, "%s: cannot read", path);
    return NULL;
}

/* The pid events of a file carry (the first one seen), or -1. */
static int pid_of(const cJSON *a)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "pid");
        if (cJSON_IsNumber(p))
            return p->valueint;
    }
    return -1;
}

static void set_pid(cJSON *a, int pid, size_t k)
{
    cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "pid");
        if (cJSON_IsNumber(p))
            cJSON_SetNumberValue(p, pid);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        cJSON *pn = args ? cJSON_GetObjectItemCaseSensitive(args, "name") : NULL;
        if (cJSON_IsString(name) && strcmp(name->valuestring, "process_name") == 0 &&
            cJSON_IsString(pn)) {
            char renamed[256];
            snprintf(renamed, sizeof renamed, "%s (file %zu)", pn->valuestring, k + 1);
            cJSON_SetValuestring(pn, renamed);
        }
    }
}

int fl_obs_trace_merge(const char *out, const char *const *in, size_t n)
{
    if (n == 0)
        return fl_fail(FL_EINVAL, "no trace to merge");
    cJSON *all = cJSON_CreateArray();
    int *pids = calloc(n, sizeof *pids);
    if (all == NULL || pids == NULL) {
        cJSON_Delete(all);
        free(pids);
        return fl_fail(FL_ENOMEM, "out of memory");
    }
    int rc = FL_OK;
    int next_free = 0;
    for (size_t k = 0; k < n && rc == FL_OK; k++) {
        char *text = slurp(in[k], &rc);
        if (text == NULL)
            break;
        cJSON *a = cJSON_Parse(text);
        free(text);
        if (!cJSON_IsArray(a)) {
            cJSON_Delete(a);
            rc = fl_fail(FL_EINVAL, "%s: not a trace (a JSON array of events)", in[k]);
            break;
        }
        int pid = pid_of(a);
        bool taken = false;
        for (size_t j = 0; j < k; j++)
            taken = taken || pids[j] == pid;
        if (taken) {
            for (bool used = true; used;) {
                used = false;
                for (size_t j = 0; j < k; j++)
                    used = used || pids[j] == next_free;
                if (used)
                    next_free++;
            }
            fprintf(stderr, "flodl-trace-merge: %s is rank %d too: shown as process %d\n", in[k],
                    pid, next_free);
            pid = next_free++;
            set_pid(a, pid, k);
        }
        pids[k] = pid;
        while (cJSON_GetArraySize(a) > 0)
            cJSON_AddItemToArray(all, cJSON_DetachItemFromArray(a, 0));
        cJSON_Delete(a);
    }
    free(pids);
    if (rc == FL_OK) {
        char *json = cJSON_PrintUnformatted(all);
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
        FILE *f = json ? fopen(tmp, "w") : NULL;
        bool ok = f != NULL && fputs(json, f) != EOF && fputc('\n', f) != EOF;
        ok = (f != NULL && fclose(f) == 0) && ok;
        if (!ok || rename(tmp, out) != 0) {
            rc = fl_fail(FL_EIO, "cannot write %s: %s", out, strerror(errno));
            unlink(tmp);
        }
        free(json);
    }
    cJSON_Delete(all);
    return rc;
}
