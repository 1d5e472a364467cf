/* types.h — the GGML type traits table (internal): everything the engine knows about a type.
 *
 * One row per GGML type the engine reads (spec ds4.md §5 for the block formats).  The binder
 * (load.c) checks types and sizes with it, the CPU matmul (cpu/matmul.c) takes its dot kernel from
 * it and the GPU upload (gpu.c) asks it whether the planar layout takes a type.  Adding a type is
 * one row here, its dequantisation in cpu/dequant.c, its dot kernel in cpu/dot.c and, for the GPU,
 * its kernels in hip/.
 */
#ifndef DS4_TYPES_H
#define DS4_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t type;        /* GGML type id (ds4_engine.h DS4_TYPE_*) */
    const char *name;    /* GGML's name: "Q8_0" */
    int64_t block_elems; /* elements per block (1 for plain floats) */
    size_t block_bytes;  /* bytes per block */
    int matrix;          /* 1: a weight matrix may have this type (CPU and GPU matmul kernels exist) */
    int vector;          /* 1: a vector or small table may have it (dequantised to float at open) */
    int gpu_planar;      /* 1: the GPU's planar layout takes its rows (hip/planar.hip) */
    /* n elements (a multiple of block_elems) to float; NULL for I32 */
    void (*dequant)(const void *src, float *dst, int64_t n);
    /* the CPU dot kernel: Y[t * ldy + r] = row r . X[t * ldx, 0..cols) for rows r0 <= r < r1 (row r
     * at W + r * row_bytes) and t < n_tok, every token through the same arithmetic (batch-invariant);
     * NULL when not a matrix type */
    void (*cpu_dot)(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t r1, int64_t cols, const float *X,
                    int64_t ldx, int64_t n_tok, float *Y, int64_t ldy);
} ds4_type_traits;

/* The row of `type`, or NULL when the engine does not know it. */
const ds4_type_traits *ds4_type(int type);
/* GGML's name of `type`, or "unknown". */
const char *ds4_type_name(int type);
/* Bytes of n elements of `type`: 0 when unknown or n is not a multiple of the block. */
size_t ds4_row_bytes(int type, int64_t n);
/* "F32, F16, BF16, Q8_0, Q2_K or IQ2_XXS": the names of the types with matrix (or vector) set,
 * for error messages. */
const char *ds4_type_list(int vectors);

#endif
