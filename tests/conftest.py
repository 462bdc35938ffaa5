"""Suite-wide settings. Under CI (CI=true) hypothesis draws the same examples on every run, so a
submission's result does not depend on the luck of one draw; locally it explores afresh."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
