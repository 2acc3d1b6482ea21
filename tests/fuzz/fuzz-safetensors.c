/* fuzz-safetensors.c: the safetensors header and index parsers (common/safetensors.c). */

/*
 * An input is a whole file: 8 bytes of header length, the header, the data. Besides "no crash",
 * it checks what a Build will rely on when a header is accepted: every tensor lies inside the
 * data, its bytes are its shape's, the tensors cover the data exactly, and each is found by its
 * name; and an index made of its names (with jansson, as a writer would) parses and agrees with
 * it. The same bytes are parsed as an index too.
 */

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_header(const SafetensorsHeader *h, size_t size) {
        uint64_t covered = 0;

        if (h->data_offset + h->data_size != size)
                abort();
        for (size_t i = 0; i < h->n_tensors; i++) {
                const SafetensorsTensor *t = &h->tensors[i];
                unsigned bits = safetensors_dtype_bits(t->dtype);
                if (bits == 0 || t->begin > t->end || t->end > h->data_size ||
                    safetensors_tensor_elements(t) * bits / 8 != safetensors_tensor_bytes(t) ||
                    safetensors_header_find(h, t->name) != t)
                        abort();
                if (i > 0 && strcmp(h->tensors[i - 1].name, t->name) >= 0)
                        abort();
                covered += t->end - t->begin;
        }
        if (covered != h->data_size)
                abort();
}

/* The index a writer would make for h alone, as one file "f"; it must agree with h. */
static void check_own_index(SafetensorsHeader *h) {
        _cleanup_(safetensors_index_freep) SafetensorsIndex *x = NULL;
        json_t *map = json_object(), *doc;
        char why[512], *text;

        if (!map)
                abort();
        for (size_t i = 0; i < h->n_tensors; i++)
                if (json_object_set_new(map, h->tensors[i].name, json_string("f")) < 0)
                        abort();
        doc = json_pack("{s:o}", "weight_map", map);
        text = json_dumps(doc, 0);
        json_decref(doc);
        if (!text)
                abort();
        int r = safetensors_index_parse(text, strlen(text), &x, why, sizeof why);
        free(text);
        if (h->n_tensors == 0) {
                if (r >= 0)
                        abort(); /* an index that names no tensor is refused */
                return;
        }
        if (r < 0 || x->n_files != 1 || x->n_entries != h->n_tensors ||
            safetensors_index_check(x, &h, why, sizeof why) < 0)
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        _cleanup_(safetensors_header_freep) SafetensorsHeader *h = NULL;
        _cleanup_(safetensors_index_freep) SafetensorsIndex *x = NULL;
        char why[512];
        uint64_t n;

        if (size >= 8 && safetensors_header_size(data, size, &n, why, sizeof why) >= 0 &&
            safetensors_header_parse((const char *) data + 8, n, size, &h, why, sizeof why) >= 0)
        {
                check_header(h, size);
                check_own_index(h);
        }
        if (safetensors_index_parse((const char *) data, size, &x, why, sizeof why) >= 0) {
                if (x->n_files == 0 || x->n_entries == 0)
                        abort();
                for (size_t i = 0; i < x->n_entries; i++)
                        if (safetensors_index_find(x, x->entries[i].name) != &x->entries[i] ||
                            x->entries[i].file >= x->n_files || strchr(x->files[x->entries[i].file], '/'))
                                abort();
        }
        return 0;
}
