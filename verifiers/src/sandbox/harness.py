# Verity sandbox harness: runs inside bubblewrap. Reads its request from fd 4 before any untrusted
# code runs, writes nonce-tagged JSON lines to fd 3. The verdict is never the exit status, never
# stdout, and never a file the program can reach.
import ast
import builtins
import json
import os
import sys


def main():
    _write, _read, _close = os.write, os.read, os.close
    _type, _len, _repr, _str, _isinstance = type, len, repr, str, isinstance
    _int, _float, _bool, _all, _range = int, float, bool, all, range
    chunks = []
    while True:
        chunk = _read(4, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    _close(4)
    request = json.loads(b"".join(chunks))
    nonce = request.pop("nonce")
    if len(sys.argv) > 1 and os.getuid() == 0:
        # privileged bwrap (Verity runs as root): become this run's own unprivileged uid
        uid = int(sys.argv[1])
        os.chown("/work", uid, uid)
        os.chown("/tmp", uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    def quote(s):
        out = ['"']
        for ch in _str(s):
            o = ord(ch)
            if ch == '"' or ch == "\\":
                out.append("\\" + ch)
            elif o < 0x20 or o > 0x7E:
                out.append("\\u%04x" % o if o <= 0xFFFF else "\\u%04x\\u%04x" % (0xD800 + ((o - 0x10000) >> 10), 0xDC00 + ((o - 0x10000) & 0x3FF)))
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)

    def encode(v):
        t = _type(v)
        if v is None:
            return "null"
        if t is _bool:
            return "true" if v else "false"
        if t is _int:
            return _str(v)
        if t is _float:
            return _repr(v) if v == v and v not in (float("inf"), float("-inf")) else "null"
        if t is list:
            return "[" + ",".join([encode(x) for x in v]) + "]"
        if t is dict:
            return "{" + ",".join([quote(k) + ":" + encode(x) for k, x in v.items()]) + "}"
        return quote(v)

    def emit(event, **fields):
        fields["event"] = event
        fields["nonce"] = nonce
        data = (encode(fields) + "\n").encode("utf-8", "replace")
        while data:
            try:
                n = _write(3, data)
            except OSError:
                return
            data = data[n:]

    emit("ready")
    mode = request["mode"]
    if mode == "cases":
        run_cases(request, emit)
    else:
        harden(request)
        if mode == "tests":
            run_tests(request, emit, _type, _isinstance, _bool, _all, _len)
        else:
            run_grade(request, emit, _type, _float, _int, _bool)
    emit("done")
    os._exit(0)


BLOCKED_EVENTS = frozenset({
    "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
})
TRUSTED_FILES = frozenset({"<tests>", "<string>"})
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals"})


def harden(request):
    """Untrusted code may not inspect the harness's frames, objects or memory, nor rewrite code."""

    def hook(event, args, _events=BLOCKED_EVENTS, _frames=FRAME_ATTRS, _trusted=TRUSTED_FILES, _err=RuntimeError,
             _isinstance=isinstance, _str=str, _bytes=bytes, _len=len, _startswith=str.startswith,
             _bstartswith=bytes.startswith):
        if event in _events or _startswith(event, "ctypes."):
            raise _err("blocked by the sandbox: " + event)
        if event == "sys._getframe" and args and args[0].f_code.co_filename in _trusted:
            raise _err("blocked by the sandbox: harness frame")
        if event == "object.__getattr__" and _len(args) > 1 and args[1] in _frames:
            raise _err("blocked by the sandbox: frame access")
        if (event == "object.__setattr__" or event == "object.__delattr__") and _len(args) > 1 and args[1] == "__code__":
            raise _err("blocked by the sandbox: code replacement")
        if event == "open" and args:
            path = args[0]
            if (_isinstance(path, _str) and _startswith(path, "/proc")) or (_isinstance(path, _bytes) and _bstartswith(path, b"/proc")):
                raise _err("blocked by the sandbox: /proc")

    sys.addaudithook(hook)


def plain_checker(_type, _isinstance, _all, _len):
    # identity checks only: `t in {...}` would hash t and could run a program metaclass
    atoms = frozenset(id(t) for t in (int, float, complex, str, bytes, bool, type(None)))
    seqs = frozenset(id(t) for t in (list, tuple, set, frozenset))
    _id, _dict = id, dict

    def plain(x, depth=0):
        t = _id(_type(x))
        if t in atoms:
            return True
        if depth > 64:
            return False
        if t in seqs:
            return _all([plain(i, depth + 1) for i in x])
        if t == _id(_dict):
            return _all([plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items()])
        return False

    return plain


def make_compare(plain, _bool):
    import operator as op
    table = {
        "Eq": op.eq, "NotEq": op.ne, "Lt": op.lt, "LtE": op.le, "Gt": op.gt, "GtE": op.ge,
        "Is": op.is_, "IsNot": op.is_not, "In": lambda a, b: op.contains(b, a),
        "NotIn": lambda a, b: not op.contains(b, a),
    }

    def compare(ops, values):
        # Only plain data (exact builtin types, recursively) is compared: objects whose __eq__
        # or __lt__ always answer True cannot pass a test.
        for v in values:
            if not plain(v):
                return False
        for i, name in enumerate(ops):
            if not _bool(table[name](values[i], values[i + 1])):
                return False
        return True

    def truth(value):
        if not plain(value):
            raise AssertionError("assert on a value that is not plain data")
        return _bool(value)

    return compare, truth


def make_isolated_runner(_type, plain):
    """Runs a callable on a fresh thread and returns (ok, value or exception): program code run
    this way has stack frames that lead back to thread start-up only, never to the harness.
    Objects coming back are kept alive for the whole run, so their finalisers never run on a
    harness thread; re-enabling the garbage collector is reported as tampering."""
    import _thread
    import gc
    import types
    generator = types.GeneratorType
    _start_thread, _new_lock, _list, _isenabled, _disable = (
        _thread.start_new_thread, _thread.allocate_lock, list, gc.isenabled, gc.disable)
    keepalive = []
    state = {"tampered": False}

    def run(fn, args, kwargs):
        box = {}
        finished = _new_lock()
        finished.acquire()

        def runner():
            try:
                result = fn(*args, **kwargs)
                if _type(result) is generator:
                    result = _list(result)
                box["result"] = result
            except BaseException as e:  # noqa: B036
                box["error"] = e
            finally:
                finished.release()

        _start_thread(runner, ())
        finished.acquire()
        if _isenabled():
            _disable()
            state["tampered"] = True
        if "error" in box:
            error = box["error"]
            keepalive.append(error)
            return False, error
        result = box.get("result")
        if not plain(result):
            keepalive.append(result)
        return True, result

    return run, state


def make_call_check(plain, program_ns, _type, isolated):
    import types
    function_type, method_type = types.FunctionType, types.MethodType
    _list, _id, _getattr = list, id, getattr
    builtin_callables = frozenset(id(v) for v in builtins.__dict__.values() if callable(v))

    def call(fn, *args, **kwargs):
        # Calls that may run program code run on a fresh thread (see make_isolated_runner).
        if _id(fn) in builtin_callables and plain(_list(args)) and plain(kwargs):
            return fn(*args, **kwargs)
        ok, result = isolated(fn, args, kwargs)
        if not ok:
            raise result
        # Values returned by the program's functions must be plain data: objects that answer
        # every comparison or arithmetic with what the test wants cannot pass.
        t = _type(fn)
        if t is function_type or t is method_type:
            owner = fn.__func__ if t is method_type else fn
            if owner.__globals__ is program_ns and not plain(result):
                raise AssertionError("the program returned a non-plain value")
        return result

    def get_attr(obj, name):
        if plain(obj):
            return _getattr(obj, name)
        ok, result = isolated(_getattr, (obj, name), {})
        if not ok:
            raise result
        return result

    def get_item(obj, key):
        if plain(obj) and plain(key):
            return obj[key]
        ok, result = isolated(lambda o, k: o[k], (obj, key), {})
        if not ok:
            raise result
        return result

    return call, get_attr, get_item


# Placeholders the rewriter calls; after compilation they are swapped for the harness's
# functions inside the code objects' constants, so no namespace entry can be patched.
CMP, TRUTH, CALL, GETATTR, GETITEM = ("\0verity:" + n for n in ("cmp", "truth", "call", "getattr", "getitem"))


def placeholder_call(name, args, node):
    return ast.copy_location(ast.Call(ast.Constant(name), args, []), node)


class Rewriter(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        call = ast.Call(ast.Constant(CALL), [node.func] + list(node.args), list(node.keywords))
        return ast.copy_location(call, node)

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        return placeholder_call(GETATTR, [node.value, ast.Constant(node.attr)], node)

    def visit_Subscript(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        return placeholder_call(GETITEM, [node.value, node.slice], node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = ast.Tuple([ast.Constant(type(o).__name__) for o in node.ops], ast.Load())
        values = ast.List([node.left] + list(node.comparators), ast.Load())
        return placeholder_call(CMP, [ops, values], node)

    def visit_Assert(self, node):
        self.generic_visit(node)
        node.test = placeholder_call(TRUTH, [node.test], node.test)
        return node


def bind_placeholders(code, functions, _type=type):
    """Replaces placeholder constants (recursively through nested code) with the functions."""
    code_type = _type(code)
    consts = []
    for c in code.co_consts:
        if _type(c) is str and c in functions:
            consts.append(functions[c])
        elif _type(c) is code_type:
            consts.append(bind_placeholders(c, functions))
        else:
            consts.append(c)
    return code.replace(co_consts=tuple(consts))


def is_test_statement(stmt):
    return not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Pass))


BUILTIN_EXCEPTIONS = frozenset(
    id(v) for v in builtins.__dict__.values() if isinstance(v, type) and issubclass(v, BaseException))


def describe(e, _type=type, _len=len, _str=str, _id=id):
    """A message for an exception that never runs program code (no __str__/__repr__ of its own)."""
    t = _type(e)
    if _id(t) not in BUILTIN_EXCEPTIONS:
        return "an exception of a class defined by the program"
    args = BaseException.__dict__["args"].__get__(e)
    detail = ""
    if _len(args) == 1 and (_type(args[0]) is _str or _type(args[0]) is int or _type(args[0]) is float):
        detail = ": " + _str(args[0])[:300]
    return t.__name__ + detail


def run_tests(request, emit, _type, _isinstance, _bool, _all, _len):
    clean_builtins = dict(builtins.__dict__)
    try:
        tree = ast.parse(request["tests"], "<tests>")
    except SyntaxError as e:
        emit("tests_invalid", message=describe(e))
        return
    statements = [Rewriter().visit(s) for s in tree.body]
    tests = [i for i, s in enumerate(statements) if is_test_statement(s)]
    emit("plan", total=len(tests))
    plain = plain_checker(_type, _isinstance, _all, _len)
    compare, truth = make_compare(plain, _bool)
    program_ns = {"__name__": "solution", "__builtins__": builtins}
    isolated, state = make_isolated_runner(_type, plain)
    call_check, get_attr, get_item = make_call_check(plain, program_ns, _type, isolated)
    functions = {CMP: compare, TRUTH: truth, CALL: call_check, GETATTR: get_attr, GETITEM: get_item}
    import gc
    import warnings
    compiled = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "'str' object is not callable" on placeholders
        for s in statements:
            module = ast.fix_missing_locations(ast.Module([s], []))
            compiled.append(bind_placeholders(compile(module, "<tests>", "exec"), functions))
    gc.disable()
    try:
        program = compile(request["program"], "solution.py", "exec")
        ok, error = isolated(exec, (program, program_ns), {})
        loaded = None if ok else describe(error)
    except BaseException as e:  # noqa: B036 - SystemExit and friends are failures too
        loaded = describe(e)
    if loaded is not None:
        emit("program_error", message=loaded)
    test_ns = dict(program_ns)
    test_ns["__builtins__"] = clean_builtins
    test_ns["__name__"] = "__tests__"
    for index, code in enumerate(compiled):
        counted = index in tests
        if loaded is not None:
            if counted:
                emit("test", index=index, passed=False, message="program failed to load")
            continue
        try:
            exec(code, test_ns)
            ok, message = True, ""
        except BaseException as e:  # noqa: B036
            ok, message = False, describe(e)
        if state["tampered"]:
            ok, message = False, "the program re-enabled the garbage collector"
        if counted:
            emit("test", index=index, passed=ok, message=message)


def run_grade(request, emit, _type, _float, _int, _bool):
    namespace = {"__name__": "grader", "__builtins__": builtins}
    try:
        exec(compile(request["program"], "grader.py", "exec"), namespace)
        grade = namespace["grade"]
        value = grade(request["sample"], request["item"])
    except BaseException as e:  # noqa: B036
        emit("grade_error", message=describe(e))
        return
    if _type(value) not in (_float, _int, _bool):
        emit("grade_error", message="grade() returned " + _type(value).__name__ + ", not a number")
        return
    emit("grade", score=_float(value))


def run_cases(request, emit):
    import signal
    import subprocess
    with open("/work/main.py", "w") as f:
        f.write(request["program"])
    cap = request["max_case_output"]
    deadline = request["case_timeout_s"]
    for index, stdin_text in enumerate(request["inputs"]):
        with open("/work/in.txt", "w") as f:
            f.write(stdin_text)
        out_path = "/work/out_%d.txt" % index
        timed_out = False
        with open("/work/in.txt", "rb") as fin, open(out_path, "wb") as fout:
            proc = subprocess.Popen([sys.executable, "-I", "/work/main.py"], stdin=fin, stdout=fout,
                                    stderr=subprocess.DEVNULL, cwd="/work", start_new_session=True)
            try:
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        with open(out_path, "rb") as f:
            out = f.read(cap + 1)
        os.unlink(out_path)
        emit("case", index=index, stdout=out[:cap].decode("utf-8", "replace"), truncated=len(out) > cap,
             returncode=proc.returncode, timed_out=timed_out)


main()
