/*
 * wmma.h: nvcuda::wmma for the CPU simulator (included by sim.h).
 *
 * Supported: bf16 16x16x16 matrix_a / matrix_b fragments (row_major or
 * col_major) and float 16x16x16 accumulators: fill_fragment,
 * load_matrix_sync, mma_sync, store_matrix_sync, num_elements and x[] as in
 * CUDA (8 elements per lane). Other shapes and types do not compile.
 *
 * The element layout is opaque, as CUDA documents it: lane l's x[i] holds
 * the matrix element at a position given by a per-seed random permutation
 * (one per fragment kind), so only elementwise use of all elements (fill,
 * scale, add fragments of the same kind) is meaningful. load/store/mma are
 * warp-collective: all 32 lanes must call them with the same pointer, ldm
 * and layout; pointers must be 32-byte aligned and ldm a multiple of 16
 * bytes (8 bf16 or 4 floats), otherwise the launch fails with
 * cudaErrorMisalignedAddress. mma_sync computes d = c + sum_k a b in float,
 * k ascending (the products of bf16 values are exact in float).
 */
#ifndef LSP_SIM_WMMA_H
#define LSP_SIM_WMMA_H

namespace lsp_sim {

enum FragKind { FRAG_A_ROW = 0, FRAG_A_COL, FRAG_B_ROW, FRAG_B_COL, FRAG_ACC, FRAG_KINDS };

void wmma_load_ab(int kind, __nv_bfloat16* x, const __nv_bfloat16* p, unsigned ldm);
void wmma_load_acc(float* x, const float* p, unsigned ldm, int col_major);
void wmma_store_acc(float* p, const float* x, unsigned ldm, int col_major);
void wmma_mma(float* d, const __nv_bfloat16* a, int akind, const __nv_bfloat16* b, int bkind, const float* c);

} /* namespace lsp_sim */

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename T, int size>
struct __align__(8) fragment_base {
	enum { num_elements = size, num_storage_elements = size };
	typedef T element_type;
	typedef T storage_element_type;
	T x[size];
};

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment; /* only the specialisations below exist */

template <>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> : public fragment_base<__nv_bfloat16, 8> {};
template <>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major> : public fragment_base<__nv_bfloat16, 8> {};
template <>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> : public fragment_base<__nv_bfloat16, 8> {};
template <>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> : public fragment_base<__nv_bfloat16, 8> {};
template <>
class fragment<accumulator, 16, 16, 16, float> : public fragment_base<float, 8> {};

template <typename T>
struct fill_argument {
	typedef T type;
};

/* Per-thread, like CUDA's: every element of this lane's fragment gets v. */
template <typename T, int size>
inline void fill_fragment(fragment_base<T, size>& f, const typename fill_argument<T>::type& v) {
	for (int i = 0; i < size; i++) f.x[i] = v;
}

template <typename Layout>
struct layout_index;
template <>
struct layout_index<row_major> {
	enum { value = 0 };
};
template <>
struct layout_index<col_major> {
	enum { value = 1 };
};

template <typename Layout>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
	::lsp_sim::wmma_load_ab(::lsp_sim::FRAG_A_ROW + layout_index<Layout>::value, f.x, p, ldm);
}
template <typename Layout>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                             unsigned ldm) {
	::lsp_sim::wmma_load_ab(::lsp_sim::FRAG_B_ROW + layout_index<Layout>::value, f.x, p, ldm);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
	::lsp_sim::wmma_load_acc(f.x, p, ldm, layout == mem_col_major);
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
	::lsp_sim::wmma_store_acc(p, f.x, ldm, layout == mem_col_major);
}
template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
	::lsp_sim::wmma_mma(d.x, a.x, ::lsp_sim::FRAG_A_ROW + layout_index<LA>::value, b.x,
	                    ::lsp_sim::FRAG_B_ROW + layout_index<LB>::value, c.x);
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif /* LSP_SIM_WMMA_H */
