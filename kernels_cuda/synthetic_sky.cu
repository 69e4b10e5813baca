// synthetic_sky: one chunk of chunkernels.sources.synthetic_sky's image in one launch: the
// counter-based Gaussian noise, the diffuse gradient and the sources that reach the chunk.
// CPU reference: chunkernels/sources/_sky.py (_render_reference and gaussian_noise on NumPy
// chunks), which defines the result; the host side of this kernel is _sky._render_cuda.
//
// Every pixel is computed as the reference computes it, operation by operation, in float64 and
// rounded to float32 at the end:
//   noise     sqrt(-2 log u1) cos(2 pi u2) * noise, with u1, u2 from two SplitMix64 outputs at
//             counters 2i+1 and 2i+2 (i: the pixel's row-major index in the image) of the stream
//             keyed by the seed: integer arithmetic, identical to NumPy's;
//   gradient  (GRADIENT * noise) * (0.6 (x / x_span - 0.5) + 0.8 (y / y_span - 0.5));
//   sources   added one by one in the order of the source list, each
//             peak exp(-0.5 ((u / sigma_major)^2 + (v / sigma_minor)^2)) over its box, with
//             u = dx cos + dy sin, v = dy cos - dx sin (cos and sin computed by the host).
// Products, quotients, sums and square roots use the _rn intrinsics, which the compiler never
// fuses into FMAs, so they round as NumPy's do; only exp, log and cos are CUDA's own
// implementations (within 1-2 ulp of float64 of NumPy's), which moves a float32 pixel by one
// ulp only where its float64 value lies that close to a rounding boundary: none of the 8192² sky's
// 67 million pixels moved with every exp, log and cos result moved by one or two ulps on the CPU.
// tests/test_sky.py and chunkernels/bench/sky.py count the pixels that differ on a GPU.
//
// Sources: a thread block owns a tile of SKY_TILE x SKY_TILE pixels; the host lists, per tile,
// the sources whose boxes meet it, in list order (CSR: tile_start, tile_sources), so a pixel adds
// exactly its sources in the reference's order, whatever the tiling or the chunking. Each thread
// computes SKY_ROWS pixels of one column of the tile, SKY_BLOCK_ROWS rows apart, and reads each
// listed source once for them.
//
// `data` holds, one after the other: `sources` rows of SKY_FIELDS doubles (y, x, cos, sin,
// sigma_major, sigma_minor, peak), `sources` boxes of 4 ints (first row, end row, first column,
// end column, relative to the chunk and clipped to it), tiles + 1 ints tile_start, and `entries`
// ints tile_sources. The chunk's geometry is a SkyChunk passed by value (_sky._CHUNK builds it).
//
// synthetic_sky_draws writes the two SplitMix64 outputs of each pixel of the chunk: the tests
// check the integers against NumPy's.
//
// The pixel code is __host__ __device__: tests/test_sky.py compiles it for the CPU with nvcc and
// runs it tile by tile, which checks the indexing and the order of the arithmetic without a GPU.

#define SKY_TILE 32
#define SKY_BLOCK_ROWS 8
#define SKY_ROWS (SKY_TILE / SKY_BLOCK_ROWS)
#define SKY_FIELDS 7
#define SKY_Y 0
#define SKY_X 1
#define SKY_COS 2
#define SKY_SIN 3
#define SKY_SIGMA_MAJOR 4
#define SKY_SIGMA_MINOR 5
#define SKY_PEAK 6

struct SkyChunk {
    unsigned long long key;  // SplitMix64 key of the seed: _mix_int(seed * GOLDEN + 1)
    long long width;         // image columns: the row stride of the pixel index
    long long row0, col0;    // the chunk's first pixel in the image
    long long rows, cols;    // the chunk's size (the output is C-contiguous rows x cols)
    double noise;            // noise standard deviation
    double gradient;         // GRADIENT * noise, as Python computes it
    double x_span, y_span;   // max(width - 1, 1), max(height - 1, 1)
    long long sources;       // rows of the source table
    long long entries;       // length of tile_sources
    long long tiles_x, tiles_y;
};
static_assert(sizeof(SkyChunk) == 14 * 8, "the layout _sky._CHUNK builds");

#define SKY_GOLDEN 0x9E3779B97F4A7C15ull
#define SKY_TWO_PI 6.283185307179586  // 2.0 * numpy.pi, exact: a doubling
#define SKY_2_POW_M53 0x1p-53

// IEEE operations rounded to nearest, never contracted into FMAs (on the host, the test
// harness compiles without contraction)
__host__ __device__ __forceinline__ double sky_mul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
__host__ __device__ __forceinline__ double sky_add(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
__host__ __device__ __forceinline__ double sky_sub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}
__host__ __device__ __forceinline__ double sky_div(double a, double b) {
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}
__host__ __device__ __forceinline__ double sky_sqrt(double a) {
#ifdef __CUDA_ARCH__
    return __dsqrt_rn(a);
#else
    return sqrt(a);
#endif
}

__host__ __device__ __forceinline__ unsigned long long sky_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// the two SplitMix64 outputs of pixel (row, col) of the image
__host__ __device__ __forceinline__ void sky_draws(const SkyChunk& chunk, long long row,
                                                   long long col, unsigned long long& first,
                                                   unsigned long long& second) {
    const unsigned long long i = (unsigned long long)row * (unsigned long long)chunk.width
                                 + (unsigned long long)col;
    first = sky_mix(chunk.key + (i * 2ull + 1ull) * SKY_GOLDEN);
    second = sky_mix(chunk.key + (i * 2ull + 2ull) * SKY_GOLDEN);
}

