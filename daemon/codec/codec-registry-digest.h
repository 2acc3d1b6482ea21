/* codec-registry-digest.h: the registry's digest, SHA-256 of its canonical form, in hex. */
#pragma once

#include "core/registry.h"
#include "core/topology.h"

/*
 * The lower-case hex SHA-256 (libsodium) of the registry's canonical form: every family as the
 * API encodes it (codec_family_encode), its `source` cleared and the mappings of the file format
 * whose order changes nothing put in key order (selectors, arguments, variants, a variant's
 * requires, a rule's when, a parameter's placements), with whether each variant replaces the
 * family's parameters; the families in the order of those bytes, each framed by its length.
 * Comments, file names, file order and key order do not count; anything Resolve or Build reads
 * does. 0, or -ENOMEM (also when libsodium cannot start).
 */
int codec_registry_digest(const Registry *r, char *ret);
