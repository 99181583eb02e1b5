"""The grading watch: a PEP 578 audit hook in every Python process of a verifier run.

This file is mounted read-only into the sandbox, in a directory put first on PYTHONPATH, so each
Python the verifier starts imports it as `sitecustomize`. When env SLIME_HARBOR_WATCH names a
config JSON file it installs an audit hook; with or without one it then imports the NEXT
`sitecustomize` on sys.path (the image's own), so the image behaves as it would without us.
Standard library only, Python 3.6 syntax (so a 3.6/3.7 Python can still say it has no hooks),
nothing from slime_harbor.

Config keys: `report` (a unix datagram socket), `agent_files` (absolute paths of files the agent
added or changed), `grader_paths` (files/dirs that are the grader's), `agent_dirs` (calibrate's probe),
`frames` (false: "files only", for tasks whose own code inspects frames), `started` (epoch seconds
the watch was set up; a file outside the runtime and grader dirs changed after it is the agent's).

Records, one JSON object per datagram (< 4 KB), sent synchronously from the hook, i.e. before the
audited operation proceeds, on a socket connected once at start (renaming or replacing the path
later cannot redirect a running process). Every record carries `proc`, a token per process:
  start    pid, ppid, argv, python, executable (and "no_audit": true on a Python before 3.8)
  event    a flagged operation: category, event, api, reached, where (file:line), function
  spawned  a process started from agent code that is not flagged (its argv, short)
  capped   after CAP flagged records in one process; later ones are dropped
  fork     from a forked child (os.register_at_fork): its pid, ppid and the parent's proc
  end      at exit (atexit), or just before an os.exec* replaces the process
A send that fails (receiver gone, queue full past SEND_TIMEOUT_S) is remembered and the `end` is
then withheld, so the host calls the run unwatched rather than trusting a partial report.

Who did it (attribution "by the public API it called"): walk the stack from the event's frame
outwards. Runtime frames (stdlib, site-packages, `<frozen ...>`, code the runtime generated) are
transparent; the first other frame owns the event: agent code, grader code or task code. Only when
it is agent code is the event the agent's; the "API" is the transparent frame just above it (None
when the agent called the builtin itself). A runtime frame running a module body (`<module>`) ends
the walk as runtime: what a library does while it is being imported is the library's business.

Agent code: a file in `agent_files` (realpath, cached), a file outside the runtime and grader dirs
changed (ctime) after `started` (a module the agent's code writes while the grader runs, from this
process or a shell), or code that is not in a real file. Generated code (`<string>`, odd compile() names) has no file to judge by: it is classified when it
is exec'd (the `exec` event hands over the code object; nested code objects inherit) and takes the
owner of that exec, found by the same walk: exec'd by agent code, or by a runtime API on the
agent's behalf (code.InteractiveInterpreter, timeit: they run the agent's text), it is agent code;
exec'd for the grader or the task, theirs; exec'd while a runtime module is being imported,
runtime code. Generated code never seen exec'd (types.FunctionType on a compile() result) is agent
code. So what namedtuple, dataclasses, enum, typing, attrs and pydantic generate for the agent is
agent code, which is harmless: that code raises no watched event itself, and the frames those
libraries take are taken inside their own public API (CLEAN_FRAME_APIS), which is what keeps them
clean.

What audit events cannot see, left to the static side (hack_monitor): reading a frame's `f_back`,
`f_locals`, `f_globals`, a function's `__globals__`, a module's attributes through sys.modules
(`sys.modules["__main__"].want`); work done entirely by builtins or runtime callables the agent
handed over, with no agent frame on the stack (the solution *being* `functools.partial(open, p)`,
a threading.Timer of `open`); a Python started with -I/-E/-S or a cleared environment (flagged when
agent code spawns it, but its own actions are unseen); processes that are not Python; code objects
made outside exec/compile (a .pyc the agent wrote claiming another file's name); another process's
memory (/proc/PID/mem).
"""

import _thread
import os
import sys

WATCH_ENV = "SLIME_HARBOR_WATCH"
# Set for a process agent code started: its main program (`-c` code, a script on stdin) is then the
# agent's, where a Python the verifier started runs the grader's.
AGENT_SPAWN_ENV = "SLIME_HARBOR_WATCH_AGENT_SPAWN"
SPAWN_EVENTS = ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system", "os.spawn", "pty.spawn")
MAX_RECORD_BYTES = 4000
FIELD_CHARS = 300
CAP = 50
SEND_TIMEOUT_S = 2.0

