"""The CUDA auto-scheduler: ``schedule.schedule_cuda`` and the kernel shapes it picks."""
