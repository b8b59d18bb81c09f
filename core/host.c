/* Host identity for error messages and the peer table. */
#include "fl_core.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void fl_hostname(char *out, size_t cap)
{
    if (cap == 0)
        return;
    if (gethostname(out, cap) != 0)
        snprintf(out, cap, "unknown-host");
    out[cap - 1] = '\0';
}

void fl_malloc_tune(void)
{
    /* ZeroMQ mallocs one buffer per large received frame and the receiver frees it right
     * after; with glibc's defaults each such buffer is mmapped (or trimmed back) and every page
     * faults in again on the next one. Keeping them in the heap is a process-wide choice, hence
     * the callers' opt-out. 32 MiB is the largest mmap threshold glibc takes on 64 bits. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    /* One arena: ZeroMQ's I/O threads allocate the buffers other threads free, and a thread's
     * own arena lives in 64 MiB heaps that are unmapped whenever they empty, so every message
     * would fault its pages in again. */
    mallopt(M_ARENA_MAX, 1);
}

uint64_t fl_rss_anon(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "RssAnon: %llu kB", &kib) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return (uint64_t)kib * 1024;
}
