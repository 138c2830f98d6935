"""CUDA backend: GPU scheduling, CUDA C generation and NVRTC compilation."""
