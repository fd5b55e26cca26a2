// devtensor strided copy kernels: one source for NVRTC (CUDA) and hiprtc/hipcc (ROCm).
//
// The host planner (src/copy/plan.rs) has already dropped size-1 dims, flipped
// negative destination strides, sorted dims by destination stride (innermost
// first) and coalesced them, so kernels get a small, dense problem. All kernels
// are dtype-agnostic: they move E-byte elements (E in 1, 2, 4, 8, 16) and the
// host widens E when alignment allows. Arguments are passed by value (no
// per-launch upload, CUDA-graph friendly). No system headers, no assumption of
// 32 lanes (wave64 on CDNA). Each kernel is a `__device__` template over the
// element type, exported by a one-line `extern "C"` instance so the names the
// host looks up (src/backend/kernels.rs) stay unmangled.

// Offline HIP compilers (hipcc, clang -x hip) need the runtime header; hiprtc
// pre-includes it and NVRTC never defines __HIP__.
#if defined(__HIP__) && !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

#if defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__) || defined(__HIP_PLATFORM_AMD__)
#define DT_HIP 1
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

struct alignas(16) v16 {
  u32 x, y, z, w;
};

enum { DT_MAX_DIMS = 16 };

// Granlund-Montgomery division by an invariant: q = (umulhi(n, mul) + n) >> shift,
// exact for n < 2^31 (the host checks the 32-bit index bound).
struct DivMagic {
  u32 mul, shift, div;
};

__device__ __forceinline__ u32 dt_div(u32 n, DivMagic m) {
  return (__umulhi(n, m.mul) + n) >> m.shift;
}

// 32-bit problem: numel < 2^31 and every element offset (not byte offset: the
// kernels index typed pointers) fits in int32.
struct StridedArgs {
  u32 numel;
  int ndim;
  DivMagic size[DT_MAX_DIMS];       // innermost first
  int src_stride[DT_MAX_DIMS];      // in elements, signed
  int dst_stride[DT_MAX_DIMS];
};

// 64-bit fallback for problems the host cannot split into 32-bit pieces.
struct StridedArgs64 {
  u64 numel;
  int ndim;
  u64 size[DT_MAX_DIMS];
  i64 src_stride[DT_MAX_DIMS];
  i64 dst_stride[DT_MAX_DIMS];
};

// The next digit of a linear index in the problem's mixed radix, innermost
// first: returns rem % size and leaves rem / size in `rem`. The 32-bit form
// multiplies by the host's magic instead of dividing.
__device__ __forceinline__ u32 dt_digit(u32& rem, const DivMagic& size) {
  u32 q = dt_div(rem, size);
  u32 c = rem - q * size.div;
  rem = q;
  return c;
}

__device__ __forceinline__ u64 dt_digit(u64& rem, u64 size) {
  u64 q = rem / size;
  u64 c = rem - q * size;
  rem = q;
  return c;
}

// Source and destination element offsets of linear index `i`, in the index
// width of `Args` (u32 / int for StridedArgs, u64 / i64 for StridedArgs64).
template <typename Args, typename Index, typename Offset>
__device__ __forceinline__ void dt_offsets(const Args& a, Index i, Offset& so, Offset& dof) {
  so = 0;
  dof = 0;
  Index rem = i;
  for (int dim = 0; dim < a.ndim; ++dim) {
    Offset c = (Offset)dt_digit(rem, a.size[dim]);
    so += c * a.src_stride[dim];
    dof += c * a.dst_stride[dim];
  }
}

// A thread's ILP items, blockDim apart: `load(i, v)` reads item i into v and
// returns where it goes (in elements of T), all loads first so that several
// are in flight, then the stores.
template <int ILP, typename T, typename V, typename Load>
__device__ __forceinline__ void dt_ilp(u32 numel, T* d, Load load) {
  u32 base = (blockIdx.x * blockDim.x) * ILP + threadIdx.x;
  V v[ILP];
  int doff[ILP];
#pragma unroll
  for (int k = 0; k < ILP; ++k) {
    u32 i = base + k * blockDim.x;
    doff[k] = i < numel ? load(i, v[k]) : -1;
  }
#pragma unroll
  for (int k = 0; k < ILP; ++k) {
    if (base + k * blockDim.x < numel) *(V*)(d + doff[k]) = v[k];
  }
}

// Elements each thread handles in the 32-bit strided copy.
enum { DT_ILP = 4 };

