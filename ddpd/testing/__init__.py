"""What ddpd's tests and benchmarks share, importable from an installed ddpd.

- ddpd.testing.baselines: plain-torch draws of each op's law, the baselines ddpd is timed
  against (each checked to draw its law by tests/tools/test_benchmark_baselines.py);
- ddpd.testing.timing: the one timer of the benchmarks (CUDA events or do_bench on a GPU,
  perf_counter after a warm-up on the CPU; medians of repeats);
- ddpd.testing.launches and ddpd.testing.sm90: the Triton ops' launches made and compiled
  for sm_90 without a GPU (Triton's driver stubbed).

The submodules are imported on demand: importing this package loads none of them.
"""
