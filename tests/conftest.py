"""Session-wide test settings.

``topo run`` writes its status file to the user's state directory when
``status.path`` is null; the tests' runs write to a temporary one instead
(subprocesses inherit it).
"""
from __future__ import annotations

import os
import tempfile

os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="topo-test-state-")
