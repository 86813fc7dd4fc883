
# Verity sandbox harness (the verdict process). It reads its request from fd 4 before anything
# else runs, writes nonce-tagged JSON lines to fd 3, and never runs untrusted code: the program
# (or a user's grade()) runs in a child process started from the wire format and child sources
# above, which has neither fd 3 nor the nonce, and cannot inspect this process (it is made
# non-dumpable, so same-uid ptrace, /proc/<pid>/mem and /proc/<pid>/fd are refused). Everything
# the child says arrives as plain data (exact built-in types built here) or as opaque references
# to its objects; comparisons, truth values and arithmetic in the tests run in this clean
# interpreter on that plain data.
import ast
import builtins
import json
import keyword
import os
import signal
import subprocess
import sys

VERDICT_FD, INPUT_FD, MESSAGES_FD = 3, 4, 5
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4


def read_request():
    chunks = []
    while True:
        chunk = os.read(INPUT_FD, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(INPUT_FD)
    return json.loads(b"".join(chunks))


def drop_privileges(uid):
    """Privileged bwrap (Verity runs as root): become this run's own unprivileged uid."""
    os.chown("/work", uid, uid)
    os.chown("/tmp", uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def make_undumpable():
    """Refuses ptrace, /proc/<pid>/mem, /proc/<pid>/fd and pidfd_getfd to same-uid processes."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


class Verdict:
    """The verdict channel: one JSON line per event, tagged with the run's nonce."""

    def __init__(self, nonce):
        self.nonce = nonce

    def emit(self, event, **fields):
        fields["event"] = event
        fields["nonce"] = self.nonce
        data = (json.dumps(fields, ensure_ascii=True, allow_nan=False) + "\n").encode()
        while data:
            data = data[os.write(VERDICT_FD, data):]


def describe(e):
    """A message for an exception raised in this process (never program code)."""
    detail = ""
    if len(e.args) == 1 and type(e.args[0]) in (str, int, float):
        detail = str(e.args[0])[:300]
    name = type(e).__name__
    return name + ": " + detail if detail else name


def spawn_child(request, output=None):
    """Starts the child that runs untrusted code; returns (process, write fd, read fd). With
    `output`, the child's stdout and stderr go to that fd."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", request["child_source"], str(to_child_r), str(from_child_w)],
        stdin=subprocess.DEVNULL, stdout=output, stderr=output, pass_fds=(to_child_r, from_child_w),
        cwd="/work")
    os.close(to_child_r)
    os.close(from_child_w)
    return proc, to_child_w, from_child_r


def kill_program_processes():
    """Kills every process this one may signal except itself and the sandbox's init: the
    program's processes, strays included (they share this uid; init is bwrap)."""
    for _ in range(100):  # again until nothing is left (a fork bomb forks while it is killed)
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            return


# ---------------------------------------------------------------- tests

# Exceptions the child may name that the tests then see as raised; any other becomes RuntimeError
# (a StopIteration from a call must not end a loop of the tests early).
RAISABLE = frozenset(
    name for name, v in vars(builtins).items()
    if isinstance(v, type) and issubclass(v, Exception) and not issubclass(v, (StopIteration, StopAsyncIteration)))
COMPARE_REFUSED = ("comparison, truth value or arithmetic on an object of the program: "
                   "tests compare plain data (the program's functions must return built-in types)")


# Modules whose import acts (prints, opens a browser or a window, adds built-ins).
NOT_REIMPORTED = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo",
                            "tkinter", "turtle", "site", "sitecustomize", "usercustomize", "webbrowser"})


class ProgramGone(Exception):
    """The program's process ended or broke the protocol; every later interaction fails."""


def program_exception(error):
    if type(error) is not list or len(error) != 3 or type(error[0]) is not str or type(error[1]) is not str:
        raise ProgramGone("the program's process sent a malformed error")
    base, message, defined_by_program = error[0], error[1][:300], error[2] is True
    cls = getattr(builtins, base) if base in RAISABLE else RuntimeError
    if defined_by_program:
        message = "an exception of a class defined by the program (derived from " + base + ")"
    elif cls is RuntimeError and base != "RuntimeError":
        message = "the program raised " + base + (": " + message if message else "")
    try:
        return cls(message) if message else cls()
    except Exception:  # a built-in exception that needs more arguments
        return RuntimeError(base + ": " + message)


