# Triton's qa scripts are run as subprocesses (tests/support/triton_examples.py), never collected.
collect_ignore_glob = ["*/*.py"]
