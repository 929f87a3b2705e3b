"""Simulated clusters: the same strategy code on SimGrid, at up to thousands of ranks (`syncbench simulate`)."""
