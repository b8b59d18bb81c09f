/* flodl-worker's --help, generated from its flag table (worker_flags.c): the sections in
 * order, each flag as "--name VALUE (what it does)", flowed onto lines of at most HELP_WIDTH
 * columns; a flag that does not fit on a line starts the next one. */
#include <stdio.h>
#include <string.h>

#include "worker_args.h"

#define HELP_WIDTH 90

/* Each section's title (NULL: none), whether its flags follow the title on its line, and the
 * text after them (NULL: a line break). */
static const struct help_section {
    const char *title;
    bool same_line;
    const char *after;
} sections[WF_SEC_COUNT] = {
    [WF_SEC_USAGE] = {"usage: flodl-worker", true,
                      " [options]\n"
                      "  rank, world size and coordinator may come from the environment "
                      "instead: FLODL_RANK/\n"
                      "  FLODL_WORLD_SIZE/FLODL_COORDINATOR, torchrun's RANK/WORLD_SIZE/"
                      "MASTER_ADDR/MASTER_PORT,\n"
                      "  Open MPI's OMPI_COMM_WORLD_RANK/_SIZE, Kubernetes' "
                      "JOB_COMPLETION_INDEX.\n"},
    [WF_SEC_DATA] = {"data (default: the built-in dataset):", false, NULL},
    [WF_SEC_TRAIN] = {"model and training:", false, NULL},
    [WF_SEC_SECURITY] = {"security (networked modes; one of them is required):", false, NULL},
    [WF_SEC_COMM] = {"communicator:", false, NULL},
    [WF_SEC_PS] = {"parameter server (--mode ps):", true, NULL},
    [WF_SEC_DRILL] = {"drill (--mode drill):", true, NULL},
};

/* A line being written: where it has got to. */
typedef struct flow {
    FILE *out;
    int col;
} flow_t;

static void flow_break(flow_t *w, int indent)
{
    w->col = fprintf(w->out, "\n%*s", indent, "") - 1;
}

/* Writes text's words one space apart, the first gap spaces after what the line holds; a word
 * that would cross the width starts a line of its own, indented as a flag's text goes on. */
static void flow_words(flow_t *w, const char *text, int gap)
{
    const char *p = text + strspn(text, " ");
    while (*p != '\0') {
        int n = (int)strcspn(p, " ");
        if (w->col > 4 && w->col + gap + n > HELP_WIDTH)
            flow_break(w, 4);
        else
            w->col += fprintf(w->out, "%*s", gap, "");
        w->col += (int)fwrite(p, 1, (size_t)n, w->out);
        gap = 1;
        p += n + (int)strspn(p + n, " ");
    }
}

/* The next row of section s after row i: whether it is in brackets too. */
static bool next_optional(const wflag_t *flags, size_t n, size_t i, wflag_sec_t s)
{
    for (size_t j = i + 1; j < n; j++)
        if (flags[j].sec == s)
            return flags[j].optional;
    return false;
}

/* "--name META help", with the brackets of a run of optional flags; *open: inside a run. */
static void entry_text(const wflag_t *flags, size_t n, size_t i, bool *open, char *out, size_t cap)
{
    const wflag_t *f = &flags[i];
    bool close = f->optional && (f->help != NULL || !next_optional(flags, n, i, f->sec));
    char words[160] = "";
    if (f->meta == NULL && f->words != NULL)
        fl_wk_flag_words(f->words, words, sizeof words);
    snprintf(out, cap, "%s--%s%s%s%s%s%s", f->optional && !*open ? "[" : "", f->name,
             f->meta != NULL || words[0] != '\0' ? " " : "", f->meta != NULL ? f->meta : words,
             close ? "]" : "", f->help != NULL ? " " : "", f->help != NULL ? f->help : "");
    *open = f->optional && !close;
}

static void help_section(FILE *out, wflag_sec_t s)
{
    const struct help_section *sec = &sections[s];
    flow_t w = {out, 0};
    int gap = 0;
    if (sec->title == NULL) {
        w.col = fprintf(out, "  ");
    } else {
        w.col = fprintf(out, "%s", sec->title);
        gap = 1;
        if (!sec->same_line) {
            flow_break(&w, 2);
            gap = 0;
        }
    }
    size_t n;
    const wflag_t *flags = fl_wk_flags(&n);
    bool open = false;
    for (size_t i = 0; i < n; i++) {
        if (flags[i].sec != s)
            continue;
        char text[1024];
        entry_text(flags, n, i, &open, text, sizeof text);
        /* A flag that does not fit on the line starts the next one. */
        if (w.col > 2 && w.col + gap + (int)strlen(text) > HELP_WIDTH) {
            flow_break(&w, 2);
            gap = 0;
        }
        flow_words(&w, text, gap);
        gap = open ? 1 : 2;
    }
    fputs(sec->after != NULL ? sec->after : "\n", out);
}

void fl_wk_args_help(FILE *out)
{
    for (int s = WF_SEC_USAGE; s < WF_SEC_COUNT; s++)
        help_section(out, (wflag_sec_t)s);
}
