"""A third-party strategy package, as a plug-in author would ship it: `chain` registers through the entry point
group `syncbench.strategies` (see the .dist-info beside this folder), not through strategies/__init__.py."""
