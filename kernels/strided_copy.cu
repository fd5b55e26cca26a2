// devtensor strided copy kernels: one source for NVRTC (CUDA) and hiprtc/hipcc (ROCm).
//
// The host planner (src/copy/plan.rs) has already dropped size-1 dims, flipped
// negative destination strides, sorted dims by destination stride (innermost
// first) and coalesced them, so kernels get a small, dense problem. All kernels
// are dtype-agnostic: they move E-byte elements (E in 1, 2, 4, 8, 16) and the
// host widens E when alignment allows. Arguments are passed by value (no
// per-launch upload, CUDA-graph friendly). No system headers, no templates in
// the exported names, no assumption of 32 lanes (wave64 on CDNA).

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

#define DT_MAX_DIMS 16

// Granlund-Montgomery division by an invariant: q = (umulhi(n, mul) + n) >> shift,
// exact for n < 2^31 (the host checks the 32-bit index bound).
struct DivMagic {
  u32 mul, shift, div;
};

__device__ __forceinline__ u32 dt_div(u32 n, DivMagic m) {
  return (__umulhi(n, m.mul) + n) >> m.shift;
}

// 32-bit problem: numel < 2^31, every byte offset fits in int32.
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

// Elements each thread handles in the strided kernels; all loads are issued
// before the stores so several are in flight.
#define DT_ILP 4

#define DT_STRIDED(E, T)                                                                   \
  extern "C" __global__ void copy_strided_e##E(const u8* __restrict__ src,                 \
                                               u8* __restrict__ dst, StridedArgs a) {      \
    const T* s = (const T*)src;                                                            \
    T* d = (T*)dst;                                                                        \
    u32 base = (blockIdx.x * blockDim.x) * DT_ILP + threadIdx.x;                           \
    T v[DT_ILP];                                                                           \
    int doff[DT_ILP];                                                                      \
    _Pragma("unroll") for (int k = 0; k < DT_ILP; ++k) {                                   \
      u32 i = base + k * blockDim.x;                                                       \
      doff[k] = -1;                                                                        \
      if (i < a.numel) {                                                                   \
        int so = 0, dof = 0;                                                               \
        u32 rem = i;                                                                       \
        for (int dim = 0; dim < a.ndim; ++dim) {                                           \
          u32 q = dt_div(rem, a.size[dim]);                                                \
          int c = (int)(rem - q * a.size[dim].div);                                        \
          so += c * a.src_stride[dim];                                                     \
          dof += c * a.dst_stride[dim];                                                    \
          rem = q;                                                                         \
        }                                                                                  \
        v[k] = s[so];                                                                      \
        doff[k] = dof;                                                                     \
      }                                                                                    \
    }                                                                                      \
    _Pragma("unroll") for (int k = 0; k < DT_ILP; ++k) {                                   \
      if (base + k * blockDim.x < a.numel) d[doff[k]] = v[k];                              \
    }                                                                                      \
  }                                                                                        \
  extern "C" __global__ void copy_strided64_e##E(const u8* __restrict__ src,               \
                                                 u8* __restrict__ dst, StridedArgs64 a) {  \
    const T* s = (const T*)src;                                                            \
    T* d = (T*)dst;                                                                        \
    u64 step = (u64)gridDim.x * blockDim.x;                                                \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.numel; i += step) {     \
      i64 so = 0, dof = 0;                                                                 \
      u64 rem = i;                                                                         \
      for (int dim = 0; dim < a.ndim; ++dim) {                                             \
        u64 q = rem / a.size[dim];                                                         \
        i64 c = (i64)(rem - q * a.size[dim]);                                              \
        so += c * a.src_stride[dim];                                                       \
        dof += c * a.dst_stride[dim];                                                      \
        rem = q;                                                                           \
      }                                                                                    \
      d[dof] = s[so];                                                                      \
    }                                                                                      \
  }                                                                                        \
  extern "C" __global__ void fill_e##E(u8* __restrict__ dst, T value, StridedArgs a) {     \
    T* d = (T*)dst;                                                                        \
    u32 step = gridDim.x * blockDim.x;                                                     \
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < a.numel; i += step) {          \
      int dof = 0;                                                                         \
      u32 rem = i;                                                                         \
      for (int dim = 0; dim < a.ndim; ++dim) {                                             \
        u32 q = dt_div(rem, a.size[dim]);                                                  \
        dof += (int)(rem - q * a.size[dim].div) * a.dst_stride[dim];                       \
        rem = q;                                                                           \
      }                                                                                    \
      d[dof] = value;                                                                      \
    }                                                                                      \
  }