class Program:
    """The client side of the child's object protocol."""

    def __init__(self, wfd, rfd):
        self.wfd, self.rfd = wfd, rfd
        self.broken = None
        self.objects = {}
        self.object_class = make_object_class(self)

    def fail(self, why):
        self.broken = why
        raise ProgramGone(why)

    def obj(self, n):
        o = self.objects.get(n)
        if o is None:
            o = object.__new__(self.object_class)
            object.__setattr__(o, "_verity_ref", n)
            self.objects[n] = o
        return o

    def module(self, name, n):
        """A module the program imported, imported again here from the read-only sys.path (so
        the tests' `math.isclose` is never the program's); otherwise an opaque reference."""
        parts = name.split(".")
        if all(p.isidentifier() and p != "__main__" for p in parts) and parts[0] not in NOT_REIMPORTED:
            try:
                import importlib
                return importlib.import_module(name)
            except BaseException:  # noqa: B036
                pass
        return self.obj(n)

    def value(self, node, with_modules=False):
        try:
            return decode(node, self.obj, self.module if with_modules else None)
        except WireError as e:
            self.fail("the program's process sent a malformed value: " + str(e))

    def encode_arg(self, value):
        def other(x):
            if type(x) is self.object_class:
                return {"p": object.__getattribute__(x, "_verity_ref")}
            for base in (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset):
                if isinstance(x, base):
                    return encode(base(x), other)
            if isinstance(x, bytearray):
                return encode(bytes(x), other)
            raise TypeError("tests can pass only plain data and the program's own objects to the program")
        return encode(value, other)

    def request(self, op, target, **fields):
        if self.broken is not None:
            raise ProgramGone(self.broken)
        fields["op"] = op
        fields["target"] = {"p": object.__getattribute__(target, "_verity_ref")}
        try:
            send(self.wfd, fields)
            reply = recv(self.rfd)
        except WireError as e:
            self.fail("the program's process ended or broke the protocol (" + str(e) + ")")
        if type(reply) is not dict or len(reply) != 1:
            self.fail("the program's process sent a malformed reply")
        if "value" in reply:
            return self.value(reply["value"])
        if "error" in reply:
            raise program_exception(reply["error"])
        if op == "next" and reply.get("stop") is True:
            raise StopIteration
        self.fail("the program's process sent a malformed reply")

    def load(self, request):
        """Runs the program's module code in the child; returns its exports or an error text."""
        message = {"mode": "tests", "program": request["program"], "site_paths": request.get("site_paths", [])}
        try:
            send(self.wfd, message)
            reply = recv(self.rfd)
        except WireError as e:
            return None, "the program's process ended while loading (" + str(e) + ")"
        if type(reply) is not dict:
            return None, "the program's process sent a malformed reply"
        if reply.get("loaded") is not True:
            try:
                return None, describe(program_exception(reply.get("error")))
            except ProgramGone as e:
                return None, str(e)
        exports = reply.get("exports")
        if type(exports) is not dict:
            return None, "the program's process sent a malformed reply"
        shadowed = frozenset(dir(builtins))
        namespace = {}
        try:
            for name, node in exports.items():
                # names of built-ins stay the built-ins: a program defining `all` or `range`
                # cannot change what the tests' own calls mean
                if name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("__") \
                        and name not in shadowed:
                    namespace[name] = self.value(node, with_modules=True)
        except ProgramGone as e:
            return None, str(e)
        return namespace, None


