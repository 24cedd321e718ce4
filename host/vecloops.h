/*
 * vecloops.h: the floating-point settings of the C files whose plain loops
 * the compiler vectorises for each SIMD path (attention.c, ewise.c), so
 * that every path gives the bits of the scalar one. Include it before the
 * first function: the pragmas hold from there to the end of the file.
 */
#ifndef LSP_VECLOOPS_H
#define LSP_VECLOOPS_H

/* No contraction of a*b+c into an FMA (GCC does not contract under
 * -std=c11, which the package's cgo flags set). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* FP exceptions are never read here, so GCC may compute both sides of a
 * select (if-convert), which it needs to vectorise these loops; results do
 * not change. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#endif
