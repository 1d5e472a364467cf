/* engine.c — version, type sizes and the dispatch of the public C API. */
#include "ds4_engine.h"
#include "cpu/kernels.h"

#include <stdio.h>

#define DS4_NATIVE_VERSION "0.1.0"

const char *ds4_version(void) { return "ds4tui-native " DS4_NATIVE_VERSION " (cpu)"; }

static int64_t block_elems(int type) {
    switch (type) {
    case DS4_TYPE_F32: case DS4_TYPE_F16: case DS4_TYPE_BF16: case DS4_TYPE_I32: return 1;
    case DS4_TYPE_Q8_0: return 32;
    case DS4_TYPE_Q2_K: case DS4_TYPE_IQ2_XXS: return 256;
    default: return 0;
    }
}

static size_t block_bytes(int type) {
    switch (type) {
    case DS4_TYPE_F32: case DS4_TYPE_I32: return 4;
    case DS4_TYPE_F16: case DS4_TYPE_BF16: return 2;
    case DS4_TYPE_Q8_0: return 34;
    case DS4_TYPE_Q2_K: return 84;
    case DS4_TYPE_IQ2_XXS: return 66;
    default: return 0;
    }
}

size_t ds4_type_row_bytes(int type, int64_t n) {
    int64_t be = block_elems(type);
    if (be == 0 || n < 0 || n % be != 0) return 0;
    return (size_t)(n / be) * block_bytes(type);
}

int ds4_dequantize(int type, const void *src, float *dst, int64_t n, char *err, size_t err_len) {
    int64_t be = block_elems(type);
    if (be == 0 || type == DS4_TYPE_I32) {
        if (err && err_len) snprintf(err, err_len, "ds4_dequantize: unsupported GGML type %d", type);
        return DS4_E_UNSUPPORTED;
    }
    if (n < 0 || n % be != 0) {
        if (err && err_len)
            snprintf(err, err_len, "ds4_dequantize: n=%lld is not a multiple of the block size %lld of GGML type %d",
                     (long long)n, (long long)be, type);
        return DS4_E_INVALID;
    }
    if (n > 0 && (!src || !dst)) {
        if (err && err_len) snprintf(err, err_len, "ds4_dequantize: NULL buffer");
        return DS4_E_INVALID;
    }
    switch (type) {
    case DS4_TYPE_F32: ds4_cpu_dequant_f32(src, dst, n); break;
    case DS4_TYPE_F16: ds4_cpu_dequant_f16(src, dst, n); break;
    case DS4_TYPE_BF16: ds4_cpu_dequant_bf16(src, dst, n); break;
    case DS4_TYPE_Q8_0: ds4_cpu_dequant_q8_0(src, dst, n); break;
    case DS4_TYPE_Q2_K: ds4_cpu_dequant_q2_k(src, dst, n); break;
    case DS4_TYPE_IQ2_XXS: ds4_cpu_dequant_iq2_xxs(src, dst, n); break;
    }
    return DS4_OK;
}
