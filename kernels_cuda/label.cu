// label: connected-component labelling of one block, numbered as scipy.ndimage.label numbers them.
//
// Reference: scipy.ndimage.label (components of nonzero pixels under a symmetric 3^ndim
// structuring element, labelled 1..N in raster order of each component's first pixel).
//
// Algorithm: union-find in which a link always goes from the larger flat index to the smaller
// one (atomicMin), so the root of every component is its first pixel in raster (C) order
// (Playne & Hawick, "A new algorithm for parallel connected-component labelling on GPUs",
// IEEE TPDS 2018). As in block-based union-find (Allegretti, Bolelli & Grana, IEEE TPDS 2019),
// each thread block first joins the pixels of a 32x32 tile in shared memory, so that global
// atomics are only needed along tile borders and across planes:
//
//   label_tiles    tile-local union-find in shared memory (rows linked by a warp ballot
//                  first, then each pair of touching runs joined once); every pixel gets its
//                  tile root
//   label_merge    unions across tile borders (and across leading axes) in global memory
//   label_flatten  path compression; flags the roots (pixels that are their own parent) and
//                  scans the flags per segment; label_scan_offsets finishes the scan: the rank
//                  of each root is its label
//   label_write    label of every pixel = rank of its root, into any output dtype and strides
//   label_write_summary  label_write in place for a chunk, writing on the way its faces and
//                  per-line label counts, for the chunked merge
//   label_table    a block's lookup table, local to global label, from a host merge
//   section 8      the chunked merge on the device, and the tables and lookups that follow it
//
// Blocks are seen as 4-D, (n0, n1, n2, n3), with leading axes of length 1 added; the parent
// array is C-ordered over that shape. Tiles cover TILE_Y x TILE_X of the last two axes at one
// (i0, i1). The structuring element reaches the kernels as a 40-bit mask: bit k is set when the
// offset whose base-3 digits (o0+1, o1+1, o2+1, o3+1) spell k connects; k < 40 are exactly the
// "backward" offsets (earlier in raster order), which suffice for a symmetric element. Bits
// 36..39 are the offsets within a plane: (-1,-1), (-1,0), (-1,+1), (0,-1) on the last two axes.

#define LABEL_TILE_X 32
#define LABEL_TILE_Y 32
#define LABEL_BLOCK_Y 8
#define LABEL_PLANE_SHIFT 36
#define LABEL_CROSS_MASK ((1ull << LABEL_PLANE_SHIFT) - 1ull)

// -- union-find ------------------------------------------------------------------------------
// Reads go through volatile pointers: other threads link roots concurrently, and a stale cached
// parent would only cost a retry, but a value hoisted out of the loop could cost progress.

template <typename I>
__device__ __forceinline__ I label_find(const volatile I* parent, I a)
{
    I p = parent[a];
    while (p != a) {
        a = p;
        p = parent[a];
    }
    return a;
}

// Join the trees of a and b: the larger root is linked under the smaller one. When the atomic
// finds that the larger root was linked meanwhile, the link it made (if any) still joins a to b,
// and the loop goes on to join a's old parent with b.
template <typename I>
__device__ __forceinline__ void label_unite(I* parent, I a, I b)
{
    const volatile I* vparent = parent;
    while (true) {
        a = label_find(vparent, a);
        b = label_find(vparent, b);
        if (a == b) {
            return;
        }
        if (a < b) {
            const I t = a;
            a = b;
            b = t;
        }
        const I old = atomicMin(parent + a, b);
        if (old == a) {
            return;
        }
        a = old;
    }
}

// -- rows joined once per pair of touching runs -------------------------------------------------
// With the 4- and 8-connected structures (in-plane bits 10 and 15: left neighbours connect), a
// row's runs of foreground already share a root, so a run is joined to each run above it that
// it touches once, not once per touching pixel: a 4-connected pair meets first where neither
// run extends left of the overlap; 8-connected, a run that touches a run above only diagonally
// does so at its first pixel (up-left) or its last (up-right). Other structures join every
// touching pixel.

__device__ __forceinline__ bool label_joins_runs(const unsigned in_plane)
{
    return in_plane == 10u || in_plane == 15u;
}

// The neighbours above that a foreground pixel joins (bits as the in-plane ones: 1 up-left,
// 2 up, 4 up-right), given those of them in the foreground (touching) and whether its left
// (before) and right (after) neighbours are.
__device__ __forceinline__ unsigned label_joins_above(const unsigned in_plane,
                                                      const unsigned touching, const bool before,
                                                      const bool after)
{
    if (!label_joins_runs(in_plane)) {
        return in_plane & touching & 7u;
    }
    if (touching & 2u) {
        return before && (touching & 1u) ? 0u : 2u;
    }
    return in_plane & touching & ((before ? 0u : 1u) | (after ? 0u : 4u));
}

// Join pixel p to the neighbours above it that joins names (label_joins_above's bits), in an
// array whose rows are row elements apart.
template <typename I>
__device__ __forceinline__ void label_unite_above(I* parent, const I p, const I row,
                                                  const unsigned joins)
{
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        if (joins & (1u << k)) {
            label_unite(parent, p, p - row - 1 + k);
        }
    }
}

// -- 1. tiles -----------------------------------------------------------------------------------
// Launch bounds of 8 blocks per SM (at most 32 registers, no spills): 6-8% faster on an H100
// than the 40 registers NVRTC chose, the whole array and 2048^2 chunks alike.
//
// A batch: chunks of one layout (shape and strides, at most 3-D) labelled by one launch of each
// kernel, as the planes i0 = 0 .. n0 - 1 of one 4-D array; the structure joins nothing along
// axis 0, so each stays its own. Their parent arrays lie one after another; their sources are
// passed by value, one pointer per chunk (label_sources;
// chunkernels.kernels.label._forest._BATCH).

#define LABEL_BATCH 64

template <typename T>
struct label_sources {
    const T* p[LABEL_BATCH];
};

