"""What a CI run says when the runner stopped the check, or the assignment is broken: not the
student's code either way.

A CI check never grades with a weaker sandbox than asked (grader.sandbox.process.as_asked), so a
runner that cannot build it (GitHub's ubuntu-24.04 refuses unprivileged user namespaces until a
sysctl lifts them; a container job's seccomp filter refuses them to root too) stops every
student's check the same way, on every push. What the run's first screen says, in this order:
whose fault it is (the runner's, not the student's code), the one fix for the course staff on
this platform (the setting, or the workflow line), and that pushing again will not help; the
grader's own finding (what it tried) follows, for the staff.

Every platform gets the same words, shaped to where they land: an `::error` annotation and the
job summary (`--ci github`, a Classmoji or other CI job's log), Classroom 50's annotation,
which keeps 300 characters (the fix comes before anything that may be cut).

A course error (grader.spec.CourseCodeError: the course's own code, a spec's make_inputs, truth or
baseline, raised while grading) stops every push the same way too, so it is said the same way:
the assignment's fault, the staff's fix (mend the line named, then release again), and that
pushing again will not help.
"""

from __future__ import annotations

from grader.sanitize import for_markdown, one_line
from grader.spec import CourseCodeError

USERNS_SYSCTL = "kernel.apparmor_restrict_unprivileged_userns"
SYSCTL_LINE = f"sudo -n sysctl -w {USERNS_SYSCTL}=0"
TITLE = "The runner stopped this check (not your code)"
CLASSROOM50_LIMIT = 300  # what Classroom 50 keeps of an annotation
FAULT = "The runner, not your code, stopped this check: nothing of your work was graded."
STUDENT = ("Do not push again for this: every push stops the same way until the course staff fix the runner. "
           "Tell them, with a link to this page.")

# the one fix for the course staff, by where the check ran
FIXES = {
    "github": (f"Course staff: in .github/workflows/grader.yml keep the step `{SYSCTL_LINE}` before `grader check` "
               "(`grader release` writes it), with runs-on: ubuntu-latest and no container (a container's seccomp "
               f"filter refuses namespaces even to root); on a self-hosted runner set {USERNS_SYSCTL}=0 once, as root, "
               "in /etc/sysctl.d."),
    "classroom50": (f"Course staff: runs-on ubuntu-latest, no container (the autograder lifts {USERNS_SYSCTL} with "
                    "sudo there); self-hosted: set it to 0 once, as root."),
    "classmoji": (f"Course staff: begin the Classmoji test's setup command with `{SYSCTL_LINE};` (GitHub's hosted "
                  f"runners); on a self-hosted runner set {USERNS_SYSCTL}=0 once, as root, in /etc/sysctl.d."),
    "ci": (f"Course staff: before `grader check`, run `{SYSCTL_LINE}` (GitHub's hosted runners, no container); on a "
           f"self-hosted runner set {USERNS_SYSCTL}=0 once, as root, in /etc/sysctl.d."),
}


COURSE_TITLE = "The assignment is broken (not your code)"
COURSE_FAULT = "The assignment is broken, not your code: nothing of your work was graded."
COURSE_FIX = ("Course staff: mend the course's code at the file and line named below (`grader course check` "
              "names it too), then release the assignment again.")
COURSE_STUDENT = ("Do not push again for this: every push stops the same way until the course staff mend the "
                  "assignment. Tell them, with a link to this page.")


def is_course_error(error: Exception) -> bool:
    """The check stopped because the course's own code raised while grading (the spec's file,
    function and line in its message), not the submission."""
    return isinstance(error, CourseCodeError)


def stops_every_push(error: Exception) -> bool:
    """A stop no push of the student's can change: the runner's, or the assignment's."""
    return is_runner_stop(error) or is_course_error(error)


def title(error: Exception) -> str:
    return COURSE_TITLE if is_course_error(error) else TITLE


def is_runner_stop(error: Exception) -> bool:
    """The check stopped because of the machine it ran on, not the submission: the sandbox
    asked for cannot be built here."""
    from grader.sandbox.isolation import SandboxError

    return isinstance(error, SandboxError)


def words(platform: str, error: Exception) -> tuple[str, str, str]:
    """(whose fault, the staff's fix, the student's instruction) for a stop on `platform`
    (github, classroom50, classmoji or ci)."""
    if is_course_error(error):
        return COURSE_FAULT, COURSE_FIX, COURSE_STUDENT
    # every runner stop today is a sandbox the runner cannot build: one fix
    return FAULT, FIXES.get(platform, FIXES["ci"]), STUDENT


def annotation(platform: str, error: Exception, limit: int = 1000) -> str:
    """The `::error` annotation's message: the fault, the fix, the student's instruction, then
    the grader's finding, cut at `limit` (the finding goes first where it must)."""
    fault, fix, student = words(platform, error)
    head = f"{fault} {fix} {student}"
    if len(head) >= limit:
        return one_line(head, limit)
    return one_line(f"{head} The grader found: {error}", limit)


def classroom50_annotation(error: Exception) -> str:
    """Classroom 50's annotation, within the 300 characters it keeps: the fault, the fix, the
    student's instruction; the finding is in the job summary (a course error's file and line are
    said here too, after them, where they fit)."""
    if isinstance(error, CourseCodeError):
        return one_line(f"The assignment is broken, not your code. Course staff: mend {error.where} "
                        f"({error.function}()) and release again. Do not push again for this; tell the staff.",
                        CLASSROOM50_LIMIT)
    fault = "The runner, not your code, stopped this check."
    _, fix, _ = words("classroom50", error)
    return one_line(f"{fault} {fix} Do not push again for this; tell the staff.", CLASSROOM50_LIMIT)


def summary_markdown(platform: str, error: Exception) -> str:
    """The job summary's section: the same three sentences first (our own words, Markdown as
    they are), the finding after them (escaped: it may name a path of the student's)."""
    fault, fix, student = words(platform, error)
    whose = "the assignment is broken" if is_course_error(error) else "the runner stopped this check"
    return (f"## Triton kernels: {whose}, not your code\n\n"
            f"**{fault}**\n\n{fix}\n\n**Students:** {student}\n\n"
            f"What the grader found (for the course staff): {for_markdown(str(error), 2000)}\n\n")
