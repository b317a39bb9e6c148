"""TRUSTED: the timing stage's own room. `decision` is the one pure rule that turns every
measurement of a function's calls into a verdict; `confirmation` holds the grader's clock's
arithmetic and the words of a held figure. The stage that gathers the evidence is
grader.judge.perf; the replay's processes are grader.judge.replay_stage and replay_process."""