def make_object_class(program):
    request = program.request

    def refused(*_args):
        raise TypeError(COMPARE_REFUSED)

    class ProgramObject:
        """An opaque reference to an object in the program's process. Calls, attribute and
        item access, iteration, len, str and repr ask the program; everything whose answer
        the tests would trust as a comparison of values is refused."""
        __slots__ = ("_verity_ref",)

        def __getattr__(self, name):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return request("getattr", self, name=name)

        def __setattr__(self, name, value):
            request("setattr", self, name=name, value=program.encode_arg(value))

        def __call__(self, *args, **kwargs):
            return request("call", self, args=[program.encode_arg(a) for a in args],
                           kwargs={k: program.encode_arg(v) for k, v in kwargs.items()})

        def __getitem__(self, key):
            return request("getitem", self, key=program.encode_arg(key))

        def __setitem__(self, key, value):
            request("setitem", self, key=program.encode_arg(key), value=program.encode_arg(value))

        def __iter__(self):
            return request("iter", self)

        def __next__(self):
            return request("next", self)

        def __len__(self):
            return request("len", self)

        def __str__(self):
            return request("str", self)

        def __repr__(self):
            return request("repr", self)

        def __hash__(self):
            return id(self)

        __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = refused

    return ProgramObject


def is_test_statement(stmt):
    return not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Pass))


def run_tests(request, verdict):
    try:
        tree = ast.parse(request["tests"], "<tests>")
    except SyntaxError as e:
        verdict.emit("tests_invalid", message=describe(e))
        return
    statements = [(s, is_test_statement(s)) for s in tree.body]
    verdict.emit("plan", total=sum(1 for _, counted in statements if counted))
    proc, wfd, rfd = spawn_child(request)
    program = Program(wfd, rfd)
    namespace, load_error = program.load(request)
    if load_error is not None:
        verdict.emit("program_error", message=load_error)
    tests = dict(namespace or {})
    tests["__name__"] = "__tests__"
    tests["__builtins__"] = builtins
    ordinal = 0
    for statement, counted in statements:
        if load_error is not None:
            ok, message = False, "program failed to load"
        else:
            try:
                exec(compile(ast.Module([statement], []), "<tests>", "exec"), tests)
                ok, message = True, ""
            except BaseException as e:  # noqa: B036 - SystemExit and friends are failures too
                ok, message = False, describe(e)
        if counted:
            verdict.emit("test", index=ordinal, passed=ok, message=message)
            ordinal += 1


# ---------------------------------------------------------------- grade

def run_grade(request, verdict):
    proc, wfd, rfd = spawn_child(request)
    try:
        send(wfd, {"mode": "grade", "program": request["program"], "sample": request["sample"],
                   "item": request["item"], "site_paths": request.get("site_paths", [])})
        reply = recv(rfd)
    except WireError:
        verdict.emit("grade_error", message="grade() ended without a result")
        return
    if type(reply) is dict and len(reply) == 1 and type(reply.get("score")) in (int, float):
        score = float(reply["score"])
        if score - score == 0.0:
            verdict.emit("grade", score=score)
        else:
            verdict.emit("grade_error", message="grade() returned a non-finite number")
    elif type(reply) is dict and "error" in reply and set(reply) <= {"error", "phase"}:
        # where it failed only guides graders/validate: loading the source, or in grade()
        phase = "load" if reply.get("phase") == "load" else "grade"
        try:
            verdict.emit("grade_error", message=describe(program_exception(reply["error"])), phase=phase)
        except ProgramGone as e:
            verdict.emit("grade_error", message=str(e), phase=phase)
    else:
        verdict.emit("grade_error", message="grade() sent a malformed result")


# ---------------------------------------------------------------- cases

def case_stdin(text):
    data = text.encode("utf-8")
    fd = os.memfd_create("stdin", 0)
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_case(request, stdin_text):
    """Runs one case; returns (stdout bytes, truncated, exit code, timed out)."""
    import select
    import time
    cap = request["max_case_output"]
    boot = ("import sys, runpy; sys.path.extend(sys.argv[1:]); sys.argv = ['main.py']; "
            "runpy.run_path('/work/main.py', run_name='__main__')")
    stdin_fd = case_stdin(stdin_text)
    out_r, out_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", boot] + request.get("site_paths", []),
                                stdin=stdin_fd, stdout=out_w, stderr=subprocess.DEVNULL, cwd="/work",
                                start_new_session=True)
    except OSError:
        os.close(out_r)
        return b"", False, None, False
    finally:
        os.close(out_w)
        os.close(stdin_fd)
    deadline = time.monotonic() + request["case_timeout_s"]
    out, timed_out, truncated = bytearray(), False, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = proc.poll() is None
            break
        ready, _, _ = select.select([out_r], [], [], min(left, 0.5))
        if not ready:
            continue
        chunk = os.read(out_r, 1 << 16)
        if not chunk:
            break
        out += chunk
        if len(out) > cap:
            truncated = True
            break
    if not (timed_out or truncated):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    kill_program_processes()  # the case and anything it left behind: no stray writes into later cases
    proc.wait()
    os.close(out_r)
    return bytes(out[:cap]), truncated, proc.returncode, timed_out


