"""Tests of the demo training job and fault injection (deploy/demo)."""
