// zoom: one output block of a separable spline resampling, from per-axis tap/weight tables.
// CPU reference: chunkernels.kernels.zoom.reference; semantics of scipy.ndimage.zoom (its
// NI_ZoomShift), whose edge modes, coordinate mapping and B-spline weights the host has already
// turned into the tables:
//   taps[row * K + k]     position read along the axis, K = ORDER + 1; -1: this tap reads the
//                         constant cval; -2 (all K taps): the output is cval outright
//   weights[row * K + k]  its weight
// with the rows of axis a starting at row offset r_a (one row per output index along the axis).
//
// out[o0, .., oN-1] = sum_k0 w0[k0] sum_k1 w1[k1] ... c[t0[k0] * s0 + t1[k1] * s1 + ...]
// nested, innermost over the last axis: K^N loads and K^N + K^(N-1) + ... fused multiply-adds,
// for float sums; double sums add SciPy's terms in SciPy's order (accumulate_terms).
// A cval tap along axis a stands for cval times the weights of the axes after a (their sums).
//
// Geometry: threads run along the output's last axis (blockIdx.x, threadIdx.x), so a warp reads
// neighbouring coefficients and writes 32 consecutive outputs; rows (the other output axes,
// flattened) run along y, with a grid-stride loop past 65535. The output is C-contiguous; the
// coefficients `c` are any view (strides in elements, possibly negative). Nothing here depends on
// the block's shape or position: one compiled kernel per (types, NDIM, ORDER) serves them all.
//
// Results are stored as SciPy stores them: integers rounded half away from zero (unsigned:
// negatives give 0) and clipped to the type's range, bool truncated (true from 1 up).

template <typename T> struct OutTraits {  // floating point: plain conversion
    template <typename W> static __device__ __forceinline__ T store(W t) { return (T)t; }
};
template <> struct OutTraits<bool> {  // SciPy casts to npy_bool (unsigned char): truncation
    template <typename W> static __device__ __forceinline__ bool store(W t) {
        return t >= (W)1 || t <= (W)-1;
    }
};

template <typename T, long long LO, unsigned long long HI, bool SIGNED>
struct IntTraits {
    template <typename W> static __device__ __forceinline__ T store(W w) {
        double t = (double)w;
        t = SIGNED ? (t > 0.0 ? t + 0.5 : t - 0.5) : (t > 0.0 ? t + 0.5 : 0.0);
        if (t > (double)HI) return (T)HI;
        if (t < (double)LO) return (T)LO;
        return (T)t;
    }
};
template <> struct OutTraits<signed char> : IntTraits<signed char, -128LL, 127ULL, true> {};
template <> struct OutTraits<unsigned char> : IntTraits<unsigned char, 0LL, 255ULL, false> {};
template <> struct OutTraits<short> : IntTraits<short, -32768LL, 32767ULL, true> {};
template <> struct OutTraits<unsigned short> : IntTraits<unsigned short, 0LL, 65535ULL, false> {};
template <> struct OutTraits<int> : IntTraits<int, -2147483648LL, 2147483647ULL, true> {};
template <> struct OutTraits<unsigned int> : IntTraits<unsigned int, 0LL, 4294967295ULL, false> {};
template <> struct OutTraits<long long>
    : IntTraits<long long, (-9223372036854775807LL - 1), 9223372036854775807ULL, true> {};
template <> struct OutTraits<unsigned long long>
    : IntTraits<unsigned long long, 0LL, 18446744073709551615ULL, false> {};

// Sum over the taps of axes A..NDIM-1 around `base`.
template <typename TC, typename W, typename I, int A, int NDIM, int K, bool CVAL>
__device__ __forceinline__ W accumulate(const TC* __restrict__ c, const I base,
                                        const I (&off)[NDIM][K], const W (&w)[NDIM][K],
                                        const bool (&is_cval)[NDIM][K], const W (&tail)[NDIM],
                                        const W cval)
{
    W acc = (W)0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        W v;
        if (CVAL && is_cval[A][k]) {
            v = cval * tail[A];
        } else if constexpr (A == NDIM - 1) {
            v = (W)c[base + off[A][k]];
        } else {
            v = accumulate<TC, W, I, A + 1, NDIM, K, CVAL>(c, base + off[A][k], off, w, is_cval,
                                                           tail, cval);
        }
        acc += w[A][k] * v;
    }
    return acc;
}

