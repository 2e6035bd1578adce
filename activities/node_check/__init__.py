"""The node check's program (run inside the check job on the node) and its tools' output parsers."""