// tiles of a batch when batch is nonzero (source i0 at xs.p[i0]), else of the one array at
// xs.p[0] with strides (s0, s1, s2, s3).
template <typename T, typename I>
__global__ void __launch_bounds__(LABEL_TILE_X * LABEL_BLOCK_Y, 8)
label_tiles(const label_sources<T> xs, const int batch, I* __restrict__ parent,
            const I n0, const I n1, const I n2, const I n3,
            const I s0, const I s1, const I s2, const I s3,
            const unsigned long long structure)
{
    __shared__ int tile[LABEL_TILE_Y * LABEL_TILE_X];
    __shared__ unsigned rows[LABEL_TILE_Y];  // per tile row, its foreground lanes
    const int tx = threadIdx.x;
    const I col = (I)blockIdx.x * LABEL_TILE_X + tx;
    const I tiles_y = (n2 + LABEL_TILE_Y - 1) / LABEL_TILE_Y;
    const I planes = n0 * n1;
    const unsigned in_plane = (unsigned)(structure >> LABEL_PLANE_SHIFT) & 0xFu;

    for (I z = blockIdx.z; z < planes; z += gridDim.z) {
        const I i0 = z / n1;
        const I i1 = z - i0 * n1;
        const T* __restrict__ xz = (batch ? xs.p[i0] : xs.p[0] + i0 * s0) + i1 * s1;
        for (I by = blockIdx.y; by < tiles_y; by += gridDim.y) {
            const I row0 = by * LABEL_TILE_Y;
            // A warp holds a tile row. Where left neighbours connect, each pixel's parent is
            // the first pixel of its run of foreground (the lowest lane above the last
            // background lane below it, from a ballot of the row): depth 1 instead of the
            // chain that 32 concurrent left-unions would build.
            for (int r = threadIdx.y; r < LABEL_TILE_Y; r += LABEL_BLOCK_Y) {
                const I row = row0 + r;
                const int t = r * LABEL_TILE_X + tx;
                const bool fg = row < n2 && col < n3 && xz[row * s2 + col * s3] != T(0);
                const unsigned row_mask = __ballot_sync(0xffffffffu, fg);
                int start = tx;
                if (in_plane & 8u) {
                    const unsigned gaps = ~row_mask & ((1u << tx) - 1u);
                    start = gaps ? 32 - __clz(gaps) : 0;
                }
                tile[t] = fg ? r * LABEL_TILE_X + start : -1;
                if (tx == 0) {
                    rows[r] = row_mask;
                }
            }
            __syncthreads();
            if (in_plane & 7u) {
                for (int r = threadIdx.y + (threadIdx.y == 0 ? LABEL_BLOCK_Y : 0);
                     r < LABEL_TILE_Y; r += LABEL_BLOCK_Y) {
                    const unsigned here = rows[r], above = rows[r - 1], bit = 1u << tx;
                    if (!(here & bit)) {
                        continue;
                    }
                    const int t = r * LABEL_TILE_X + tx;
                    const unsigned touching = (above & (bit >> 1) ? 1u : 0u) |
                                              (above & bit ? 2u : 0u) |
                                              (above & (bit << 1) ? 4u : 0u);
                    label_unite_above(tile, t, LABEL_TILE_X,
                                      label_joins_above(in_plane, touching, here & (bit >> 1),
                                                        here & (bit << 1)));
                }
            }
            __syncthreads();
            for (int r = threadIdx.y; r < LABEL_TILE_Y; r += LABEL_BLOCK_Y) {
                const I row = row0 + r;
                if (row >= n2 || col >= n3) {
                    continue;
                }
                const int t = r * LABEL_TILE_X + tx;
                I value = -1;
                if (tile[t] >= 0) {
                    // tile order is raster order, so the tile root is the piece's first pixel
                    const int root = label_find<int>(tile, t);
                    value = (z * n2 + row0 + root / LABEL_TILE_X) * n3 +
                            (I)blockIdx.x * LABEL_TILE_X + root % LABEL_TILE_X;
                }
                parent[(z * n2 + row) * n3 + col] = value;
            }
            __syncthreads();  // the next tile reuses the shared array
        }
    }
}

// The pixels one thread of a tile-grid launch covers (grid: tiles of the last axis along x, tile
// rows along y, planes (i0, i1) along z; LABEL_TILE_X x LABEL_BLOCK_Y threads): visit(i0, i1,
// row, col, r) for each pixel inside the array, r being its row within its tile.
template <typename I, typename Visit>
__device__ __forceinline__ void label_tile_pixels(const I n0, const I n1, const I n2, const I n3,
                                                  Visit visit)
{
    const I col = (I)blockIdx.x * LABEL_TILE_X + threadIdx.x;
    const I tiles_y = (n2 + LABEL_TILE_Y - 1) / LABEL_TILE_Y;
    const I planes = n0 * n1;
    if (col >= n3) {
        return;
    }
    for (I z = blockIdx.z; z < planes; z += gridDim.z) {
        const I i0 = z / n1;
        const I i1 = z - i0 * n1;
        for (I by = blockIdx.y; by < tiles_y; by += gridDim.y) {
            const I row0 = by * LABEL_TILE_Y;
            for (int r = threadIdx.y; r < LABEL_TILE_Y; r += LABEL_BLOCK_Y) {
                const I row = row0 + r;
                if (row < n2) {
                    visit(i0, i1, row, col, r);
                }
            }
        }
    }
}

// -- 2. across tiles and planes --------------------------------------------------------------
// label_merge_pixel joins one pixel to its neighbours that label_tiles could not reach: across
// the tile's top (top), left (left) and right (right) borders, and in other planes (cross).
// label_merge visits every pixel (the structure joins across planes); label_merge_borders, for
// structures within the plane, only the pixels on a tile's top row and side columns, each once
// with the same flags: a sixteenth of the threads.

