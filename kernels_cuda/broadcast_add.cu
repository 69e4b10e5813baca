// broadcast_add: z = x + y, with y broadcast to x's shape (NumPy broadcasting; zero strides).
// CPU reference: numpy.add (chunkernels/kernels/broadcast_add.py). Result dtype TZ follows
// numpy.result_type(x, y); both inputs are converted to TZ before the addition, as NumPy does.
//
// Geometry (planned in Python by chunkernels.layout): the iteration space is x's shape in x's
// memory order, with size-1 axes dropped and mergeable axes collapsed, giving NDIM <= 4 dims:
// up to three outer dims, flattened into `rows`, and one inner dim of `cols` steps. z is freshly
// allocated and contiguous in that order. x and y are arbitrary views: strides are in elements,
// may be negative (reversed views) or zero (broadcast).
//
// VEC > 1 is the fast path: x's inner stride is 1, the inner extent divides by VEC and every
// pointer and outer stride is aligned, so each thread moves VEC elements (16 bytes of the widest
// dtype) per access. y's inner stride is then 1 (vector loads) or 0 (one scalar, replicated).
// VEC == 1 takes any strides.
//
// Threads run along the inner dim (blockIdx.x, threadIdx.x); each thread walks rows
// (blockIdx.y, threadIdx.y) UNROLL at a time so that several independent loads are in flight.
// A y that does not change along the outer dims (a row vector, the seed's case) is loaded once
// per thread. For NDIM <= 2 the row index needs no division. Plain cached loads and stores measured
// 1% faster than streaming (.cs) hints on an H100 (docs/benchmarks.md).

template <int BYTES> struct RawWord;
template <> struct RawWord<4> { typedef unsigned int type; };
template <> struct RawWord<8> { typedef uint2 type; };
template <> struct RawWord<16> { typedef uint4 type; };

// N values of T that move through memory as one aligned word.
template <typename T, int N>
union Pack {
    typename RawWord<sizeof(T) * N>::type raw;
    T v[N];
};

template <typename I, int NDIM>
__device__ __forceinline__ I outer_offset(I row, I nb, I nc, I s0, I s1, I s2) {
    if (NDIM <= 2) return row * s0;
    if (NDIM == 3) {
        const I b = row % nb;
        return (row / nb) * s0 + b * s1;
    }
    const I c = row % nc;
    const I t = row / nc;
    const I b = t % nb;
    return (t / nb) * s0 + b * s1 + c * s2;
}

template <typename TX, typename TY, typename TZ, typename I, int NDIM, int VEC>
__global__ void __launch_bounds__(256) broadcast_add(
    const TX* __restrict__ x, const TY* __restrict__ y, TZ* __restrict__ z,
    const I rows, const I cols, const I nb, const I nc,
    const I xs0, const I xs1, const I xs2, const I xsc,
    const I ys0, const I ys1, const I ys2, const I ysc)
{
    constexpr int UNROLL = 4;
    typedef Pack<TX, VEC> PX;
    typedef Pack<TZ, VEC> PZ;

    const I col = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const I step = (I)gridDim.y * blockDim.y;
    const bool y_fixed = (ys0 == 0 && ys1 == 0 && ys2 == 0);

    // y's VEC values for this column; for a y that varies along the outer dims, reloaded per row.
    auto load_y = [&](I yoff, TY (&out)[VEC]) {
        if (VEC == 1 || ysc == 0) {
            const TY v = __ldg(y + yoff);
#pragma unroll
            for (int k = 0; k < VEC; ++k) out[k] = v;
        } else {
            Pack<TY, VEC> p;
            p.raw = __ldg(reinterpret_cast<const typename RawWord<sizeof(TY) * VEC>::type*>(y + yoff));
#pragma unroll
            for (int k = 0; k < VEC; ++k) out[k] = p.v[k];
        }
    };

    TY yfix[VEC];
    if (y_fixed) load_y(col * ysc, yfix);

    for (I row = (I)blockIdx.y * blockDim.y + threadIdx.y; row < rows; row += UNROLL * step) {
        PX xv[UNROLL];
        TY yv[UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I r = row + u * step;
            if (r < rows) {
                const I xoff = outer_offset<I, NDIM>(r, nb, nc, xs0, xs1, xs2) + col * xsc;
                xv[u].raw = __ldg(reinterpret_cast<const typename RawWord<sizeof(TX) * VEC>::type*>(x + xoff));
                if (y_fixed) {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) yv[u][k] = yfix[k];
                } else {
                    load_y(outer_offset<I, NDIM>(r, nb, nc, ys0, ys1, ys2) + col * ysc, yv[u]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const I r = row + u * step;
            if (r < rows) {
                PZ zv;
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    zv.v[k] = static_cast<TZ>(xv[u].v[k]) + static_cast<TZ>(yv[u][k]);
                *reinterpret_cast<typename RawWord<sizeof(TZ) * VEC>::type*>(z + (r * cols + col) * VEC) = zv.raw;
            }
        }
    }
}