template <typename T>
__device__ __forceinline__ void dt_copy_strided(const u8* __restrict__ src, u8* __restrict__ dst,
                                                const StridedArgs& a) {
  const T* s = (const T*)src;
  dt_ilp<DT_ILP, T, T>(a.numel, (T*)dst, [&](u32 i, T& v) {
    int so, dof;
    dt_offsets(a, i, so, dof);
    v = s[so];
    return dof;
  });
}

// Grid-stride loop: the host caps the grid, so one thread may take many elements.
template <typename T>
__device__ __forceinline__ void dt_copy_strided64(const u8* __restrict__ src, u8* __restrict__ dst,
                                                  const StridedArgs64& a) {
  const T* s = (const T*)src;
  T* d = (T*)dst;
  u64 step = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.numel; i += step) {
    i64 so, dof;
    dt_offsets(a, i, so, dof);
    d[dof] = s[so];
  }
}

// Copies whose destination has a unit-stride run (its innermost dim, and the
// next one where it continues the first contiguously: the pixels of an NHWC
// image, channels within pixels) of a multiple of N = 16 / E elements, in
// 16-byte aligned rows (the host checks): each thread moves N neighbours
// along the run, all loads first, then one 16-byte store. A warp writes
// 512 contiguous bytes a store, and the index math (a division a dim) is
// paid once per 16 bytes instead of once per element: 16 times fewer for
// bytes. Along the run the source offset steps by the inner dim's stride,
// and by `src_carry` more where the inner index wraps.
enum { DT_VEC_BYTES = 16, DT_VEC_ILP = 2 };

struct VecArgs {
  DivMagic inner;    // the run's inner dim (its whole length if the run is one dim)
  int src_inner;     // its source stride (elements)
  int src_outer;     // the source stride of the dim the run continues into (0: none)
  int src_carry;     // added where the inner index wraps: src_outer - inner * src_inner
  StridedArgs rows;  // vectors: the run / N (source stride 0, destination N), then the outer dims
};

template <typename T>
__device__ __forceinline__ void dt_copy_vec(const u8* __restrict__ src, u8* __restrict__ dst, const VecArgs& a) {
  enum { N = DT_VEC_BYTES / sizeof(T) };
  struct alignas(DT_VEC_BYTES) Vec {
    T e[N];
  };
  const T* s = (const T*)src;
  dt_ilp<DT_VEC_ILP, T, Vec>(a.rows.numel, (T*)dst, [&](u32 i, Vec& v) {
    int so, dof;
    dt_offsets(a.rows, i, so, dof);
    // The vector's place in its run, and its first element's inner index.
    u32 first = (i - dt_div(i, a.rows.size[0]) * a.rows.size[0].div) * N;
    u32 outer = dt_div(first, a.inner);
    u32 c = first - outer * a.inner.div;
    int at = so + (int)c * a.src_inner + (int)outer * a.src_outer;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      v.e[j] = s[at];
      at += a.src_inner;
      if (++c == a.inner.div) {
        c = 0;
        at += a.src_carry;
      }
    }
    return dof;
  });
}

// The source strides are unused (the host passes zeros).
template <typename T>
__device__ __forceinline__ void dt_fill(u8* __restrict__ dst, T value, const StridedArgs& a) {
  T* d = (T*)dst;
  u32 step = gridDim.x * blockDim.x;
  for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < a.numel; i += step) {
    int so, dof;
    dt_offsets(a, i, so, dof);
    d[dof] = value;
  }
}

extern "C" __global__ void copy_strided_e1(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs a) { dt_copy_strided<u8>(src, dst, a); }
extern "C" __global__ void copy_strided_e2(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs a) { dt_copy_strided<u16>(src, dst, a); }
extern "C" __global__ void copy_strided_e4(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs a) { dt_copy_strided<u32>(src, dst, a); }
extern "C" __global__ void copy_strided_e8(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs a) { dt_copy_strided<u64>(src, dst, a); }
extern "C" __global__ void copy_strided_e16(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs a) { dt_copy_strided<v16>(src, dst, a); }