DT_STRIDED(1, u8)
DT_STRIDED(2, u16)
DT_STRIDED(4, u32)
DT_STRIDED(8, u64)
DT_STRIDED(16, v16)

// Contiguous copy with 16-byte accesses; the host passes 16-byte aligned
// pointers and handles the head and tail.
extern "C" __global__ void copy_contig_v16(const v16* __restrict__ src, v16* __restrict__ dst, u64 n) {
  u64 step = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = src[i];
}

// Shared-memory tiled transpose over two dims: the source's fastest dim (unit
// source stride) and the destination's fastest dim (unit destination stride).
// Every other dim is a batch dim described by `batch`. A block moves one
// TILE x TILE tile, reading along the source's fast dim and writing along the
// destination's fast dim, so both sides are coalesced; the +1 column of padding
// keeps shared-memory accesses free of bank conflicts for 4- and 8-byte types.
#define DT_TILE 32
#define DT_TILE_ROWS 8

struct TransposeArgs {
  u32 n_src_fast;      // extent of the source's fastest dim (dst stride = dst_stride_sf)
  u32 n_dst_fast;      // extent of the destination's fastest dim (src stride = src_stride_df)
  int src_stride_df;   // source stride of the destination-fast dim
  int dst_stride_sf;   // destination stride of the source-fast dim
  u32 tiles_sf, tiles_df;
  StridedArgs batch;   // remaining dims (numel = number of batches)
};

#define DT_TRANSPOSE(E, T)                                                                 \
  extern "C" __global__ void transpose_tiled_e##E(const u8* __restrict__ src,              \
                                                  u8* __restrict__ dst, TransposeArgs a) { \
    __shared__ T tile[DT_TILE][DT_TILE + 1];                                               \
    const T* s = (const T*)src;                                                            \
    T* d = (T*)dst;                                                                        \
    u32 b = blockIdx.x;                                                                    \
    u32 t_sf = b % a.tiles_sf;                                                             \
    b /= a.tiles_sf;                                                                       \
    u32 t_df = b % a.tiles_df;                                                             \
    b /= a.tiles_df;                                                                       \
    int so = 0, dof = 0;                                                                   \
    u32 rem = b;                                                                           \
    for (int dim = 0; dim < a.batch.ndim; ++dim) {                                         \
      u32 q = dt_div(rem, a.batch.size[dim]);                                              \
      int c = (int)(rem - q * a.batch.size[dim].div);                                      \
      so += c * a.batch.src_stride[dim];                                                   \
      dof += c * a.batch.dst_stride[dim];                                                  \
      rem = q;                                                                             \
    }                                                                                      \
    u32 sf0 = t_sf * DT_TILE, df0 = t_df * DT_TILE;                                        \
    /* read: threadIdx.x walks the source-fast dim */                                      \
    for (u32 r = threadIdx.y; r < DT_TILE; r += DT_TILE_ROWS) {                            \
      u32 sf = sf0 + threadIdx.x, df = df0 + r;                                            \
      if (sf < a.n_src_fast && df < a.n_dst_fast)                                          \
        tile[r][threadIdx.x] = s[so + (int)sf + (int)df * a.src_stride_df];                \
    }                                                                                      \
    __syncthreads();                                                                       \
    /* write: threadIdx.x walks the destination-fast dim */                                \
    for (u32 r = threadIdx.y; r < DT_TILE; r += DT_TILE_ROWS) {                            \
      u32 df = df0 + threadIdx.x, sf = sf0 + r;                                            \
      if (sf < a.n_src_fast && df < a.n_dst_fast)                                          \
        d[dof + (int)df + (int)sf * a.dst_stride_sf] = tile[threadIdx.x][r];               \
    }                                                                                      \
  }

DT_TRANSPOSE(1, u8)
DT_TRANSPOSE(2, u16)
DT_TRANSPOSE(4, u32)
DT_TRANSPOSE(8, u64)
