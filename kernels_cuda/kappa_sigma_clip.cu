// One pass of κ-σ clipping (the GPU lesson's ks_clipper_cpu, seed 002) with an exact median by
// histogram refinement. CPU reference: chunkernels/kernels/kappa_sigma_clip.py (reference,
// partial, select); the driver is chunkernels/sources/_clip.py.
//
// Values map to unsigned keys in the values' order (Key<T> below): floats flip the sign bit of
// non-negative values and every bit of negative ones, with -0.0 counted as +0.0 (NaN keys lie
// outside [key(-inf), key(+inf)]); signed integers flip the sign bit. ksc_pass reads one block
// (any strides: at most 3 dims after chunkernels.layout.plan_pointwise collapsed it, walked in
// its memory order by a grid-stride loop), ksc_pass_blocks several contiguous blocks of one
// device as one run of values (a launch per pass, not per block), and, for the values whose
// key is in [wlo, whi]:
//   - counts them and sums d = x * scale - center * scale (= (x - center) * scale, exactly for
//     a power-of-two scale) and d*d in double, and counts NaNs anywhere (all four left at 0 when
//     `moments` is 0: refinement passes need the histogram only). The driver passes scale 1
//     unless huge values would overflow the sums of squares;
//   - EXTREMES false: histograms their keys in [hlo, hhi] into bins (key - hlo) >> shift;
//   - EXTREMES true: the largest key in [alo, ahi] and the smallest in [blo, bhi].
// The histogram and extremes only ever see keys inside the window.
// Results accumulate into `row` (doubles): the head [count, sum, sumsq, nans, na, amax, nb,
// bmin, sel...] (HEAD values) and then the histogram, so that the blocks of one device can add
// into one row, launch after launch in stream order. Each thread block keeps its histogram in
// shared memory as 16-bit counters, two per word (65536 bins in 128 KiB): a counter that reaches
// SPILL hands SPILL to the row and drops by it, so no counter overflows, and the rest is added
// to the row at the end. Each thread block writes its statistics to `partials`; the last one to
// finish (a counter, no grid synchronisation) adds them in block order, so sums do not depend on
// timing, and resets the counter for the next launch.
//
// ksc_select (one thread block) then finds, in a row, the bins holding two ranks (r1 < 0: the
// middle ranks of the row's count): bin, count before it, count in it.

#define HEAD 16
#define COUNT 0
#define SUM 1
#define SUMSQ 2
#define NANS 3
#define NA 4
#define AMAX 5
#define NB 6
#define BMIN 7
#define SEL 8
#define PARTIAL 8
#define THREADS 1024
#define UNROLL 8
#define SPILL 0x4000u

template <typename T> struct Key;