extern "C" __global__ void copy_strided64_e1(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs64 a) { dt_copy_strided64<u8>(src, dst, a); }
extern "C" __global__ void copy_strided64_e2(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs64 a) { dt_copy_strided64<u16>(src, dst, a); }
extern "C" __global__ void copy_strided64_e4(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs64 a) { dt_copy_strided64<u32>(src, dst, a); }
extern "C" __global__ void copy_strided64_e8(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs64 a) { dt_copy_strided64<u64>(src, dst, a); }
extern "C" __global__ void copy_strided64_e16(const u8* __restrict__ src, u8* __restrict__ dst, StridedArgs64 a) { dt_copy_strided64<v16>(src, dst, a); }

extern "C" __global__ void copy_vec_e1(const u8* __restrict__ src, u8* __restrict__ dst, VecArgs a) { dt_copy_vec<u8>(src, dst, a); }
extern "C" __global__ void copy_vec_e2(const u8* __restrict__ src, u8* __restrict__ dst, VecArgs a) { dt_copy_vec<u16>(src, dst, a); }
extern "C" __global__ void copy_vec_e4(const u8* __restrict__ src, u8* __restrict__ dst, VecArgs a) { dt_copy_vec<u32>(src, dst, a); }
extern "C" __global__ void copy_vec_e8(const u8* __restrict__ src, u8* __restrict__ dst, VecArgs a) { dt_copy_vec<u64>(src, dst, a); }

extern "C" __global__ void fill_e1(u8* __restrict__ dst, u8 value, StridedArgs a) { dt_fill<u8>(dst, value, a); }
extern "C" __global__ void fill_e2(u8* __restrict__ dst, u16 value, StridedArgs a) { dt_fill<u16>(dst, value, a); }
extern "C" __global__ void fill_e4(u8* __restrict__ dst, u32 value, StridedArgs a) { dt_fill<u32>(dst, value, a); }
extern "C" __global__ void fill_e8(u8* __restrict__ dst, u64 value, StridedArgs a) { dt_fill<u64>(dst, value, a); }
extern "C" __global__ void fill_e16(u8* __restrict__ dst, v16 value, StridedArgs a) { dt_fill<v16>(dst, value, a); }

// Shared-memory tiled transpose over two dims: the source's fastest dim and
// the destination's fastest dim (unit strides in a dense transpose; small ones
// in a transpose of strided views, `x[:, ::2].T`, where the host picks the
// pair). Every other dim is a batch dim described by `batch`. A block moves
// one TILE x TILE tile, reading along the source's fast dim and writing along
// the destination's fast dim, so both sides are coalesced; the +1 column of
// padding keeps shared-memory accesses free of bank conflicts for 4- and
// 8-byte types.
enum { DT_TILE = 32 };
enum { DT_TILE_ROWS = 8 };

struct TransposeArgs {
  u32 n_src_fast;      // extent of the source's fastest dim (dst stride = dst_stride_sf)
  u32 n_dst_fast;      // extent of the destination's fastest dim (src stride = src_stride_df)
  int src_stride_df;   // source stride of the destination-fast dim
  int dst_stride_sf;   // destination stride of the source-fast dim
  int src_stride_sf;   // source stride of the source-fast dim (1 in a dense transpose)
  int dst_stride_df;   // destination stride of the destination-fast dim (likewise)
  u32 tiles_sf, tiles_df;
  StridedArgs batch;   // remaining dims (numel = number of batches)
};

// The tile a block moves, from its index: the first source-fast and
// destination-fast indices (multiples of the tile's `edge`, in elements), its
// batch's element offsets, and how many of its `edge` indices lie inside
// each fast dim (fewer at the far edges). Source-fast tiles vary fastest.
struct DtTile {
  u32 sf0, df0;  // first source-fast and destination-fast index
  int so, dof;   // the batch's source and destination offsets
  u32 n_sf, n_df;
};

__device__ __forceinline__ DtTile dt_tile(const TransposeArgs& a, u32 edge) {
  DtTile t;
  u32 b = blockIdx.x;
  u32 t_sf = b % a.tiles_sf;
  b /= a.tiles_sf;
  u32 t_df = b % a.tiles_df;
  b /= a.tiles_df;
  dt_offsets(a.batch, b, t.so, t.dof);
  t.sf0 = t_sf * edge;
  t.df0 = t_df * edge;
  const u32 sf_left = a.n_src_fast - t.sf0, df_left = a.n_dst_fast - t.df0;
  t.n_sf = sf_left < edge ? sf_left : edge;
  t.n_df = df_left < edge ? df_left : edge;
  return t;
}