// SciPy's own sum, for double sums (float64 and integer results): every term is the coefficient
// times the weights of axes 0, 1, ... in turn, the terms added with the last axis's taps varying
// fastest, each product and sum rounded on its own (no fused multiply-add), as NI_ZoomShift adds
// them and as the CPU reference does. The nested sum above rounds differently, which moves an
// integer result that lies within rounding of .5 by one. A cval tap along any axis makes the
// term's coefficient cval (the reference's padded cval slot).
template <typename TC, typename I, int A, int NDIM, int K, bool CVAL>
__device__ __forceinline__ void accumulate_terms(const TC* __restrict__ c, const I base,
                                                 const bool cval_term, int (&ks)[NDIM],
                                                 const I (&off)[NDIM][K],
                                                 const double (&w)[NDIM][K],
                                                 const bool (&is_cval)[NDIM][K],
                                                 const double cval, double& acc)
{
#pragma unroll
    for (int k = 0; k < K; ++k) {
        ks[A] = k;
        const bool cv = CVAL && (cval_term || is_cval[A][k]);
        if constexpr (A == NDIM - 1) {
            double t = cv ? cval : (double)c[base + off[A][k]];
#pragma unroll
            for (int a = 0; a < NDIM; ++a) t = __dmul_rn(t, w[a][ks[a]]);
            acc = __dadd_rn(acc, t);
        } else {
            accumulate_terms<TC, I, A + 1, NDIM, K, CVAL>(c, base + off[A][k], cv, ks, off, w,
                                                          is_cval, cval, acc);
        }
    }
}

template <typename TC, typename TO, typename W, typename I, int NDIM, int ORDER, bool CVAL>
__global__ void __launch_bounds__(256) zoom(
    const TC* __restrict__ c, TO* __restrict__ out,
    const int* __restrict__ taps, const W* __restrict__ weights,
    const I rows, const I cols, const I e1, const I e2,
    const I s0, const I s1, const I s2, const I s3,
    const I r0, const I r1, const I r2, const I r3,
    const double cval_in)
{
    constexpr int K = ORDER + 1;
    const I col = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const I strides[4] = {s0, s1, s2, s3};
    const I row_offset[4] = {r0, r1, r2, r3};
    const W cval = (W)cval_in;

    // the last axis's taps and weights: one row per thread, the same for every row it visits
    I off[NDIM][K];
    W w[NDIM][K];
    bool is_cval[NDIM][K];
    W tail[NDIM];
    {
        const I t = (row_offset[NDIM - 1] + col) * K;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int tap = __ldg(taps + t + k);
            is_cval[NDIM - 1][k] = CVAL && tap < 0;
            off[NDIM - 1][k] = (I)(tap < 0 ? 0 : tap) * strides[NDIM - 1];
            w[NDIM - 1][k] = __ldg(weights + t + k);
        }
    }
    tail[NDIM - 1] = (W)1;
    const bool last_outside = CVAL && __ldg(taps + (row_offset[NDIM - 1] + col) * K) == -2;

    for (I row = (I)blockIdx.y * blockDim.y + threadIdx.y; row < rows;
         row += (I)gridDim.y * blockDim.y) {
        // the row's leading output indices (C order; extents e1, e2 after the first)
        I idx[3] = {0, 0, 0};
        bool outside = last_outside;
        if (NDIM == 2) {
            idx[0] = row;
        } else if (NDIM == 3) {
            idx[1] = row % e1;
            idx[0] = row / e1;
        } else if (NDIM == 4) {
            idx[2] = row % e2;
            const I r = row / e2;
            idx[1] = r % e1;
            idx[0] = r / e1;
        }
#pragma unroll
        for (int a = 0; a < NDIM - 1; ++a) {
            const I t = (row_offset[a] + idx[a]) * K;
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int tap = __ldg(taps + t + k);
                is_cval[a][k] = CVAL && tap < 0;
                outside = outside || (CVAL && tap == -2);
                off[a][k] = (I)(tap < 0 ? 0 : tap) * strides[a];
                w[a][k] = __ldg(weights + t + k);
            }
        }
        if (outside) {
            out[row * cols + col] = OutTraits<TO>::store(cval);
            continue;
        }
        if constexpr (sizeof(W) == sizeof(double)) {
            double value = 0.0;
            int ks[NDIM];
            accumulate_terms<TC, I, 0, NDIM, K, CVAL>(c, (I)0, false, ks, off, w, is_cval,
                                                      (double)cval, value);
            out[row * cols + col] = OutTraits<TO>::store(value);
            continue;
        }
        if (CVAL) {
#pragma unroll
            for (int a = NDIM - 2; a >= 0; --a) {
                W sum = (W)0;
#pragma unroll
                for (int k = 0; k < K; ++k) sum += w[a + 1][k];
                tail[a] = tail[a + 1] * sum;
            }
        }
        const W value = accumulate<TC, W, I, 0, NDIM, K, CVAL>(c, (I)0, off, w, is_cval, tail, cval);
        out[row * cols + col] = OutTraits<TO>::store(value);
    }
}

