"""A training run: the loop and what happens between steps, the RLCluster, trainers, optimizer."""