template <typename I>
__device__ __forceinline__ void label_merge_pixel(I* parent, const I n0, const I n1, const I n2,
                                                  const I n3, const I i0, const I i1,
                                                  const I row, const I col, const bool top,
                                                  const bool left, const bool right,
                                                  const unsigned in_plane,
                                                  const unsigned long long cross)
{
    const I p = ((i0 * n1 + i1) * n2 + row) * n3 + col;
    if (parent[p] < 0) {
        return;
    }
    if (top && row > 0 && label_joins_runs(in_plane)) {
        // a tile's top row against the row above, as label_tiles joins rows (the runs now
        // reach across tiles: the left pixel may be the last of the tile to the left,
        // whose own top row does the same)
        const unsigned touching = (col > 0 && parent[p - n3 - 1] >= 0 ? 1u : 0u) |
                                  (parent[p - n3] >= 0 ? 2u : 0u) |
                                  (col + 1 < n3 && parent[p - n3 + 1] >= 0 ? 4u : 0u);
        label_unite_above(parent, p, n3,
                          label_joins_above(in_plane, touching,
                                            col > 0 && parent[p - 1] >= 0,
                                            col + 1 < n3 && parent[p + 1] >= 0));
    } else if (row > 0) {
        // every foreground neighbour above that label_tiles could not reach
        label_unite_above(parent, p, n3,
                          ((in_plane & 1u) && (top || left) && col > 0 &&
                           parent[p - n3 - 1] >= 0 ? 1u : 0u) |
                          ((in_plane & 2u) && top && parent[p - n3] >= 0 ? 2u : 0u) |
                          ((in_plane & 4u) && (top || right) && col + 1 < n3 &&
                           parent[p - n3 + 1] >= 0 ? 4u : 0u));
    }
    if ((in_plane & 8u) && left && col > 0 && parent[p - 1] >= 0) {
        label_unite(parent, p, p - 1);
    }
    for (unsigned long long bits = cross; bits; bits &= bits - 1ull) {
        const int k = __ffsll((long long)bits) - 1;
        const I d0 = k / 27 - 1;
        const I d1 = (k / 9) % 3 - 1;
        const I d2 = (k / 3) % 3 - 1;
        const I d3 = k % 3 - 1;
        const I j0 = i0 + d0, j1 = i1 + d1, j2 = row + d2, j3 = col + d3;
        if (j0 < 0 || j0 >= n0 || j1 < 0 || j1 >= n1 || j2 < 0 || j2 >= n2 || j3 < 0 ||
            j3 >= n3) {
            continue;
        }
        const I q = ((j0 * n1 + j1) * n2 + j2) * n3 + j3;
        if (parent[q] >= 0) {
            label_unite(parent, p, q);
        }
    }
}

template <typename I>
__global__ void label_merge(I* parent, const I n0, const I n1, const I n2, const I n3,
                            const unsigned long long structure)
{
    const unsigned in_plane = (unsigned)(structure >> LABEL_PLANE_SHIFT) & 0xFu;
    const unsigned long long cross = structure & LABEL_CROSS_MASK;
    const bool left = threadIdx.x == 0;
    const bool right = threadIdx.x == LABEL_TILE_X - 1;
    label_tile_pixels(n0, n1, n2, n3, [&](const I i0, const I i1, const I row, const I col,
                                          const int r) {
        const bool top = r == 0;
        // inside a tile, every in-plane neighbour was joined by label_tiles
        if (!cross && !top && !left && !right) {
            return;
        }
        label_merge_pixel(parent, n0, n1, n2, n3, i0, i1, row, col, top, left, right, in_plane,
                          cross);
    });
}

// Blocks of LABEL_TILE_X x 2 threads on label_tiles' grid: row 0 of the threads takes the tile's
// top row, row 1 its left and right columns below the top row (thread x: tile row x).
template <typename I>
__global__ void label_merge_borders(I* parent, const I n0, const I n1, const I n2, const I n3,
                                    const unsigned long long structure)
{
    const unsigned in_plane = (unsigned)(structure >> LABEL_PLANE_SHIFT) & 0xFu;
    const int tx = threadIdx.x;
    const I col0 = (I)blockIdx.x * LABEL_TILE_X;
    const I tiles_y = (n2 + LABEL_TILE_Y - 1) / LABEL_TILE_Y;
    for (I z = blockIdx.z; z < n0 * n1; z += gridDim.z) {
        const I i0 = z / n1;
        const I i1 = z - i0 * n1;
        for (I by = blockIdx.y; by < tiles_y; by += gridDim.y) {
            const I row0 = by * LABEL_TILE_Y;
            if (threadIdx.y == 0) {
                if (col0 + tx < n3) {
                    label_merge_pixel(parent, n0, n1, n2, n3, i0, i1, row0, col0 + tx, true,
                                      tx == 0, tx == LABEL_TILE_X - 1, in_plane, 0ull);
                }
            } else if (tx > 0 && row0 + tx < n2) {
                label_merge_pixel(parent, n0, n1, n2, n3, i0, i1, row0 + tx, col0, false, true,
                                  false, in_plane, 0ull);
                if (col0 + LABEL_TILE_X - 1 < n3) {
                    label_merge_pixel(parent, n0, n1, n2, n3, i0, i1, row0 + tx,
                                      col0 + LABEL_TILE_X - 1, false, false, true, in_plane, 0ull);
                }
            }
        }
    }
}

// -- 3. scans -----------------------------------------------------------------------------------
// An inclusive scan in two launches, its last pass left to the kernels that read it: label_scan
// cuts the array into segments of seg elements (a whole number of tiles of LABEL_SCAN_TILE),
// one thread block each, replaces every element by the sum of its segment up to it and writes
// each segment's total; label_scan_offsets (one block of 1024 threads) turns the totals into
// their exclusive scan followed by the sum of all. The inclusive sum at i is then
// local[i] + offsets[i / seg] (label_scanned).

#define LABEL_SCAN_THREADS 256

