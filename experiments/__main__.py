"""`python -m experiments ...` is the `syncbench` command."""

from experiments.cli import main

raise SystemExit(main())
