"""The leader and the beats: one worker's lease and its duties, every process's in-flight beats, redrive jobs."""