// seg is a power of two (chunkernels.kernels.label._forest._ScanPlan): a shift, not a 64-bit
// division.
template <typename T>
__device__ __forceinline__ T label_scanned(const T* local, const T* offsets, long long seg,
                                           long long i)
{
    return local[i] + offsets[i >> (__ffsll(seg) - 1)];
}

// Inclusive scan of one value per thread over a whole block (warp shuffles, then the warps'
// sums through shared memory); carry is added, and becomes the block's running total.
template <typename T, int THREADS>
__device__ __forceinline__ T label_block_scan(T v, T& carry, T* warp_sums)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int d = 1; d < 32; d <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) {
            v += u;
        }
    }
    if (lane == 31) {
        warp_sums[warp] = v;
    }
    __syncthreads();
    T before = carry;
    T all = carry;
    for (int w = 0; w < THREADS / 32; ++w) {
        const T s = warp_sums[w];
        before += w < warp ? s : T(0);
        all += s;
    }
    __syncthreads();  // warp_sums is reused by the next call
    carry = all;
    return before + v;
}

// label_scan's first pass over this block's segment, of the values value(i) (called once per
// element of the segment): out[i] is the segment's sum up to i, totals[block] its total. A
// thread takes LABEL_SCAN_ITEMS consecutive elements a round (their values in flight together,
// one block scan a round), so segments are whole numbers of LABEL_SCAN_TILE elements.
#define LABEL_SCAN_ITEMS 4
#define LABEL_SCAN_TILE (LABEL_SCAN_THREADS * LABEL_SCAN_ITEMS)

template <typename T, typename Value>
__device__ __forceinline__ void label_scan_segment(T* out, T* totals, const long long n,
                                                   const long long seg, Value value)
{
    __shared__ T warp_sums[LABEL_SCAN_THREADS / 32];
    const long long begin = (long long)blockIdx.x * seg;
    const long long end = min(n, begin + seg);
    T carry = 0;
    for (long long base = begin; base < end; base += LABEL_SCAN_TILE) {
        const long long i = base + LABEL_SCAN_ITEMS * threadIdx.x;
        T sums[LABEL_SCAN_ITEMS];
        T sum = 0;
#pragma unroll
        for (int k = 0; k < LABEL_SCAN_ITEMS; ++k) {
            sum += i + k < end ? value(i + k) : T(0);
            sums[k] = sum;
        }
        const T before = label_block_scan<T, LABEL_SCAN_THREADS>(sum, carry, warp_sums) - sum;
        if constexpr (sizeof(T) == 4) {
            if (i + LABEL_SCAN_ITEMS <= end) {  // one vector: i is a multiple of 4
                reinterpret_cast<int4*>(out)[i / 4] = make_int4(
                    (int)(before + sums[0]), (int)(before + sums[1]), (int)(before + sums[2]),
                    (int)(before + sums[3]));
                continue;
            }
        }
#pragma unroll
        for (int k = 0; k < LABEL_SCAN_ITEMS; ++k) {
            if (i + k < end) {
                out[i + k] = before + sums[k];
            }
        }
    }
    if (threadIdx.x == 0) {
        totals[blockIdx.x] = carry;
    }
}

template <typename T>
__global__ void label_scan(T* values, T* __restrict__ totals, const long long n,
                           const long long seg)
{
    label_scan_segment<T>(values, totals, n, seg, [values](long long i) { return values[i]; });
}

template <typename T>
__global__ void label_scan_offsets(const T* __restrict__ totals, T* __restrict__ offsets,
                                   const int segments)
{
    __shared__ T warp_sums[32];
    T carry = 0;
    for (int base = 0; base < segments; base += 1024) {
        const int i = base + threadIdx.x;
        const T t = i < segments ? totals[i] : T(0);
        const T v = label_block_scan<T, 1024>(t, carry, warp_sums);
        if (i < segments) {
            offsets[i] = v - t;
        }
    }
    if (threadIdx.x == 0) {
        offsets[segments] = carry;
    }
}

// -- 4. compress, flag and count the roots ----------------------------------------------------
// Path compression, and the scan of the root flags with label_scan's segments (label_scan's
// first pass, the flags made on the way): counts[p] is the number of roots of p's segment up to
// p; label_scan_offsets finishes the scan.

template <typename I>
__global__ void label_flatten(I* parent, I* __restrict__ counts, I* __restrict__ totals,
                              const long long n, const long long seg)
{
    label_scan_segment<I>(counts, totals, n, seg, [parent](long long p) {
        const I v = parent[p];
        if (v < 0) {
            return I(0);
        }
        // other threads shorten paths meanwhile; every value read is still an ancestor
        I r = v;
        I q = parent[r];
        while (q != r) {
            r = q;
            q = parent[r];
        }
        if (r != v) {
            parent[p] = r;
        }
        return I(r == p);
    });
}

// -- 5. labels ----------------------------------------------------------------------------------
// (counts, offsets, seg) is the scan of the root flags (section 3): the label of root r is its
// rank, label_scanned(counts, offsets, seg, r). The output may be the parent array itself (each
// thread reads its own parent before writing its label).

template <typename I, typename O>
__global__ void __launch_bounds__(LABEL_TILE_X * LABEL_BLOCK_Y, 6)
label_write(const I* parent, const I* __restrict__ counts, const I* __restrict__ offsets,
            const long long seg, O* out, const I n0, const I n1, const I n2, const I n3,
            const I o0, const I o1, const I o2, const I o3)
{
    label_tile_pixels(n0, n1, n2, n3, [&](const I i0, const I i1, const I row, const I col, int) {
        const I v = parent[((i0 * n1 + i1) * n2 + row) * n3 + col];
        out[i0 * o0 + i1 * o1 + row * o2 + col * o3] =
            v < 0 ? O(0) : O(label_scanned(counts, offsets, seg, (long long)v));
    });
}

