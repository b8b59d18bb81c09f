/* Private to device/: the backend table and the one operation record every backend runs. The
 * front end (dev.c) checks arguments, fills an operation and hands it to the device's backend:
 * cpu runs it at once (dev_host.c), sim queues it on the stream's thread and runs the same
 * host code there, cuda launches cuBLAS or a kernel (dev_cuda.cu). */
#ifndef FL_DEV_INT_H
#define FL_DEV_INT_H

#include "fl_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dev_opcode {
    DOP_H2D = 0,    /* p[0] device dst, p[1] host src, n[0] bytes */
    DOP_D2H,        /* p[0] host dst, p[1] device src, n[0] bytes */
    DOP_D2D,        /* p[0] dst, p[1] src, n[0] bytes */
    DOP_MEMSET,     /* p[0] dst, n[0] bytes, i0 the byte */
    DOP_GEMM_FWD,   /* n = b, out, in; p = x, w, z; f[0] beta */
    DOP_GEMM_WGRAD, /* n = b, out, in; p = dz, a, gw */
    DOP_GEMM_IGRAD, /* n = b, out, in; p = dz, w, da */
    DOP_BIAS_ROWS,  /* p = z, bias; n = rows, cols */
    DOP_RELU,       /* p[0] z; n[0] */
    DOP_RELU_BACK,  /* p = da, a; n[0] */
    DOP_BIAS_GRAD,  /* p = gb, dz; n = rows, cols */
    DOP_XENT,       /* p = logits, labels, dz (may be NULL), row_loss, out; n = rows, classes */
    DOP_SCALE,      /* p[0] x; n[0]; f[0] alpha */
    DOP_AXPY,       /* p = y, x; n[0]; f[0] alpha */
    DOP_SUMSQ,      /* p = x, out; n[0] */
    DOP_NONFINITE,  /* p = x, out; n[0] */
    DOP_OPT,        /* p = param, grad, buf1, buf2; n[0]; sc */
    DOP_EF_ACCUM,   /* p = v, u (NULL without momentum), g; n[0]; f = m, scale */
    DOP_EF_SENT,    /* p = v, u (may be NULL), idx, val; n[0] k, n[1] entries of v; i0 wire */
    DOP_TOPK,       /* p = x, idx, val, out, workspace (the backend's); n = n, k */
    DOP_PEER,       /* p[0] dst (the stream's device), p[1] src (on peer); n[0] bytes */
    DOP_SUM_ROWS,   /* p = out, in; n = cols, rows; f[0] alpha */
    DOP_COUNT
} dev_opcode_t;

#define DEV_NPTR 5

typedef struct dev_op {
    dev_opcode_t code;
    void *p[DEV_NPTR];    /* raw addresses (device or host, as the opcode says) */
    size_t ext[DEV_NPTR]; /* bytes of each p the operation may touch (sim checks them) */
    bool host[DEV_NPTR];  /* p[i] is host memory */
    size_t n[3];
    float f[2];
    int i0;
    fl_opt_scalars_t sc;
    const struct fl_dev *peer; /* DOP_PEER: the device p[1] lives on (of the same kind) */
} dev_op_t;

const char *fl_dev_op_name(dev_opcode_t code);

struct fl_dev {
    const struct dev_backend *be;
    fl_dev_opts_t o;
    char name[160];
    void *impl;
};

struct fl_stream {
    fl_dev_t *d;
    void *impl;
};

struct fl_event {
    fl_dev_t *d;
    void *impl;
    bool timed;    /* fl_event_create_timed: fl_event_elapsed_ms may read it */
    bool recorded; /* fl_event_record succeeded once: before that no backend is asked for its
                    * time (CUDA would report an invalid handle, a sanitizer an API error) */
    int64_t t_ns;  /* cpu: the host clock at the last record (its work is done by then) */
};

struct fl_dev_topk {
    fl_dev_t *d;
    size_t n_max;
    void *impl; /* the backend's workspace (NULL on cpu and sim: the host code needs none) */
};

typedef struct dev_backend {
    const char *name;
    /* devices of this kind (see fl_dev_count) */
    int (*count)(char *why, size_t cap);
    int (*open)(fl_dev_t *d); /* sets d->impl and d->name */
    void (*close)(fl_dev_t *d);
    int (*mem_info)(fl_dev_t *d, size_t *free_bytes, size_t *total_bytes);
    int (*bind)(fl_dev_t *d);
    int (*alloc)(fl_dev_t *d, size_t bytes, void **out);
    void (*free)(fl_dev_t *d, void *p);
    int (*host_alloc)(fl_dev_t *d, size_t bytes, void **out);
    void (*host_free)(fl_dev_t *d, void *p);
    int (*stream_open)(fl_stream_t *s);
    void (*stream_close)(fl_stream_t *s);
    int (*stream_sync)(fl_stream_t *s, int timeout_ms);
    int (*event_open)(fl_event_t *e);
    void (*event_close)(fl_event_t *e);
    int (*event_record)(fl_event_t *e, fl_stream_t *s);
    int (*stream_wait)(fl_stream_t *s, fl_event_t *e);
    bool (*event_done)(fl_event_t *e);
    int (*event_sync)(fl_event_t *e, int timeout_ms);
    int (*run)(fl_stream_t *s, const dev_op_t *op); /* queue (or run) one operation */
    int (*topk_open)(fl_dev_topk_t *t);
    void (*topk_close)(fl_dev_topk_t *t);
    /* Page-locks the caller's host memory (NULL: nothing to do, as on cpu and sim). */
    int (*host_register)(fl_dev_t *d, void *p, size_t bytes);
    void (*host_unregister)(fl_dev_t *d, void *p);
    /* The backend's own stream handle (cuda: the cudaStream_t; NULL: none, as on cpu and sim). */
    void *(*stream_native)(fl_stream_t *s);
    /* Milliseconds between two completed records of timed events of the device. */
    int (*event_elapsed)(fl_event_t *start, fl_event_t *end, double *ms);
} dev_backend_t;

extern const dev_backend_t fl_dev_cpu_backend;
extern const dev_backend_t fl_dev_sim_backend;
extern const dev_backend_t fl_dev_cuda_backend; /* dev_cuda.cu, or dev_nocuda.c without CUDA */

/* Runs op on host memory (every p is a host address): the cpu backend's body, and what sim's
 * stream threads run. FL_OK, or FL_EINVAL for an opcode it does not know. */
int fl_dev_host_run(const dev_op_t *op);

/* The exact top-k of host memory x (n entries) into idx/val; out[0] the count, out[1] the first
 * NaN or Inf (-1: none). */
void fl_dev_host_topk(const float *x, size_t n, size_t k, uint32_t *idx, float *val, int64_t *out);

#ifdef __cplusplus
}
#endif

#endif
