/* Private to proto/: the generated protobuf-c declarations. No other folder includes this. */
#ifndef FL_MSG_INT_H
#define FL_MSG_INT_H

#include "fl_msg.h"
#include "flodl.pb-c.h"

/* The Header.body member that carries a message of this type, or NOT_SET for an unknown
 * type. */
static inline Flodl__Header__BodyCase fl_msg_body_case(int type)
{
    switch (type) {
    case FL_MSG_REGISTER: return FLODL__HEADER__BODY_REG;
    case FL_MSG_WELCOME: return FLODL__HEADER__BODY_WELCOME;
    case FL_MSG_BARRIER: return FLODL__HEADER__BODY_BARRIER;
    case FL_MSG_HEARTBEAT: return FLODL__HEADER__BODY_HEARTBEAT;
    case FL_MSG_ERROR: return FLODL__HEADER__BODY_ERROR;
    case FL_MSG_SHUTDOWN: return FLODL__HEADER__BODY_SHUTDOWN;
    case FL_MSG_CHUNK: return FLODL__HEADER__BODY_CHUNK;
    case FL_MSG_PUSH: return FLODL__HEADER__BODY_PUSH;
    case FL_MSG_PUSH_ACK: return FLODL__HEADER__BODY_PUSH_ACK;
    case FL_MSG_PULL: return FLODL__HEADER__BODY_PULL;
    case FL_MSG_PULL_REPLY: return FLODL__HEADER__BODY_PULL_REPLY;
    default: return FLODL__HEADER__BODY__NOT_SET;
    }
}

/* The message type whose body a Header.body case is (0 for NOT_SET). */
static inline int fl_msg_type_of_body(Flodl__Header__BodyCase body)
{
    for (int t = FL_MSG_REGISTER; t <= FL_MSG_PULL_REPLY; t++)
        if (fl_msg_body_case(t) == body)
            return t;
    return FL_MSG_NONE;
}

/* Checks what protobuf-c leaves unchecked in an unpacked header's bytes (msg_wire.c): every
 * string field at its wire length against the wire-text rule, and the number of body fields
 * on the wire (*nbodies). FL_OK, or FL_EPROTO with *fault FL_FAULT_HEADER and the detail naming
 * the field ("Register.host has a control character at byte 4 of 9"). */
int fl_msg_wire_check(const void *data, size_t len, unsigned *nbodies, fl_msg_fault_t *fault);

#endif
