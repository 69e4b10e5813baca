// Partial statistics for image comparison metrics (mean_squared_error, normalized_root_mse).
// CPU reference: chunkernels/kernels/mean_squared_error.py (scikit-image's
// skimage.metrics.mean_squared_error / normalized_root_mse semantics).
//
// One pass over a pair of same-shape views a (the true / first image) and b. Values are
// converted to the compute type T (scikit-image's float type for the pair: float32 stays
// float32, everything else becomes float64); differences and squares are taken in T, as NumPy
// does on the converted arrays, and accumulated in double. Each thread block writes one row of
// STATS doubles to `partials`:
//   [0] sum (a - b)^2   [1] sum a^2   [2] sum a   [3] min a   [4] max a   [5] element count
// The caller combines the rows (sums, min, max) on the device. min and max propagate NaN, as
// numpy.min / numpy.max do.
//
// Geometry (planned by chunkernels.layout.plan_pointwise in a's memory order): NDIM <= 4 dims
// with extents (n0 implied, n1, n2, n3), element strides per array (any sign, zero allowed).
// A grid-stride loop walks the n elements in that order, so consecutive threads read
// consecutive addresses of a.

#define STATS 6

template <typename T>
__device__ __forceinline__ double nan_min(double acc, T v) {
    const double d = static_cast<double>(v);
    return (d != d || acc != acc) ? (d != d ? d : acc) : (d < acc ? d : acc);
}

template <typename T>
__device__ __forceinline__ double nan_max(double acc, T v) {
    const double d = static_cast<double>(v);
    return (d != d || acc != acc) ? (d != d ? d : acc) : (d > acc ? d : acc);
}

__device__ __forceinline__ double combine_min(double x, double y) {
    return (x != x || y != y) ? (x != x ? x : y) : (x < y ? x : y);
}

__device__ __forceinline__ double combine_max(double x, double y) {
    return (x != x || y != y) ? (x != x ? x : y) : (x > y ? x : y);
}

template <typename TA, typename TB, typename T, typename I, int NDIM>
__global__ void __launch_bounds__(256) squared_error_stats(
    const TA* __restrict__ a, const TB* __restrict__ b, double* __restrict__ partials,
    const I n, const I n1, const I n2, const I n3,
    const I as0, const I as1, const I as2, const I as3,
    const I bs0, const I bs1, const I bs2, const I bs3)
{
    double acc[STATS] = {0.0, 0.0, 0.0, __longlong_as_double(0x7ff0000000000000LL),
                         __longlong_as_double(0xfff0000000000000LL), 0.0};
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I r = i, c1 = 0, c2 = 0, c3 = 0;
        if (NDIM >= 4) { c3 = r % n3; r /= n3; }
        if (NDIM >= 3) { c2 = r % n2; r /= n2; }
        if (NDIM >= 2) { c1 = r % n1; r /= n1; }
        const T x = static_cast<T>(__ldg(a + (r * as0 + c1 * as1 + c2 * as2 + c3 * as3)));
        const T y = static_cast<T>(__ldg(b + (r * bs0 + c1 * bs1 + c2 * bs2 + c3 * bs3)));
        const T d = x - y;
        acc[0] += static_cast<double>(d * d);
        acc[1] += static_cast<double>(x * x);
        acc[2] += static_cast<double>(x);
        acc[3] = nan_min(acc[3], x);
        acc[4] = nan_max(acc[4], x);
        acc[5] += 1.0;
    }

    // block reduction: warp shuffles, then one value per warp through shared memory
    __shared__ double warp_acc[STATS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < STATS; ++k) {
        double v = acc[k];
        for (int off = 16; off > 0; off >>= 1) {
            const double o = __shfl_down_sync(0xffffffffu, v, off);
            v = (k == 3) ? combine_min(v, o) : (k == 4) ? combine_max(v, o) : v + o;
        }
        if (lane == 0) warp_acc[k][warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
#pragma unroll
        for (int k = 0; k < STATS; ++k) {
            double v = lane < warps ? warp_acc[k][lane]
                     : (k == 3 ? __longlong_as_double(0x7ff0000000000000LL)
                        : k == 4 ? __longlong_as_double(0xfff0000000000000LL) : 0.0);
            for (int off = 16; off > 0; off >>= 1) {
                const double o = __shfl_down_sync(0xffffffffu, v, off);
                v = (k == 3) ? combine_min(v, o) : (k == 4) ? combine_max(v, o) : v + o;
            }
            if (lane == 0) partials[(size_t)blockIdx.x * STATS + k] = v;
        }
    }
}
