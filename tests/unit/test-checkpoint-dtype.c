/* test-checkpoint-dtype.c: core/checkpoint-dtype.c: what converts, with which rounding, and
 * what is refused. Bit patterns are torch's (x.to(dtype).view(int16)) for the same values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/checkpoint-dtype.h"

static void test_exact_and_rounded(void **state) {
        char why[160];
        /* BF16 1.0, -2.5, the smallest subnormal -> float32, exactly */
        uint16_t bf[3] = { 0x3f80, 0xc020, 0x0001 };
        float f[3];
        assert_int_equal(checkpoint_dtype_check(SAFETENSORS_BF16, DTYPE_FLOAT32, why, sizeof why), 0);
        checkpoint_dtype_convert(SAFETENSORS_BF16, DTYPE_FLOAT32, bf, f, 3);
        assert_true(f[0] == 1.0f && f[1] == -2.5f);
        uint32_t bits;
        memcpy(&bits, &f[2], 4);
        assert_int_equal(bits, 0x00010000);

        /* F32 -> bfloat16, ties to even: 1 + 2^-8 (a tie) -> 1.0; 1 + 3 * 2^-8 -> 1 + 2^-6 */
        float in[3] = { 1.00390625f, 1.01171875f, -0.0f };
        uint16_t out[3];
        checkpoint_dtype_convert(SAFETENSORS_F32, DTYPE_BFLOAT16, in, out, 3);
        assert_int_equal(out[0], 0x3f80);
        assert_int_equal(out[1], 0x3f82);
        assert_int_equal(out[2], 0x8000);

        /* F32 -> float16: 65520 overflows to inf (torch gives inf too), 1/3 rounds */
        float big[2] = { 65520.0f, 1.0f / 3.0f };
        checkpoint_dtype_convert(SAFETENSORS_F32, DTYPE_FLOAT16, big, out, 2);
        assert_int_equal(out[0], 0x7c00);
        assert_int_equal(out[1], 0x3555);

        /* F64 -> float32: 0.1 -> 0x3dcccccd */
        double d = 0.1;
        checkpoint_dtype_convert(SAFETENSORS_F64, DTYPE_FLOAT32, &d, f, 1);
        memcpy(&bits, &f[0], 4);
        assert_int_equal(bits, 0x3dcccccd);

        /* F16 -> bfloat16: 1.0 and 2^-24 (the smallest float16 subnormal) */
        uint16_t h[2] = { 0x3c00, 0x0001 };
        checkpoint_dtype_convert(SAFETENSORS_F16, DTYPE_BFLOAT16, h, out, 2);
        assert_int_equal(out[0], 0x3f80);
        assert_int_equal(out[1], 0x3380);

        /* The same type: bytes, unaligned too */
        uint8_t src[9] = { 0, 1, 2, 3, 4, 5, 6, 7, 8 }, dst[9] = {};
        checkpoint_dtype_convert(SAFETENSORS_BF16, DTYPE_BFLOAT16, src + 1, dst + 1, 4);
        assert_memory_equal(src + 1, dst + 1, 8);
}

static void test_refused(void **state) {
        char why[160];

        assert_int_equal(checkpoint_dtype_check(SAFETENSORS_BF16, DTYPE_FLOAT16, why, sizeof why),
                         -EINVAL);
        assert_string_equal(why, "a BF16 tensor cannot become float16: float16's range is "
                                 "smaller than bfloat16's");
        assert_int_equal(checkpoint_dtype_check(SAFETENSORS_F64, DTYPE_BFLOAT16, why, sizeof why),
                         -EINVAL);
        assert_string_equal(why, "a F64 tensor cannot become bfloat16: it would be rounded twice "
                                 "(through float32)");
        const SafetensorsDtype no[] = { SAFETENSORS_I64, SAFETENSORS_I32, SAFETENSORS_U8,
                                        SAFETENSORS_BOOL, SAFETENSORS_F8_E4M3, SAFETENSORS_F4,
                                        SAFETENSORS_C64 };
        for (size_t i = 0; i < ELEMENTSOF(no); i++)
                assert_int_equal(checkpoint_dtype_check(no[i], DTYPE_FLOAT32, why, sizeof why),
                                 -EINVAL);
        assert_string_equal(why, "a C64 tensor cannot become float32: only F32, F64, BF16 and F16 "
                                 "tensors fill floating-point parameters");
        const SafetensorsDtype yes[] = { SAFETENSORS_F32, SAFETENSORS_F16, SAFETENSORS_BF16 };
        for (size_t i = 0; i < ELEMENTSOF(yes); i++)
                for (Dtype t = 0; t < _DTYPE_MAX; t++)
                        assert_int_equal(checkpoint_dtype_check(yes[i], t, why, sizeof why),
                                         yes[i] == SAFETENSORS_BF16 && t == DTYPE_FLOAT16 ? -EINVAL : 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_exact_and_rounded),
                cmocka_unit_test(test_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
