"""`python -m experiments.gpu_check`: the GPU check (docs/gpu.md)."""

import sys

from experiments.gpu_check import main

sys.exit(main())