def run_cases(request, verdict):
    with open("/work/main.py", "w") as f:
        f.write(request["program"])
    for index, stdin_text in enumerate(request["inputs"]):
        out, truncated, returncode, timed_out = run_case(request, stdin_text)
        verdict.emit("case", index=index, stdout=out.decode("utf-8", "replace"), truncated=truncated,
                     returncode=returncode, timed_out=timed_out)


# ---------------------------------------------------------------- session

def read_available(fd, out, cap):
    """Appends what `fd` (non-blocking) holds now to `out`, stopping once `out` passes `cap`
    bytes (a flood never stops on its own); False once `fd` is at its end."""
    while len(out) <= cap:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        out += chunk
    return True


def run_session(request, verdict):
    """A tool session: the child keeps one interpreter (the model's cells, or the job's tool
    functions) for the whole episode. Each framed message on fd 5 is one call; its answer is one
    `cell` event with the output the call printed (capped: more ends the session), the error
    line of a failed call, and whether the session is over. The supervisor kills the whole
    sandbox when a call runs past its time limit."""
    import select
    cap = request["max_output"]
    out_r, out_w = os.pipe()
    proc, wfd, rfd = spawn_child(request, output=out_w)
    os.close(out_w)
    os.set_blocking(out_r, False)
    try:
        send(wfd, {"mode": "session", "functions": request.get("functions", []),
                   "site_paths": request.get("site_paths", [])})
        loaded = recv(rfd)
    except WireError:
        loaded = None
    errors = loaded.get("errors") if type(loaded) is dict else None
    if type(errors) is not list or not all(type(e) is str for e in errors):
        verdict.emit("session_failed", message="the session process did not start")
        return
    verdict.emit("session", errors=[e[:500] for e in errors])
    output_open = True
    while True:
        try:
            message = recv(MESSAGES_FD)
        except WireError:
            break  # the episode is over
        if output_open:
            output_open = read_available(out_r, bytearray(), cap)  # stray output of earlier calls
        out, truncated, reply = bytearray(), False, None
        try:
            send(wfd, message)
        except WireError:
            reply = False
        while reply is None:
            watched = [rfd] + ([out_r] if output_open else [])
            ready, _, _ = select.select(watched, [], [])
            if out_r in ready:
                output_open = read_available(out_r, out, cap)
                if len(out) > cap:
                    truncated = True
                    break
            if rfd in ready:
                try:
                    reply = recv(rfd)
                except WireError:
                    reply = False
        if reply is not None and output_open:  # the child flushed before answering
            output_open = read_available(out_r, out, cap)
            truncated = len(out) > cap
        error = reply.get("error") if type(reply) is dict else None
        verdict.emit("cell", output=bytes(out[:cap]).decode("utf-8", "replace"), truncated=truncated,
                     error=error[:2000] if type(error) is str else None, ended=reply is False)
        if truncated or reply is False:
            break
    kill_program_processes()


# ---------------------------------------------------------------- main

def main():
    os.set_inheritable(VERDICT_FD, False)
    request = read_request()
    verdict = Verdict(request.pop("nonce"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path.extend(request.get("site_paths", []))  # started with -S: no .pth hooks, same packages
    if len(sys.argv) > 1 and os.getuid() == 0:
        drop_privileges(int(sys.argv[1]))
    make_undumpable()
    verdict.emit("ready")
    mode = request["mode"]
    if mode == "cases":
        run_cases(request, verdict)
    elif mode == "tests":
        run_tests(request, verdict)
    elif mode == "session":
        run_session(request, verdict)
    else:
        run_grade(request, verdict)
    verdict.emit("done")
    os._exit(0)


main()
