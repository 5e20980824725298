"""Whether this host has an NVIDIA GPU: `gpu`-marked tests skip only when it has none."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def nvidia_gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and "GPU" in listing.stdout


requires_gpu = pytest.mark.skipif(not nvidia_gpu_present(), reason="no NVIDIA GPU on this host")
