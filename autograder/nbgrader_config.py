"""nbgrader configuration of the course.

nbgrader's "source" is solutions/ and its "release" is notebooks/:
    solutions/<id>/<id>.ipynb  --make release-->  notebooks/<id>/<id>.ipynb
Grading folders (submitted/, autograded/, feedback/, the gradebook) live outside git:
`make grade` puts them in the OUT folder the instructor passes. Run nbgrader commands
from this folder (`cd autograder && nbgrader ...`) so this file is found.
"""
import os
import sys

c = get_config()  # noqa: F821 - provided by nbgrader

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))    # for autograder.feedback
c.CourseDirectory.course_id = "zero-by-hand"
c.CourseDirectory.root = os.environ.get("ZEROCOURSE_NBGRADER_ROOT", os.path.dirname(_here))
# Absolute: a grading OUT folder needs no solutions/ (nor a link to it) beside feedback/.
c.CourseDirectory.source_directory = os.path.join(os.path.dirname(_here), "solutions")
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.db_url = os.environ.get(
    "ZEROCOURSE_GRADEBOOK", "sqlite:///" + os.path.join(_here, "gradebook.db"))

# Per-cell limit while autograding. A launch() defaults to 60 s (ZEROCOURSE_TIMEOUT) and a stuck
# collective errors after 20 s (ZEROCOURSE_COLLECTIVE_TIMEOUT); a test cell stops at its first
# failure, so one cell never waits for more than one launch timeout.
c.Execute.timeout = int(os.environ.get("ZEROCOURSE_CELL_TIMEOUT", 150))
c.Execute.interrupt_on_timeout = True

# Sandboxed grading (autograder/grade.py sets these): the kernel lives in its own network
# namespace, so it talks to nbgrader over Unix sockets instead of TCP.
if os.environ.get("ZEROCOURSE_KERNEL_IPC"):
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.environ["ZEROCOURSE_KERNEL_IPC"]

# Graded test cells run in a verdict kernel that never runs learner code, the rest in the
# learner's kernel (autograder/split_execute.py): the score comes from code the learner
# never touched.
c.Autograde.autograde_preprocessors = [
    "autograder.split_execute.SplitExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
    # Last, once scores are saved: OUT/autograded/, which formgrader shows, runs nothing in a
    # browser (scripts, event handlers, javascript: URLs, iframes, active SVG removed).
    "autograder.sanitize.SanitizeLearnerContent",
]

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Feedback must not show the hidden tests' source, neither in the cells nor quoted by tracebacks.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "autograder.feedback.HideTestTracebacks",
    "autograder.sanitize.SanitizeLearnerContent",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# The exchange (deploy/hub/): collect refuses an inbound entry that is not owned by the
# learner it names, instead of nbgrader's warning (autograder/exchange.py).
c.ExchangeFactory.collect = "autograder.exchange.OwnerCheckedCollect"