// zoom_pass: the float sums of `zoom`, one axis at a time (float32 data zoomed into float32).
// The nested sum above, innermost over the last axis, is also a sequence of 1-D resamplings:
// the last axis first (src: the coefficients, any view), then each axis before it, every pass
// reading the previous one's C-contiguous float result. Each pass adds the same terms in the
// same order as the nested sum does at that depth (results agree to a rounding: where the
// compiler fuses a multiply-add differently), for a few reads and writes of the intermediate
// arrays instead of K^N loads per output. Used from spline order 2 up: for K^N = 1 or 8 loads
// the nested kernel, which writes only the output, is the faster.
//   dst[o0, .., oN-1]   shape: the source's with axis AXIS replaced by its output length
//                       (axes before AXIS still input positions, axes after it outputs)
//   cval taps           cval times the weights of the axes already resampled (the tail)
//   -2 (OUTSIDE)        checked on every axis in the last pass (AXIS == 0): the output is cval
// One thread per output element (grid-stride), in C order, so neighbouring threads write
// neighbouring elements and read neighbouring ones along every axis but AXIS.
template <typename TI, typename TO, typename I, int NDIM, int AXIS, int ORDER, bool CVAL>
__global__ void __launch_bounds__(256) zoom_pass(
    const TI* __restrict__ src, TO* __restrict__ dst,
    const int* __restrict__ taps, const float* __restrict__ weights,
    const I n, const I e1, const I e2, const I e3,
    const I s0, const I s1, const I s2, const I s3,
    const I r0, const I r1, const I r2, const I r3,
    const double cval_in)
{
    constexpr int K = ORDER + 1;
    const I extent[4] = {0, e1, e2, e3};
    const I strides[4] = {s0, s1, s2, s3};
    const I row_offset[4] = {r0, r1, r2, r3};
    const float cval = (float)cval_in;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I o[NDIM];
        I rest = i;
#pragma unroll
        for (int a = NDIM - 1; a > 0; --a) {
            o[a] = rest % extent[a];
            rest /= extent[a];
        }
        o[0] = rest;
        I base = 0;
#pragma unroll
        for (int a = 0; a < NDIM; ++a)
            if (a != AXIS) base += o[a] * strides[a];
        const I t = (row_offset[AXIS] + o[AXIS]) * K;
        int tap[K];
        bool cval_tap = false;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            tap[k] = __ldg(taps + t + k);
            cval_tap = cval_tap || (CVAL && tap[k] < 0);
        }
        float tail = 1.0f;  // the nested sum's tail[AXIS]: ((1 * S_{N-1}) * S_{N-2}) ... S_{AXIS+1}
        if (CVAL && cval_tap) {  // only rows that read cval need it
#pragma unroll
            for (int a = NDIM - 1; a > AXIS; --a) {
                const I ta = (row_offset[a] + o[a]) * K;
                float sum = 0.0f;
#pragma unroll
                for (int k = 0; k < K; ++k) sum += __ldg(weights + ta + k);
                tail = tail * sum;
            }
        }
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const float v = (CVAL && tap[k] < 0)
                                ? cval * tail
                                : (float)src[base + (I)(tap[k] < 0 ? 0 : tap[k]) * strides[AXIS]];
            acc += __ldg(weights + t + k) * v;
        }
        if (CVAL && AXIS == 0) {
            bool outside = false;
#pragma unroll
            for (int a = 0; a < NDIM; ++a)
                outside = outside || __ldg(taps + (row_offset[a] + o[a]) * K) == -2;
            if (outside) acc = cval;
        }
        dst[i] = OutTraits<TO>::store(acc);
    }
}
