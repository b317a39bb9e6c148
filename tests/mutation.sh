#!/bin/sh
# Mutation testing of the grade-deciding code with mutmut (slow: not part of the default run).
# Mutates the functions below, runs the focused tests of pyproject.toml's [tool.mutmut] against
# each mutant, and prints every mutant that survived. See docs/testing.md for the score and triage.
#   sh tests/mutation.sh            # from the repository root; 6 to 12 minutes on 2 cores
set -e
cd "$(dirname "$0")/.."
rm -rf mutants  # a fresh copy: results cached from other sources or tests would be stale
# one thread per test process: mutmut forks its workers, and a forked OpenMP pool deadlocks
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mutmut run --max-children "${JOBS:-2}" \
  "grader.judge.verdict.x_judge_call*" "grader.judge.verdict.x_judge_runs*" "grader.judge.verdict.x__judge_parts*" "grader.judge.verdict.x__modified_input*" \
  "grader.judge.verdict.x__delivery*" "grader.judge.verdict.x__compare*" "grader.judge.verdict.x__finite_max*" "grader.judge.verdict.x__spec_explanation*" \
  "grader.worker.memcheck.x__check*" "grader.worker.memcheck.x__owner*" "grader.worker.memcheck.x__nearest*" \
  "grader.judge.integrity.*" \
  "grader.batch.jobs.x_job_key*" "grader.batch.jobs.x_spec_fingerprint*" "grader.batch.store.x_is_reusable*" "grader.batch.run.x_plan_batch*" \
  "grader.batch.store.x_store_record*" "grader.batch.store.x_read_records*" \
  "grader.judge.scoring.*" "grader.judge.activity.*" \
  "grader.judge.perf.x_call_times*" "grader.judge.perf.x_round_ratios*" "grader.judge.perf.x_ratio_estimate*" "grader.judge.perf.x_needs_more_rounds*" \
  "grader.judge.perf.x_floor_ms*" "grader.judge.perf.x__conduct*" "grader.judge.perf.x__verdict*" \
  "grader.judge.timing.confirmation.*" "grader.judge.timing.decision.*" \
  > mutants.log 2>&1 || true
mutmut results