// -- 6. a chunk's labels and what the chunked merge needs of it ----------------------------------
// label_write into the parent array itself (C order, type I), writing on the way the chunk's
// summary. Its segments, in order: for each real axis a (the last 4 - first_axis of the four),
// the face at index 0 then the face at index n_a - 1, each in C order over the other axes (a
// pixel on both, n_a == 1, goes to both); then, for each line along the last axis in C order,
// the labels numbered up to the line's end (the rank at its last pixel), which tells the merge
// how many labels start on each line. (counts, offsets, seg) is the scan of the root flags.

// Where segment y of a summary starts: the sizes of the faces before it (axis first_axis + y / 2
// of the four; an axis's face holds total / n_axis pixels). Only face pixels and the lines' last
// pixels ask: not inlined, so that its divisions take no registers from the other pixels' path.
template <typename I>
__device__ __noinline__ I label_summary_at(const int y, const int first_axis, const I total,
                              const I n0, const I n1, const I n2, const I n3)
{
    I at = 0;
#pragma unroll
    for (int s = 0; s < 2 * 4; ++s) {
        const int axis = first_axis + s / 2;
        if (s >= y || axis > 3) {
            break;
        }
        at += total / (axis == 0 ? n0 : axis == 1 ? n1 : axis == 2 ? n2 : n3);
    }
    return at;
}

// For a batch (batch nonzero: axis 0 numbers the chunks, first_axis >= 1), each chunk's labels
// count from 1 (its roots after those of the chunks before it) and its summary follows the
// summaries of the chunks before it.
//
// 8 blocks per SM for 32-bit indices (12% faster over 16 chunks of 2048^2 than the 40 registers
// NVRTC chose), 6 for 64-bit ones, which would spill at 32 registers.
template <typename I>
__global__ void __launch_bounds__(LABEL_TILE_X * LABEL_BLOCK_Y, sizeof(I) == 4 ? 8 : 6)
label_write_summary(I* parent, const I* __restrict__ counts, const I* __restrict__ offsets,
                    const long long seg, I* __restrict__ summaries,
                    const I n0, const I n1, const I n2, const I n3, const int first_axis,
                    const int batch)
{
    const I total = batch ? n1 * n2 * n3 : n0 * n1 * n2 * n3;  // one chunk's pixels
    label_tile_pixels(n0, n1, n2, n3, [&](const I i0, const I i1, const I row, const I col, int) {
        const I chunk = batch ? i0 : I(0);
        const I line = ((batch ? I(0) : i0) * n1 + i1) * n2 + row;  // in the chunk
        const I p = (i0 * n1 + i1) * n2 * n3 + row * n3 + col;
        const I v = parent[p];
        // the roots of the chunks before this one
        const I before = chunk ? I(label_scanned(counts, offsets, seg,
                                                 (long long)chunk * total - 1)) : I(0);
        const I label = v < 0 ? I(0) : I(label_scanned(counts, offsets, seg, (long long)v)) - before;
        parent[p] = label;
        // where the chunk's summary starts, and its lines' part: asked by face pixels and the
        // lines' last pixels only
        const auto lines_at = [&]() {
            return label_summary_at(2 * (4 - first_axis), first_axis, total, n0, n1, n2, n3);
        };
        const auto summary = [&]() { return summaries + (chunk ? chunk * (lines_at() + total / n3)
                                                               : I(0)); };
        if (col == n3 - 1) {
            summary()[lines_at() + line] =
                I(label_scanned(counts, offsets, seg, (long long)p)) - before;
        }
        const I c[4] = {i0, i1, row, col};
        const I n[4] = {n0, n1, n2, n3};
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const bool low = c[a] == 0;
            const bool high = c[a] == n[a] - 1;
            if (a < first_axis || !(low || high)) {
                continue;
            }
            I e = 0;  // the pixel's place in the face: C order over the chunk's other axes
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                if (b != a && (b > 0 || !batch)) {
                    e = e * n[b] + c[b];
                }
            }
            const int y = 2 * (a - first_axis);
            if (low) {
                summary()[label_summary_at(y, first_axis, total, n0, n1, n2, n3) + e] = label;
            }
            if (high) {
                summary()[label_summary_at(y + 1, first_axis, total, n0, n1, n2, n3) + e] = label;
            }
        }
    });
}

// label_write_summary's summary alone, without the labels: one thread per summary element of
// each chunk (chunk = idx / size, size = the faces then total / n3 lines), reading the root of
// the pixel it stands for. The labels are written later, already global (label_write_through).
template <typename I>
__global__ void label_summary(const I* __restrict__ parent, const I* __restrict__ counts,
                              const I* __restrict__ offsets, const long long seg,
                              I* __restrict__ summaries, const I n0, const I n1, const I n2,
                              const I n3, const int first_axis, const int batch,
                              const long long size)
{
    const I total = batch ? n1 * n2 * n3 : n0 * n1 * n2 * n3;  // one chunk's pixels
    const I n[4] = {n0, n1, n2, n3};
    const long long chunks = batch ? (long long)n0 : 1;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < chunks * size;
         idx += step) {
        const I chunk = (I)(idx / size);
        long long e = idx - (long long)chunk * size;
        I c[4] = {batch ? chunk : I(0), 0, 0, 0};
        int y = 0;
        for (; y < 2 * (4 - first_axis); ++y) {  // which face, if any
            const I face = total / n[first_axis + y / 2];
            if (e < face) {
                break;
            }
            e -= face;
        }
        if (y < 2 * (4 - first_axis)) {  // pixel e of the face, C order over the other axes
            const int a = first_axis + y / 2;
            for (int b = 3; b >= first_axis; --b) {
                if (b != a) {
                    c[b] = (I)(e % n[b]);
                    e /= n[b];
                }
            }
            c[a] = y % 2 ? n[a] - 1 : I(0);
        } else {  // the last pixel of line e
            c[3] = n3 - 1;
            for (int b = 2; b >= first_axis; --b) {
                c[b] = (I)(e % n[b]);
                e /= n[b];
            }
        }
        const I p = ((c[0] * n1 + c[1]) * n2 + c[2]) * n3 + c[3];
        const I before = chunk ? I(label_scanned(counts, offsets, seg,
                                                 (long long)chunk * total - 1)) : I(0);
        I value;
        if (y < 2 * (4 - first_axis)) {
            const I v = parent[p];
            value = v < 0 ? I(0) : I(label_scanned(counts, offsets, seg, (long long)v)) - before;
        } else {
            value = I(label_scanned(counts, offsets, seg, (long long)p)) - before;
        }
        summaries[idx] = value;
    }
}

