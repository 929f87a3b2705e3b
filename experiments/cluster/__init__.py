"""Where ranks run: the Ray session (embedded or an existing cluster) and the group of worker actors."""
