"""CUDA backend: CUDA C generation, NVRTC compilation and the driver-API runtime."""