// noise and gradient of pixel (row, col) of the image
__host__ __device__ __forceinline__ double sky_background(const SkyChunk& chunk, long long row,
                                                          long long col) {
    unsigned long long first, second;
    sky_draws(chunk, row, col, first, second);
    // below 2**53 + 1: converted exactly; u1 in (0, 1], so log(u1) is finite
    const double u1 = sky_mul((double)((first >> 11) + 1ull), SKY_2_POW_M53);
    const double u2 = sky_mul((double)(second >> 11), SKY_2_POW_M53);
    const double normal = sky_mul(sky_sqrt(sky_mul(-2.0, log(u1))), cos(sky_mul(SKY_TWO_PI, u2)));
    const double x = (double)col, y = (double)row;
    const double plane = sky_add(sky_mul(0.6, sky_sub(sky_div(x, chunk.x_span), 0.5)),
                                 sky_mul(0.8, sky_sub(sky_div(y, chunk.y_span), 0.5)));
    return sky_add(sky_mul(chunk.noise, normal), sky_mul(chunk.gradient, plane));
}

// one source's value at offset (dx, dy) from its centre
__host__ __device__ __forceinline__ double sky_source(const double* p, double dx, double dy) {
    const double u = sky_add(sky_mul(dx, p[SKY_COS]), sky_mul(dy, p[SKY_SIN]));
    const double v = sky_sub(sky_mul(dy, p[SKY_COS]), sky_mul(dx, p[SKY_SIN]));
    const double a = sky_div(u, p[SKY_SIGMA_MAJOR]);
    const double b = sky_div(v, p[SKY_SIGMA_MINOR]);
    return sky_mul(p[SKY_PEAK], exp(sky_mul(-0.5, sky_add(sky_mul(a, a), sky_mul(b, b)))));
}

// thread (tx, ty) of the thread block of tile `tile`: its SKY_ROWS pixels of column tx
__host__ __device__ __forceinline__ void sky_pixels(float* __restrict__ out,
                                                    const unsigned char* __restrict__ data,
                                                    const SkyChunk& chunk, long long tile,
                                                    int tx, int ty) {
    const double* table = reinterpret_cast<const double*>(data);
    const int* boxes = reinterpret_cast<const int*>(table + SKY_FIELDS * chunk.sources);
    const int* tile_start = boxes + 4 * chunk.sources;
    const int* tile_sources = tile_start + chunk.tiles_x * chunk.tiles_y + 1;
    const long long c = (tile % chunk.tiles_x) * SKY_TILE + tx;
    const long long r = (tile / chunk.tiles_x) * SKY_TILE + ty;
    if (c >= chunk.cols) return;
    double acc[SKY_ROWS];
#pragma unroll
    for (int k = 0; k < SKY_ROWS; ++k) {
        const long long row = r + k * SKY_BLOCK_ROWS;
        acc[k] = row < chunk.rows ? sky_background(chunk, chunk.row0 + row, chunk.col0 + c) : 0.0;
    }
    const double x = (double)(chunk.col0 + c);
    const int end = tile_start[tile + 1];
    for (int e = tile_start[tile]; e < end; ++e) {
        const int s = tile_sources[e];
        const int* box = boxes + 4 * s;
        if (c < box[2] || c >= box[3]) continue;
        const double* p = table + SKY_FIELDS * s;
        const double dx = sky_sub(x, p[SKY_X]);
#pragma unroll
        for (int k = 0; k < SKY_ROWS; ++k) {
            const long long row = r + k * SKY_BLOCK_ROWS;
            if (row >= box[0] && row < box[1]) {
                const double dy = sky_sub((double)(chunk.row0 + row), p[SKY_Y]);
                acc[k] = sky_add(acc[k], sky_source(p, dx, dy));
            }
        }
    }
#pragma unroll
    for (int k = 0; k < SKY_ROWS; ++k) {
        const long long row = r + k * SKY_BLOCK_ROWS;
        if (row < chunk.rows) out[row * chunk.cols + c] = (float)acc[k];  // rounded to nearest
    }
}

// grid: one thread block of SKY_TILE x SKY_BLOCK_ROWS threads per tile, tiles_x * tiles_y
__global__ void __launch_bounds__(SKY_TILE * SKY_BLOCK_ROWS) synthetic_sky(
    float* __restrict__ out, const unsigned char* __restrict__ data,
    const __grid_constant__ SkyChunk chunk)
{
    sky_pixels(out, data, chunk, blockIdx.x, threadIdx.x, threadIdx.y);
}

// draws[2 p], draws[2 p + 1]: the SplitMix64 outputs of the chunk's pixel p (row-major)
__global__ void __launch_bounds__(256) synthetic_sky_draws(
    unsigned long long* __restrict__ draws, const __grid_constant__ SkyChunk chunk)
{
    const long long n = chunk.rows * chunk.cols;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (long long)gridDim.x * blockDim.x) {
        sky_draws(chunk, chunk.row0 + p / chunk.cols, chunk.col0 + p % chunk.cols,
                  draws[2 * p], draws[2 * p + 1]);
    }
}
