"""A stand-in ``libnvidia-ml.so.1`` for tests on machines without an NVIDIA driver.

``fake_nvml.c`` implements the NVML entry points the NVML sampler reaches through the real pynvml,
with deterministic values configured by ``FAKE_NVML_*`` environment variables (documented at the top
of the C file). :func:`build` compiles it with gcc into ``DIR/libnvidia-ml.so.1``; a *new* process
started with ``LD_LIBRARY_PATH=DIR`` then loads it through pynvml's ``CDLL("libnvidia-ml.so.1")``
(the dynamic loader reads ``LD_LIBRARY_PATH`` at process start, and pynvml keeps the library it loaded
for the life of the process). By hand: ``python -m gpu_pipeline_tests.fake_nvml DIR``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"


def compiler() -> str | None:
    """Path of gcc, or ``None`` when it is not installed."""
    return shutil.which("gcc")


def build(dest_dir: Path) -> Path:
    """Compile the stand-in into ``dest_dir/libnvidia-ml.so.1`` and return its path."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("gcc is not installed: cannot build the stand-in libnvidia-ml.so.1")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / LIBRARY_NAME
    cmd = [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-o", str(out), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building {LIBRARY_NAME} failed ({' '.join(cmd)}):\n{proc.stderr}")
    return out
