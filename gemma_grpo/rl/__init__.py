"""The RL library: rollout, rewards in the loop, losses, the learner and its RLCluster."""