template <typename T>
__device__ __forceinline__ void dt_transpose_tiled(const u8* __restrict__ src, u8* __restrict__ dst,
                                                   const TransposeArgs& a) {
  __shared__ T tile[DT_TILE][DT_TILE + 1];
  const T* s = (const T*)src;
  T* d = (T*)dst;
  const DtTile t = dt_tile(a, DT_TILE);
  const u32 sf0 = t.sf0, df0 = t.df0;
  const int so = t.so, dof = t.dof;
  // read: threadIdx.x walks the source-fast dim
  for (u32 r = threadIdx.y; r < DT_TILE; r += DT_TILE_ROWS) {
    u32 sf = sf0 + threadIdx.x, df = df0 + r;
    if (sf < a.n_src_fast && df < a.n_dst_fast)
      tile[r][threadIdx.x] = s[so + (int)sf * a.src_stride_sf + (int)df * a.src_stride_df];
  }
  __syncthreads();
  // write: threadIdx.x walks the destination-fast dim
  for (u32 r = threadIdx.y; r < DT_TILE; r += DT_TILE_ROWS) {
    u32 df = df0 + threadIdx.x, sf = sf0 + r;
    if (sf < a.n_src_fast && df < a.n_dst_fast)
      d[dof + (int)df * a.dst_stride_df + (int)sf * a.dst_stride_sf] = tile[threadIdx.x][r];
  }
}

extern "C" __global__ void transpose_tiled_e1(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_tiled<u8>(src, dst, a); }
extern "C" __global__ void transpose_tiled_e2(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_tiled<u16>(src, dst, a); }
extern "C" __global__ void transpose_tiled_e4(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_tiled<u32>(src, dst, a); }
extern "C" __global__ void transpose_tiled_e8(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_tiled<u64>(src, dst, a); }

// Tiled transposes whose fast dims are short against the tile (a 5-D
// permute's last dim of 16 moved to the front; a 32 x 32 block of f16 in a
// packed tile of 64 x 64): a plain tile would leave half its lanes idle or
// more. Here a short side's slots hold runs of W (its extent rounded up to a
// power of two), run j being index j of a fold dim the host took out of the
// batch (whose extent there it divided by the runs a tile holds, its strides
// multiplied by them). Slot i of a side is index i & (W - 1) of its fast dim
// and i >> log2(W) of its fold dim; an unfolded side has W = the tile's edge
// (every slot in run 0). Separate kernels, so that the plain transposes do
// not pay the slot arithmetic.
struct FoldedArgs {
  TransposeArgs t;
  u32 log2_w_sf, log2_w_df;   // log2(W) of the source-fast and destination-fast sides
  int src_stride_fsf;         // the source-fast side's fold dim (strides of one step)
  int dst_stride_fsf;
  int src_stride_fdf;         // the destination-fast side's fold dim
  int dst_stride_fdf;
};

template <typename T>
__device__ __forceinline__ void dt_transpose_folded(const u8* __restrict__ src, u8* __restrict__ dst,
                                                    const FoldedArgs& f) {
  __shared__ T tile[DT_TILE][DT_TILE + 1];
  const TransposeArgs& a = f.t;
  const T* s = (const T*)src;
  T* d = (T*)dst;
  const DtTile t = dt_tile(a, DT_TILE);
  const u32 l_sf = f.log2_w_sf, m_sf = (1u << l_sf) - 1;
  const u32 l_df = f.log2_w_df, m_df = (1u << l_df) - 1;
  const u32 x = threadIdx.x;
  // read: threadIdx.x walks the source-fast slots, r the destination-fast ones
  {
    const u32 sf = t.sf0 + (x & m_sf);
    const int so = t.so + (int)sf * a.src_stride_sf + (int)(x >> l_sf) * f.src_stride_fsf;
    for (u32 r = threadIdx.y; r < DT_TILE; r += DT_TILE_ROWS) {
      const u32 df = t.df0 + (r & m_df);
      if (sf < a.n_src_fast && df < a.n_dst_fast)
        tile[r][x] = s[so + (int)df * a.src_stride_df + (int)(r >> l_df) * f.src_stride_fdf];
    }
  }
  __syncthreads();
  // write: threadIdx.x walks the destination-fast slots, r the source-fast ones
  {
    const u32 df = t.df0 + (x & m_df);
    const int dof = t.dof + (int)df * a.dst_stride_df + (int)(x >> l_df) * f.dst_stride_fdf;
    for (u32 r = threadIdx.y; r < DT_TILE; r += DT_TILE_ROWS) {
      const u32 sf = t.sf0 + (r & m_sf);
      if (sf < a.n_src_fast && df < a.n_dst_fast)
        d[dof + (int)sf * a.dst_stride_sf + (int)(r >> l_sf) * f.dst_stride_fsf] = tile[x][r];
    }
  }
}

