/* proto: the wire messages as plain C structs, and the only code that packs and unpacks them
 * (protobuf-c, generated from flodl.proto at build time). Decoding validates everything a
 * receiver relies on: magic, version, type, the body that type needs, string and list bounds,
 * frame descriptions; fl_msg_check_frames() then compares the header with the frames that
 * actually arrived. No sockets here: transport/ moves the bytes. */
#ifndef FL_MSG_H
#define FL_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_MSG_MAGIC 0x4C444C46u /* "FLDL" little-endian */
#define FL_MSG_VERSION 1u
#define FL_MSG_MAX_FRAMES 16
#define FL_MSG_MAX_STRIPES 8
#define FL_MSG_TEXT_MAX 512
#define FL_MSG_MISSING_MAX 256
#define FL_MSG_MAX_PEERS 65536
#define FL_MSG_TUNING_MAX 128

typedef enum fl_msg_type {
    FL_MSG_NONE = 0,
    FL_MSG_REGISTER = 1,
    FL_MSG_WELCOME = 2,
    FL_MSG_BARRIER = 3,
    FL_MSG_HEARTBEAT = 4,
    FL_MSG_ERROR = 5,
    FL_MSG_SHUTDOWN = 6,
    FL_MSG_CHUNK = 7,
} fl_msg_type_t;

typedef enum fl_codec {
    FL_CODEC_RAW = 0,
    FL_CODEC_LZ4 = 1,
    FL_CODEC_SPARSE = 2, /* a sparse block: its own header says n, k and sizes */
} fl_codec_t;

/* Why a message was refused; maps onto the context counters. */
typedef enum fl_msg_fault {
    FL_FAULT_NONE = 0,
    FL_FAULT_HEADER,  /* not a parseable header, or a field out of bounds */
    FL_FAULT_MAGIC,   /* wrong magic */
    FL_FAULT_VERSION, /* other protocol version */
    FL_FAULT_FRAMES,  /* frames differ from the header's description */
    FL_FAULT_SIZE,    /* over the size limit */
} fl_msg_fault_t;

typedef struct fl_msg_frame {
    uint64_t bytes;
    uint32_t dtype; /* fl_dtype_t, 0 for untyped bytes */
    uint32_t codec; /* fl_codec_t */
    uint64_t raw_bytes;
} fl_msg_frame_t;

typedef struct fl_msg_register {
    int32_t rank;
    int32_t world_size;
    char host[FL_HOST_MAX];
    uint32_t nendpoints;
    char endpoints[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    int32_t pid;
    uint64_t model_signature;
    char tuning[FL_MSG_TUNING_MAX];
} fl_msg_register_t;

typedef struct fl_msg_peer {
    int32_t rank;
    char host[FL_HOST_MAX];
    uint32_t nendpoints;
    char endpoints[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    int32_t pid;
} fl_msg_peer_t;

typedef struct fl_msg_welcome {
    uint32_t npeers;
    fl_msg_peer_t *peers; /* npeers entries; owned by the header (fl_msg_hdr_deinit frees) */
    uint32_t heartbeat_ms;
    uint32_t heartbeat_timeout_ms;
} fl_msg_welcome_t;

typedef struct fl_msg_barrier {
    uint64_t id;
    uint32_t round;
} fl_msg_barrier_t;

typedef struct fl_msg_heartbeat {
    uint32_t op;
    uint64_t op_seq;
    uint32_t op_step;
    int32_t waiting_on;
    uint32_t registered;
    char missing[FL_MSG_MISSING_MAX];
} fl_msg_heartbeat_t;

typedef struct fl_msg_error {
    int32_t code;
    int32_t about_rank;
    char host[FL_HOST_MAX];
    char text[FL_MSG_TEXT_MAX];
} fl_msg_error_t;

typedef struct fl_msg_shutdown {
    int32_t code;
    char text[FL_MSG_TEXT_MAX];
} fl_msg_shutdown_t;

typedef struct fl_msg_chunk {
    uint32_t coll;
    uint32_t phase;
    uint32_t step;
    uint32_t seg;
    uint64_t offset;
    uint64_t count;
    uint32_t op;
    uint64_t total;
    uint32_t dtype;
} fl_msg_chunk_t;

typedef struct fl_msg_hdr {
    uint32_t version;
    char job_id[FL_JOB_MAX];
    uint64_t generation;
    fl_msg_type_t type;
    int32_t sender;
    uint64_t seq;
    uint64_t step;
    uint32_t nframes;
    fl_msg_frame_t frames[FL_MSG_MAX_FRAMES];
    union {
        fl_msg_register_t reg;
        fl_msg_welcome_t welcome;
        fl_msg_barrier_t barrier;
        fl_msg_heartbeat_t heartbeat;
        fl_msg_error_t error;
        fl_msg_shutdown_t shutdown;
        fl_msg_chunk_t chunk;
    } u;
} fl_msg_hdr_t;

/* Zeroes h and sets version, type and sender; the body for type is zero-initialised. */
void fl_msg_hdr_init(fl_msg_hdr_t *h, fl_msg_type_t type, int32_t sender);

/* Frees what decoding allocated (the welcome peer table). Leaves h zeroed. NULL-safe. */
void fl_msg_hdr_deinit(fl_msg_hdr_t *h);

/* Frees what decoding allocated but keeps the plain fields (type, sender, job, ...), for
 * callers that answer a refused message. NULL-safe. */
void fl_msg_hdr_free_tables(fl_msg_hdr_t *h);

/* Allocates the welcome peer table of h (type must be FL_MSG_WELCOME). FL_OK or FL_ENOMEM. */
int fl_msg_welcome_alloc(fl_msg_hdr_t *h, uint32_t npeers);

/* Encodes h. alloc(len, ud) must return len writable bytes (transport hands out the memory of
 * the outgoing frame, so nothing is copied twice); NULL means out of memory. Sets *len.
 * Returns FL_OK, FL_EINVAL (h breaks a bound: a string too long, too many frames), FL_ENOMEM. */
int fl_msg_encode(const fl_msg_hdr_t *h, void *(*alloc)(size_t len, void *ud), void *ud,
                  size_t *len);

/* Decodes and validates one header frame into out (caller owns out; deinit it afterwards,
 * also after a failure). Returns FL_OK, or FL_EPROTO with *fault set and the detail naming
 * the field; on a version mismatch out->version, type and sender are still filled so the
 * receiver can answer. */
int fl_msg_decode(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault);

/* Checks the frames that arrived against the header: same count, each frame's byte size as
 * declared, raw payload sizes of RAW frames equal to their wire size, none over max_bytes.
 * FL_OK or FL_EPROTO with *fault (FL_FAULT_FRAMES or FL_FAULT_SIZE). */
int fl_msg_check_frames(const fl_msg_hdr_t *h, const size_t *sizes, size_t n, size_t max_bytes,
                        fl_msg_fault_t *fault);

/* "register", "chunk", ...; "unknown" for others. */
const char *fl_msg_type_name(int type);

#ifdef __cplusplus
}
#endif

#endif
