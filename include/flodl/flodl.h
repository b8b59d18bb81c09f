/* flodl public API: versions, error codes, element types and reduction operators.
 * This is the umbrella header of libflodl; it includes the communicator (comm.h), the
 * compressor (compress.h), the embeddable coordinator (coordinator.h) and the
 * parameter-server client (ps.h). Private types of the components never appear in these
 * headers, and libflodl.so exports exactly the functions declared in include/flodl.
 *
 * ABI: within one soname (libflodl.so.0.1 for every 0.1.x; see docs/c-api.md,
 * "ABI") a program built against older headers keeps running with a newer libflodl:
 * - functions are never removed and their signatures and meaning do not change; enum values
 *   and error codes keep their numbers (new ones may be added);
 * - the options structs that carry a struct_size as their first field (fl_comm_opts_t,
 *   fl_ps_client_opts_t, fl_coord_opts_t) may grow: new fields are only appended, with
 *   defaults that keep the old behaviour. struct_size, set by the *_opts_init function, is
 *   sizeof the struct the program was built with: a library accepts the size of every
 *   release of its soname up to its own and refuses any other (FL_EINVAL, naming both sizes),
 *   e.g. a struct not filled by *_opts_init, or one from headers newer than the library.
 *   Always fill them with *_opts_init, then set fields by name;
 * - every other struct (the other options, stats and info structs, fl_ps_grad_t) keeps its
 *   layout; changing it, or breaking any rule above, takes a new soname. */
#ifndef FLODL_FLODL_H
#define FLODL_FLODL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_VERSION_MAJOR 0
#define FL_VERSION_MINOR 1
#define FL_VERSION_PATCH 0
#define FL_VERSION_STRING "0.1.0"

/* The version of the libflodl a program runs with (the macros above are the one it was built
 * with), as ncclGetVersion and zmq_version give theirs: "0.1.0", and 10000 * major + 100 *
 * minor + patch. */
const char *fl_version(void);
int fl_version_code(void);

/* The optional parts this libflodl was built with: "cuda", or "" for a CPU-only build. */
const char *fl_build_features(void);

/* Error codes. Every call that can fail returns FL_OK or one of these (negative). */
typedef enum fl_err {
    FL_OK = 0,
    FL_EINVAL = -1,     /* bad argument, option or flag; the detail names it */
    FL_ENOMEM = -2,     /* allocation failed */
    FL_EIO = -3,        /* operating-system or socket failure */
    FL_ETIMEDOUT = -4,  /* a deadline passed; the detail names the peer waited for */
    FL_EPEER = -5,      /* a peer died, left or refused us; the detail names rank and host */
    FL_EPROTO = -6,     /* malformed, unexpected or mismatched message */
    FL_EGPU = -7,       /* CUDA or NCCL failure, with the CUDA error text */
    FL_ECLOSED = -8,    /* the object was shut down or is broken after an earlier failure */
    FL_ENONFINITE = -9, /* NaN or Inf where a finite number was required */
    FL_ERESYNC = -10,   /* the parameter server restarted from a checkpoint: go on from its
                           step with its parameters (see ps.h) */
} fl_err_t;

/* Static description of an error code; never NULL. */
const char *fl_strerror(int code);

/* Detail text of the calling thread's last failure: rank, host, operation and cause.
 * Valid until the next flodl call on this thread. Never NULL. */
const char *fl_last_error(void);

/* Element types of buffers. float16 and bfloat16 reduce with float32 accumulation. */
typedef enum fl_dtype {
    FL_FLOAT32 = 1,
    FL_FLOAT16 = 2,
    FL_BFLOAT16 = 3,
    FL_FLOAT64 = 4,
    FL_INT32 = 5,
    FL_UINT8 = 6,
    FL_INT64 = 7,
} fl_dtype_t;

/* Bytes per element of a dtype, or 0 for an unknown one. */
size_t fl_dtype_size(fl_dtype_t dtype);

/* Name of a dtype ("float32"), or "unknown". */
const char *fl_dtype_name(fl_dtype_t dtype);

/* Reduction operators. */
typedef enum fl_op {
    FL_SUM = 1,
    FL_AVG = 2, /* sum divided by the number of ranks, once, in float32 or wider */
    FL_MAX = 3,
    FL_MIN = 4,
} fl_op_t;

/* Name of an operator ("sum"), or "unknown". */
const char *fl_op_name(fl_op_t op);

/* Log levels, lowest first. */
typedef enum fl_log_level {
    FL_LOG_DEBUG = 0,
    FL_LOG_INFO = 1,
    FL_LOG_WARN = 2,
    FL_LOG_ERROR = 3,
    FL_LOG_OFF = 4,
} fl_log_level_t;

#ifdef __cplusplus
}
#endif

#include <flodl/comm.h>
#include <flodl/compress.h>
#include <flodl/coordinator.h>
#include <flodl/hier.h>
#include <flodl/ps.h>

#endif
