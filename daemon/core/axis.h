/* axis.h: the four parallel axes tp, cp, ep, pp, always iterated in that order. */
#pragma once

#include <errno.h>

typedef enum Axis {
        AXIS_TP,
        AXIS_CP,
        AXIS_EP,
        AXIS_PP,
        _AXIS_MAX,
        _AXIS_INVALID = -EINVAL,
} Axis;

const char *axis_to_string(Axis a);
/* "tp" -> AXIS_TP; anything else -> _AXIS_INVALID. */
Axis axis_from_string(const char *s);
