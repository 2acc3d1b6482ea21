/* axis.c: names of the parallel axes. */
#include "axis.h"
#include "common/macro.h"

static const char *const axis_table[_AXIS_MAX] = {
        [AXIS_TP] = "tp",
        [AXIS_CP] = "cp",
        [AXIS_EP] = "ep",
        [AXIS_PP] = "pp",
};

const char *axis_to_string(Axis a) {
        if (a < 0 || a >= _AXIS_MAX)
                return NULL;
        return axis_table[a];
}

Axis axis_from_string(const char *s) {
        if (!s)
                return _AXIS_INVALID;
        for (Axis a = 0; a < _AXIS_MAX; a++)
                if (streq(axis_table[a], s))
                        return a;
        return _AXIS_INVALID;
}
