"""scipy.ndimage's functions on NumPy, CuPy and Dask arrays, PyTorch tensors and xarray
DataArrays (the output type follows the input; Dask arrays are processed chunk by chunk).

>>> import numpy as np, dask.array as da
>>> from chunkernels import ndimage
>>> x = da.from_array(np.arange(16.0).reshape(4, 4), chunks=2)
>>> ndimage.uniform_filter(x, 3, mode="wrap").compute()[0]
array([5., 4., 5., 6.])
"""

from chunkernels.ndimage._filters import convolve as convolve
from chunkernels.ndimage._filters import convolve1d as convolve1d
from chunkernels.ndimage._filters import correlate as correlate
from chunkernels.ndimage._filters import correlate1d as correlate1d
from chunkernels.ndimage._filters import gaussian_filter as gaussian_filter
from chunkernels.ndimage._filters import gaussian_filter1d as gaussian_filter1d
from chunkernels.ndimage._filters import gaussian_gradient_magnitude as gaussian_gradient_magnitude
from chunkernels.ndimage._filters import gaussian_laplace as gaussian_laplace
from chunkernels.ndimage._filters import laplace as laplace
from chunkernels.ndimage._filters import prewitt as prewitt
from chunkernels.ndimage._filters import sobel as sobel
from chunkernels.ndimage._filters import uniform_filter as uniform_filter
from chunkernels.ndimage._filters import uniform_filter1d as uniform_filter1d
from chunkernels._shared.filters import FilterArgumentError as FilterArgumentError
from chunkernels._shared.filters import FilterAxisError as FilterAxisError
from chunkernels._shared.filters import FilterTypeError as FilterTypeError
from chunkernels._shared.filters import FilterZeroDivisionError as FilterZeroDivisionError
from chunkernels._shared.filters import NonFiniteError as NonFiniteError
from chunkernels._shared.interpolation import InterpolationError as InterpolationError
from chunkernels._shared.interpolation import NonFiniteZoomError as NonFiniteZoomError
from chunkernels._shared.interpolation import OutputTooLargeError as OutputTooLargeError
from chunkernels.ndimage._interpolation import resize as resize
from chunkernels.ndimage._interpolation import spline_filter as spline_filter
from chunkernels.ndimage._interpolation import spline_filter1d as spline_filter1d
from chunkernels.ndimage._interpolation import zoom as zoom
from chunkernels.ndimage._label import label as label
from chunkernels.kernels.label import LabelError as LabelError
from chunkernels.ndimage._measurements import area as area
from chunkernels.ndimage._measurements import center_of_mass as center_of_mass
from chunkernels.ndimage._measurements import extrema as extrema
from chunkernels.ndimage._measurements import find_objects as find_objects
from chunkernels.ndimage._measurements import histogram as histogram
from chunkernels.ndimage._measurements import labeled_comprehension as labeled_comprehension
from chunkernels.ndimage._measurements import maximum as maximum
from chunkernels.ndimage._measurements import maximum_position as maximum_position
from chunkernels.ndimage._measurements import mean as mean
from chunkernels.ndimage._measurements import measure as measure
from chunkernels.ndimage._measurements import median as median
from chunkernels.ndimage._measurements import minimum as minimum
from chunkernels.ndimage._measurements import minimum_position as minimum_position
from chunkernels.ndimage._measurements import standard_deviation as standard_deviation
from chunkernels.ndimage._measurements import sum as sum  # noqa: A004 - scipy.ndimage's alias
from chunkernels.ndimage._measurements import sum_labels as sum_labels
from chunkernels.ndimage._measurements import variance as variance