extern "C" __global__ void transpose_tiled_folded_e1(const u8* __restrict__ src, u8* __restrict__ dst, FoldedArgs a) { dt_transpose_folded<u8>(src, dst, a); }
extern "C" __global__ void transpose_tiled_folded_e2(const u8* __restrict__ src, u8* __restrict__ dst, FoldedArgs a) { dt_transpose_folded<u16>(src, dst, a); }
extern "C" __global__ void transpose_tiled_folded_e4(const u8* __restrict__ src, u8* __restrict__ dst, FoldedArgs a) { dt_transpose_folded<u32>(src, dst, a); }
extern "C" __global__ void transpose_tiled_folded_e8(const u8* __restrict__ src, u8* __restrict__ dst, FoldedArgs a) { dt_transpose_folded<u64>(src, dst, a); }

// The P x P block of elements in P u32s (word k: P elements of row k),
// transposed in registers by byte permutes: out[k] holds element k of each row.
template <int P>
__device__ __forceinline__ void dt_transpose_words(const u32 (&v)[P], u32 (&out)[P]) {
  if (P == 4) {
    u32 t0 = __byte_perm(v[0], v[1], 0x5140), t1 = __byte_perm(v[0], v[1], 0x7362);
    u32 t2 = __byte_perm(v[2 % P], v[3 % P], 0x5140), t3 = __byte_perm(v[2 % P], v[3 % P], 0x7362);
    out[0] = __byte_perm(t0, t2, 0x5410);
    out[1 % P] = __byte_perm(t0, t2, 0x7632);
    out[2 % P] = __byte_perm(t1, t3, 0x5410);
    out[3 % P] = __byte_perm(t1, t3, 0x7632);
  } else {
    out[0] = __byte_perm(v[0], v[1], 0x5410);
    out[1] = __byte_perm(v[0], v[1], 0x7632);
  }
}

// The tiled transpose of 1- and 2-byte elements moving 4 bytes a thread and
// instruction: P = 4 / sizeof(T) elements packed in a u32. A block moves a
// tile of 32·P x 32·P elements (128 x 128 bytes of u8): it reads whole u32s
// along the source's rows into shared memory, then each thread takes P
// neighbouring rows' u32s of one column, transposes that P x P block of
// elements in registers (byte permutes) and writes P u32s, each P elements
// along the destination's rows. Versus an element a thread (transpose_tiled_e1):
// a quarter of the global requests and shared wavefronts, no byte-wise shared
// bank conflicts. Shared words are XOR-swizzled by row / P, so both the row
// writes and the P-row column reads hit 32 distinct banks. The host checks
// that both fast dims are unit-stride, every other stride and both extents are
// multiples of P, and both bases 4-byte aligned.
template <typename T>
__device__ __forceinline__ void dt_transpose_packed(const u8* __restrict__ src, u8* __restrict__ dst,
                                                    const TransposeArgs& a) {
  enum { P = 4 / sizeof(T), TD = 32 * P };
  __shared__ u32 tile[TD * 32];
  const DtTile t = dt_tile(a, TD);
  const u32 sf0 = t.sf0, df0 = t.df0;
  const T* s = (const T*)src + t.so;
  T* d = (T*)dst + t.dof;
  // Read: row r (along df) of the tile, u32 x of it (elements sf0 + P·x ..).
  const u32 x = threadIdx.x;
  for (u32 r = threadIdx.y; r < TD; r += DT_TILE_ROWS) {
    u32 sf = sf0 + P * x, df = df0 + r;
    if (sf < a.n_src_fast && df < a.n_dst_fast)
      tile[r * 32 + (x ^ ((r / P) & 31))] = *(const u32*)(s + (int)sf + (int)df * a.src_stride_df);
  }
  __syncthreads();
  // Write: rows P·x .. P·x + P - 1, column w: P u32s, transposed. Only
  // what was read: rows and columns past the far edges were not.
  const u32 df = df0 + P * x;
  if (df >= a.n_dst_fast) return;
  for (u32 w = threadIdx.y; w < 32 && sf0 + P * w < a.n_src_fast; w += DT_TILE_ROWS) {
    u32 v[P];
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = tile[(P * x + k) * 32 + (w ^ x)];
    u32 out[P];
    dt_transpose_words<P>(v, out);
#pragma unroll
    for (int k = 0; k < P; ++k) *(u32*)(d + (int)df + (int)(sf0 + P * w + k) * a.dst_stride_sf) = out[k];
  }
}

