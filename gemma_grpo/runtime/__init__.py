"""Where a run lives: the mesh, processes, storage, the work-dir lease, checkpoints, metrics."""
