"""TRUSTED, pure: Nsight Compute's view of a replay, read and explained (`--profile`).

`ncu` holds the command a profiled replay runs under and reads what it printed (hostile text: the
kernel names are a student's); `explain` turns the student's figures beside the reference's into
the one or two differences that explain most of the gap. Nothing here imports torch, the judge or
a student's code; grader.judge.profiling runs the replays."""
