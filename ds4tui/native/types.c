/* types.c — the GGML type traits table (types.h). */
#include "types.h"
#include "ds4_engine.h"
#include "cpu/kernels.h"

#include <pthread.h>
#include <stdio.h>

static const ds4_type_traits k_types[] = {
    /* type               name       elems bytes mat vec planar dequant                  CPU dot */
    {DS4_TYPE_F32,     "F32",      1,    4,  1,  1,  0, ds4_cpu_dequant_f32,     ds4_cpu_dot_f32},
    {DS4_TYPE_F16,     "F16",      1,    2,  1,  1,  0, ds4_cpu_dequant_f16,     ds4_cpu_dot_f16},
    {DS4_TYPE_BF16,    "BF16",     1,    2,  1,  1,  0, ds4_cpu_dequant_bf16,    ds4_cpu_dot_bf16},
    {DS4_TYPE_Q8_0,    "Q8_0",     32,   34, 1,  0,  1, ds4_cpu_dequant_q8_0,    ds4_cpu_dot_q8_0},
    {DS4_TYPE_Q2_K,    "Q2_K",     256,  84, 1,  0,  1, ds4_cpu_dequant_q2_k,    ds4_cpu_dot_q2_k},
    {DS4_TYPE_IQ2_XXS, "IQ2_XXS",  256,  66, 1,  0,  1, ds4_cpu_dequant_iq2_xxs, ds4_cpu_dot_iq2_xxs},
    {DS4_TYPE_I32,     "I32",      1,    4,  0,  0,  0, NULL,                    NULL},
};

const ds4_type_traits *ds4_type(int type) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].type == type) return &k_types[i];
    return NULL;
}

const char *ds4_type_name(int type) {
    const ds4_type_traits *t = ds4_type(type);
    return t ? t->name : "unknown";
}

size_t ds4_row_bytes(int type, int64_t n) {
    const ds4_type_traits *t = ds4_type(type);
    if (!t || n < 0 || n % t->block_elems != 0) return 0;
    return (size_t)(n / t->block_elems) * t->block_bytes;
}

static char k_lists[2][128];
static pthread_once_t k_lists_once = PTHREAD_ONCE_INIT;

static void make_lists(void) {
    for (int v = 0; v < 2; v++) {
        const char *names[16];
        int n = 0;
        for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
            if (v ? k_types[i].vector : k_types[i].matrix) names[n++] = k_types[i].name;
        char *o = k_lists[v];
        size_t left = sizeof k_lists[v];
        for (int i = 0; i < n; i++) {
            int w = snprintf(o, left, "%s%s", i == 0 ? "" : (i == n - 1 ? " or " : ", "), names[i]);
            if (w < 0 || (size_t)w >= left) break;
            o += w;
            left -= (size_t)w;
        }
    }
}

const char *ds4_type_list(int vectors) {
    pthread_once(&k_lists_once, make_lists);
    return k_lists[vectors ? 1 : 0];
}