// -- 7. a block's lookup table, for the chunked relabel -----------------------------------------
// table[l] for the local labels l = 0..k of one block
// (chunkernels.kernels.label._host_merge._table computes the same on the host; the merge there
// explains the numbering): 0 for the background; for a label merged away (merged[j] == l, merged
// increasing), its component's label into[j]; else l + shift[i] - j, where i is the line the
// label is first met on (the first line whose count ends[i] reaches l) and j the number of
// merged-away labels below l. One thread per label.

template <typename T>
__device__ __forceinline__ long long label_lower_bound(const T* a, long long n, long long v)
{
    long long lo = 0;
    while (n > 0) {  // first index in [lo, lo + n) whose value is not below v
        const long long half = n / 2;
        if ((long long)a[lo + half] < v) {
            lo += half + 1;
            n -= half + 1;
        } else {
            n = half;
        }
    }
    return lo;
}

template <typename I, typename O>
__global__ void label_table(const I* __restrict__ ends, const long long lines,
                            const long long* __restrict__ shift,
                            const long long* __restrict__ merged,
                            const long long* __restrict__ into, const long long m,
                            O* __restrict__ table, const long long k)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x; l <= k; l += step) {
        long long value = 0;
        if (l > 0) {
            const long long j = label_lower_bound(merged, m, l);
            value = j < m && merged[j] == l ? into[j]
                                            : l + shift[label_lower_bound(ends, lines, l)] - j;
        }
        table[l] = O(value);
    }
}

// -- 8. the chunked merge on a device -----------------------------------------------------------
// chunkernels.kernels.label.merge_device: the merge of step 2 without leaving the device, for
// blocks labelled on one GPU. Every local label of every block is a *node*; its *rank* is its
// place in raster order of first pixels among all nodes (0-based), worked out from the per-line
// counts. The nodes that meet a chunk face are joined by a union-find whose roots are the nodes
// of smallest rank, and labels follow by counting the nodes merged away.
//
//   label_slots       per slot (a block's line along the last axis): the block's labels up to
//                     the line's end, and the labels starting on it, scattered into the table
//                     of (line of the array, chunk along the last axis) whose C order is
//                     raster order; label_scan of that table
//   label_face_nodes  per face pixel: its node's rank, put in a hash table of the face nodes
//                     (open addressing; a node on several face pixels takes one slot, which
//                     starts as its own parent), and the slot of each face pixel
//   label_face_unite  across every chunk boundary along one axis, the structure's pairs of face
//                     pixels are joined: a union-find over the slots whose links go from a root
//                     of larger rank to one of smaller rank, so each root is its component's
//                     node of smallest rank
//   label_face_roots  path compression; sets the bit of each node merged away (not a root) in a
//                     bitmap over all ranks
//   label_scan_popc   the scan of the bitmap's words' bit counts
//   label_renumber    a block's lookup table, local to global label, from all of the above
//
// A node of rank r that is kept gets label r + 1 - (nodes merged away of smaller rank); one
// merged away gets its root's label. Nothing is sorted: the host never waits, and the work
// grows with the face pixels (and, for the bitmap, with the nodes there can be, a bit each;
// past merge_device's BITMAP_BYTES, with the nodes there are, which the host waits for).

// The rank of label l of a block whose slots are ends[s0 .. s0 + lines); the scan (raster,
// offsets, seg) gives every slot's labels up to its end in raster order over all blocks.
struct label_raster {
    const long long* local;
    const long long* offsets;
    long long seg;
    const long long* segment;
};

__device__ __forceinline__ long long label_rank(const long long* ends, const label_raster raster,
                                                long long s0, long long lines, long long l)
{
    const long long s = s0 + label_lower_bound(ends + s0, lines, l);
    return label_scanned(raster.local, raster.offsets, raster.seg, raster.segment[s]) - ends[s] -
           1 + l;
}

template <typename T>
__global__ void label_slots(const T* __restrict__ values, const long long* __restrict__ ends_at,
                            const unsigned char* __restrict__ head,
                            const long long* __restrict__ segment,
                            long long* __restrict__ ends, long long* __restrict__ counts,
                            const long long slots)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x; s < slots; s += step) {
        const long long e = values[ends_at[s]];
        ends[s] = e;
        counts[segment[s]] = head[s] ? e : e - (long long)values[ends_at[s] - 1];
    }
}

// The hash table of face nodes: keys (ranks, LABEL_EMPTY where free) and parent, mask + 1 slots
// (a power of two, at least twice the face pixels), linear probing from a multiplicative hash.
#define LABEL_EMPTY (-1ll)

__device__ __forceinline__ long long label_slot_of(const long long r, const unsigned long long mask)
{
    unsigned long long h = (unsigned long long)r * 0x9E3779B97F4A7C15ull;
    return (long long)((h ^ (h >> 29)) & mask);
}

// The slot of rank r, or -1 if no face pixel has it.
__device__ __forceinline__ long long label_find_slot(const long long* __restrict__ keys,
                                                     const unsigned long long mask,
                                                     const long long r)
{
    for (long long slot = label_slot_of(r, mask);; slot = (slot + 1) & (long long)mask) {
        const long long k = keys[slot];
        if (k == r) {
            return slot;
        }
        if (k == LABEL_EMPTY) {
            return -1;
        }
    }
}

