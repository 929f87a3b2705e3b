"""What to run: sweep files (TOML) validated into a Sweep and expanded into RunSpecs; the shipped sweeps."""
