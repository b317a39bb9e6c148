"""A class: fetching the students' repos, jobs (a student x an assignment), their records in
the class folder, the executors that run them, and the class views (dashboard, gradebooks,
similarity, leaderboard)."""
