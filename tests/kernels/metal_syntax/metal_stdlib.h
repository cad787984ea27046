// Metal's API as far as mlxspec's programs use it, declared (never defined) for clang's -fsyntax-only, with the
// rules of Apple's compiler that g++ under the emulator cannot see (tests/kernels/test_metal_syntax.py):
// - address spaces: device, constant and threadgroup pointers do not convert to one another or to a function's
//   own (thread) pointers. MLX passes inputs of fewer than 8 elements in `constant` space;
// - one overload of each math function per type (mixed calls such as max(float, int) are ambiguous, as there);
// - no implicit conversion between vector types, none from float to bfloat (checked with
//   -Wimplicit-float-conversion, which flags float -> half too: stricter than Metal, never looser);
// - SIMD-group functions take integer and floating scalars and vectors only (not bool).
// `threadgroup` is resolved by the test (a declaration becomes static storage in address space 3).
#pragma once
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define thread
#define threadgroup __mlxspec_threadgroup

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef unsigned long size_t;
typedef _Float16 half;
typedef __bf16 bfloat;

namespace metal {
template <typename T, int N> using vec = T __attribute__((ext_vector_type(N)));
template <bool B, typename T = void> struct enable_if {};
template <typename T> struct enable_if<true, T> { typedef T type; };
template <bool B, typename T = void> using enable_if_t = typename enable_if<B, T>::type;
template <typename A, typename B> struct is_same { static constexpr bool value = false; };
template <typename A> struct is_same<A, A> { static constexpr bool value = true; };
template <typename T> struct is_simd_scalar {
  static constexpr bool value = is_same<T, float>::value || is_same<T, half>::value || is_same<T, int>::value ||
      is_same<T, uint>::value || is_same<T, short>::value || is_same<T, ushort>::value ||
      is_same<T, char>::value || is_same<T, uchar>::value || is_same<T, signed char>::value;
};
template <typename T> struct is_simd_type : is_simd_scalar<T> {};
template <typename T, int N> struct is_simd_type<vec<T, N>> : is_simd_scalar<T> {};
#define MLXSPEC_SIMD(name, ...) template <typename T, typename = enable_if_t<is_simd_type<T>::value>> T name(T data __VA_ARGS__);
MLXSPEC_SIMD(simd_shuffle, , ushort lane)
MLXSPEC_SIMD(simd_shuffle_xor, , ushort mask)
MLXSPEC_SIMD(simd_shuffle_down, , ushort delta)
MLXSPEC_SIMD(simd_shuffle_up, , ushort delta)
MLXSPEC_SIMD(simd_broadcast, , ushort lane)
MLXSPEC_SIMD(simd_sum)
MLXSPEC_SIMD(simd_max)
MLXSPEC_SIMD(simd_min)
MLXSPEC_SIMD(simd_prefix_exclusive_sum)
MLXSPEC_SIMD(simd_prefix_inclusive_sum)
#undef MLXSPEC_SIMD

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
mem_flags operator|(mem_flags a, mem_flags b);
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

// metal_math and metal_integer: one overload per type
#define MLXSPEC_MATH(T)                                                                                      \
  T fma(T a, T b, T c); T max(T a, T b); T min(T a, T b); T fmax(T a, T b); T fmin(T a, T b); T exp(T x);   \
  T exp2(T x); T log(T x); T tanh(T x); T ldexp(T x, int k); T abs(T x); T fabs(T x); T sqrt(T x);          \
  T rsqrt(T x); T floor(T x); T ceil(T x); T round(T x); T rint(T x); bool isnan(T x); bool isinf(T x);     \
  T clamp(T x, T lo, T hi); T pow(T x, T y); T copysign(T x, T y); T select(T a, T b, bool c);
MLXSPEC_MATH(float)
MLXSPEC_MATH(half)
namespace precise { MLXSPEC_MATH(float) MLXSPEC_MATH(half) }
namespace fast { MLXSPEC_MATH(float) MLXSPEC_MATH(half) }
#undef MLXSPEC_MATH
#define MLXSPEC_INT(T) T max(T a, T b); T min(T a, T b); T clamp(T x, T lo, T hi); T abs(T x); T popcount(T x);
MLXSPEC_INT(int) MLXSPEC_INT(uint) MLXSPEC_INT(short) MLXSPEC_INT(ushort) MLXSPEC_INT(char) MLXSPEC_INT(uchar)
MLXSPEC_INT(long) MLXSPEC_INT(ulong)
#undef MLXSPEC_INT

template <typename To, typename From, typename = enable_if_t<sizeof(To) == sizeof(From)>> To as_type(From x);

// metal_simdgroup_matrix: 8 x 8 matrices of float, half or bfloat
template <typename T, int Cols, int Rows> struct simdgroup_matrix {
  static_assert(is_same<T, float>::value || is_same<T, half>::value || is_same<T, bfloat>::value, "element type");
  static_assert(Cols == 8 && Rows == 8, "8 x 8");
  simdgroup_matrix();
  thread vec<T, 2>& thread_elements();
};
template <typename T, int C, int R>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<T, C, R>& d, const thread simdgroup_matrix<T, C, R>& a,
                                   const thread simdgroup_matrix<T, C, R>& b, const thread simdgroup_matrix<T, C, R>& c);
}  // namespace metal

typedef metal::vec<float, 2> float2; typedef metal::vec<float, 4> float4;
typedef metal::vec<half, 2> half2; typedef metal::vec<half, 4> half4;
typedef metal::vec<uint, 2> uint2; typedef metal::vec<uint, 3> uint3; typedef metal::vec<uint, 4> uint4;
typedef metal::vec<int, 2> int2; typedef metal::vec<int, 4> int4;
typedef metal::vec<ushort, 2> ushort2; typedef metal::vec<uchar, 4> uchar4;
using namespace metal;

// MLX's utils (mlx/backend/metal/kernels/utils.h, bf16.h), which mx.fast.metal_kernel puts before every program
typedef half float16_t;
typedef bfloat bfloat16_t;
