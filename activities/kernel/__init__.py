"""The node's kernel log: readers of ``/dev/kmsg`` and of a file-backed source, the line parser, the SXid table."""