template <typename T>
__global__ void label_face_nodes(const T* __restrict__ values,
                                 const long long* __restrict__ face_at,
                                 const long long* __restrict__ face_block,
                                 const long long* __restrict__ first,
                                 const long long* __restrict__ ends,
                                 const long long* __restrict__ raster,
                                 const long long* __restrict__ raster_offsets,
                                 const long long raster_seg, const long long* __restrict__ segment,
                                 long long* keys, long long* __restrict__ parent,
                                 long long* __restrict__ at, const unsigned long long mask,
                                 const long long faces)
{
    const label_raster scan = {raster, raster_offsets, raster_seg, segment};
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x; f < faces; f += step) {
        const long long l = values[face_at[f]];
        long long slot = -1;
        if (l != 0) {
            const long long b = face_block[f];
            const long long r = label_rank(ends, scan, first[b], first[b + 1] - first[b], l);
            for (slot = label_slot_of(r, mask);; slot = (slot + 1) & (long long)mask) {
                const long long old = (long long)atomicCAS(
                    reinterpret_cast<unsigned long long*>(keys) + slot,
                    (unsigned long long)LABEL_EMPTY, (unsigned long long)r);
                if (old == LABEL_EMPTY) {
                    parent[slot] = slot;  // the node's first face pixel
                    break;
                }
                if (old == r) {
                    break;
                }
            }
        }
        at[f] = slot;
    }
}

// Join the trees of slots a and b: the root of larger rank (keys) is linked under the other.
// A link is made only on a root that is still one (compare-and-swap), else it is tried again
// from the new roots; every link goes to a smaller rank, so the roots keep the smallest.
__device__ __forceinline__ void label_unite_ranked(long long* parent,
                                                   const long long* __restrict__ keys,
                                                   long long a, long long b)
{
    const volatile long long* vparent = parent;
    while (true) {
        a = label_find(vparent, a);
        b = label_find(vparent, b);
        if (a == b) {
            return;
        }
        if (keys[a] < keys[b]) {
            const long long t = a;
            a = b;
            b = t;
        }
        if ((long long)atomicCAS(reinterpret_cast<unsigned long long*>(parent) + a,
                                 (unsigned long long)a, (unsigned long long)b) == a) {
            return;
        }
    }
}

// The faces of one axis as two stacks of planes over the other axes (face pixel indices): low
// holds the last faces of the chunks before each boundary, high the first faces after it, both
// C-ordered with shape (n0, n1, n2, n3), n0 the boundaries and the planes seen in 3-D. Bit k of
// offsets is set when the structure joins a pixel to the one at plane offset (k / 9 - 1,
// k / 3 % 3 - 1, k % 3 - 1) across the boundary.
__global__ void label_face_unite(const long long* __restrict__ low,
                                 const long long* __restrict__ high,
                                 const long long* __restrict__ keys,
                                 const long long* __restrict__ at, long long* parent,
                                 const long long n0, const long long n1, const long long n2,
                                 const long long n3, const unsigned int offsets)
{
    const long long total = n0 * n1 * n2 * n3;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const long long a = at[low[e]];
        if (a < 0) {
            continue;
        }
        const long long c3 = e % n3;
        const long long c2 = (e / n3) % n2;
        const long long c1 = (e / (n3 * n2)) % n1;
        const long long c0 = e / (n3 * n2 * n1);
        for (unsigned int bits = offsets; bits; bits &= bits - 1u) {
            const int k = __ffs((int)bits) - 1;
            const long long j1 = c1 + k / 9 - 1, j2 = c2 + (k / 3) % 3 - 1, j3 = c3 + k % 3 - 1;
            if (j1 < 0 || j1 >= n1 || j2 < 0 || j2 >= n2 || j3 < 0 || j3 >= n3) {
                continue;
            }
            const long long b = at[high[((c0 * n1 + j1) * n2 + j2) * n3 + j3]];
            if (b >= 0) {
                label_unite_ranked(parent, keys, a, b);
            }
        }
    }
}

// Per slot of a node: its root, and its rank's bit in merged (a bitmap over the ranks, zeroed)
// when it is not a root.
__global__ void label_face_roots(long long* parent, const long long* __restrict__ keys,
                                 unsigned int* __restrict__ merged, const long long slots)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x; s < slots; s += step) {
        const long long r = keys[s];
        if (r == LABEL_EMPTY) {
            continue;
        }
        const long long root = label_find((const volatile long long*)parent, s);
        parent[s] = root;
        if (root != s) {
            atomicOr(merged + (r >> 5), 1u << (r & 31));
        }
    }
}

// label_scan's first pass over the bit counts of the bitmap's words.
template <typename T>
__global__ void label_scan_popc(const unsigned int* __restrict__ merged, T* values,
                                T* __restrict__ totals, const long long n, const long long seg)
{
    label_scan_segment<T>(values, totals, n, seg, [merged](long long i) {
        return T(__popc(merged[i]));
    });
}

// The nodes merged away of rank below r: the scan (away, offsets, seg) of the bitmap's words'
// counts up to r's word, and the bits below r's in it.
__device__ __forceinline__ long long label_away_below(const long long r,
                                                      const unsigned int* __restrict__ merged,
                                                      const long long* __restrict__ away,
                                                      const long long* __restrict__ away_offsets,
                                                      const long long away_seg)
{
    const long long w = r >> 5;
    return (w > 0 ? label_scanned(away, away_offsets, away_seg, w - 1) : 0) +
           __popc(merged[w] & ((1u << (r & 31)) - 1u));
}

// What the renumbering reads of the merge: the hash table of face nodes (keys, parent, mask),
// the bitmap of nodes merged away and the scan of its counts (away, away_offsets, away_seg).
struct label_merged {
    const long long* keys;
    const long long* parent;
    unsigned long long mask;
    const unsigned int* bits;
    const long long* away;
    const long long* away_offsets;
    long long away_seg;
};

// The global label of local label l > 0 of a block whose slots are ends[s0 .. s0 + lines).
__device__ __forceinline__ long long label_global(const long long* ends, const label_raster scan,
                                                  const long long s0, const long long lines,
                                                  const long long l, const label_merged m)
{
    long long r = label_rank(ends, scan, s0, lines, l);
    const long long slot = label_find_slot(m.keys, m.mask, r);
    if (slot >= 0) {  // a node on a face: its component's first
        r = m.keys[m.parent[slot]];
    }
    return r + 1 - label_away_below(r, m.bits, m.away, m.away_offsets, m.away_seg);
}

