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
#define FL_MSG_TUNING_MAX 512
#define FL_MSG_SETTINGS_MAX FL_SETTINGS_MAX /* Register.settings, terminator included */
#define FL_MSG_MAX_SHARDS 4096              /* shards of one job */
#define FL_MSG_MAX_CHECKPOINTS 16           /* checkpoint steps a server offers when resuming */
/* The largest header frame a bound socket takes: a server's registration with a shard endpoint
 * of FL_ENDPOINT_MAX bytes for each of FL_MSG_MAX_SHARDS shards, and 64 KiB for the rest. */
#define FL_MSG_HDR_MAX_IN (FL_MSG_MAX_SHARDS * (FL_ENDPOINT_MAX + 3) + 65536)
#define FL_MSG_TOKEN_MAX 33 /* a member's token: 32 hex digits of 16 random bytes, terminated */

typedef enum fl_msg_type {
    FL_MSG_NONE = 0,
    FL_MSG_REGISTER = 1,
    FL_MSG_WELCOME = 2,
    FL_MSG_BARRIER = 3,
    FL_MSG_HEARTBEAT = 4,
    FL_MSG_ERROR = 5,
    FL_MSG_SHUTDOWN = 6,
    FL_MSG_CHUNK = 7,
    FL_MSG_PUSH = 8,
    FL_MSG_PUSH_ACK = 9,
    FL_MSG_PULL = 10,
    FL_MSG_PULL_REPLY = 11,
} fl_msg_type_t;

typedef enum fl_msg_role {
    FL_ROLE_WORKER = 0,
    FL_ROLE_SERVER = 1,
} fl_msg_role_t;

/* The sender rank parameter-server processes stamp on their messages. */
#define FL_MSG_SENDER_SERVER (-2)

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
    int32_t rank; /* servers: the first shard served */
    int32_t world_size;
    char host[FL_HOST_MAX];
    uint32_t nendpoints;
    char endpoints[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    int32_t pid;
    uint64_t model_signature;
    char tuning[FL_MSG_TUNING_MAX];
    char settings[FL_MSG_SETTINGS_MAX]; /* workers: what every rank must share (fl_settings) */
    fl_msg_role_t role;
    uint64_t param_count;
    /* servers */
    uint32_t shard_count;
    uint32_t num_shards;
    uint32_t nshard_eps;
    char (*shard_eps)[FL_ENDPOINT_MAX]; /* nshard_eps entries; owned by the header */
    uint32_t ncheckpoints;
    uint64_t checkpoints[FL_MSG_MAX_CHECKPOINTS];
    uint32_t consistency; /* fl_ps_consistency_t */
    uint32_t staleness;
    uint64_t ckpt_every_steps;
    uint64_t ckpt_every_ms;
    char model_shapes[FL_MODEL_SHAPES_MAX]; /* "" or as fl_model_shapes_cut writes it */
    char token[FL_MSG_TOKEN_MAX];           /* "" or the token of the member's welcome */
} fl_msg_register_t;

typedef struct fl_msg_peer {
    int32_t rank;
    char host[FL_HOST_MAX];
    uint32_t nendpoints;
    char endpoints[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    int32_t pid;
} fl_msg_peer_t;

typedef struct fl_msg_shard {
    uint32_t index;
    uint64_t offset;
    uint64_t count;
    char endpoint[FL_ENDPOINT_MAX];
    char host[FL_HOST_MAX];
} fl_msg_shard_t;

typedef struct fl_msg_welcome {
    uint32_t npeers;
    fl_msg_peer_t *peers; /* npeers entries; owned by the header (fl_msg_hdr_deinit frees) */
    uint32_t heartbeat_ms;
    uint32_t heartbeat_timeout_ms;
    uint32_t nshards;
    fl_msg_shard_t *shards; /* nshards entries, by index; owned by the header */
    uint64_t param_count;
    uint32_t consistency;
    uint32_t staleness;
    bool resume;
    uint64_t resume_step;
    uint64_t ckpt_every_steps;
    uint64_t ckpt_every_ms;
    char token[FL_MSG_TOKEN_MAX]; /* the receiver's own token, proof for a later registration */
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

typedef enum fl_msg_push_kind {
    FL_PUSH_GRADIENT = 0,
    FL_PUSH_INIT = 1,
} fl_msg_push_kind_t;

typedef struct fl_msg_push {
    uint32_t shard;
    uint64_t offset;
    uint64_t count;
    uint64_t step;
    uint32_t batch;
    fl_msg_push_kind_t kind;
    bool checkpoint;
} fl_msg_push_t;

typedef struct fl_msg_push_ack {
    uint32_t shard;
    uint64_t step;
    uint64_t version;
    bool ignored;
} fl_msg_push_ack_t;

typedef struct fl_msg_pull {
    uint32_t shard;
    uint64_t offset;
    uint64_t count;
    uint64_t step;
    bool latest;
    uint32_t wait_ms;
    bool lz4;
} fl_msg_pull_t;

typedef struct fl_msg_pull_reply {
    uint32_t shard;
    uint64_t offset;
    uint64_t count;
    uint64_t version;
    uint64_t step;
    uint64_t min_step;
} fl_msg_pull_reply_t;

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
        fl_msg_push_t push;
        fl_msg_push_ack_t push_ack;
        fl_msg_pull_t pull;
        fl_msg_pull_reply_t pull_reply;
    } u;
} fl_msg_hdr_t;

