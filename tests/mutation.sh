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
  "grader.judge.x_judge_call*" "grader.judge.x_judge_runs*" "grader.judge.x__judge_parts*" "grader.judge.x__modified_input*" \
  "grader.judge.x__delivery*" "grader.judge.x__compare*" "grader.judge.x__finite_max*" "grader.judge.x__spec_explanation*" \
  "grader.memcheck.x__check*" "grader.memcheck.x__owner*" "grader.memcheck.x__nearest*" \
  "grader.integrity.*" \
  "grader.batch.x_job_key*" "grader.batch.x_spec_fingerprint*" "grader.batch.x_is_reusable*" "grader.batch.x_plan_batch*" \
  "grader.batch.x_store_record*" "grader.batch.x_read_records*" \
  "grader.grade.xǁ_Integrityǁ*" "grader.grade.x__few*" "grader.grade.x__trivial*" \
  "grader.scoring.*" "grader.activity.*" \
  "grader.perf.x_call_times*" "grader.perf.x_round_ratios*" "grader.perf.x_ratio_estimate*" "grader.perf.x_needs_more_rounds*" \
  "grader.perf.x_floor_ms*" "grader.perf.x__conduct*" "grader.perf.x__verdict*" \
  > mutants.log 2>&1 || true
mutmut results
