"""The multi-host test bed's fixtures (multihost_testbed.py; other suites and bench/ import
that module, whose name is unique, with test/multihost on sys.path)."""
from multihost_testbed import multihost, multihost3  # noqa: F401 - fixtures
