// halo_gather: assemble a block extended by its halo in one launch, from the core block and the
// pieces of its neighbours. Used by the halo exchange (chunkernels/_halo.py) for CuPy blocks; the
// NumPy path does the same with slice assignments (buf[dest] = piece), which define the result.
//
// The extended buffer `dst` is C-contiguous, of shape plan.shape (padded to 4 dims with leading
// 1s). Along each axis a it is cut into plan.nseg[a] segments starting at plan.seg[a][s]; the
// pieces are the product of those segments (the core block is one of them), numbered in C order
// of their segment indices. Piece k starts at address plan.src[k] and has element strides
// plan.stride[k][.] (any view: sliced, transposed, reversed). Each thread copies elements of a
// row of dst (several, strided by the grid's width, so that splitting the row index into outer
// coordinates is paid once per row): it finds the segment of its row along the outer axes once,
// and along the inner axis per element (a few compares), then reads the piece holding it.
//
// The copy moves bits: W is an unsigned word of the element's size, so one instantiation serves
// every dtype of that size. The plan is passed by value (2880 bytes of kernel parameters) as a
// __grid_constant__, so indexing it with a run-time piece number reads the parameter bank and
// never copies it to local memory. The Python side builds it as 360 int64 (_halo.GATHER_WORDS).

#define HG_DIMS 4
#define HG_SEGS 8
#define HG_PIECES 64

struct HaloGatherPlan {
    long long shape[HG_DIMS];
    long long seg[HG_DIMS][HG_SEGS];
    long long nseg[HG_DIMS];
    long long src[HG_PIECES];
    long long stride[HG_PIECES][HG_DIMS];
};
static_assert(sizeof(HaloGatherPlan) == 360 * 8, "the layout _halo.py builds");

struct __align__(8) halo_word16 { unsigned long long lo, hi; };  // complex128

__device__ __forceinline__ int halo_segment(const HaloGatherPlan& plan, int axis, long long p) {
    int s = 0;
    while (s + 1 < plan.nseg[axis] && plan.seg[axis][s + 1] <= p) ++s;
    return s;
}

template <typename W>
__global__ void __launch_bounds__(256) halo_gather(W* __restrict__ dst,
                                                  const __grid_constant__ HaloGatherPlan plan)
{
    const long long cols = plan.shape[3];
    const long long rows = plan.shape[0] * plan.shape[1] * plan.shape[2];
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const long long p2 = r % plan.shape[2];
        const long long q = r / plan.shape[2];
        const long long p1 = q % plan.shape[1];
        const long long p0 = q / plan.shape[1];
        const int s0 = halo_segment(plan, 0, p0);
        const int s1 = halo_segment(plan, 1, p1);
        const int s2 = halo_segment(plan, 2, p2);
        const long long outer = (s0 * plan.nseg[1] + s1) * plan.nseg[2] + s2;
        const long long d0 = p0 - plan.seg[0][s0], d1 = p1 - plan.seg[1][s1],
                        d2 = p2 - plan.seg[2][s2];
        W* row = dst + r * cols;
        for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += (long long)gridDim.x * blockDim.x) {
            const int s3 = halo_segment(plan, 3, c);
            const long long k = outer * plan.nseg[3] + s3;
            const long long* st = plan.stride[k];
            const W* src = reinterpret_cast<const W*>(plan.src[k]);
            row[c] = src[d0 * st[0] + d1 * st[1] + d2 * st[2] + (c - plan.seg[3][s3]) * st[3]];
        }
    }
}
