"""pytest plugin the SWE-bench grader loads into the tests' pytest (``-p slime_harbor_guard``).

`slime-harbor swebench-tasks` copies this file into every task as tests/guard/slime_harbor_guard.py.
It runs inside the process of the code under test, so it cannot stop that code from tampering with
pytest; it makes tampering visible to the grader (tests/grade.py), which runs as root outside:

- every test report pytest delivers (node id, phase, outcome) is written as a JSON line to the
  pipe the grader handed down (``SLIME_HARBOR_GUARD_FD``), independent of the printed log, so a
  log the code under test forges (extra ``PASSED`` lines, an atexit summary) disagrees with it;
- pytest's report machinery (the functions and methods that build, deliver and print test
  reports) and the plugins implementing its report hooks are snapshotted when pytest is
  configured and compared when the session ends: code under test that patched them, or
  registered a plugin of its own, is reported as ``patched_runner``.

The grader treats a missing session record (the plugin disabled or its pipe closed) as tampering
too. Only the standard library and pytest's own modules are used: it runs in the repo's Python.
"""

import json
import os

import pytest

GUARD_FD_ENV = "SLIME_HARBOR_GUARD_FD"

# (module, class or None, attribute): what builds, delivers and prints a test's outcome.
WATCHED = [
    ("_pytest.runner", None, "runtestprotocol"),
    ("_pytest.runner", None, "call_and_report"),
    ("_pytest.runner", None, "call_runtest_hook"),
    ("_pytest.runner", None, "pytest_runtest_makereport"),
    ("_pytest.runner", "CallInfo", "from_call"),
    ("_pytest.reports", "TestReport", "from_item_and_call"),
    ("_pytest.reports", "TestReport", "__init__"),
    ("_pytest.reports", "BaseReport", "passed"),
    ("_pytest.reports", "BaseReport", "failed"),
    ("_pytest.reports", "BaseReport", "skipped"),
    ("_pytest.python", None, "pytest_pyfunc_call"),
    ("_pytest.python", "Function", "runtest"),
    ("_pytest.skipping", None, "pytest_runtest_makereport"),
    ("_pytest.terminal", "TerminalReporter", "pytest_runtest_logreport"),
    ("_pytest.terminal", "TerminalReporter", "short_test_summary"),
    ("_pytest.main", None, "pytest_runtestloop"),
    ("_pytest.main", "Session", "perform_collect"),
]
HOOKS = [
    "pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport",
    "pytest_report_teststatus", "pytest_runtest_call", "pytest_pyfunc_call", "pytest_runtestloop",
    "pytest_collection_modifyitems", "pytest_terminal_summary", "pytest_sessionfinish",
]


def _emit(record):
    try:
        fd = int(os.environ.get(GUARD_FD_ENV, "-1"))
        if fd >= 0:
            os.write(fd, (json.dumps(record) + "\n").encode())
    except (OSError, ValueError):
        pass


def _watched():
    import importlib

    found = {}
    for module, cls, attr in WATCHED:
        try:
            owner = importlib.import_module(module)
            if cls is not None:
                owner = getattr(owner, cls)
                value = owner.__dict__.get(attr)
            else:
                value = getattr(owner, attr, None)
        except Exception:  # a pytest version without it: nothing to compare
            value = None
        found[f"{module}.{cls + '.' if cls else ''}{attr}"] = id(value) if value is not None else None
    return found


def _hook_plugins(config):
    plugins = {}
    for name in HOOKS:
        hook = getattr(config.hook, name, None)
        if hook is None:
            continue
        plugins[name] = {(config.pluginmanager.get_name(impl.plugin) or repr(impl.plugin)): impl.plugin
                         for impl in hook.get_hookimpls()}
    return plugins


def _trusted_late_plugin(plugin):
    """A plugin registered after configure that is not the tested code's: pytest's own and
    installed packages (registered lazily: the session, the terminal reporter...), and conftest
    files (reset to the repo's own by the grader, which checks them after the run)."""
    import inspect

    try:
        path = inspect.getfile(plugin if inspect.ismodule(plugin) else type(plugin))
    except TypeError:
        return False
    path = os.path.realpath(path)
    if os.path.basename(path) == "conftest.py":
        return True
    return not path.startswith("/testbed/") and ("/site-packages/" in path or "/dist-packages/" in path
                                                or os.path.dirname(path) == os.path.dirname(os.__file__))


class _Guard:
    def __init__(self, config):
        self.config = config
        self.functions, self.plugins = {}, {}

    def snapshot(self):
        self.functions = _watched()
        self.plugins = _hook_plugins(self.config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        _emit({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
               "xfail": bool(getattr(report, "wasxfail", None) is not None)})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        problems = [f"{name} was replaced" for name, ident in _watched().items() if ident != self.functions.get(name)]
        for hook, plugins in _hook_plugins(self.config).items():
            for name, plugin in plugins.items():
                if name not in self.plugins.get(hook, {}) and not _trusted_late_plugin(plugin):
                    problems.append(f"plugin {name!r} added to {hook}")
        _emit({"session": "finish", "exitstatus": int(exitstatus), "problems": problems})


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    guard = _Guard(config)
    config.pluginmanager.register(guard, "slime_harbor_guard_session")
    guard.snapshot()
    _emit({"session": "start"})
