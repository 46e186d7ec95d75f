"""A disk that stopped answering, for the processes of one daemon test (tests/daemon/test_daemon_lifecycle.py).

Python imports `sitecustomize` from the path at start-up; a test puts this folder on PYTHONPATH for the
daemon it starts. Opening a safetensors file then blocks forever, as a read from a stalled disk would:
the daemon's load never ends, whatever the machine's speed.
"""

import threading

import safetensors


def _never_opens(*args, **kwargs):
    threading.Event().wait()


safetensors.safe_open = _never_opens
