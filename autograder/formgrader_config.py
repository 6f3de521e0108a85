"""Jupyter server settings of the server that shows formgrader (`make formgrader`, and the
instructor's server on the hub: deploy/hub/setup.sh loads this file).

    jupyter lab --config=autograder/formgrader_config.py

The course's nbgrader settings (autograder/nbgrader_config.py), plus what keeps a
submission's content from running in the instructor's browser:
- formgrader's exporter sanitizes every notebook it renders (autograder/sanitize.py), also
  one autograded by other means than `make grade` (formgrader's own Autograde button);
- a Content-Security-Policy that runs no inline script but the server's own
  (autograder/formgrader_csp.py).
"""
import os
import sys

c = get_config()  # noqa: F821 - provided by Jupyter

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_here))         # autograder.* for the server's process
load_subconfig(os.path.join(_here, "nbgrader_config.py"))  # noqa: F821

from autograder.formgrader_csp import configure  # noqa: E402

configure(c)