/* Zeroes h and sets version, type and sender; the body for type is zero-initialised. */
void fl_msg_hdr_init(fl_msg_hdr_t *h, fl_msg_type_t type, int32_t sender);

/* Frees what decoding allocated (the welcome's peer table and shard map, a server
 * registration's shard endpoints). Leaves h zeroed. NULL-safe. */
void fl_msg_hdr_deinit(fl_msg_hdr_t *h);

/* Frees what decoding allocated but keeps the plain fields (type, sender, job, ...), for
 * callers that answer a refused message. NULL-safe. */
void fl_msg_hdr_free_tables(fl_msg_hdr_t *h);

/* Allocates the welcome peer table of h (type must be FL_MSG_WELCOME). FL_OK or FL_ENOMEM. */
int fl_msg_welcome_alloc(fl_msg_hdr_t *h, uint32_t npeers);

/* Allocates the welcome shard map of h (type FL_MSG_WELCOME). FL_OK or FL_ENOMEM. */
int fl_msg_welcome_alloc_shards(fl_msg_hdr_t *h, uint32_t nshards);

/* Allocates the shard endpoint table of a registration (type FL_MSG_REGISTER). */
int fl_msg_register_alloc_shards(fl_msg_register_t *reg, uint32_t n);

/* Deep copy of a decoded header into dst (dst's own tables are not freed first). FL_OK or
 * FL_ENOMEM (dst then holds no tables). */
int fl_msg_hdr_copy(fl_msg_hdr_t *dst, const fl_msg_hdr_t *src);

/* Encodes h. alloc(len, ud) must return len writable bytes (transport hands out the memory of
 * the outgoing frame, so nothing is copied twice); NULL means out of memory. Sets *len.
 * Identifiers that are not wire text (fl_text_scan) are refused; free text (error and
 * shutdown texts, the missing ranks) is sent escaped (fl_text_escape) instead, so a goodbye
 * is never lost for a file name in it. Returns FL_OK, FL_EINVAL (h breaks a bound: a string
 * unterminated, too long or not wire text, too many frames), FL_ENOMEM. */
int fl_msg_encode(const fl_msg_hdr_t *h, void *(*alloc)(size_t len, void *ud), void *ud,
                  size_t *len);

/* Decodes and validates one header frame into out (caller owns out; deinit it afterwards,
 * also after a failure). Every string must be wire text (fl_text_scan: UTF-8, no control
 * character, no NUL) at its full wire length; identifiers (job id, hosts, endpoints, tuning)
 * must fit their field, free text (error and shutdown texts, the missing ranks) is cut to it
 * between two characters. Returns FL_OK, or FL_EPROTO with *fault set and the detail naming
 * the field (never quoting the bytes refused); on a version mismatch out->version, type,
 * sender and the numbers are still filled so the receiver can answer (not the job id). */
int fl_msg_decode(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault);

/* Checks the frames that arrived against the header: same count, each frame's byte size as
 * declared, raw payload sizes of RAW frames equal to their wire size, none over max_bytes.
 * FL_OK or FL_EPROTO with *fault (FL_FAULT_FRAMES or FL_FAULT_SIZE). */
int fl_msg_check_frames(const fl_msg_hdr_t *h, const size_t *sizes, size_t n, size_t max_bytes,
                        fl_msg_fault_t *fault);

/* "register", "chunk", ...; "unknown" for others. */
const char *fl_msg_type_name(int type);

/* The operation a member reports in its heartbeats (Heartbeat.op): the collectives (their
 * numbers are Chunk.coll's, collective/fl_coll.h) and the parameter-server client's calls (its
 * step in Heartbeat.op_seq). */
typedef enum fl_msg_op {
    FL_MSG_OP_NONE = 0,
    FL_MSG_OP_ALLREDUCE = 1,
    FL_MSG_OP_REDUCE_SCATTER = 2,
    FL_MSG_OP_ALLGATHER = 3,
    FL_MSG_OP_BROADCAST = 4,
    FL_MSG_OP_BARRIER = 5,
    FL_MSG_OP_SPARSE_ALLREDUCE = 6,
    FL_MSG_OP_PUSH = 16,
    FL_MSG_OP_PULL = 17,
    FL_MSG_OP_PUSH_PULL = 18,
} fl_msg_op_t;

/* "allreduce", "push", ...; "operation <n>" for another number (into a static buffer of the
 * caller's thread). */
const char *fl_msg_op_name(uint32_t op);

/* How many elements each frame of a dense parameter-server payload of count elements carries
 * (a wire rule both sides apply): all of them up to 1 Mi elements, else pieces of at least
 * 1 Mi, a multiple of FL_MSG_PS_ALIGN, at most FL_MSG_MAX_FRAMES of them. Receivers of pieces
 * reuse heap buffers where one large frame would be mapped and page-faulted in afresh. */
#define FL_MSG_PS_ALIGN 2048
uint64_t fl_msg_ps_piece(uint64_t count);

/* True for the parameter-server client's operations. */
bool fl_msg_op_is_ps(uint32_t op);

#ifdef __cplusplus
}
#endif

#endif
