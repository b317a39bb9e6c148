"""UNTRUSTED: the code that runs inside the sandbox, beside the student's module.

Nothing here decides a grade. It imports only the shared codec (`grader.codec`) and the
worker protocol (`grader.protocol`) from the rest of the package, never the judge, the
specs or the plans, so nothing the trusted side keeps is within a student's reach.
"""