extern "C" __global__ void transpose_packed_e1(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_packed<u8>(src, dst, a); }
extern "C" __global__ void transpose_packed_e2(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_packed<u16>(src, dst, a); }

// dt_transpose_packed with folded sides (FoldedArgs): slots count elements,
// W is at least P (the host folds extents that are multiples of P), so a
// u32 never straddles two runs.
template <typename T>
__device__ __forceinline__ void dt_transpose_packed_folded(const u8* __restrict__ src, u8* __restrict__ dst,
                                                           const FoldedArgs& f) {
  enum { P = 4 / sizeof(T), TD = 32 * P };
  __shared__ u32 tile[TD * 32];
  const TransposeArgs& a = f.t;
  const DtTile t = dt_tile(a, TD);
  const u32 l_sf = f.log2_w_sf, m_sf = (1u << l_sf) - 1;
  const u32 l_df = f.log2_w_df, m_df = (1u << l_df) - 1;
  const T* s = (const T*)src + t.so;
  T* d = (T*)dst + t.dof;
  const u32 x = threadIdx.x;
  // Read: row r (a destination-fast slot) of the tile, u32 x of it.
  {
    const u32 sf = t.sf0 + ((P * x) & m_sf);
    const T* sx = s + (int)sf + (int)((P * x) >> l_sf) * f.src_stride_fsf;
    for (u32 r = threadIdx.y; r < TD; r += DT_TILE_ROWS) {
      const u32 df = t.df0 + (r & m_df);
      if (sf < a.n_src_fast && df < a.n_dst_fast)
        tile[r * 32 + (x ^ ((r / P) & 31))] =
            *(const u32*)(sx + (int)df * a.src_stride_df + (int)(r >> l_df) * f.src_stride_fdf);
    }
  }
  __syncthreads();
  // Write: slots P·x .. P·x + P - 1 of the destination-fast side, column w.
  const u32 df = t.df0 + ((P * x) & m_df);
  if (df >= a.n_dst_fast) return;
  T* dx = d + (int)df + (int)((P * x) >> l_df) * f.dst_stride_fdf;
  for (u32 w = threadIdx.y; w < 32; w += DT_TILE_ROWS) {
    const u32 sf = t.sf0 + ((P * w) & m_sf);
    if (sf >= a.n_src_fast) continue;
    u32 v[P];
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = tile[(P * x + k) * 32 + (w ^ x)];
    u32 out[P];
    dt_transpose_words<P>(v, out);
    T* dw = dx + (int)((P * w) >> l_sf) * f.dst_stride_fsf;
#pragma unroll
    for (int k = 0; k < P; ++k) *(u32*)(dw + (int)(sf + k) * a.dst_stride_sf) = out[k];
  }
}

extern "C" __global__ void transpose_packed_folded_e1(const u8* __restrict__ src, u8* __restrict__ dst, FoldedArgs a) { dt_transpose_packed_folded<u8>(src, dst, a); }
extern "C" __global__ void transpose_packed_folded_e2(const u8* __restrict__ src, u8* __restrict__ dst, FoldedArgs a) { dt_transpose_packed_folded<u16>(src, dst, a); }