AGENT, GRADER, TASK, RUNTIME = "agent", "grader", "task", "runtime"

# The classification table. Each row: category -> the audit events it watches, and how an event
# that is the agent's is judged:
#   "any"      flagged through whatever API
#   "direct"   flagged only when agent code called the builtin itself (API None)
#   "frames"   flagged unless the API is in CLEAN_FRAME_APIS (and never when in FLAGGED_FRAME_APIS)
TABLE = {
    # A path under grader_paths (symlinks, /proc/self/root, /proc/self/fd and dir_fd resolved).
    "grader_files": {
        "events": ("open", "os.listdir", "os.scandir", "glob.glob", "glob.glob/2", "exec", "compile",
                   "os.symlink", "os.link", "os.rename", "os.remove", "os.rmdir", "os.truncate"),
        "rule": "any",
    },
    # Frames and so the locals of callers (the grader's `want`).
    "frames": {
        "events": ("sys._getframe", "sys._getframemodulename", "sys._current_frames",
                   "sys._current_exceptions", "object.__getattr__"),
        "rule": "frames",
    },
    "heap": {"events": ("gc.get_referrers", "gc.get_referents", "gc.get_objects"), "rule": "any"},
    "tracer": {"events": ("sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"),
               "rule": "any"},
    # The watch itself: another audit hook, or raw memory through ctypes.
    "hook": {"events": ("sys.addaudithook", "ctypes.*"), "rule": "any"},
    # compile()/code.replace() naming a real file that is not the agent's: code in disguise.
    "disguise": {"events": ("compile", "code.__new__"), "rule": "direct"},
    # A process naming a grader path or escaping the hook (python -I/-E/-S, env without ours).
    "spawn": {"events": ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system", "os.spawn",
                         "pty.spawn"), "rule": "any"},
}
# "Files only" mode keeps what guards the file watch; drops what a task's own frame code trips.
FILES_ONLY = ("grader_files", "hook", "disguise", "spawn")
# Frame attributes whose read hands over a frame (object.__getattr__). f_back is not audited.
FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")
# Prefixes of API qualnames that take frames for their own ends, and the ones that hand them out.
CLEAN_FRAME_APIS = (
    "collections.", "enum.", "typing.", "dataclasses.", "pydantic.", "pydantic_core.", "attr.",
    "attrs.", "warnings.", "functools.", "abc.", "logging.", "traceback.format_exc",
    "traceback.print_exc", "traceback.extract_tb", "traceback.format_tb", "traceback.print_tb",
    "traceback.format_exception", "traceback.print_exception", "traceback.TracebackException",
)
FLAGGED_FRAME_APIS = (
    "inspect.", "traceback.extract_stack", "traceback.walk_stack", "traceback.print_stack",
    "traceback.format_stack", "traceback.StackSummary.extract", "logging.Logger.findCaller",
    "logging.currentframe", "logging.<lambda>", "pdb.", "bdb.",
    # before 3.11 a frame names only its function, not its class
    "logging.findCaller", "traceback.extract",
)
# The builtin the agent called directly, named in reports.
DIRECT_API = {"open": "builtins.open", "exec": "builtins.exec", "compile": "builtins.compile",
              "code.__new__": "types.CodeType", "subprocess.Popen": "subprocess.Popen"}
PYTHON_FLAGS_WITH_ARG = "cmWXQ"


