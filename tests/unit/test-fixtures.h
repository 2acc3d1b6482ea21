/* test-fixtures.h: where the unit tests find the repository's test data (tests/conformance). */
#pragma once

#include <stdlib.h>

/*
 * The conformance fixtures folder (cases.json, registry/), from $FAMILYD_CONFORMANCE, which
 * tests/unit/meson.build sets to <source root>/tests/conformance. Run by hand, a test finds it
 * relative to the source root it is started in.
 */
static inline const char *conformance_dir(void) {
        const char *d = getenv("FAMILYD_CONFORMANCE");
        return d && *d ? d : "tests/conformance";
}
