"""GPU tests: the fake NVML, the NVML source and the node-agent GPU activities."""
