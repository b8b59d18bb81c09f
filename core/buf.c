/* Buffers with release hooks: the one way a payload changes hands without a copy. */
#include "fl_core.h"

#include <string.h>

void fl_buf_release(fl_buf_t *buf)
{
    if (buf == NULL)
        return;
    if (buf->release != NULL)
        buf->release(buf->data, buf->hint);
    memset(buf, 0, sizeof *buf);
}
