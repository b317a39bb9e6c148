"""Getting an assignment to students and into their CI: the student kit, GitHub Actions
output, the Gradescope autograder."""
