import sys

from chunkernels.cli import main

sys.exit(main())