def _short(value, limit=FIELD_CHARS):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Watch(object):
    """One process's hook: its config, classification caches and report socket."""

    def __init__(self, config, sock):
        self.sock = sock
        self.frames = bool(config.get("frames", True))
        self.started = float(config.get("started") or 0)
        self.agent_files = set(os.path.realpath(p) for p in config.get("agent_files", ()))
        # calibrate's probe: every file under these dirs (the task's own workdir) is the agent's
        self.agent_dirs = tuple(os.path.realpath(p) for p in config.get("agent_dirs", ()))
        # whose is this process's main program when it has no file (python -c, python - <<EOF)
        self.agent_main = os.environ.pop(AGENT_SPAWN_ENV, None) is not None
        self.main_command = False  # set by cpython.run_command: unregistered <string> code is the -c program
        self.agent_compiled_string = False  # agent code compiled a "<string>": that name is no longer the main's alone
        self.spawn_mark = False  # os.environ holds AGENT_SPAWN_ENV for a spawn in flight
        graders = []
        for p in config.get("grader_paths", ()):
            graders += [os.path.normpath(p), os.path.realpath(p)]
        self.grader_paths = tuple(sorted(set(graders)))
        self.runtime_dirs = self._runtime_dirs()
        self.own_file = os.path.realpath(__file__)
        self.file_kinds = {}
        # id(code) -> (kind, code, origin): the code is kept so the id stays its own; origin says
        # " (from FILE:LINE)", the agent's line that exec'd it
        self.generated = {}
        self.busy = set()  # thread idents inside the hook: the hook's own calls are audited too
        self.watched_events = {}
        for category, row in TABLE.items():
            if self.frames or category in FILES_ONLY:
                for event in row["events"]:
                    self.watched_events.setdefault(event, []).append(category)
        self._new_process()

    def _new_process(self):
        self.proc = os.urandom(8).hex()
        self.sent_keys = set()
        self.flagged = 0
        self.lost = False

    @staticmethod
    def _runtime_dirs():
        dirs = [os.path.dirname(os.path.realpath(os.__file__))]
        for entry in sys.path:
            if "site-packages" in entry or "dist-packages" in entry:
                dirs.append(os.path.realpath(entry))
        try:
            import site
            dirs += [os.path.realpath(p) for p in site.getsitepackages()]
            dirs.append(os.path.realpath(site.getusersitepackages()))
        except Exception:
            pass
        return tuple(sorted(set(d for d in dirs if d and d != "/")))

    # ---- sending

    def send(self, record):
        record["proc"] = self.proc
        record["pid"] = os.getpid()
        data = _json(record).encode("utf-8", "replace")
        if len(data) > MAX_RECORD_BYTES:
            for key in ("argv", "reached", "api", "function", "where"):
                if key in record:
                    record[key] = _short(record[key], 120)
            data = _json(record).encode("utf-8", "replace")[:MAX_RECORD_BYTES]
        try:
            self.sock.send(data)
        except Exception:
            self.lost = True

    def start_record(self, no_audit=False):
        record = {"kind": "start", "ppid": os.getppid(), "argv": [_short(a) for a in getattr(sys, "orig_argv", sys.argv)[:20]],
                  "python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
        if no_audit:
            record["no_audit"] = True
        self.send(record)

    def at_exit(self, by="atexit"):
        if not self.lost:
            self.send({"kind": "end", "by": by})

    def after_fork(self):
        parent = self.proc
        self._new_process()
        self.send({"kind": "fork", "ppid": os.getppid(), "parent": parent})

    # ---- classification

    def path_kind(self, real):
        """The owner of a resolved file path."""
        if real in self.agent_files:
            return AGENT
        if self.under_grader(real):
            return GRADER
        if real == self.own_file or any(real.startswith(d + os.sep) for d in self.runtime_dirs):
            return RUNTIME
        if any(real.startswith(d + os.sep) for d in self.agent_dirs):
            return AGENT
        try:
            changed = os.stat(real).st_ctime
        except OSError:
            changed = 0
        if self.started and changed >= self.started:
            return AGENT
        return TASK

    def file_kind(self, filename):
        kind = self.file_kinds.get(filename)
        if kind is None:
            kind = self.file_kinds[filename] = self._file_kind(filename)
        return kind

    def _file_kind(self, filename):
        if not filename or filename.startswith("<frozen"):
            return RUNTIME if filename else AGENT
        if filename == "<stdin>":  # the main program read from stdin (a here-document the verifier runs)
            return AGENT if self.agent_main else GRADER
        if filename == "<string>" and self.main_command and not self.agent_compiled_string:
            return AGENT if self.agent_main else GRADER  # python -c: code exec'd by anyone is registered first
        if filename.startswith("<"):
            return AGENT
        real = os.path.realpath(filename)
        if os.path.isfile(real):
            return self.path_kind(real)
        # A module inside an archive (zipimport): the archive is the file.
        head = real
        while head and head != os.sep:
            head = os.path.dirname(head)
            if os.path.isfile(head):
                return self.path_kind(head)
        return AGENT

    def code_kind(self, code):
        known = self.generated.get(id(code))
        if known is not None and known[1] is code:
            return known[0]
        return self.file_kind(code.co_filename)

    def under_grader(self, path):
        for g in self.grader_paths:
            if path == g or path.startswith(g + "/"):
                return True
        return False

    def attribute(self, frame):
        """(owner kind, owner frame, api frame) for an event raised with `frame` on top."""
        api = None
        while frame is not None:
            code = frame.f_code
            kind = self.code_kind(code)
            if kind != RUNTIME:
                return kind, frame, api
            if code.co_name == "<module>":
                return RUNTIME, None, None
            api = frame
            frame = frame.f_back
        return RUNTIME, None, None

    @staticmethod
    def qualname(frame):
        if frame is None:
            return None
        code = frame.f_code
        module = frame.f_globals.get("__name__") or "?"
        return "%s.%s" % (module, getattr(code, "co_qualname", code.co_name))

    def frame_owner(self, frame):
        code = frame.f_code
        return "%s %s:%s in %s" % (self.code_kind(code), code.co_filename, frame.f_lineno, code.co_name)

    # ---- resolving paths

    def resolve(self, path):
        """Absolute candidate paths an audited path argument may name (a relative one may be
        relative to the cwd or to any directory fd the process holds: dir_fd is not audited)."""
        if isinstance(path, int):
            try:
                return [os.readlink("/proc/self/fd/%d" % path)]
            except OSError:
                return []
        try:
            path = os.fsdecode(os.fspath(path))
        except TypeError:
            return []
        if os.path.isabs(path):
            return [path]
        return [os.path.join(os.getcwd(), path)]

    def dir_fd_candidates(self, path):
        try:
            rel = os.fsdecode(os.fspath(path))
        except TypeError:
            return []
        out = []
        try:
            for fd in os.listdir("/proc/self/fd"):
                try:
                    target = os.readlink("/proc/self/fd/" + fd)
                except OSError:
                    continue
                if target.startswith("/") and os.path.isdir(target):
                    out.append(os.path.join(target, rel))
        except OSError:
            pass
        return out

    def grader_hit(self, candidates):
        for candidate in candidates:
            for form in (os.path.normpath(candidate), os.path.realpath(candidate)):
                if self.under_grader(form):
                    return form
        return None

    # ---- the hook

    def hook(self, event, args):
        if self.spawn_mark and event not in SPAWN_EVENTS:
            self.spawn_mark = False  # the spawn that needed it is done: later spawns are not the agent's
            os.environ.pop(AGENT_SPAWN_ENV, None)
        if event == "cpython.run_command":
            self.main_command = True
            self.file_kinds.pop("<string>", None)
            return
        categories = self.watched_events.get(event)
        if categories is None:
            if event.startswith("ctypes."):
                categories = self.watched_events.get("ctypes.*")
            if categories is None:
                return
        me = _thread.get_ident()
        if me in self.busy:
            return
        self.busy.add(me)
        try:
            self.judge(event, args, categories)
        except Exception:
            pass  # never raise into the watched program
        finally:
            self.busy.discard(me)

    def judge(self, event, args, categories):
        frame = sys._getframe(2)  # 0: judge, 1: hook, 2: whoever raised the event
        if event == "exec":
            self.note_generated(args[0], frame)
        for category in categories:
            getattr(self, "check_" + category)(event, args, frame)

    def flag(self, category, event, api, reached, agent_frame):
        code = agent_frame.f_code
        where = "%s:%s" % (code.co_filename, agent_frame.f_lineno)
        if code.co_filename.startswith("<"):
            where += self.generated_from(agent_frame)
        record = {"kind": "event", "category": category, "event": event, "api": api,
                  "reached": _short(reached), "where": where, "function": code.co_name}
        key = (category, event, api, record["reached"], record["where"])
        if key in self.sent_keys:
            return
        self.sent_keys.add(key)
        self.flagged += 1
        if self.flagged > CAP:
            if self.flagged == CAP + 1:
                self.send({"kind": "capped", "after": CAP})
            return
        self.send(record)

    def generated_from(self, frame, start=None):
        """" (from FILE:LINE)": the agent's line that ran (or exec'd) generated agent code."""
        known = self.generated.get(id(frame.f_code))
        if start is None and known is not None and known[1] is frame.f_code and known[2]:
            return known[2]
        frame = start if start is not None else frame.f_back
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith("<") and self.code_kind(frame.f_code) == AGENT:
                return " (from %s:%s)" % (filename, frame.f_lineno)
            frame = frame.f_back
        return ""

    def agents(self, frame):
        """(agent frame, api name) when the event is the agent's, else None."""
        kind, owner, api = self.attribute(frame)
        if kind != AGENT:
            return None
        return owner, self.qualname(api)

    def api_or_direct(self, api, event, args=()):
        if api is not None:
            return api
        if event == "open" and len(args) > 1 and args[1] is None:
            return "os.open"
        return DIRECT_API.get(event, event)

    # -- generated code and files written by the agent

    def note_generated(self, code, frame):
        filename = code.co_filename
        if not filename.startswith("<") or filename.startswith("<frozen"):
            return  # a real file's code is judged by its file (a forged name: check_disguise)
        kind = self.attribute(frame)[0]
        self.mark(code, kind, self.generated_from(frame, start=frame) if kind == AGENT else "")

    def mark(self, code, kind, origin):
        todo = [code]
        while todo and len(self.generated) < 50000:
            c = todo.pop()
            self.generated[id(c)] = (kind, c, origin)
            todo += [k for k in c.co_consts if hasattr(k, "co_code")]

    # -- the categories

    def check_grader_files(self, event, args, frame):
        if event == "exec":
            filename = args[0].co_filename
            hit = filename if self.file_kind(filename) == GRADER else None
        elif event == "compile":
            filename = args[1] if len(args) > 1 else None
            hit = filename if isinstance(filename, str) and self.grader_hit([filename]) else None
        elif event in ("glob.glob", "glob.glob/2"):
            pattern = args[0]
            if len(args) > 2 and args[2]:
                pattern = os.path.join(os.fsdecode(args[2]), os.fsdecode(pattern))
            hit = self.grader_hit(self.resolve(pattern))
        else:
            path = args[0] if args else None
            if path is None and event in ("os.listdir", "os.scandir"):
                path = "."
            paths = [path] + ([args[1]] if event in ("os.symlink", "os.link", "os.rename") else [])
            hit = None
            for p in paths:
                hit = hit or self.grader_hit(self.resolve(p))
            if hit is None:
                relative = [p for p in paths if not isinstance(p, int) and p is not None
                            and not os.path.isabs(os.fsdecode(os.fspath(p)))]
                if not relative or self.agents(frame) is None:
                    return
                for p in relative:
                    hit = hit or self.grader_hit(self.dir_fd_candidates(p))
        if hit is None:
            return
        if event in ("os.listdir", "os.scandir") and self.code_kind(frame.f_code) == RUNTIME and (
                os.path.realpath(hit) in [os.path.realpath(p or ".") for p in sys.path]):
            return  # the import system or importlib.metadata searching sys.path (graders put their dir there)
        agent = self.agents(frame)
        if agent is None:
            return
        if agent[1] and agent[1].startswith("warnings.") and self.on_stack(hit, frame):
            return  # a warning shows the source line it points to: a caller's, already on the stack
        self.flag("grader_files", event, self.api_or_direct(agent[1], event, args), hit, agent[0])

    def on_stack(self, path, frame):
        real = os.path.realpath(path)
        while frame is not None:
            if os.path.realpath(frame.f_code.co_filename) == real:
                return True
            frame = frame.f_back
        return False

    def check_frames(self, event, args, frame):
        reached = None
        if event == "object.__getattr__":
            name = args[1] if len(args) > 1 else None
            if name == "f_code":
                target = args[0]
                if self.code_kind(target.f_code) not in (GRADER, TASK):
                    return
                reached = "f_code of " + self.frame_owner(target)
            elif name in FRAME_ATTRS:
                reached = name
            else:
                return
        agent = self.agents(frame)
        if agent is None:
            return
        owner, api = agent
        if event == "object.__getattr__" and args[1] in ("gi_frame", "cr_frame", "ag_frame") and api:
            return
        if api is not None and not api.startswith(FLAGGED_FRAME_APIS) and api.startswith(CLEAN_FRAME_APIS):
            return
        if reached is None:
            got = args[0] if args else None
            reached = self.frame_owner(got) if hasattr(got, "f_code") else _short(got)
        self.flag("frames", event, api or event, reached, owner)

    def check_heap(self, event, args, frame):
        agent = self.agents(frame)
        if agent is not None:
            self.flag("heap", event, agent[1] or event, "the heap", agent[0])

    def check_tracer(self, event, args, frame):
        agent = self.agents(frame)
        if agent is not None:
            self.flag("tracer", event, agent[1] or event, _short(args[0]) if args else "", agent[0])
            return
        # threading.settrace/setprofile only store the function; a new thread installs it with no
        # agent frame on its stack: judge by whose function it is.
        threading = sys.modules.get("threading")
        for name in ("_trace_hook", "_profile_hook"):
            func = getattr(threading, name, None)
            code = getattr(func, "__code__", None)
            if code is not None and self.code_kind(code) == AGENT:
                self.flag("tracer", event, "threading." + name[1:].replace("_hook", ""),
                          "%s:%s" % (code.co_filename, code.co_firstlineno),
                          _FakeFrame(code))

    def check_hook(self, event, args, frame):
        agent = self.agents(frame)
        if agent is not None:
            self.flag("hook", event, agent[1] or event, _short(args[:2]), agent[0])

    def check_disguise(self, event, args, frame):
        filename = args[1] if event == "compile" else (args[1] if len(args) > 1 else None)
        if filename == "<string>" and self.main_command and not self.agent_compiled_string \
                and self.agents(frame) is not None:
            self.agent_compiled_string = True  # a "<string>" of the agent's may now run unregistered
            self.file_kinds.pop("<string>", None)
        if not isinstance(filename, str) or filename.startswith("<"):
            return
        if self.file_kind(filename) == AGENT:
            return
        agent = self.agents(frame)
        if agent is not None and agent[1] is None:
            self.flag("disguise", event, DIRECT_API.get(event, event), filename, agent[0])

    def check_spawn(self, event, args, frame):
        agent = self.agents(frame)
        if event == "os.exec":
            self.at_exit("exec")  # the process is replaced: no atexit will run
        if agent is None:
            return
        owner, api = agent
        self.mark_agent_spawn(event, args)
        program = None
        if event == "os.system":
            argv, env = [os.fsdecode(args[0])], None
        elif event == "subprocess.Popen":
            program, argv, env = args[0], args[1], args[3]
        elif event == "os.spawn":
            program, argv, env = args[1], args[2], args[3]
        elif event == "pty.spawn":
            argv, env = args[0], None
        else:
            program, argv, env = args[0], args[1], args[2]
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        argv = [_text(a) for a in (argv or ())]
        why = self.spawn_problem(([_text(program)] if program is not None else []) + argv, env)
        api = api or DIRECT_API.get(event, event)
        if why:
            self.flag("spawn", event, api, "%s: %s" % (why, _short(" ".join(argv), 200)), owner)
        else:
            self.send({"kind": "spawned", "argv": _short(" ".join(argv), 200), "api": api})

    def mark_agent_spawn(self, event, args):
        """The child of agent code learns so (AGENT_SPAWN_ENV): its main program is the agent's.
        An explicit environment gets the variable; an inherited one holds it until the next event."""
        env = {"subprocess.Popen": 3, "os.exec": 2, "os.posix_spawn": 2, "os.spawn": 3}.get(event)
        mapping = args[env] if env is not None and len(args) > env else None
        if isinstance(mapping, dict):
            mapping[AGENT_SPAWN_ENV] = "1"
        elif mapping is None:
            os.environ[AGENT_SPAWN_ENV] = "1"
            self.spawn_mark = True

    def spawn_problem(self, argv, env):
        words = []
        for arg in argv:
            words += arg.replace(";", " ").replace("&&", " ").replace("|", " ").split()
        for word in words:
            word = word.strip("'\"")
            for g in self.grader_paths:
                at = word.find(g)
                if at >= 0 and (at == 0 or not (word[at - 1].isalnum() or word[at - 1] in "._-")):
                    end = word[at + len(g):at + len(g) + 1]
                    if end in ("", "/", "*", "'", '"', ")"):
                        return "names " + g
        pythons = [i for i, w in enumerate(words) if os.path.basename(w.strip("'\"")).startswith("python")]
        for i in pythons:
            for word in words[i + 1:]:
                if not word.startswith("-") or word.startswith("--"):
                    break
                for ch in word[1:]:
                    if ch in "IES":
                        return "python -" + ch + " skips the hook"
                    if ch in PYTHON_FLAGS_WITH_ARG:
                        break
                else:
                    continue
                break
        if not pythons:
            return None
        if "env" in [os.path.basename(w) for w in words] and ("-i" in words or "--ignore-environment" in words):
            return "env -i drops the hook's variables"
        if env is not None:
            try:
                value = env.get(WATCH_ENV) if hasattr(env, "get") else None
                pythonpath = env.get("PYTHONPATH", "") if hasattr(env, "get") else ""
                if isinstance(value, bytes):
                    value = os.fsdecode(value)
                if isinstance(pythonpath, bytes):
                    pythonpath = os.fsdecode(pythonpath)
            except Exception:
                value, pythonpath = None, ""
            ours = os.path.dirname(self.own_file)
            if not value or not any(p and os.path.realpath(p) == ours for p in pythonpath.split(os.pathsep)):
                return "an environment without the hook's variables"
        return None


class _FakeFrame(object):
    """Stands for the agent function a new thread will run, where no agent frame exists yet."""

    def __init__(self, code):
        self.f_code = code
        self.f_lineno = code.co_firstlineno


def _text(value):
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        return str(value)


# The config and the records are read and written without the json module (which imports re and
# enum: several milliseconds in every Python the grading starts).
LIST_KEYS = {"agent_file": "agent_files", "grader_path": "grader_paths", "agent_dir": "agent_dirs"}


def read_config(path):
    """The config the host wrote (report.WatchChannel): one `key value` per line; the list keys
    repeat (LIST_KEYS)."""
    config = {name: [] for name in LIST_KEYS.values()}
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f.read().split("\n"):
            key, _, value = line.partition(" ")
            if key in LIST_KEYS:
                config[LIST_KEYS[key]].append(value)
            elif key == "frames":
                config["frames"] = value == "1"
            elif key == "started":
                config["started"] = float(value)
            elif key:
                config[key] = value
    return config


_ESCAPES = dict((i, "\\u%04x" % i) for i in range(32))
_ESCAPES.update({ord("\\"): "\\\\", ord('"'): '\\"'})


def _json(value):
    """JSON of a record: str, int, float, bool, None, lists and dicts of them."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_json(str(k)) + ":" + _json(v) for k, v in value.items()) + "}"
    return '"' + str(value).translate(_ESCAPES) + '"'


def _chain_load():
    """Import the next `sitecustomize` on sys.path as site.py would import ours."""
    here = os.path.dirname(os.path.realpath(__file__))
    # A plain import with our dir off sys.path (importlib.util costs every Python a few ms).
    saved, ours = sys.path[:], sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]
    try:
        try:
            import sitecustomize  # noqa: F401  (the image's own)
        except ImportError as exc:
            if exc.name != "sitecustomize":
                raise
            if ours is not None:
                sys.modules["sitecustomize"] = ours
    except Exception as err:
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                             % (err.__class__.__name__, err))
    finally:
        sys.path[:] = saved


def _install():
    config_path = os.environ.get(WATCH_ENV)
    if not config_path:
        return
    try:
        config = read_config(config_path)
        import _socket  # not socket.py: every Python of the grading pays for what the hook imports
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        sock.settimeout(SEND_TIMEOUT_S)
        sock.connect(config["report"])
    except Exception as err:  # unwatched: the host sees no start from this process
        sys.stderr.write("slime-harbor watch: not watching (%s: %s)\n" % (err.__class__.__name__, err))
        return
    if not hasattr(sys, "addaudithook"):
        record = {"kind": "start", "no_audit": True, "proc": os.urandom(8).hex(), "pid": os.getpid(),
                  "python": "%d.%d.%d" % sys.version_info[:3], "argv": sys.argv[:20]}
        try:
            sock.send(_json(record).encode("utf-8", "replace")[:MAX_RECORD_BYTES])
        except Exception:
            pass
        return
    watch = Watch(config, sock)
    import atexit
    atexit.register(watch.at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=watch.after_fork)
    watch.start_record()
    sys.addaudithook(watch.hook)


_install()
_chain_load()
