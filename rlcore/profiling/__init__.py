"""``[profiler]``: torch's profiler around chosen training steps in every worker process, and a summary
of where each process's time went (``rlcore.profiling.timeline``)."""
