/*
 * ds4_engine.h — the whole public C API of the ds4tui native engine.
 *
 * The block between the CDEF markers is also the cffi cdef (build_native.py
 * extracts it), so it holds plain declarations only: no #if, no macros
 * with arguments, no inline code.
 *
 * Conventions
 *   - Functions return 0 (DS4_OK) on success and a negative DS4_E* code on
 *     failure; where a message buffer is passed, a NUL-terminated English
 *     message naming the problem is written into it.
 *   - Nothing in the engine prints to the terminal or exits the process.
 *   - Types and block layouts follow the GGML/GGUF definitions (spec ds4.md §5).
 */
#ifndef DS4_ENGINE_H
#define DS4_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF BEGIN */

/* Return codes. */
#define DS4_OK 0
#define DS4_E_INVALID -1
#define DS4_E_UNSUPPORTED -2
#define DS4_E_NOMEM -3

/* GGML type ids (ggml.h / GGUF tensor-info type field). */
#define DS4_TYPE_F32 0
#define DS4_TYPE_F16 1
#define DS4_TYPE_Q8_0 8
#define DS4_TYPE_Q2_K 10
#define DS4_TYPE_IQ2_XXS 16
#define DS4_TYPE_I32 26
#define DS4_TYPE_BF16 30

/* Version string of the native library, e.g. "ds4tui-native 0.1.0 (cpu)". */
const char *ds4_version(void);

/* Bytes occupied by n elements of GGML type `type`, or 0 when the type is
 * unsupported or n is not a multiple of the type's block size. */
size_t ds4_type_row_bytes(int type, int64_t n);

/* Dequantise n elements of GGML type `type` from `src` into float `dst`.
 * n must be a multiple of the type's block size (32 for Q8_0, 256 for
 * Q2_K and IQ2_XXS, 1 for F32/F16/BF16).  Returns DS4_OK or a DS4_E* code
 * with a message in err[0..err_len). */
int ds4_dequantize(int type, const void *src, float *dst, int64_t n,
                   char *err, size_t err_len);

/* CDEF END */

#ifdef __cplusplus
}
#endif

#endif /* DS4_ENGINE_H */
