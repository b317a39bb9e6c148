"""TRUSTED: the student's kernels timed where no student code runs.

A worker records the Triton launches of one call (grader.worker.launches); `launchrecord` reads that
record as hostile data and checks all of it; `runner` (in a process of its own that imports only
torch, Triton and this package: `python -m grader.replay`) loads the checked binaries, makes the
same launches on its own buffers, times them with its own events, and hands back its result (at
the judge's indices, told after the times, or whole for `grader verify`) for the judge to compare
with the truth.
"""