// table[l] for the local labels l = 0..min(k, bound) of one block, k its number of labels
// (read here: the host does not wait for it) and bound the table's last index; the merge's
// results as label_merged holds them.
template <typename O>
__global__ void label_renumber(const long long* __restrict__ ends,
                               const long long* __restrict__ raster,
                               const long long* __restrict__ raster_offsets,
                               const long long raster_seg, const long long* __restrict__ segment,
                               const long long s0, const long long lines,
                               const long long* __restrict__ keys,
                               const long long* __restrict__ parent,
                               const unsigned long long mask,
                               const unsigned int* __restrict__ bits,
                               const long long* __restrict__ away,
                               const long long* __restrict__ away_offsets,
                               const long long away_seg, O* __restrict__ table,
                               const long long bound)
{
    const label_raster scan = {raster, raster_offsets, raster_seg, segment};
    const label_merged m = {keys, parent, mask, bits, away, away_offsets, away_seg};
    const long long k = lines > 0 ? min(ends[s0 + lines - 1], bound) : 0;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x; l <= k; l += step) {
        table[l] = O(l > 0 ? label_global(ends, scan, s0, lines, l, m) : 0);
    }
}

// label_renumber for the chunks of a batch (label_summary), one chunk per blockIdx.y: chunk y
// is block b.p[y] of the grid, and its local label l goes to table[before + l], before being its
// batch's roots up to the chunk (the root scan counts, offsets, seg of the batch's forest): the
// table is indexed by a root's rank in the batch (label_write_through).
struct label_blocks {
    long long p[LABEL_BATCH];
};

template <typename I, typename O>
__global__ void label_renumber_batch(const long long* __restrict__ ends,
                                     const long long* __restrict__ raster,
                                     const long long* __restrict__ raster_offsets,
                                     const long long raster_seg,
                                     const long long* __restrict__ segment,
                                     const long long* __restrict__ first, const label_blocks b,
                                     const I* __restrict__ counts, const I* __restrict__ offsets,
                                     const long long seg, const long long total,
                                     const long long* __restrict__ keys,
                                     const long long* __restrict__ parent,
                                     const unsigned long long mask,
                                     const unsigned int* __restrict__ bits,
                                     const long long* __restrict__ away,
                                     const long long* __restrict__ away_offsets,
                                     const long long away_seg, O* __restrict__ table,
                                     const long long bound)
{
    const label_raster scan = {raster, raster_offsets, raster_seg, segment};
    const label_merged m = {keys, parent, mask, bits, away, away_offsets, away_seg};
    const long long chunk = blockIdx.y;
    const long long s0 = first[b.p[chunk]], lines = first[b.p[chunk] + 1] - s0;
    const long long before = chunk ? (long long)label_scanned(counts, offsets, seg,
                                                              chunk * total - 1) : 0;
    const long long k = lines > 0 ? min(ends[s0 + lines - 1], bound) : 0;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x + 1; l <= k; l += step) {
        table[before + l] = O(label_global(ends, scan, s0, lines, l, m));
    }
}

// Every pixel of a batch (its forest: parent, and the scan of its root flags) through the batch's
// table (label_renumber_batch), flat: out[p] = table[rank of p's root]. out may be the parent
// array itself (each thread reads its own parents before writing). Four pixels a thread, read
// as one vector when the parents allow (32-bit, 16-byte aligned; CuPy's allocations are), so
// that each thread has four loads in flight.
template <typename I, typename O>
__device__ __forceinline__ O label_through(const I v, const I* __restrict__ counts,
                                           const I* __restrict__ offsets, const long long seg,
                                           const O* __restrict__ table)
{
    return v < 0 ? O(0) : table[label_scanned(counts, offsets, seg, (long long)v)];
}

template <typename O>
struct alignas(4 * sizeof(O)) label_quad {
    O v[4];
};

template <typename I, typename O>
__global__ void __launch_bounds__(256, 8)
label_write_through(const I* parent, const I* __restrict__ counts,
                                    const I* __restrict__ offsets, const long long seg,
                                    const O* __restrict__ table, O* out, const long long n)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long quads = n / 4;
    long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (sizeof(I) == 4) {
        const bool quad_out =
            sizeof(O) == 4 && (reinterpret_cast<unsigned long long>(out) & 15ull) == 0;
        if ((reinterpret_cast<unsigned long long>(parent) & 15ull) == 0) {
            for (; q < quads; q += step) {
                const int4 v = reinterpret_cast<const int4*>(parent)[q];
                const O a = label_through<I, O>(I(v.x), counts, offsets, seg, table);
                const O b = label_through<I, O>(I(v.y), counts, offsets, seg, table);
                const O c = label_through<I, O>(I(v.z), counts, offsets, seg, table);
                const O d = label_through<I, O>(I(v.w), counts, offsets, seg, table);
                if (quad_out) {
                    reinterpret_cast<label_quad<O>*>(out)[q] = label_quad<O>{{a, b, c, d}};
                } else {
                    out[4 * q] = a;
                    out[4 * q + 1] = b;
                    out[4 * q + 2] = c;
                    out[4 * q + 3] = d;
                }
            }
            q = 4 * quads + (long long)blockIdx.x * blockDim.x + threadIdx.x;  // the tail
        }
    }
    for (; q < n; q += step) {
        out[q] = label_through<I, O>(parent[q], counts, offsets, seg, table);
    }
}

// out[i] = table[labels[i]]: a block's local labels through its table, both C-ordered.
template <typename I, typename O>
__global__ void label_lookup(const I* __restrict__ labels, const O* __restrict__ table,
                             O* __restrict__ out, const long long n)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = table[labels[i]];
    }
}