// Transposes of pixels: elements that are runs of three T (RGB of u8, f16 or
// f32) contiguous on both sides, whose pixels are adjacent along both fast
// dims (the host checks: source stride 3 along the source-fast dim,
// destination stride 3 along the destination-fast dim; the Args' strides are
// in T). A block moves 32 x 32 pixels, and a tile row is 96 contiguous T on
// either side, so a warp reads and writes 32 contiguous T an instruction,
// whole sectors, where an element kernel's lanes each take one T from a
// different row (a sector for three bytes). Shared rows are ROW T long:
// the write phase's lanes read pixel j / 3, channel j % 3, of one column,
// from 11 rows, so a row is 2 words past a multiple of the 32 banks where a
// pixel spans at most two words (bytes, halves: 34 and 66 words) and 3 where
// it spans three (99 words): no bank serves two words of a request.
template <typename T>
__device__ __forceinline__ void dt_transpose_rgb(const u8* __restrict__ src, u8* __restrict__ dst,
                                                 const TransposeArgs& a) {
  enum { ROW = sizeof(T) == 1 ? 136 : sizeof(T) == 2 ? 132 : 99 };
  __shared__ T tile[DT_TILE * ROW];
  const DtTile t = dt_tile(a, DT_TILE);
  const u32 sf0 = t.sf0, df0 = t.df0;
  const u32 n_sf = t.n_sf, n_df = t.n_df;  // pixels a tile row, source and destination side
  const T* s = (const T*)src + t.so + (int)sf0 * 3;
  T* d = (T*)dst + t.dof + (int)df0 * 3;
  for (u32 r = threadIdx.y; r < n_df; r += DT_TILE_ROWS) {
    const T* row = s + (int)(df0 + r) * a.src_stride_df;
    for (u32 j = threadIdx.x; j < 3 * n_sf; j += DT_TILE) tile[r * ROW + j] = row[j];
  }
  __syncthreads();
  for (u32 w = threadIdx.y; w < n_sf; w += DT_TILE_ROWS) {
    T* row = d + (int)(sf0 + w) * a.dst_stride_sf;
    for (u32 j = threadIdx.x; j < 3 * n_df; j += DT_TILE) {
      u32 p = j / 3;
      row[j] = tile[p * ROW + 3 * w + (j - 3 * p)];
    }
  }
}

extern "C" __global__ void transpose_rgb_e1(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_rgb<u8>(src, dst, a); }
extern "C" __global__ void transpose_rgb_e2(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_rgb<u16>(src, dst, a); }
extern "C" __global__ void transpose_rgb_e4(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_rgb<u32>(src, dst, a); }

// RGB bytes a u32 a thread: dt_transpose_rgb's tiles where every u32 is whole
// and aligned (the host checks: both bases, the rows' and batches' strides
// and both fast extents multiples of 4), 24 words a tile row. A lane loads
// one word of a source row; on the way out it gathers the four bytes of its
// destination word (pixel j / 3, channel j % 3, for j = 4x .. 4x + 3: the
// same shared offsets for every row, column w adding 3w) and stores them at
// once. Shared rows of 100 bytes (25 words) keep both phases free of bank
// conflicts. A quarter of the memory instructions of a byte a lane.
__device__ __forceinline__ void dt_transpose_rgb_packed(const u8* __restrict__ src, u8* __restrict__ dst,
                                                        const TransposeArgs& a) {
  enum { ROW_BYTES = 100 };
  __shared__ u32 tile[DT_TILE * ROW_BYTES / 4];
  const DtTile t = dt_tile(a, DT_TILE);
  const u32 sf0 = t.sf0, df0 = t.df0, n_sf = t.n_sf, n_df = t.n_df;
  const u8* s = src + t.so + (int)sf0 * 3;
  u8* d = dst + t.dof + (int)df0 * 3;
  const u32 x = threadIdx.x;
  if (x < 3 * n_sf / 4) {
    for (u32 r = threadIdx.y; r < n_df; r += DT_TILE_ROWS)
      tile[r * (ROW_BYTES / 4) + x] = *(const u32*)(s + (int)(df0 + r) * a.src_stride_df + 4 * x);
  }
  __syncthreads();
  if (x >= 3 * n_df / 4) return;
  const u8* tb = (const u8*)tile;
  u32 at[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 j = 4 * x + i, p = j / 3;
    at[i] = p * ROW_BYTES + (j - 3 * p);
  }
  for (u32 w = threadIdx.y; w < n_sf; w += DT_TILE_ROWS) {
    const u8* c = tb + 3 * w;
    u32 v = (u32)c[at[0]] | (u32)c[at[1]] << 8 | (u32)c[at[2]] << 16 | (u32)c[at[3]] << 24;
    *(u32*)(d + (int)(sf0 + w) * a.dst_stride_sf + 4 * x) = v;
  }
}

extern "C" __global__ void transpose_rgb_packed_e1(const u8* __restrict__ src, u8* __restrict__ dst, TransposeArgs a) { dt_transpose_rgb_packed(src, dst, a); }
