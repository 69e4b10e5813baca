// boundary.cuh: scipy.ndimage's boundary modes as an index map, and scipy's result conversion.
// Shared by correlate1d.cu and correlate.cu; chunkernels.cuda.source() inlines it into each, so
// NVRTC sees one self-contained source (and CuPy's compile cache keys on all of it).
//
// map_index(j, n, mode) maps a possibly out-of-range index j of an axis of length n to the index
// scipy.ndimage reads instead, or -1 where it reads cval. Extensions longer than the axis repeat
// the pattern, as scipy's line extension does (reflect of reflect):
//   reflect  (d c b a | a b c d | d c b a)  period 2n
//   mirror   (d c b | a b c d | c b a)      period 2n-2 (n == 1: the single value)
//   nearest  (a a a | a b c d | d d d)
//   wrap     (a b c d | a b c d | a b c d)  period n
//   constant (k k k | a b c d | k k k)      -1: the caller uses cval
// The codes follow chunkernels._shared.filters.MODES.
#ifndef CHUNKERNELS_BOUNDARY_CUH
#define CHUNKERNELS_BOUNDARY_CUH

#define CK_MODE_REFLECT 0
#define CK_MODE_MIRROR 1
#define CK_MODE_NEAREST 2
#define CK_MODE_WRAP 3
#define CK_MODE_CONSTANT 4

template <typename I>
__device__ __forceinline__ I map_index(I j, const I n, const int mode) {
    if (j >= 0 && j < n) return j;
    switch (mode) {
    case CK_MODE_NEAREST:
        return j < 0 ? I(0) : n - 1;
    case CK_MODE_WRAP: {
        const I r = j % n;
        return r < 0 ? r + n : r;
    }
    case CK_MODE_REFLECT: {
        const I p = 2 * n;
        I r = j % p;
        if (r < 0) r += p;
        return r < n ? r : p - 1 - r;
    }
    case CK_MODE_MIRROR: {
        if (n == 1) return 0;
        const I p = 2 * n - 2;
        I r = j % p;
        if (r < 0) r += p;
        return r < n ? r : p - r;
    }
    default:
        return -1;
    }
}

template <typename T> struct ck_is_float { static constexpr bool value = false; };
template <> struct ck_is_float<float> { static constexpr bool value = true; };
template <> struct ck_is_float<double> { static constexpr bool value = true; };
template <typename T> struct ck_is_double { static constexpr bool value = false; };
template <> struct ck_is_double<double> { static constexpr bool value = true; };

// x86-64's truncating conversions (cvttsd2si), which scipy's C casts compile to: a value out of
// the target's range, or NaN, gives the "integer indefinite" INT_MIN / LLONG_MIN. CUDA's own
// conversions saturate instead, so scipy's results on out-of-range sums are reproduced here.
__device__ __forceinline__ int ck_cvtt32(const double v) {
    return (v > -2147483649.0 && v < 2147483648.0) ? static_cast<int>(v) : (-2147483647 - 1);
}
__device__ __forceinline__ long long ck_cvtt64(const double v) {
    return (v >= -9223372036854775808.0 && v < 9223372036854775808.0)
               ? static_cast<long long>(v) : (-9223372036854775807LL - 1);
}

// The accumulated value A stored as the output type TO, as scipy.ndimage stores it: a C cast from
// double, compiled for x86-64 by gcc. int8/uint8/int16/uint16/int32 convert through a 32-bit
// integer and keep its low bits (300.0 -> uint8 44), uint32 and int64 through a 64-bit one,
// uint64 subtracts 2**63 from values not below it first. Integer accumulators (scipy.signal's
// integer arithmetic) wrap.
template <typename TO, typename A>
__device__ __forceinline__ TO to_output(const A v) {
    if constexpr (ck_is_float<TO>::value || !ck_is_float<A>::value) {
        return static_cast<TO>(v);
    } else if constexpr (sizeof(TO) == 8 && TO(-1) > TO(0)) {
        const double d = static_cast<double>(v);
        return !(d >= 9223372036854775808.0)
                   ? static_cast<TO>(ck_cvtt64(d))
                   : static_cast<TO>(ck_cvtt64(d - 9223372036854775808.0)) ^ (TO(1) << 63);
    } else if constexpr (sizeof(TO) == 8 || (sizeof(TO) == 4 && TO(-1) > TO(0))) {
        return static_cast<TO>(ck_cvtt64(static_cast<double>(v)));
    } else {
        return static_cast<TO>(ck_cvtt32(static_cast<double>(v)));
    }
}

#endif  // CHUNKERNELS_BOUNDARY_CUH
