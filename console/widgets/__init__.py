"""One widget per panel of the console; each renders from a RunState, a GpuSnapshot or a file."""
