"""Why ``apply`` checks operand chunks: Dask's ``map_blocks`` pairs blocks by position.

x is 2x4 with column chunks (1, 3); y, the row vector added to every row, is chunked (3, 1). Both
have two blocks along the shared axis, so ``map_blocks`` pairs them: a 1-column block of x with 3
values of y, a 3-column block of x with 1 value of y. NumPy broadcasting accepts both pairs, and
the result is silently wrong: other values, and 6 columns where 4 were declared.
docs/concepts.md includes this file.

    python examples/alignment.py
"""

import dask.array as da
import numpy as np

import chunkernels

# --8<-- [start:demo]
x = np.arange(8.0).reshape(2, 4)
y = np.arange(4.0) * 100
dx = da.from_array(x, chunks=(2, (1, 3)))
dy = da.from_array(y, chunks=((3, 1),))   # same length, other chunk boundaries

z = da.map_blocks(np.add, dx, dy, dtype=float)
wrong = z.compute()
print(z.shape, wrong.shape)                # (2, 4) declared, (2, 6) computed: no error

try:
    chunkernels.apply(dx, "broadcast_add", dy)
except chunkernels.AlignmentError as exc:
    print(exc)                             # says which axis, both chunkings, and the fix

z = chunkernels.apply(dx, "broadcast_add", dy, align=True)  # rechunks y to x's chunks
assert np.array_equal(z.compute(), x + y)
# --8<-- [end:demo]
assert wrong.shape == (2, 6), "Dask's map_blocks behaviour changed; update docs/concepts.md"
print("verified: align=True gives x + y")
