"""Benchmarks and checks as plain commands: transport p2p, collectives (`verify`, `bench`)."""
