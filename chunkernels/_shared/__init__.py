"""What kernels and front ends both need, below both: scipy's parameter rules and test inputs.

A kernel's ``validate`` and the public function in :mod:`chunkernels.ndimage` or
:mod:`chunkernels.signal` that runs it check the same arguments by the same rules; those rules
live here, once, so a kernel never imports a front end (as scikit-image's ``_shared`` sits below
its subpackages). Modules here import nothing above :mod:`chunkernels.cuda` (see the layer table
in ``tests/test_layers.py``).

* :mod:`chunkernels._shared.filters`: scipy.ndimage's filter arguments (modes, axes, origins,
  output dtypes, Gaussian weights).
* :mod:`chunkernels._shared.interpolation`: scipy.ndimage's spline orders and interpolation modes.
* :mod:`chunkernels._shared.cases`: random inputs for the kernels' ``cases`` (and
  :mod:`chunkernels.testing`).
"""
