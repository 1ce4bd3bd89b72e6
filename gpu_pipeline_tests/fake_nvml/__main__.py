"""``python -m gpu_pipeline_tests.fake_nvml DIR``: build the stand-in libnvidia-ml.so.1 into DIR."""

import sys
from pathlib import Path

from gpu_pipeline_tests.fake_nvml import build

if len(sys.argv) != 2:
    sys.exit("usage: python -m gpu_pipeline_tests.fake_nvml DIR")
print(build(Path(sys.argv[1])))
