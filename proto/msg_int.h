/* Private to proto/: the generated protobuf-c declarations. No other folder includes this. */
#ifndef FL_MSG_INT_H
#define FL_MSG_INT_H

#include "flodl.pb-c.h"

#endif
