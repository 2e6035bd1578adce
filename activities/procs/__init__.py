"""procs: a job's rank processes from /proc and their Python stacks (py-spy), read by the node agent."""