template <> struct Key<float> {
    typedef unsigned int type;
    static __device__ __forceinline__ type of(float v) {
        unsigned int u = __float_as_uint(v);
        if (u == 0x80000000u) u = 0u;
        return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    static __device__ __forceinline__ double value(type k) {
        return (double)__uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
    }
    static __device__ __forceinline__ bool nan(float v) { return v != v; }
};

template <> struct Key<double> {
    typedef unsigned long long type;
    static __device__ __forceinline__ type of(double v) {
        unsigned long long u = (unsigned long long)__double_as_longlong(v);
        if (u == 0x8000000000000000ull) u = 0ull;
        return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
    }
    static __device__ __forceinline__ double value(type k) {
        return __longlong_as_double((long long)((k & 0x8000000000000000ull)
                                                ? (k & 0x7fffffffffffffffull) : ~k));
    }
    static __device__ __forceinline__ bool nan(double v) { return v != v; }
};

// Signed integers: widened to S, the sign bit flipped. Unsigned integers are their own keys.
#define CHUNKERNELS_SIGNED_KEY(T, K, S)                                                       \
    template <> struct Key<T> {                                                               \
        typedef K type;                                                                       \
        static __device__ __forceinline__ type of(T v) {                                      \
            return (K)(S)v ^ ((K)1 << (sizeof(K) * 8 - 1));                                   \
        }                                                                                     \
        static __device__ __forceinline__ double value(type k) {                              \
            return (double)(S)(k ^ ((K)1 << (sizeof(K) * 8 - 1)));                            \
        }                                                                                     \
        static __device__ __forceinline__ bool nan(T) { return false; }                       \
    };
#define CHUNKERNELS_UNSIGNED_KEY(T, K)                                                        \
    template <> struct Key<T> {                                                               \
        typedef K type;                                                                       \
        static __device__ __forceinline__ type of(T v) { return (K)v; }                       \
        static __device__ __forceinline__ double value(type k) { return (double)k; }          \
        static __device__ __forceinline__ bool nan(T) { return false; }                       \
    };
CHUNKERNELS_SIGNED_KEY(signed char, unsigned int, int)
CHUNKERNELS_SIGNED_KEY(short, unsigned int, int)
CHUNKERNELS_SIGNED_KEY(int, unsigned int, int)
CHUNKERNELS_SIGNED_KEY(long long, unsigned long long, long long)
CHUNKERNELS_UNSIGNED_KEY(unsigned char, unsigned int)
CHUNKERNELS_UNSIGNED_KEY(unsigned short, unsigned int)
CHUNKERNELS_UNSIGNED_KEY(unsigned int, unsigned int)
CHUNKERNELS_UNSIGNED_KEY(unsigned long long, unsigned long long)

// Position of element i = ((i0 * n1) + i1) * n2 + i2 of the walk (extents (n0, n1, n2), leading
// ones for fewer dims), advanced by a fixed step without divisions: the step's digits in the
// same mixed radix are added with carries.
template <typename I, int NDIM>
struct Walk {
    I i0, i1, i2, q0, q1, q2;
    __device__ __forceinline__ Walk(I start, I step, I n1, I n2) {
        i0 = i1 = q0 = q1 = 0;
        if (NDIM == 1) {
            i2 = start; q2 = step;
        } else if (NDIM == 2) {
            i2 = start % n2; i1 = start / n2; q2 = step % n2; q1 = step / n2;
        } else {
            i2 = start % n2; I r = start / n2; i1 = r % n1; i0 = r / n1;
            q2 = step % n2; r = step / n2; q1 = r % n1; q0 = r / n1;
        }
    }
    __device__ __forceinline__ I offset(I s0, I s1, I s2) const {
        return NDIM == 1 ? i2 * s2 : NDIM == 2 ? i1 * s1 + i2 * s2 : i0 * s0 + i1 * s1 + i2 * s2;
    }
    __device__ __forceinline__ void next(I n1, I n2) {
        i2 += q2;
        if (NDIM == 1) return;
        if (i2 >= n2) { i2 -= n2; ++i1; }
        i1 += q1;
        if (NDIM == 2) return;
        if (i1 >= n1) { i1 -= n1; ++i0; }
        i0 += q0;
    }
};

// One more value in bin `bin` of the shared histogram (two 16-bit counters per word). The
// thread whose increment brings a counter to SPILL moves SPILL of it to the row; other threads
// may add meanwhile, but far fewer than the 0xffff - SPILL that would overflow the counter.
__device__ __forceinline__ void count_bin(unsigned int* hist, double* row, unsigned int bin) {
    const unsigned int half = (bin & 1u) << 4;
    const unsigned int old = atomicAdd(&hist[bin >> 1], 1u << half);
    if (((old >> half) & 0xffffu) == SPILL - 1u) {
        atomicSub(&hist[bin >> 1], SPILL << half);
        atomicAdd(&row[HEAD + bin], (double)SPILL);
    }
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
    for (int off = 16; off > 0; off >>= 1) {
        const T o = __shfl_down_sync(0xffffffffu, v, off);
        v = o > v ? o : v;
    }
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_min(T v) {
    for (int off = 16; off > 0; off >>= 1) {
        const T o = __shfl_down_sync(0xffffffffu, v, off);
        v = o < v ? o : v;
    }
    return v;
}

// How a pass reads its values: load() gives the element at the reader's position, then moves
// it on by the grid's stride. WalkReader reads one view (any strides, Walk above); BlocksReader
// reads several contiguous blocks of one device, one after the other, as one run of values:
// ptrs[b] the start of block b, ends[b] the run's index past its last value.
template <typename T, typename I, int NDIM>
struct WalkReader {
    const T* x;
    Walk<I, NDIM> walk;
    I n1, n2, st0, st1, st2;
    __device__ __forceinline__ WalkReader(const T* x_, I start, I step, I n1_, I n2_, I s0, I s1,
                                          I s2)
        : x(x_), walk(start, step, n1_, n2_), n1(n1_), n2(n2_), st0(s0), st1(s1), st2(s2) {}
    __device__ __forceinline__ T load() {
        const T v = __ldg(x + walk.offset(st0, st1, st2));
        walk.next(n1, n2);
        return v;
    }
};

template <typename T, typename I>
struct BlocksReader {
    const unsigned long long* ptrs;
    const I* ends;
    const T* block;
    I i, step, begin, end;
    int b;
    __device__ __forceinline__ BlocksReader(const unsigned long long* ptrs_, const I* ends_,
                                            I start, I step_)
        : ptrs(ptrs_), ends(ends_), i(start), step(step_), begin(0), b(0) {
        end = __ldg(ends);
        block = reinterpret_cast<const T*>(__ldg(ptrs));
    }
    __device__ __forceinline__ T load() {
        while (i >= end) {  // the next block (callers stop at the run's end)
            begin = end;
            ++b;
            end = __ldg(ends + b);
            block = reinterpret_cast<const T*>(__ldg(ptrs + b));
        }
        const T v = __ldg(block + (i - begin));
        i += step;
        return v;
    }
};

// The pass over the n values a reader gives (see the top of the file); one thread block's share
// is every gridDim.x * blockDim.x-th value from its threads' starts.
template <typename T, typename I, bool EXTREMES, typename Reader>
__device__ __forceinline__ void ksc_pass_body(
    Reader reader, const I n, double* __restrict__ row, double* __restrict__ partials,
    unsigned int* __restrict__ done,
    const typename Key<T>::type wlo, const typename Key<T>::type whi,
    const typename Key<T>::type hlo, const typename Key<T>::type hhi,
    const int shift, const int nbins,
    const typename Key<T>::type alo, const typename Key<T>::type ahi,
    const typename Key<T>::type blo, const typename Key<T>::type bhi,
    const double center, const double scale, const int moments)
{
    typedef typename Key<T>::type K;
    extern __shared__ unsigned int hist[];
    const int words = EXTREMES ? 0 : (nbins + 1) >> 1;
    for (int w = threadIdx.x; w < words; w += blockDim.x) hist[w] = 0u;
    __syncthreads();

    unsigned long long cnt = 0, nans = 0, na = 0, nb = 0;
    double sum = 0.0, sumsq = 0.0;
    K amax = 0, bmin = ~(K)0;
    const double scaled_center = center * scale;

    const I step = (I)gridDim.x * blockDim.x;
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    for (I i = start; i < n;) {
        T v[UNROLL];
        int m = 0;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (i < n) {
                v[u] = reader.load();
                ++m;
                i += step;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (u >= m) break;
            const K k = Key<T>::of(v[u]);
            if (k >= wlo && k <= whi) {
                if (moments) {
                    const double d = static_cast<double>(v[u]) * scale - scaled_center;
                    ++cnt;
                    sum += d;
                    sumsq = fma(d, d, sumsq);
                }
                if (EXTREMES) {
                    if (k >= alo && k <= ahi) { ++na; amax = k > amax ? k : amax; }
                    if (k >= blo && k <= bhi) { ++nb; bmin = k < bmin ? k : bmin; }
                } else if (k >= hlo && k <= hhi) {
                    count_bin(hist, row, (unsigned int)((k - hlo) >> shift));
                }
            } else if (moments && Key<T>::nan(v[u])) {
                ++nans;
            }
        }
    }

    // the rest of the shared histogram to the row
    __syncthreads();
    for (int w = threadIdx.x; w < words; w += blockDim.x) {
        const unsigned int c = hist[w];
        if (c & 0xffffu) atomicAdd(&row[HEAD + 2 * w], (double)(c & 0xffffu));
        if (c >> 16) atomicAdd(&row[HEAD + 2 * w + 1], (double)(c >> 16));
    }

    // this thread block's statistics: warp shuffles, then warp 0 over the warps' results
    __shared__ unsigned long long w_cnt[32], w_nans[32], w_na[32], w_nb[32];
    __shared__ double w_sum[32], w_sumsq[32];
    __shared__ K w_amax[32], w_bmin[32];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    cnt = warp_sum(cnt); nans = warp_sum(nans); na = warp_sum(na); nb = warp_sum(nb);
    sum = warp_sum(sum); sumsq = warp_sum(sumsq); amax = warp_max(amax); bmin = warp_min(bmin);
    if (lane == 0) {
        w_cnt[warp] = cnt; w_nans[warp] = nans; w_na[warp] = na; w_nb[warp] = nb;
        w_sum[warp] = sum; w_sumsq[warp] = sumsq; w_amax[warp] = amax; w_bmin[warp] = bmin;
    }
    __syncthreads();
    if (warp == 0) {
        const bool in = lane < warps;
        cnt = warp_sum(in ? w_cnt[lane] : 0ull);
        nans = warp_sum(in ? w_nans[lane] : 0ull);
        na = warp_sum(in ? w_na[lane] : 0ull);
        nb = warp_sum(in ? w_nb[lane] : 0ull);
        sum = warp_sum(in ? w_sum[lane] : 0.0);
        sumsq = warp_sum(in ? w_sumsq[lane] : 0.0);
        amax = warp_max(in ? w_amax[lane] : (K)0);
        bmin = warp_min(in ? w_bmin[lane] : ~(K)0);
        if (lane == 0) {
            double* p = partials + (size_t)blockIdx.x * PARTIAL;
            p[COUNT] = (double)cnt; p[SUM] = sum; p[SUMSQ] = sumsq; p[NANS] = (double)nans;
            p[NA] = (double)na; p[AMAX] = na ? Key<T>::value(amax) : 0.0;
            p[NB] = (double)nb; p[BMIN] = nb ? Key<T>::value(bmin) : 0.0;
            __threadfence();  // the partials are visible before the counter says so
            last = atomicAdd(done, 1u) == gridDim.x - 1;
        }
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        // every thread block's partials, in block order; then into the row (earlier launches
        // into the same row came before this one, in stream order)
        double c = 0.0, a = 0.0, q = 0.0, nn = 0.0, ca = 0.0, cb = 0.0, va = 0.0, vb = 0.0;
        for (unsigned int b = 0; b < gridDim.x; ++b) {
            const double* p = partials + (size_t)b * PARTIAL;
            c += __ldcg(p + COUNT); a += __ldcg(p + SUM); q += __ldcg(p + SUMSQ);
            nn += __ldcg(p + NANS);
            const double pa = __ldcg(p + NA), pb = __ldcg(p + NB);
            if (pa > 0.0) { const double v = __ldcg(p + AMAX); va = (ca > 0.0 && va > v) ? va : v; ca += pa; }
            if (pb > 0.0) { const double v = __ldcg(p + BMIN); vb = (cb > 0.0 && vb < v) ? vb : v; cb += pb; }
        }
        row[COUNT] += c; row[SUM] += a; row[SUMSQ] += q; row[NANS] += nn;
        if (ca > 0.0) { row[AMAX] = (row[NA] > 0.0 && row[AMAX] > va) ? row[AMAX] : va; row[NA] += ca; }
        if (cb > 0.0) { row[BMIN] = (row[NB] > 0.0 && row[BMIN] < vb) ? row[BMIN] : vb; row[NB] += cb; }
        *done = 0u;
    }
}

#define KSC_PASS_PARAMS                                                                       \
    double* __restrict__ row, double* __restrict__ partials, unsigned int* __restrict__ done,   \
    const typename Key<T>::type wlo, const typename Key<T>::type whi,                         \
    const typename Key<T>::type hlo, const typename Key<T>::type hhi,                         \
    const int shift, const int nbins,                                                         \
    const typename Key<T>::type alo, const typename Key<T>::type ahi,                         \
    const typename Key<T>::type blo, const typename Key<T>::type bhi,                         \
    const double center, const double scale, const int moments
#define KSC_PASS_ARGS row, partials, done, wlo, whi, hlo, hhi, shift, nbins, alo, ahi, blo, bhi, \
    center, scale, moments

// One view (at most 3 dims after collapsing, any strides).
template <typename T, typename I, int NDIM, bool EXTREMES>
__global__ void __launch_bounds__(THREADS) ksc_pass(
    const T* __restrict__ x, const I n, const I n1, const I n2, const I st0, const I st1,
    const I st2, KSC_PASS_PARAMS)
{
    const I step = (I)gridDim.x * blockDim.x;
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    ksc_pass_body<T, I, EXTREMES>(WalkReader<T, I, NDIM>(x, start, step, n1, n2, st0, st1, st2),
                                  n, KSC_PASS_ARGS);
}

// Several contiguous blocks of one device in one launch: n values in all, block b's pointer
// ptrs[b] and the run's index past its last value ends[b] (ends[last] == n).
template <typename T, typename I, bool EXTREMES>
__global__ void __launch_bounds__(THREADS) ksc_pass_blocks(
    const unsigned long long* __restrict__ ptrs, const I* __restrict__ ends, const I n,
    KSC_PASS_PARAMS)
{
    const I step = (I)gridDim.x * blockDim.x;
    const I start = (I)blockIdx.x * blockDim.x + threadIdx.x;
    ksc_pass_body<T, I, EXTREMES>(BlocksReader<T, I>(ptrs, ends, start, step), n, KSC_PASS_ARGS);
}

// The bins of the row's histogram (nbins of them) holding ranks r1 and r2, counted from 0 over
// the histogram's values; r1 < 0: the middle ranks, (count - 1) / 2 and count / 2, of row[COUNT].
// Writes row[SEL + 3j .. SEL + 3j + 2] = (bin, values before it, values in it), or (-1, 0, 0).
__global__ void __launch_bounds__(THREADS) ksc_select(double* __restrict__ row, const int nbins,
                                                      const long long r1, const long long r2)
{
    __shared__ double warp_total[32];
    __shared__ long long ranks[2];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
    if (t == 0) {
        long long a = r1, b = r2;
        if (r1 < 0) {
            const long long n = (long long)row[COUNT];
            a = n > 0 ? (n - 1) / 2 : -1;
            b = n > 0 ? n / 2 : -1;
        }
        ranks[0] = a;
        ranks[1] = b;
        for (int j = 0; j < 2; ++j) {
            row[SEL + 3 * j] = -1.0; row[SEL + 3 * j + 1] = 0.0; row[SEL + 3 * j + 2] = 0.0;
        }
    }
    // each thread sums a run of bins; an inclusive scan of the runs over the block
    const int per = (nbins + blockDim.x - 1) / blockDim.x;
    const int first = min(nbins, t * per), end = min(nbins, first + per);
    double local = 0.0;
    for (int b = first; b < end; ++b) local += row[HEAD + b];
    double incl = local;
    for (int off = 1; off < 32; off <<= 1) {
        const double o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
    }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        double w = lane < warps ? warp_total[lane] : 0.0;
        for (int off = 1; off < 32; off <<= 1) {
            const double o = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += o;
        }
        if (lane < warps) warp_total[lane] = w;
    }
    __syncthreads();
    const double before = incl - local + (warp > 0 ? warp_total[warp - 1] : 0.0);
    for (int j = 0; j < 2; ++j) {
        const long long r = ranks[j];
        if (r < 0 || (double)r < before || (double)r >= before + local) continue;
        double acc = before;
        for (int b = first; b < end; ++b) {
            const double h = row[HEAD + b];
            if ((double)r < acc + h) {
                row[SEL + 3 * j] = (double)b; row[SEL + 3 * j + 1] = acc; row[SEL + 3 * j + 2] = h;
                break;
            }
            acc += h;
        }
    }
}
